package peers

import (
	"errors"
	"fmt"
	"time"

	"tpsched/netio"
	"tpsched/scd/call"
)

// Call is one call on its way to another node.
type Call struct {
	Caller    call.Caller // where its answer goes
	CallerID  uint64      // the id it came with: its answer goes under it
	Kind      netio.Kind  // call, call-no-reply (or a name lookup: a Request)
	Group     string
	Service   string
	Payload   []byte // the call's own copy: the frame's buffer belongs to the event loop
	TimeoutMs uint32
	Deadline  time.Time // zero: none
	Start     time.Time
	Tried     []string // nodes tried, for a retry after a communication error
	Retries   int      // retries left (scd_retry_of_comm_error)
	// Direct: a scheduler-direct call (dcscddirect client), which
	// schedule_rate weighs when it is sent on as when it was first routed.
	Direct bool

	via       *peer // the peer it was last handed to
	lookup    bool  // ask the node where the group is received before sending it
	redirects int   // 'wrong receiver' answers met
	request   bool  // a Request: to this node only, never rerouted, not counted in flight
}

// ErrCommunication is a failure to reach a node, or a refusal from a node
// that certainly did not run the call: the call can go elsewhere.
var ErrCommunication = errors.New("communication error")

// Refusal is a node's answer that says the call did not run there; it
// wraps ErrCommunication.
type Refusal struct {
	Node string
	Code netio.Code
	Msg  string
}

func (r *Refusal) Error() string {
	return fmt.Sprintf("node %s refused the call (%v: %s): %v", r.Node, r.Code, r.Msg, ErrCommunication)
}

func (r *Refusal) Unwrap() error { return ErrCommunication }

// RefusedBeforeRunning reports whether an error code from another node
// certainly means the call never ran there, because of the node's state
// rather than the call's: it stops, the group is held or gone there, or
// its queue is full. Such a call is retried elsewhere like a communication
// error (scd_retry_of_comm_error).
func RefusedBeforeRunning(code netio.Code) bool {
	switch code {
	case netio.CodeShuttingDown, netio.CodeServiceClosed, netio.CodeNoSuchGroup, netio.CodeServerBusy:
		return true
	}
	return false
}

// TimeLeft is what a call may still be given when it is sent on (to a
// node's queue or another node): the milliseconds until its deadline, at
// least 1, or its TimeoutMs when it has no deadline. ok is false once the
// deadline has passed: its caller has been told, or is about to be told,
// 'timed out', so the call must not be sent anywhere (it would run after
// that), and is answered 'timed out' instead. A call that waited (in a
// peer's queue while a lane dialled, before a reroute, parked for a
// server) never gets a fresh budget.
func (c *Call) TimeLeft(now time.Time) (ms uint32, ok bool) {
	if c.Deadline.IsZero() {
		return c.TimeoutMs, true
	}
	left := c.Deadline.Sub(now)
	if left <= 0 {
		return 0, false
	}
	return uint32(min(max(left.Milliseconds(), 1), 1<<32-1)), true
}

// FailLate answers 'timed out' to a call whose deadline passed before any
// node took it (TimeLeft said so); where names the stage it waited in.
func (c *Call) FailLate(where string) {
	c.Fail(netio.CodeTimedOut, fmt.Sprintf("its deadline (%v) passed %s", call.RoundLimit(c.Deadline.Sub(c.Start)), where))
}

// wantsAnswer reports whether somebody waits for the call's answer.
func (c *Call) wantsAnswer() bool { return c.Kind != netio.KindCallNoReply }

// Fail answers the call's caller with an error, unless it asked for no
// answer.
func (c *Call) Fail(code netio.Code, msg string) {
	if c.wantsAnswer() {
		_ = c.Caller.Send(netio.AppendError(nil, c.CallerID, code, msg))
	}
}

// FailUnsent answers a call no node took after err: with the refusal it
// met, or 'network down' (err, then more).
func (c *Call) FailUnsent(err error, more string) {
	var r *Refusal
	if errors.As(err, &r) {
		c.Fail(r.Code, r.Msg)
		return
	}
	c.Fail(netio.CodeNetworkDown, err.Error()+more)
}

// Answer takes the answer to a sent call from its connection (it is the
// call's netio.Answerer) and passes it to the caller under the caller's
// id; a refusal before running goes to the Delegate's Reroute instead, and
// a 'wrong receiver' back to the peer, which asks where the group is
// received. A request's answer always goes to its caller. A frame that is
// neither a reply nor an error is no answer: its connection closes
// (netio.MuxConn), and the calls on it get 'protocol error'.
func (c *Call) Answer(f netio.Frame, err error) {
	p := c.via
	// Counted until its answer is written (or it is sent on): a drain
	// that sees no call in flight closes the RPC port.
	defer p.count(c, -1)
	switch {
	case errors.Is(err, netio.ErrCallExpired) && c.request:
		c.Fail(netio.CodeTimedOut, fmt.Sprintf("node %s did not answer %s in time", p.node, c.Service))
	case errors.Is(err, netio.ErrCallExpired):
		c.Fail(netio.CodeTimedOut, fmt.Sprintf("no answer from node %s within %v", p.node, call.RoundLimit(c.Deadline.Sub(c.Start))))
	case errors.Is(err, netio.ErrBadKind):
		// The node sent a frame that is no answer (or of no kind), which
		// closed the connection (not retried: the call may have run there).
		c.Fail(netio.CodeProtocol, fmt.Sprintf("node %s broke the protocol: %v", p.node, err))
	case err != nil:
		// Not retried: the other node may have run it.
		c.Fail(netio.CodeNetworkDown, "connection to node "+p.node+" lost")
	case c.request || f.Kind == netio.KindReply:
		c.pass(f)
	case f.Code == netio.CodeWrongReceiver && c.redirects < maxRedirects:
		// It did not run: ask where the group is received, then send it there.
		c.redirects++
		c.lookup = true
		if p.enqueue(c) != enqueued {
			p.pool.reroute(c, &Refusal{Node: p.node, Code: f.Code, Msg: string(f.Payload)})
		}
	case RefusedBeforeRunning(f.Code):
		p.pool.reroute(c, &Refusal{Node: p.node, Code: f.Code, Msg: string(f.Payload)})
	default:
		c.pass(f)
	}
}

// pass gives the caller the node's answer under the caller's id.
func (c *Call) pass(f netio.Frame) {
	_ = c.Caller.Send(netio.AppendFrame(nil, netio.Header{Kind: f.Kind, Code: f.Code, ID: c.CallerID}, "", "", f.Payload))
}
