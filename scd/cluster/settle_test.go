package cluster

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"tpsched/netio"
	"tpsched/scd/call"
	"tpsched/scd/names"
	"tpsched/scd/route"
)

// awaitingRouter is n0's router before its table settled: it will join
// others (AwaitJoin) and knows no other node yet; its waits are bounded
// by bound.
func awaitingRouter(t *testing.T, bound time.Duration) *testRouter {
	t.Helper()
	r := unlistenedRouter(t, Options{Policy: policy(), AwaitJoin: true}, &fakeLocal{groups: map[string]*fakeGroup{}})
	r.parking.bound = bound
	r.addr = listen(t, r)
	return r
}

// servedCount is how many calls the fake local scheduler was given.
func (l *fakeLocal) servedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.served
}

// TestCallWaitsForTheTableToSettle: a node that has not yet learned the
// cluster's table (a restarted node, serving on the sockets it took over
// before its first push/pull) keeps a call and a lookup for a group no
// known node runs, and places them once the table settled: the call goes
// to the node that runs the group, the lookup names it. Answered at once,
// both met 'no such service group' (the restart itest's 3 to 35 calls in
// 17,000). After the table settled, a call for a group nobody runs is
// refused at once.
func TestCallWaitsForTheTableToSettle(t *testing.T) {
	n1 := fakeNode(t, "n1", echoing("n1"))
	r := awaitingRouter(t, time.Minute)
	c := r.client(t)
	type result struct {
		out []byte
		err error
	}
	called := make(chan result, 1)
	go func() {
		out, err := c.Call(context.Background(), "theirs", "echo", []byte("x"))
		called <- result{out, err}
	}()
	looked := sendRaw(t, r.addr, netio.Header{Kind: netio.KindNameLookup}, "theirs", "")
	select {
	case res := <-called:
		t.Fatalf("the call was answered before the table settled: %q, %v", res.out, res.err)
	case f := <-looked:
		t.Fatalf("the lookup was answered before the table settled: %v %q", f.Code, f.Payload)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := r.names.Apply(names.NodeInfo{Node: "n1", Addr: n1, Boot: 1, Seq: 1, Groups: []names.GroupInfo{{Group: "theirs"}}}); err != nil {
		t.Fatal(err)
	}
	r.parking.settle()
	select {
	case res := <-called:
		if res.err != nil || string(res.out) != "n1:x" {
			t.Errorf("the call that waited: %q, %v; want n1's answer", res.out, res.err)
		}
	case <-time.After(testWait):
		t.Fatal("the call that waited was not answered once the table settled")
	}
	select {
	case f := <-looked:
		nodes, err := netio.ParseLookupAnswer(f.Payload)
		if f.Kind != netio.KindReply || err != nil || len(nodes) != 1 || nodes[0].Addr != n1 {
			t.Errorf("the lookup that waited: %v %v %q (%v); want n1 (%s)", f.Kind, f.Code, f.Payload, err, n1)
		}
	case <-time.After(testWait):
		t.Fatal("the lookup that waited was not answered once the table settled")
	}
	start := time.Now()
	_, err := c.Call(context.Background(), "nowhere", "echo", nil)
	if codeOf(err) != netio.CodeNoSuchGroup || time.Since(start) > time.Second {
		t.Errorf("a call for a group nobody runs, after the table settled: %v after %v; want 'no such service group' at once",
			err, time.Since(start))
	}
}

// TestWaitingCallTimesOutAtItsDeadline: a call that waits for the table
// is answered 'timed out' at its own deadline, and never served.
func TestWaitingCallTimesOutAtItsDeadline(t *testing.T) {
	r := awaitingRouter(t, time.Minute)
	start := time.Now()
	answered := sendRaw(t, r.addr, netio.Header{Kind: netio.KindCall, TimeoutMs: 300}, "theirs", "echo")
	select {
	case f := <-answered:
		if f.Kind != netio.KindError || f.Code != netio.CodeTimedOut || !strings.Contains(string(f.Payload), "learned which nodes run theirs") ||
			time.Since(start) < 300*time.Millisecond {
			t.Errorf("a waiting call with 300 ms: %v %v %q after %v; want 'timed out' at its deadline",
				f.Kind, f.Code, f.Payload, time.Since(start))
		}
	case <-time.After(testWait):
		t.Fatal("a waiting call was not answered at its deadline")
	}
	if n := r.local.servedCount(); n != 0 {
		t.Errorf("the call was served %d times after its deadline", n)
	}
}

// TestWaitingCallIsPlacedAfterTheBound: a node whose table never settles
// (no seed answers, Join not even begun) holds a call at most its bound,
// then places it on what it knows: here, nowhere.
func TestWaitingCallIsPlacedAfterTheBound(t *testing.T) {
	r := awaitingRouter(t, 200*time.Millisecond)
	c := r.client(t)
	start := time.Now()
	_, err := c.Call(context.Background(), "theirs", "echo", nil)
	took := time.Since(start)
	if codeOf(err) != netio.CodeNoSuchGroup || took < 200*time.Millisecond || took > testWait {
		t.Errorf("a call that waited out the bound: %v after %v; want 'no such service group' after 200 ms", err, took)
	}
	if n := r.local.servedCount(); n != 1 {
		t.Errorf("the call reached the local scheduler %d times, want once", n)
	}
}

// TestWaitingRoomIsBounded: at most maxParked calls wait; the next is
// placed at once (here: passed on to the local scheduler), and every one
// that waited is answered once when the table settles.
func TestWaitingRoomIsBounded(t *testing.T) {
	r := awaitingRouter(t, time.Minute)
	a := make(answers, maxParked+1)
	f := netio.Frame{Header: netio.Header{Kind: netio.KindCall}, Group: []byte("theirs"), Service: []byte("echo")}
	for i := range maxParked {
		f.ID = uint64(i)
		if handled, code, _ := r.Route(a, call.From{}, &f); !handled || code != netio.CodeOK {
			t.Fatalf("call %d: handled %v, code %v; want kept", i, handled, code)
		}
	}
	f.ID = maxParked
	if handled, _, _ := r.Route(a, call.From{}, &f); handled {
		t.Fatal("a call beyond the waiting room's bound was kept")
	}
	r.parking.settle()
	seen := map[uint64]bool{}
	for range maxParked {
		select {
		case b := <-a:
			g, _, err := netio.Decode(b, 1<<20)
			if err != nil || g.Code != netio.CodeNoSuchGroup || seen[g.ID] {
				t.Fatalf("answer %v %v for id %d (seen before: %v)", err, g.Code, g.ID, seen[g.ID])
			}
			seen[g.ID] = true
		case <-time.After(testWait):
			t.Fatalf("%d of %d waiting calls answered", len(seen), maxParked)
		}
	}
	select {
	case b := <-a:
		t.Errorf("an answer too many: %q", b)
	case <-time.After(100 * time.Millisecond):
	}
}

// sendRaw sends one frame (a call or a lookup) to the test router's port
// on a connection of its own, not the client's, and returns where its
// answer comes.
func sendRaw(t *testing.T, addr string, h netio.Header, group, service string) <-chan netio.Frame {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	mc := netio.NewMuxConn(nc, netio.MuxOptions{})
	t.Cleanup(func() { mc.Close(errors.New("test ends")) })
	answered := make(chan netio.Frame, 1)
	if _, sent, err := mc.Call(h, group, service, nil, time.Time{}, answerFunc(func(f netio.Frame, err error) { answered <- f })); !sent {
		t.Fatal(err)
	}
	return answered
}

type answerFunc func(netio.Frame, error)

func (a answerFunc) Answer(f netio.Frame, err error) { a(f, err) }

// TestCallMeetsATableThatSettledWhileItWasRouted: a table that fills and
// settles after a call's look found no node, and before the call could
// wait, is looked at again: the call goes to the node it names now (it
// was passed on to this node's queue, and refused 'no such service
// group').
func TestCallMeetsATableThatSettledWhileItWasRouted(t *testing.T) {
	n1 := fakeNode(t, "n1", echoing("n1"))
	var r *testRouter
	var once sync.Once
	steer := func(_ string, cands []route.Candidate) []route.Candidate {
		once.Do(func() { // between the look and the wait
			if _, err := r.names.Apply(names.NodeInfo{Node: "n1", Addr: n1, Boot: 1, Seq: 1, Groups: []names.GroupInfo{{Group: "theirs"}}}); err != nil {
				t.Error(err)
			}
			r.parking.settle()
		})
		return cands
	}
	r = unlistenedRouter(t, Options{Policy: policy(), AwaitJoin: true, Steer: steer}, &fakeLocal{groups: map[string]*fakeGroup{}})
	r.addr = listen(t, r)
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	out, err := r.client(t).Call(ctx, "theirs", "echo", []byte("x"))
	if err != nil || string(out) != "n1:x" {
		t.Errorf("a call whose table settled under it: %q, %v; want n1's answer", out, err)
	}
}

// TestWaitingCallKeepsItsWatchTime: a call without a timeout of its own,
// bounded by watch_time, leaves the waiting room with what is left of it,
// not a fresh watch_time from there.
func TestWaitingCallKeepsItsWatchTime(t *testing.T) {
	local := &fakeLocal{groups: map[string]*fakeGroup{}}
	r := unlistenedRouter(t, Options{Policy: policy(), AwaitJoin: true, WatchTime: 10 * time.Second}, local)
	r.addr = listen(t, r)
	a := make(answers, 1)
	f := netio.Frame{Header: netio.Header{Kind: netio.KindCall, ID: 1}, Group: []byte("theirs"), Service: []byte("echo")}
	if handled, code, _ := r.Route(a, call.From{}, &f); !handled || code != netio.CodeOK {
		t.Fatalf("handled %v, code %v; want kept", handled, code)
	}
	time.Sleep(300 * time.Millisecond)
	r.parking.settle()
	select {
	case <-a:
	case <-time.After(testWait):
		t.Fatal("no answer once the table settled")
	}
	local.mu.Lock()
	defer local.mu.Unlock()
	if len(local.timeouts) != 1 || local.timeouts[0] == 0 || local.timeouts[0] > 9_700 {
		t.Errorf("placed with timeouts %v ms, want one of at most the 9,700 left of its watch_time", local.timeouts)
	}
}

// TestLookupOfAHeldGroupDoesNotWait: a group the table knows, held on
// every node that runs it, is an answer already: its lookup is answered
// at once ('no node serves it now'), as a call for it is ('held on').
func TestLookupOfAHeldGroupDoesNotWait(t *testing.T) {
	r := unlistenedRouter(t, Options{Policy: policy(), AwaitJoin: true}, &fakeLocal{groups: map[string]*fakeGroup{}},
		names.NodeInfo{Node: "n1", Addr: "127.0.0.1:1", Groups: []names.GroupInfo{{Group: "theirs", Held: true}}})
	r.addr = listen(t, r)
	looked := sendRaw(t, r.addr, netio.Header{Kind: netio.KindNameLookup}, "theirs", "")
	select {
	case f := <-looked:
		if f.Kind != netio.KindError || f.Code != netio.CodeNoSuchGroup {
			t.Errorf("lookup of a group held everywhere: %v %v %q; want 'no node serves it now'", f.Kind, f.Code, f.Payload)
		}
	case <-time.After(time.Second):
		t.Error("the lookup of a group held everywhere waited for the table")
	}
}

// waitingAtAnswer is a caller that, at each answer sent to it, checks that
// the router still counts every call of its own that waited and is not yet
// answered, the one being answered included.
type waitingAtAnswer struct {
	t        *testing.T
	r        *testRouter
	mu       sync.Mutex
	owed     int
	answered map[uint64]netio.Code
}

func (w *waitingAtAnswer) Send(b []byte) error {
	f, _, err := netio.Decode(b, 1<<20)
	if err != nil {
		return err
	}
	waiting := w.r.Waiting()
	w.mu.Lock()
	defer w.mu.Unlock()
	if waiting < w.owed {
		w.t.Errorf("call %d answered %v with %d calls waiting, %d owed: a drain would see them gone", f.ID, f.Code, waiting, w.owed)
	}
	w.owed--
	w.answered[f.ID] = f.Code
	return nil
}

// TestAWaitingCallCountsUntilItIsAnswered: the calls that wait for the
// table are counted (Router.Waiting, which the node's drain adds to its
// calls in flight) while they wait and until each is answered or placed,
// whether its deadline passed or the table settled. Uncounted, a drain
// that began as a new node learned the table (a hand-over soon after a
// start) saw none, and the port closed before their answers.
func TestAWaitingCallCountsUntilItIsAnswered(t *testing.T) {
	r := awaitingRouter(t, time.Minute)
	w := &waitingAtAnswer{t: t, r: r, answered: map[uint64]netio.Code{}}
	park := func(id uint64, timeoutMs uint32) {
		t.Helper()
		f := &netio.Frame{Header: netio.Header{Kind: netio.KindCall, ID: id, TimeoutMs: timeoutMs}, Group: []byte("nowhere"), Service: []byte("echo")}
		var deadline time.Time
		if timeoutMs > 0 {
			deadline = time.Now().Add(time.Duration(timeoutMs) * time.Millisecond)
		}
		w.mu.Lock()
		w.owed++
		w.mu.Unlock()
		if !r.parkCall(w, call.From{}, f, deadline) {
			t.Fatalf("call %d was not kept to wait", id)
		}
	}
	park(1, 50)
	park(2, 0)
	park(3, 0)
	if n := r.Waiting(); n < 2 {
		t.Errorf("%d calls waiting after three were kept, want at least 2 (one may be answered at its deadline)", n)
	}
	answered := func(n int) func() bool {
		return func() bool { w.mu.Lock(); defer w.mu.Unlock(); return len(w.answered) >= n }
	}
	waitUntil(t, "the call with 50 ms answered at its deadline", answered(1))
	r.parking.settle()
	waitUntil(t, "the calls that waited answered once the table settled", answered(3))
	// Counted off after the last answer was sent: a moment after.
	waitUntil(t, "no call waiting after every answer", func() bool { return r.Waiting() == 0 })
	w.mu.Lock()
	defer w.mu.Unlock()
	want := map[uint64]netio.Code{1: netio.CodeTimedOut, 2: netio.CodeNoSuchGroup, 3: netio.CodeNoSuchGroup}
	for id, code := range want {
		if got := w.answered[id]; got != code {
			t.Errorf("call %d answered %v, want %v", id, got, code)
		}
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(testWait); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", testWait, what)
		}
	}
}

// TestAStopBeforeTheTableSettledIsNotNoSuchGroup: a node that stops
// learning the table before it settled (handed over again soon after a
// restart, or stopped, while a seed does not answer) refuses the calls and
// lookups for a group no known node runs as its stop ('node shutting
// down': call again), the ones that waited and those that come after, and
// passes no such call to its local scheduler, which would answer 'no such
// service group' for a group another node may run (the cluster torture's
// answers with a serving node in n0's table). A group defined here goes to
// the local scheduler as before, serving or not (it says why), and a node
// whose table settled first still answers 'no such service group' when it
// stops.
func TestAStopBeforeTheTableSettledIsNotNoSuchGroup(t *testing.T) {
	refused := func(t *testing.T, what string, code netio.Code, msg string) {
		t.Helper()
		if code != netio.CodeShuttingDown || !strings.Contains(msg, "learning which nodes run theirs") {
			t.Errorf("%s: %v %q; want 'node shutting down', saying the node had not learned who runs theirs", what, code, msg)
		}
	}
	refusedCall := func(t *testing.T, what string, err error) {
		t.Helper()
		var te *netio.Error
		if !errors.As(err, &te) {
			t.Errorf("%s: %v; want 'node shutting down'", what, err)
			return
		}
		refused(t, what, te.Code, te.Message)
	}
	lookup := netio.Header{Kind: netio.KindNameLookup}
	for _, stop := range []string{"hand-over", "leave"} {
		t.Run(stop, func(t *testing.T) {
			r := awaitingRouter(t, time.Minute)
			r.local.mu.Lock()
			r.local.groups["mine"] = &fakeGroup{} // defined here, not serving
			r.local.mu.Unlock()
			c := r.client(t)
			waited := make(chan error, 1)
			go func() {
				_, err := c.Call(context.Background(), "theirs", "echo", nil)
				waited <- err
			}()
			looked := sendRaw(t, r.addr, lookup, "theirs", "")
			waitUntil(t, "the call and the lookup to wait for the table", func() bool { return r.Waiting() == 2 })
			if stop == "leave" {
				r.Leave()
			} else {
				r.StopWithoutLeaving()
			}
			for _, ch := range []<-chan netio.Frame{looked, sendRaw(t, r.addr, lookup, "theirs", "")} {
				select {
				case f := <-ch:
					refused(t, "a lookup", f.Code, string(f.Payload))
				case <-time.After(testWait):
					t.Fatal("a lookup was not answered after the stop")
				}
			}
			select {
			case err := <-waited:
				refusedCall(t, "the call that waited", err)
			case <-time.After(testWait):
				t.Fatal("the waiting call was not answered at the stop")
			}
			_, err := c.Call(context.Background(), "theirs", "echo", nil)
			refusedCall(t, "a call after the stop", err)
			if n := r.local.servedCount(); n != 0 {
				t.Errorf("the local scheduler was given %d of the calls for theirs", n)
			}
			_, _ = c.Call(context.Background(), "mine", "echo", nil)
			if n := r.local.servedCount(); n != 1 {
				t.Errorf("the call for a group defined here reached the local scheduler %d times, want once", n)
			}
		})
	}
	t.Run("settled first", func(t *testing.T) {
		r := awaitingRouter(t, time.Minute)
		r.parking.settle()
		r.StopWithoutLeaving()
		_, err := r.client(t).Call(context.Background(), "theirs", "echo", nil)
		if codeOf(err) != netio.CodeNoSuchGroup {
			t.Errorf("a call after the stop of a node whose table settled: %v; want 'no such service group'", err)
		}
		select {
		case f := <-sendRaw(t, r.addr, lookup, "theirs", ""):
			if f.Code != netio.CodeNoSuchGroup {
				t.Errorf("a lookup after the stop of a node whose table settled: %v %q; want 'no such service group'", f.Code, f.Payload)
			}
		case <-time.After(testWait):
			t.Fatal("a lookup was not answered")
		}
	})
}
