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

// This file transfers calls to other nodes: one peer per node. A peer
// sends a call to a target, an address of the node: its RPC port, or the
// port of the receiver group that takes the call's service group there
// (scdmulti -g), learned when the node answers 'wrong receiver' or, for a
// group with multi_schedule, asked beforehand (a receivers lookup). Each
// target has a queue and one or more lanes: a lane is a goroutine with one
// connection (a netio.MuxConn) that it dials when the first call comes and
// again after a failure, opening it with the peer hello (hello.go). With
// multi_schedule a target has one lane per receiving socket of the group
// there, each on a different socket as far as reconnecting can make it, and
// the lanes take calls from the target's queue as they are free: the calls
// are spread over the receivers. A call is handed to a queue from the
// event loop (never blocking it); a lane sends it under a fresh id, and
// the connection's reader answers the original caller under the caller's
// id when the reply comes back.
//
// A call is counted in its peer's in-flight count (P2C's second key) from
// before it is queued until it is answered, and a stopped peer takes no
// call: the check and the queueing happen under the peer's lock, and the
// lanes empty the queues only after the stop, so no call is left in a
// queue nobody reads.
//
// A connection the node asks to leave (KindGoAway: it hands its port to a
// new process) takes no new call; its lane dials a new one, which the new
// process accepts, while the answers of the calls sent on the old one
// still come.

// fwdCall is one call on its way to another node.
type fwdCall struct {
	caller    caller
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
	lookup    bool     // ask the node where the group is received before sending it
	redirects int      // 'wrong receiver' answers met
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

// peerQueue bounds the calls waiting for one target's lanes: beyond it a
// call is refused server busy rather than buffered without limit.
const peerQueue = 4096

// writeBatch is how many bytes of queued calls a lane gathers into one
// write.
const writeBatch = 64 << 10

// maxRedirects bounds the 'wrong receiver' answers one call may meet.
const maxRedirects = 2

// lookupTimeout bounds a receivers lookup.
const lookupTimeout = 2 * time.Second

// peer is the way to one other node.
type peer struct {
	f    *forwarder
	node string
	addr string // its RPC port

	inFlight atomic.Int64 // calls queued or sent, not yet answered: P2C's second key
	sentTo   *metrics.Counter

	mu       sync.Mutex
	stopped  bool                    // guarded by mu: no call is queued any more
	replaced bool                    // guarded by mu: stopped because the node moved; queued calls go to its new peer
	targets  map[string]*target      // guarded by mu: by address
	routes   map[string]recvRoute    // guarded by mu: by service group, where its calls go, once learned
	conns    map[*netio.MuxConn]bool // guarded by mu: every connection with calls on it, for expire
	stop     chan struct{}
}

// recvRoute is where a service group's calls are received on the node.
type recvRoute struct {
	addr  string
	count int // receiving sockets there
}

// target is one address of a peer's node, with its queue and lanes.
type target struct {
	p     *peer
	addr  string
	group string // a service group received here, for its lanes' receivers lookups
	queue chan *fwdCall
	lanes int         // guarded by p.mu: lanes started
	taken map[int]int // guarded by p.mu: receiving socket -> lanes connected to it
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
	// multi reports whether a service group's transfers are spread over
	// the receivers of its receiver group on the other node
	// (multi_schedule); nil: none is.
	multi func(group string) bool

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
		targets: map[string]*target{},
		routes:  map[string]recvRoute{},
		conns:   map[*netio.MuxConn]bool{},
		stop:    make(chan struct{}),
		sentTo:  f.metrics.GetOrCreateCounter(fmt.Sprintf(`tpsched_forwarded_total{to=%q}`, node)),
	}
	f.peers[node] = p
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

func (f *forwarder) multiSchedule(group string) bool { return f.multi != nil && f.multi(group) }

// enqueue counts cl in flight and queues it for the target its group is
// received on, unless the queue is full or the peer stopped.
func (p *peer) enqueue(cl *fwdCall) enqueueResult {
	multi := p.f.multiSchedule(cl.group)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return peerStopped
	}
	t := p.targetLocked(cl, multi)
	p.inFlight.Add(1)
	cl.via = p
	select {
	case t.queue <- cl:
		return enqueued
	default:
		p.inFlight.Add(-1)
		return queueFull
	}
}

// targetLocked is the target cl goes to: where its group is received, once
// known; else the node's RPC port, with a lookup first when the group
// spreads its calls (multi_schedule) or was sent to the wrong receiver.
// p.mu is held.
func (p *peer) targetLocked(cl *fwdCall, multi bool) *target {
	r, known := p.routes[cl.group]
	if !known || cl.lookup {
		cl.lookup = cl.lookup || multi
		return p.targetAtLocked(p.addr, cl.group, 1)
	}
	lanes := 1
	if multi {
		lanes = r.count
	}
	return p.targetAtLocked(r.addr, cl.group, lanes)
}

// targetAtLocked returns the target at addr with at least lanes lanes,
// starting what is missing. p.mu is held.
func (p *peer) targetAtLocked(addr, group string, lanes int) *target {
	t := p.targets[addr]
	if t == nil {
		t = &target{p: p, addr: addr, group: group, queue: make(chan *fwdCall, peerQueue), taken: map[int]int{}}
		p.targets[addr] = t
	}
	for t.lanes < lanes {
		t.lanes++
		p.f.wg.Add(1)
		go t.runLane()
	}
	return t
}

// learned records where group is received on the node.
func (p *peer) learned(group string, r recvRoute) {
	p.mu.Lock()
	p.routes[group] = r
	p.mu.Unlock()
}

// forgetAddr drops the routes to addr, after it could not be reached: the
// node may have moved the group.
func (p *peer) forgetAddr(addr string) {
	p.mu.Lock()
	for g, r := range p.routes {
		if r.addr == addr {
			delete(p.routes, g)
		}
	}
	p.mu.Unlock()
}

// halt stops the peer: it takes no more calls, its lanes answer (or, when
// replaced, hand on) what is queued, and its connections close.
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
	f.mu.Lock()
	peers := f.peers
	f.mu.Unlock()
	for _, p := range peers {
		p.mu.Lock()
		conns := p.conns
		p.mu.Unlock()
		for mc := range conns {
			mc.Close(fmt.Errorf("connection to node %s closed: this node is stopping", p.node))
		}
	}
}

// expire answers forwarded calls whose deadline passed without a reply.
func (f *forwarder) expire(now time.Time) {
	var conns []*netio.MuxConn
	f.mu.Lock()
	for _, p := range f.peers {
		p.mu.Lock()
		for mc := range p.conns {
			conns = append(conns, mc)
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
// id; a refusal before running goes to reroute instead, and a 'wrong
// receiver' back to the peer, which asks where the group is received.
func (cl *fwdCall) Answer(f netio.Frame, err error) {
	p := cl.via
	p.inFlight.Add(-1)
	switch {
	case errors.Is(err, netio.ErrCallExpired):
		answerErr(cl, netio.CodeTimedOut, fmt.Sprintf("no answer from node %s within %v", p.node, roundLimit(cl.deadline.Sub(cl.start))))
	case err != nil:
		// Not retried: the other node may have run it.
		answerErr(cl, netio.CodeNetworkDown, "connection to node "+p.node+" lost")
	case f.Kind == netio.KindError && f.Code == netio.CodeWrongReceiver && cl.redirects < maxRedirects:
		// It did not run: ask where the group is received, then send it there.
		cl.redirects++
		cl.lookup = true
		if p.enqueue(cl) != enqueued {
			p.f.reroute(cl, &refusal{node: p.node, code: f.Code, msg: string(f.Payload)})
		}
	case f.Kind == netio.KindError && refusedBeforeRunning(f.Code):
		p.f.reroute(cl, &refusal{node: p.node, code: f.Code, msg: string(f.Payload)})
	default:
		out := netio.AppendFrame(nil, netio.Header{Kind: f.Kind, Code: f.Code, ID: cl.callerID}, "", "", f.Payload)
		_ = cl.caller.Send(out)
	}
}

// runLane keeps one connection to the target while calls come.
func (t *target) runLane() {
	p := t.p
	defer p.f.wg.Done()
	var carried []*fwdCall // taken off the queue, not sent: they go first on the next connection
	here := -1             // the receiving socket of the lane's connection, when known
	for {
		if len(carried) == 0 {
			var first *fwdCall
			select {
			case <-p.stop:
			case first = <-t.queue:
				carried = append(carried, first)
			}
		}
		select {
		case <-p.stop:
			for _, cl := range carried {
				p.handOn(cl)
			}
			t.emptyQueue()
			return
		default:
		}
		mc, err := t.dial(&here)
		if err != nil {
			if errors.Is(err, errHelloRefused) {
				p.f.log.Warn("peer hello failed", "node", p.node, "addr", t.addr, "err", err)
			} else {
				p.f.log.Debug("peer unreachable", "node", p.node, "addr", t.addr, "err", err)
			}
			if t.addr != p.addr {
				p.forgetAddr(t.addr)
			}
			for _, cl := range carried {
				p.retry(cl, err)
			}
			carried = carried[:0]
			t.retryQueued(err)
			continue
		}
		carried = t.serve(mc, carried)
		t.release(&here)
	}
}

// dial connects a lane: the hello, then, when the target has several
// lanes, a receivers lookup that says which receiving socket the
// connection landed on. A connection on a socket another lane of the
// target has already is dialled again, a few times (the kernel's hash
// places connections; the steering program gives each new one to the
// socket with the least work, so it rarely needs to).
func (t *target) dial(here *int) (*netio.MuxConn, error) {
	p := t.p
	for attempt := 0; ; attempt++ {
		nc, fr, err := dialPeer(t.addr, p.f.self, p.node, p.f.key)
		if err != nil {
			return nil, err
		}
		mc := netio.NewMuxConn(nc, netio.MuxOptions{MaxPayload: def.MaxMaxMessageSize, Reader: fr})
		p.mu.Lock()
		lanes := t.lanes
		p.mu.Unlock()
		if lanes < 2 {
			return mc, nil
		}
		r, err := lookupReceivers(mc, t.group)
		if err != nil || r.Here < 0 {
			return mc, nil // served all the same; the node answers what it cannot take
		}
		p.mu.Lock()
		busy := t.taken[r.Here] > 0 && attempt < 3*lanes
		if !busy {
			t.taken[r.Here]++
			*here = r.Here
		}
		p.mu.Unlock()
		if !busy {
			return mc, nil
		}
		mc.Close(errors.New("another lane has this receiving socket"))
	}
}

// release forgets the receiving socket of a lane's connection that ended.
func (t *target) release(here *int) {
	if *here < 0 {
		return
	}
	t.p.mu.Lock()
	if t.taken[*here]--; t.taken[*here] <= 0 {
		delete(t.taken, *here)
	}
	t.p.mu.Unlock()
	*here = -1
}

// lookupReceivers asks the node on mc where group is received.
func lookupReceivers(mc *netio.MuxConn, group string) (netio.Receivers, error) {
	w := &lookupWaiter{ch: make(chan lookupResult, 1)}
	_, sent, err := mc.Call(netio.Header{Kind: netio.KindNameLookup}, group, netio.LookupReceivers, nil,
		time.Now().Add(lookupTimeout), w)
	if !sent {
		return netio.Receivers{}, err
	}
	select {
	case r := <-w.ch:
		if r.err != nil {
			return netio.Receivers{}, r.err
		}
		if r.f.Kind != netio.KindReply {
			return netio.Receivers{}, &netio.Error{Code: r.f.Code, Message: string(r.f.Payload)}
		}
		return netio.ParseReceivers(r.f.Payload)
	case <-time.After(lookupTimeout):
		return netio.Receivers{}, fmt.Errorf("receivers lookup: no answer within %v", lookupTimeout)
	}
}

type lookupResult struct {
	f   netio.Frame
	err error
}

type lookupWaiter struct{ ch chan lookupResult }

func (w *lookupWaiter) Answer(f netio.Frame, err error) { w.ch <- lookupResult{f, err} }

// serve writes calls to mc until it fails, the node asks the lane to go
// away or the peer stops; mc's reader answers the callers. It returns the
// calls it took but could not send because mc had closed or was going
// away.
func (t *target) serve(mc *netio.MuxConn, calls []*fwdCall) (unsent []*fwdCall) {
	p := t.p
	p.mu.Lock()
	p.conns[mc] = true
	p.mu.Unlock()
	defer func() {
		if mc.GoingAway() {
			// The calls on it are answered by the node that asked; the
			// connection closes itself after the last.
			go func() {
				<-mc.Done()
				p.mu.Lock()
				delete(p.conns, mc)
				p.mu.Unlock()
			}()
			return
		}
		p.mu.Lock()
		delete(p.conns, mc)
		p.mu.Unlock()
		mc.Close(fmt.Errorf("connection to node %s closed", p.node)) // answers what was sent
	}()
	buf := make([]byte, 0, writeBatch)
	add := func(cl *fwdCall) {
		if len(unsent) > 0 {
			unsent = append(unsent, cl) // keep their order
			return
		}
		if cl.lookup && t.redirect(mc, cl) {
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
			case cl := <-t.queue:
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
		case cl := <-t.queue:
			add(cl)
		}
	}
}

// redirect asks the node on mc where cl's group is received and, when that
// is another target (or more lanes), hands cl there; it reports whether it
// did. A failed lookup leaves cl to be sent here: the node answers what it
// cannot take.
func (t *target) redirect(mc *netio.MuxConn, cl *fwdCall) bool {
	p := t.p
	cl.lookup = false
	r, err := lookupReceivers(mc, cl.group)
	if err != nil {
		return false
	}
	p.learned(cl.group, recvRoute{addr: r.Addr, count: r.Count})
	multi := p.f.multiSchedule(cl.group)
	p.mu.Lock()
	lanes := t.lanes
	p.mu.Unlock()
	if r.Addr == t.addr && (!multi || lanes >= r.Count) {
		return false
	}
	p.inFlight.Add(-1) // enqueue counts it again
	switch p.enqueue(cl) {
	case enqueued:
	case queueFull:
		answerErr(cl, netio.CodeServerBusy, "too many calls waiting for node "+p.node)
	default:
		p.inFlight.Add(1) // handOn takes it off again
		p.handOn(cl)
	}
	return true
}

// frame appends cl's frame under a fresh id of mc, which answers it; false
// if mc has closed or is going away.
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
		if mc.Err() != nil || mc.GoingAway() {
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

func (t *target) retryQueued(err error) {
	for {
		select {
		case cl := <-t.queue:
			t.p.retry(cl, err)
		default:
			return
		}
	}
}

// emptyQueue deals with the calls still queued when the peer stopped.
func (t *target) emptyQueue() {
	for {
		select {
		case cl := <-t.queue:
			t.p.handOn(cl)
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
