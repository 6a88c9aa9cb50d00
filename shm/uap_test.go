package shm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"tpsched/shm/internal/sockwire"
)

const helperEnv = "TPSCHED_SHM_TEST_UAP"

// HelperUAPEnv turns the test binary into the Go helper UAP (TestHelperUAP),
// for the protocol suite (package shm_test).
const HelperUAPEnv = helperEnv

// TestHelperUAP is not a test: it is the UAP process that the cross-process
// tests start by re-executing the test binary. TPSCHED_SHM_TEST_MAXSLEEP
// (a duration) bounds its futex sleeps, so a lost wake-up shows as a stall.
func TestHelperUAP(t *testing.T) {
	switch os.Getenv(helperEnv) {
	case "1":
	case "hostile":
		hostileUAP()
	case "lanecaller":
		hostileLaneCaller()
	case "lanecallee":
		hostileLaneCallee()
	case "lanecalleeforge":
		forgingLaneCallee()
	case "closeafterone": // serves one call, closes without being told to leave, lives on
		u, err := Attach()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		u.Handle("echo", func(req []byte) ([]byte, error) { return req, nil })
		if err := u.ServeOne(); err != nil {
			fmt.Fprintln(os.Stderr, "serve one:", err)
			os.Exit(1)
		}
		if err := u.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "close:", err)
			os.Exit(1)
		}
		time.Sleep(time.Hour) // the node learns that it left from the process, not its exit
	default:
		t.Skip("helper process for the cross-process tests")
	}
	if v := os.Getenv("TPSCHED_SHM_TEST_MAXSLEEP"); v != "" {
		maxSleep, _ = time.ParseDuration(v)
	}
	u, err := Attach()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	u.Handle("echo", func(req []byte) ([]byte, error) { return req, nil })
	u.Handle("fail", func(req []byte) ([]byte, error) { return nil, errors.New("failed: " + string(req)) })
	u.Handle("huge", func(req []byte) ([]byte, error) { return make([]byte, u.MaxMessage()+1), nil })
	u.Handle("pid", func(req []byte) ([]byte, error) { return strconv.AppendInt(req[:0], int64(os.Getpid()), 10), nil })
	// relay calls the service its request names ("group/service/request")
	// through the node and returns the answer, or the error's code and text.
	u.Handle("relay", func(req []byte) ([]byte, error) {
		parts := bytes.SplitN(req, []byte("/"), 3)
		if len(parts) != 3 {
			return nil, errors.New("relay wants group/service/request")
		}
		reply, err := u.Call(context.Background(), string(parts[0]), string(parts[1]), parts[2])
		var ce *CallError
		switch {
		case errors.As(err, &ce):
			return fmt.Appendf(nil, "error %d: %s", ce.Code, ce.Message), nil
		case err != nil:
			return nil, err
		}
		return reply, nil
	})
	// loop calls the service its request names ("group/service/N") N
	// times with a 128-byte request and says how long the calls took.
	u.Handle("loop", func(req []byte) ([]byte, error) {
		parts := bytes.SplitN(req, []byte("/"), 3)
		if len(parts) != 3 {
			return nil, errors.New("loop wants group/service/N")
		}
		n, err := strconv.Atoi(string(parts[2]))
		if err != nil {
			return nil, err
		}
		payload := make([]byte, 128)
		start := time.Now()
		for range n {
			if _, err := u.Call(context.Background(), string(parts[0]), string(parts[1]), payload); err != nil {
				return nil, err
			}
		}
		return strconv.AppendInt(nil, int64(time.Since(start)), 10), nil
	})
	// cancel calls other/svc with a context cancelled after the duration
	// its request names, and says what the call returned and when.
	u.Handle("cancel", func(req []byte) ([]byte, error) {
		d, err := time.ParseDuration(string(req))
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(d, cancel)
		start := time.Now()
		_, err = u.Call(ctx, "other", "svc", nil)
		return fmt.Appendf(nil, "%v after %v", err, time.Since(start).Round(time.Millisecond)), nil
	})
	u.Handle("sleep", func(req []byte) ([]byte, error) {
		d, err := time.ParseDuration(string(req))
		if err != nil {
			return nil, err
		}
		time.Sleep(d)
		return req, nil
	})
	// background calls other/svc (or the "group/service/request" its
	// request names) from a goroutine of its own, which outlives the call
	// served; what its Call returned goes to bg.
	bg := make(chan error, 1)
	u.Handle("background", func(req []byte) ([]byte, error) {
		group, service, payload := "other", "svc", []byte(nil)
		if parts := bytes.SplitN(req, []byte("/"), 3); len(parts) == 3 {
			group, service, payload = string(parts[0]), string(parts[1]), parts[2]
		}
		go func() {
			_, err := u.Call(context.Background(), group, service, payload)
			bg <- err
		}()
		return req, nil
	})
	if err := u.Serve(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	u.Close()
	if os.Getenv("TPSCHED_SHM_TEST_AFTER_CLOSE") == "background" {
		select { // the background call must end, and say the UAP closed
		case err := <-bg:
			if !errors.Is(err, ErrClosed) {
				fmt.Fprintln(os.Stderr, "the background call after Close:", err)
				os.Exit(4)
			}
		case <-time.After(5 * time.Second):
			fmt.Fprintln(os.Stderr, "the background call did not end after Close")
			os.Exit(5)
		}
	}
	os.Exit(0)
}

type uapProc struct {
	*Proc
	cmd  *exec.Cmd
	done chan error
}

// testMailboxes is how many calls a test process may hold.
const testMailboxes = 4

func newGroup(tb testing.TB, maxMsg, slots int) *Group {
	tb.Helper()
	g, err := NewGroup("test", maxMsg, slots, testMailboxes)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { g.Unmap() })
	return g
}

// startUAP runs the helper UAP in slot with a fresh area, killed at cleanup.
func startUAP(tb testing.TB, g *Group, slot int, env ...string) *uapProc {
	tb.Helper()
	p, err := g.NewProc(slot)
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperUAP$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=1", "TPSCHED_SHM_FD=3")
	cmd.Env = append(cmd.Env, env...)
	return &uapProc{Proc: p, cmd: cmd, done: startProcess(tb, cmd, p.Files())}
}

// startProcess starts cmd as a UAP process on the node's files (fds 3
// on), its output on the test's, killed at cleanup (and with the test
// process); the channel takes its exit.
func startProcess(tb testing.TB, cmd *exec.Cmd, files []*os.File) chan error {
	tb.Helper()
	cmd.ExtraFiles = files
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tb.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	return done
}

func (u *uapProc) wait(tb testing.TB, d time.Duration) error {
	tb.Helper()
	select {
	case err := <-u.done:
		u.done <- err
		return err
	case <-time.After(d):
		tb.Fatalf("UAP pid %d still running after %v", u.cmd.Process.Pid, d)
		return nil
	}
}

// until waits on g's doorbells for cond, failing the test after d.
func until(tb testing.TB, g *Group, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			tb.Fatalf("timed out after %v waiting for %s", d, what)
		}
		g.Wait(10 * time.Millisecond)
	}
}

func attached(tb testing.TB, g *Group, ps ...*uapProc) {
	tb.Helper()
	for _, p := range ps {
		until(tb, g, 10*time.Second, "the UAP to attach", p.Attach)
	}
}

// call hands p one call and waits for its completion.
func call(tb testing.TB, g *Group, p *Proc, entry string, req []byte) Completion {
	tb.Helper()
	if err := p.Dispatch(entry, req, 0); err != nil {
		tb.Fatal(err)
	}
	p.Wake()
	var c Completion
	until(tb, g, 10*time.Second, "a completion", func() bool {
		var ok bool
		var err error
		c, ok, err = p.Completion()
		if err != nil {
			tb.Fatal(err)
		}
		return ok
	})
	return c
}

// TestCrossProcessKilledBeforeTaking: a process stopped before it could
// take a call handed to its mailbox, then killed, had not taken it (the
// node requeues it); a fresh process in the slot serves. (One killed in its
// handler had taken its call: TestUAPProtocol, every implementation.)
func TestCrossProcessKilledBeforeTaking(t *testing.T) {
	g := newGroup(t, 64, 1)
	q := startUAP(t, g, 0)
	attached(t, g, q)
	q.cmd.Process.Signal(syscall.SIGSTOP)
	waitStopped(t, q.cmd.Process.Pid)
	if err := q.Dispatch("echo", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	q.Wake()
	time.Sleep(20 * time.Millisecond)
	q.cmd.Process.Kill()
	q.wait(t, 10*time.Second)
	if q.Holding() != 1 || q.Taken() != 0 {
		t.Fatalf("killed before taking: holding %d, taken %d", q.Holding(), q.Taken())
	}
	r := startUAP(t, g, 0)
	attached(t, g, r)
	if c := call(t, g, r.Proc, "echo", []byte("after")); string(c.Reply) != "after" {
		t.Fatalf("reply %q", c.Reply)
	}
}

// TestNoLostWakeups: many calls one at a time to two processes whose
// futex sleeps, and the reader's, last 10 s: a lost wake-up on either side
// stalls the test.
func TestNoLostWakeups(t *testing.T) {
	old := maxSleep
	maxSleep = 10 * time.Second
	defer func() { maxSleep = old }()
	g := newGroup(t, 64, 2)
	ps := []*uapProc{startUAP(t, g, 0, "TPSCHED_SHM_TEST_MAXSLEEP=10s", "TPSCHED_SPIN_US=0"),
		startUAP(t, g, 1, "TPSCHED_SHM_TEST_MAXSLEEP=10s", "TPSCHED_SPIN_US=0")}
	attached(t, g, ps...)
	start := time.Now()
	for i := range 4000 {
		p := ps[i%2]
		if i%7 == 0 {
			time.Sleep(50 * time.Microsecond) // let both sides fall asleep now and then
		}
		if c := call(t, g, p.Proc, "echo", []byte{byte(i)}); c.Reply[0] != byte(i) {
			t.Fatalf("call %d: %v", i, c.Reply)
		}
	}
	if d := time.Since(start); d > 9*time.Second {
		t.Fatalf("4000 calls took %v: a wake-up was lost", d)
	}
}

// TestIdleUAPBacksOff: a process that waits for calls for a while wakes
// at most about once a second (idleSleepMax), not at every maxSleep:
// S10's 128 idle Go callers, waking every 100 ms, took a third of a core.
// A call still wakes it at once.
func TestIdleUAPBacksOff(t *testing.T) {
	g := newGroup(t, 64, 1)
	p := startUAP(t, g, 0)
	attached(t, g, p)
	pid := p.cmd.Process.Pid
	time.Sleep(1600 * time.Millisecond) // the sleeps grow to their bound
	before := switches(t, pid)
	time.Sleep(2 * time.Second)
	// Each wake-up of a Go process through its runtime costs a few
	// switches over its threads: 100 ms sleeps gave about 80 in 2 s.
	n := switches(t, pid) - before
	t.Logf("%d voluntary context switches in 2 s", n)
	if n > 30 {
		t.Errorf("the idle process switched %d times in 2 s: it wakes more often than idleSleepMax", n)
	}
	start := time.Now()
	if c := call(t, g, p.Proc, "echo", []byte("x")); string(c.Reply) != "x" {
		t.Fatalf("reply %q", c.Reply)
	}
	if d := time.Since(start); d > idleSleepMax/2 {
		t.Errorf("a call to the idle process took %v: the call did not wake it", d)
	}
}

// switches is the voluntary context switches of all of pid's threads.
func switches(t *testing.T, pid int) int {
	t.Helper()
	dirs, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range dirs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, d.Name()))
		if err != nil {
			continue // the thread ended
		}
		for line := range bytes.Lines(b) {
			if v, ok := bytes.CutPrefix(line, []byte("voluntary_ctxt_switches:")); ok {
				k, _ := strconv.Atoi(string(bytes.TrimSpace(v)))
				n += k
			}
		}
	}
	return n
}

func BenchmarkRoundTripCrossProcess(b *testing.B) {
	for _, size := range []int{128, 4096} {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			g := newGroup(b, 64<<10, 1)
			p := startUAP(b, g, 0)
			attached(b, g, p)
			req := make([]byte, size)
			for range 100 {
				call(b, g, p.Proc, "echo", req)
			}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				call(b, g, p.Proc, "echo", req)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/roundtrip")
		})
	}
}

// hostileUAP is a UAP that does not use the library and attacks what it can
// reach: it tries to write the group page every way it can (and prints
// what happened), then answers its calls with forgeries by number: 1 an
// unknown status, 2 a reply longer than the buffer, later ones a plain
// echo. Between calls it rings its doorbell without cause. (Whatever it
// writes in its area concerns only the calls handed to it: the honest
// process beside it is the proof.)
func hostileUAP() {
	const area, group, bell = 3, 4, 5
	try := func(what string, err error) {
		fmt.Printf("%s: %v\n", what, err)
	}
	_, err := syscall.Mmap(group, 0, pageSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	try("mmap group page writable", err)
	ro, err := syscall.Mmap(group, 0, pageSize, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		try("mmap group page read-only", err)
		os.Exit(4)
	}
	try("mprotect group page writable", syscall.Mprotect(ro, syscall.PROT_READ|syscall.PROT_WRITE))
	_, err = syscall.Pwrite(group, []byte{1}, gClosed)
	try("pwrite group page", err)
	try("ftruncate group page", syscall.Ftruncate(group, 0))
	fmt.Println("probes done")
	mem, err := syscall.Mmap(area, 0, int(areaSize(64, testMailboxes)), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		fmt.Println("mmap area:", err)
		os.Exit(4)
	}
	ctl := (*procCtl)(unsafe.Pointer(&mem[0]))
	ctl.pid.Store(uint32(os.Getppid())) // it claims to be the node
	ctl.state.Store(stateReady)
	ring(bell)
	seen := uint64(0)
	for {
		no := ctl.dispatchNo.Load()
		if no == seen {
			ring(bell)
			time.Sleep(time.Millisecond)
			continue
		}
		seen = no
		var m *mailbox
		for i := range ctl.mailboxes {
			if ctl.mb[i].claim.Load()>>2 == no {
				m = &ctl.mb[i]
			}
		}
		if m == nil {
			continue // revoked before it looked
		}
		m.claim.Store(no<<2 | claimTaken)
		switch no {
		case 1:
			m.status.Store(99)
		case 2:
			m.status.Store(uint32(StatusOK))
			m.replyLen.Store(1 << 30)
		default:
			m.status.Store(uint32(StatusOK))
			m.replyLen.Store(m.reqLen)
		}
		ctl.doneNo.Store(no)
		ring(bell)
	}
}

func TestHostileUAP(t *testing.T) {
	g := newGroup(t, 64, 2)
	// The hostile process in slot 0.
	hp, err := g.NewProc(0)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperUAP$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=hostile")
	cmd.ExtraFiles = hp.Files()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	hp.SetPID(cmd.Process.Pid)
	honest := startUAP(t, g, 1)
	attached(t, g, honest)
	until(t, g, 10*time.Second, "the hostile process to attach", hp.Attach)

	var report bytes.Buffer
	buf := make([]byte, 4096)
	for !bytes.Contains(report.Bytes(), []byte("probes done")) {
		n, err := out.Read(buf)
		if err != nil {
			t.Fatalf("hostile UAP output %q: %v", report.String(), err)
		}
		report.Write(buf[:n])
	}
	for _, refused := range []string{
		"mmap group page writable: operation not permitted",
		"mprotect group page writable: permission denied",
		"pwrite group page: operation not permitted",
		"ftruncate group page: operation not permitted",
	} {
		if !bytes.Contains(report.Bytes(), []byte(refused)) {
			t.Errorf("the hostile UAP was not refused %q; it reported:\n%s", refused, report.String())
		}
	}
	if g.gp.closed.Load() != 0 {
		t.Fatal("the hostile UAP closed the group")
	}

	// Its forged completions: a protocol error, never a reply.
	for no, why := range []string{1: "completion status 99", 2: "reply of 1073741824 bytes"} {
		if no == 0 {
			continue
		}
		if err := hp.Dispatch("echo", []byte("x"), 0); err != nil {
			t.Fatal(err)
		}
		hp.Wake()
		var perr error
		until(t, g, 10*time.Second, "the hostile completion", func() bool {
			_, ok, err := hp.Completion()
			perr = err
			return ok
		})
		var pe *ProtocolError
		if !errors.As(perr, &pe) || pe.Why[:12] != why[:12] {
			t.Errorf("forgery %d: %v, want a protocol error about %s", no, perr, why)
		} else if pe.PID != cmd.Process.Pid {
			// Issue 27 break 6: the log named the node's pid, as the
			// process wrote it in its area.
			t.Errorf("forgery %d: the protocol error names pid %d, want the started process's %d", no, pe.PID, cmd.Process.Pid)
		}
		// The honest process is untouched.
		if c := call(t, g, honest.Proc, "echo", []byte("honest")); c.Status != StatusOK || string(c.Reply) != "honest" {
			t.Fatalf("honest process: %v %q", c.Status, c.Reply)
		}
	}
	if c := call(t, g, hp, "echo", []byte("three")); c.Status != StatusOK || string(c.Reply) != "three" {
		t.Errorf("hostile echo: %v %q", c.Status, c.Reply)
	}
	if hp.Rings() < 2 {
		t.Errorf("the hostile doorbell woke the reader %d times; the reader must count them", hp.Rings())
	}
}

// In socket mode a request over max_message_size is a protocol error on
// the UAP side: Serve returns an error (the process should exit).
func TestSocketProtocolErrorFromNode(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	nf := os.NewFile(uintptr(fds[0]), "node")
	node, err := net.FileConn(nf)
	nf.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	node.SetDeadline(time.Now().Add(10 * time.Second))
	go func() {
		h := make([]byte, sockwire.HeaderSize)
		if _, err := sockwire.Read(node, h, 0, uint8(statusEnd)); err != nil {
			return
		}
		sockwire.Put(h, sockwire.Msg{Kind: sockwire.KindWelcome, A: 64, B: sockwire.Version})
		node.Write(h)
		sockwire.Put(h, sockwire.Msg{Kind: sockwire.KindRequest, NameLen: 4, PayLen: 65, A: 1})
		node.Write(h)
	}()
	u, err := attachSocket(fds[1], false)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if u.MaxMessage() != 64 {
		t.Fatalf("MaxMessage %d", u.MaxMessage())
	}
	u.Handle("echo", func(req []byte) ([]byte, error) { return req, nil })
	done := make(chan error, 1)
	go func() { done <- u.Serve() }()
	select {
	case err := <-done:
		if !errors.Is(err, sockwire.ErrProtocol) {
			t.Fatalf("Serve = %v, want a protocol error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve still running")
	}
}

// waitCompletion waits for p's next completion.
func waitCompletion(tb testing.TB, g *Group, p *Proc) Completion {
	tb.Helper()
	var c Completion
	until(tb, g, 10*time.Second, "a completion", func() bool {
		var ok bool
		var err error
		c, ok, err = p.Completion()
		if err != nil {
			tb.Fatal(err)
		}
		return ok
	})
	return c
}

// A process handed calls before it finished the current one runs them
// all, in order, each from its own buffer.
func TestCrossProcessPrefetch(t *testing.T) {
	g := newGroup(t, 64, 1)
	p := startUAP(t, g, 0)
	attached(t, g, p)
	for i := range 200 {
		var sent []string
		for j := range testMailboxes {
			req := fmt.Sprintf("call %d.%d", i, j)
			if err := p.Dispatch("echo", []byte(req), 0); err != nil {
				t.Fatal(err)
			}
			sent = append(sent, req)
		}
		if err := p.Dispatch("echo", nil, 0); err != errBusy {
			t.Fatalf("a call beyond %d mailboxes: %v, want errBusy", testMailboxes, err)
		}
		p.Wake()
		for _, want := range sent {
			if c := waitCompletion(t, g, p.Proc); string(c.Reply) != want {
				t.Fatalf("reply %q, want %q", c.Reply, want)
			}
		}
	}
}

// A prefetched call revoked before the process took it never runs; one it
// took cannot be revoked.
func TestCrossProcessRevoke(t *testing.T) {
	g := newGroup(t, 64, 1)
	p := startUAP(t, g, 0)
	attached(t, g, p)
	if err := p.Dispatch("sleep", []byte("100ms"), 0); err != nil {
		t.Fatal(err)
	}
	if err := p.Dispatch("pid", []byte("revoked"), 0); err != nil {
		t.Fatal(err)
	}
	p.Wake()
	if ok := p.Revoke(); !ok {
		t.Fatalf("revoke = %v; the next call cannot have been taken while the process slept 100 ms", ok)
	}
	if err := p.Dispatch("echo", []byte("after"), 0); err != nil {
		t.Fatal(err)
	}
	if c := waitCompletion(t, g, p.Proc); string(c.Reply) != "100ms" {
		t.Fatalf("first reply %q", c.Reply)
	}
	if c := waitCompletion(t, g, p.Proc); string(c.Reply) != "after" {
		t.Fatalf("after a revoke the process answered %q, want the call after it", c.Reply)
	}
	// Taken: the revoke fails.
	if err := p.Dispatch("sleep", []byte("1ms"), 0); err != nil {
		t.Fatal(err)
	}
	if err := p.Dispatch("sleep", []byte("200ms"), 0); err != nil {
		t.Fatal(err)
	}
	p.Wake()
	until(t, g, 10*time.Second, "the process to take its next call", func() bool { return p.Taken() == 2 })
	if p.Revoke() {
		t.Fatal("revoked a call the process had taken")
	}
	waitCompletion(t, g, p.Proc)
	if c := waitCompletion(t, g, p.Proc); string(c.Reply) != "200ms" {
		t.Fatalf("reply %q", c.Reply)
	}
}

// waitStopped waits until every thread of process pid is stopped (state T
// in /proc): a SIGSTOP takes effect some time after kill returns, and one
// thread at a time. The thread it wakes to stop the others may wait for a
// CPU while another, running, goes on: a Go UAP's serving thread took a
// call made after kill had returned (TestLaneErrors, on a busy machine).
func waitStopped(tb testing.TB, pid int) {
	tb.Helper()
	end := time.Now().Add(10 * time.Second)
	for time.Now().Before(end) {
		if allStopped(tb, pid) {
			return
		}
		time.Sleep(time.Millisecond)
	}
	tb.Fatalf("process %d did not stop", pid)
}

func allStopped(tb testing.TB, pid int) bool {
	tb.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(tasks) == 0 {
		tb.Fatalf("the threads of process %d: %v", pid, err)
	}
	for _, task := range tasks {
		b, err := os.ReadFile(task)
		if err != nil {
			return false // a thread that ended as we looked: look again
		}
		// tid (comm) state ...: the state follows the last ')'.
		if i := bytes.LastIndexByte(b, ')'); i <= 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}

// A call a process took may have run, so it must not run again elsewhere:
// Taken counts up to the last call taken, even when a hostile process took
// a later one and left an earlier one offered.
func TestTakenCountsUpToTheLastTaken(t *testing.T) {
	g := newGroup(t, 64, 1)
	p, err := g.NewProc(0)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := p.Dispatch("echo", []byte("x"), 0); err != nil {
			t.Fatal(err)
		}
	}
	take := func(no uint64) {
		for i := range p.ctl.mailboxes {
			if m := &p.ctl.mb[i]; m.claim.Load() == no<<2 {
				m.claim.Store(no<<2 | claimTaken)
				return
			}
		}
		t.Fatalf("call %d is in no mailbox", no)
	}
	if got := p.Taken(); got != 0 {
		t.Fatalf("none taken: Taken %d, want 0", got)
	}
	take(2) // out of order: call 1 is still offered
	if got := p.Taken(); got != 2 {
		t.Fatalf("call 2 taken before call 1: Taken %d, want 2", got)
	}
	take(1)
	if got := p.Taken(); got != 2 {
		t.Fatalf("calls 1 and 2 taken: Taken %d, want 2", got)
	}
}

// TestRemovedAreaHasNoPages: a process passed its area's descriptor to a
// child that outlives it (here: a dup the test keeps). Once the node
// removes the process, the area holds no page: a UAP whose every life
// leaves such a child cannot grow the node's memory by an area per life
// (issue 27 break 3).
func TestRemovedAreaHasNoPages(t *testing.T) {
	g := newGroup(t, 1<<20, 1)
	p, err := g.NewProc(0)
	if err != nil {
		t.Fatal(err)
	}
	kept, err := unix.Dup(int(p.area.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(kept)
	for i := range p.mem { // every page written, as requests are
		p.mem[i] = 1
	}
	blocks := func() int64 {
		var st unix.Stat_t
		if err := unix.Fstat(kept, &st); err != nil {
			t.Fatal(err)
		}
		return st.Blocks
	}
	if b := blocks(); b*512 < int64(len(p.mem)) {
		t.Fatalf("the written area holds %d bytes, want at least %d", b*512, len(p.mem))
	}
	g.Remove(0)
	g.unmapRetired()
	if b := blocks(); b != 0 {
		t.Errorf("a removed area still holds %d bytes for the descriptor a child kept", b*512)
	}
}
