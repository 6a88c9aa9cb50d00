package scd

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/netio"
	"tpsched/scd/def"
)

// This file transfers calls to other nodes: one peer per node, each with
// one connection to the node's RPC port (a netio.MuxConn) that it dials
// when the first call comes and again after a failure, opening it with the
// peer hello (hello.go). A call is handed to the peer's queue from the event
// loop (never blocking it); the peer's writer goroutine sends it under a
// fresh id, and the connection's reader answers the original caller under
// the caller's id when the reply comes back.
//
// A call is counted in its peer's in-flight count (P2C's second key) from
// before it is queued until it is answered, and a stopped peer takes no
// call: the check and the queueing happen under the peer's lock, and the
// writer empties the queue only after the stop, so no call is left in a
// queue nobody reads.

// fwdCall is one call on its way to another node.
type fwdCall struct {
	caller    *netio.Conn
	callerID  uint64
	kind      netio.Kind
	group     string
	service   string
	payload   []byte // a copy: the frame's buffer belongs to the event loop
	timeoutMs uint32
	deadline  time.Time // zero: none
	start     time.Time
	tried     []string // nodes tried, for a retry after a communication error
	retries   int      // retries left
	via       *peer    // the peer it was last handed to
}

// errCommunication is a failure to reach a node, or a refusal from a node
// that certainly did not run the call: the call can go elsewhere.
var errCommunication = errors.New("communication error")

// refusal is a node's answer that says the call did not run there.
type refusal struct {
	node string
	code netio.Code
	msg  string
}

func (r *refusal) Error() string {
	return fmt.Sprintf("node %s refused the call (%v: %s): %v", r.node, r.code, r.msg, errCommunication)
}

func (r *refusal) Unwrap() error { return errCommunication }

// refusedBeforeRunning reports whether an error code from another node
// certainly means the call never ran there, because of the node's state
// rather than the call's: it stops, the group is held or gone there, or
// its queue is full. Such a call is retried elsewhere like a communication
// error (scd_retry_of_comm_error).
func refusedBeforeRunning(code netio.Code) bool {
	switch code {
	case netio.CodeShuttingDown, netio.CodeServiceClosed, netio.CodeNoSuchGroup, netio.CodeServerBusy:
		return true
	}
	return false
}

// peerQueue bounds the calls waiting for one peer's writer: beyond it a
// call is refused server busy rather than buffered without limit.
const peerQueue = 4096

// writeBatch is how many bytes of queued calls the writer gathers into one
// write.
const writeBatch = 64 << 10

// peer is the way to one other node.
type peer struct {
	f    *forwarder
	node string
	addr string

	queue    chan *fwdCall
	inFlight atomic.Int64 // calls queued or sent, not yet answered: P2C's second key
	sentTo   *metrics.Counter

	mu       sync.Mutex
	stopped  bool           // guarded by mu: no call is queued any more
	replaced bool           // guarded by mu: stopped because the node moved; queued calls go to its new peer
	conn     *netio.MuxConn // guarded by mu: the live connection, nil between connections
	stop     chan struct{}
}

// forwarder owns the peers.
type forwarder struct {
	self    string
	key     []byte
	log     *slog.Logger
	metrics *metrics.Set
	// reroute is called with a call that could not be sent, or that a node
	// refused before running it: it tries another node or answers the
	// caller.
	reroute func(*fwdCall, error)

	mu    sync.Mutex
	peers map[string]*peer // by node id
	wg    sync.WaitGroup
	done  bool
}

func newForwarder(self string, key []byte, log *slog.Logger, set *metrics.Set) *forwarder {
	return &forwarder{self: self, key: key, log: log, metrics: set, peers: map[string]*peer{}}
}

// peerFor returns the peer of node at addr, replacing it if the node
// moved; nil once the forwarder is closed.
func (f *forwarder) peerFor(node, addr string) *peer {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done {
		return nil
	}
	p := f.peers[node]
	if p != nil && p.addr == addr {
		return p
	}
	if p != nil {
		p.halt(true)
	}
	p = &peer{
		f: f, node: node, addr: addr,
		queue:  make(chan *fwdCall, peerQueue),
		stop:   make(chan struct{}),
		sentTo: f.metrics.GetOrCreateCounter(fmt.Sprintf(`tpsched_forwarded_total{to=%q}`, node)),
	}
	f.peers[node] = p
	f.wg.Add(1)
	go p.run()
	return p
}

// inFlight is this node's calls in flight to node.
func (f *forwarder) inFlight(node string) int {
	f.mu.Lock()
	p := f.peers[node]
	f.mu.Unlock()
	if p == nil {
		return 0
	}
	return int(p.inFlight.Load())
}

// totalInFlight is every call this node has handed to other nodes and not
// yet answered.
func (f *forwarder) totalInFlight() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	var sum int64
	for _, p := range f.peers {
		sum += p.inFlight.Load()
	}
	return int(sum)
}

// send hands cl to node's peer, or says why it cannot.
func (f *forwarder) send(node, addr string, cl *fwdCall) (netio.Code, string) {
	// A peer replaced between peerFor and enqueue refuses the call: the
	// next peerFor returns its successor.
	for range 3 {
		p := f.peerFor(node, addr)
		if p == nil {
			return netio.CodeNetworkDown, "this node is stopping"
		}
		switch p.enqueue(cl) {
		case enqueued:
			return netio.CodeOK, ""
		case queueFull:
			return netio.CodeServerBusy, "too many calls waiting for node " + node
		}
	}
	return netio.CodeNetworkDown, "node " + node + " keeps changing its address"
}

type enqueueResult int

const (
	enqueued enqueueResult = iota
	queueFull
	peerStopped
)

// enqueue counts cl in flight and queues it for the writer, unless the
// queue is full or the peer stopped.
func (p *peer) enqueue(cl *fwdCall) enqueueResult {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return peerStopped
	}
	p.inFlight.Add(1)
	cl.via = p
	select {
	case p.queue <- cl:
		return enqueued
	default:
		p.inFlight.Add(-1)
		return queueFull
	}
}

// halt stops the peer: it takes no more calls, its writer answers (or,
// when replaced, hands on) what is queued, and its connection closes.
func (p *peer) halt(replaced bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	p.stopped, p.replaced = true, replaced
	close(p.stop)
}

// close stops every peer; calls waiting for an answer are answered
// 'network down'.
func (f *forwarder) close() {
	f.mu.Lock()
	f.done = true
	for _, p := range f.peers {
		p.halt(false)
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// expire answers forwarded calls whose deadline passed without a reply.
func (f *forwarder) expire(now time.Time) {
	f.mu.Lock()
	conns := make([]*netio.MuxConn, 0, len(f.peers))
	for _, p := range f.peers {
		p.mu.Lock()
		if p.conn != nil {
			conns = append(conns, p.conn)
		}
		p.mu.Unlock()
	}
	f.mu.Unlock()
	for _, mc := range conns {
		mc.Expire(now)
	}
}

func answerErr(cl *fwdCall, code netio.Code, msg string) {
	if cl.kind == netio.KindCall {
		_ = cl.caller.Send(netio.AppendError(nil, cl.callerID, code, msg))
	}
}

// answerUnsent answers a call no node took after err: with the refusal it
// met, or 'network down' (err, then more).
func answerUnsent(cl *fwdCall, err error, more string) {
	var r *refusal
	if errors.As(err, &r) {
		answerErr(cl, r.code, r.msg)
		return
	}
	answerErr(cl, netio.CodeNetworkDown, err.Error()+more)
}

// Answer takes the answer to a sent call from its connection (it is the
// call's netio.Answerer) and passes it to the caller under the caller's
// id; a refusal before running goes to reroute instead.
func (cl *fwdCall) Answer(f netio.Frame, err error) {
	p := cl.via
	p.inFlight.Add(-1)
	switch {
	case errors.Is(err, netio.ErrCallExpired):
		answerErr(cl, netio.CodeTimedOut, fmt.Sprintf("no answer from node %s within %v", p.node, roundLimit(cl.deadline.Sub(cl.start))))
	case err != nil:
		// Not retried: the other node may have run it.
		answerErr(cl, netio.CodeNetworkDown, "connection to node "+p.node+" lost")
	case f.Kind == netio.KindError && refusedBeforeRunning(f.Code):
		p.f.reroute(cl, &refusal{node: p.node, code: f.Code, msg: string(f.Payload)})
	default:
		out := netio.AppendFrame(nil, netio.Header{Kind: f.Kind, Code: f.Code, ID: cl.callerID}, "", "", f.Payload)
		_ = cl.caller.Send(out)
	}
}

// run keeps a connection to the peer while calls come.
func (p *peer) run() {
	defer p.f.wg.Done()
	var carried []*fwdCall // taken off the queue, not sent: they go first on the next connection
	for {
		if len(carried) == 0 {
			var first *fwdCall
			select {
			case <-p.stop:
			case first = <-p.queue:
				carried = append(carried, first)
			}
		}
		select {
		case <-p.stop:
			for _, cl := range carried {
				p.handOn(cl)
			}
			p.emptyQueue()
			return
		default:
		}
		nc, fr, err := dialPeer(p.addr, p.f.self, p.node, p.f.key)
		if err != nil {
			if errors.Is(err, errHelloRefused) {
				p.f.log.Warn("peer hello failed", "node", p.node, "addr", p.addr, "err", err)
			} else {
				p.f.log.Debug("peer unreachable", "node", p.node, "addr", p.addr, "err", err)
			}
			for _, cl := range carried {
				p.retry(cl, err)
			}
			carried = carried[:0]
			p.retryQueued(err)
			continue
		}
		mc := netio.NewMuxConn(nc, netio.MuxOptions{MaxPayload: def.MaxMaxMessageSize, Reader: fr})
		carried = p.serve(mc, carried)
	}
}

// serve writes calls to mc until it fails or the peer stops; mc's reader
// answers the callers. It returns the calls it took but could not send
// because mc had closed.
func (p *peer) serve(mc *netio.MuxConn, calls []*fwdCall) (unsent []*fwdCall) {
	p.mu.Lock()
	p.conn = mc
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.conn = nil
		p.mu.Unlock()
		mc.Close(fmt.Errorf("connection to node %s closed", p.node)) // answers what was sent
	}()
	buf := make([]byte, 0, writeBatch)
	add := func(cl *fwdCall) {
		if len(unsent) > 0 {
			unsent = append(unsent, cl) // keep their order
			return
		}
		var ok bool
		if buf, ok = p.frame(buf, mc, cl); !ok {
			unsent = append(unsent, cl)
		}
	}
	for _, cl := range calls {
		add(cl)
	}
	for {
	gather:
		for len(buf) < writeBatch && len(unsent) == 0 {
			select {
			case cl := <-p.queue:
				add(cl)
			default:
				break gather
			}
		}
		if len(buf) > 0 {
			if _, err := mc.Write(buf); err != nil {
				return unsent
			}
		}
		if len(unsent) > 0 {
			return unsent
		}
		if cap(buf) > 4*writeBatch {
			buf = make([]byte, 0, writeBatch) // a huge call's buffer is not kept
		}
		buf = buf[:0]
		select {
		case <-p.stop:
			return nil
		case <-mc.Done():
			return nil
		case cl := <-p.queue:
			add(cl)
		}
	}
}

// frame appends cl's frame under a fresh id of mc, which answers it; false
// if mc has closed.
func (p *peer) frame(dst []byte, mc *netio.MuxConn, cl *fwdCall) ([]byte, bool) {
	timeout := cl.timeoutMs
	if !cl.deadline.IsZero() {
		left := time.Until(cl.deadline).Milliseconds()
		timeout = uint32(max(1, left))
	}
	h := netio.Header{Kind: cl.kind, Flags: netio.FlagForwarded, TimeoutMs: timeout}
	if cl.kind == netio.KindCall {
		id, err := mc.Expect(cl.deadline, cl)
		if err != nil {
			return dst, false
		}
		h.ID = id
	} else {
		if mc.Err() != nil {
			return dst, false
		}
		p.inFlight.Add(-1) // nobody waits for an answer
	}
	p.sentTo.Inc()
	return netio.AppendFrame(dst, h, cl.group, cl.service, cl.payload), true
}

// retry sends cl elsewhere after a failure to reach this peer.
func (p *peer) retry(cl *fwdCall, err error) {
	p.inFlight.Add(-1)
	p.f.reroute(cl, fmt.Errorf("node %s (%s): %w: %v", p.node, p.addr, errCommunication, err))
}

func (p *peer) retryQueued(err error) {
	for {
		select {
		case cl := <-p.queue:
			p.retry(cl, err)
		default:
			return
		}
	}
}

// emptyQueue deals with the calls still queued when the peer stopped.
func (p *peer) emptyQueue() {
	for {
		select {
		case cl := <-p.queue:
			p.handOn(cl)
		default:
			return
		}
	}
}

// handOn deals with a call the stopped peer did not send: handed to the
// node's new peer if this one was replaced, else answered.
func (p *peer) handOn(cl *fwdCall) {
	p.inFlight.Add(-1)
	p.mu.Lock()
	replaced := p.replaced
	p.mu.Unlock()
	if !replaced {
		answerErr(cl, netio.CodeNetworkDown, "node "+p.node+": this node is stopping")
		return
	}
	p.f.mu.Lock()
	next := p.f.peers[p.node]
	p.f.mu.Unlock()
	code, msg := netio.CodeNetworkDown, "node "+p.node+" moved"
	if next != nil && next != p {
		code, msg = p.f.send(p.node, next.addr, cl)
	}
	if code != netio.CodeOK {
		answerErr(cl, code, msg)
	}
}
