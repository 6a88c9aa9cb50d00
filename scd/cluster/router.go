package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/netio"
	"tpsched/netio/rpcport"
	"tpsched/scd/call"
	"tpsched/scd/def"
	"tpsched/scd/loadlevel"
	"tpsched/scd/names"
	"tpsched/scd/peers"
	"tpsched/scd/route"
)

// Local is the node's own groups as the cluster sees them (scd/local's
// Scheduler, through the node). Every method is called on event loops or
// the peer pool's lanes and must not block.
type Local interface {
	// Group is the group named name if it is defined here, with or
	// without a server now.
	Group(name string) (Group, bool)
	// Serve puts a call on this node's queue of its group, or says why
	// not.
	Serve(c call.Caller, f *netio.Frame) (netio.Code, string)
	// UnknownGroup names a group that is not here, with the nearest that
	// is.
	UnknownGroup(name string) string
}

// Group is one group defined on this node.
type Group interface {
	Def() *def.Server
	Held() bool
	// Serving reports whether it takes calls here now (it has a server).
	Serving() bool
	Level() loadlevel.Level
	InFlight() int // calls waiting or held by a process
}

// Options configure a Router.
type Options struct {
	Self    string // this node's id
	Log     *slog.Logger
	Metrics *metrics.Set
	// CounterFunc registers a counter /metrics reads at each scrape.
	CounterFunc func(name string, get func() uint64)
	Local       Local
	Pool        *peers.Pool
	Policy      route.Policy
	// Retries is scd_retry_of_comm_error; WatchTime sysconf's watch_time
	// (a transferred call's deadline when neither the call nor a group
	// here gives one); MultiSchedule usrrc's multi_schedule (for groups
	// this node does not define).
	Retries       int
	WatchTime     time.Duration
	MultiSchedule bool
	// Draining reports whether the node drains: a call that comes back
	// from another node is not served here then.
	Draining func() bool
	// AwaitJoin says the node will Join other nodes: until its table
	// settles, a call for a group no known node runs waits (settle.go)
	// instead of meeting 'no such service group'.
	AwaitJoin bool
	// Steer drops from the candidates of a call the nodes where its
	// group's calls miss their goals (the routing manager); nil: none is
	// dropped. It runs on the event loop.
	Steer func(group string, cands []route.Candidate) []route.Candidate
}

// Router is the node's choice of a node for each call, and its name table.
type Router struct {
	opts  Options
	self  string
	log   *slog.Logger
	names *names.Table
	// gossip is set once the node has joined; the RPC port, the control
	// endpoint and the load checks already run by then.
	gossip atomic.Pointer[names.Gossip]
	pool   *peers.Pool
	policy route.Policy

	candPool sync.Pool // *[]route.Candidate, one per call being routed
	leave    sync.Once

	// lastReceived is when (unix ns) the last transferred call came in: a
	// leaving node serves until the others have stopped sending.
	lastReceived atomic.Int64

	received sync.Map // node -> *metrics.Counter: by member node a call was transferred from
	// receivedOther counts transferred calls from a node that is not a
	// member of the name table: no name becomes a label value unless the
	// node has proved it (hello) and is known (announced).
	receivedOther *metrics.Counter
	// parking holds the calls no known node takes until the table has
	// settled (settle.go); nil for a node that joins no other.
	parking *parking
	// retried counts calls sent on to another node, by why.
	retriedUnreachable, retriedRefused *metrics.Counter
}

// New makes the router of a node before it joins, and makes it its pool's
// Delegate.
func New(opts Options) *Router {
	if opts.Steer == nil {
		opts.Steer = func(_ string, cands []route.Candidate) []route.Candidate { return cands }
	}
	if opts.Draining == nil {
		opts.Draining = func() bool { return false }
	}
	r := &Router{
		opts: opts, self: opts.Self, log: opts.Log,
		names:              names.NewTable(opts.Self),
		pool:               opts.Pool,
		policy:             opts.Policy,
		receivedOther:      opts.Metrics.NewCounter(`tpsched_requests_received_total{from="unknown"}`),
		retriedUnreachable: opts.Metrics.NewCounter(`tpsched_transfer_retries_total{reason="unreachable"}`),
		retriedRefused:     opts.Metrics.NewCounter(`tpsched_transfer_retries_total{reason="refused"}`),
	}
	if opts.AwaitJoin {
		r.parking = newParking()
	}
	r.candPool.New = func() any { s := make([]route.Candidate, 0, 8); return &s }
	opts.Pool.SetDelegate(r)
	return r
}

// Names is the name table (read only: the gossip writes it).
func (r *Router) Names() *names.Table { return r.names }

// globalRand is math/rand/v2's goroutine-safe source as a route.Rand.
type globalRand struct{}

func (globalRand) IntN(n int) int { return rand.IntN(n) }

// serving is the group named name if it takes calls here now; nil when it
// is not defined here or has no server here.
func (r *Router) serving(name string) Group {
	if g, ok := r.opts.Local.Group(name); ok && g.Serving() {
		return g
	}
	return nil
}

// candidates appends the nodes that can take a call for group: the others
// that run it and are not held, and this node when lg (the group here, if
// it takes calls) says so.
//
// A node the pool could not connect to a moment ago (peers'
// Unreachable) is left out while another candidate remains, or orHere
// (this node takes the call if no other does: a balanced call, whose
// candidates are the others only): every call sent there would meet the
// same error (with scd_retry_of_comm_error 0, the default, as its answer)
// until the failure detector takes the node out of the table. With
// nowhere else to go, it stays, and the call tries it.
func (r *Router) candidates(dst []route.Candidate, group string, lg Group, tried []string, orHere bool) []route.Candidate {
	first := len(dst)
	for _, e := range r.names.Lookup(group) {
		if e.Local || e.Held || contains(tried, e.Node) {
			continue
		}
		dst = append(dst, route.Candidate{Node: e.Node, Level: e.Level, InFlight: r.pool.InFlight(e.Node)})
	}
	if lg != nil && !lg.Held() && lg.Serving() && !contains(tried, r.self) {
		dst = append(dst, route.Candidate{Node: r.self, Local: true, Level: lg.Level(), InFlight: lg.InFlight()})
	}
	reachable := dst[:first]
	for _, c := range dst[first:] {
		if c.Local || !r.pool.Unreachable(c.Node) {
			reachable = append(reachable, c) // never ahead of the reading: in place
		}
	}
	if len(reachable) > first || orHere {
		return reachable
	}
	return dst
}

// socketGroup reports whether group receives from a socket (routed at
// random, no status check): as defined here, or as its nodes announce.
func (r *Router) socketGroup(group string, lg Group) bool {
	if lg != nil {
		return lg.Def().ReceiveFrom == def.ReceiveSocket
	}
	entries := r.names.Lookup(group)
	return len(entries) > 0 && entries[0].Socket
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Route is the router as a stage of the node's line: it transfers the
// call to another node when the node choice says so (handled, with the
// pool's or the next node's refusal if any), and lets it pass to be
// served here otherwise. A call a node transferred here (from.Peer) is
// never transferred again, nor one that names this node.
func (r *Router) Route(c call.Caller, from call.From, f *netio.Frame) (handled bool, code netio.Code, msg string) {
	return r.route(c, from, f, true)
}

// route is Route; mayPark says whether a call no known node takes may
// wait for the table to settle (settle.go), which a call that waited
// already may not.
func (r *Router) route(c call.Caller, from call.From, f *netio.Frame, mayPark bool) (handled bool, code netio.Code, msg string) {
	if from.Peer != "" {
		r.countReceived(from.Peer)
		return false, 0, "" // the hop mark: served here or refused, never transferred again
	}
	if f.Flags&netio.FlagDestination != 0 {
		return false, 0, "" // the caller named this node: served here or refused
	}
	// Read before the table: a table that settles after its read has not
	// been seen settled.
	settled := !mayPark || r.parking.isSettled()
	group := string(f.Group)
	g := r.serving(group)
	socket := r.socketGroup(group, g)
	buf := r.candPool.Get().(*[]route.Candidate)
	defer r.candPool.Put(buf)
	var cands []route.Candidate
	balanced := g != nil && f.Flags&netio.FlagBalanced != 0
	if balanced {
		// The sender chose this node: stay unless held, or LEVEL2 while
		// another node is lower.
		cands = r.candidates((*buf)[:0], group, nil, nil, !g.Held())
		if !route.Transfer(g.Held(), g.Level(), cands, r.policy) {
			return false, 0, ""
		}
	} else {
		cands = r.candidates((*buf)[:0], group, g, nil, false)
	}
	cands = r.opts.Steer(group, cands)
	*buf = cands
	direct := !balanced && schedulerDirect(from, f)
	i := route.Choose(cands, r.policy, route.Request{Direct: direct, Socket: socket}, globalRand{})
	if i < 0 {
		// Without this, a group held on the only nodes that run it passes
		// to this node's queue, which knows no such group and says so:
		// the caller read 'no such service group' for a hold (issue 31).
		if msg, ok := r.heldElsewhere(group, g); ok {
			return true, netio.CodeServiceClosed, msg
		}
		if !settled {
			if r.parkCall(c, from, f, r.deadline(f, g, time.Now())) {
				return true, netio.CodeOK, ""
			}
			if r.parking.isSettled() {
				// It settled since the table was read: the table may
				// name a node now.
				return r.route(c, from, f, false)
			}
		}
		if _, defined := r.opts.Local.Group(group); !defined && r.parking.cutShort() {
			return true, netio.CodeShuttingDown, notLearned(group)
		}
		return false, 0, ""
	}
	if cands[i].Local {
		return false, 0, ""
	}
	entries := r.names.Lookup(group)
	fc := &peers.Call{
		Caller: c, CallerID: f.ID, Kind: f.Kind,
		Group: group, Service: string(f.Service), Payload: append([]byte(nil), f.Payload...),
		TimeoutMs: f.TimeoutMs, Start: time.Now(),
		Retries: route.Retries(r.opts.Retries, len(entries)), Direct: direct,
	}
	fc.Deadline = r.deadline(f, g, fc.Start)
	code, msg = r.transfer(fc, cands[i].Node)
	return true, code, msg
}

// deadline is when a call that came at start must be answered: its own
// timeout, else its group's watch_time here (g, when it has a server
// here), else sysconf's; zero for none.
func (r *Router) deadline(f *netio.Frame, g Group, start time.Time) time.Time {
	switch {
	case f.TimeoutMs > 0:
		return start.Add(time.Duration(f.TimeoutMs) * time.Millisecond)
	case g != nil && g.Def().WatchTime > 0:
		return start.Add(g.Def().WatchTime)
	case r.opts.WatchTime > 0:
		return start.Add(r.opts.WatchTime)
	}
	return time.Time{}
}

// heldElsewhere says where group is held when no node takes its calls and
// another node holds it ("work is held on n2"); ok is false when some node
// runs it unheld (the call may be refused for another reason here), or no
// other node holds it (this node's own answer is then the right one). lg
// is the group here when it has a server here.
func (r *Router) heldElsewhere(group string, lg Group) (msg string, ok bool) {
	var held []string
	for _, e := range r.names.Lookup(group) {
		if e.Local {
			continue
		}
		if !e.Held {
			return "", false
		}
		held = append(held, e.Node)
	}
	if len(held) == 0 {
		return "", false
	}
	if lg != nil {
		if !lg.Held() {
			return "", false
		}
		held = append(held, r.self)
	}
	slices.Sort(held)
	return group + " is held on " + strings.Join(held, ", ") + " (scdctl release " + group + " there)", true
}

// schedulerDirect reports whether f is a scheduler-direct request, the
// only kind schedule_rate weighs (000: "valid only when you specify Y for
// the DCSCDDIRECT operand in the client environment definition of
// TP1/Client"): a client's call marked so (dcscddirect = Y). A call a UAP
// makes (no connection: it came through its shared memory) is a server's
// request, and a client's call without the mark is not scheduler-direct
// either: Table 3-7 sends both to the least-loaded node.
func schedulerDirect(from call.From, f *netio.Frame) bool {
	return from.Conn != nil && f.Flags&netio.FlagSchedulerDirect != 0
}

// transfer hands fc to node.
func (r *Router) transfer(fc *peers.Call, node string) (netio.Code, string) {
	info, ok := r.names.Get(node)
	if !ok {
		// The node left between the choice and now; the call has not left
		// this node, so it is chosen for again, free of the retry budget.
		fc.Tried = append(fc.Tried, node)
		fc.Retries++
		r.Reroute(fc, fmt.Errorf("node %s left: %w", node, peers.ErrCommunication))
		return netio.CodeOK, ""
	}
	fc.Tried = append(fc.Tried, node)
	return r.pool.Send(node, info.Addr, fc)
}

// Reroute is the pool's way back (peers.Delegate) after a node could not
// be reached, or refused a call before running it: up to
// scd_retry_of_comm_error other nodes, this one included, are tried. When
// none is left the caller gets the refusal, or 'network down'. A call
// whose deadline passed (it waited in a peer's queue while a lane dialled)
// is answered 'timed out' and sent nowhere; one still in time is sent on
// with the time it has left, never a fresh budget.
func (r *Router) Reroute(fc *peers.Call, err error) {
	timeout, inTime := fc.TimeLeft(time.Now())
	if !inTime {
		fc.FailLate("before a node took it (" + err.Error() + ")")
		return
	}
	if fc.Retries <= 0 || r.opts.Draining() {
		fc.FailUnsent(err, "")
		return
	}
	g, _ := r.opts.Local.Group(fc.Group)
	cands := r.candidates(nil, fc.Group, g, fc.Tried, false)
	i := route.Choose(cands, r.policy, route.Request{Direct: fc.Direct, Retry: true,
		Socket: r.socketGroup(fc.Group, g)}, globalRand{})
	if i < 0 {
		fc.FailUnsent(err, "; no other node runs "+fc.Group)
		return
	}
	fc.Retries--
	if errors.As(err, new(*peers.Refusal)) {
		r.retriedRefused.Inc()
	} else {
		r.retriedUnreachable.Inc()
	}
	if cands[i].Local {
		f := netio.Frame{
			Header:  netio.Header{Kind: fc.Kind, ID: fc.CallerID, TimeoutMs: timeout},
			Group:   []byte(fc.Group),
			Service: []byte(fc.Service),
			Payload: fc.Payload,
		}
		if code, msg := r.opts.Local.Serve(fc.Caller, &f); code != netio.CodeOK {
			fc.Fail(code, msg)
		}
		return
	}
	if code, msg := r.transfer(fc, cands[i].Node); code != netio.CodeOK {
		fc.Fail(code, msg)
	}
}

// MultiSchedule reports whether this node spreads the calls it transfers
// for group over the receivers of the group's receiver group on the other
// node (peers.Delegate): the group's multi_schedule here, or usrrc's for a
// group this node does not define.
func (r *Router) MultiSchedule(group string) bool {
	if g, ok := r.opts.Local.Group(group); ok {
		return g.Def().MultiSchedule
	}
	return r.opts.MultiSchedule
}

// countReceived counts a call transferred here by node: under its name
// once it is a member of the name table, else under "unknown". A node's
// counter is made once, so the table is asked only until it is known.
func (r *Router) countReceived(node string) {
	r.lastReceived.Store(time.Now().UnixNano())
	if c, ok := r.received.Load(node); ok {
		c.(*metrics.Counter).Inc()
		return
	}
	if _, member := r.names.Get(node); !member || node == r.self {
		r.receivedOther.Inc()
		return
	}
	c, _ := r.received.LoadOrStore(node, r.opts.Metrics.GetOrCreateCounter(fmt.Sprintf(`tpsched_requests_received_total{from=%q}`, node)))
	c.(*metrics.Counter).Inc()
}

// AnswerLookup tells a balancing client which nodes run a group, with
// their levels, from the name table. It runs on the event loop.
func (r *Router) AnswerLookup(c *rpcport.Conn, f *netio.Frame) {
	group := string(f.Group)
	settled := r.parking.isSettled() // before the table, as in route
	entries := r.names.Lookup(group)
	if !settled && len(entries) == 0 { // known and held is an answer already
		if r.parkLookup(c, f) {
			return
		}
		entries = r.names.Lookup(group) // it may have settled since the table was read
	}
	c.SendNow(r.lookupAnswerFrom(f.ID, group, entries))
}

// lookupAnswerFrom is the answer to lookup id for group from its table
// entries; none, after the node stopped learning the table before it
// settled, is the stop's refusal (parking.cutShort), as for a call.
func (r *Router) lookupAnswerFrom(id uint64, group string, entries []names.Entry) []byte {
	if len(entries) == 0 && r.parking.cutShort() {
		return netio.AppendError(nil, id, netio.CodeShuttingDown, notLearned(group))
	}
	return lookupAnswer(id, group, lookupNodes(entries))
}

// notLearned is the refusal of a call or lookup for a group no known node
// runs, by a node that stopped learning the table before it settled.
func notLearned(group string) string {
	return "this node stopped learning which nodes run " + group + " (a stop or a restart) before it knew: call again"
}

// lookupNodes are the nodes of a group's table entries that take its
// calls now.
func lookupNodes(entries []names.Entry) []netio.NodeLevel {
	var nodes []netio.NodeLevel
	for _, e := range entries {
		if !e.Held {
			nodes = append(nodes, netio.NodeLevel{Addr: e.Addr, Level: uint8(e.Level)})
		}
	}
	return nodes
}

// AnswerLookupAlone is AnswerLookup for a node whose all_node names no
// other node: this node, if it serves the group.
func AnswerLookupAlone(c *rpcport.Conn, f *netio.Frame, local Local, self string) {
	var nodes []netio.NodeLevel
	if g, ok := local.Group(string(f.Group)); ok && !g.Held() && g.Serving() {
		nodes = append(nodes, netio.NodeLevel{Addr: AdvertisedAddr(c.Port(), self), Level: uint8(g.Level())})
	}
	c.SendNow(lookupAnswer(f.ID, string(f.Group), nodes))
}

// lookupAnswer is the answer frame to lookup id for group.
func lookupAnswer(id uint64, group string, nodes []netio.NodeLevel) []byte {
	if len(nodes) == 0 {
		return netio.AppendError(nil, id, netio.CodeNoSuchGroup, group+": no node serves it now")
	}
	return netio.AppendFrame(nil, netio.Header{Kind: netio.KindReply, ID: id}, "", "", netio.AppendLookupAnswer(nil, nodes))
}

// AdvertisedAddr is the address other nodes and clients reach port p of
// node self on: the port's own, or the node id for its host when it
// listens on every address (the node id is the best name there is). ""
// for no port.
func AdvertisedAddr(p *rpcport.Port, self string) string {
	if p == nil {
		return ""
	}
	host, port, _ := net.SplitHostPort(p.Addr())
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = self
	}
	return net.JoinHostPort(host, port)
}
