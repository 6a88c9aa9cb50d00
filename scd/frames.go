package scd

// This file is the node's side of the RPC port: each frame a receiving
// socket reads goes to OnFrame, on the socket's event loop. A call (kind
// call or call-no-reply) goes along the node's line of stages (package
// call); every other frame is a control frame and goes to the handler of
// its kind, and a name lookup to the handler of its service. Both are
// built once, in New, from the definitions.

import (
	"sync"

	"tpsched/netio"
	"tpsched/netio/rpcport"
	"tpsched/scd/call"
	"tpsched/scd/peers"
	"tpsched/scd/wlmnode"
)

// frameHandler answers one control frame on the event loop: it must not
// block, and f and its buffers are valid only until it returns (what it
// keeps, it copies).
type frameHandler func(c *rpcport.Conn, f *netio.Frame)

// controlFrames are the handlers of the frames that are not calls, by kind
// and, for a name lookup, by service.
type controlFrames struct {
	byKind  map[netio.Kind]frameHandler
	lookups map[string]frameHandler // by the lookup's service
	lookup  frameHandler            // a lookup of any other service: where a group is served
	refuse  frameHandler            // any other kind
}

func (t *controlFrames) answer(c *rpcport.Conn, f *netio.Frame) {
	h := t.byKind[f.Kind]
	if f.Kind == netio.KindNameLookup {
		if h = t.lookups[string(f.Service)]; h == nil {
			h = t.lookup
		}
	}
	if h == nil {
		h = t.refuse
	}
	h(c, f)
}

// OnFrame takes one frame off a receiving socket. It runs on a gnet event
// loop and must not block: checks, one enqueue, and an immediate answer
// when the call is refused.
func (n *Node) OnFrame(c *rpcport.Conn, f netio.Frame) {
	// The stages and handlers are interfaces and func values: a pointer to
	// f would make the compiler move f to the heap on every frame. The
	// frame goes in a pooled one instead, which nothing keeps past the
	// call (call.Stage's contract, frameHandler's).
	fp := framePool.Get().(*netio.Frame)
	*fp = f
	n.onFrame(c, fp)
	*fp = netio.Frame{}
	framePool.Put(fp)
}

var framePool = sync.Pool{New: func() any { return new(netio.Frame) }}

func (n *Node) onFrame(c *rpcport.Conn, f *netio.Frame) {
	if f.Kind != netio.KindCall && f.Kind != netio.KindCallNoReply {
		n.control.answer(c, f)
		return
	}
	code, msg := n.line.Route(c, call.From{Conn: c, Peer: peers.Hop(c, f)}, f)
	if code != netio.CodeOK && f.Kind == netio.KindCall {
		c.SendNow(netio.AppendError(nil, f.ID, code, msg))
	}
}

// buildFrames makes the node's lines and control table from what it has:
// a stage or a handler of a part the node does not run is not there.
func (n *Node) buildFrames() {
	var uap call.Line
	if n.wlm != nil {
		uap = append(uap, n.wlm)
	}
	if n.inCluster {
		uap = append(uap, n.router)
	}
	uap = append(uap, n.local)
	n.uapLine = uap
	line := call.Line{drainStage{n}}
	if len(n.cfg.Sched.ReceiverGroups) > 0 {
		line = append(line, n.receivers)
	}
	n.line = append(line, uap...)

	t := controlFrames{
		byKind:  map[netio.Kind]frameHandler{netio.KindAnnounce: n.hello.Accept},
		lookups: map[string]frameHandler{netio.LookupReceivers: n.receivers.Answer},
		lookup:  n.answerLookup,
		refuse: func(c *rpcport.Conn, f *netio.Frame) {
			n.badRequests.Inc()
			c.Refuse(netio.AppendError(nil, f.ID, netio.CodeProtocol, "a node takes calls, not "+f.Kind.String()))
		},
	}
	if n.wlm != nil {
		t.lookups[netio.LookupFind] = n.wlm.AnswerFind
		for _, s := range wlmnode.Requests {
			t.lookups[s] = n.wlm.ServeRequest
		}
	}
	n.control = t
}

// drainStage refuses every call while the node drains.
type drainStage struct{ n *Node }

func (s drainStage) Route(call.Caller, call.From, *netio.Frame) (bool, netio.Code, string) {
	if s.n.draining.Load() {
		return true, netio.CodeShuttingDown, ""
	}
	return false, 0, ""
}
