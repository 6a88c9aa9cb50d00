package wlmnode

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/bpf"
	"tpsched/netio"
	"tpsched/scd/call"
	"tpsched/scd/def"
	"tpsched/scd/loadlevel"
	"tpsched/scd/names"
	"tpsched/scd/peers"
	"tpsched/scd/wlm"
)

// These tests run the routing manager of a node alone against fakes of
// its neighbours: fakeGroup stands for a group of the local scheduler (its
// server starts when asked, or never, as the test says, and honours ctx as
// the Group contract asks), fakeLocal for the scheduler (Serve answers the
// call with its payload), fakePeers for the peer pool (no other node).

const testWait = 10 * time.Second

type fakeGroup struct {
	def     def.Server
	serving atomic.Bool
	held    bool
	// never: StartServer waits for ctx (a server whose processes never
	// attach); else it starts at once.
	never   bool
	started atomic.Int32
	stopped atomic.Int32
	classes atomic.Pointer[wlm.Classes]
	// servingGate, when set, runs at each Serving: a test's way to hold
	// the callers of Serving until several are in it at once.
	servingGate atomic.Pointer[func()]
	// afterServing, when set, runs at each Serving after the answer was
	// read: a test's way to act between a count of servers and its use.
	afterServing atomic.Pointer[func()]
}

func (g *fakeGroup) Name() string     { return g.def.ServiceGroup }
func (g *fakeGroup) Def() *def.Server { return &g.def }
func (g *fakeGroup) Held() bool       { return g.held }
func (g *fakeGroup) Serving() bool {
	if f := g.servingGate.Load(); f != nil {
		(*f)()
	}
	on := g.serving.Load()
	if f := g.afterServing.Load(); f != nil {
		(*f)()
	}
	return on
}
func (g *fakeGroup) Level() loadlevel.Level    { return loadlevel.Level0 }
func (g *fakeGroup) InFlight() int             { return 0 }
func (g *fakeGroup) Failure() error            { return nil }
func (g *fakeGroup) Usage() bpf.Usage          { return bpf.Usage{} }
func (g *fakeGroup) SetCPUWeight(int) error    { return nil }
func (g *fakeGroup) SetClasses(c *wlm.Classes) { g.classes.Store(c) }
func (g *fakeGroup) SetServing(on bool)        { g.serving.Store(on) }
func (g *fakeGroup) TakeSamples(c *wlm.Classes) []wlm.Sample {
	if g.classes.Load() != c {
		return nil
	}
	return c.Take()
}
func (g *fakeGroup) StartServer(ctx context.Context, deadline time.Time) error {
	g.started.Add(1)
	if g.never {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}
func (g *fakeGroup) StopServer(ctx context.Context, quiesce time.Duration, msg string) error {
	g.stopped.Add(1)
	return nil
}
func (g *fakeGroup) ReplaceProcesses(ctx context.Context, deadline time.Time) (int, error) {
	return 1, nil
}

type fakeLocal struct{ groups []*fakeGroup }

func (l *fakeLocal) Groups() []Group {
	out := make([]Group, len(l.groups))
	for i, g := range l.groups {
		out[i] = g
	}
	return out
}

func (l *fakeLocal) Group(name string) (Group, bool) {
	for _, g := range l.groups {
		if g.Name() == name {
			return g, true
		}
	}
	return nil, false
}

func (l *fakeLocal) Serve(c call.Caller, f *netio.Frame) (netio.Code, string) {
	g, ok := l.Group(string(f.Group))
	if !ok || !g.Serving() {
		return netio.CodeServiceClosed, "no server"
	}
	_ = c.Send(netio.AppendReply(nil, f.ID, f.Payload))
	return netio.CodeOK, ""
}

// fakePeers is the pool of a node alone: nothing can be sent.
type fakePeers struct{}

func (fakePeers) Request(context.Context, string, string, string, string, []byte, time.Time) ([]byte, error) {
	return nil, &netio.Error{Code: netio.CodeNetworkDown, Message: "no other node"}
}
func (fakePeers) Send(string, string, *peers.Call) (netio.Code, string) {
	return netio.CodeNetworkDown, "no other node"
}

// answers keeps every answer frame by id.
type answers struct {
	mu  sync.Mutex
	got map[uint64][]netio.Frame
}

func (a *answers) Send(b []byte) error {
	f, _, err := netio.Decode(b, 1<<20)
	if err != nil {
		return err
	}
	f.Payload = append([]byte(nil), f.Payload...)
	a.mu.Lock()
	a.got[f.ID] = append(a.got[f.ID], f)
	a.mu.Unlock()
	return nil
}

// SendNow is Send: the manager's answers on the event loop.
func (a *answers) SendNow(b []byte) { _ = a.Send(b) }

func (a *answers) wait(t *testing.T, id uint64) netio.Frame {
	t.Helper()
	deadline := time.Now().Add(testWait)
	for time.Now().Before(deadline) {
		a.mu.Lock()
		got := a.got[id]
		a.mu.Unlock()
		if len(got) > 0 {
			time.Sleep(20 * time.Millisecond) // a second answer would come by now
			a.mu.Lock()
			defer a.mu.Unlock()
			if n := len(a.got[id]); n != 1 {
				t.Errorf("call %d answered %d times", id, n)
			}
			return got[0]
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("call %d got no answer", id)
	return netio.Frame{}
}

const ordersPolicy = "set policy_interval = 1\nset default_class = BATCH\nclass -n ONLINE -i 1 -t 100 -p 90\n" +
	"class -n BATCH -i 3 -t 5000\nclassify -g orders -c ONLINE\nenvironment -g orders\n"

// testManager is the manager of node "n0" alone, with group orders (an
// application environment, no server yet) and front (a server from the
// start).
func testManager(t *testing.T, orders *fakeGroup) (*Manager, *fakeLocal) {
	t.Helper()
	return testManagerLog(t, orders, slog.New(slog.DiscardHandler))
}

// testManagerLog is testManager with log as the manager's log.
func testManagerLog(t *testing.T, orders *fakeGroup, log *slog.Logger) (*Manager, *fakeLocal) {
	t.Helper()
	return testManagerWith(t, orders, log, func(*Options) {})
}

// testManagerWith is testManagerLog with the options changed by opt.
func testManagerWith(t *testing.T, orders *fakeGroup, log *slog.Logger, opt func(*Options)) (*Manager, *fakeLocal) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "svcpolicy"), []byte(ordersPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := def.LoadPolicy(dir)
	if err != nil {
		t.Fatal(err)
	}
	front := &fakeGroup{def: def.Server{Name: "front", ServiceGroup: "front", Services: []def.Service{{Name: "echo", Entry: "echo"}}}}
	front.serving.Store(true)
	orders.def = def.Server{Name: "orders", ServiceGroup: "orders", Services: []def.Service{{Name: "echo", Entry: "echo"}}, SchedulePriority: 8}
	local := &fakeLocal{groups: []*fakeGroup{front, orders}}
	set := metrics.NewSet()
	o := Options{
		Self: "n0", Dir: dir, Policy: p, Log: log, Metrics: set,
		BadRequests: set.NewCounter("bad"), Local: local, Peers: fakePeers{},
		Names: names.NewTable("n0"), Alone: true,
		Addr: func() string { return "127.0.0.1:1" }, Announce: func() {}, MeasuresWaits: func() bool { return false },
		ProcStat: filepath.Join(dir, "stat"), // none: spare CPU is not measured
	}
	opt(&o)
	w, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	w.Start()
	return w, local
}

func callFrame(id uint64, group string) *netio.Frame {
	return &netio.Frame{Header: netio.Header{Kind: netio.KindCall, ID: id, TimeoutMs: 20_000}, Group: []byte(group),
		Service: []byte("echo"), Payload: []byte("x")}
}

// managerGoroutines are the goroutines running the package's code.
func managerGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "tpsched/scd/wlmnode.") && !strings.Contains(g, "_test.go") {
			n++
		}
	}
	return n
}

// TestParkedCallServedWhenItsServerStarts: a call for an environment no
// node serves is parked (taken, no answer yet); the manager starts the
// server here, and the call is served by it, once.
func TestParkedCallServedWhenItsServerStarts(t *testing.T) {
	orders := &fakeGroup{}
	w, _ := testManager(t, orders)
	defer w.Close()
	a := &answers{got: map[uint64][]netio.Frame{}}
	if handled, code, msg := w.Route(a, call.From{}, callFrame(1, "orders")); !handled || code != netio.CodeOK {
		t.Fatalf("Route: %v %v %s, want the call parked", handled, code, msg)
	}
	if handled, _, _ := w.Route(a, call.From{}, callFrame(2, "front")); handled {
		t.Error("a call for a group with a server here was taken by the manager")
	}
	if f := a.wait(t, 1); f.Kind != netio.KindReply || string(f.Payload) != "x" {
		t.Errorf("the parked call: %v %v %q, want served", f.Kind, f.Code, f.Payload)
	}
	if n := orders.started.Load(); n != 1 || !orders.Serving() {
		t.Errorf("server started %d times, serving %v; want once, serving", n, orders.Serving())
	}
}

// TestCloseEndsWaitsAndAnswersParkedCalls: a call waits for a server whose
// processes never attach; Close ends the start (its ctx), answers the call
// 'node shutting down' and returns with no goroutine of the manager left.
func TestCloseEndsWaitsAndAnswersParkedCalls(t *testing.T) {
	orders := &fakeGroup{never: true}
	w, _ := testManager(t, orders)
	a := &answers{got: map[uint64][]netio.Frame{}}
	if handled, code, _ := w.Route(a, call.From{}, callFrame(1, "orders")); !handled || code != netio.CodeOK {
		t.Fatalf("Route: %v %v", handled, code)
	}
	deadline := time.Now().Add(testWait)
	for orders.started.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	closed := make(chan struct{})
	go func() { w.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(testWait):
		t.Fatal("Close did not return: a wait of the manager ignores its end")
	}
	if f := a.wait(t, 1); f.Kind != netio.KindError || f.Code != netio.CodeShuttingDown {
		t.Errorf("the parked call: %v %v %q, want 'node shutting down'", f.Kind, f.Code, f.Payload)
	}
	if n := managerGoroutines(); n != 0 {
		t.Errorf("%d goroutines of the manager after Close", n)
	}
	if handled, code, _ := w.Route(a, call.From{}, callFrame(2, "orders")); !handled || code != netio.CodeShuttingDown {
		t.Errorf("a call after Close: %v %v, want refused 'node shutting down'", handled, code)
	}
}

// TestFindAndRequestAfterCloseAreAnswered: AnswerFind and ServeRequest
// check that the manager is not closed, then start a goroutine that
// answers; when Close begins in between, goTracked starts nothing and the
// find or the other node's request must still be answered 'node shutting
// down'. The test calls what follows the check after Close, as that race
// would. They used to get no answer at all.
func TestFindAndRequestAfterCloseAreAnswered(t *testing.T) {
	orders := &fakeGroup{never: true}
	w, _ := testManager(t, orders)
	w.Close()
	a := &answers{got: map[uint64][]netio.Frame{}}
	t.Run("find", func(t *testing.T) {
		w.envs.answerFind(a, &netio.Frame{Header: netio.Header{Kind: netio.KindNameLookup, ID: 1, TimeoutMs: 20_000},
			Group: []byte("orders"), Service: []byte(netio.LookupFind)})
		if f := a.wait(t, 1); f.Kind != netio.KindError || f.Code != netio.CodeShuttingDown {
			t.Errorf("the find: %v %v %q, want 'node shutting down'", f.Kind, f.Code, f.Payload)
		}
		if n := w.envs.waiters.Load(); n != 0 {
			t.Errorf("%d find waiters counted after the answer, want 0", n)
		}
		w.envs.mu.Lock()
		finds := len(w.envs.finds)
		w.envs.mu.Unlock()
		if finds != 0 {
			t.Errorf("%d finds kept after Close, which no goroutine will end; want none", finds)
		}
	})
	t.Run("request", func(t *testing.T) {
		w.envs.serveRequest(a, &netio.Frame{Header: netio.Header{Kind: netio.KindNameLookup, ID: 2, TimeoutMs: 20_000},
			Service: []byte(wlmMeasure)})
		if f := a.wait(t, 2); f.Kind != netio.KindError || f.Code != netio.CodeShuttingDown {
			t.Errorf("the request: %v %v %q, want 'node shutting down'", f.Kind, f.Code, f.Payload)
		}
	})
}

// TestStartCutByCloseIsShuttingDown: a start of the server here that the
// manager's Close cut short answers 'node shutting down', not 'server
// terminated' with the context's error: the server did not fail. Close
// answers the parked calls itself too, and which of the two answered them
// was a race (TestCloseEndsWaitsAndAnswersParkedCalls failed once in make
// test on 2026-12-05 with the start's answer).
func TestStartCutByCloseIsShuttingDown(t *testing.T) {
	orders := &fakeGroup{never: true}
	w, _ := testManager(t, orders)
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := w.envs.activate(ctx, "orders", time.Now().Add(testWait))
	var ne *netio.Error
	if !errors.As(err, &ne) || ne.Code != netio.CodeShuttingDown {
		t.Errorf("a start cut short by the manager's end: %v, want 'node shutting down'", err)
	}
	if n := orders.started.Load(); n != 1 {
		t.Errorf("the server was started %d times, want 1", n)
	}
}

// TestQuiesceStopsTheServerHere: quiesce stops this node's server of the
// environment (it takes no call from then on) and no server starts for it
// until resume.
func TestQuiesceStopsTheServerHere(t *testing.T) {
	orders := &fakeGroup{}
	w, _ := testManager(t, orders)
	defer w.Close()
	a := &answers{got: map[uint64][]netio.Frame{}}
	w.Route(a, call.From{}, callFrame(1, "orders"))
	a.wait(t, 1)
	res, err := w.Quiesce("orders")
	if err != nil || len(res.Nodes) != 1 || res.Nodes[0].Error != "" {
		t.Fatalf("quiesce: %+v, %v", res, err)
	}
	if orders.Serving() || orders.stopped.Load() != 1 {
		t.Errorf("after quiesce: serving %v, stopped %d times; want stopped once", orders.Serving(), orders.stopped.Load())
	}
	handled, code, _ := w.Route(a, call.From{}, callFrame(2, "orders"))
	if handled && code == netio.CodeOK {
		a.wait(t, 2)
	}
	a.mu.Lock()
	if got := a.got[2]; handled && code == netio.CodeOK && (len(got) != 1 || got[0].Code != netio.CodeServiceClosed) {
		t.Errorf("a call after quiesce: %+v, want 'service closed'", got)
	}
	a.mu.Unlock()
	if n := orders.started.Load(); n != 1 {
		t.Errorf("server started %d times after quiesce, want no new start", n)
	}
	if _, err := w.Quiesce("nope"); err == nil {
		t.Error("quiesce of a group that is no environment succeeded")
	}
}

// TestGrowSaysWhyNoServerStarts (issue 30 item 4): a missed goal asks for
// one more server elsewhere; when no node has the spare CPU a new server
// needs (or every node serves the environment already), the report and
// the log say so, with each node's figure, instead of only repeating the
// ask.
func TestGrowSaysWhyNoServerStarts(t *testing.T) {
	orders := &fakeGroup{}
	w, _ := testManager(t, orders)
	defer w.Close()
	grow := func() *GrowReport {
		t.Helper()
		w.mu.Lock()
		w.lastGrow = GrowReport{}
		w.mu.Unlock()
		w.envs.mu.Lock()
		clear(w.envs.growAsked)
		clear(w.envs.dec.lastGrow)
		w.envs.mu.Unlock()
		w.envs.dec.grow("orders")
		deadline := time.Now().Add(testWait)
		for time.Now().Before(deadline) {
			if g := w.Report().Grow; g != nil {
				return g
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatal("no outcome of the ask for one more server in the report")
		return nil
	}
	// No spare CPU measured here (no /proc/stat of its own): 0.00.
	g := grow()
	if g.Env != "orders" || g.Decider != "n0" || !strings.Contains(g.Result, "a node needs 0.10 spare CPU at importance 1") ||
		!strings.Contains(g.Result, "n0 0.00") {
		t.Errorf("grow with no spare CPU: %+v", g)
	}
	if orders.started.Load() != 0 {
		t.Errorf("a server started without spare CPU")
	}
	// Serving here already, the only node: none can get a second.
	orders.serving.Store(true)
	if g := grow(); !strings.Contains(g.Result, "n0 serves it") {
		t.Errorf("grow where the only node serves it: %+v", g)
	}
}

// TestConcurrentFirstFindsPlaceOnce: two finds for an environment no node
// serves, made at once (two nodes' first calls through wlm-decide, a find
// and a replenish), place one server between them. A decide that looked
// at the servers while the other did too claimed the start after it
// without looking again, and both placed one (on several nodes, measured
// apart, two servers). Here both are held in the look (the local group's
// Serving) until both are in it; each placement leaves a hint.
func TestConcurrentFirstFindsPlaceOnce(t *testing.T) {
	orders := &fakeGroup{}
	w, _ := testManager(t, orders)
	defer w.Close()
	var in atomic.Int32
	both := make(chan struct{})
	gate := func() {
		if in.Add(1) == 2 {
			close(both)
		}
		select {
		case <-both:
		case <-time.After(2 * time.Second): // a caller of Serving other than the two
		}
	}
	orders.servingGate.Store(&gate)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), testWait)
			defer cancel()
			if _, err := w.envs.dec.decide(ctx, "orders", purposeFirst, time.Now().Add(testWait)); err != nil {
				t.Errorf("decide: %v", err)
			}
		})
	}
	wg.Wait()
	w.envs.mu.Lock()
	placed := len(w.envs.dec.hints["orders"])
	w.envs.mu.Unlock()
	if placed != 1 {
		t.Fatalf("%d servers placed for two finds at once, want 1", placed)
	}
}

// TestParkedCallPastItsDeadlineIsNotServed: a parked call whose deadline
// passed before expire came to it is answered 'timed out' when its find
// ends, not served (it would run after its caller was told 'timed out');
// one still in time is served.
func TestParkedCallPastItsDeadlineIsNotServed(t *testing.T) {
	orders := &fakeGroup{}
	w, _ := testManager(t, orders)
	defer w.Close()
	orders.serving.Store(true)
	a := &answers{got: map[uint64][]netio.Frame{}}
	start := time.Now().Add(-time.Second)
	late := &peers.Call{Caller: a, CallerID: 1, Kind: netio.KindCall, Group: "orders", Service: "echo", Payload: []byte("x"),
		TimeoutMs: 500, Start: start, Deadline: start.Add(500 * time.Millisecond)}
	inTime := &peers.Call{Caller: a, CallerID: 2, Kind: netio.KindCall, Group: "orders", Service: "echo", Payload: []byte("y"),
		TimeoutMs: 20_000, Start: time.Now(), Deadline: time.Now().Add(20 * time.Second)}
	w.envs.park.dispatch([]*peers.Call{late, inTime}, &flight{servers: []serverAt{{node: "n0"}}})
	if f := a.wait(t, 1); f.Kind != netio.KindError || f.Code != netio.CodeTimedOut {
		t.Errorf("a parked call past its deadline: %v %v %q, want 'timed out'", f.Kind, f.Code, f.Payload)
	}
	if f := a.wait(t, 2); f.Kind != netio.KindReply {
		t.Errorf("a parked call in time: %v %v %q, want served", f.Kind, f.Code, f.Payload)
	}
}

// TestServersCountedAcrossAPolicyDropAreNotKept: a count of servers taken
// under the policy that still named the environment, kept after a reload
// dropped it (and resumed it from none), raised the new epoch's
// high-water mark; named again, the environment had a server started for
// a mark the dropped policy left (make check saw it once in
// TestWLMPolicyDropQuiesces).
func TestServersCountedAcrossAPolicyDropAreNotKept(t *testing.T) {
	orders := &fakeGroup{}
	w, _ := testManager(t, orders)
	defer w.Close()
	a := &answers{got: map[uint64][]netio.Frame{}}
	w.Route(a, call.From{}, callFrame(1, "orders"))
	a.wait(t, 1)
	m := w.envs
	before := m.state("orders")
	if before.HWM != 1 {
		t.Fatalf("after the first call: %+v, want high-water mark 1", before)
	}
	svcpolicy := filepath.Join(w.opts.Dir, "svcpolicy")
	if err := os.WriteFile(svcpolicy, []byte(strings.Replace(ordersPolicy, "environment -g orders\n", "", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	var dropped atomic.Bool
	drop := func() {
		if !strings.Contains(string(debug.Stack()), "(*envs).observe") {
			return
		}
		once.Do(func() {
			if out, err := w.reloadLocal(); err != nil {
				t.Errorf("policy without orders: %s, %v", out, err)
			}
			dropped.Store(true)
		})
	}
	orders.afterServing.Store(&drop)
	m.observe() // the interval's observe may have taken the drop first
	orders.afterServing.Store(nil)
	if !dropped.Load() {
		t.Fatal("the policy was not dropped while servers were counted")
	}
	after := m.state("orders")
	if after.Epoch <= before.Epoch || after.HWM != 0 || after.Quiesced {
		t.Errorf("dropped while its servers were counted: %+v (was %+v), want a new epoch from none", after, before)
	}
	if err := os.WriteFile(svcpolicy, []byte(ordersPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := w.reloadLocal(); err != nil {
		t.Fatalf("policy naming orders again: %s, %v", out, err)
	}
	m.interval() // would start a server for a high-water mark left behind
	if st := m.state("orders"); st.HWM != 0 || orders.started.Load() != 1 {
		t.Errorf("named again: %+v, server started %d times; want high-water mark 0 and no new start", st, orders.started.Load())
	}
}

// TestPeerRequestForAPlainGroupStopsNothing: another node's quiesce,
// resume or refresh names a group that is no application environment of
// this node's policy (a peer that lies, or one whose policy was read again
// before this node's): the request is refused, and this node's plain
// server of the group keeps serving. quiesceLocal stopped it, and nothing
// would start it again (only an environment's server starts on demand).
func TestPeerRequestForAPlainGroupStopsNothing(t *testing.T) {
	orders := &fakeGroup{}
	w, local := testManager(t, orders)
	defer w.Close()
	front := local.groups[0]
	ctx := context.Background()
	for _, service := range []string{wlmQuiesce, wlmResume, wlmRefresh} {
		_, err := w.envs.handle(ctx, service, "front", binary.AppendUvarint(nil, 1), time.Now().Add(testWait))
		var ne *netio.Error
		if !errors.As(err, &ne) || ne.Code != netio.CodeNoSuchGroup {
			t.Errorf("%s of a plain group: %v, want refused 'no such service group'", service, err)
		}
	}
	if !front.Serving() || front.stopped.Load() != 0 {
		t.Errorf("after a peer's quiesce of plain group front: serving %v, stopped %d times; want serving, never stopped",
			front.Serving(), front.stopped.Load())
	}
	if st := w.envs.state("front"); st != (wlm.EnvState{}) {
		t.Errorf("state of plain group front after the requests: %+v, want none", st)
	}
}

// TestAnnouncedEnvironmentsOutsideThePolicyAreNotKept: a peer announces
// application environments this node's policy does not name, different
// ones in each announce (a peer may send any names): observe kept a state
// for every name it ever saw, and each held on to the announce it came in,
// so the node's memory grew for as long as the peer announced.
func TestAnnouncedEnvironmentsOutsideThePolicyAreNotKept(t *testing.T) {
	orders := &fakeGroup{}
	w, _ := testManager(t, orders)
	defer w.Close()
	for seq := range 20 {
		info := names.NodeInfo{Node: "evil", Addr: "127.0.0.1:2", Boot: 1, Seq: uint64(seq + 1), WLM: &names.WLMInfo{}}
		for i := range 100 {
			info.WLM.Envs = append(info.WLM.Envs, names.EnvInfo{Env: fmt.Sprintf("junk%04d-%04d", seq, i), Epoch: 1, HWM: 1})
		}
		if _, err := w.opts.Names.Apply(info); err != nil {
			t.Fatal(err)
		}
		w.envs.observe()
	}
	w.envs.mu.Lock()
	n := len(w.envs.states)
	w.envs.mu.Unlock()
	if n > len(w.policy.Load().p.Environments) {
		t.Errorf("%d environment states kept after 2,000 names a peer announced; want at most the policy's %d",
			n, len(w.policy.Load().p.Environments))
	}
}

// TestPeerRequestsInProgressAreBounded: another node's requests each wait
// on a goroutine of their own (a start in progress, a quiesce's calls) for
// up to a minute; a peer that sends them without end (it may) made one
// goroutine for each, without bound. Past maxRequests in progress a
// request is answered 'server busy' at once, as finds past
// maxFindWaiters are; every one is answered once.
func TestPeerRequestsInProgressAreBounded(t *testing.T) {
	orders := &fakeGroup{never: true} // the start never ends: every wlm-start waits
	w, _ := testManager(t, orders)
	a := &answers{got: map[uint64][]netio.Frame{}}
	const extra = 10
	for id := range uint64(maxRequests + extra) {
		w.envs.serveRequest(a, &netio.Frame{Header: netio.Header{Kind: netio.KindNameLookup, ID: id + 1, TimeoutMs: 20_000},
			Group: []byte("orders"), Service: []byte(wlmStart)})
	}
	busy := func() int {
		a.mu.Lock()
		defer a.mu.Unlock()
		n := 0
		for _, got := range a.got {
			for _, f := range got {
				if f.Code == netio.CodeServerBusy {
					n++
				}
			}
		}
		return n
	}
	if n := busy(); n != extra {
		t.Errorf("%d of %d requests answered 'server busy' at once, want the %d past %d in progress", n, maxRequests+extra, extra, maxRequests)
	}
	w.Close()
	for id := range uint64(maxRequests + extra) {
		a.mu.Lock()
		n := len(a.got[id+1])
		a.mu.Unlock()
		if n != 1 {
			t.Fatalf("request %d answered %d times after Close, want once", id+1, n)
		}
	}
}

// TestFirstFindAfterAFailedGrowGetsTheServers: a find (purpose first)
// reaches the decider while it places one more server for a missed goal,
// and waits for that placement. The placement fails (no node has the spare
// CPU), but the environment has servers: the find is answered them, not
// the grow's 'no server started' ('server busy'), which failed the calls
// parked for it though a server was there.
func TestFirstFindAfterAFailedGrowGetsTheServers(t *testing.T) {
	orders := &fakeGroup{}
	w, _ := testManager(t, orders)
	defer w.Close()
	d := w.envs.dec
	// A grow's placement that has just failed, its claim still held: the
	// find finds the claim and waits for it (done already).
	fl := &flight{done: make(chan struct{}), servers: []serverAt{{node: "n1", addr: "127.0.0.1:2"}},
		err: &netio.Error{Code: netio.CodeServerBusy, Message: "no server of orders started: a node needs 0.10 spare CPU"}}
	close(fl.done)
	w.envs.mu.Lock()
	d.decides["orders"] = fl
	w.envs.mu.Unlock()
	defer func() {
		w.envs.mu.Lock()
		delete(d.decides, "orders")
		w.envs.mu.Unlock()
	}()
	type result struct {
		s   []serverAt
		err error
	}
	got := make(chan result, 1)
	go func() {
		s, err := d.decide(context.Background(), "orders", purposeFirst, time.Now().Add(testWait))
		got <- result{s, err}
	}()
	select {
	case r := <-got:
		if r.err != nil || len(r.s) != 1 || r.s[0].node != "n1" {
			t.Errorf("a first find after a failed grow: %v, %v; want the server on n1", r.s, r.err)
		}
	case <-time.After(testWait):
		t.Fatal("the find did not end")
	}
}

// TestMeasureNowIsBoundedByItsContext: a placement asks this node to
// measure at once (freshen, within measureTimeout) while another
// measurement holds the measuring lock and its log line waits for its
// output (a stderr not read). The ask ends at its context's deadline.
// Before, measureNow took measureMu whatever its context said, and the
// first measurement wrote its log line with measureMu held: the ask
// waited for that log write, past its deadline.
func TestMeasureNowIsBoundedByItsContext(t *testing.T) {
	release := make(chan struct{})
	h := &blockingHandler{release: release, match: "at once"}
	w, _ := testManagerLog(t, &fakeGroup{}, slog.New(h))
	defer w.Close()
	first := make(chan error, 1)
	go func() { first <- w.measureNow(context.Background()) }()
	deadline := time.Now().Add(testWait)
	for !h.blocked.Load() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if !h.blocked.Load() {
		t.Fatal("the first measurement logged nothing")
	}
	stuck := time.AfterFunc(3*time.Second, func() { close(release) }) // the log's output drains, at last
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	start := time.Now()
	_ = w.measureNow(ctx)
	took := time.Since(start)
	cancel()
	if stuck.Stop() {
		close(release)
	}
	if err := <-first; err != nil {
		t.Errorf("the first measurement: %v", err)
	}
	if took > time.Second {
		t.Errorf("a measurement asked for within 200 ms took %v while another's log line waited", took)
	}
}

// blockingHandler holds the first log line whose message contains match
// until release is closed.
type blockingHandler struct {
	release chan struct{}
	match   string
	blocked atomic.Bool
}

func (h *blockingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *blockingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *blockingHandler) WithGroup(string) slog.Handler            { return h }
func (h *blockingHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.match) && h.blocked.CompareAndSwap(false, true) {
		<-h.release
	}
	return nil
}

// heldAtAnswer is a caller that, at each answer sent to it, checks that
// the routing manager still counts every call of its own not yet
// answered, the one being answered included: a drain that polls
// Manager.Parked must not see them gone before their answers are sent.
type heldAtAnswer struct {
	t        *testing.T
	w        *Manager
	mu       sync.Mutex
	owed     int
	answered map[uint64]netio.Code
}

func (h *heldAtAnswer) Send(b []byte) error {
	f, _, err := netio.Decode(b, 1<<20)
	if err != nil {
		return err
	}
	held := h.w.Parked()
	h.mu.Lock()
	defer h.mu.Unlock()
	if held < h.owed {
		h.t.Errorf("call %d answered %v with %d calls held, %d owed: a drain would see them gone", f.ID, f.Code, held, h.owed)
	}
	h.owed--
	h.answered[f.ID] = f.Code
	return nil
}

func (h *heldAtAnswer) park(env string, calls ...*peers.Call) {
	p := h.w.envs.park
	p.m.mu.Lock()
	p.parked[env] = append(p.parked[env], calls...)
	p.m.mu.Unlock()
	h.mu.Lock()
	h.owed += len(calls)
	h.mu.Unlock()
}

// TestAParkedCallIsHeldUntilItsAnswerIsSent: the parked calls answered at
// their deadline, for a quiesce and at the close are taken off parked
// under the manager's lock and answered after it; until each answer is
// sent the manager must still count the call, as it does for the calls a
// find hands on, or a drain could stop the port in between and the answer
// would meet a closed connection.
func TestAParkedCallIsHeldUntilItsAnswerIsSent(t *testing.T) {
	orders := &fakeGroup{never: true}
	w, _ := testManager(t, orders)
	h := &heldAtAnswer{t: t, w: w, answered: map[uint64]netio.Code{}}
	parked := func(id uint64, deadline time.Time) *peers.Call {
		return &peers.Call{Caller: h, CallerID: id, Kind: netio.KindCall, Group: "orders", Service: "echo",
			Payload: []byte("x"), TimeoutMs: 500, Start: time.Now(), Deadline: deadline}
	}
	past, later := time.Now().Add(-time.Second), time.Now().Add(time.Hour)

	h.park("orders", parked(1, past), parked(2, past), parked(3, later))
	w.envs.park.expire(time.Now())
	h.park("orders", parked(4, later))
	w.envs.park.answerAll("orders", netio.CodeServiceClosed, "quiesced")
	h.park("orders", parked(5, later), parked(6, later))
	h.park("other", parked(7, later))
	w.Close()

	want := map[uint64]netio.Code{1: netio.CodeTimedOut, 2: netio.CodeTimedOut, 3: netio.CodeServiceClosed,
		4: netio.CodeServiceClosed, 5: netio.CodeShuttingDown, 6: netio.CodeShuttingDown, 7: netio.CodeShuttingDown}
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, code := range want {
		if got, ok := h.answered[id]; !ok || got != code {
			t.Errorf("call %d: answered %v (%v), want %v", id, got, ok, code)
		}
	}
	if n := w.Parked(); n != 0 || h.owed != 0 {
		t.Errorf("after the answers: %d calls held, %d owed; want none", n, h.owed)
	}
}

// TestNothingIsDecidedBeforeTheTableSettles: a node in a cluster serves
// before it has learned the cluster's name table (a restart's new process),
// and the table then lists no node, this one neither. A call for an
// environment waits (parked, no server started) and another node's decide
// request is answered so that it asks again ('timed out'), where both
// were answered 'no such service group' ("none defines it") for an
// environment the nodes define. Once the table settled, the find goes on
// with what it says.
func TestNothingIsDecidedBeforeTheTableSettles(t *testing.T) {
	settled := make(chan struct{})
	orders := &fakeGroup{}
	w, _ := testManagerWith(t, orders, slog.New(slog.DiscardHandler), func(o *Options) {
		o.Alone, o.Settled = false, settled
	})
	defer w.Close()
	a := &answers{got: map[uint64][]netio.Frame{}}
	if handled, code, msg := w.Route(a, call.From{}, callFrame(1, "orders")); !handled || code != netio.CodeOK {
		t.Fatalf("Route: %v %v %s, want the call parked", handled, code, msg)
	}
	_, err := w.envs.handle(context.Background(), wlmDecide, "orders", []byte{purposeFirst}, time.Now().Add(time.Second))
	var ne *netio.Error
	if !errors.As(err, &ne) || ne.Code != netio.CodeTimedOut || !retryable(err) {
		t.Errorf("a decide request before the table settled: %v; want 'timed out', asked again", err)
	}
	time.Sleep(300 * time.Millisecond)
	a.mu.Lock()
	early := len(a.got[1])
	a.mu.Unlock()
	if early != 0 || orders.started.Load() != 0 {
		t.Fatalf("before the table settled: %d answers to the call, %d servers started; want none", early, orders.started.Load())
	}
	close(settled)
	if f := a.wait(t, 1); f.Kind != netio.KindError || f.Code != netio.CodeNoSuchGroup {
		t.Errorf("the call once the table settled without any node: %v %v %q; want what that table says", f.Kind, f.Code, f.Payload)
	}
}

// TestACallForAnEnvironmentDefinedElsewhereWaitsForTheTable: a node that
// does not define an environment (the cluster torture's entry node) gets
// a call for it before it has learned the cluster's name table (a
// restart's new process): the call waits for the table, then the find
// says what the table says. Passed on at once, it met no server in the
// router (the environment was dormant everywhere) and the node's
// scheduler answered 'no such service group' with the group's bare name,
// while the nodes that define it were in the cluster (found by the
// torture's "envs"). Once settled, a call for an environment no node
// defines goes the usual way.
func TestACallForAnEnvironmentDefinedElsewhereWaitsForTheTable(t *testing.T) {
	settled := make(chan struct{})
	w, _ := testManagerWith(t, &fakeGroup{}, slog.New(slog.DiscardHandler), func(o *Options) {
		o.Alone, o.Settled = false, settled
		o.Local = &fakeLocal{} // no group here: orders is the other nodes'
	})
	defer w.Close()
	a := &answers{got: map[uint64][]netio.Frame{}}
	if handled, code, msg := w.Route(a, call.From{}, callFrame(1, "orders")); !handled || code != netio.CodeOK {
		t.Fatalf("Route before the table settled: %v %v %s, want the call parked", handled, code, msg)
	}
	close(settled)
	if f := a.wait(t, 1); f.Kind != netio.KindError || f.Code != netio.CodeNoSuchGroup || !strings.Contains(string(f.Payload), "none defines it") {
		t.Errorf("the call once the table settled without any node: %v %v %q; want 'no such service group', none defines it", f.Kind, f.Code, f.Payload)
	}
	if handled, _, _ := w.Route(a, call.From{}, callFrame(2, "orders")); handled {
		t.Error("a call after the table settled, no node defining the environment, was taken, not passed on")
	}
}

// TestHandOverPassesTheServersAndTakesNoMoreStarts: a restart's old
// process names the environments it serves (HandOver) and from then on
// takes no start or decision from another node: wlm-start is refused
// 'node shutting down' (the decider tries another node) and wlm-decide
// 'timed out' (the asker asks again), and no server starts; the new
// process, given the names, starts them (StartHere). Its own calls still
// start one, and a hand-over undone (TakeBack) takes starts again.
func TestHandOverPassesTheServersAndTakesNoMoreStarts(t *testing.T) {
	orders := &fakeGroup{}
	w, _ := testManager(t, orders)
	defer w.Close()
	if got := w.HandOver(); len(got.Serving) != 0 {
		t.Errorf("HandOver with orders dormant: %v, want none serving", got)
	}
	a := &answers{got: map[uint64][]netio.Frame{}}
	for i, req := range []struct {
		service string
		payload []byte
		code    netio.Code
	}{{wlmStart, nil, netio.CodeShuttingDown}, {wlmDecide, []byte{purposeFirst}, netio.CodeTimedOut}} {
		id := uint64(i + 1)
		w.envs.serveRequest(a, &netio.Frame{Header: netio.Header{Kind: netio.KindNameLookup, ID: id, TimeoutMs: 5_000},
			Group: []byte("orders"), Service: []byte(req.service), Payload: req.payload})
		if f := a.wait(t, id); f.Kind != netio.KindError || f.Code != req.code {
			t.Errorf("%s after HandOver: %v %v %q, want %v", req.service, f.Kind, f.Code, f.Payload, req.code)
		}
	}
	if n := orders.started.Load(); n != 0 {
		t.Errorf("orders started %d times after HandOver, want 0", n)
	}
	if handled, code, msg := w.Route(a, call.From{}, callFrame(3, "orders")); !handled || code != netio.CodeOK {
		t.Fatalf("Route after HandOver: %v %v %s, want the call parked", handled, code, msg)
	}
	if f := a.wait(t, 3); f.Kind != netio.KindReply {
		t.Errorf("the old process's own call after HandOver: %v %v %q, want served", f.Kind, f.Code, f.Payload)
	}

	w.TakeBack()
	if err := w.envs.handedOverRefusal(wlmStart); err != nil {
		t.Errorf("after TakeBack: %v, want starts taken", err)
	}
	h := w.HandOver()
	if !slices.Equal(h.Serving, []string{"orders"}) {
		t.Errorf("HandOver with orders serving: %v, want [orders]", h.Serving)
	}

	// The new process's manager, given the names (and one the policy
	// does not name).
	next := &fakeGroup{}
	w2, _ := testManager(t, next)
	defer w2.Close()
	h.Serving = append(h.Serving, "gone")
	w2.StartHere(context.Background(), h, time.Now().Add(testWait))
	if n := next.started.Load(); n != 1 || w2.EnvironmentState("orders") != envServing {
		t.Errorf("StartHere: orders started %d times, %q here; want once, serving", n, w2.EnvironmentState("orders"))
	}
}

// TestHandOverPassesAQuiesce: a node alone whose environment was quiesced
// is restarted: the new process, which hears of the quiesce from no other
// node, has it from the old one (HandOver's states), and starts no server
// for a call. Before, it started one at the first call.
func TestHandOverPassesAQuiesce(t *testing.T) {
	orders := &fakeGroup{}
	w, _ := testManager(t, orders)
	defer w.Close()
	if _, err := w.Quiesce("orders"); err != nil {
		t.Fatal(err)
	}
	h := w.HandOver()

	next := &fakeGroup{}
	w2, _ := testManager(t, next)
	defer w2.Close()
	w2.StartHere(context.Background(), h, time.Now().Add(testWait))
	err := w2.envs.activate(context.Background(), "orders", time.Now().Add(testWait))
	var ne *netio.Error
	if !errors.As(err, &ne) || ne.Code != netio.CodeServiceClosed || next.started.Load() != 0 {
		t.Errorf("a start in the new process after a quiesce in the old: %v, %d started; want 'service closed', none", err, next.started.Load())
	}
}

// TestStartHereEndsWithItsContext: the new process's starts of the old
// one's servers end when the hand-over is undone (ctx), not at their
// deadline, and leave the environment dormant.
func TestStartHereEndsWithItsContext(t *testing.T) {
	orders := &fakeGroup{never: true} // its processes never attach
	w, _ := testManager(t, orders)
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	w.StartHere(ctx, Handover{Serving: []string{"orders"}}, time.Now().Add(testWait))
	if took := time.Since(start); took > testWait/2 || w.EnvironmentState("orders") != envDormant {
		t.Errorf("StartHere took %v and left orders %q; want it ended with its context, dormant", took, w.EnvironmentState("orders"))
	}
}

// TestAQuiesceLearnedFromAnnouncesStopsTheServerHere: a node whose server
// of an environment runs learns of the environment's quiesce from another
// node's announce, not from the request that stops the servers (it went
// to the process before a restart, which had passed its servers on, or
// this node was cut off when it was sent): the server stops, as the
// request would have stopped it. Before, it served on until the next
// quiesce.
func TestAQuiesceLearnedFromAnnouncesStopsTheServerHere(t *testing.T) {
	orders := &fakeGroup{}
	w, _ := testManager(t, orders)
	defer w.Close()
	if err := w.envs.activate(context.Background(), "orders", time.Now().Add(testWait)); err != nil {
		t.Fatal(err)
	}
	info := names.NodeInfo{Node: "n1", Addr: "127.0.0.1:2", Boot: 1, Seq: 1,
		WLM: &names.WLMInfo{Envs: []names.EnvInfo{{Env: "orders", Epoch: 7, HWM: 1, Quiesced: true}}}}
	if _, err := w.opts.Names.Apply(info); err != nil {
		t.Fatal(err)
	}
	w.envs.observe()
	deadline := time.Now().Add(testWait)
	for w.EnvironmentState("orders") != envDormant && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := w.EnvironmentState("orders"); got != envDormant || orders.stopped.Load() != 1 || orders.Serving() {
		t.Errorf("after a quiesce announced by another node: orders %q here, stopped %d times, serving %v; want dormant, once, not serving",
			got, orders.stopped.Load(), orders.Serving())
	}
}

// TestAQuiesceOvertakenByAResumeStopsNothing: a quiesce request (or one
// learned from announces) whose epoch a resume has passed by the time it
// would stop the server here stops nothing: it would refuse the calls the
// resume let in.
func TestAQuiesceOvertakenByAResumeStopsNothing(t *testing.T) {
	orders := &fakeGroup{}
	w, _ := testManager(t, orders)
	defer w.Close()
	if err := w.envs.activate(context.Background(), "orders", time.Now().Add(testWait)); err != nil {
		t.Fatal(err)
	}
	w.envs.mu.Lock()
	w.envs.states["orders"] = wlm.EnvState{Epoch: 6, HWM: 1} // resumed at 6, after a quiesce at 5
	w.envs.mu.Unlock()
	if err := w.envs.quiesceLocalIf(context.Background(), "orders", "quiesce", 5, true); err != nil {
		t.Fatal(err)
	}
	if n := orders.stopped.Load(); n != 0 || w.EnvironmentState("orders") != envServing {
		t.Errorf("a quiesce at epoch 5 after a resume at 6: stopped %d times, %q here; want serving", n, w.EnvironmentState("orders"))
	}
}
