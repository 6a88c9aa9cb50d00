package peers

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/internal/pace"
	"tpsched/netio"
)

// Delegate is what the pool asks of its node, in the manner of
// memberlist's delegates. The pool calls it from its lanes and its
// connections' readers, never from an event loop's Send and never with
// its own locks held; neither method may block.
type Delegate interface {
	// Reroute is given a call the pool could not send to its node, or
	// that the node refused before running it; err is a *Refusal or wraps
	// ErrCommunication. From then on the call is the delegate's: it sends
	// it elsewhere (Send again, or its own queue) or answers it.
	Reroute(c *Call, err error)
	// MultiSchedule reports whether group's calls are spread over the
	// receiving sockets of its receiver group on the other node
	// (multi_schedule).
	MultiSchedule(group string) bool
}

// answerDelegate is the delegate of a pool whose node reroutes nothing: an
// unsent call is answered with what stopped it.
type answerDelegate struct{}

func (answerDelegate) Reroute(c *Call, err error) { c.FailUnsent(err, "") }
func (answerDelegate) MultiSchedule(string) bool  { return false }

// Options configure a Pool.
type Options struct {
	Self    string // this node's id, for the hello
	Key     []byte // cluster_key; nil: none
	Log     *slog.Logger
	Metrics *metrics.Set // tpsched_forwarded_total{to=...}
	// UserTimeout is every peer connection's TCP_USER_TIMEOUT; 0:
	// DefaultUserTimeout. It should fit the failure detector (leave.go).
	UserTimeout time.Duration
}

// Pool is a node's connections to the other nodes (see the package
// comment).
type Pool struct {
	self     string
	key      []byte
	log      *slog.Logger
	metrics  *metrics.Set
	delegate atomic.Pointer[delegateBox]

	userTimeout time.Duration

	mu    sync.Mutex
	peers map[string]*peer // by node id
	gone  map[*peer]bool   // peers of nodes that left or moved, until their lanes and connections end (leave.go)
	wg    sync.WaitGroup   // the lanes
	done  bool

	expiry *pace.Loop // RunExpiry's: fast while the pool has peers, woken by the first
}

type delegateBox struct{ Delegate }

// New makes an empty pool; nothing is dialled until a call or a request
// comes. Its delegate answers what it cannot send until SetDelegate.
func New(opts Options) *Pool {
	if opts.UserTimeout <= 0 {
		opts.UserTimeout = DefaultUserTimeout
	}
	p := &Pool{self: opts.Self, key: opts.Key, log: opts.Log, metrics: opts.Metrics, userTimeout: opts.UserTimeout,
		peers: map[string]*peer{}, gone: map[*peer]bool{}, expiry: pace.New(expireEvery, expireIdle)}
	p.delegate.Store(&delegateBox{answerDelegate{}})
	return p
}

// SetDelegate gives the pool the node's Delegate; before the first Send.
func (p *Pool) SetDelegate(d Delegate) { p.delegate.Store(&delegateBox{d}) }

func (p *Pool) reroute(c *Call, err error) {
	if c.request {
		c.FailUnsent(err, "") // a request goes to its node or nowhere
		return
	}
	p.delegate.Load().Reroute(c, err)
}

func (p *Pool) multiSchedule(group string) bool { return p.delegate.Load().MultiSchedule(group) }

// peerFor returns the peer of node at addr, replacing it if the node
// moved; nil once the pool is closed.
func (p *Pool) peerFor(node, addr string) *peer {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return nil
	}
	pr := p.peers[node]
	if pr != nil && pr.addr == addr {
		return pr
	}
	if pr != nil {
		// Its connections retire with calls on them: gone keeps them
		// in Expire's, TotalInFlight's and Close's sight until they end.
		pr.halt(true)
		p.gone[pr] = true
	}
	pr = &peer{
		pool: p, node: node, addr: addr,
		targets: map[string]*target{},
		routes:  map[string]recvRoute{},
		conns:   map[*netio.MuxConn]bool{},
		stop:    make(chan struct{}),
		sentTo:  p.metrics.GetOrCreateCounter(fmt.Sprintf(`tpsched_forwarded_total{to=%q}`, node)),
	}
	p.peers[node] = pr
	p.expiry.Wake() // never blocks
	return pr
}

// InFlight is this node's calls in flight to node (P2C's second key).
func (p *Pool) InFlight(node string) int {
	p.mu.Lock()
	pr := p.peers[node]
	p.mu.Unlock()
	if pr == nil {
		return 0
	}
	return int(pr.inFlight.Load())
}

// dialFailedUnlessConnected records a lane's failed dial, unless a lane of
// the node has its connection (a receiving address that failed while the
// RPC port's lane serves does not make the node unreachable). The look
// and the store are one step under mu, as serve's count and clear are.
func (pr *peer) dialFailedUnlessConnected() {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	for _, t := range pr.targets {
		if t.serving > 0 {
			return
		}
	}
	pr.dialFailed.Store(time.Now().UnixNano())
}

// unreachableFor is how long a node whose connection could not be made is
// left out of the choice while another node can take its calls: each call
// sent there meanwhile would meet the same error, until the failure
// detector takes the node out of the name table. Past it one call tries
// the node again.
const unreachableFor = time.Second

// Unreachable reports whether the last connection to node could not be
// made, less than unreachableFor ago, and none was made since.
func (p *Pool) Unreachable(node string) bool {
	p.mu.Lock()
	pr := p.peers[node]
	p.mu.Unlock()
	if pr == nil {
		return false
	}
	at := pr.dialFailed.Load()
	return at != 0 && time.Since(time.Unix(0, at)) < unreachableFor
}

// TotalInFlight is every call this node has handed to other nodes and not
// yet answered (requests are not calls: they are not counted).
func (p *Pool) TotalInFlight() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var sum int64
	for _, pr := range p.peers {
		sum += pr.inFlight.Load()
	}
	for pr := range p.gone {
		sum += pr.inFlight.Load()
	}
	return int(sum)
}

// Send hands c to node's peer at addr, or says why it cannot: then c is
// still the caller's. It never blocks.
func (p *Pool) Send(node, addr string, c *Call) (netio.Code, string) {
	// A peer replaced between peerFor and enqueue refuses the call: the
	// next peerFor returns its successor.
	for range 3 {
		pr := p.peerFor(node, addr)
		if pr == nil {
			return netio.CodeNetworkDown, "this node is stopping"
		}
		switch pr.enqueue(c) {
		case enqueued:
			return netio.CodeOK, ""
		case queueFull:
			return netio.CodeServerBusy, "too many calls waiting for node " + node
		}
	}
	return netio.CodeNetworkDown, "node " + node + " keeps changing its address"
}

// Close stops every peer; calls waiting for an answer are answered
// 'network down', queued ones likewise.
func (p *Pool) Close() {
	p.mu.Lock()
	p.done = true
	for _, pr := range p.peers {
		pr.halt(false)
	}
	p.mu.Unlock()
	// Before the lanes are waited for: a lane in a write the other node
	// does not take (bounded by its calls' deadlines) or in a receivers
	// lookup ends now, not at that bound. A stopped peer registers no new
	// connection (serve), so none escapes this.
	p.closeConns()
	p.wg.Wait()
	p.closeConns()
}

// closeConns closes every connection of every peer, answering the calls on
// them 'network down'.
func (p *Pool) closeConns() {
	p.mu.Lock()
	peers := p.allPeersLocked()
	p.mu.Unlock()
	for _, pr := range peers {
		// A copy: a retired connection that ends deletes itself from
		// pr.conns meanwhile, and Close waits for its writer.
		pr.mu.Lock()
		conns := slices.Collect(maps.Keys(pr.conns))
		pr.mu.Unlock()
		for _, mc := range conns {
			mc.Close(fmt.Errorf("connection to node %s closed: this node is stopping", pr.node))
		}
	}
}

// RunExpiry calls Expire until stop is closed: every expireEvery while the
// pool has a peer (its connections may hold calls and requests), every
// expireIdle while it has none, as on a node alone; the first peer wakes
// it.
func (p *Pool) RunExpiry(stop <-chan struct{}) {
	p.expiry.Run(stop, p.Expire, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.peers) > 0 || len(p.gone) > 0
	})
}

// expireEvery bounds how late a transferred call's or a request's timeout
// is answered.
const expireEvery = 50 * time.Millisecond

// expireIdle is how often a pool with no peer looks (a variable for the
// test that makes it an hour).
var expireIdle = time.Second

// Expire answers calls and requests whose deadline passed without an
// answer.
func (p *Pool) Expire(now time.Time) {
	var conns []*netio.MuxConn
	p.mu.Lock()
	p.pruneGoneLocked()
	for _, pr := range p.allPeersLocked() {
		pr.mu.Lock()
		for mc := range pr.conns {
			conns = append(conns, mc)
		}
		pr.mu.Unlock()
	}
	p.mu.Unlock()
	for _, mc := range conns {
		mc.Expire(now)
	}
}

// allPeersLocked is every peer with calls or connections: the nodes' and
// those of nodes that left. p.mu is held.
func (p *Pool) allPeersLocked() []*peer {
	out := make([]*peer, 0, len(p.peers)+len(p.gone))
	for _, pr := range p.peers {
		out = append(out, pr)
	}
	for pr := range p.gone {
		out = append(out, pr)
	}
	return out
}

// peer is the way to one other node.
type peer struct {
	pool *Pool
	node string
	addr string // its RPC port

	inFlight atomic.Int64 // calls queued or sent, not yet answered: P2C's second key
	sentTo   *metrics.Counter
	// dialFailed is when a lane last failed to connect with no lane of
	// the node connected (unix ns; 0: a connection was made since).
	dialFailed atomic.Int64

	mu       sync.Mutex
	stopped  bool // guarded by mu: no call is queued any more
	replaced bool // guarded by mu: stopped because the node moved; queued calls go to its new peer
	left     bool // guarded by mu: stopped because the node left the tables; queued calls are rerouted
	// lanesRunning is the lanes not yet ended; guarded by mu.
	lanesRunning int
	targets      map[string]*target      // guarded by mu: by address
	routes       map[string]recvRoute    // guarded by mu: by service group, where its calls go, once learned
	conns        map[*netio.MuxConn]bool // guarded by mu: every connection with calls on it, for expire
	stop         chan struct{}
}

// recvRoute is where a service group's calls are received on the node.
type recvRoute struct {
	addr  string
	count int // receiving sockets there
}

type enqueueResult int

const (
	enqueued enqueueResult = iota
	queueFull
	peerStopped
)

// count adds delta to the peer's calls in flight; a request is not one.
func (pr *peer) count(c *Call, delta int64) {
	if !c.request {
		pr.inFlight.Add(delta)
	}
}

// enqueue counts c in flight and queues it for the target its group is
// received on, unless the queue is full or the peer stopped.
func (pr *peer) enqueue(c *Call) enqueueResult {
	multi := !c.request && pr.pool.multiSchedule(c.Group)
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.stopped {
		return peerStopped
	}
	t := pr.targetLocked(c, multi)
	if len(t.queue)+t.held >= cap(t.queue) {
		return queueFull
	}
	pr.count(c, 1)
	c.via = pr
	select {
	case t.queue <- c:
		return enqueued
	default:
		pr.count(c, -1)
		return queueFull
	}
}

// targetLocked is the target c goes to: where its group is received, once
// known; else the node's RPC port, with a lookup first when the group
// spreads its calls (multi_schedule) or was sent to the wrong receiver. A
// request goes to the RPC port. pr.mu is held.
func (pr *peer) targetLocked(c *Call, multi bool) *target {
	if c.request {
		return pr.targetAtLocked(pr.addr, c.Group, 1)
	}
	r, known := pr.routes[c.Group]
	if !known || c.lookup {
		c.lookup = c.lookup || multi
		return pr.targetAtLocked(pr.addr, c.Group, 1)
	}
	lanes := 1
	if multi {
		lanes = r.count
	}
	return pr.targetAtLocked(r.addr, c.Group, lanes)
}

// targetAtLocked returns the target at addr with at least lanes lanes,
// starting what is missing, within maxPeerLanes: past it a new address's
// calls go to the node's RPC port, and a target gets no more lanes (the
// addresses and counts are the node's lookup answers). pr.mu is held.
func (pr *peer) targetAtLocked(addr, group string, lanes int) *target {
	t := pr.targets[addr]
	if t == nil {
		if addr != pr.addr && pr.lanesRunning >= maxPeerLanes {
			return pr.targetAtLocked(pr.addr, group, 1)
		}
		t = &target{p: pr, addr: addr, group: group, queue: make(chan *Call, peerQueue), taken: map[int]int{}}
		pr.targets[addr] = t
	}
	for t.lanes < lanes && (t.lanes == 0 || pr.lanesRunning < maxPeerLanes) {
		t.lanes++
		pr.lanesRunning++
		pr.pool.wg.Add(1)
		go t.runLane()
	}
	return t
}

// learned records where group is received on the node.
func (pr *peer) learned(group string, r recvRoute) {
	pr.mu.Lock()
	pr.routes[group] = r
	pr.mu.Unlock()
}

// forgetAddr drops the routes to addr, after it could not be reached: the
// node may have moved the group.
func (pr *peer) forgetAddr(addr string) {
	pr.mu.Lock()
	for g, r := range pr.routes {
		if r.addr == addr {
			delete(pr.routes, g)
		}
	}
	pr.mu.Unlock()
}

// halt stops the peer: it takes no more calls, its lanes answer (or, when
// replaced, hand on) what is queued, and its connections close (or, when
// replaced, retire: they close after their last answer).
func (pr *peer) halt(replaced bool) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.stopped {
		return
	}
	pr.stopped, pr.replaced = true, replaced
	close(pr.stop)
}

// retry sends c elsewhere after a failure to reach this peer. Its count
// here goes once rerouting has answered it or handed it to whatever
// counts it next (the local queue, another peer), so that a drain never
// sees it in neither.
func (pr *peer) retry(c *Call, err error) {
	defer pr.count(c, -1)
	pr.pool.reroute(c, fmt.Errorf("node %s (%s): %w: %v", pr.node, pr.addr, ErrCommunication, err))
}

// handOn deals with a call the stopped peer did not send: handed to the
// node's new peer if this one was replaced, else answered.
func (pr *peer) handOn(c *Call) {
	pr.mu.Lock()
	replaced, left := pr.replaced, pr.left
	pr.mu.Unlock()
	if left {
		// Never sent: it goes to another node free of the retry budget
		// (scd_retry_of_comm_error), as a call routed to a node that left
		// before its transfer does: the node's leaving is not a failure
		// of this call.
		c.Retries++
		pr.retry(c, fmt.Errorf("node %s left the cluster", pr.node))
		return
	}
	defer pr.count(c, -1) // after the answer or the new peer's count: see retry
	if !replaced {
		c.Fail(netio.CodeNetworkDown, "node "+pr.node+": this node is stopping")
		return
	}
	pr.pool.mu.Lock()
	next := pr.pool.peers[pr.node]
	pr.pool.mu.Unlock()
	code, msg := netio.CodeNetworkDown, "node "+pr.node+" moved"
	if next != nil && next != pr {
		code, msg = pr.pool.Send(pr.node, next.addr, c)
	}
	if code != netio.CodeOK {
		c.Fail(code, msg)
	}
}
