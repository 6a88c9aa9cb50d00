package shm

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// scheduleQueue is what scd holds for a service group, whichever way its
// server receives: *Segment and *SocketQueue must both satisfy it.
type scheduleQueue interface {
	File() *os.File
	Layout() Layout
	Enqueue(service string, req []byte, deadline time.Time) (Token, error)
	WaitCompletions(buf []Completion, timeout time.Duration) []Completion
	Release(t Token)
	PrepareSlot(slot int) error
	Reclaim(slot int) (Token, bool)
	Stats() Stats
	Depth() int
	SlotInfo(slot int) SlotInfo
	RequestStop(slot int)
	Close() error
	Unmap() error
}

var (
	_ scheduleQueue = (*Segment)(nil)
	_ scheduleQueue = (*SocketQueue)(nil)
)

func newSockQ(t testing.TB, l Layout) *SocketQueue {
	t.Helper()
	q, err := CreateSocket(t.Name(), l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close(); q.Unmap() })
	return q
}

// startSockUAP runs the helper UAP (TestHelperUAP) in socket mode, killed at
// cleanup. Like procmgr must, it calls PrepareSlot and then File.
func startSockUAP(tb testing.TB, q *SocketQueue, env ...string) *uap {
	tb.Helper()
	if err := q.PrepareSlot(0); err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperUAP$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=1", "TPSCHED_SHM_FD=3",
		"TPSCHED_PROC_SLOT=0", "TPSCHED_RECEIVE=socket")
	cmd.Env = append(cmd.Env, env...)
	cmd.ExtraFiles = []*os.File{q.File()}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	u := &uap{cmd: cmd, done: make(chan error, 1)}
	go func() { u.done <- cmd.Wait() }()
	tb.Cleanup(func() {
		cmd.Process.Kill()
		<-u.done
	})
	return u
}

// waitQ collects n completions or fails after d.
func TestSocketLayout(t *testing.T) {
	for _, l := range []Layout{
		{Slots: 4, MaxMessage: 64, Processes: 2},
		{Slots: 4, MaxMessage: 64, Processes: 0},
		{Slots: 0, MaxMessage: 64, Processes: 1},
		{Slots: 4, MaxMessage: 0, Processes: 1},
	} {
		if q, err := CreateSocket("bad", l); err == nil {
			q.Unmap()
			t.Errorf("CreateSocket(%+v) succeeded", l)
		}
	}
	q := newSockQ(t, Layout{Slots: 4, MaxMessage: 64, Processes: 1})
	if q.Layout().Slots != 4 || q.PrepareSlot(1) == nil {
		t.Fatal("layout or slot check")
	}
}

func TestSocketEcho(t *testing.T) {
	const n = 1000
	q := newSockQ(t, Layout{Slots: 16, MaxMessage: 1 << 20, Processes: 1})
	u := startSockUAP(t, q)
	echoLoad(t, q, n, 1<<30, 3)
	if info := q.SlotInfo(0); info.State != SlotIdle || info.PID != u.cmd.Process.Pid || info.Served != n {
		t.Fatalf("slot info %+v, pid %d", info, u.cmd.Process.Pid)
	}
}

func TestSocketStatuses(t *testing.T) {
	q := newSockQ(t, Layout{Slots: 8, MaxMessage: 4096, Processes: 1})
	startSockUAP(t, q)
	checkStatuses(t, q)
}

func TestSocketFull(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const slots = 3
	q := newSockQ(t, Layout{Slots: slots, MaxMessage: 64, Processes: 1})
	if _, err := q.Enqueue(strings.Repeat("s", 33), nil, time.Time{}); !errors.Is(err, ErrNameTooLong) {
		t.Fatalf("long name: %v", err)
	}
	if _, err := q.Enqueue("echo", make([]byte, 65), time.Time{}); !errors.Is(err, ErrTooBig) {
		t.Fatalf("65 bytes: %v", err)
	}
	// No process yet: Slots wait in the node, then the queue is full.
	if _, err := q.Enqueue("sleep", []byte("1h"), time.Time{}); err != nil {
		t.Fatal(err)
	}
	for range slots - 1 {
		if _, err := q.Enqueue("echo", []byte("x"), time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := q.Enqueue("echo", nil, time.Time{}); !errors.Is(err, ErrFull) {
		t.Fatalf("enqueue %d with no process: %v", slots+1, err)
	}
	// The process takes the sleep: one slot frees, then full again.
	startSockUAP(t, q)
	poll(ctx, t, "the UAP to take the sleep", func() bool {
		st := q.Stats()
		return st.Busy == 1 && st.Depth == slots-1 && q.SlotInfo(0).State == SlotBusy
	})
	if _, err := q.Enqueue("echo", []byte("x"), time.Time{}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue("echo", nil, time.Time{}); !errors.Is(err, ErrFull) {
		t.Fatalf("enqueue beyond %d waiting + 1 in the UAP: %v", slots, err)
	}
	if st := q.Stats(); st.Depth != slots || q.Depth() != slots || st.Queued != slots+1 || st.Taken != 1 {
		t.Fatalf("stats %+v", st)
	}
	q.Close()
	if _, err := q.Enqueue("echo", nil, time.Time{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

func TestSocketCloseDrains(t *testing.T) {
	q := newSockQ(t, Layout{Slots: 32, MaxMessage: 64, Processes: 1})
	checkCloseDrains(t, q, startSockUAP(t, q))
}

func TestSocketKill(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := newSockQ(t, Layout{Slots: 4, MaxMessage: 64, Processes: 1})
	u := startSockUAP(t, q)
	tok, err := q.Enqueue("sleep", []byte("1h"), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	rest := []string{"a", "b", "c"}
	for _, r := range rest {
		if _, err := q.Enqueue("echo", []byte(r), time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	poll(ctx, t, "the UAP to take the sleep", func() bool {
		info := q.SlotInfo(0)
		return info.State == SlotBusy && info.PID == u.cmd.Process.Pid
	})
	time.Sleep(50 * time.Millisecond) // inside the handler by now
	u.cmd.Process.Signal(syscall.SIGKILL)
	u.wait(t, 10*time.Second)
	got, ok := q.Reclaim(0)
	if !ok || got != tok {
		t.Fatalf("Reclaim = %x %v, want %x", got, ok, tok)
	}
	if info := q.SlotInfo(0); info.State != SlotFree {
		t.Fatalf("slot after Reclaim %+v", info)
	}
	q.Release(got)
	if got, ok := q.Reclaim(0); ok {
		t.Fatalf("second Reclaim = %x", got)
	}
	old := q.File()
	if err := q.PrepareSlot(0); err != nil {
		t.Fatal(err)
	}
	if q.File() == old {
		t.Fatal("PrepareSlot kept the socketpair of a dead process")
	}
	if st := q.Stats(); st.Depth != 3 || st.Busy != 0 {
		t.Fatalf("stats before the new process %+v", st)
	}
	u2 := startSockUAP(t, q)
	cs := waitN(t, q, 3, 10*time.Second)
	for i, c := range cs {
		if c.Status != StatusOK || string(c.Reply) != rest[i] {
			t.Fatalf("completion %d: %v %q", i, c.Status, c.Reply)
		}
		q.Release(c.Token)
	}
	poll(ctx, t, "the new process idle", func() bool {
		info := q.SlotInfo(0)
		return info.State == SlotIdle && info.PID == u2.cmd.Process.Pid && info.Served == 3
	})
}

// RequestStop lets the process finish the request it holds, then it exits
// 0; queued requests wait for the next process.
func TestSocketRequestStop(t *testing.T) {
	q := newSockQ(t, Layout{Slots: 8, MaxMessage: 64, Processes: 1})
	checkRequestStop(t, q, startSockUAP(t, q), func() int { startSockUAP(t, q); return 0 })
}

// rawUAP is the UAP end of q's socket driven by hand.
func rawUAP(t *testing.T, q *SocketQueue) net.Conn {
	t.Helper()
	c, err := net.FileConn(q.File())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// A reply over MaxMessage is a protocol error: the node closes the socket
// and Reclaim names the request.
func TestSocketProtocolErrorFromUAP(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q := newSockQ(t, Layout{Slots: 4, MaxMessage: 64, Processes: 1})
	c := rawUAP(t, q)
	h := make([]byte, sockHdrSize+maxName+64)
	putSockHdr(h, sockMsg{kind: kindHello, a: 4242, b: sockVersion})
	if _, err := c.Write(h[:sockHdrSize]); err != nil {
		t.Fatal(err)
	}
	m, err := readSockHdr(c, h, 0)
	if err != nil || m.kind != kindWelcome || m.a != 64 {
		t.Fatalf("welcome: %+v %v", m, err)
	}
	tok, err := q.Enqueue("echo", []byte("abc"), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	m, err = readSockHdr(c, h, 64)
	if err != nil || m.kind != kindRequest || Token(m.a) != tok || m.nameLen != 4 || m.payLen != 3 {
		t.Fatalf("request: %+v %v", m, err)
	}
	if _, err := io.ReadFull(c, h[:7]); err != nil || string(h[:7]) != "echoabc" {
		t.Fatalf("request body %q %v", h[:7], err)
	}
	if info := q.SlotInfo(0); info.State != SlotBusy || info.PID != 4242 {
		t.Fatalf("slot info %+v", info)
	}
	putSockHdr(h, sockMsg{kind: kindReply, payLen: 65, a: m.a})
	if _, err := c.Write(h[:sockHdrSize]); err != nil {
		t.Fatal(err)
	}
	poll(ctx, t, "the node to drop the process", func() bool { return q.SlotInfo(0).State == SlotFree })
	if _, err := c.Read(h); err != io.EOF {
		t.Fatalf("read after the protocol error: %v, want EOF", err)
	}
	if got, ok := q.Reclaim(0); !ok || got != tok {
		t.Fatalf("Reclaim = %x %v, want %x", got, ok, tok)
	}
	if cs := q.WaitCompletions(nil, 10*time.Millisecond); len(cs) != 0 {
		t.Fatalf("completions %+v", cs)
	}
}

// A request over MaxMessage is a protocol error on the UAP side: Serve
// returns an error.
func TestSocketProtocolErrorFromNode(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	nf, uf := os.NewFile(uintptr(fds[0]), "node"), os.NewFile(uintptr(fds[1]), "uap")
	defer nf.Close()
	defer uf.Close()
	node, err := net.FileConn(nf)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	node.SetDeadline(time.Now().Add(10 * time.Second))
	go func() {
		h := make([]byte, sockHdrSize)
		if _, err := readSockHdr(node, h, 0); err != nil {
			return
		}
		putSockHdr(h, sockMsg{kind: kindWelcome, a: 64, b: sockVersion})
		node.Write(h)
		putSockHdr(h, sockMsg{kind: kindRequest, nameLen: 4, payLen: 65, a: 1})
		node.Write(h)
	}()
	srv, err := attachSocketFile(uf, false)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if srv.MaxMessage() != 64 {
		t.Fatalf("MaxMessage %d", srv.MaxMessage())
	}
	srv.Handle("echo", func(req []byte) ([]byte, error) { return req, nil })
	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()
	select {
	case err := <-done:
		if !errors.Is(err, errProtocol) {
			t.Fatalf("Serve = %v, want a protocol error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve still running")
	}
}

// In refresh mode the socket process serves one request and exits 0.
func TestSocketRefresh(t *testing.T) {
	q := newSockQ(t, Layout{Slots: 8, MaxMessage: 64, Processes: 1})
	for i := range 2 {
		if _, err := q.Enqueue("echo", []byte{byte(i)}, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 {
		u := startSockUAP(t, q, "TPSCHED_REFRESH=1")
		cs := waitN(t, q, 1, 10*time.Second)
		if len(cs[0].Reply) != 1 || cs[0].Reply[0] != byte(i) {
			t.Fatalf("refresh %d served %v", i, cs[0].Reply)
		}
		q.Release(cs[0].Token)
		if err := u.wait(t, 10*time.Second); err != nil {
			t.Fatalf("refresh process %d exit: %v", i, err)
		}
		if _, ok := q.Reclaim(0); ok {
			t.Fatalf("refresh process %d held a request", i)
		}
		if got := q.Stats().Depth; got != 1-i {
			t.Fatalf("after refresh process %d the queue holds %d, want %d", i, got, 1-i)
		}
	}
}
