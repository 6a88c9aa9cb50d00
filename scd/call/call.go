// Package call is the contract of a call's way through a node: where its
// answer goes (Caller), where it came from (From), and the stages it
// passes, in order, until one takes it (Stage, Line).
//
// A node builds its lines once, at start, from its definitions: a stage
// that is off (no receiver groups, no service policy, no other node) is
// not in the line, so no stage asks whether another exists. A call from a
// client or a peer passes
//
//	draining (scd) -> receiver groups (scd/cluster) -> routing manager
//	(scd/wlmnode) -> other nodes (scd/cluster) -> this node's queue (scd/local)
//
// and a call a UAP makes through its shared memory the same line from the
// routing manager on: a node that drains still takes it (it belongs to a
// call the node is finishing) and it did not come on a receiving socket.
// The last stage, the local scheduler, takes every call that reaches it.
//
// # Usage
//
//	line := call.Line{drain, receivers, manager, router, sched}
//	code, msg := line.Route(conn, call.From{Conn: conn, Peer: hop}, &frame)
//	if code != netio.CodeOK && frame.Kind == netio.KindCall {
//		conn.SendNow(netio.AppendError(nil, frame.ID, code, msg))
//	}
package call

import (
	"time"

	"tpsched/netio"
)

// Caller is where a call's answer goes: the connection it came on (a
// client's or a peer's rpcport.Conn), or the UAP that made it through its
// shared memory (scd/local). Send takes one or more whole answer frames
// (netio.AppendReply, netio.AppendError), each under the id the call came
// with.
//
// The contract, for whoever answers: every call that asked for an answer
// gets exactly one; one that asked for none gets none. For every Caller:
// Send must not block (it runs on gnet event loops and on reply readers)
// and may be called from any goroutine, concurrently, but never with a
// lock of the node held that Send could need; its error says only that the
// answer could not be delivered (the caller went away), and the answerer
// goes on.
type Caller interface {
	Send(b []byte) error
}

// Conn is a connection a call came on, as the stages see it: where its
// answer goes, and the receiver group of the socket it arrived on. The RPC
// port's connection (netio/rpcport) is one; the contract names none.
type Conn interface {
	Caller
	// ReceiverGroup is the receiver group of the socket the connection
	// arrived on; "" for the default group.
	ReceiverGroup() string
}

// From is where a call came from.
type From struct {
	// Conn is the connection the call came on; nil for a call a UAP made
	// through its shared memory.
	Conn Conn
	// Peer is the node that transferred the call here, as the peer hello
	// on its connection proved (scd/peers); "" when the call was not
	// transferred, or its hop mark cannot be trusted.
	Peer string
}

// A Stage is one step of a call's way through a node.
type Stage interface {
	// Route takes the call f from c, or lets it pass to the next stage.
	// handled says it took it: then code is netio.CodeOK when the call
	// was accepted (queued, sent on, parked: its answer comes later to
	// c), or the code and message of the error the caller is to be
	// answered at once (which the line's user sends, not the stage). A
	// stage that lets a call pass has answered nothing and kept nothing.
	//
	// Route runs on a gnet event loop (a client's or a peer's call) or on
	// a reply reader (a UAP's): it must not block. f and its buffers are
	// valid only until Route returns: a stage that keeps the call copies
	// what it keeps.
	Route(c Caller, from From, f *netio.Frame) (handled bool, code netio.Code, msg string)
}

// Line is the stages a call passes, in order. The last stage of a line
// takes every call (scd/local's scheduler).
type Line []Stage

// Route passes f along the line until a stage takes it and returns that
// stage's code and message.
func (l Line) Route(c Caller, from From, f *netio.Frame) (netio.Code, string) {
	for _, s := range l {
		if handled, code, msg := s.Route(c, from, f); handled {
			return code, msg
		}
	}
	return netio.CodeNoSuchGroup, string(f.Group) // a line without its last stage: nothing took it
}

// RoundLimit shows a call's time limit as people set it, for the messages
// of 'timed out' answers: a client adds 1 ms to the time its caller has
// left, so 250 ms arrive as 251.
func RoundLimit(d time.Duration) time.Duration {
	if d >= 50*time.Millisecond {
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}
