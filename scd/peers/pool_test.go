package peers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"golang.org/x/sys/unix"

	"tpsched/internal/freeport"
	"tpsched/netio"
	"tpsched/netio/rpcport"
	"tpsched/scd/client"
	"tpsched/scd/def"
)

// These tests run the pool on real sockets in process: a netio server
// stands in for this node's RPC port and hands every call it receives to
// the pool; the other nodes are fakeNodes (a netio server with the node's
// side of the hello), which answer as the test says, so every transferred
// call gets exactly one answer.

const testWait = 10 * time.Second // bound on every wait in these tests

const testKey = "the-right-key-0123456789"

// fakeNode is another node as the pool meets it: an RPC port on loopback
// whose connections open with the peer hello (an Acceptor); each call or
// lookup goes to answer with the node its hop mark proves ("" if none).
type fakeNode struct {
	addr    string
	hello   *Acceptor
	refused *metrics.Counter
	hellos  atomic.Int32 // connections that began a hello
	answer  func(c *rpcport.Conn, f netio.Frame, hop string)
}

// noSuchGroup is a node that runs no group: every call is answered so.
func noSuchGroup(c *rpcport.Conn, f netio.Frame, _ string) {
	if f.Kind != netio.KindCallNoReply {
		c.SendNow(netio.AppendError(nil, f.ID, netio.CodeNoSuchGroup, string(f.Group)))
	}
}

func startFakeNode(t *testing.T, name, key string, answer func(c *rpcport.Conn, f netio.Frame, hop string)) *fakeNode {
	t.Helper()
	var k []byte
	if key != "" {
		k = []byte(key)
	}
	n := &fakeNode{refused: metrics.NewSet().NewCounter("refused"), answer: answer}
	n.hello = NewAcceptor(name, k, n.refused, slog.New(slog.DiscardHandler))
	srv, err := rpcport.Listen(rpcport.Options{Addr: "127.0.0.1:0", MaxPayload: def.MaxMaxMessageSize,
		Logger: slog.New(slog.DiscardHandler)}, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testWait)
		defer cancel()
		_ = srv.Stop(ctx)
	})
	n.addr = srv.Addr()
	return n
}

func (n *fakeNode) OnFrame(c *rpcport.Conn, f netio.Frame) {
	if f.Kind == netio.KindAnnounce {
		if len(f.Payload) > 0 && f.Payload[0] == helloStepHello {
			n.hellos.Add(1)
		}
		n.hello.Accept(c, &f)
		return
	}
	n.answer(c, f, Hop(c, &f))
}

func (n *fakeNode) OnClose(*rpcport.Conn) {}

// transferSide is this node's RPC port in the test: each call's group says
// where it goes (route), and the forwarder takes it there.
type transferSide struct {
	pool  *Pool
	route func(group string) (node, addr string)
}

func (s *transferSide) OnFrame(c *rpcport.Conn, f netio.Frame) {
	if f.Kind != netio.KindCall && f.Kind != netio.KindCallNoReply {
		return
	}
	node, addr := s.route(string(f.Group))
	fc := &Call{Caller: c, CallerID: f.ID, Kind: f.Kind, Group: string(f.Group), Service: string(f.Service),
		Payload: append([]byte(nil), f.Payload...), TimeoutMs: f.TimeoutMs, Start: time.Now(),
		Deadline: time.Now().Add(testWait)}
	if code, msg := s.pool.Send(node, addr, fc); code != netio.CodeOK && f.Kind == netio.KindCall {
		c.SendNow(netio.AppendError(nil, f.ID, code, msg))
	}
}

func (s *transferSide) OnClose(*rpcport.Conn) {}

// startTransferSide starts a pool named self behind a netio server with
// loops event loops; a call that cannot be sent, or is refused, is
// answered so, not retried (the pool's default delegate).
func startTransferSide(t *testing.T, self, key string, loops int, route func(string) (string, string)) (*transferSide, string) {
	t.Helper()
	s := &transferSide{route: route}
	var k []byte
	if key != "" {
		k = []byte(key)
	}
	s.pool = New(Options{Self: self, Key: k, Log: slog.New(slog.DiscardHandler), Metrics: metrics.NewSet()})
	srv, err := rpcport.Listen(rpcport.Options{Addr: "127.0.0.1:0", Loops: loops, Logger: slog.New(slog.DiscardHandler)}, s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testWait)
		defer cancel()
		_ = srv.Stop(ctx)
		s.pool.Close()
	})
	return s, srv.Addr()
}

// TestTransferToReplacedPeerIsAnswered: a node that moves to another
// address gets a new peer, and the old one stops. Calls handed to the old
// peer in the moment it is replaced must still be answered, and those
// already sent on its connection by the node itself: the connection is
// retired, not closed under them. Here every call names the address to
// use, so the peer is replaced on almost every call while calls come in on
// four event loops.
func TestTransferToReplacedPeerIsAnswered(t *testing.T) {
	// More Ps than cores: the OS then preempts a thread anywhere, also
	// between a peer's lookup and the hand-over of a call to it.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(16))
	addrA := startFakeNode(t, "x", "", noSuchGroup).addr
	addrB := startFakeNode(t, "x", "", noSuchGroup).addr
	_, addr := startTransferSide(t, "self", "", 4, func(group string) (string, string) {
		if strings.HasSuffix(group, "a") {
			return "x", addrA
		}
		return "x", addrB
	})
	const callers, calls = 16, 200
	clients := make([]*client.Client, callers)
	for i := range clients {
		c, err := client.New(client.Options{Hosts: []string{addr}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients[i] = c
	}
	var unanswered, answered, refusedBefore atomic.Int64
	// The window is a few instructions wide: several rounds make it show.
	for round := 0; round < 5 && unanswered.Load() == 0; round++ {
		var wg sync.WaitGroup
		for i, c := range clients {
			wg.Go(func() {
				for j := range calls {
					group := "to-a"
					if (i+j)%2 == 1 {
						group = "to-b"
					}
					// Long enough for a busy machine, which held some
					// answers past 2 s: a lost call is never answered,
					// however long it waits.
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					_, err := c.Call(ctx, group, "echo", nil)
					cancel()
					// x answers every call 'no such service group'. 'Network
					// down' would be a call on the connection of a replaced
					// peer, closed under it; a time-out is no answer at all.
					// Send may refuse a call before it goes out when the
					// peer is replaced three times while it tries (here the
					// address changes on almost every call): that one never
					// left the node, and says so.
					code := codeOf(err)
					if code == netio.CodeNetworkDown && strings.Contains(err.Error(), "keeps changing its address") {
						refusedBefore.Add(1)
						continue
					}
					if code != netio.CodeNoSuchGroup {
						unanswered.Add(1)
						t.Errorf("round %d, call %d of caller %d: %v", round, j, i, err)
						return // one is enough; do not wait for each
					}
					answered.Add(1)
				}
			})
		}
		wg.Wait()
	}
	if n := unanswered.Load(); n > 0 {
		t.Errorf("calls transferred while their peer was replaced were not answered by the node (%d answered)", answered.Load())
	}
	t.Logf("%d calls answered by the node, %d refused before they were sent", answered.Load(), refusedBefore.Load())
}

// TestTransferInFlightNeverNegative: the in-flight count of a peer (P2C's
// second key) counts a call from before it is queued until it is answered,
// so it is never below zero, and zero once every call is answered.
func TestTransferInFlightNeverNegative(t *testing.T) {
	// More Ps than cores: the OS then preempts a thread anywhere, also
	// between a call's hand-over and its count, for a whole time slice.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(16))
	addrA := startFakeNode(t, "x", "", noSuchGroup).addr
	s, addr := startTransferSide(t, "self", "", 4, func(string) (string, string) { return "x", addrA })
	stop := make(chan struct{})
	var lowest atomic.Int64
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if v := int64(s.pool.InFlight("x")); v < lowest.Load() {
				lowest.Store(v)
			}
		}
	})
	const callers, calls = 8, 400 // below the peer's queue bound
	clients := make([]*client.Client, callers)
	for i := range clients {
		c, err := client.New(client.Options{Hosts: []string{addr}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients[i] = c
	}
	var wg sync.WaitGroup
	// The window is a few instructions wide: many rounds make it show.
	for round := 0; round < 60 && lowest.Load() >= 0 && !t.Failed(); round++ {
		for _, c := range clients {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), testWait)
				defer cancel()
				for range calls {
					if err := c.CallNoReply(ctx, "g", "log", nil); err != nil {
						t.Errorf("CallNoReply: %v", err)
						return
					}
				}
				// One answered call behind them: every no-reply call before
				// it has been written to the peer.
				if _, err := c.Call(ctx, "g", "echo", nil); codeOf(err) != netio.CodeNoSuchGroup {
					t.Errorf("call after the no-reply calls: %v", err)
				}
			})
		}
		wg.Wait()
	}
	wg.Wait()
	close(stop)
	sampler.Wait()
	if v := lowest.Load(); v < 0 {
		t.Errorf("in-flight count to the peer went down to %d", v)
	}
	if v := s.pool.InFlight("x"); v != 0 {
		t.Errorf("in-flight count %d after every call was answered", v)
	}
}

func codeOf(err error) netio.Code {
	var te *netio.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 255
}

// TestRefusedBeforeRunning: only an answer that proves the call never ran
// on the other node lets it go to a third; every code that a call which
// may have run can get is final (a resent call could run twice).
func TestRefusedBeforeRunning(t *testing.T) {
	resend := map[netio.Code]bool{
		netio.CodeShuttingDown:  true, // the node drains: it took no new call
		netio.CodeServiceClosed: true, // held there: refused at admission
		netio.CodeNoSuchGroup:   true, // the table was stale: nothing ran
		netio.CodeServerBusy:    true, // its queue was full: refused at admission
	}
	for _, code := range netio.Codes() {
		if got := RefusedBeforeRunning(code); got != resend[code] {
			t.Errorf("%v: RefusedBeforeRunning %v, want %v", code, got, resend[code])
		}
	}
}

// slowLookups answers every name lookup "ok" after pause, from a goroutine
// of its own, and every call 'no such service group'.
func slowLookups(pause time.Duration) func(c *rpcport.Conn, f netio.Frame, hop string) {
	return func(c *rpcport.Conn, f netio.Frame, hop string) {
		if f.Kind != netio.KindNameLookup {
			noSuchGroup(c, f, hop)
			return
		}
		id := f.ID
		go func() {
			time.Sleep(pause)
			_ = c.Send(netio.AppendFrame(nil, netio.Header{Kind: netio.KindReply, ID: id}, "", "", []byte("ok "+hop)))
		}()
	}
}

// TestRequestsDialOnceAndKeepTheirConnection: requests and calls sent at
// once to a node no connection leads to yet dial it once, and every
// request gets the node's answer, with the hop mark its hello proved: no
// connection with requests on it is closed under them.
func TestRequestsDialOnceAndKeepTheirConnection(t *testing.T) {
	node := startFakeNode(t, "x", testKey, slowLookups(200*time.Millisecond))
	pool := New(Options{Self: "self", Key: []byte(testKey), Log: slog.New(slog.DiscardHandler), Metrics: metrics.NewSet()})
	t.Cleanup(pool.Close)
	const requests = 16
	var wg sync.WaitGroup
	errs := make(chan error, 2*requests)
	for range requests {
		wg.Go(func() {
			out, err := pool.Request(context.Background(), "x", node.addr, "wlm-policy", "", nil, time.Now().Add(testWait))
			if err == nil && string(out) != "ok self" {
				err = errors.New("answer " + string(out))
			}
			errs <- err
		})
		wg.Go(func() {
			a := &answerRecorder{ch: make(chan []byte, 1)}
			c := &Call{Caller: a, CallerID: 1, Kind: netio.KindCall, Group: "g", Start: time.Now(), Deadline: time.Now().Add(testWait)}
			if code, msg := pool.Send("x", node.addr, c); code != netio.CodeOK {
				errs <- errors.New(msg)
				return
			}
			select {
			case b := <-a.ch:
				if f, _, err := netio.Decode(b, 1<<20); err != nil || f.Code != netio.CodeNoSuchGroup {
					errs <- errors.New("call answered " + f.Code.String())
				}
			case <-time.After(testWait):
				errs <- errors.New("a call got no answer")
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a request or call: %v", err)
		}
	}
	if k := node.hellos.Load(); k != 1 {
		t.Errorf("%d connections dialled to the node, want 1", k)
	}
	if v := pool.TotalInFlight(); v != 0 {
		t.Errorf("%d calls in flight after every answer (requests are not counted)", v)
	}
}

// TestTimeoutAfterAlone: a pool with no peer expires nothing and looks
// every expireIdle (here an hour); the first call to a peer wakes it, so
// that call's timeout is answered on time by a node that never answers.
func TestTimeoutAfterAlone(t *testing.T) {
	old := expireIdle
	expireIdle = time.Hour
	t.Cleanup(func() { expireIdle = old })
	node := startFakeNode(t, "x", testKey, func(*rpcport.Conn, netio.Frame, string) {}) // never answers
	pool := New(Options{Self: "self", Key: []byte(testKey), Log: slog.New(slog.DiscardHandler), Metrics: metrics.NewSet()})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); pool.RunExpiry(stop) }()
	t.Cleanup(func() { close(stop); <-done; pool.Close() })
	time.Sleep(3 * expireEvery) // the loop saw no peer: it waits its hour
	a := &answerRecorder{ch: make(chan []byte, 1)}
	c := &Call{Caller: a, CallerID: 1, Kind: netio.KindCall, Group: "g", Start: time.Now(), Deadline: time.Now().Add(200 * time.Millisecond)}
	if code, msg := pool.Send("x", node.addr, c); code != netio.CodeOK {
		t.Fatalf("send: %v %s", code, msg)
	}
	select {
	case b := <-a.ch:
		if f, _, err := netio.Decode(b, 1<<20); err != nil || f.Code != netio.CodeTimedOut {
			t.Errorf("a call the node never answers: %v %v, want 'timed out'", f.Code, err)
		}
	case <-time.After(testWait):
		t.Fatal("a call the node never answers got no answer")
	}
}

// answerRecorder is a caller that keeps its one answer.
type answerRecorder struct{ ch chan []byte }

func (a *answerRecorder) Send(b []byte) error {
	a.ch <- append([]byte(nil), b...)
	return nil
}

// TestRequestNotReroutedAndAnsweredWhenUnreachable: a request to a node
// that cannot be reached is answered 'network down' and never given to the
// delegate; one the node refuses as a call would be refused before
// running ('node shutting down') is answered with that refusal, not sent
// elsewhere.
func TestRequestNotReroutedAndAnsweredWhenUnreachable(t *testing.T) {
	pool := New(Options{Self: "self", Log: slog.New(slog.DiscardHandler), Metrics: metrics.NewSet()})
	t.Cleanup(pool.Close)
	var rerouted atomic.Int32
	pool.SetDelegate(countingDelegate{&rerouted})
	refusing := startFakeNode(t, "x", "", func(c *rpcport.Conn, f netio.Frame, _ string) {
		c.SendNow(netio.AppendError(nil, f.ID, netio.CodeShuttingDown, "draining"))
	})
	_, err := pool.Request(context.Background(), "x", refusing.addr, "wlm-start", "orders", nil, time.Now().Add(testWait))
	var ne *netio.Error
	if !errors.As(err, &ne) || ne.Code != netio.CodeShuttingDown {
		t.Errorf("a request the node refuses: %v, want its 'node shutting down'", err)
	}
	_, err = pool.Request(context.Background(), "y", "127.0.0.1:1", "wlm-start", "orders", nil, time.Now().Add(testWait))
	if !errors.As(err, &ne) || ne.Code != netio.CodeNetworkDown || !errors.Is(ErrCommunication, ErrCommunication) {
		t.Errorf("a request to a node nobody listens for: %v, want 'network down'", err)
	}
	if k := rerouted.Load(); k != 0 {
		t.Errorf("%d requests given to the delegate to send elsewhere", k)
	}
}

type countingDelegate struct{ n *atomic.Int32 }

func (d countingDelegate) Reroute(c *Call, err error) { d.n.Add(1); c.FailUnsent(err, "") }
func (countingDelegate) MultiSchedule(string) bool    { return false }

// TestNodeLeftKeepsLiveCallsAndDialsAnew (issue 30 item 1): when a node
// leaves the tables while its link still acknowledges (a node leaving on
// purpose, or one a slow detector declared dead), the calls already sent
// to it get the node's own answers, not 'network down'; and the next call
// for the node after it comes back goes on a new connection, never on one
// from before it left.
func TestNodeLeftKeepsLiveCallsAndDialsAnew(t *testing.T) {
	release := make(chan struct{})
	held := make(chan struct{}, 16)
	var node *fakeNode
	node = startFakeNode(t, "x", "", func(c *rpcport.Conn, f netio.Frame, _ string) {
		if string(f.Group) == "hold" {
			held <- struct{}{}
			go func() {
				<-release
				_ = c.Send(netio.AppendError(nil, f.ID, netio.CodeNoSuchGroup, "answered after the leave"))
			}()
			return
		}
		noSuchGroup(c, f, "")
	})
	s, addr := startTransferSide(t, "self", "", 1, func(string) (string, string) { return "x", node.addr })
	c, err := client.New(client.Options{Hosts: []string{addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	const n = 4
	errs := make(chan error, n)
	for range n {
		go func() { _, err := c.Call(ctx, "hold", "s", nil); errs <- err }()
	}
	for range n {
		select {
		case <-held:
		case <-ctx.Done():
			t.Fatal("the held calls did not reach the node")
		}
	}
	if got := node.hellos.Load(); got != 1 {
		t.Fatalf("%d hellos before the leave, want 1", got)
	}
	s.pool.NodeLeft("x")
	close(release)
	for range n {
		if err := <-errs; codeOf(err) != netio.CodeNoSuchGroup || !strings.Contains(err.Error(), "answered after the leave") {
			t.Errorf("a call sent before its node left the tables, over a live link: %v, want the node's own answer", err)
		}
	}
	if _, err := c.Call(ctx, "g", "s", nil); codeOf(err) != netio.CodeNoSuchGroup {
		t.Fatalf("a call after the node came back: %v", err)
	}
	if got := node.hellos.Load(); got != 2 {
		t.Errorf("%d hellos after the node came back, want 2 (a new connection)", got)
	}
	// The left node's peer is forgotten once its connection has closed.
	waitUntil(t, func() bool {
		s.pool.Expire(time.Now())
		s.pool.mu.Lock()
		defer s.pool.mu.Unlock()
		return len(s.pool.gone) == 0
	})
	wantNoneInFlight(t, s.pool, "after every call was answered")
}

// wantNoneInFlight waits up to testWait for the pool to count no call in
// flight: a call is counted off after its answer is passed on (Answer), so
// its caller may read the answer a moment before.
func wantNoneInFlight(t *testing.T, pool *Pool, when string) {
	t.Helper()
	for deadline := time.Now().Add(testWait); pool.TotalInFlight() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("%d calls in flight %v %s", pool.TotalInFlight(), testWait, when)
			return
		}
	}
}

// waitUntil waits up to testWait for cond.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(testWait); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
	}
}

// TestReplacedPeerCallsExpireAndClose: the calls on the connection of a
// peer replaced because its node moved (which retires, not closes) are
// still the pool's: counted in flight, answered 'timed out' at their
// deadline by a node that never answers, and answered when the pool
// closes. The replaced peer was forgotten at once, so its connection was
// in none of the three.
func TestReplacedPeerCallsExpireAndClose(t *testing.T) {
	got := make(chan string, 4)
	mute := func(_ *rpcport.Conn, f netio.Frame, _ string) { got <- string(f.Group) } // never answers
	addrA := startFakeNode(t, "x", testKey, mute).addr
	addrB := startFakeNode(t, "x", testKey, mute).addr
	pool := New(Options{Self: "self", Key: []byte(testKey), Log: slog.New(slog.DiscardHandler), Metrics: metrics.NewSet()})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); pool.RunExpiry(stop) }()
	closed := false
	t.Cleanup(func() {
		close(stop)
		<-done
		if !closed {
			pool.Close()
		}
	})
	send := func(id uint64, addr string, d time.Duration) *answerRecorder {
		t.Helper()
		a := &answerRecorder{ch: make(chan []byte, 1)}
		c := &Call{Caller: a, CallerID: id, Kind: netio.KindCall, Group: fmt.Sprint("g", id), Start: time.Now(), Deadline: time.Now().Add(d)}
		if code, msg := pool.Send("x", addr, c); code != netio.CodeOK {
			t.Fatalf("send: %v %s", code, msg)
		}
		select {
		case <-got:
		case <-time.After(testWait):
			t.Fatalf("call %d did not reach the node", id)
		}
		return a
	}
	answer := func(a *answerRecorder, want netio.Code, within time.Duration) {
		t.Helper()
		select {
		case b := <-a.ch:
			if f, _, err := netio.Decode(b, 1<<20); err != nil || f.Code != want {
				t.Errorf("answer %v %v, want code %v", f.Code, err, want)
			}
		case <-time.After(within):
			t.Errorf("no answer within %v, want code %v", within, want)
		}
	}
	short := send(1, addrA, 300*time.Millisecond)
	long := send(2, addrA, testWait)
	other := send(3, addrB, testWait) // x moved: its peer is replaced
	if n := pool.TotalInFlight(); n != 3 {
		t.Errorf("%d calls in flight, want 3 (two on the replaced peer's connection)", n)
	}
	answer(short, netio.CodeTimedOut, 2*time.Second)
	pool.Close()
	closed = true
	answer(long, netio.CodeNetworkDown, time.Second)
	answer(other, netio.CodeNetworkDown, time.Second)
}

// holdingPeer is a TCP listener that accepts connections and reads
// nothing from them until release (but for those free says of their
// number, from 1, in the order accepted; nil: none); then it relays each
// to target (a fakeNode), or, with no target, holds it without a word.
// Its connections close at the test's end.
type holdingPeer struct {
	addr     string
	released chan struct{}
	once     sync.Once
	closed   chan struct{} // one value per connection the dialer closed before release
	accepted atomic.Int32
}

func startHoldingPeer(t *testing.T, target string, free func(nth int32) bool) *holdingPeer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &holdingPeer{addr: ln.Addr().String(), released: make(chan struct{}), closed: make(chan struct{}, 64)}
	freed := make(chan struct{})
	close(freed)
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		h.release()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			released := h.released
			if n := h.accepted.Add(1); free != nil && free(n) {
				released = freed
			}
			wg.Go(func() {
				// A byte read before release is the dialer's hello, left
				// unanswered; EOF is the dialer giving up.
				buf := make([]byte, 4<<10)
				var early []byte
				for {
					_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
					n, err := c.Read(buf)
					early = append(early, buf[:n]...)
					select {
					case <-released:
					default:
						if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
							h.closed <- struct{}{}
							return
						}
						continue
					}
					break
				}
				_ = c.SetReadDeadline(time.Time{})
				if target == "" {
					_, _ = io.Copy(io.Discard, c)
					return
				}
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				mu.Lock()
				conns = append(conns, up)
				mu.Unlock()
				if _, err := up.Write(early); err != nil {
					return
				}
				wg.Go(func() { _, _ = io.Copy(c, up); c.Close() })
				_, _ = io.Copy(up, c)
				up.Close()
			})
		}
	})
	return h
}

func (h *holdingPeer) release() { h.once.Do(func() { close(h.released) }) }

// answersOf collects what a's caller was sent until the pool has closed
// (its lanes have ended: no answer can come later).
func answersOf(a *answerRecorder) []netio.Frame {
	var out []netio.Frame
	for {
		select {
		case b := <-a.ch:
			f, _, err := netio.Decode(b, 1<<20)
			if err != nil {
				f = netio.Frame{Header: netio.Header{Kind: netio.KindError, Code: 255}}
			}
			out = append(out, f)
		default:
			return out
		}
	}
}

// TestQueuedCallsLeaveAtTheirDeadlineWhileTheLaneDials: a call queued
// while its lane dials a node that takes the connection but does not
// answer the hello is answered 'timed out' at its deadline, not when the
// hello's bound ends the dial, and once; a call still in time when the
// dial succeeds is sent and gets the node's answer, once; the late one
// never reaches the node.
func TestQueuedCallsLeaveAtTheirDeadlineWhileTheLaneDials(t *testing.T) {
	var reached atomic.Int32
	node := startFakeNode(t, "x", "", func(c *rpcport.Conn, f netio.Frame, hop string) {
		reached.Add(1)
		noSuchGroup(c, f, hop)
	})
	for _, succeeds := range []bool{false, true} {
		t.Run(fmt.Sprintf("dial succeeds %v", succeeds), func(t *testing.T) {
			reached.Store(0)
			target := ""
			if succeeds {
				target = node.addr
			}
			peer := startHoldingPeer(t, target, nil)
			pool := New(Options{Self: "self", Log: slog.New(slog.DiscardHandler), Metrics: metrics.NewSet()})
			closed := false
			t.Cleanup(func() {
				if !closed {
					pool.Close()
				}
			})
			send := func(id uint64, d time.Duration) *answerRecorder {
				a := &answerRecorder{ch: make(chan []byte, 4)}
				c := &Call{Caller: a, CallerID: id, Kind: netio.KindCall, Group: "g", Start: time.Now(), Deadline: time.Now().Add(d)}
				if code, msg := pool.Send("x", peer.addr, c); code != netio.CodeOK {
					t.Fatalf("send: %v %s", code, msg)
				}
				return a
			}
			start := time.Now()
			short := send(1, 100*time.Millisecond)
			var long *answerRecorder
			if succeeds {
				long = send(2, testWait)
			}
			select {
			case b := <-short.ch:
				short.ch <- b // answersOf counts it below
				if f, _, err := netio.Decode(b, 1<<20); err != nil || f.Code != netio.CodeTimedOut {
					t.Errorf("a call whose deadline passed while its lane dialled: %v %v, want 'timed out'", f.Code, err)
				}
				if took := time.Since(start); took >= helloTimeout {
					t.Errorf("a call with a 100ms deadline was answered after %v, when the dial ended", took)
				}
			case <-time.After(testWait):
				t.Fatal("a call queued while its lane dialled got no answer")
			}
			select {
			case <-peer.closed:
				t.Fatalf("the dial ended before the short call was answered")
			default:
			}
			if succeeds {
				peer.release()
				select {
				case b := <-long.ch:
					long.ch <- b
				case <-time.After(testWait):
					t.Fatal("a call in time when the dial succeeded got no answer")
				}
			} else {
				select { // the hello's bound ends the dial
				case <-peer.closed:
				case <-time.After(testWait):
					t.Fatal("the dial to a node that never answers its hello did not end")
				}
			}
			pool.Close()
			closed = true
			if got := answersOf(short); len(got) != 1 {
				t.Errorf("the late call got %d answers, want 1: %v", len(got), got)
			}
			if succeeds {
				if got := answersOf(long); len(got) != 1 || got[0].Code != netio.CodeNoSuchGroup {
					t.Errorf("the call in time got %v, want the node's one answer", got)
				}
				if n := reached.Load(); n != 1 {
					t.Errorf("%d calls reached the node, want 1 (the late one must not be sent)", n)
				}
			}
			wantNoneInFlight(t, pool, "after every answer")
		})
	}
}

// deafPeer is a node that completes the peer hello (without a key) on
// every connection and then never reads again, its receive buffer small:
// a node stopped (SIGSTOP) or wedged while its kernel keeps the link
// alive. Its connections close at the test's end, or at closeAll.
type deafPeer struct {
	addr  string
	mu    sync.Mutex
	conns []net.Conn
}

func startDeafPeer(t *testing.T, name string) *deafPeer {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 64<<10) })
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &deafPeer{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	quit := make(chan struct{})
	t.Cleanup(func() { ln.Close(); close(quit); d.closeAll(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			d.mu.Lock()
			d.conns = append(d.conns, c)
			d.mu.Unlock()
			wg.Go(func() {
				fr := netio.NewFrameReader(c, 4<<10)
				if _, _, err := fr.Read(nil); err != nil { // hello
					return
				}
				var nonce [helloNonceSize]byte
				if _, err := c.Write(helloFrame(nil, name, helloStepChallenge, nonce[:])); err != nil {
					return
				}
				if _, _, err := fr.Read(nil); err != nil { // proof
					return
				}
				_, _ = c.Write(helloFrame(nil, "", helloStepWelcome))
				<-quit // and reads nothing more
				c.Close()
			})
		}
	})
	return d
}

func (d *deafPeer) closeAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		c.Close()
	}
}

// TestNodeThatStopsReadingCannotHoldTheLane: a node that completed the
// hello and then reads nothing more gets large calls until the lane's
// write of them stops, and a call queued behind that write waits for it.
// The write is bounded (its calls' deadlines, at least netio's least
// bound), not left to the link's TCP_USER_TIMEOUT (here longer than the
// test, as a node may set to fit a slower failure detector): the
// connection fails and the call behind it is answered 'timed out', once;
// so is every call in the stopped write.
func TestNodeThatStopsReadingCannotHoldTheLane(t *testing.T) {
	peer := startDeafPeer(t, "x")
	pool := New(Options{Self: "self", Log: slog.New(slog.DiscardHandler), Metrics: metrics.NewSet(), UserTimeout: time.Minute})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); pool.RunExpiry(stop) }()
	var closeOnce sync.Once
	closePool := func() {
		closeOnce.Do(func() {
			close(stop)
			<-done
			peer.closeAll() // without the bound, the lane's write ends only so
			pool.Close()
		})
	}
	t.Cleanup(closePool)
	send := func(id uint64, payload []byte, d time.Duration) *answerRecorder {
		a := &answerRecorder{ch: make(chan []byte, 4)}
		c := &Call{Caller: a, CallerID: id, Kind: netio.KindCall, Group: "g", Payload: payload,
			Start: time.Now(), Deadline: time.Now().Add(d)}
		if code, msg := pool.Send("x", peer.addr, c); code != netio.CodeOK {
			t.Fatalf("send: %v %s", code, msg)
		}
		return a
	}
	answer := func(what string, a *answerRecorder) {
		t.Helper()
		select {
		case b := <-a.ch:
			a.ch <- b // answersOf counts it below
			if f, _, err := netio.Decode(b, 1<<20); err != nil || f.Code != netio.CodeTimedOut {
				t.Errorf("%s: %v %v, want 'timed out'", what, f.Code, err)
			}
		case <-time.After(testWait):
			t.Fatalf("%s: no answer within %v", what, testWait)
		}
	}
	const calls = 16 // 16 MiB: far more than the two sockets' buffers hold
	payload := make([]byte, 1<<20)
	recs := make([]*answerRecorder, calls)
	for i := range recs {
		recs[i] = send(uint64(i+1), payload, time.Second)
	}
	// Answered at their deadline (the pool's expiry) once they were put
	// in the write: it cannot end while the node does not read.
	for i, a := range recs {
		answer(fmt.Sprintf("large call %d", i+1), a)
	}
	behind := send(calls+1, nil, 500*time.Millisecond)
	answer("a call queued behind a write the node does not take", behind)
	closePool()
	for i, a := range append(recs, behind) {
		if got := answersOf(a); len(got) != 1 {
			t.Errorf("call %d got %d answers, want 1", i+1, len(got))
		}
	}
	if n := pool.TotalInFlight(); n != 0 {
		t.Errorf("%d calls in flight after every answer", n)
	}
}

// TestCloseDoesNotWaitForAStuckWrite: the pool's Close (the node's stop)
// ends a lane stuck in a write to a node that stopped reading at once,
// not at the write's bound (its calls' deadlines, here a minute away), and
// every call on it is answered once.
func TestCloseDoesNotWaitForAStuckWrite(t *testing.T) {
	peer := startDeafPeer(t, "x")
	pool := New(Options{Self: "self", Log: slog.New(slog.DiscardHandler), Metrics: metrics.NewSet(), UserTimeout: time.Minute})
	closed := make(chan struct{})
	t.Cleanup(func() {
		peer.closeAll() // without the fix, the stuck write ends only so
		<-closed
	})
	const calls = 16 // 16 MiB: far more than the two sockets' buffers hold
	payload := make([]byte, 1<<20)
	recs := make([]*answerRecorder, calls)
	for i := range recs {
		recs[i] = &answerRecorder{ch: make(chan []byte, 4)}
		c := &Call{Caller: recs[i], CallerID: uint64(i + 1), Kind: netio.KindCall, Group: "g", Payload: payload,
			Start: time.Now(), Deadline: time.Now().Add(time.Minute)}
		if code, msg := pool.Send("x", peer.addr, c); code != netio.CodeOK {
			t.Fatalf("send: %v %s", code, msg)
		}
	}
	waitUntil(t, func() bool { return stuckWrite(pool, "x") })
	start := time.Now()
	go func() { defer close(closed); pool.Close() }()
	select {
	case <-closed:
	case <-time.After(3 * time.Second): // below netio's least write bound
		t.Fatalf("Close did not return within 3s of a lane's write stopping (it waited for the write's bound)")
	}
	t.Logf("Close took %v", time.Since(start))
	for i, a := range recs {
		got := answersOf(a)
		if len(got) != 1 {
			t.Errorf("call %d got %d answers, want 1", i+1, len(got))
			continue
		}
		if got[0].Code != netio.CodeNetworkDown {
			t.Errorf("call %d: %v %s, want 'network down'", i+1, got[0].Code, got[0].Payload)
		}
	}
	if n := pool.TotalInFlight(); n != 0 {
		t.Errorf("%d calls in flight after Close", n)
	}
}

// stuckWrite reports whether a connection of node's peer has bytes its
// kernel cannot send: the other side's window is full.
func stuckWrite(pool *Pool, node string) bool {
	pool.mu.Lock()
	pr := pool.peers[node]
	pool.mu.Unlock()
	if pr == nil {
		return false
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	for mc := range pr.conns {
		rc, err := mc.NetConn().(syscall.Conn).SyscallConn()
		if err != nil {
			continue
		}
		var info *unix.TCPInfo
		_ = rc.Control(func(fd uintptr) { info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) })
		if err == nil && info.Notsent_bytes > 0 && info.Snd_wnd == 0 {
			return true
		}
	}
	return false
}

// multiDelegate spreads every group over the receiving sockets
// (multi_schedule) and answers what it cannot send.
type multiDelegate struct{}

func (multiDelegate) Reroute(c *Call, err error) { c.FailUnsent(err, "") }
func (multiDelegate) MultiSchedule(string) bool  { return true }

// startTwoReceiverNode is node x whose receivers lookups answer that a
// group is received on two sockets at *at (set before the first lookup),
// and which answers every call 'no such service group'.
func startTwoReceiverNode(t *testing.T, at *atomic.Pointer[string]) *fakeNode {
	return startFakeNode(t, "x", "", func(c *rpcport.Conn, f netio.Frame, hop string) {
		if f.Kind == netio.KindNameLookup {
			c.SendNow(netio.AppendFrame(nil, netio.Header{Kind: netio.KindReply, ID: f.ID}, "", "",
				netio.AppendReceivers(nil, netio.Receivers{Addr: *at.Load(), Count: 2, Here: -1})))
			return
		}
		noSuchGroup(c, f, hop)
	})
}

// TestDiallingLaneLeavesQueuedCallsToAConnectedOne: of a target's two
// lanes (multi_schedule), one has its connection and the other dials a
// hello that hangs: the calls queued meanwhile go out on the connection
// and get the node's answer, none waits for the dial (to be answered
// 'timed out' at its deadline, or 'network down' when the dial fails).
func TestDiallingLaneLeavesQueuedCallsToAConnectedOne(t *testing.T) {
	var proxyAddr atomic.Pointer[string]
	node := startTwoReceiverNode(t, &proxyAddr)
	// The first connection goes through, the next hangs in its hello.
	proxy := startHoldingPeer(t, node.addr, func(n int32) bool { return n == 1 })
	proxyAddr.Store(&proxy.addr)
	pool := New(Options{Self: "self", Log: slog.New(slog.DiscardHandler), Metrics: metrics.NewSet()})
	pool.SetDelegate(multiDelegate{})
	t.Cleanup(pool.Close)
	pool.peerFor("x", proxy.addr).learned("g", recvRoute{addr: proxy.addr, count: 2})
	send := func(id uint64, d time.Duration) *answerRecorder {
		a := &answerRecorder{ch: make(chan []byte, 4)}
		c := &Call{Caller: a, CallerID: id, Kind: netio.KindCall, Group: "g", Start: time.Now(), Deadline: time.Now().Add(d)}
		if code, msg := pool.Send("x", proxy.addr, c); code != netio.CodeOK {
			t.Fatalf("send: %v %s", code, msg)
		}
		return a
	}
	code := func(a *answerRecorder, within time.Duration) (netio.Code, bool) {
		var b []byte
		select {
		case b = <-a.ch:
		default:
			select {
			case b = <-a.ch:
			case <-time.After(within):
				return 0, false
			}
		}
		f, _, err := netio.Decode(b, 1<<20)
		if err != nil {
			return 255, true
		}
		return f.Code, true
	}
	// Calls until the second lane took one and dials: that one goes back
	// to the first lane too.
	var recs []*answerRecorder
	for id := uint64(1); proxy.accepted.Load() < 2; id++ {
		if id > 200 {
			t.Fatal("the second lane never dialled")
		}
		recs = append(recs, send(id, testWait))
		time.Sleep(10 * time.Millisecond)
	}
	early := len(recs)
	for i := range 20 {
		recs = append(recs, send(uint64(early+i+1), time.Second))
	}
	end := time.Now().Add(helloTimeout * 3 / 4) // within the hello's bound: none waits for the dial to fail
	for i, a := range recs {
		c, ok := code(a, max(time.Until(end), 0))
		switch {
		case !ok:
			t.Errorf("call %d (of %d sent before the second lane dialled): no answer while that lane dialled", i+1, early)
		case c != netio.CodeNoSuchGroup:
			t.Errorf("call %d (of %d sent before the second lane dialled): %v, want the node's answer", i+1, early, c)
		}
	}
}

// TestCloseDoesNotWaitForAHangingHello: the pool's Close (the node's stop)
// ends a lane's dial to a node that took the connection and does not
// answer the hello at once, not at the hello's bound; the call that
// waited for it is answered once.
func TestCloseDoesNotWaitForAHangingHello(t *testing.T) {
	peer := startHoldingPeer(t, "", nil)
	pool := New(Options{Self: "self", Log: slog.New(slog.DiscardHandler), Metrics: metrics.NewSet()})
	closed := make(chan struct{})
	t.Cleanup(func() { <-closed })
	a := &answerRecorder{ch: make(chan []byte, 4)}
	c := &Call{Caller: a, CallerID: 1, Kind: netio.KindCall, Group: "g", Start: time.Now(), Deadline: time.Now().Add(time.Minute)}
	if code, msg := pool.Send("x", peer.addr, c); code != netio.CodeOK {
		t.Fatalf("send: %v %s", code, msg)
	}
	waitUntil(t, func() bool { return peer.accepted.Load() == 1 })
	start := time.Now()
	go func() { defer close(closed); pool.Close() }()
	select {
	case <-closed:
		// Without the dial's end at the stop, Close returns only at the
		// hello's bound, most of which is still ahead here.
		if took := time.Since(start); took > helloTimeout*3/4 {
			t.Errorf("Close took %v: it waited for a dial whose hello hung, until the hello's bound (%v)", took, helloTimeout)
		}
	case <-time.After(testWait):
		t.Fatal("Close did not return")
	}
	if got := answersOf(a); len(got) != 1 || got[0].Code != netio.CodeNetworkDown {
		t.Errorf("the call that waited for the dial got %v, want one 'network down'", got)
	}
}

// TestUnreachableNodeAnswersOnce: a call for a node nobody listens for is
// answered 'network down' once (its lane dials again for the next call,
// never for an answered one).
func TestUnreachableNodeAnswersOnce(t *testing.T) {
	pool := New(Options{Self: "self", Log: slog.New(slog.DiscardHandler), Metrics: metrics.NewSet()})
	a := &countingCaller{first: make(chan []byte, 1)}
	c := &Call{Caller: a, CallerID: 1, Kind: netio.KindCall, Group: "g", Start: time.Now(), Deadline: time.Now().Add(testWait)}
	if code, msg := pool.Send("x", "127.0.0.1:1", c); code != netio.CodeOK {
		t.Fatalf("send: %v %s", code, msg)
	}
	select {
	case b := <-a.first:
		if f, _, err := netio.Decode(b, 1<<20); err != nil || f.Code != netio.CodeNetworkDown {
			t.Errorf("a call for an unreachable node: %v %v, want 'network down'", f.Code, err)
		}
	case <-time.After(testWait):
		t.Fatal("no answer")
	}
	time.Sleep(100 * time.Millisecond) // a second answer, if any, comes from the lane's next dial at once
	pool.Close()
	if n := a.n.Load(); n != 1 {
		t.Errorf("a call for an unreachable node got %d answers, want 1", n)
	}
}

// countingCaller counts its answers and keeps the first; it never blocks.
type countingCaller struct {
	n     atomic.Int32
	first chan []byte
}

func (c *countingCaller) Send(b []byte) error {
	if c.n.Add(1) == 1 {
		c.first <- append([]byte(nil), b...)
	}
	return nil
}

// TestHeldCallGoesToASiblingThatConnects: a call a dialling lane holds
// (its hello hangs) goes out on a sibling lane of its target as soon as
// that one connects, also when no other call comes to wake the lane; it
// waited for its own dial's 2 s bound (a finding of the review of the
// dialling lanes).
func TestHeldCallGoesToASiblingThatConnects(t *testing.T) {
	var proxyAddr atomic.Pointer[string]
	node := startTwoReceiverNode(t, &proxyAddr)
	// The first connection hangs in its hello, the next go through.
	proxy := startHoldingPeer(t, node.addr, func(n int32) bool { return n > 1 })
	addr, accepted := proxy.addr, &proxy.accepted
	proxyAddr.Store(&addr)
	pool := New(Options{Self: "self", Log: slog.New(slog.DiscardHandler), Metrics: metrics.NewSet()})
	pool.SetDelegate(multiDelegate{})
	t.Cleanup(pool.Close)
	pool.peerFor("x", addr).learned("g", recvRoute{addr: addr, count: 2})
	send := func(id uint64, d time.Duration) *answerRecorder {
		a := &answerRecorder{ch: make(chan []byte, 4)}
		c := &Call{Caller: a, CallerID: id, Kind: netio.KindCall, Group: "g", Start: time.Now(), Deadline: time.Now().Add(d)}
		if code, msg := pool.Send("x", addr, c); code != netio.CodeOK {
			t.Fatalf("send: %v %s", code, msg)
		}
		return a
	}
	first := send(1, 5*time.Second)
	waitUntil(t, func() bool { return accepted.Load() >= 1 })
	time.Sleep(20 * time.Millisecond)
	for id := uint64(2); accepted.Load() < 2; id++ {
		if id > 200 {
			t.Fatal("second lane never dialled")
		}
		send(id, 5*time.Second)
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	select {
	case b := <-first.ch:
		f, _, _ := netio.Decode(b, 1<<20)
		t.Logf("call 1 answered %v after %v", f.Code, time.Since(start))
		if time.Since(start) > 500*time.Millisecond {
			t.Errorf("call 1 waited %v for its own lane's hung dial though a sibling lane was connected", time.Since(start))
		}
	case <-time.After(testWait):
		t.Fatal("call 1 never answered")
	}
}

// TestUnreachableIsTheNodes: a failed dial to one of a node's receiving
// addresses does not make the node unreachable while its RPC port's lane
// serves (the router would leave it out for every group).
func TestUnreachableIsTheNodes(t *testing.T) {
	node := startFakeNode(t, "x", "", noSuchGroup)
	pool := New(Options{Self: "self", Log: slog.New(slog.DiscardHandler), Metrics: metrics.NewSet()})
	t.Cleanup(pool.Close)
	a := &answerRecorder{ch: make(chan []byte, 4)}
	c := &Call{Caller: a, CallerID: 1, Kind: netio.KindCall, Group: "g", Start: time.Now(), Deadline: time.Now().Add(testWait)}
	if code, msg := pool.Send("x", node.addr, c); code != netio.CodeOK {
		t.Fatalf("send: %v %s", code, msg)
	}
	<-a.ch // connected on the RPC port
	pool.peerFor("x", node.addr).learned("h", recvRoute{addr: "127.0.0.1:1", count: 1})
	b := &answerRecorder{ch: make(chan []byte, 4)}
	c2 := &Call{Caller: b, CallerID: 2, Kind: netio.KindCall, Group: "h", Start: time.Now(), Deadline: time.Now().Add(testWait)}
	if code, msg := pool.Send("x", node.addr, c2); code != netio.CodeOK {
		t.Fatalf("send: %v %s", code, msg)
	}
	<-b.ch
	if pool.Unreachable("x") {
		t.Errorf("node x reported unreachable while its RPC port's connection serves")
	}
}

// TestLookupAnswersCannotGrowLanesWithoutBound: a node's receivers lookup
// answers say where its groups are received; a node that answers each with
// another address and 64 sockets (a hostile node, or one whose receivers
// keep moving) must not make the pool start 64 more lanes (goroutines,
// each with a queue of its target) for every group it is asked about:
// their number stays bounded by what a node can have, and every call still
// gets one answer.
func TestLookupAnswersCannotGrowLanesWithoutBound(t *testing.T) {
	const groups = 12 // 12 x 64 lanes: beyond what any node has
	addrs := make([]string, groups)
	for i := range addrs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs[i] = ln.Addr().String() // closed at once: nobody listens there
		ln.Close()
	}
	node := startFakeNode(t, "x", "", func(c *rpcport.Conn, f netio.Frame, hop string) {
		if f.Kind == netio.KindNameLookup {
			var i int
			fmt.Sscanf(string(f.Group), "g%d", &i)
			c.SendNow(netio.AppendFrame(nil, netio.Header{Kind: netio.KindReply, ID: f.ID}, "", "",
				netio.AppendReceivers(nil, netio.Receivers{Addr: addrs[i%groups], Count: 64, Here: -1})))
			return
		}
		noSuchGroup(c, f, hop)
	})
	pool := New(Options{Self: "self", Log: slog.New(slog.DiscardHandler), Metrics: metrics.NewSet()})
	pool.SetDelegate(multiDelegate{})
	t.Cleanup(pool.Close)
	for i := range groups {
		a := &countingCaller{first: make(chan []byte, 1)}
		c := &Call{Caller: a, CallerID: uint64(i + 1), Kind: netio.KindCall, Group: fmt.Sprint("g", i),
			Start: time.Now(), Deadline: time.Now().Add(testWait)}
		if code, msg := pool.Send("x", node.addr, c); code != netio.CodeOK {
			t.Fatalf("send: %v %s", code, msg)
		}
		select {
		case <-a.first:
		case <-time.After(testWait):
			t.Fatalf("call %d got no answer", i+1)
		}
	}
	pr := pool.peerFor("x", node.addr)
	pr.mu.Lock()
	lanes, targets := pr.lanesRunning, len(pr.targets)
	pr.mu.Unlock()
	t.Logf("%d lanes on %d targets after %d lookups", lanes, targets, groups)
	if lanes > maxPeerLanes {
		t.Errorf("%d lanes to one node after %d lookup answers, want at most %d", lanes, groups, maxPeerLanes)
	}
}

// TestCallsDoNotWaitForAnotherCallsLookup: a call that must ask the node
// where its group is received (multi_schedule, route not yet known) comes
// after another, already framed, in a lane's batch. The lookup takes the
// node a second; the call before it must not wait for that in the lane's
// buffer, where its deadline passed (its caller told 'timed out') and it
// was written to the node after all, to run there with its caller gone.
func TestCallsDoNotWaitForAnotherCallsLookup(t *testing.T) {
	var addr atomic.Pointer[string]
	type arrival struct {
		group string
		at    time.Time
	}
	arrived := make(chan arrival, 16)
	node := startFakeNode(t, "x", "", func(c *rpcport.Conn, f netio.Frame, hop string) {
		if f.Kind == netio.KindNameLookup {
			id := f.ID
			go func() {
				time.Sleep(time.Second)
				_ = c.Send(netio.AppendFrame(nil, netio.Header{Kind: netio.KindReply, ID: id}, "", "",
					netio.AppendReceivers(nil, netio.Receivers{Addr: *addr.Load(), Count: 1, Here: -1})))
			}()
			return
		}
		arrived <- arrival{string(f.Group), time.Now()}
		noSuchGroup(c, f, hop)
	})
	addr.Store(&node.addr)
	pool := New(Options{Self: "self", Log: slog.New(slog.DiscardHandler), Metrics: metrics.NewSet()})
	pool.SetDelegate(multiDelegate{})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); pool.RunExpiry(stop) }()
	t.Cleanup(func() { close(stop); <-done; pool.Close() })
	pool.peerFor("x", node.addr).learned("a", recvRoute{addr: node.addr, count: 1}) // a: no lookup
	send := func(id uint64, group string, d time.Duration) *answerRecorder {
		a := &answerRecorder{ch: make(chan []byte, 4)}
		c := &Call{Caller: a, CallerID: id, Kind: netio.KindCall, Group: group, Start: time.Now(), Deadline: time.Now().Add(d)}
		if code, msg := pool.Send("x", node.addr, c); code != netio.CodeOK {
			t.Fatalf("send: %v %s", code, msg)
		}
		return a
	}
	// Both queued while the lane dials: they make one batch.
	first := send(1, "a", 300*time.Millisecond)
	second := send(2, "b", testWait)
	var answeredAt time.Time
	select {
	case b := <-first.ch:
		answeredAt = time.Now()
		if f, _, err := netio.Decode(b, 1<<20); err != nil || f.Code != netio.CodeNoSuchGroup {
			t.Errorf("the call before another's lookup: %v %v, want the node's answer in time", f.Code, err)
		}
	case <-time.After(testWait):
		t.Fatal("the call before another's lookup got no answer")
	}
	select {
	case <-second.ch:
	case <-time.After(testWait):
		t.Fatal("the call that asked where its group is received got no answer")
	}
	for range 2 {
		a := <-arrived
		if a.group == "a" && a.at.After(answeredAt) {
			t.Errorf("call 1 reached the node %v after its caller was answered", a.at.Sub(answeredAt))
		}
	}
}

// TestAnswerThatIsNoAnswerIsRefused: a node that answers a transferred
// call or a request under its id with a frame that is neither a reply nor
// an error (a call, a lookup, an announce, a go-away) gives its caller no
// answer: its connection closes (netio.MuxConn) and the caller gets
// 'protocol error' naming the node, once, never the frame as if it were one (a UAP's local call takes any frame but an
// error as its reply; a client given a go-away under id 0 leaves the
// connection).
func TestAnswerThatIsNoAnswerIsRefused(t *testing.T) {
	kinds := []netio.Kind{netio.KindCall, netio.KindCallNoReply, netio.KindNameLookup, netio.KindAnnounce, netio.KindGoAway}
	node := startFakeNode(t, "x", "", func(c *rpcport.Conn, f netio.Frame, _ string) {
		var k int
		fmt.Sscanf(string(f.Group), "k%d", &k)
		c.SendNow(netio.AppendFrame(nil, netio.Header{Kind: kinds[k], ID: f.ID}, "g", "s", []byte("not an answer")))
	})
	pool := New(Options{Self: "self", Log: slog.New(slog.DiscardHandler), Metrics: metrics.NewSet()})
	t.Cleanup(pool.Close)
	for k, kind := range kinds {
		a := &answerRecorder{ch: make(chan []byte, 4)}
		c := &Call{Caller: a, CallerID: 1, Kind: netio.KindCall, Group: fmt.Sprint("k", k), Start: time.Now(), Deadline: time.Now().Add(testWait)}
		if code, msg := pool.Send("x", node.addr, c); code != netio.CodeOK {
			t.Fatalf("send: %v %s", code, msg)
		}
		select {
		case b := <-a.ch:
			if f, _, err := netio.Decode(b, 1<<20); err != nil || f.Kind != netio.KindError || f.Code != netio.CodeProtocol {
				t.Errorf("a call answered with a %v frame: the caller got a %v frame (%v %q), want 'protocol error'", kind, f.Kind, f.Code, f.Payload)
			}
		case <-time.After(testWait):
			t.Fatalf("a call answered with a %v frame got no answer", kind)
		}
		_, err := pool.Request(context.Background(), "x", node.addr, "wlm-start", fmt.Sprint("k", k), nil, time.Now().Add(testWait))
		if codeOf(err) != netio.CodeProtocol {
			t.Errorf("a request answered with a %v frame: %v, want 'protocol error'", kind, err)
		}
	}
}

// TestLookupEndsAtItsCallsDeadline: a call that must first ask the node
// where its group is received (multi_schedule, route not yet known) is
// answered 'timed out' at its deadline when the node's answer to the
// lookup is slow, not when the lookup's own bound (2 s) or the answer
// comes; and it is not sent.
func TestLookupEndsAtItsCallsDeadline(t *testing.T) {
	var reached atomic.Int32
	var addr atomic.Pointer[string]
	node := startFakeNode(t, "x", "", func(c *rpcport.Conn, f netio.Frame, hop string) {
		if f.Kind == netio.KindNameLookup {
			id := f.ID
			go func() {
				time.Sleep(1500 * time.Millisecond)
				_ = c.Send(netio.AppendFrame(nil, netio.Header{Kind: netio.KindReply, ID: id}, "", "",
					netio.AppendReceivers(nil, netio.Receivers{Addr: *addr.Load(), Count: 1, Here: -1})))
			}()
			return
		}
		reached.Add(1)
		noSuchGroup(c, f, hop)
	})
	addr.Store(&node.addr)
	pool := New(Options{Self: "self", Log: slog.New(slog.DiscardHandler), Metrics: metrics.NewSet()})
	pool.SetDelegate(multiDelegate{})
	t.Cleanup(pool.Close)
	a := &answerRecorder{ch: make(chan []byte, 4)}
	start := time.Now()
	c := &Call{Caller: a, CallerID: 1, Kind: netio.KindCall, Group: "g", Start: start, Deadline: start.Add(200 * time.Millisecond)}
	if code, msg := pool.Send("x", node.addr, c); code != netio.CodeOK {
		t.Fatalf("send: %v %s", code, msg)
	}
	select {
	case b := <-a.ch:
		took := time.Since(start)
		if f, _, err := netio.Decode(b, 1<<20); err != nil || f.Code != netio.CodeTimedOut {
			t.Errorf("a call whose lookup outlasts its deadline: %v %v, want 'timed out'", f.Code, err)
		}
		if took > time.Second {
			t.Errorf("a call with a 200ms deadline was answered after %v, when its lookup ended", took)
		}
	case <-time.After(testWait):
		t.Fatal("a call whose lookup outlasts its deadline got no answer")
	}
	if n := reached.Load(); n != 0 {
		t.Errorf("%d calls reached the node after their deadline", n)
	}
}

// inFlightRecorder is a caller that notes the pool's calls in flight when
// its answer is sent.
type inFlightRecorder struct {
	pool *Pool
	at   chan int
}

func (r *inFlightRecorder) Send([]byte) error {
	r.at <- r.pool.TotalInFlight()
	return nil
}

// TestACallIsInFlightUntilItsAnswerIsSent: a transferred call counts in
// TotalInFlight while its answer is sent to its caller, whether the other
// node replied, its deadline passed, the connection was lost or the node
// could not be reached (the call rerouted: here, answered). The
// node's drain closes the RPC port once nothing is in flight: counted off
// before the send, an answer could meet a port already shut.
func TestACallIsInFlightUntilItsAnswerIsSent(t *testing.T) {
	reply := func(c *rpcport.Conn, f netio.Frame, _ string) {
		switch string(f.Group) {
		case "reply":
			c.SendNow(netio.AppendReply(nil, f.ID, f.Payload))
		case "close":
			c.Close()
		} // "mute": never answered
	}
	addr := startFakeNode(t, "x", testKey, reply).addr
	pool := New(Options{Self: "self", Key: []byte(testKey), Log: slog.New(slog.DiscardHandler), Metrics: metrics.NewSet()})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); pool.RunExpiry(stop) }()
	t.Cleanup(func() { close(stop); <-done; pool.Close() })
	for _, group := range []string{"reply", "mute", "close", "unreachable"} {
		r := &inFlightRecorder{pool: pool, at: make(chan int, 1)}
		c := &Call{Caller: r, CallerID: 1, Kind: netio.KindCall, Group: group, Start: time.Now(), Deadline: time.Now().Add(300 * time.Millisecond)}
		node, to := "x", addr
		if group == "unreachable" {
			var err error
			if to, err = freeport.Addr(); err != nil { // nothing listens: the dial is refused
				t.Fatal(err)
			}
			node = "y"
		}
		if code, msg := pool.Send(node, to, c); code != netio.CodeOK {
			t.Fatalf("%s: send: %v %s", group, code, msg)
		}
		select {
		case n := <-r.at:
			if n != 1 {
				t.Errorf("%s: its answer sent with %d calls in flight, want 1 (its own)", group, n)
			}
		case <-time.After(testWait):
			t.Fatalf("%s: no answer", group)
		}
		waitUntil(t, func() bool { return pool.TotalInFlight() == 0 })
	}
}
