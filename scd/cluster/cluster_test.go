package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/netio"
	"tpsched/netio/rpcport"
	"tpsched/scd/call"
	"tpsched/scd/client"
	"tpsched/scd/def"
	"tpsched/scd/loadlevel"
	"tpsched/scd/names"
	"tpsched/scd/peers"
	"tpsched/scd/route"
)

// These tests run the router in process against fakes of its neighbours:
// fakeLocal stands for the local scheduler (its groups and what Serve got),
// the other nodes are fake nodes (an RPC port on loopback with the node's
// side of the peer hello, answering as the test says), and the router's
// own RPC port is an rpcport server that hands every call to the router,
// then, as the node's line does, to fakeLocal.

const (
	testWait = 10 * time.Second // bound on every wait in these tests
	testKey  = "the-right-key-0123456789"
)

// fakeGroup is a group as Local reports it.
type fakeGroup struct {
	def     def.Server
	held    bool
	serving bool
	level   loadlevel.Level
}

func (g *fakeGroup) Def() *def.Server       { return &g.def }
func (g *fakeGroup) Held() bool             { return g.held }
func (g *fakeGroup) Serving() bool          { return g.serving }
func (g *fakeGroup) Level() loadlevel.Level { return g.level }
func (g *fakeGroup) InFlight() int          { return 0 }

// fakeLocal is the node's own groups; Serve answers every call with its
// payload prefixed "here:" and counts it.
type fakeLocal struct {
	mu       sync.Mutex
	groups   map[string]*fakeGroup
	served   int
	timeouts []uint32 // the TimeoutMs of each call Serve got
}

func (l *fakeLocal) Group(name string) (Group, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if g, ok := l.groups[name]; ok {
		return g, true
	}
	return nil, false
}

func (l *fakeLocal) Serve(c call.Caller, f *netio.Frame) (netio.Code, string) {
	l.mu.Lock()
	g := l.groups[string(f.Group)]
	l.served++
	l.timeouts = append(l.timeouts, f.TimeoutMs)
	l.mu.Unlock()
	if g == nil {
		return netio.CodeNoSuchGroup, string(f.Group)
	}
	_ = c.Send(netio.AppendReply(nil, f.ID, append([]byte("here:"), f.Payload...)))
	return netio.CodeOK, ""
}

func (l *fakeLocal) UnknownGroup(name string) string { return name }

// fakeNode is another node: its RPC port with the peer hello; every call
// goes to answer.
func fakeNode(t *testing.T, name string, answer func(c *rpcport.Conn, f netio.Frame)) string {
	t.Helper()
	h := &nodeHandler{hello: peers.NewAcceptor(name, []byte(testKey), metrics.NewSet().NewCounter("refused"), slog.New(slog.DiscardHandler)), answer: answer}
	return listen(t, h)
}

type nodeHandler struct {
	hello  *peers.Acceptor
	answer func(c *rpcport.Conn, f netio.Frame)
}

func (h *nodeHandler) OnFrame(c *rpcport.Conn, f netio.Frame) {
	if f.Kind == netio.KindAnnounce {
		h.hello.Accept(c, &f)
		return
	}
	h.answer(c, f)
}

func (h *nodeHandler) OnClose(*rpcport.Conn) {}

func listen(t *testing.T, h rpcport.Handler) string {
	t.Helper()
	srv, err := rpcport.Listen(rpcport.Options{Addr: "127.0.0.1:0", MaxPayload: def.MaxMaxMessageSize,
		Logger: slog.New(slog.DiscardHandler)}, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testWait)
		defer cancel()
		_ = srv.Stop(ctx)
	})
	return srv.Addr()
}

// echoing answers every call with its payload prefixed by the node's name.
func echoing(name string) func(c *rpcport.Conn, f netio.Frame) {
	return func(c *rpcport.Conn, f netio.Frame) {
		c.SendNow(netio.AppendReply(nil, f.ID, append([]byte(name+":"), f.Payload...)))
	}
}

// refusing answers every call with code, as a node does that did not run
// it.
func refusing(code netio.Code) func(c *rpcport.Conn, f netio.Frame) {
	return func(c *rpcport.Conn, f netio.Frame) { c.SendNow(netio.AppendError(nil, f.ID, code, "refused")) }
}

// testRouter is node n0's router (with a name table of members and the
// policy opts.Policy) behind an RPC port of its own, which hands each call
// to the router and then to local, as the node's line does.
type testRouter struct {
	*Router
	hello   *peers.Acceptor
	local   *fakeLocal
	metrics *metrics.Set
	addr    string
}

func newTestRouter(t *testing.T, opts Options, local *fakeLocal, members ...names.NodeInfo) *testRouter {
	t.Helper()
	r := unlistenedRouter(t, opts, local, members...)
	r.addr = listen(t, r)
	return r
}

// unlistenedRouter is newTestRouter's router before its port opens, for
// a test to change what the port's loops will read.
func unlistenedRouter(t *testing.T, opts Options, local *fakeLocal, members ...names.NodeInfo) *testRouter {
	t.Helper()
	set := metrics.NewSet()
	pool := peers.New(peers.Options{Self: "n0", Key: []byte(testKey), Log: slog.New(slog.DiscardHandler), Metrics: set})
	t.Cleanup(pool.Close)
	opts.Self, opts.Log, opts.Metrics, opts.Pool, opts.Local = "n0", slog.New(slog.DiscardHandler), set, pool, local
	opts.CounterFunc = func(string, func() uint64) {}
	r := &testRouter{Router: New(opts), local: local, metrics: set,
		hello: peers.NewAcceptor("n0", []byte(testKey), set.NewCounter("refused"), slog.New(slog.DiscardHandler))}
	for _, m := range members {
		m.Boot, m.Seq = 1, 1
		if _, err := r.names.Apply(m); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

func (r *testRouter) OnFrame(c *rpcport.Conn, f netio.Frame) {
	if f.Kind == netio.KindAnnounce {
		r.hello.Accept(c, &f)
		return
	}
	if f.Kind == netio.KindNameLookup {
		r.AnswerLookup(c, &f)
		return
	}
	if f.Kind != netio.KindCall && f.Kind != netio.KindCallNoReply {
		return
	}
	from := call.From{Conn: c, Peer: peers.Hop(c, &f)}
	code, msg := call.Line{r.Router, r.local}.Route(c, from, &f)
	if code != netio.CodeOK && f.Kind == netio.KindCall {
		c.SendNow(netio.AppendError(nil, f.ID, code, msg))
	}
}

func (r *testRouter) OnClose(*rpcport.Conn) {}

// stage is the last stage of the test's line: the fake local scheduler.
func (l *fakeLocal) Route(c call.Caller, _ call.From, f *netio.Frame) (bool, netio.Code, string) {
	code, msg := l.Serve(c, f)
	return true, code, msg
}

func (r *testRouter) client(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.New(client.Options{Hosts: []string{r.addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func codeOf(err error) netio.Code {
	var te *netio.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 255
}

// metricValue is the value of the series named exactly name.
func metricValue(set *metrics.Set, name string) int {
	var b bytes.Buffer
	set.WritePrometheus(&b)
	for _, line := range strings.Split(b.String(), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

func policy() route.Policy { return route.Policy{Rule: route.OpenTP1, Announce: true} }

// TestRouteTransfersOrLetsPass: a group only another node serves goes
// there and its answer comes back under the caller's id; a group served
// here and nowhere else stays; a call that names this node (an explicit
// destination) stays even for a group served elsewhere.
func TestRouteTransfersOrLetsPass(t *testing.T) {
	n1 := fakeNode(t, "n1", echoing("n1"))
	local := &fakeLocal{groups: map[string]*fakeGroup{"mine": {serving: true}, "both": {serving: true}}}
	r := newTestRouter(t, Options{Policy: route.Policy{Rule: route.OpenTP1, Announce: true, ThisNodeFirst: true}}, local,
		names.NodeInfo{Node: "n1", Addr: n1, Groups: []names.GroupInfo{{Group: "both"}, {Group: "theirs"}}})
	c := r.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	for _, tc := range []struct{ group, want string }{
		{"theirs", "n1:x"}, // only n1 runs it
		{"mine", "here:x"}, // only this node
		{"both", "here:x"}, // this_node_first
	} {
		out, err := c.Call(ctx, tc.group, "echo", []byte("x"))
		if err != nil || string(out) != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.group, out, err, tc.want)
		}
	}
	if got := metricValue(r.metrics, `tpsched_forwarded_total{to="n1"}`); got != 1 {
		t.Errorf("%d calls transferred to n1, want 1", got)
	}
}

// TestRouteNeverTransfersATransferredCall: a call that bears the hop mark
// of a node that proved the cluster key is served here (or refused), never
// sent on, and counted under the node's name once it is a member.
func TestRouteNeverTransfersATransferredCall(t *testing.T) {
	n1 := fakeNode(t, "n1", echoing("n1"))
	local := &fakeLocal{groups: map[string]*fakeGroup{}}
	r := newTestRouter(t, Options{Policy: policy()}, local,
		names.NodeInfo{Node: "n1", Addr: n1, Groups: []names.GroupInfo{{Group: "theirs"}}})
	// n1 transfers a call for "theirs" here (its table was stale): the
	// router must not send it back.
	pool := peers.New(peers.Options{Self: "n1", Key: []byte(testKey), Log: slog.New(slog.DiscardHandler), Metrics: metrics.NewSet()})
	t.Cleanup(pool.Close)
	a := &recorder{ch: make(chan netio.Frame, 1)}
	fc := &peers.Call{Caller: a, CallerID: 5, Kind: netio.KindCall, Group: "theirs", Service: "echo", Start: time.Now(), Deadline: time.Now().Add(testWait)}
	if code, msg := pool.Send("n0", r.addr, fc); code != netio.CodeOK {
		t.Fatalf("send: %v %s", code, msg)
	}
	f := a.next(t)
	if f.Kind != netio.KindError || f.Code != netio.CodeNoSuchGroup {
		t.Errorf("a transferred call for a group not here: %v %v %q, want 'no such service group' from n0 itself", f.Kind, f.Code, f.Payload)
	}
	if got := metricValue(r.metrics, `tpsched_forwarded_total{to="n1"}`); got != 0 {
		t.Errorf("the transferred call was sent on %d times", got)
	}
	if got := metricValue(r.metrics, `tpsched_requests_received_total{from="n1"}`); got != 1 {
		t.Errorf("received from n1: %d, want 1", got)
	}
}

// recorder is a caller that keeps the one answer it gets.
type recorder struct{ ch chan netio.Frame }

// next is the next frame the caller was sent; none within testWait fails
// the test.
func (r *recorder) next(t *testing.T) netio.Frame {
	t.Helper()
	select {
	case f := <-r.ch:
		return f
	case <-time.After(testWait):
		t.Fatal("no answer")
		return netio.Frame{}
	}
}

func (r *recorder) Send(b []byte) error {
	f, _, err := netio.Decode(b, 1<<20)
	if err != nil {
		return err
	}
	f.Payload = append([]byte(nil), f.Payload...)
	r.ch <- f
	return nil
}

// TestRefusedTransferGoesElsewhere: a node that refuses a transferred call
// before running it ('node shutting down': it drains) makes the router
// send the call to another node, with scd_retry_of_comm_error; without
// retries the caller gets the refusal itself.
func TestRefusedTransferGoesElsewhere(t *testing.T) {
	for _, retries := range []int{1, 0} {
		t.Run(fmt.Sprintf("retries %d", retries), func(t *testing.T) {
			stopping := fakeNode(t, "n1", refusing(netio.CodeShuttingDown))
			serving := fakeNode(t, "n2", echoing("n2"))
			work := []names.GroupInfo{{Group: "work"}}
			r := newTestRouter(t, Options{Policy: policy(), Retries: retries}, &fakeLocal{groups: map[string]*fakeGroup{}},
				names.NodeInfo{Node: "n1", Addr: stopping, Groups: work}, names.NodeInfo{Node: "n2", Addr: serving, Groups: work})
			c := r.client(t)
			ctx, cancel := context.WithTimeout(context.Background(), testWait)
			defer cancel()
			var served, refused int
			for i := range 200 { // about half go to n1 first
				want := strconv.Itoa(i)
				out, err := c.Call(ctx, "work", "echo", []byte(want))
				switch {
				case err == nil && string(out) == "n2:"+want:
					served++
				case retries == 0 && codeOf(err) == netio.CodeShuttingDown:
					refused++
				default:
					t.Fatalf("call %d: %q, %v", i, out, err)
				}
			}
			toN1 := metricValue(r.metrics, `tpsched_forwarded_total{to="n1"}`)
			retried := metricValue(r.metrics, `tpsched_transfer_retries_total{reason="refused"}`)
			t.Logf("served %d, refused %d; %d sent to the stopping node, %d sent on", served, refused, toN1, retried)
			switch {
			case retries == 1 && served != 200:
				t.Errorf("%d of 200 calls served with a retry", served)
			case retries == 1 && (toN1 == 0 || retried != toN1):
				t.Errorf("%d calls sent to the stopping node, %d sent on", toN1, retried)
			case retries == 0 && (refused < 50 || served < 50):
				t.Errorf("without retries: %d refused, %d served; want about half each", refused, served)
			}
		})
	}
}

// TestRerouteServesHereWhenThisNodeRunsTheGroup: a call the only other
// node cannot be reached for is served here when this node runs the
// group too (a retry may come back), and answered 'network down' when it
// does not.
func TestRerouteServesHereWhenThisNodeRunsTheGroup(t *testing.T) {
	local := &fakeLocal{groups: map[string]*fakeGroup{"both": {serving: true}}}
	r := newTestRouter(t, Options{Policy: policy(), Retries: 1}, local,
		names.NodeInfo{Node: "n1", Addr: "127.0.0.1:1", Groups: []names.GroupInfo{{Group: "both"}, {Group: "theirs"}}})
	a := &recorder{ch: make(chan netio.Frame, 1)}
	fc := &peers.Call{Caller: a, CallerID: 9, Kind: netio.KindCall, Group: "both", Service: "echo", Payload: []byte("y"),
		Start: time.Now(), Deadline: time.Now().Add(testWait), Retries: 1}
	if code, msg := r.transfer(fc, "n1"); code != netio.CodeOK {
		t.Fatalf("transfer: %v %s", code, msg)
	}
	f := a.next(t)
	if f.Kind != netio.KindReply || string(f.Payload) != "here:y" {
		t.Errorf("rerouted call: %v %v %q, want served here", f.Kind, f.Code, f.Payload)
	}
	fc = &peers.Call{Caller: a, CallerID: 10, Kind: netio.KindCall, Group: "theirs", Service: "echo",
		Start: time.Now(), Deadline: time.Now().Add(testWait), Retries: 1}
	_, _ = r.transfer(fc, "n1")
	f = a.next(t)
	if f.Kind != netio.KindError || f.Code != netio.CodeNetworkDown {
		t.Errorf("a call for a group only the unreachable node runs: %v %v %q, want 'network down'", f.Kind, f.Code, f.Payload)
	}
}

// TestRerouteKeepsTheCallsDeadline: a call sent on after its node could
// not be reached keeps its caller's deadline. One whose deadline passed
// (it waited in the peer's queue while the lane dialled) is answered
// 'timed out' and served nowhere: served here it would run after its
// caller was told 'timed out'. One still in time is served here with the
// time it has left, not its first budget again.
func TestRerouteKeepsTheCallsDeadline(t *testing.T) {
	local := &fakeLocal{groups: map[string]*fakeGroup{"both": {serving: true}}}
	r := newTestRouter(t, Options{Policy: policy(), Retries: 1}, local,
		names.NodeInfo{Node: "n1", Addr: "127.0.0.1:1", Groups: []names.GroupInfo{{Group: "both"}}})
	a := &recorder{ch: make(chan netio.Frame, 1)}
	start := time.Now().Add(-time.Second)
	fc := &peers.Call{Caller: a, CallerID: 9, Kind: netio.KindCall, Group: "both", Service: "echo", Payload: []byte("y"),
		TimeoutMs: 500, Start: start, Deadline: start.Add(500 * time.Millisecond), Retries: 1}
	if code, msg := r.transfer(fc, "n1"); code != netio.CodeOK {
		t.Fatalf("transfer: %v %s", code, msg)
	}
	f := a.next(t)
	if f.Kind != netio.KindError || f.Code != netio.CodeTimedOut {
		t.Errorf("a rerouted call past its deadline: %v %v %q, want 'timed out'", f.Kind, f.Code, f.Payload)
	}
	local.mu.Lock()
	served := local.served
	local.mu.Unlock()
	if served != 0 {
		t.Errorf("a call past its deadline was served here %d times", served)
	}

	start = time.Now().Add(-50 * time.Second)
	fc = &peers.Call{Caller: a, CallerID: 10, Kind: netio.KindCall, Group: "both", Service: "echo", Payload: []byte("z"),
		TimeoutMs: 60_000, Start: start, Deadline: start.Add(60 * time.Second), Retries: 1}
	if code, msg := r.transfer(fc, "n1"); code != netio.CodeOK {
		t.Fatalf("transfer: %v %s", code, msg)
	}
	f = a.next(t)
	if f.Kind != netio.KindReply {
		t.Fatalf("a rerouted call in time: %v %v %q, want served here", f.Kind, f.Code, f.Payload)
	}
	local.mu.Lock()
	defer local.mu.Unlock()
	if len(local.timeouts) != 1 || local.timeouts[0] == 0 || local.timeouts[0] > 10_000 {
		t.Errorf("served here with timeouts %v ms, want one of at most the 10,000 left", local.timeouts)
	}
}

// TestQueuedCallPastItsDeadlineIsNotSent: a call whose deadline passed
// before its lane could write it is answered 'timed out' and never reaches
// the other node, which would run it after its caller gave up.
func TestQueuedCallPastItsDeadlineIsNotSent(t *testing.T) {
	var mu sync.Mutex
	got := 0
	n1 := fakeNode(t, "n1", func(c *rpcport.Conn, f netio.Frame) {
		mu.Lock()
		got++
		mu.Unlock()
		echoing("n1")(c, f)
	})
	r := newTestRouter(t, Options{Policy: policy()}, &fakeLocal{groups: map[string]*fakeGroup{}},
		names.NodeInfo{Node: "n1", Addr: n1, Groups: []names.GroupInfo{{Group: "theirs"}}})
	a := &recorder{ch: make(chan netio.Frame, 2)}
	start := time.Now().Add(-time.Second)
	late := &peers.Call{Caller: a, CallerID: 1, Kind: netio.KindCall, Group: "theirs", Service: "echo", Payload: []byte("late"),
		TimeoutMs: 500, Start: start, Deadline: start.Add(500 * time.Millisecond)}
	if code, msg := r.transfer(late, "n1"); code != netio.CodeOK {
		t.Fatalf("transfer: %v %s", code, msg)
	}
	f := a.next(t)
	if f.Kind != netio.KindError || f.Code != netio.CodeTimedOut {
		t.Errorf("a queued call past its deadline: %v %v %q, want 'timed out'", f.Kind, f.Code, f.Payload)
	}
	// A call in time after it: once it is answered, the late one would
	// have reached n1 before it, on the same connection.
	ok := &peers.Call{Caller: a, CallerID: 2, Kind: netio.KindCall, Group: "theirs", Service: "echo", Payload: []byte("ok"),
		Start: time.Now(), Deadline: time.Now().Add(testWait)}
	if code, msg := r.transfer(ok, "n1"); code != netio.CodeOK {
		t.Fatalf("transfer: %v %s", code, msg)
	}
	f = a.next(t)
	if f.Kind != netio.KindReply || string(f.Payload) != "n1:ok" {
		t.Errorf("a call in time: %v %v %q, want n1's echo", f.Kind, f.Code, f.Payload)
	}
	mu.Lock()
	defer mu.Unlock()
	if got != 1 {
		t.Errorf("n1 got %d calls, want 1 (the late one must not be sent)", got)
	}
}

// answers is a call.Caller for a UAP's own call: it keeps what it is sent.
type answers chan []byte

func (a answers) Send(b []byte) error { a <- append([]byte(nil), b...); return nil }

// TestScheduleRateOnlyForSchedulerDirectCalls: with n1 at LEVEL0 and n2 at
// LEVEL1, schedule_rate (50: LEVEL0 and LEVEL1 alike) weighs only the
// calls of a scheduler-direct client (dcscddirect = Y); a plain client's
// calls, and a UAP's own calls even when marked, go to the least-loaded
// node, n1 (Table 3-7: announce Y, this_node_first N).
func TestScheduleRateOnlyForSchedulerDirectCalls(t *testing.T) {
	n1, n2 := fakeNode(t, "n1", echoing("n1")), fakeNode(t, "n2", echoing("n2"))
	r := newTestRouter(t, Options{Policy: route.Policy{Rule: route.OpenTP1, Announce: true, ScheduleRate: 50}},
		&fakeLocal{groups: map[string]*fakeGroup{}},
		names.NodeInfo{Node: "n1", Addr: n1, Groups: []names.GroupInfo{{Group: "g", Level: loadlevel.Level0}}},
		names.NodeInfo{Node: "n2", Addr: n2, Groups: []names.GroupInfo{{Group: "g", Level: loadlevel.Level1}}})
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	const calls = 200
	count := func(c *client.Client) map[string]int {
		got := map[string]int{}
		for range calls {
			out, err := c.Call(ctx, "g", "echo", []byte("x"))
			if err != nil {
				t.Fatal(err)
			}
			node, _, _ := strings.Cut(string(out), ":")
			got[node]++
		}
		return got
	}
	plain := count(r.client(t))
	direct, err := client.New(client.Options{Hosts: []string{r.addr}, SchedulerDirect: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close() })
	weighted := count(direct)
	uap := map[string]int{}
	for i := range calls {
		a := make(answers, 1)
		f := netio.Frame{Header: netio.Header{Kind: netio.KindCall, ID: uint64(i + 1), Flags: netio.FlagSchedulerDirect},
			Group: []byte("g"), Service: []byte("echo"), Payload: []byte("x")}
		if handled, code, msg := r.Route(a, call.From{}, &f); !handled || code != netio.CodeOK {
			t.Fatalf("a UAP's call: handled %v, %v %s", handled, code, msg)
		}
		select {
		case b := <-a:
			rf, _, err := netio.Decode(b, len(b))
			if err != nil {
				t.Fatal(err)
			}
			node, _, _ := strings.Cut(string(rf.Payload), ":")
			uap[node]++
		case <-ctx.Done():
			t.Fatal("a UAP's call was not answered")
		}
	}
	t.Logf("served by n1/n2: plain client %d/%d, scheduler-direct client %d/%d, UAP %d/%d",
		plain["n1"], plain["n2"], weighted["n1"], weighted["n2"], uap["n1"], uap["n2"])
	if plain["n1"] != calls || uap["n1"] != calls {
		t.Errorf("plain client's calls %v, UAP's calls %v: want all %d on n1, the least loaded", plain, uap, calls)
	}
	// 50:50 over n1 and n2: 100 ± 7 each (one sigma); 60 is far out.
	if weighted["n1"] < 60 || weighted["n2"] < 60 {
		t.Errorf("scheduler-direct calls %v: want them spread over n1 and n2 (schedule_rate 50)", weighted)
	}
}

// TestCallsQueuedForALeftNodeGoElsewhereFree: calls queued for a node that
// never answered its hello, which then leaves the cluster, were never
// written: they go to another node, free of the retry budget (here 0),
// as a call routed to a node that left before its transfer does. Before,
// each was charged, and with no retry left answered 'network down'.
func TestCallsQueuedForALeftNodeGoElsewhereFree(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() { // accepts and never answers the hello
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	n2 := fakeNode(t, "n2", echoing("n2"))
	r := newTestRouter(t, Options{Policy: policy()}, &fakeLocal{groups: map[string]*fakeGroup{}},
		names.NodeInfo{Node: "n1", Addr: ln.Addr().String(), Groups: []names.GroupInfo{{Group: "theirs"}}},
		names.NodeInfo{Node: "n2", Addr: n2, Groups: []names.GroupInfo{{Group: "theirs"}}})
	a := &recorder{ch: make(chan netio.Frame, 2)}
	for id := uint64(1); id <= 2; id++ {
		fc := &peers.Call{Caller: a, CallerID: id, Kind: netio.KindCall, Group: "theirs", Service: "echo", Payload: []byte("x"),
			Start: time.Now(), Deadline: time.Now().Add(testWait)}
		if code, msg := r.transfer(fc, "n1"); code != netio.CodeOK {
			t.Fatalf("transfer: %v %s", code, msg)
		}
	}
	r.names.Remove("n1")
	r.pool.NodeLeft("n1")
	for range 2 {
		f := a.next(t)
		if f.Kind != netio.KindReply || string(f.Payload) != "n2:x" {
			t.Errorf("a call queued for n1 when it left: %v %v %q, want n2's echo", f.Kind, f.Code, f.Payload)
		}
	}
}

// refusingAddr is an address on loopback whose connections are refused
// (a node killed, not yet out of the name table).
func refusingAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	return ln.Addr().String()
}

// servedOrDown makes n calls of work/echo through c, one after another,
// and counts those echoed by the node whose replies start with by and
// those answered 'network down'; any other outcome fails the test.
func servedOrDown(t *testing.T, c *client.Client, n int, by string) (served, down int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	for i := range n {
		want := strconv.Itoa(i)
		out, err := c.Call(ctx, "work", "echo", []byte(want))
		switch {
		case err == nil && string(out) == by+want:
			served++
		case codeOf(err) == netio.CodeNetworkDown:
			down++
		default:
			t.Fatalf("call %d: %q, %v", i, out, err)
		}
	}
	return served, down
}

// TestUnreachableNodeIsLeftOutWhileAnotherServes: a node whose port
// refuses connections (killed, not yet out of the name table) meets one
// call a second at most while another node serves the group; without
// retries each call sent there was answered 'network down', about half of
// them.
func TestUnreachableNodeIsLeftOutWhileAnotherServes(t *testing.T) {
	dead := refusingAddr(t)
	serving := fakeNode(t, "n2", echoing("n2"))
	work := []names.GroupInfo{{Group: "work"}}
	r := newTestRouter(t, Options{Policy: policy()}, &fakeLocal{groups: map[string]*fakeGroup{}},
		names.NodeInfo{Node: "n1", Addr: dead, Groups: work}, names.NodeInfo{Node: "n2", Addr: serving, Groups: work})
	c := r.client(t)
	began := time.Now()
	served, down := servedOrDown(t, c, 200, "n2:")
	took := time.Since(began)
	t.Logf("served %d, 'network down' %d, in %v", served, down, took.Round(time.Millisecond))
	if limit := 1 + int(took/time.Second); down == 0 || down > limit {
		t.Errorf("%d calls answered 'network down' in %v, want 1 to %d (the first, then one a second)", down, took, limit)
	}
}

// TestBalancedCallStaysHereWhenTheOtherNodeIsUnreachable: a balanced call
// at a node whose group is LEVEL2, where the only other node announced
// LEVEL0 and cannot be connected to, is served here once that node is
// left out (no lower node remains), not sent on to meet the refusal.
func TestBalancedCallStaysHereWhenTheOtherNodeIsUnreachable(t *testing.T) {
	dead := refusingAddr(t)
	local := &fakeLocal{groups: map[string]*fakeGroup{
		"work": {def: def.Server{ServiceGroup: "work"}, serving: true, level: loadlevel.Level2}}}
	r := newTestRouter(t, Options{Policy: policy()}, local,
		names.NodeInfo{Node: "n1", Addr: dead, Groups: []names.GroupInfo{{Group: "work", Level: loadlevel.Level0}}})
	c, err := client.New(client.Options{Hosts: []string{r.addr}, Balanced: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	here, down := servedOrDown(t, c, 20, "here:")
	if down > 1 {
		t.Errorf("%d of 20 balanced calls sent to the node that cannot be reached ('network down'), %d served here; want the first only", down, here)
	}
}

// TestRetryIsWeighedAsTheFirstChoice: with the P2C rule, a call refused
// before it ran and sent on is chosen for as it was the first time:
// schedule_rate weighs the draw only for a scheduler-direct call. With
// n2 at LEVEL0 and n3, n4 at LEVEL1, rate 100 (weights 100, 1, 1), a
// plain call goes to n2 when n2 is one of the two drawn, 2 in 3 (60 of
// 90, ± 4.5); a scheduler-direct one almost always (89 of 90). Every
// retry was weighed as scheduler-direct.
func TestRetryIsWeighedAsTheFirstChoice(t *testing.T) {
	refused := fakeNode(t, "n1", refusing(netio.CodeShuttingDown))
	r := newTestRouter(t, Options{Policy: route.Policy{Rule: route.P2C, Announce: true, ScheduleRate: 100}, Retries: 1},
		&fakeLocal{groups: map[string]*fakeGroup{}},
		names.NodeInfo{Node: "n1", Addr: refused, Groups: []names.GroupInfo{{Group: "g"}}},
		names.NodeInfo{Node: "n2", Addr: fakeNode(t, "n2", echoing("n2")), Groups: []names.GroupInfo{{Group: "g"}}},
		names.NodeInfo{Node: "n3", Addr: fakeNode(t, "n3", echoing("n3")), Groups: []names.GroupInfo{{Group: "g", Level: loadlevel.Level1}}},
		names.NodeInfo{Node: "n4", Addr: fakeNode(t, "n4", echoing("n4")), Groups: []names.GroupInfo{{Group: "g", Level: loadlevel.Level1}}})
	const calls = 90
	toN2 := func(direct bool) int {
		n := 0
		for i := range calls {
			a := &recorder{ch: make(chan netio.Frame, 1)}
			fc := &peers.Call{Caller: a, CallerID: uint64(i + 1), Kind: netio.KindCall, Group: "g", Service: "echo",
				Payload: []byte("x"), Start: time.Now(), Deadline: time.Now().Add(testWait), Retries: 1, Direct: direct}
			if code, msg := r.transfer(fc, "n1"); code != netio.CodeOK {
				t.Fatalf("transfer: %v %s", code, msg)
			}
			f := a.next(t)
			if f.Kind != netio.KindReply {
				t.Fatalf("call %d: %v %v %q, want an echo from n2, n3 or n4", i, f.Kind, f.Code, f.Payload)
			}
			if string(f.Payload) == "n2:x" {
				n++
			}
		}
		return n
	}
	plain, direct := toN2(false), toN2(true)
	t.Logf("sent on to n2: %d of %d plain calls, %d of %d scheduler-direct ones", plain, calls, direct, calls)
	if plain > 78 {
		t.Errorf("%d of %d plain calls sent on to n2, want about 60: schedule_rate weighed a call that is not scheduler-direct", plain, calls)
	}
	if direct < 79 {
		t.Errorf("%d of %d scheduler-direct calls sent on to n2, want about 89 (schedule_rate 100)", direct, calls)
	}
}
