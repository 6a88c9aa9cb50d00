package shm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"tpsched/internal/testenv"
)

// The tests of this file drive the C UAP library (uap-c/, through the
// example examples/uap-c) with the scheduler side of this package, as the
// cross-process tests of uap_test.go drive the Go UAP: the same protocol,
// kept by a second implementation.

// cDir is where TestMain's first user built the C UAPs; removed after the
// tests.
var (
	cOnce  sync.Once
	cDir   string
	cErr   error
	cSkip  string
	cBuilt = map[string]string{}
)

func TestMain(m *testing.M) {
	code := m.Run()
	if cDir != "" {
		os.RemoveAll(cDir)
	}
	os.Exit(code)
}

// cFlags are the Makefile's UAP_CFLAGS: a warning fails the build here too.
var cFlags = testenv.UAPCFlags

// repoFile is a path in the repository, from this package's directory.
func repoFile(parts ...string) string { return filepath.Join(append([]string{".."}, parts...)...) }

// gcc runs the C compiler with args, in dir, bounded in time.
func gcc(dir string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "gcc", args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("gcc %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// cUAP builds the example C UAP (once per variant of extra compiler
// flags) and returns its path; the test is skipped if there is no gcc.
func cUAP(tb testing.TB, extra ...string) string {
	tb.Helper()
	root := cBuildDir(tb)
	key := strings.Join(extra, " ")
	if p, ok := cBuilt[key]; ok {
		return p
	}
	out := filepath.Join(cDir, fmt.Sprintf("uap-echo-c-%d", len(cBuilt)))
	args := append(append(append([]string{}, cFlags...), extra...),
		"-I", filepath.Join(root, "uap-c"), "-o", out,
		filepath.Join(root, "examples/uap-c/uap_echo.c"), filepath.Join(root, "uap-c/tpsched_uap.c"))
	if err := gcc(root, args...); err != nil {
		tb.Fatal(err)
	}
	cBuilt[key] = out
	return out
}

// cBuildDir makes cDir once and returns the repository's root; the test
// is skipped if there is no gcc.
func cBuildDir(tb testing.TB) string {
	tb.Helper()
	cOnce.Do(func() {
		if _, err := exec.LookPath("gcc"); err != nil {
			cSkip = fmt.Sprintf("the C UAP library needs gcc: %v", err)
			return
		}
		cDir, cErr = os.MkdirTemp("", "tpsched-cuap-")
	})
	if cSkip != "" {
		tb.Skip(cSkip)
	}
	if cErr != nil {
		tb.Fatal(cErr)
	}
	root, err := filepath.Abs(repoFile())
	if err != nil {
		tb.Fatal(err)
	}
	return root
}

// CProgram builds a test's own C UAP, the C source src, with the library
// (for package shm_test, as CUAP); the test is skipped without gcc.
func CProgram(tb testing.TB, name, src string) string {
	tb.Helper()
	root := cBuildDir(tb)
	c := filepath.Join(cDir, name+".c")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		tb.Fatal(err)
	}
	out := filepath.Join(cDir, name)
	args := append(append([]string{}, cFlags...), "-I", filepath.Join(root, "uap-c"), "-o", out, c, filepath.Join(root, "uap-c/tpsched_uap.c"))
	if err := gcc(root, args...); err != nil {
		tb.Fatal(err)
	}
	return out
}

// startCUAP runs the C UAP prog in slot with a fresh area, killed at
// cleanup.
func startCUAP(tb testing.TB, prog string, g *Group, slot int, env ...string) *uapProc {
	tb.Helper()
	p, err := g.NewProc(slot)
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(prog)
	cmd.Env = append(os.Environ(), "TPSCHED_SHM_FD=3")
	cmd.Env = append(cmd.Env, env...)
	return &uapProc{Proc: p, cmd: cmd, done: startProcess(tb, cmd, p.Files())}
}

// TestCUAPHandlers: the example C UAP registers its entries in order and
// its handlers read their arguments as documented (the protocol's statuses
// are TestUAPProtocol's, for every implementation).
func TestCUAPHandlers(t *testing.T) {
	prog := cUAP(t)
	g := newGroup(t, 64, 1)
	p := startCUAP(t, prog, g, 0)
	attached(t, g, p)
	if got, want := strings.Join(p.Entries(), " "), "echo sleep burn cpu fail pid calls crash call"; got != want {
		t.Errorf("registered entries %q, want %q", got, want)
	}
	for _, c := range []struct {
		entry, req string
		status     Status
		reply      string
	}{
		{"sleep", "x", StatusAppError, `want a non-negative decimal number, got "x"`},
		{"sleep", "1 tag", StatusOK, "1 tag"},
		{"pid", "", StatusOK, strconv.Itoa(p.cmd.Process.Pid)},
		// An entry name as long as the layout allows, which no handler has.
		{strings.Repeat("e", 32), "", StatusNoSuchService, strings.Repeat("e", 32)},
	} {
		got := call(t, g, p.Proc, c.entry, []byte(c.req))
		if got.Status != c.status || string(got.Reply) != c.reply {
			t.Errorf("%s %q: %v %q, want %v %q", c.entry, c.req, got.Status, got.Reply, c.status, c.reply)
		}
	}
}

// A handler's message longer than a tiny max_message_size is cut to it, and
// so is a no-such-service reply.
func TestCUAPTinyMaxMessage(t *testing.T) {
	prog := cUAP(t)
	g := newGroup(t, 3, 1)
	p := startCUAP(t, prog, g, 0)
	attached(t, g, p)
	for _, c := range []struct {
		entry  string
		status Status
		reply  string
	}{
		{"fail", StatusAppError, "fai"},
		{"nope", StatusNoSuchService, "nop"},
		{"echo", StatusOK, "abc"},
	} {
		got := call(t, g, p.Proc, c.entry, []byte("abc"))
		if got.Status != c.status || string(got.Reply) != c.reply {
			t.Errorf("%s: %v %q, want %v %q", c.entry, got.Status, got.Reply, c.status, c.reply)
		}
	}
}

// TestCUAPCrash: a C handler that crashes the process had taken its call
// (the node answers it 'server terminated'); its half-written reply is
// never a completion.
func TestCUAPCrash(t *testing.T) {
	prog := cUAP(t)
	g := newGroup(t, 64, 1)
	p := startCUAP(t, prog, g, 0)
	attached(t, g, p)
	if err := p.Dispatch("crash", nil, 0); err != nil {
		t.Fatal(err)
	}
	p.Wake()
	err := p.wait(t, 10*time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGSEGV {
		t.Fatalf("crash: the process ended with %v, want SIGSEGV", err)
	}
	if p.Holding() != 1 || p.Taken() != 1 {
		t.Fatalf("crashed in its handler: holding %d, taken %d", p.Holding(), p.Taken())
	}
	if _, ok, _ := p.Completion(); ok {
		t.Fatal("a crashed handler's call has a completion")
	}
	// Killed before it took its call: not taken, so it may go elsewhere.
	q := startCUAP(t, prog, g, 0)
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
	r := startCUAP(t, prog, g, 0)
	attached(t, g, r)
	if c := call(t, g, r.Proc, "echo", []byte("after")); string(c.Reply) != "after" {
		t.Fatalf("reply %q", c.Reply)
	}
}

// A C process handed its next call before it finished the current one runs
// both, in order, from their own buffers.
func TestCUAPPrefetch(t *testing.T) {
	prog := cUAP(t)
	g := newGroup(t, 64, 1)
	p := startCUAP(t, prog, g, 0)
	attached(t, g, p)
	for i := range 200 {
		a, b := []byte("a"+strconv.Itoa(i)), []byte("b"+strconv.Itoa(i))
		if err := p.Dispatch("echo", a, 0); err != nil {
			t.Fatal(err)
		}
		if err := p.Dispatch("echo", b, 0); err != nil {
			t.Fatal(err)
		}
		p.Wake()
		if c := waitCompletion(t, g, p.Proc); string(c.Reply) != string(a) {
			t.Fatalf("first reply %q, want %q", c.Reply, a)
		}
		if c := waitCompletion(t, g, p.Proc); string(c.Reply) != string(b) {
			t.Fatalf("second reply %q, want %q", c.Reply, b)
		}
	}
}

// A prefetched call revoked before the C process took it never runs (the
// process skips its number); one it took cannot be revoked.
func TestCUAPRevoke(t *testing.T) {
	prog := cUAP(t)
	g := newGroup(t, 64, 1)
	p := startCUAP(t, prog, g, 0)
	attached(t, g, p)
	for i := range 3 { // each round skips a number, so parities shift
		if err := p.Dispatch("sleep", []byte("100"), 0); err != nil {
			t.Fatal(err)
		}
		if err := p.Dispatch("pid", []byte("revoked"), 0); err != nil {
			t.Fatal(err)
		}
		p.Wake()
		if ok := p.Revoke(); !ok {
			t.Fatalf("round %d: revoke = %v; the next call cannot have been taken while the process slept 100 ms", i, ok)
		}
		after := []byte("after " + strconv.Itoa(i))
		if err := p.Dispatch("echo", after, 0); err != nil {
			t.Fatal(err)
		}
		if c := waitCompletion(t, g, p.Proc); string(c.Reply) != "100" {
			t.Fatalf("round %d: first reply %q", i, c.Reply)
		}
		if c := waitCompletion(t, g, p.Proc); string(c.Reply) != string(after) {
			t.Fatalf("round %d: after a revoke the process answered %q, want %q", i, c.Reply, after)
		}
	}
	// Each round ran its sleep and its echo, never the revoked call, and
	// nothing twice; this call is the 7th.
	if c := call(t, g, p.Proc, "calls", nil); string(c.Reply) != "7" {
		t.Fatalf("the process ran %s handlers, want 7: a revoked or completed call ran", c.Reply)
	}
	if err := p.Dispatch("sleep", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	if err := p.Dispatch("sleep", []byte("200"), 0); err != nil {
		t.Fatal(err)
	}
	p.Wake()
	until(t, g, 10*time.Second, "the process to take its next call", func() bool { return p.Taken() == 2 })
	if p.Revoke() {
		t.Fatal("revoked a call the process had taken")
	}
	waitCompletion(t, g, p.Proc)
	if c := waitCompletion(t, g, p.Proc); string(c.Reply) != "200" {
		t.Fatalf("reply %q", c.Reply)
	}
}

// TestCUAPNoLostWakeups: many calls one at a time to two C processes built
// with 10 s futex sleeps and no spinning: a lost wake-up stalls the test.
func TestCUAPNoLostWakeups(t *testing.T) {
	prog := cUAP(t, "-DTPSCHED_MAX_SLEEP_NS=10000000000LL")
	old := maxSleep
	maxSleep = 10 * time.Second
	defer func() { maxSleep = old }()
	g := newGroup(t, 64, 2)
	ps := []*uapProc{startCUAP(t, prog, g, 0, "TPSCHED_SPIN_US=0"), startCUAP(t, prog, g, 1, "TPSCHED_SPIN_US=0")}
	attached(t, g, ps...)
	start := time.Now()
	for i := range 4000 {
		p := ps[i%2]
		if i%7 == 0 {
			time.Sleep(50 * time.Microsecond) // let both sides fall asleep now and then
		}
		if err := p.Dispatch("echo", []byte{byte(i)}, 0); err != nil {
			t.Fatal(err)
		}
		p.Wake()
		// Either side's lost wake-up costs a 10 s sleep.
		sent := time.Now()
		for {
			c, ok, err := p.Completion()
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				if len(c.Reply) != 1 || c.Reply[0] != byte(i) {
					t.Fatalf("call %d: %v", i, c.Reply)
				}
				break
			}
			if d := time.Since(sent); d > 3*time.Second {
				t.Fatalf("call %d unanswered after %v: a wake-up was lost", i, d)
			}
			g.Wait(10 * time.Millisecond)
		}
	}
	if d := time.Since(start); d > 9*time.Second {
		t.Fatalf("4000 calls took %v: a wake-up was lost", d)
	}
	// The group closes: the sleeping processes see it at once, not after
	// their 10 s bound.
	closed := time.Now()
	g.Close()
	for _, p := range ps {
		if err := p.wait(t, 5*time.Second); err != nil {
			t.Fatalf("exit after close: %v", err)
		}
	}
	if d := time.Since(closed); d > 2*time.Second {
		t.Errorf("the processes left %v after the group closed", d)
	}
}

// TestCUAPAttachErrors: a C UAP not started by scdd says what is wrong and
// exits 2.
func TestCUAPAttachErrors(t *testing.T) {
	prog := cUAP(t)
	for _, c := range []struct {
		env  []string
		want string
	}{
		{nil, "fd 3 is not a tpsched process area (a UAP must be started by scdd"},
		{[]string{"TPSCHED_SHM_FD=x"}, `TPSCHED_SHM_FD="x": not a file descriptor`},
		{[]string{"TPSCHED_RECEIVE=pipe"}, `TPSCHED_RECEIVE="pipe": want queue or socket`},
		{[]string{"TPSCHED_RECEIVE=socket"}, "TPSCHED_RECEIVE=socket but fd 3 is not a socket"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cmd := exec.CommandContext(ctx, prog)
		cmd.Env = append(os.Environ(), c.env...)
		out, err := cmd.CombinedOutput()
		cancel()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), c.want) {
			t.Errorf("env %q: exit %v, output %q; want exit 2 and %q", c.env, err, out, c.want)
		}
	}
}

func BenchmarkRoundTripCrossProcessC(b *testing.B) {
	prog := cUAP(b)
	for _, size := range []int{128, 4096} {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			g := newGroup(b, 64<<10, 1)
			p := startCUAP(b, prog, g, 0)
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

// CUAP is the example C UAP, built once, for the protocol suite (package
// shm_test); the test is skipped without gcc.
func CUAP(tb testing.TB) string { return cUAP(tb) }
