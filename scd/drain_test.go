package scd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"tpsched/netio"
	"tpsched/procmgr"
	"tpsched/scd/def"
	"tpsched/scd/local"
)

// stuckProcesses is a local.ProcessManager whose servers never get a process:
// a server it starts stays starting.
type stuckProcesses struct{ inProcess }

func (stuckProcesses) Start(spec procmgr.Spec, d procmgr.Delegate) (local.Processes, error) {
	return &inProcServer{spec: spec, d: d}, nil
}

// nodeGoroutines lists the goroutines running code of tpsched/scd (not of
// the tests).
func nodeGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "tpsched/scd") && !strings.Contains(g, "_test.go") {
			out = append(out, g)
		}
	}
	return out
}

// policyNode starts a node whose service policy makes group orders an
// application environment (its server starts on the first call or find),
// with pm's processes. The test drains it with drain (Drain once only),
// else it is drained when the test ends.
func policyNode(t *testing.T, pm local.ProcessManager, drainTimeout time.Duration) (n *Node, drain func() error) {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"sysconf":    `set node_id = "inproc"` + "\nset rpc_port = 0\nset metrics_address = \"127.0.0.1:0\"\nset control_socket = \"ctl.sock\"\n",
		"svcpolicy":  "set policy_interval = 1\nset default_class = BATCH\nclass -n BATCH -i 3 -t 5000\nenvironment -g orders\n",
		"usr/orders": fmt.Sprintf("set service_group = orders\nset service = echo\nset module = %q\nset parallel_count = 1\n", os.Args[0]),
	}
	for name, text := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := def.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	n, err = New(cfg, Options{Logger: slog.New(slog.DiscardHandler), SchedProbes: "off", DrainTimeout: drainTimeout})
	if err != nil {
		t.Fatal(err)
	}
	n.pm = pm
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	drained := false
	t.Cleanup(func() {
		if !drained {
			_ = n.Drain(context.Background())
		}
	})
	return n, func() error {
		drained = true
		return n.Drain(context.Background())
	}
}

// TestDrainEndsTheRoutingManagersGoroutines: a find that waits for a
// server that never gets a process ends when the node drains: Drain
// returns with no goroutine of the node left (scd/wlmnode's are tracked
// and end with it). On the old code the find's goroutine and the one
// waiting to answer it ran on for up to 30 s.
func TestDrainEndsTheRoutingManagersGoroutines(t *testing.T) {
	n, drain := policyNode(t, stuckProcesses{}, 2*time.Second)
	mc := dialNode(t, n.RPCAddr())
	answers := make(chan netio.Frame, 1)
	if _, sent, err := mc.Call(netio.Header{Kind: netio.KindNameLookup, TimeoutMs: 60_000}, "orders", netio.LookupFind, nil,
		time.Time{}, answerFunc(func(f netio.Frame, err error) { answers <- f })); !sent {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the find waits for the server
	if err := drain(); err != nil {
		t.Logf("drain: %v", err)
	}
	deadline := time.Now().Add(time.Second)
	for len(nodeGoroutines()) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if left := nodeGoroutines(); len(left) > 0 {
		t.Errorf("%d goroutine(s) of the node still run after Drain:\n%s", len(left), strings.Join(left, "\n\n"))
	}
	select {
	case f := <-answers:
		if f.Kind != netio.KindError || f.Code != netio.CodeShuttingDown {
			t.Errorf("the find was answered %v %v %q, want 'node shutting down'", f.Kind, f.Code, f.Payload)
		}
	case <-time.After(testWait):
		t.Error("the find got no answer")
	}
}

// lateProcesses is a local.ProcessManager whose servers' processes attach
// after delay, as a UAP that takes a while to start.
type lateProcesses struct {
	inProcess
	delay time.Duration
}

func (l lateProcesses) Start(spec procmgr.Spec, d procmgr.Delegate) (local.Processes, error) {
	s := &inProcServer{spec: spec, d: d}
	s.wg.Add(1) // Stop waits for the late start too
	go func() {
		defer s.wg.Done()
		time.Sleep(l.delay)
		for slot := range spec.Resident {
			if err := s.run(slot); err != nil {
				d.Exited(slot, 1, err)
			}
		}
	}()
	return s, nil
}

// TestDrainServesParkedCalls: a call parked by the routing manager until
// its environment's server starts is served when the server attaches
// during the drain, within the drain timeout. Drain used to count only the
// queued calls and the peer pool's, so it closed the manager at once and
// the call was answered 'node shutting down'.
func TestDrainServesParkedCalls(t *testing.T) {
	n, drain := policyNode(t, lateProcesses{delay: 300 * time.Millisecond}, 5*time.Second)
	mc := dialNode(t, n.RPCAddr())
	answers := make(chan netio.Frame, 1)
	if _, sent, err := mc.Call(netio.Header{Kind: netio.KindCall, TimeoutMs: 10_000}, "orders", "echo", []byte("parked"),
		time.Time{}, answerFunc(func(f netio.Frame, err error) { answers <- f })); !sent {
		t.Fatal(err)
	}
	deadline := time.Now().Add(testWait)
	for n.wlm.Parked() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the call was never parked")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := drain(); err != nil {
		t.Errorf("drain: %v", err)
	}
	select {
	case f := <-answers:
		if f.Kind != netio.KindReply || string(f.Payload) != "parked" {
			t.Errorf("the parked call was answered %v %v %q, want its reply", f.Kind, f.Code, f.Payload)
		}
	case <-time.After(testWait):
		t.Error("the parked call got no answer")
	}
}

type answerFunc func(netio.Frame, error)

func (a answerFunc) Answer(f netio.Frame, err error) { a(f, err) }

func dialNode(t *testing.T, addr string) *netio.MuxConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	mc := netio.NewMuxConn(nc, netio.MuxOptions{})
	t.Cleanup(func() { mc.Close(errors.New("test ends")) })
	return mc
}

// TestUnitOutwaitsTheStop: the systemd unit's TimeoutStopSec is longer
// than the stop of the node it starts takes at most (its -drain-timeout,
// in a cluster, with every part of the shutdown bounded), so systemd's
// SIGKILL never cuts the port's last answers short.
func TestUnitOutwaitsTheStop(t *testing.T) {
	b, err := os.ReadFile("../dist/tpsched.service")
	if err != nil {
		t.Fatal(err)
	}
	unit := string(b)
	get := func(re string) time.Duration {
		m := regexp.MustCompile(re).FindStringSubmatch(unit)
		if m == nil {
			t.Fatalf("the unit has no %s", re)
		}
		d, err := time.ParseDuration(m[1])
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	drain, stop := get(`(?m)^ExecStart=.*-drain-timeout (\S+)`), get(`(?m)^TimeoutStopSec=(\S+)`)
	n := &Node{inCluster: true, opts: Options{DrainTimeout: drain}}
	if bound := n.StopBound(); stop <= bound {
		t.Errorf("TimeoutStopSec=%v, but a node with -drain-timeout %v may take %v to stop", stop, drain, bound)
	}
}
