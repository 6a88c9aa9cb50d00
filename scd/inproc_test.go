package scd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tpsched/bpf"
	"tpsched/netio"
	"tpsched/procmgr"
	"tpsched/scd/client"
	"tpsched/scd/def"
	"tpsched/scd/local"
	"tpsched/shm"
)

// inProcess is a processManager whose UAPs are goroutines of the test:
// each resident slot attaches to the files its group prepared (the real
// shared memory of a real group) and serves echo, fail and sleep. So a
// whole Node, its RPC port, queues and reply readers included, runs in
// the test process, without root and without starting a process.
type inProcess struct{}

func (inProcess) Start(spec procmgr.Spec, d procmgr.Delegate) (local.Processes, error) {
	s := &inProcServer{spec: spec, d: d}
	for slot := range spec.Resident {
		if err := s.run(slot); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (inProcess) CPUStatus() procmgr.CPUStatus {
	return procmgr.CPUStatus{Mechanism: "none", Reason: "in-process test UAPs"}
}
func (inProcess) Stats() procmgr.Stats { return procmgr.Stats{} }

func (inProcess) Containment() procmgr.ContainStatus {
	return procmgr.ContainStatus{Kill: procmgr.KillPgroup, Pids: procmgr.LimitNone, Memory: procmgr.LimitNone}
}
func (inProcess) Close() {}

type inProcServer struct {
	spec procmgr.Spec
	d    procmgr.Delegate
	wg   sync.WaitGroup
	// beforeServe, when set, runs in each process between its attach and
	// its Serve (a UAP that calls a service as it starts).
	beforeServe func(*shm.UAP)
}

func (s *inProcServer) run(slot int) error {
	files, err := s.d.Prepare(slot)
	if err != nil {
		return err
	}
	var fds [3]int                // the UAP owns its descriptors, as a process would
	for i, f := range files[:3] { // no control line: these take no lanes
		if fds[i], err = unix.Dup(int(f.Fd())); err != nil {
			return err
		}
	}
	u, err := shm.AttachFDs(fds[0], fds[1], fds[2])
	if err != nil {
		return err
	}
	u.Handle("echo", func(req []byte) ([]byte, error) { return req, nil })
	u.Handle("fail", func(req []byte) ([]byte, error) { return nil, errors.New("failed: " + string(req)) })
	u.Handle("sleep", func(req []byte) ([]byte, error) {
		d, err := time.ParseDuration(string(req))
		if err != nil {
			return nil, err
		}
		time.Sleep(d)
		return req, nil
	})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if s.beforeServe != nil {
			s.beforeServe(u)
		}
		err := u.Serve()
		u.Close()
		s.d.Exited(slot, 0, err)
	}()
	return nil
}

func (s *inProcServer) Kick(int)                      {}
func (s *inProcServer) Attached(int, int)             {}
func (s *inProcServer) Kill(int, int)                 {}
func (s *inProcServer) Replace(int)                   {}
func (s *inProcServer) Running() (int, int)           { return s.spec.Resident, 0 }
func (s *inProcServer) Processes() []procmgr.ProcInfo { return nil }
func (s *inProcServer) Usage() bpf.Usage              { return bpf.Usage{} }
func (s *inProcServer) CPUSample() procmgr.CPUSample  { return procmgr.CPUSample{} }
func (s *inProcServer) CPUGroupPath() string          { return "" }
func (s *inProcServer) Limits() procmgr.LimitStatus   { return procmgr.LimitStatus{} }
func (s *inProcServer) Output() procmgr.OutputStats   { return procmgr.OutputStats{} }
func (s *inProcServer) Stopping()                     {}
func (s *inProcServer) ParallelCount() (int, int)     { return s.spec.Resident, s.spec.Max }
func (s *inProcServer) SetParallelCount(int, int) ([]bool, error) {
	return nil, errors.New("in-process test UAPs keep their counts")
}
func (s *inProcServer) Stop(ctx context.Context) (err error) { return waitGroup(ctx, &s.wg) }

func waitGroup(ctx context.Context, wg *sync.WaitGroup) error {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// inProcNode starts a node on a definition directory made of sysconf and
// usr files (a usr body's "MODULE" is any executable: the UAPs run in
// process), on loopback ports of its own unless sysconf sets them; it is
// drained when the test ends.
func inProcNode(t testing.TB, sysconf string, servers map[string]string) *Node {
	t.Helper()
	return inProcNodeWith(t, sysconf, servers, nil)
}

// inProcNodeWith is inProcNode with prepare run between New and Start.
func inProcNodeWith(t testing.TB, sysconf string, servers map[string]string, prepare func(*Node)) *Node {
	t.Helper()
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Defaults for what sysconf does not set itself.
	for _, d := range []string{`node_id = "inproc"`, `rpc_port = 0`, `metrics_address = "127.0.0.1:0"`, `control_socket = "ctl.sock"`} {
		if operand, _, _ := strings.Cut(d, " "); !strings.Contains(sysconf, "set "+operand+" ") {
			sysconf = "set " + d + "\n" + sysconf
		}
	}
	write("sysconf", sysconf)
	for name, body := range servers {
		write("usr/"+name, strings.ReplaceAll(body, "MODULE", fmt.Sprintf("%q", os.Args[0])))
	}
	cfg, err := def.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	n, err := New(cfg, Options{Logger: slog.New(slog.DiscardHandler), SchedProbes: "off", DrainTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	n.pm = inProcess{}
	if prepare != nil {
		prepare(n)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Drain(context.Background()); err != nil {
			t.Errorf("drain: %v", err)
		}
	})
	return n
}

func inProcClient(t testing.TB, n *Node) *client.Client {
	t.Helper()
	c, err := client.New(client.Options{Hosts: []string{n.RPCAddr()}, MaxMessageSize: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestNodeInProcess runs the call path of a whole node in the test
// process: a real RPC port, real schedule queues and shared memory, UAPs
// as goroutines. It covers the answers a caller can switch on.
func TestNodeInProcess(t *testing.T) {
	n := inProcNode(t, "", map[string]string{
		"g": "set service_group = g\nset service = echo, fail, sleep\nset module = MODULE\n" +
			"set parallel_count = 2\nset queue_size = 2\nset max_message_size = 1024\n",
	})
	c := inProcClient(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	code := func(err error) netio.Code {
		var ne *netio.Error
		if errors.As(err, &ne) {
			return ne.Code
		}
		return 255
	}
	if out, err := c.Call(ctx, "g", "echo", []byte("hi")); err != nil || string(out) != "hi" {
		t.Fatalf("echo: %q, %v", out, err)
	}
	for _, tc := range []struct {
		group, service string
		payload        []byte
		want           netio.Code
		msg            string
	}{
		{"g", "fail", []byte("x"), netio.CodeApplication, "failed: x"},
		{"g", "nope", nil, netio.CodeNoSuchService, "g/nope"},
		{"h", "echo", nil, netio.CodeNoSuchGroup, "h (did you mean g?)"},
		{"g", "ecoh", nil, netio.CodeNoSuchService, "g/ecoh (did you mean echo?)"},
		{"g", "echo", make([]byte, 1025), netio.CodeMessageTooBig, "1025 bytes"},
	} {
		_, err := c.Call(ctx, tc.group, tc.service, tc.payload)
		if code(err) != tc.want || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s/%s: %v; want %v with %q", tc.group, tc.service, err, tc.want, tc.msg)
		}
	}
	// Two processes, two places in the queue: the fifth call is refused,
	// and only then.
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			_, err := c.Call(ctx, "g", "sleep", []byte("300ms"))
			errs <- err
		})
	}
	waitInFlight(t, n, "g", 4)
	if _, err := c.Call(ctx, "g", "echo", nil); code(err) != netio.CodeServerBusy {
		t.Errorf("a fifth call with 2 running and 2 waiting: %v, want 'server busy'", err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a call that was admitted: %v", err)
		}
	}
	// Held: refused 'service closed'; released: served.
	if err := n.Hold("g"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Call(ctx, "g", "echo", nil); code(err) != netio.CodeServiceClosed {
		t.Errorf("call to a held group: %v", err)
	}
	n.Release("g")
	// A call whose timeout passes while it runs: 'timed out', once.
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelShort()
	if _, err := c.Call(short, "g", "sleep", []byte("400ms")); code(err) != netio.CodeTimedOut {
		t.Errorf("call that outlives its timeout: %v", err)
	}
	if out, err := c.Call(ctx, "g", "echo", []byte("after")); err != nil || string(out) != "after" {
		t.Errorf("echo after all that: %q, %v", out, err)
	}
}

func waitInFlight(t testing.TB, n *Node, group string, want int) {
	t.Helper()
	end := time.Now().Add(10 * time.Second)
	g, _ := n.local.Group(group)
	for g.InFlight() != want {
		if time.Now().After(end) {
			t.Fatalf("%s has %d calls in flight, want %d", group, g.InFlight(), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestNodeInProcessUnderLoad: 64 callers on two processes for a while:
// every call answered with its own reply (the queue and the processes'
// mailboxes never disagree on who holds what).
func TestNodeInProcessUnderLoad(t *testing.T) {
	n := inProcNode(t, "", map[string]string{
		"g": "set service_group = g\nset service = echo\nset module = MODULE\nset parallel_count = 2\nset queue_size = 256\n",
	})
	c := inProcClient(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var calls, fails atomic.Int64
	for i := range 64 {
		wg.Go(func() {
			for j := 0; ctx.Err() == nil; j++ {
				want := fmt.Sprintf("caller %d call %d", i, j)
				out, err := c.Call(context.Background(), "g", "echo", []byte(want))
				calls.Add(1)
				if err != nil || string(out) != want {
					if fails.Add(1) <= 5 {
						t.Errorf("call %q: %q, %v", want, out, err)
					}
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d calls, %d failed", calls.Load(), fails.Load())
}
