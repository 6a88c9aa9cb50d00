package shm

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// laneTestSpec is a lane to the helper UAP's entry, called as test/svc.
func laneTestSpec(entry string) LaneSpec {
	return LaneSpec{Group: "test", Service: "svc", Entry: entry, Watch: 10 * time.Second}
}

// relay hands the caller a relay call of req (group/service/request) and
// returns what its Call returned, as the helper UAP says it.
func relay(tb testing.TB, g *Group, p *Proc, req string) string {
	tb.Helper()
	if err := p.Dispatch("relay", []byte(req), time.Now().Add(10*time.Second).UnixNano()); err != nil {
		tb.Fatal(err)
	}
	p.Wake()
	c := waitCompletion(tb, g, p)
	if c.Status != StatusOK {
		tb.Fatalf("relay %q: %v %q", req, c.Status, c.Reply)
	}
	return string(c.Reply)
}

func lanesOK(tb testing.TB, g *Group, ps ...*uapProc) {
	tb.Helper()
	for _, p := range ps {
		until(tb, g, 10*time.Second, "the UAP to take lanes", p.LanesOK)
	}
}

// A lane's two ends may be either library's: the lane tests run their
// honest processes as the Go helper UAP (TestHelperUAP) and as its twin
// on the C library (testdata/lane_uap.c: the same entries, requests and
// answers), in every pairing of caller and callee.
type laneImpl string

const (
	goLanes laneImpl = "go"
	cLanes  laneImpl = "c"
)

// laneUAP is how a lane test starts one end: the helper UAP of impl, with
// env (the Go helper's hostile modes are helperEnv values).
type laneUAP struct {
	impl laneImpl
	env  []string
}

func honest(impl laneImpl) laneUAP { return laneUAP{impl: impl} }

func hostile(mode string) laneUAP {
	return laneUAP{impl: goLanes, env: []string{helperEnv + "=" + mode}}
}

// start runs the UAP in slot with a fresh area, killed at cleanup.
func (l laneUAP) start(tb testing.TB, g *Group, slot int) *uapProc {
	tb.Helper()
	if l.impl == cLanes {
		return startCUAP(tb, cLaneUAP(tb), g, slot, l.env...)
	}
	return startUAP(tb, g, slot, l.env...)
}

var cLaneUAPPath string

// cLaneUAP builds testdata/lane_uap.c once; the test is skipped without gcc.
func cLaneUAP(tb testing.TB) string {
	tb.Helper()
	if cLaneUAPPath == "" {
		src, err := os.ReadFile("testdata/lane_uap.c")
		if err != nil {
			tb.Fatal(err)
		}
		cLaneUAPPath = CProgram(tb, "lane_uap", string(src))
	}
	return cLaneUAPPath
}

// eachLaneImpl runs f as a subtest for each library.
func eachLaneImpl(t *testing.T, f func(t *testing.T, impl laneImpl)) {
	for _, impl := range []laneImpl{goLanes, cLanes} {
		t.Run(string(impl), func(t *testing.T) { f(t, impl) })
	}
}

// eachLanePairing runs f as a subtest for each pairing of the libraries
// of the caller and the callee.
func eachLanePairing(t *testing.T, f func(t *testing.T, caller, callee laneImpl)) {
	for _, caller := range []laneImpl{goLanes, cLanes} {
		for _, callee := range []laneImpl{goLanes, cLanes} {
			t.Run(string(caller)+"_to_"+string(callee), func(t *testing.T) { f(t, caller, callee) })
		}
	}
}

// lanePair starts a caller in slot 0 and a callee in slot 1 of a fresh
// group of slots, waits until both take lanes, and grants the caller a
// lane of generation 1 to the callee's entry.
func lanePair(tb testing.TB, slots int, callerUAP, calleeUAP laneUAP, entry string) (*Group, *uapProc, *uapProc, *Lane) {
	tb.Helper()
	g := newGroup(tb, 4096, slots)
	caller, callee := callerUAP.start(tb, g, 0), calleeUAP.start(tb, g, 1)
	attached(tb, g, caller, callee)
	lanesOK(tb, g, caller, callee)
	l, err := NewLane(caller.Proc, callee.Proc, 1, laneTestSpec(entry))
	if err != nil {
		tb.Fatal(err)
	}
	return g, caller, callee, l
}

// stopMappedCallee waits until the callee maps lane l and stops it
// (SIGSTOP), continued at the test's end: a call made on the lane stays
// untaken.
func stopMappedCallee(tb testing.TB, g *Group, l *Lane, callee *uapProc) {
	tb.Helper()
	until(tb, g, 10*time.Second, "the callee to map the lane", func() bool { return l.Look(false).CalleeOn })
	pid := callee.cmd.Process.Pid
	syscall.Kill(pid, syscall.SIGSTOP)
	tb.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	waitStopped(tb, pid)
}

// TestLaneCallerGoneGetsNoLane: a caller whose area the reader unmapped
// (the process died and was removed while a call it made ran on in
// another group) takes no lane, and a grant to it reads none of its
// memory. scdd died of that: a lane offered to a caller at the end of its
// call, which completed after the caller was gone.
func TestLaneCallerGoneGetsNoLane(t *testing.T) {
	g := newGroup(t, 4096, 2)
	caller, callee := honest(goLanes).start(t, g, 0), honest(goLanes).start(t, g, 1)
	attached(t, g, caller, callee)
	lanesOK(t, g, caller, callee)
	if err := caller.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-caller.done
	caller.done <- nil // for the cleanup's wait
	g.Remove(0)
	g.unmapRetired()
	if caller.CallerLanesOK() {
		t.Error("a caller whose area is gone takes lanes")
	}
	if l, err := NewLane(caller.Proc, callee.Proc, 1, laneTestSpec("echo")); !errors.Is(err, ErrNoLanes) {
		t.Errorf("a lane granted to a caller whose area is gone: %v, %v", l, err)
	}
}

// usualWay hands the caller a relay of req and expects its call to come
// the usual way (through the scheduler, not a lane): it answers it with
// answer, checks that the caller's relay says so, and returns the call as
// the scheduler saw it.
func usualWay(tb testing.TB, g *Group, caller *Proc, req, answer string) OutCall {
	tb.Helper()
	if err := caller.Dispatch("relay", []byte(req), 0); err != nil {
		tb.Fatal(err)
	}
	caller.Wake()
	oc := awaitOutCall(tb, g, caller)
	caller.AnswerOutCall(oc.No, 0, []byte(answer))
	if c := waitCompletion(tb, g, caller); string(c.Reply) != answer {
		tb.Fatalf("relay %q, answered %q the usual way: the caller says %q", req, answer, c.Reply)
	}
	return oc
}

// TestLaneCalls: a caller with a lane to a callee calls it straight, the
// scheduler seeing no call of its own and counting the completions; the
// callee's errors reach the caller as the node would say them.
func TestLaneCalls(t *testing.T) { eachLanePairing(t, testLaneCalls) }

func testLaneCalls(t *testing.T, callerImpl, calleeImpl laneImpl) {
	g, caller, callee, l := lanePair(t, 2, honest(callerImpl), honest(calleeImpl), "echo")
	defer l.Close()
	for i := range 50 {
		if got := relay(t, g, caller.Proc, "test/svc/ping"); got != "ping" {
			t.Fatalf("call %d on the lane: %q", i, got)
		}
	}
	if _, made, _ := caller.OutCall(); made {
		t.Fatal("a call on the lane reached the scheduler")
	}
	lk := l.Look(true)
	if lk.Completed != 50 || lk.Made != 50 || lk.Over != 50 || lk.Open || !lk.CalleeOn || !l.CallerOn() {
		t.Fatalf("look after 50 calls: %+v", lk)
	}
	// Another service of the group goes the usual way.
	usualWay(t, g, caller.Proc, "test/other/x", "usual")
	l.Revoke()
	until(t, g, 10*time.Second, "the callee to leave the revoked lane", func() bool { return !l.Look(true).CalleeOn })
	// Revoked: the usual way again, and the callee takes mailbox calls.
	usualWay(t, g, caller.Proc, "test/svc/y", "usual again")
	if c := call(t, g, callee.Proc, "echo", []byte("mailbox")); string(c.Reply) != "mailbox" {
		t.Fatalf("the callee after the revoke: %q", c.Reply)
	}
}

// TestLaneErrors: the callee's error answers, and the scheduler's rulings
// (the callee killed holding the call; a call it never took given back).
func TestLaneErrors(t *testing.T) { eachLanePairing(t, testLaneErrors) }

func testLaneErrors(t *testing.T, callerImpl, calleeImpl laneImpl) {
	g, caller, callee, l := lanePair(t, 3, honest(callerImpl), honest(calleeImpl), "fail")
	if got := relay(t, g, caller.Proc, "test/svc/boom"); got != "error 10: application error: failed: boom" {
		t.Fatalf("an application error on the lane: %q", got)
	}
	l.Revoke()
	until(t, g, 10*time.Second, "the callee to leave", func() bool { return !l.Look(true).CalleeOn })
	l.Close()

	// Killed holding the call: the ruling answers it.
	l, err := NewLane(caller.Proc, callee.Proc, 2, laneTestSpec("sleep"))
	if err != nil {
		t.Fatal(err)
	}
	if err := caller.Dispatch("relay", []byte("test/svc/10s"), 0); err != nil {
		t.Fatal(err)
	}
	caller.Wake()
	until(t, g, 10*time.Second, "the callee to take the call", func() bool { return l.Look(true).Taken })
	if l.Rule(laneMoved, "") {
		t.Fatal("a taken call was given back as never run")
	}
	callee.cmd.Process.Kill()
	callee.wait(t, 10*time.Second)
	if !l.Rule(7, "server terminated: the UAP process serving the call died") {
		t.Fatal("the ruling of a taken call lost")
	}
	if c := waitCompletion(t, g, caller.Proc); string(c.Reply) != "error 7: server terminated: the UAP process serving the call died" {
		t.Fatalf("a call whose callee died: %q", c.Reply)
	}
	l.Revoke()
	l.Close()

	// A callee that never takes the call (stopped): given back, the
	// caller makes it the usual way.
	stopped := honest(calleeImpl).start(t, g, 2)
	attached(t, g, stopped)
	lanesOK(t, g, stopped)
	l, err = NewLane(caller.Proc, stopped.Proc, 3, laneTestSpec("echo"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	stopMappedCallee(t, g, l, stopped)
	if err := caller.Dispatch("relay", []byte("test/svc/z"), 0); err != nil {
		t.Fatal(err)
	}
	caller.Wake()
	until(t, g, 10*time.Second, "the call on the lane", func() bool { return l.Look(true).Open })
	if !l.Rule(laneMoved, "") {
		t.Fatal("an untaken call was not given back")
	}
	oc := awaitOutCall(t, g, caller.Proc)
	if string(oc.Request) != "z" {
		t.Fatalf("the call given back came the usual way as %q", oc.Request)
	}
	caller.AnswerOutCall(oc.No, 0, []byte("the usual way"))
	if c := waitCompletion(t, g, caller.Proc); string(c.Reply) != "the usual way" {
		t.Fatalf("the call given back: %q", c.Reply)
	}
	if lk := l.Look(true); lk.Completed != 0 || lk.Open || lk.Made != 1 || lk.Over != 0 {
		t.Fatalf("the lane after the give-back (a call made, none over but given back): %+v", lk)
	}
	syscall.Kill(stopped.cmd.Process.Pid, syscall.SIGCONT)
	// The callee, woken, still serves its lane: nothing is left to take.
	time.Sleep(50 * time.Millisecond)
	if lk := l.Look(true); lk.Taken || lk.Completed != 0 || l.CallerOn() {
		t.Fatalf("the callee took a call given back, or the caller kept the lane: %+v", lk)
	}
	// The caller let the lane go: its calls go the usual way.
	usualWay(t, g, caller.Proc, "test/svc/again", "again")
}

// TestCloseEndsALaneCallInFlight is TestCloseEndsACallInFlight on a
// lane: the goroutine's Call waits on the lane's word, not the process's,
// and Close must wake it there (it waited for the next timed look, here
// made an hour away so that a lost wake-up cannot pass).
func TestCloseEndsALaneCallInFlight(t *testing.T) {
	caller := laneUAP{impl: goLanes, env: []string{"TPSCHED_SHM_TEST_AFTER_CLOSE=background",
		"TPSCHED_SHM_TEST_MAXSLEEP=1h", "TPSCHED_SPIN_US=0"}}
	g, p, _, l := lanePair(t, 3, caller, honest(goLanes), "sleep")
	defer l.Close()
	until(t, g, 10*time.Second, "the callee to map the lane", func() bool { return l.Look(true).CalleeOn })
	if c := call(t, g, p.Proc, "background", []byte("test/svc/1h")); c.Status != StatusOK {
		t.Fatalf("background: %v %q", c.Status, c.Reply)
	}
	until(t, g, 10*time.Second, "the callee to take the call on the lane", func() bool { return l.Look(true).Taken })
	until(t, g, 10*time.Second, "the call to sleep on the lane", func() bool { return l.h.callerSleeping.Load() != 0 })
	p.Stop()
	p.Wake()
	if err := p.wait(t, 10*time.Second); err != nil {
		t.Fatalf("the UAP closed with a call in flight on a lane: %v", err)
	}
}

// TestLaneTakeBackIsNotACompletion: a call its caller took back unrun,
// finding the lane revoked as it made the call (callLane's take-back, a
// race of a moment, played here on the lane's words as callLane writes
// them, the callee stopped), was run by nobody: the callee's completions
// (its group's processed count) do not count it, nor do the calls over
// (the caller's local calls), as for a give-back the scheduler ruled
// (TestLaneErrors).
func TestLaneTakeBackIsNotACompletion(t *testing.T) {
	g, _, callee, l := lanePair(t, 3, honest(goLanes), honest(goLanes), "echo")
	defer l.Close()
	stopMappedCallee(t, g, l, callee)
	// Revoked before the call is published (Revoke finds nothing to
	// give back), the caller reading the revoke just after publishing.
	l.Revoke()
	h := l.h
	c := h.claim.Load()
	n := c>>8 + 1
	h.seq.Store(n)
	if !h.claim.CompareAndSwap(c, n<<8|laneMoved<<2|laneRuled) {
		t.Fatal("the stopped callee moved the claim")
	}
	if lk := l.Look(true); lk.Completed != 0 || lk.Over != 0 || lk.Made != n || lk.Open {
		t.Fatalf("the lane after its caller took its call back: %+v, want none completed or over", lk)
	}
}

// TestLaneCountsAtRandom drives a lane's words at random the way its
// three parties write them (the caller publishing calls and taking one
// back, as callLane does; the callee taking and completing them, as
// takeLane and serveLane do; the scheduler ruling with every code and
// looking at random moments) and holds Look's counts to what happened:
// the callee's completions exactly, and the calls over less one given
// back. Each episode is one lane, over at its first give-back (an honest
// caller lets the lane go then).
func TestLaneCountsAtRandom(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 28))
	for ep := 0; ep < 3000; ep++ {
		callee := &Proc{ctl: &procCtl{}}
		l := &Lane{gen: 1, callee: callee, h: &laneHdr{}}
		h := l.h
		h.claim.Store(laneDone) // call 0, over: the state a new lane starts in
		var trace []string
		var completed, sawCompleted, over uint64
		givenBack := false
		for step := 0; step < 60 && !givenBack; step++ {
			c, made := h.claim.Load(), h.seq.Load()
			n := c >> 8
			switch rng.IntN(6) {
			case 0: // the caller makes a call, and maybe takes it back
				if !laneFinal(c) || made != n {
					continue
				}
				h.seq.Store(n + 1)
				trace = append(trace, fmt.Sprintf("made %d", n+1))
				if rng.IntN(3) == 0 && h.claim.CompareAndSwap(c, (n+1)<<8|laneMoved<<2|laneRuled) {
					trace = append(trace, fmt.Sprintf("took back %d", n+1))
					over++
					givenBack = true
				}
			case 1: // the callee takes the call
				if laneFinal(c) && made != n && h.claim.CompareAndSwap(c, (n+1)<<8|laneTaken) {
					trace = append(trace, fmt.Sprintf("taken %d", n+1))
				}
			case 2: // the callee completes it
				if c&3 == laneTaken && h.claim.CompareAndSwap(c, n<<8|laneDone) {
					completed++
					over++
					trace = append(trace, fmt.Sprintf("done %d", n))
				}
			case 3, 4: // the scheduler rules
				code := []uint32{laneMoved, 5, 7}[rng.IntN(3)]
				rule := l.Rule
				if rng.IntN(2) == 0 {
					rule = l.RuleTaken
				}
				if rule(code, "ruled") {
					over++
					givenBack = code == laneMoved
					trace = append(trace, fmt.Sprintf("ruled %d on %d", code, h.claim.Load()>>8))
				}
			case 5:
				sawCompleted += l.Look(true).Completed
				trace = append(trace, "look")
			}
		}
		lk := l.Look(true)
		sawCompleted += lk.Completed
		if givenBack {
			over--
		}
		if sawCompleted != completed || lk.Over != over {
			t.Fatalf("episode %d: looks counted %d completed and %d over, the callee completed %d and %d are over (a give-back not among them): %s",
				ep, sawCompleted, lk.Over, completed, over, strings.Join(trace, ", "))
		}
	}
}

// BenchmarkLaneCall: a UAP's calls to another process on a lane, 128
// bytes each, nobody else on the path (ns/op is one call).
func BenchmarkLaneCall(b *testing.B) {
	for _, impl := range []laneImpl{goLanes, cLanes} {
		b.Run(string(impl), func(b *testing.B) { benchmarkLaneCall(b, impl) })
	}
}

func benchmarkLaneCall(b *testing.B, impl laneImpl) {
	g, caller, _, l := lanePair(b, 2, honest(impl), honest(impl), "echo")
	defer l.Close()
	b.ResetTimer()
	got := relay(b, g, caller.Proc, "test/svc/x") // maps the lane
	_ = got
	if err := caller.Dispatch("loop", []byte("test/svc/"+strconv.Itoa(b.N)), 0); err != nil {
		b.Fatal(err)
	}
	caller.Wake()
	c := waitCompletion(b, g, caller.Proc)
	ns, err := strconv.ParseInt(string(c.Reply), 10, 64)
	if c.Status != StatusOK || err != nil {
		b.Fatalf("loop: %v %q", c.Status, c.Reply)
	}
	b.ReportMetric(float64(ns)/float64(b.N), "ns/call")
	if lk := l.Look(true); lk.Completed != uint64(b.N)+1 {
		b.Fatalf("%d calls on the lane, want %d", lk.Completed, b.N+1)
	}
}

// hostileLaneCaller is a UAP that, handed any call, takes the lane it was
// granted and attacks its callee through it: a call made with the claim
// forged as taken (so the callee cannot take it, and a node reading the
// claim would think it runs), and a flood of wake-ups; then it answers.
func hostileLaneCaller() {
	u, err := Attach()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	u.Handle("attack", func(req []byte) ([]byte, error) {
		u.out.mu.Lock()
		defer u.out.mu.Unlock()
		u.syncLaneOut()
		e := u.out.lane
		if e == nil {
			return nil, errors.New("no lane")
		}
		n := e.h.claim.Load()>>8 + 1
		e.h.seq.Store(n)
		e.h.claim.Store(n<<8 | laneTaken)
		for range 20000 {
			e.h.calleeWake.Add(1)
			futexWake(&e.h.calleeWake, 1)
		}
		return []byte("attacked"), nil
	})
	if err := u.Serve(); err != nil {
		os.Exit(3)
	}
	os.Exit(0)
}

// hostileLaneCallee is a UAP that serves its mailbox calls honestly and
// the calls on its lanes not: the first it answers right after a flood of
// wake-ups of its caller, the others with a status no UAP may write.
func hostileLaneCallee() {
	first := true
	misserveLanes(func(h *laneHdr, n uint64) {
		if first {
			for range 5000 {
				h.callerWake.Add(1)
				futexWake(&h.callerWake, 1)
				time.Sleep(time.Microsecond) // the caller, woken, goes back to sleep in between
			}
			h.status.Store(uint32(StatusOK))
			h.replyLen.Store(h.reqLen.Load())
		} else {
			h.status.Store(99)
		}
		first = false
		h.claim.Store(n<<8 | laneDone)
	})
}

// misserveLanes is a UAP that serves its mailbox calls honestly and ends
// each call it takes on a lane with end, then wakes its caller.
func misserveLanes(end func(h *laneHdr, n uint64)) {
	u, err := Attach()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	u.Handle("echo", func(req []byte) ([]byte, error) { return req, nil })
	u.publish()
	for {
		u.syncLaneIn()
		if n := u.takeLane(); n != 0 {
			h := u.laneIn.h
			end(h, n)
			h.callerWake.Add(1)
			futexWake(&h.callerWake, 1)
			continue
		}
		if n, mb := u.take(); n != 0 {
			u.serve(n, mb)
			continue
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// TestLaneHostileCaller: a caller that forges its lane's claim and floods
// its callee spoils only its own lane: revoked, the callee leaves it (its
// own word says so, whatever the claim), and serves the queue's calls.
func TestLaneHostileCaller(t *testing.T) { eachLaneImpl(t, testLaneHostileCaller) }

func testLaneHostileCaller(t *testing.T, calleeImpl laneImpl) {
	g, caller, callee, l := lanePair(t, 2, hostile("lanecaller"), honest(calleeImpl), "echo")
	defer l.Close()
	until(t, g, 10*time.Second, "the callee to map the lane", func() bool { return l.Look(false).CalleeOn })
	if c := call(t, g, caller.Proc, "attack", nil); string(c.Reply) != "attacked" {
		t.Fatalf("the attack: %v %q", c.Status, c.Reply)
	}
	if lk := l.Look(true); !lk.Taken || lk.Completed != 0 {
		t.Fatalf("after the forged claim: %+v", lk)
	}
	l.Revoke()
	until(t, g, 10*time.Second, "the callee to leave the lane whose claim says taken", func() bool { return !l.Look(false).CalleeOn })
	if c := call(t, g, callee.Proc, "echo", []byte("after")); c.Status != StatusOK || string(c.Reply) != "after" {
		t.Fatalf("the callee after the attack: %v %q", c.Status, c.Reply)
	}
}

// TestLaneHostileCallee: a callee that answers its lane's calls with a
// status no UAP may write, after a flood of wake-ups, spoils only those
// answers: the caller gets a protocol error, lets the lane go, and its
// next call goes the usual way.
func TestLaneHostileCallee(t *testing.T) { eachLaneImpl(t, testLaneHostileCallee) }

func testLaneHostileCallee(t *testing.T, callerImpl laneImpl) {
	g, caller, callee, l := lanePair(t, 2, honest(callerImpl), hostile("lanecallee"), "echo")
	if got := relay(t, g, caller.Proc, "test/svc/x"); got != "x" {
		t.Fatalf("a call the callee answered after a flood of wake-ups: %q", got)
	}
	if l.CallerOn() {
		t.Fatal("the caller kept the lane whose callee woke it for nothing thousands of times")
	}
	l.Revoke()
	until(t, g, 10*time.Second, "the callee to leave the lane", func() bool { return !l.Look(false).CalleeOn })
	l.Close()
	l, err := NewLane(caller.Proc, callee.Proc, 2, laneTestSpec("echo"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := relay(t, g, caller.Proc, "test/svc/x"); !strings.HasPrefix(got, "error 9: protocol error") {
		t.Fatalf("a call the callee answered with status 99: %q", got)
	}
	if l.CallerOn() {
		t.Fatal("the caller kept the lane after a broken answer")
	}
	usualWay(t, g, caller.Proc, "test/svc/y", "usual")
}

// TestLaneTimedOutCallStillRunning: a call the scheduler ruled 'timed
// out' while the callee ran it is over for the caller, not for the
// callee, which goes on using the lane's buffer and writes its reply
// there when it finishes. The caller's next call must not share that
// buffer with it: written into the lane, its request would be overwritten
// by the late reply and run as that (and the late handler would read it
// as its own request). The caller lets such a lane go: the next call
// goes the usual way, with its own request.
func TestLaneTimedOutCallStillRunning(t *testing.T) {
	eachLanePairing(t, testLaneTimedOutCallStillRunning)
}

func testLaneTimedOutCallStillRunning(t *testing.T, callerImpl, calleeImpl laneImpl) {
	g, caller, callee, l := lanePair(t, 2, honest(callerImpl), honest(calleeImpl), "relay")
	defer l.Close()
	// Call 1 on the lane: the callee relays it to x/y and waits for our
	// answer, running it.
	if err := caller.Dispatch("relay", []byte("test/svc/x/y/first"), 0); err != nil {
		t.Fatal(err)
	}
	caller.Wake()
	first := awaitOutCall(t, g, callee.Proc)
	if string(first.Request) != "first" {
		t.Fatalf("call 1 reached the callee as %q", first.Request)
	}
	if !l.Rule(5, "timed out: the test") {
		t.Fatal("the ruling of the running call lost")
	}
	if c := waitCompletion(t, g, caller.Proc); string(c.Reply) != "error 5: timed out: the test" {
		t.Fatalf("call 1: %q", c.Reply)
	}
	// Call 2, while the callee still runs call 1.
	if err := caller.Dispatch("relay", []byte("test/svc/x/y/second"), 0); err != nil {
		t.Fatal(err)
	}
	caller.Wake()
	until(t, g, 10*time.Second, "call 2 to be made", func() bool {
		return caller.ctl.out.no.Load() > caller.outSeen.Load() || l.Look(false).Made >= 2
	})
	// Call 1 ends late, its reply written into the lane's buffer.
	callee.AnswerOutCall(first.No, 0, []byte("a/b/late reply of call 1"))
	var got OutCall
	var from string
	until(t, g, 10*time.Second, "call 2 to reach a service", func() bool {
		for _, p := range []*uapProc{caller, callee} {
			oc, ok, err := p.OutCall()
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				got, from = oc, map[*uapProc]string{caller: "the caller", callee: "the callee"}[p]
				return true
			}
		}
		return false
	})
	switch {
	case from == "the caller" && string(got.Request) == "x/y/second":
		caller.AnswerOutCall(got.No, 0, []byte("second done"))
	case from == "the callee" && string(got.Group) == "x" && string(got.Request) == "second":
		callee.AnswerOutCall(got.No, 0, []byte("second done"))
	default:
		t.Fatalf("call 2 reached %s as %s/%s %q: it ran with another call's bytes", from, got.Group, got.Service, got.Request)
	}
	if c := waitCompletion(t, g, caller.Proc); string(c.Reply) != "second done" {
		t.Fatalf("call 2: %q", c.Reply)
	}
}

// forgingLaneCallee is a UAP that takes the calls on its lanes and ends
// each with a claim of another number, so the node's rulings, which
// follow the claim, miss the call its caller waits for.
func forgingLaneCallee() {
	misserveLanes(func(h *laneHdr, n uint64) { h.claim.Store((n+5)<<8 | laneDone) })
}

// TestLaneCalleeForgesTheClaim: a callee that ends a call with a claim of
// another number spoils that call's answer, but the call still gets one:
// the node's ruling, which follows the forged claim, misses it, and the
// caller, waiting for its own number, gives up on its own a little after
// the call's deadline (bounded by watch_time), 'timed out', as the node
// would have answered it, and lets the lane go.
func TestLaneCalleeForgesTheClaim(t *testing.T) { eachLaneImpl(t, testLaneCalleeForgesTheClaim) }

func testLaneCalleeForgesTheClaim(t *testing.T, callerImpl laneImpl) {
	g := newGroup(t, 4096, 2)
	caller, callee := honest(callerImpl).start(t, g, 0), hostile("lanecalleeforge").start(t, g, 1)
	attached(t, g, caller, callee)
	lanesOK(t, g, caller, callee)
	spec := laneTestSpec("echo")
	spec.Watch = 300 * time.Millisecond
	l, err := NewLane(caller.Proc, callee.Proc, 1, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	until(t, g, 10*time.Second, "the callee to map the lane", func() bool { return l.Look(false).CalleeOn })
	if err := caller.Dispatch("relay", []byte("test/svc/x"), 0); err != nil {
		t.Fatal(err)
	}
	caller.Wake()
	until(t, g, 10*time.Second, "the call on the lane", func() bool { return l.Look(false).Made == 1 })
	time.Sleep(spec.Watch + 50*time.Millisecond)
	l.Rule(5, "timed out: the node's ruling") // as expireLanes would, past the deadline
	if c := waitCompletion(t, g, caller.Proc); !strings.HasPrefix(string(c.Reply), "error 5: timed out") {
		t.Fatalf("the call whose claim the callee forged: %q", c.Reply)
	}
	if l.CallerOn() {
		t.Fatal("the caller kept the lane")
	}
}

// TestLaneCallerNotReadingItsLine: a caller that says it takes lanes and
// never reads its control line fills it; a grant that cannot reach it
// refuses it lanes from then on, as one that cannot reach a callee does
// (else the node makes and drops a lane, lending a callee out of its
// queue and back, at every call it makes).
func TestLaneCallerNotReadingItsLine(t *testing.T) {
	eachLanePairing(t, testLaneCallerNotReadingItsLine)
}

func testLaneCallerNotReadingItsLine(t *testing.T, callerImpl, calleeImpl laneImpl) {
	g, caller, callee, l := lanePair(t, 2, honest(callerImpl), honest(calleeImpl), "echo")
	l.Revoke()
	l.Close()
	for gen := uint32(2); ; gen++ {
		if gen > 5000 {
			t.Fatal("5000 grants reached a caller that reads none")
		}
		l, err := NewLane(caller.Proc, callee.Proc, gen, laneTestSpec("echo"))
		if err != nil {
			if !callee.LanesOK() {
				t.Fatalf("grant %d: %v, and the callee refused lanes", gen, err)
			}
			break
		}
		until(t, g, 10*time.Second, "the callee to map the lane", func() bool { return l.Look(false).CalleeOn })
		l.Revoke()
		until(t, g, 10*time.Second, "the callee to leave the lane", func() bool { return !l.Look(false).CalleeOn })
		l.Close()
	}
	if caller.LanesOK() {
		t.Fatal("a caller whose control line is full still takes lanes")
	}
}

// TestLaneGivenBackKeepsItsDeadline: a call given back unrun after it
// waited on the lane goes the usual way with the time it has left, not
// the time it had when it was made (the node would hold it, and start
// it, past the caller's deadline).
func TestLaneGivenBackKeepsItsDeadline(t *testing.T) {
	eachLanePairing(t, testLaneGivenBackKeepsItsDeadline)
}

func testLaneGivenBackKeepsItsDeadline(t *testing.T, callerImpl, calleeImpl laneImpl) {
	g, caller, callee, l := lanePair(t, 2, honest(callerImpl), honest(calleeImpl), "echo")
	defer l.Close()
	stopMappedCallee(t, g, l, callee)
	if err := caller.Dispatch("relay", []byte("test/svc/z"), time.Now().Add(3*time.Second).UnixNano()); err != nil {
		t.Fatal(err)
	}
	caller.Wake()
	until(t, g, 10*time.Second, "the call on the lane", func() bool { return l.Look(false).Open })
	time.Sleep(1500 * time.Millisecond)
	if !l.Rule(laneMoved, "") {
		t.Fatal("an untaken call was not given back")
	}
	oc := awaitOutCall(t, g, caller.Proc)
	if oc.TimeoutMs > 1600 {
		t.Fatalf("the call given back after 1.5 s of its 3 went the usual way with a timeout of %d ms", oc.TimeoutMs)
	}
	caller.AnswerOutCall(oc.No, 0, []byte("usual"))
	if c := waitCompletion(t, g, caller.Proc); string(c.Reply) != "usual" {
		t.Fatalf("the call given back: %q", c.Reply)
	}
}

// TestLaneRuleTakenLeavesAnUntakenCall: at a callee's death the node
// answers 'server terminated' only a call the callee took (RuleTaken); one
// it never took is left to be given back to its caller unrun.
func TestLaneRuleTakenLeavesAnUntakenCall(t *testing.T) {
	eachLanePairing(t, testLaneRuleTakenLeavesAnUntakenCall)
}

func testLaneRuleTakenLeavesAnUntakenCall(t *testing.T, callerImpl, calleeImpl laneImpl) {
	g, caller, callee, l := lanePair(t, 2, honest(callerImpl), honest(calleeImpl), "echo")
	defer l.Close()
	stopMappedCallee(t, g, l, callee)
	if err := caller.Dispatch("relay", []byte("test/svc/z"), 0); err != nil {
		t.Fatal(err)
	}
	caller.Wake()
	until(t, g, 10*time.Second, "the call on the lane", func() bool { return l.Look(false).Open })
	if l.RuleTaken(7, "server terminated: never taken") {
		t.Fatal("a call the callee never took was answered 'server terminated'")
	}
	if !l.Rule(laneMoved, "") {
		t.Fatal("the untaken call was not left to be given back")
	}
	oc := awaitOutCall(t, g, caller.Proc)
	caller.AnswerOutCall(oc.No, 0, []byte("usual"))
	if c := waitCompletion(t, g, caller.Proc); string(c.Reply) != "usual" {
		t.Fatalf("the call given back: %q", c.Reply)
	}
}
