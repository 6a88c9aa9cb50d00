package itest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"tpsched/internal/testenv"
	"tpsched/netio"
	"tpsched/scd"
	"tpsched/scd/client"
)

// The tests of this file run the C UAP (uap-c/, through its example
// examples/uap-c, built by `make uap-c` with gcc) under a real scdd.

var (
	cuapOnce sync.Once
	cuapPath string
	cuapSkip string
	cuapErr  error
)

// cuapModule builds the C UAP library and uap-echo-c with the Makefile's
// target into the tests' binary directory (where a root scdd's UAP users
// can reach it), once; the test is skipped without gcc or make.
func cuapModule(t *testing.T) string {
	t.Helper()
	cuapOnce.Do(func() {
		for _, tool := range []string{"gcc", "make"} {
			if _, err := exec.LookPath(tool); err != nil {
				cuapSkip = fmt.Sprintf("the C UAP needs %s: %v", tool, err)
				return
			}
		}
		dir := filepath.Join(binDir, "c")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		wd, err := os.Getwd()
		if err != nil {
			cuapErr = err
			return
		}
		out, err := exec.CommandContext(ctx, "make", "-C", filepath.Dir(wd), "--no-print-directory",
			"BIN="+dir, "VERSION=v0.0.0-itest", "uap-c").CombinedOutput()
		if err != nil {
			cuapErr = fmt.Errorf("make uap-c: %w\n%s", err, out)
			return
		}
		cuapPath = filepath.Join(dir, "uap-echo-c")
	})
	if cuapSkip != "" {
		t.Skip(cuapSkip)
	}
	must(t, cuapErr)
	return cuapPath
}

// cuapServer is a usr file of a group served by uap-echo-c. "ghost" is in
// the definition but not registered by the UAP.
func cuapServer(module, group string, procs int, extra string) string {
	return fmt.Sprintf(`set service_group = %q
set service = "echo=echo", "sleep=sleep", "fail=fail", "crash=crash", "pid=pid", "calls=calls", "ghost=ghost", "call=call"
set module = %q
set parallel_count = %d
set queue_size = 64
set max_message_size = 2097152
%s`, group, module, procs, extra)
}

// procOf is the status of a group's process in slot.
func procOf(t *testing.T, n *node, group string, slot int) scd.ProcessStatus {
	t.Helper()
	for _, p := range groupStatus(t, n, group).Processes {
		if p.Slot == slot {
			return p
		}
	}
	t.Fatalf("group %s has no process in slot %d", group, slot)
	return scd.ProcessStatus{}
}

// echoSizes calls echo with payloads of every size and checks each byte.
func echoSizes(ctx context.Context, t *testing.T, c *client.Client, group string) {
	t.Helper()
	for _, size := range []int{0, 1, 4095, 4096, 64 << 10, 1 << 20} {
		p := make([]byte, size)
		for i := range p {
			p[i] = byte(i*7 + size)
		}
		reply, err := c.Call(ctx, group, "echo", p)
		if err != nil || !bytes.Equal(reply, p) {
			t.Fatalf("echo of %d B: %d B back (equal %v), %v", size, len(reply), bytes.Equal(reply, p), err)
		}
	}
}

// TestCUAPUnderScdd: echo (0 B to 1 MiB), an application error, an entry
// the UAP does not register, a crash mid-call answered 'server terminated'
// with the process replaced, prefetch, a revoked prefetched call, and
// socket mode, with the C UAP under a real scdd.
func TestCUAPUnderScdd(t *testing.T) {
	testenv.Slow(t, "runs for seconds; 5 s without -race on a busy 2-core machine")
	skipShort(t)
	module := cuapModule(t)
	dir := defDir(t, "", map[string]string{
		"one":  cuapServer(module, "one", 1, ""),
		"two":  cuapServer(module, "two", 2, ""),
		"sock": cuapServer(module, "sock", 1, "set receive_from = socket\n"),
	})
	n := startNode(t, "-c", dir)
	c := n.client()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	t.Run("echo", func(t *testing.T) { echoSizes(ctx, t, c, "one") })

	t.Run("-version", func(t *testing.T) {
		out, err := exec.CommandContext(ctx, module, "-version").Output()
		if err != nil || !strings.HasPrefix(string(out), "uap-echo-c ") || !strings.Contains(string(out), "layout 5") {
			t.Fatalf("uap-echo-c -version: %q, %v", out, err)
		}
	})

	t.Run("application error", func(t *testing.T) {
		_, err := c.Call(ctx, "one", "fail", []byte("x"))
		var ne *netio.Error
		if codeOf(err) != netio.CodeApplication || !errors.As(err, &ne) || ne.Message != "failure requested" {
			t.Fatalf("fail: %v, want application error \"failure requested\"", err)
		}
		if _, err := c.Call(ctx, "one", "sleep", []byte("soon")); codeOf(err) != netio.CodeApplication ||
			!strings.Contains(err.Error(), `want a non-negative decimal number, got "soon"`) {
			t.Fatalf("sleep soon: %v, want the handler's message", err)
		}
	})

	t.Run("entry not registered", func(t *testing.T) {
		if _, err := c.Call(ctx, "one", "ghost", nil); codeOf(err) != netio.CodeNoSuchService {
			t.Fatalf("ghost: %v, want no such service", err)
		}
		// scdd read the C UAP's entry table (page 1) for its warning.
		if log := n.stderr.String(); !strings.Contains(log, `entry \"ghost\" of service ghost is not registered`) ||
			!strings.Contains(log, "it registers [echo sleep burn cpu fail pid calls crash call]") {
			t.Errorf("no warning naming the entries the C UAP registers:\n%s", log)
		}
	})

	t.Run("crash mid-call", func(t *testing.T) {
		before := procOf(t, n, "one", 0)
		if _, err := c.Call(ctx, "one", "crash", []byte("x")); codeOf(err) != netio.CodeServerTerminated {
			t.Fatalf("crash: %v, want server terminated", err)
		}
		waitFor(t, 10*time.Second, "the crashed process to be replaced", func() bool {
			p := procOf(t, n, "one", 0)
			return p.PID != 0 && p.PID != before.PID && p.Restarts == before.Restarts+1
		})
		if pidAlive(before.PID) {
			t.Errorf("the crashed UAP %d is alive", before.PID)
		}
		var reply []byte
		waitFor(t, 10*time.Second, "the new process to serve", func() bool {
			var err error
			reply, err = c.Call(ctx, "one", "pid", nil)
			return err == nil
		})
		if now := procOf(t, n, "one", 0).PID; string(reply) != strconv.Itoa(now) {
			t.Errorf("pid %s answered, the slot's process is %d", reply, now)
		}
		echoSizes(ctx, t, c, "one")
	})

	t.Run("prefetch", func(t *testing.T) {
		// One process, four callers: while it sleeps on one call the node
		// hands it the next, which it runs from its other mailbox.
		pid := procOf(t, n, "one", 0).PID
		runsBefore := callsOf(ctx, t, c, "one")
		const callers = 4
		errs := make(chan error, callers)
		for i := range callers {
			go func() {
				msg := []byte(fmt.Sprintf("200 caller%d", i))
				reply, err := c.Call(ctx, "one", "sleep", msg)
				if err == nil && !bytes.Equal(reply, msg) {
					err = fmt.Errorf("reply %q to %q", reply, msg)
				}
				errs <- err
			}()
		}
		waitFor(t, 5*time.Second, "the process to hold a call and the next one", func() bool {
			return procOf(t, n, "one", 0).Calls == 2
		})
		for range callers {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
		if p := procOf(t, n, "one", 0); p.PID != pid {
			t.Fatalf("the process changed (%d, was %d)", p.PID, pid)
		}
		// Each call ran once: the four sleeps and this call.
		if runs := callsOf(ctx, t, c, "one"); runs != runsBefore+callers+1 {
			t.Errorf("the process ran %d handlers, want %d", runs-runsBefore, callers+1)
		}
	})

	t.Run("revoked prefetched call", func(t *testing.T) {
		revokedPrefetch(ctx, t, n, c)
	})

	t.Run("local call", func(t *testing.T) {
		// one's C process calls two's (C) and back, and an error comes
		// back as one.
		for _, size := range []int{0, 1, 4096, 64 << 10} {
			want := bytes.Repeat([]byte{'c'}, size)
			got, err := c.Call(ctx, "one", "call", append([]byte("two/echo/"), want...))
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("one/call two/echo of %d B: %d B back, %v", size, len(got), err)
			}
		}
		if _, err := c.Call(ctx, "one", "call", []byte("two/fail/x")); codeOf(err) != netio.CodeApplication ||
			!strings.Contains(err.Error(), "call two/fail: application error: failure requested") {
			t.Fatalf("one/call two/fail: %v", err)
		}
		if _, err := c.Call(ctx, "sock", "call", []byte("two/echo/x")); codeOf(err) != netio.CodeApplication ||
			!strings.Contains(err.Error(), "not supported") {
			t.Fatalf("a call from socket mode: %v; want ENOTSUP as an application error", err)
		}
	})

	t.Run("socket mode", func(t *testing.T) {
		if g := groupStatus(t, n, "sock"); g.Receive != "socket" || len(g.Processes) != 1 {
			t.Fatalf("status %+v: want one process receiving from a socket", g)
		}
		echoSizes(ctx, t, c, "sock")
		if _, err := c.Call(ctx, "sock", "fail", nil); codeOf(err) != netio.CodeApplication || !strings.Contains(err.Error(), "failure requested") {
			t.Fatalf("fail over the socket: %v", err)
		}
		if _, err := c.Call(ctx, "sock", "ghost", nil); codeOf(err) != netio.CodeNoSuchService {
			t.Fatalf("ghost over the socket: %v", err)
		}
		if _, err := c.Call(ctx, "sock", "crash", nil); codeOf(err) != netio.CodeServerTerminated {
			t.Fatalf("crash over the socket: %v, want server terminated", err)
		}
		waitFor(t, 10*time.Second, "the socket server to serve again", func() bool {
			_, err := c.Call(ctx, "sock", "echo", []byte("again"))
			return err == nil
		})
	})

	if log := n.stderr.String(); strings.Contains(log, "broke the protocol") || strings.Contains(log, "uap-echo-c:") {
		t.Errorf("the C UAP broke the protocol or failed:\n%s", log)
	}
}

// callsOf asks a group's (single) process how many handlers it ran.
func callsOf(ctx context.Context, t *testing.T, c *client.Client, group string) int {
	t.Helper()
	reply, err := c.Call(ctx, group, "calls", nil)
	must(t, err)
	runs, err := strconv.Atoi(string(reply))
	must(t, err)
	return runs
}

// revokedPrefetch: with both processes of group "two" busy, a third call is
// prefetched to the one in the lower slot (the node's order); that one is
// made the stuck one (the longer call), so when the other becomes free the
// node asks the prefetched call back and the free process serves it, long
// before the stuck one could have.
func revokedPrefetch(ctx context.Context, t *testing.T, n *node, c *client.Client) {
	type result struct {
		reply []byte
		err   error
		at    time.Time
	}
	call := func(svc, msg string) chan result {
		ch := make(chan result, 1)
		go func() {
			reply, err := c.Call(ctx, "two", svc, []byte(msg))
			ch <- result{reply, err, time.Now()}
		}()
		return ch
	}
	busy := func(pred func(ps []scd.ProcessStatus) bool) []scd.ProcessStatus {
		var ps []scd.ProcessStatus
		waitFor(t, 5*time.Second, "the processes of two to take their calls", func() bool {
			ps = groupStatus(t, n, "two").Processes
			return len(ps) == 2 && pred(ps)
		})
		return ps
	}
	held := func(ps []scd.ProcessStatus) int { return ps[0].Calls + ps[1].Calls }
	busy(func(ps []scd.ProcessStatus) bool { return held(ps) == 0 && ps[0].PID != 0 && ps[1].PID != 0 })

	first := call("sleep", "1000 first")
	var firstSlot int
	for _, p := range busy(func(ps []scd.ProcessStatus) bool { return held(ps) == 1 }) {
		if p.Calls == 1 {
			firstSlot = p.Slot
		}
	}
	otherSlot := 1 - firstSlot
	// The lower slot is to be stuck: the first call if it went there, else
	// a longer second one (the usual case: the process ready last, slot 1,
	// takes the first call).
	second := "400 second"
	stuckSlot, freeSlot := firstSlot, otherSlot
	if firstSlot > otherSlot {
		second = "2500 second"
		stuckSlot, freeSlot = otherSlot, firstSlot
	}
	secondCh := call("sleep", second)
	busy(func(ps []scd.ProcessStatus) bool { return ps[0].Calls == 1 && ps[1].Calls == 1 })
	stuck, free := procOf(t, n, "two", stuckSlot), procOf(t, n, "two", freeSlot)
	t.Logf("sleep 1000 in slot %d, sleep %s in slot %d: stuck pid %d (slot %d), free pid %d (slot %d)",
		firstSlot, second, otherSlot, stuck.PID, stuckSlot, free.PID, freeSlot)

	prefetched := call("pid", "")
	waitFor(t, 5*time.Second, "the third call to be handed to the stuck process ahead", func() bool {
		return procOf(t, n, "two", stuckSlot).Calls == 2
	})
	r := <-prefetched
	if r.err != nil || string(r.reply) != strconv.Itoa(free.PID) {
		t.Fatalf("the prefetched call was answered %q, %v by pid %s; want the free process %d (stuck: %d)",
			r.reply, r.err, r.reply, free.PID, stuck.PID)
	}
	stuckCh := first
	if stuckSlot != firstSlot {
		stuckCh = secondCh
	}
	s := <-stuckCh
	if s.err != nil {
		t.Fatalf("the stuck process's call: %v", s.err)
	}
	if !r.at.Before(s.at) {
		t.Errorf("the revoked call was answered at %v, after the stuck process's own call (%v)", r.at, s.at)
	}
	for _, ch := range []chan result{first, secondCh} {
		if ch != stuckCh {
			if o := <-ch; o.err != nil {
				t.Errorf("the free process's call: %v", o.err)
			}
		}
	}
}

// TestCUAPDrain: SIGTERM with calls in flight on a C UAP (one running,
// three handed over ahead): each completes, a new call is refused,
// the C processes leave cleanly (none killed, none taken for a crash) and
// scdd exits 0.
func TestCUAPDrain(t *testing.T) {
	skipShort(t)
	module := cuapModule(t)
	dir := defDir(t, "", map[string]string{"slow": cuapServer(module, "slow", 1, "")})
	n := startNode(t, "-c", dir)
	c := n.client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pid := groupStatus(t, n, "slow").Processes[0].PID
	const inFlight = 4
	results := make(chan error, inFlight)
	for i := range inFlight {
		go func() {
			msg := []byte(fmt.Sprintf("250 call%d", i))
			reply, err := c.Call(ctx, "slow", "sleep", msg)
			if err == nil && !bytes.Equal(reply, msg) {
				err = fmt.Errorf("reply %q to %q", reply, msg)
			}
			results <- err
		}()
	}
	waitFor(t, 5*time.Second, "all calls to reach the process, three handed over ahead", func() bool {
		g := groupStatus(t, n, "slow")
		return g.InFlight == inFlight && g.Processes[0].Calls == inFlight
	})
	drainAndCheck(ctx, t, n, c, "slow", results, inFlight, "a call in flight at SIGTERM")
	if pidAlive(pid) {
		t.Errorf("C UAP %d still alive after scdd stopped", pid)
	}
	log := n.stderr.String()
	for _, bad := range []string{"restarting", "did not exit in time", "uap-echo-c:"} {
		if strings.Contains(log, bad) {
			t.Errorf("scdd's log says %q: the C UAP did not leave cleanly:\n%s", bad, log)
		}
	}
}
