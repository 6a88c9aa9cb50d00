package itest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"tpsched/internal/testenv"
	"tpsched/netio"
	"tpsched/scd/client"
)

// drainAndCheck sends the node SIGTERM and checks the drain: status says
// draining, a new call to group is refused 'node shutting down', each of
// the n calls whose results come on results (what names them) is
// answered, and scdd exits.
func drainAndCheck(ctx context.Context, t *testing.T, n *node, c *client.Client, group string, results <-chan error, calls int, what string) {
	t.Helper()
	n.signal(syscall.SIGTERM)
	waitFor(t, 5*time.Second, "status to say draining", func() bool {
		st, err := n.status()
		return err == nil && st.Draining
	})
	if _, err := c.Call(ctx, group, "echo", []byte("late")); codeOf(err) != netio.CodeShuttingDown {
		t.Errorf("call during drain: got %v, want node shutting down", err)
	}
	for range calls {
		if err := <-results; err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	if err := n.waitExit(15 * time.Second); err != nil {
		t.Errorf("scdd exit: %v\n%s", err, n.stderr.String())
	}
}

func skipShort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real scdd and UAP processes; skipped with -short")
	}
}

func codeOf(err error) netio.Code {
	var te *netio.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 255
}

const echoServer = `set service_group = %q
set service = "echo=echo", "sleep=sleep", "burn=burn", "fail=fail", "crash=crash", "pid=pid"
set module = MODULE
set parallel_count = %d
set queue_size = %d
set max_message_size = %d
`

func echoDef(group string, procs, queue, maxMsg int) string {
	return fmt.Sprintf(echoServer, group, procs, queue, maxMsg)
}

// TestThousandCallsTwoGroups sends 1,000 concurrent calls of 1 B to 1 MiB
// across two service groups and checks every byte that comes back.
func TestThousandCallsTwoGroups(t *testing.T) {
	skipShort(t)
	dir := defDir(t, "", map[string]string{
		"alpha": echoDef("alpha", 2, 1024, 1<<20),
		"beta":  echoDef("beta", 2, 1024, 1<<20),
	})
	n := startNode(t, "-c", dir)
	clients := make([]*client.Client, 8)
	for i := range clients {
		clients[i] = n.client()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const calls = 1000
	// The payloads are made before the calls start: made by the 1,000
	// goroutines at once (100 MB of race-checked writes), they starved the
	// clients' dials on a busy machine until one timed out.
	payloads := make([][]byte, calls)
	for i := range payloads {
		// Sizes spread evenly over 0..20 powers of two: 1 B .. 1 MiB.
		size := 1 << (i % 21)
		if size > 1 {
			size = size/2 + rand.IntN(size/2+1)
		}
		size = min(size, 1<<20)
		payloads[i] = make([]byte, size)
		for j := range payloads[i] {
			payloads[i][j] = byte(i*31 + j)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			payload := payloads[i]
			size := len(payload)
			group := []string{"alpha", "beta"}[i%2]
			reply, err := clients[i%len(clients)].Call(ctx, group, "echo", payload)
			if err != nil {
				errs <- fmt.Errorf("call %d (%d B to %s): %w", i, size, group, err)
				return
			}
			if !bytes.Equal(reply, payload) {
				errs <- fmt.Errorf("call %d: %d B sent, %d B back, content differs", i, size, len(reply))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	a, b := groupStatus(t, n, "alpha"), groupStatus(t, n, "beta")
	if a.Processed+b.Processed != calls {
		t.Errorf("processed %d + %d, want %d", a.Processed, b.Processed, calls)
	}
	m := n.metrics()
	for _, want := range []string{
		`tpsched_requests_processed_total{group="alpha"} 500`,
		`tpsched_requests_queued_total{group="beta"} 500`,
		`tpsched_queue_depth{group="alpha"} 0`,
		`tpsched_processes{group="beta",kind="resident"} 2`,
		`tpsched_request_duration_seconds_count{group="alpha"} 500`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestRefusals covers the errors a caller can switch on.
func TestRefusals(t *testing.T) {
	skipShort(t)
	dir := defDir(t, "", map[string]string{
		"small": echoDef("small", 1, 4, 64<<10),
	})
	n := startNode(t, "-c", dir)
	c := n.client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	cases := []struct {
		name           string
		group, service string
		payload        []byte
		want           netio.Code
	}{
		{"unknown group", "nosuch", "echo", nil, netio.CodeNoSuchGroup},
		{"unknown service", "small", "nosuch", nil, netio.CodeNoSuchService},
		{"over the group's max_message_size", "small", "echo", make([]byte, 64<<10+1), netio.CodeMessageTooBig},
		{"application error", "small", "fail", nil, netio.CodeApplication},
		{"bad argument is an application error", "small", "sleep", []byte("soon"), netio.CodeApplication},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Call(ctx, tc.group, tc.service, tc.payload)
			if codeOf(err) != tc.want {
				t.Fatalf("got %v, want code %q", err, tc.want)
			}
		})
	}
	t.Run("exactly max_message_size passes", func(t *testing.T) {
		p := bytes.Repeat([]byte{7}, 64<<10)
		reply, err := c.Call(ctx, "small", "echo", p)
		if err != nil || !bytes.Equal(reply, p) {
			t.Fatalf("got %d B, %v", len(reply), err)
		}
	})
	t.Run("over the client's limit is refused before sending", func(t *testing.T) {
		small := n.client(func(o *client.Options) { o.MaxMessageSize = 1024 })
		_, err := small.Call(ctx, "small", "echo", make([]byte, 1025))
		if codeOf(err) != netio.CodeMessageTooBig {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("held group refused, released group served", func(t *testing.T) {
		if out, err := n.scdctl("hold", "small"); err != nil {
			t.Fatalf("scdctl hold: %v: %s", err, out)
		}
		if _, err := c.Call(ctx, "small", "echo", []byte("x")); codeOf(err) != netio.CodeServiceClosed {
			t.Fatalf("held: got %v", err)
		}
		if out, _ := n.scdctl("status"); !regexp.MustCompile(`small\s+small\s+held`).MatchString(out) {
			t.Errorf("status does not show the hold:\n%s", out)
		}
		if out, err := n.scdctl("release", "small"); err != nil {
			t.Fatalf("scdctl release: %v: %s", err, out)
		}
		if _, err := c.Call(ctx, "small", "echo", []byte("x")); err != nil {
			t.Fatalf("released: %v", err)
		}
		if out, err := n.scdctl("hold", "nosuch"); err == nil || !strings.Contains(out, "no such service group") {
			t.Errorf("hold of an unknown group: %v: %s", err, out)
		}
	})
	t.Run("full queue answers server busy", func(t *testing.T) {
		// One process busy with a sleep, four queue slots: the sixth call
		// finds no room.
		var wg sync.WaitGroup
		codes := make(chan netio.Code, 8)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := c.Call(ctx, "small", "sleep", []byte("300"))
				codes <- codeOf(err)
			}()
		}
		wg.Wait()
		close(codes)
		busy, ok := 0, 0
		for code := range codes {
			switch code {
			case netio.CodeServerBusy:
				busy++
			case 255:
				ok++
			default:
				t.Errorf("unexpected %v", code)
			}
		}
		if busy < 3 || ok < 4 {
			t.Errorf("%d served, %d busy; want at least 4 served (4 queue slots, plus 1 if the process took one first) and 3 busy", ok, busy)
		}
	})
	t.Run("watch_time from the caller times out", func(t *testing.T) {
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_, err := c.Call(short, "small", "sleep", []byte("1000"))
		if codeOf(err) != netio.CodeTimedOut && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("a bad frame closes that connection only and is counted", func(t *testing.T) {
		bad, err := net.Dial("tcp", n.rpc)
		must(t, err)
		defer bad.Close()
		_, _ = bad.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		_ = bad.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := bad.Read(make([]byte, 1)); err == nil {
			t.Error("the node answered garbage instead of closing")
		}
		if _, err := c.Call(ctx, "small", "echo", []byte("still here")); err != nil {
			t.Errorf("other connection after a bad frame: %v", err)
		}
		if m := n.metrics(); !strings.Contains(m, "tpsched_bad_frames_total 1") {
			t.Errorf("bad frame not counted:\n%s", grep(m, "bad_frames"))
		}
	})
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestKilledUAPFailsItsCall kills the UAP process serving a sleep: that
// call fails with 'server terminated', a replacement starts, and later
// calls are served.
func TestKilledUAPFailsItsCall(t *testing.T) {
	skipShort(t)
	dir := defDir(t, "", map[string]string{"one": echoDef("one", 1, 16, 1<<20)})
	n := startNode(t, "-c", dir)
	c := n.client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Call(ctx, "one", "echo", []byte("warm")); err != nil {
		t.Fatal(err)
	}
	pid := groupStatus(t, n, "one").Processes[0].PID
	done := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx, "one", "sleep", []byte("10000"))
		done <- err
	}()
	waitFor(t, 5*time.Second, "the sleep call to be taken", func() bool {
		return groupStatus(t, n, "one").InFlight == 1 && groupStatus(t, n, "one").QueueDepth == 0
	})
	time.Sleep(50 * time.Millisecond) // inside the handler, not just taken
	must(t, syscall.Kill(pid, syscall.SIGKILL))
	select {
	case err := <-done:
		if codeOf(err) != netio.CodeServerTerminated {
			t.Fatalf("killed UAP's call: got %v, want server terminated", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the killed UAP's call was not answered within 5 s")
	}
	waitFor(t, 5*time.Second, "a replacement process", func() bool {
		p := groupStatus(t, n, "one").Processes[0]
		return p.PID != 0 && p.PID != pid && p.Restarts == 1
	})
	if out, err := n.scdctl("status"); err != nil || statusRow(t, out, "one")["RESTARTS"] != "1" {
		t.Errorf("scdctl status does not show the restart in its table: %v\n%s", err, out)
	}
	for i := range 20 {
		msg := []byte("after " + strconv.Itoa(i))
		if reply, err := c.Call(ctx, "one", "echo", msg); err != nil || !bytes.Equal(reply, msg) {
			t.Fatalf("call after restart: %q, %v", reply, err)
		}
	}
	t.Run("a crashing service fails its call and the UAP comes back", func(t *testing.T) {
		_, err := c.Call(ctx, "one", "crash", nil)
		if codeOf(err) != netio.CodeServerTerminated {
			t.Fatalf("crash: got %v", err)
		}
		waitFor(t, 5*time.Second, "the next call to be served", func() bool {
			_, err := c.Call(ctx, "one", "echo", []byte("x"))
			return err == nil
		})
	})
}

// TestSIGTERMDrains: queued calls finish, new ones are refused, the UAPs
// stop and scdd exits 0.
func TestSIGTERMDrains(t *testing.T) {
	skipShort(t)
	dir := defDir(t, "", map[string]string{"slow": echoDef("slow", 1, 16, 1<<20)})
	n := startNode(t, "-c", dir)
	c := n.client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pid := groupStatus(t, n, "slow").Processes[0].PID
	const queued = 4
	results := make(chan error, queued)
	for range queued {
		go func() {
			_, err := c.Call(ctx, "slow", "sleep", []byte("250"))
			results <- err
		}()
	}
	waitFor(t, 5*time.Second, "all calls to reach the node", func() bool {
		return groupStatus(t, n, "slow").InFlight == queued
	})
	drainAndCheck(ctx, t, n, c, "slow", results, queued, "queued call during drain")
	if pidAlive(pid) {
		t.Errorf("UAP %d still alive after scdd stopped", pid)
	}
	if strings.Contains(n.stderr.String(), "restarting") {
		t.Errorf("a UAP ending at shutdown was taken for a crash:\n%s", n.stderr.String())
	}
}

// TestHangupLeavesScddServing: SIGHUP (an operator's dropped ssh session,
// scdd started with &) and a log write to a stderr pipe whose reader is
// gone (the same session) must not end scdd: a call in flight is answered
// and the node serves the next one.
func TestHangupLeavesScddServing(t *testing.T) {
	skipShort(t)
	dir := defDir(t, "", map[string]string{"one": echoDef("one", 1, 16, 1<<20)})
	var pr, pw *os.File
	n := startCommandWith(t, func(c *exec.Cmd) {
		// stderr is a pipe this test can close the reading end of; what
		// comes through it goes on to the node's buffer.
		var err error
		pr, pw, err = os.Pipe()
		must(t, err)
		log := c.Stderr
		c.Stderr = pw
		go func() { _, _ = io.Copy(log, pr) }()
	}, bin("scdd"), "-c", dir)
	pw.Close() // scdd has its own copy
	c := n.client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	callThrough := func(sig syscall.Signal, what string) {
		t.Helper()
		done := make(chan error, 1)
		go func() {
			_, err := c.Call(ctx, "one", "sleep", []byte("1000"))
			done <- err
		}()
		waitFor(t, 5*time.Second, "the sleep call to be taken", func() bool {
			return groupStatus(t, n, "one").InFlight == 1
		})
		n.signal(sig)
		if err := <-done; err != nil {
			t.Fatalf("%s: the call in flight: %v", what, err)
		}
		if reply, err := c.Call(ctx, "one", "echo", []byte("after")); err != nil || string(reply) != "after" {
			t.Fatalf("%s: a call after it: %q, %v", what, reply, err)
		}
		select {
		case <-n.done:
			t.Fatalf("%s: scdd exited: %v", what, n.err)
		default:
		}
	}
	callThrough(syscall.SIGHUP, "SIGHUP")
	waitFor(t, 5*time.Second, "scdd to log the SIGHUP", func() bool {
		return strings.Contains(n.stderr.String(), "SIGHUP ignored")
	})
	// The reader leaves: scdd's next log line (this SIGHUP's) meets EPIPE.
	pr.Close()
	callThrough(syscall.SIGHUP, "SIGHUP with stderr's reader gone")
}

// TestEmbeddedDefault runs the README's demo: scdd with no definitions,
// then `scdctl call demo echo hello`.
func TestEmbeddedDefault(t *testing.T) {
	skipShort(t)
	for _, port := range []string{"127.0.0.1:12000", "127.0.0.1:12001"} {
		if ln, err := net.Listen("tcp", port); err != nil {
			t.Skipf("the embedded default's port %s is taken: %v", port, err)
		} else {
			ln.Close()
		}
	}
	n := startNode(t)
	cmd := exec.Command(bin("scdctl"), "call", "demo", "echo", "hello")
	cmd.Env = append(cmd.Environ(), "DCCONFPATH=", "TPSCHED_RPC=", "TPSCHED_HTTP=", "TPSCHED_CONTROL_SOCKET=")
	out, err := cmd.CombinedOutput()
	if err != nil || string(out) != "hello\n" {
		t.Fatalf("scdctl call demo echo hello: %q, %v", out, err)
	}
	st, err := n.status()
	must(t, err)
	if len(st.Groups) != 1 || st.Groups[0].Group != "demo" || len(st.Groups[0].Processes) == 0 {
		t.Fatalf("embedded default status: %+v", st)
	}
	out, err = exec.Command(bin("scdctl"), "status", "--json").CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"group":"demo"`) {
		t.Fatalf("scdctl status --json: %s, %v", out, err)
	}
}

// TestBadDefinitionStopsStartup: scdd names file, line and operand, both
// for what the definitions say and for what only the machine can tell.
func TestBadDefinitionStopsStartup(t *testing.T) {
	skipShort(t)
	cases := []struct{ name, body, want string }{
		{"contradiction", "set service_group = \"bad\"\nset service = \"echo=echo\"\nset module = MODULE\nset parallel_count = 3,2\n",
			"usr/bad:4: parallel_count:"},
		{"module missing", "set service_group = \"bad\"\nset service = \"echo=echo\"\n# the UAP\nset module = \"/nonexistent/uap\"\n",
			"usr/bad:4: module: /nonexistent/uap does not exist"},
		{"module by name, not found", "set service_group = \"bad\"\nset service = \"echo=echo\"\nset module = \"no-such-uap\"\n",
			"usr/bad:3: module: \"no-such-uap\" not found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := defDir(t, "", map[string]string{"bad": tc.body})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, bin("scdd"), "-c", dir).CombinedOutput()
			checkRace(t, "scdd", string(out))
			if err == nil {
				t.Fatal("scdd started")
			}
			if !strings.Contains(string(out), tc.want) {
				t.Fatalf("error does not name file:line: operand (want %q): %s", tc.want, out)
			}
		})
	}
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool, detail ...func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			var more []string
			for _, f := range detail {
				more = append(more, f())
			}
			t.Fatalf("timed out after %v waiting for %s %s", d, what, strings.Join(more, "; "))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDrainTimeoutAnswersEveryCall: when the drain times out with calls
// still held by processes that will not finish, every caller gets an
// answer frame ('server terminated' once the process is killed, 'node
// shutting down' for those that never reached one), not a bare close of
// its connection, even though the UAPs used up their whole time to stop
// (issue 10 item 6: one 5 s budget used to cover the UAPs and the port).
func TestDrainTimeoutAnswersEveryCall(t *testing.T) {
	testenv.Slow(t, "runs for seconds; 6 s without -race on a busy 2-core machine")
	skipShort(t)
	dir := defDir(t, ownControlSocket, map[string]string{"slow": echoDef("slow", 1, 16, 1<<20)})
	n := startNode(t, "-c", dir, "-drain-timeout", "300ms")
	c := n.client()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	const calls = 3
	results := make(chan error, calls)
	for range calls {
		go func() {
			_, err := c.Call(ctx, "slow", "sleep", []byte("30000")) // longer than any budget
			results <- err
		}()
	}
	waitFor(t, 5*time.Second, "all calls to reach the node", func() bool {
		return groupStatus(t, n, "slow").InFlight == calls
	})
	n.signal(syscall.SIGTERM)
	codes := map[netio.Code]int{}
	for range calls {
		err := <-results
		var ne *netio.Error
		if !errors.As(err, &ne) || (ne.Code != netio.CodeServerTerminated && ne.Code != netio.CodeShuttingDown) {
			t.Errorf("a call held at the drain's end: %v; want 'server terminated' or 'node shutting down'", err)
			continue
		}
		codes[ne.Code]++
	}
	if codes[netio.CodeServerTerminated] != 1 {
		t.Errorf("answers %v: want one 'server terminated' (the killed process's call)", codes)
	}
	n.waitExit(20 * time.Second)
}
