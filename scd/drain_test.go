package scd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
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

// TestDrainEndsTheRoutingManagersGoroutines: a find that waits for a
// server that never gets a process ends when the node drains: Drain
// returns with no goroutine of the node left (scd/wlmnode's are tracked
// and end with it). On the old code the find's goroutine and the one
// waiting to answer it ran on for up to 30 s.
func TestDrainEndsTheRoutingManagersGoroutines(t *testing.T) {
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
	n, err := New(cfg, Options{Logger: slog.New(slog.DiscardHandler), SchedProbes: "off", DrainTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	n.pm = stuckProcesses{}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	drained := false
	t.Cleanup(func() {
		if !drained {
			_ = n.Drain(context.Background())
		}
	})
	mc := dialNode(t, n.RPCAddr())
	answers := make(chan netio.Frame, 1)
	if _, sent, err := mc.Call(netio.Header{Kind: netio.KindNameLookup, TimeoutMs: 60_000}, "orders", netio.LookupFind, nil,
		time.Time{}, answerFunc(func(f netio.Frame, err error) { answers <- f })); !sent {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the find waits for the server
	if err := n.Drain(context.Background()); err != nil {
		t.Logf("drain: %v", err)
	}
	drained = true
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
