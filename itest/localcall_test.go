package itest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"tpsched/internal/testenv"
	"tpsched/netio"
)

// callerServer's "call" service calls group/service/request through the
// node from inside its handler (shm.UAP.Call).
const callerServer = `set service_group = %q
set service = "call=call", "echo=echo", "sleep=sleep"
set module = MODULE
set parallel_count = %d
set queue_size = 64
`

// TestUAPCallsAnotherService: a service calls another group's service
// from its handler, through its shared memory and the node. Every outer
// call gets the inner call's reply, its own; errors come back as errors;
// the node counts the calls.
func TestUAPCallsAnotherService(t *testing.T) {
	skipShort(t)
	dir := defDir(t, "", map[string]string{
		"front": fmt.Sprintf(callerServer, "front", 2),
		"back":  echoDef("back", 2, 64, 1<<20),
	})
	n := startNode(t, "-c", dir)
	c := n.client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				want := fmt.Sprintf("caller %d call %d %s", w, i, strings.Repeat("x", i*97))
				got, err := c.Call(ctx, "front", "call", []byte("back/echo/"+want))
				if err != nil || string(got) != want {
					errs <- fmt.Errorf("caller %d call %d: %.60q, %v", w, i, got, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	for _, tc := range []struct{ req, want string }{
		{"back/fail/x", "application error: failure requested"},
		{"nosuch/echo/x", "no such service group: nosuch"},
		{"back/ehco/x", "no such service: back/ehco (did you mean echo?)"},
	} {
		_, err := c.Call(ctx, "front", "call", []byte(tc.req))
		if codeOf(err) != netio.CodeApplication || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("front/call %q: %v; want an application error with %q", tc.req, err, tc.want)
		}
	}
	if m := n.metrics(); !strings.Contains(m, `tpsched_local_calls_total{group="front"} 403`) {
		t.Errorf("/metrics does not count the 403 local calls:\n%s", grepLines(m, "local_calls"))
	}
}

// TestLocalCallFaults: a callee killed under a local call fails it
// 'server terminated'; a caller killed while its call waits is answered
// 'server terminated' and the late answer to its call is dropped; a
// service that calls its own group, all of whose processes wait the same
// way, ends at its deadline. The node serves on after each.
func TestLocalCallFaults(t *testing.T) {
	skipShort(t)
	dir := defDir(t, "", map[string]string{
		"front": fmt.Sprintf(callerServer, "front", 1),
		"back":  echoDef("back", 1, 64, 1<<20),
	})
	n := startNode(t, "-c", dir)
	c := n.client()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	serves := func(when string) {
		t.Helper()
		for _, g := range []string{"front", "back"} {
			if got, err := c.Call(ctx, g, "echo", []byte(when)); err != nil || string(got) != when {
				t.Fatalf("%s: %s/echo: %q, %v", when, g, got, err)
			}
		}
	}
	serves("first")

	// The callee dies.
	done := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx, "front", "call", []byte("back/sleep/10000"))
		done <- err
	}()
	waitFor(t, 5*time.Second, "back to serve the inner call", func() bool { return groupStatus(t, n, "back").InFlight == 1 })
	time.Sleep(50 * time.Millisecond)
	must(t, syscall.Kill(groupStatus(t, n, "back").Processes[0].PID, syscall.SIGKILL))
	select {
	case err := <-done:
		if codeOf(err) != netio.CodeApplication || !strings.Contains(err.Error(), "server terminated") {
			t.Errorf("callee killed: %v; want the caller's application error carrying 'server terminated'", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("callee killed: no answer within 5 s")
	}
	waitFor(t, 10*time.Second, "back's replacement", func() bool {
		p := groupStatus(t, n, "back").Processes[0]
		return p.PID != 0 && p.Restarts == 1
	})
	serves("after the callee died")

	// The caller dies while its call waits in back.
	go func() {
		_, err := c.Call(ctx, "front", "call", []byte("back/sleep/1000"))
		done <- err
	}()
	waitFor(t, 5*time.Second, "back to serve the inner call", func() bool { return groupStatus(t, n, "back").InFlight == 1 })
	must(t, syscall.Kill(groupStatus(t, n, "front").Processes[0].PID, syscall.SIGKILL))
	select {
	case err := <-done:
		if codeOf(err) != netio.CodeServerTerminated {
			t.Errorf("caller killed: %v; want server terminated", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("caller killed: no answer within 5 s")
	}
	waitFor(t, 5*time.Second, "the inner call to end", func() bool { return groupStatus(t, n, "back").InFlight == 0 })
	serves("after the caller died")

	// front's one process calls front: the inner call can only wait,
	// and the node says so after a second.
	start := time.Now()
	cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
	_, err := c.Call(cctx, "front", "call", []byte("front/echo/me"))
	ccancel()
	if codeOf(err) != netio.CodeTimedOut && !(codeOf(err) == netio.CodeApplication && strings.Contains(err.Error(), "timed out")) {
		t.Errorf("a call to its own busy group: %v; want timed out", err)
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("a call to its own busy group took %v to end; its deadline was 2 s", d)
	}
	if m := n.metrics(); !strings.Contains(m, `tpsched_local_call_stalls_total{group="front"} 1`) ||
		!strings.Contains(n.stderr.String(), "every process of the group waits for a call of its own") {
		t.Errorf("the stall was not reported: %s%s", grepLines(m, "stalls"), grepLines(n.stderr.String(), "front"))
	}
	serves("after the cycle")
	if v := groupStatus(t, n, "front").Errors.ProtocolViolations; v != 0 {
		t.Errorf("%d protocol violations", v)
	}
}

// TestLocalCallToAnotherNode: a UAP's call to a group this node does not
// serve goes to the node that does, and its answer comes back to the UAP.
func TestLocalCallToAnotherNode(t *testing.T) {
	skipShort(t)
	nodes := startCluster(t, clusterOpts{extra: func(i int) map[string]string {
		switch i {
		case 0:
			return map[string]string{"front": fmt.Sprintf(callerServer, "front", 1)}
		case 1:
			return map[string]string{"far": echoDef("far", 1, 64, 1<<20)}
		}
		return nil
	}})
	waitFor(t, 15*time.Second, "n0 to learn that n1 serves far", func() bool { return knowsGroup(t, nodes[0], "n1", "far") },
		nodes[0].stderr.String)
	c := nodes[0].client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 20 {
		want := fmt.Sprintf("across %d", i)
		got, err := c.Call(ctx, "front", "call", []byte("far/echo/"+want))
		if err != nil || string(got) != want {
			t.Fatalf("call %d: %q, %v", i, got, err)
		}
	}
	if st := groupStatus(t, nodes[1], "far"); st.Processed < 20 {
		t.Errorf("n1 served %d calls of far; want the 20 n0's UAP made", st.Processed)
	}
}

// TestChaosLocalCallsKilledUAPs kills, every 0.3 s, a process of the
// calling group or of the called one, alternately, while 12 callers send
// calls whose service makes a local call (front/call -> back/echo).
// Every outer call gets exactly one answer: its own reply (which carries
// the local call's reply, so a local call answered twice or to the wrong
// process shows as a wrong reply), or 'server terminated' (the front
// process died), or the front's application error carrying the local
// call's 'server terminated' (the back process died).
func TestChaosLocalCallsKilledUAPs(t *testing.T) {
	testenv.Slow(t, "a fault experiment; 8 s without -race on a busy 2-core machine")
	skipShort(t)
	dir := defDir(t, ownControlSocket, map[string]string{
		"front": `set service_group = "front"
set service = "call=call"
set module = MODULE
set parallel_count = 4
set queue_size = 64
set watch_time = 10
`,
		"back": `set service_group = "back"
set service = "echo=echo"
set module = MODULE
set parallel_count = 3
set queue_size = 64
set watch_time = 10
`,
	})
	n := startNode(t, "-c", dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const route = "back/echo/"
	var outstanding atomic.Int64
	tl := rawCallersReplying(ctx, t, n.rpc, 12, "front", "call", route, 10_000, &outstanding,
		func(req []byte) []byte { return req[len(route):] })
	time.Sleep(time.Second)

	kills, rng := map[string]int{}, rand.New(rand.NewPCG(3, 4))
	end := time.Now().Add(chaosDuration(5*time.Second, 20*time.Second))
	for i := 0; time.Now().Before(end); i++ {
		group := [2]string{"front", "back"}[i%2]
		if pids := uapPIDs(t, n, group); len(pids) > 0 {
			_ = syscall.Kill(pids[rng.IntN(len(pids))], syscall.SIGKILL)
			kills[group]++
		}
		time.Sleep(300 * time.Millisecond)
	}
	time.Sleep(time.Second)
	cancel()
	time.Sleep(300 * time.Millisecond)

	chaosFigures(t, "local calls under kills: %d callers' processes and %d callees' killed; %s", kills["front"], kills["back"], tl)
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if tl.lost+tl.dup+tl.wrong+tl.spoiled+tl.stray > 0 {
		t.Errorf("calls lost, duplicated or misdelivered: %s", tl)
	}
	if tl.ok < 1000 {
		t.Errorf("only %d calls answered with their reply: %s", tl.ok, tl)
	}
	for code, k := range tl.byCode {
		msg := tl.messages[code]
		switch {
		case code == netio.CodeServerTerminated:
		case code == netio.CodeApplication && strings.Contains(msg, "server terminated"):
		default:
			t.Errorf("%d calls failed %q: %s", k, code, msg)
		}
	}
}

// TestLaneLocalCalls: a caller's calls in a row to one service of a group
// with processes to spare go on a lane (a process lent to the caller,
// no scdd thread on the call's path), and answer as the queue would: every
// reply its own, the node counting them; a hold ends the lane at once
// ('service closed'); a callee killed under a call on the lane fails it
// 'server terminated'; a call on the lane past its deadline is answered
// 'timed out'. The node serves on after each. Both groups run the Go
// UAP (uap-echo) and then the C one (uap-echo-c, the C library's lanes).
func TestLaneLocalCalls(t *testing.T) {
	skipShort(t)
	t.Run("go", func(t *testing.T) { testLaneLocalCalls(t, fmt.Sprintf("%q", bin("uap-echo"))) })
	t.Run("c", func(t *testing.T) { testLaneLocalCalls(t, fmt.Sprintf("%q", cuapModule(t))) })
}

func testLaneLocalCalls(t *testing.T, module string) {
	dir := defDir(t, "", map[string]string{
		"front": strings.ReplaceAll(fmt.Sprintf(callerServer, "front", 1), "MODULE", module),
		"back":  strings.ReplaceAll(echoDef("back", 3, 64, 1<<20), "MODULE", module) + "set watch_time = 2\n",
	})
	n := startNode(t, "-c", dir)
	c := n.client()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	laneCalls := func() float64 { return sumMetric(n.metrics(), `tpsched_lane_calls_total{group="back"}`) }
	inARow := func(what, service, req string, k int) {
		t.Helper()
		for i := range k {
			want := fmt.Sprintf("%s %d", req, i)
			if service != "echo" {
				want = req
			}
			got, err := c.Call(ctx, "front", "call", []byte("back/"+service+"/"+want))
			if err != nil || string(got) != want {
				t.Fatalf("%s: call %d: %.60q, %v", what, i, got, err)
			}
		}
	}

	// untilLane makes calls in a row until a lane carries them. A lane is
	// offered at a call, and one that finds the group's processes still
	// starting, or a call waiting for one, puts the offer off (laneRetry,
	// laneQuiet): how many calls that takes is the machine's speed.
	untilLane := func(what, service, req string) {
		t.Helper()
		before := laneCalls()
		waitFor(t, 10*time.Second, what+": calls in a row to take a lane", func() bool {
			inARow(what, service, req, 5)
			return laneCalls() > before
		})
	}

	untilLane("echo", "echo", "x")
	before := laneCalls()
	inARow("echo", "echo", "x", 200)
	if got := laneCalls() - before; got < 150 {
		t.Errorf("%v of 200 calls in a row on a lane, want most:\n%s", got, grepLines(n.metrics(), "lane"))
	}
	// While calls go on, prc shows which process serves the lane.
	front := groupStatus(t, n, "front").Processes[0].PID
	stop := make(chan struct{})
	calling := make(chan struct{})
	go func() {
		defer close(calling)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := c.Call(ctx, "front", "call", []byte("back/echo/prc")); err != nil {
				t.Errorf("a call while prc looks: %v", err)
				return
			}
		}
	}()
	waitFor(t, 10*time.Second, "scdctl prc to show the process lent to front's lane", func() bool {
		out, _ := n.scdctl("prc", "back")
		return strings.Contains(out, fmt.Sprintf("(lane for pid %d)", front))
	})
	close(stop)
	<-calling
	m := n.metrics()
	if local, lane := sumMetric(m, `tpsched_local_calls_total{group="front"}`), sumMetric(m, `tpsched_lane_calls_total{group="back"}`); local < 200 || lane > local {
		t.Errorf("/metrics counts %v local calls, %v of them on lanes; want at least the 200 made in a row, lanes included:\n%s", local, lane, grepLines(m, "_calls_total"))
	}

	// Held: the next call is refused, lane or none.
	_, err := n.scdctl("hold", "back")
	must(t, err)
	if _, err := c.Call(ctx, "front", "call", []byte("back/echo/held")); codeOf(err) != netio.CodeApplication || !strings.Contains(err.Error(), "service closed") {
		t.Errorf("a call to a held group: %v; want an application error carrying 'service closed'", err)
	}
	_, err = n.scdctl("release", "back")
	must(t, err)

	// The callee dies under a call on the lane. The echo lane idles out
	// first (a caller holds one lane), then sleep's is granted.
	time.Sleep(time.Second)
	untilLane("sleep lane", "sleep", "1")
	done := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx, "front", "call", []byte("back/sleep/10000"))
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	for _, p := range groupStatus(t, n, "back").Processes { // the lane's callee among them
		if p.PID > 0 {
			_ = syscall.Kill(p.PID, syscall.SIGKILL)
		}
	}
	select {
	case err := <-done:
		if codeOf(err) != netio.CodeApplication || !strings.Contains(err.Error(), "server terminated") {
			t.Errorf("callee killed on a lane: %v; want the caller's application error carrying 'server terminated'", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("callee killed on a lane: no answer within 10 s")
	}
	waitFor(t, 20*time.Second, "back's processes to come back", func() bool {
		_, err := c.Call(ctx, "back", "echo", []byte("back"))
		return err == nil
	})

	// Past its deadline (back's watch_time, 2 s) on the lane.
	time.Sleep(time.Second)
	untilLane("sleep lane again", "sleep", "1")
	start := time.Now()
	_, err = c.Call(ctx, "front", "call", []byte("back/sleep/5000"))
	if codeOf(err) != netio.CodeApplication || !strings.Contains(err.Error(), "timed out") || time.Since(start) > 4*time.Second {
		t.Errorf("a call on the lane past watch_time: %v after %v; want the caller's application error carrying 'timed out' after about 2 s", err, time.Since(start))
	}
	inARow("after", "echo", "y", 20)
}
