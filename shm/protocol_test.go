package shm_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"tpsched/shm"
	"tpsched/shm/sockmode"
)

// The UAP protocol, one table of cases run over every implementation: the
// Go UAP library and the C one, each on shared memory (receive_from =
// queue) and on a socket (receive_from = socket), against the node's side
// of each (shm.Group, sockmode.Transport). What only one implementation
// has (shared memory's mailboxes, prefetch and revoke, its doorbells, the
// C library's build and crash, a hostile UAP) stays in its own tests.

// nodeProc is the node's end of one process: what *shm.Proc and
// *sockmode.Proc share.
type nodeProc interface {
	Files() []*os.File
	PID() int
	SetPID(pid int)
	Attach() bool
	Entries() []string
	Dispatch(entry string, req []byte, deadline int64) error
	Wake()
	Completion() (shm.Completion, bool, error)
	Holding() int
	Taken() int
	Stop()
	Left() bool
}

// nodeSide is the node's end of a group.
type nodeSide struct {
	newProc func(slot int) (nodeProc, error)
	wait    func(time.Duration)
	close   func()
}

// impl is one implementation of the UAP side.
type impl struct {
	name   string
	socket bool // receive_from = socket: one call at a time, written to the process's socket
	// prog is the program and its arguments and environment that run it.
	prog func(tb testing.TB) (path string, args, env []string)
	// fail is what its fail handler answers to "x"; sleep what its sleep
	// handler wants for d.
	fail  string
	sleep func(d time.Duration) string
	// entries is how many entries it registers (Go: TestHelperUAP's
	// u.Handle calls, uap_test.go; C: TestCUAPHandlers' list), so a
	// handler added there must be counted here; 0: the transport does not
	// say (socket mode).
	entries int
	huge    bool // it has the huge handler: a reply over max_message_size
}

func goUAP(tb testing.TB) (string, []string, []string) {
	return os.Args[0], []string{"-test.run=^TestHelperUAP$", "-test.count=1"}, []string{shm.HelperUAPEnv + "=1"}
}

func cUAP(tb testing.TB) (string, []string, []string) { return shm.CUAP(tb), nil, nil }

var impls = []impl{
	{name: "go/shm", prog: goUAP, fail: "failed: x", sleep: func(d time.Duration) string { return d.String() }, entries: 9, huge: true},
	{name: "c/shm", prog: cUAP, fail: "failure requested", sleep: ms, entries: 9},
	{name: "go/socket", socket: true, prog: goUAP, fail: "failed: x", sleep: func(d time.Duration) string { return d.String() }, huge: true},
	{name: "c/socket", socket: true, prog: cUAP, fail: "failure requested", sleep: ms},
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// group makes the node's side of a group of impl with max_message_size
// maxMsg.
func (im impl) group(tb testing.TB, maxMsg int) *nodeSide {
	tb.Helper()
	if im.socket {
		tr, err := sockmode.New("test", maxMsg)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { tr.Unmap() })
		return &nodeSide{newProc: func(slot int) (nodeProc, error) { return tr.NewProc(slot) }, wait: tr.Wait, close: tr.Close}
	}
	g, err := shm.NewGroup("test", maxMsg, 1, 4)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { g.Unmap() })
	return &nodeSide{newProc: func(slot int) (nodeProc, error) { return g.NewProc(slot) }, wait: g.Wait, close: g.Close}
}

// uap is one process of impl and the node's end of it.
type uap struct {
	nodeProc
	cmd  *exec.Cmd
	done chan error
}

// start runs a process of impl in slot 0 with a fresh end, killed at
// cleanup.
func (im impl) start(tb testing.TB, n *nodeSide, env ...string) *uap {
	tb.Helper()
	p, err := n.newProc(0)
	if err != nil {
		tb.Fatal(err)
	}
	path, args, penv := im.prog(tb)
	cmd := exec.Command(path, args...)
	cmd.Env = append(append(os.Environ(), "TPSCHED_SHM_FD=3"), penv...)
	if im.socket {
		cmd.Env = append(cmd.Env, "TPSCHED_RECEIVE=socket")
	}
	cmd.Env = append(cmd.Env, env...)
	u := &uap{nodeProc: p, cmd: cmd, done: shm.StartProcess(tb, cmd, p.Files())}
	p.SetPID(cmd.Process.Pid)
	until(tb, n, "the UAP to attach", u.Attach)
	return u
}

// exit waits for the process to end and returns how it ended.
func (u *uap) exit(tb testing.TB) error {
	tb.Helper()
	select {
	case err := <-u.done:
		u.done <- err
		return err
	case <-time.After(10 * time.Second):
		tb.Fatalf("UAP pid %d still running after 10 s", u.cmd.Process.Pid)
		return nil
	}
}

// until waits on the node's side for cond, failing the test after 10 s.
func until(tb testing.TB, n *nodeSide, what string, cond func() bool) {
	tb.Helper()
	end := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(end) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		n.wait(10 * time.Millisecond)
	}
}

// call hands u one call and waits for its completion.
func call(tb testing.TB, n *nodeSide, u *uap, entry string, req []byte, deadline int64) shm.Completion {
	tb.Helper()
	if err := u.Dispatch(entry, req, deadline); err != nil {
		tb.Fatal(err)
	}
	u.Wake()
	var c shm.Completion
	until(tb, n, "a completion", func() bool {
		var ok bool
		var err error
		c, ok, err = u.Completion()
		if err != nil {
			tb.Fatal(err)
		}
		return ok
	})
	return c
}

// protocolCases are what every implementation does the same.
var protocolCases = []struct {
	name string
	run  func(t *testing.T, im impl)
}{
	{"echo", func(t *testing.T, im impl) {
		// Every size up to max_message_size comes back whole.
		n := im.group(t, 1<<20)
		u := im.start(t, n)
		rng := rand.New(rand.NewPCG(1, 2))
		src := make([]byte, 2<<20)
		for i := range src {
			src[i] = byte(rng.Uint32())
		}
		for i := range 500 {
			size := []int{0, 1 << 20, 1, 4095, 4096}[i%5]
			if i > 10 {
				size = rng.IntN(64 << 10)
			}
			off := rng.IntN(len(src) - size)
			c := call(t, n, u, "echo", src[off:off+size], 0)
			if c.Status != shm.StatusOK || !bytes.Equal(c.Reply, src[off:off+size]) {
				t.Fatalf("call %d: %v, %d bytes back of %d", i, c.Status, len(c.Reply), size)
			}
		}
	}},
	{"statuses", func(t *testing.T, im impl) {
		// A reply, an application error, an entry the UAP lacks, a
		// deadline passed before it ran, and what the node refuses to send.
		n := im.group(t, 64)
		u := im.start(t, n)
		if got := len(u.Entries()); got != im.entries {
			t.Errorf("registered entries %q, want %d", u.Entries(), im.entries)
		}
		cases := []struct {
			entry, req string
			deadline   int64
			status     shm.Status
			reply      string
		}{
			{"echo", "hi", 0, shm.StatusOK, "hi"},
			{"echo", "", 0, shm.StatusOK, ""},
			{"fail", "x", 0, shm.StatusAppError, im.fail},
			{"nope", "x", 0, shm.StatusNoSuchService, "nope"},
			{"echo", "late", time.Now().Add(-time.Second).UnixNano(), shm.StatusTimedOut, ""},
			{"echo", "in time", time.Now().Add(time.Minute).UnixNano(), shm.StatusOK, "in time"},
		}
		if im.huge {
			cases = append(cases, struct {
				entry, req string
				deadline   int64
				status     shm.Status
				reply      string
			}{"huge", "", 0, shm.StatusAppError, "reply too big"})
		}
		for _, c := range cases {
			got := call(t, n, u, c.entry, []byte(c.req), c.deadline)
			if got.Status != c.status || string(got.Reply) != c.reply {
				t.Errorf("%s %q: %v %q, want %v %q", c.entry, c.req, got.Status, got.Reply, c.status, c.reply)
			}
		}
		if err := u.Dispatch("echo", make([]byte, 65), 0); err != shm.ErrTooBig {
			t.Errorf("65 bytes over a 64-byte max: %v, want ErrTooBig", err)
		}
		if err := u.Dispatch(string(make([]byte, 33)), nil, 0); err != shm.ErrNameTooLong {
			t.Errorf("a 33-byte entry: %v, want ErrNameTooLong", err)
		}
	}},
	{"stop and close", func(t *testing.T, im impl) {
		// Stopped while holding a call: the call completes, then the
		// process leaves. A process of a closed group leaves.
		n := im.group(t, 64)
		a := busy(t, im, n)
		a.Stop()
		a.Wake()
		completedOK(t, n, a, "the stopped process's completion")
		if err := a.exit(t); err != nil {
			t.Fatalf("stopped process: %v", err)
		}
		// A socket process's leave is read from its socket by the node's
		// side, which may see it a moment after the process ended.
		until(t, n, "the stopped process to say it left", a.Left)
		b := im.start(t, n)
		if c := call(t, n, b, "echo", []byte("still"), 0); string(c.Reply) != "still" {
			t.Fatalf("reply %q", c.Reply)
		}
		n.close()
		if err := b.exit(t); err != nil {
			t.Fatalf("closed group's process: %v", err)
		}
	}},
	{"closed holding a call", func(t *testing.T, im impl) {
		// The group closes while its process runs a call: the call
		// completes, then the process leaves, not at a kill. (A socket
		// process was never sent its close: the completion woke no
		// writer, and nothing else came to.)
		n := im.group(t, 64)
		u := busy(t, im, n)
		n.close()
		// The reply is in well before the node takes it, as when the
		// node's reader is busy elsewhere.
		time.Sleep(250 * time.Millisecond)
		completedOK(t, n, u, "the completion of the call it held")
		if err := u.exit(t); err != nil {
			t.Fatalf("closed group's process: %v", err)
		}
	}},
	{"refresh", func(t *testing.T, im impl) {
		// TPSCHED_REFRESH: each process serves one call and leaves.
		n := im.group(t, 64)
		for i := range 3 {
			u := im.start(t, n, "TPSCHED_REFRESH=1")
			if c := call(t, n, u, "pid", nil, 0); string(c.Reply) != strconv.Itoa(u.cmd.Process.Pid) {
				t.Fatalf("refresh %d: pid %q from process %d", i, c.Reply, u.cmd.Process.Pid)
			}
			if err := u.exit(t); err != nil {
				t.Fatalf("refresh process %d exit: %v", i, err)
			}
		}
	}},
	{"killed holding a call", func(t *testing.T, im impl) {
		// A process killed in its handler had taken its call (it may have
		// run part of it); a fresh process in the slot serves.
		n := im.group(t, 64)
		u := im.start(t, n)
		if err := u.Dispatch("sleep", []byte(im.sleep(time.Hour)), 0); err != nil {
			t.Fatal(err)
		}
		u.Wake()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for u.Taken() == 0 {
			if ctx.Err() != nil {
				t.Fatal("the UAP never took its call")
			}
			n.wait(time.Millisecond)
		}
		u.cmd.Process.Kill()
		u.exit(t)
		if u.Holding() != 1 || u.Taken() != 1 {
			t.Fatalf("killed in its handler: holding %d, taken %d", u.Holding(), u.Taken())
		}
		v := im.start(t, n)
		if c := call(t, n, v, "echo", []byte("after"), 0); string(c.Reply) != "after" {
			t.Fatalf("reply %q", c.Reply)
		}
	}},
}

// busy starts a process of n and hands it a call that sleeps 50 ms.
func busy(t *testing.T, im impl, n *nodeSide) *uap {
	t.Helper()
	u := im.start(t, n)
	if err := u.Dispatch("sleep", []byte(im.sleep(50*time.Millisecond)), 0); err != nil {
		t.Fatal(err)
	}
	u.Wake()
	return u
}

// completedOK waits on n for u's completion of its call, status OK.
func completedOK(t *testing.T, n *nodeSide, u *uap, what string) {
	t.Helper()
	until(t, n, what, func() bool {
		c, ok, _ := u.Completion()
		return ok && c.Status == shm.StatusOK
	})
}

// TestUAPProtocol runs every protocol case over every implementation.
func TestUAPProtocol(t *testing.T) {
	for _, im := range impls {
		t.Run(im.name, func(t *testing.T) {
			for _, c := range protocolCases {
				t.Run(c.name, func(t *testing.T) { c.run(t, im) })
			}
		})
	}
}
