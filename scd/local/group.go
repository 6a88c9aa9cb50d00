package local

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/bpf"
	"tpsched/netio"
	"tpsched/scd/call"
	"tpsched/scd/def"
	"tpsched/scd/loadlevel"
	"tpsched/scd/schedq"
	"tpsched/scd/wlm"
)

// Group is one service group on this node: its schedule queue (calls
// waiting and held, scd/schedq), the transport to its processes (shared
// memory, or a socket for receive_from = socket) and the user server whose
// processes serve it. Its procmgr Delegate is delegate.go's; its reply
// reader is reader.go's.
//
// mu orders everything the queue and the transport see: an enqueue from an
// event loop, a completion or an attach seen by the reply reader, a
// process's exit, an expiry. A call is handed to a process under mu, so no
// event can come between the queue's decision and the process's area.
// procmgr is never called with mu held (it calls back into the group).
type Group struct {
	name    string
	def     def.Server
	entries map[string]string // service name -> entry name (interned)
	procs   processes
	server  *server // the server's lifecycle on a node with a service policy (server.go); nil otherwise
	held    atomic.Bool
	serving atomic.Bool           // it takes calls here: always, but for a server the routing manager stopped or has not started
	closed  atomic.Bool           // the node is stopping: the processes were told to leave
	failing atomic.Pointer[error] // the server's processes die before they attach
	log     logger
	tr      transport
	watch   time.Duration
	workDir string // its processes' working directory (uapdir.go)
	place   func(c call.Caller, f *netio.Frame) (netio.Code, string) // where its processes' own calls go
	rd      reader

	mu      sync.Mutex
	q       *schedq.Queue[*request]
	slots   []slotState
	late    []*request                // Expire's, reused
	actions []schedq.Action[*request] // the queue's, reused
	exits   []schedq.ExitedCall[*request]

	// classes are the service policy's classes of the group's calls and
	// their figures (wlm.NoClasses without a policy): set by the routing
	// manager, recorded into under mu.
	classes atomic.Pointer[wlm.Classes]

	load groupLoad

	refused    *metrics.Counter // calls refused server busy: the queue was full
	timedOut   *metrics.Counter
	terminated *metrics.Counter
	misbehaved *metrics.Counter  // processes killed for breaking the protocol
	localCalls *metrics.Counter  // calls its processes made through shared memory
	stalls     *metrics.Counter  // checkStall's warnings
	latency    *latencyHistogram // tpsched_request_duration_seconds, readable for /status

	// checkStall's episode, on the expiry loop only.
	stallSince  time.Time
	stallWarned bool
}

// logger is what a group logs through (the node's slog.Logger).
type logger interface {
	Warn(msg string, args ...any)
	Error(msg string, args ...any)
}

// slotState is what the node knows of the process in one slot.
type slotState struct {
	p        proc   // its transport end; nil: no process
	attached bool   // it attached and serves
	served   uint64 // calls it completed
	events   uint64 // attaches and completions: what may ring its doorbell
	warned   bool   // its missing entries were logged
	// killed: it broke the protocol and was killed; nothing more is read
	// from it (and logged) until it is reaped, however often it rings.
	killed bool

	// since is its last attach or completion: when its next call's
	// service began (the routing manager's service time).
	since time.Time
}

// request is one call from its admission to its answer and the end of its
// process's work on it.
type request struct {
	to         call.Caller
	id         uint64
	start      time.Time
	deadline   int64 // unix ns; 0: wait for ever
	noReply    bool
	entry      string
	req        []byte // the request until a process has it: the frame's during submit, else payload
	payload    []byte // the call's own copy of its request, made when it has to wait
	dispatched bool   // handed to a process (the queue holds it until its completion or exit)
	class      uint16 // its service class (wlm.Classes)
}

var requestPool = sync.Pool{New: func() any { return new(request) }}

// maxPooledPayload keeps a huge request's copy from living on in the pool.
const maxPooledPayload = 64 << 10

func freeRequest(cl *request) {
	p := cl.payload[:0]
	if cap(p) > maxPooledPayload {
		p = nil
	}
	*cl = request{payload: p}
	requestPool.Put(cl)
}

// submit admits a call: handed to a ready process at once, or waiting in
// the queue, or refused. It runs on an event loop and never blocks.
func (g *Group) submit(c call.Caller, f *netio.Frame, entry string, now time.Time) (netio.Code, string) {
	if err := g.failing.Load(); err != nil {
		return netio.CodeServerTerminated, (*err).Error()
	}
	cl := requestPool.Get().(*request)
	cl.to, cl.id, cl.start, cl.noReply, cl.entry = c, f.ID, now, f.Kind == netio.KindCallNoReply, entry
	timeout := g.watch
	if f.TimeoutMs > 0 {
		timeout = time.Duration(f.TimeoutMs) * time.Millisecond
	}
	if timeout > 0 {
		cl.deadline = now.Add(timeout).UnixNano()
	}
	cl.class = g.classes.Load().Of(f.Service)
	cl.req = f.Payload // the frame's, valid until submit returns
	g.mu.Lock()
	if err := g.q.Submit(cl, cl.deadline); err != nil {
		g.mu.Unlock()
		freeRequest(cl)
		if errors.Is(err, schedq.ErrFull) {
			g.refused.Inc()
			return netio.CodeServerBusy, fmt.Sprintf("schedule queue of %s is full (queue_size %d)", g.name, g.def.QueueSize)
		}
		return netio.CodeShuttingDown, ""
	}
	g.act()
	if cl.req != nil { // it waits in the queue: keep a copy of the request
		cl.payload = append(cl.payload[:0], cl.req...)
		cl.req = cl.payload
	}
	waiting := g.q.Waiting()
	g.mu.Unlock()
	g.procs.Kick(waiting)
	return netio.CodeOK, ""
}

// act carries out what the queue decided: calls handed to processes, and
// prefetched calls asked back (which may decide more). Under mu.
func (g *Group) act() {
	for {
		g.actions = g.q.TakeActions(g.actions[:0])
		if len(g.actions) == 0 {
			return
		}
		for _, a := range g.actions {
			p := g.slots[a.Slot].p
			switch a.Kind {
			case schedq.Hand:
				cl := a.Call
				if err := p.Dispatch(cl.entry, cl.req, cl.deadline); err != nil {
					// Sizes were checked on admission: a bug, not an input.
					g.log.Error("handing a call to a process failed", "group", g.name, "slot", a.Slot, "err", err)
				}
				cl.req = nil // in the process's buffer now
				cl.dispatched = true
				p.Wake()
			case schedq.Revoke:
				req, ok := p.Revoke()
				if !ok {
					g.q.NotRevoked(a.Slot)
					continue
				}
				cl, free := g.q.Revoked(a.Slot)
				if free {
					freeRequest(cl)
					continue
				}
				// Its request is only in the mailbox the process never
				// took: copy it out before the mailbox is used again.
				cl.payload = append(cl.payload[:0], req...)
				cl.req, cl.dispatched = cl.payload, false
			}
		}
		clear(g.actions)
	}
}

// fail sends an error answer to the call's caller unless it asked for none.
func (cl *request) fail(code netio.Code, msg string) {
	if !cl.noReply {
		_ = cl.to.Send(netio.AppendError(nil, cl.id, code, msg))
	}
}

// expire answers 'timed out' to every caller whose deadline has passed. A
// waiting call leaves the queue; one a process holds stays held (its
// completion is dropped) until the process finishes or dies.
func (g *Group) expire(now time.Time) {
	g.mu.Lock()
	late := g.q.Expire(now.UnixNano(), g.late[:0])
	type answer struct {
		to      call.Caller
		id      uint64
		noReply bool
		limit   time.Duration
	}
	out := make([]answer, 0, len(late))
	classes := g.classes.Load()
	for _, cl := range late {
		out = append(out, answer{cl.to, cl.id, cl.noReply, time.Duration(cl.deadline - cl.start.UnixNano())})
		since := now // it never reached a process: all of it was queue time
		if cl.dispatched {
			since = cl.start
		}
		classes.Record(cl.class, cl.start, since, now)
		if !cl.dispatched {
			freeRequest(cl) // it left the queue; nothing refers to it now
		}
	}
	clear(late)
	g.late = late[:0]
	g.mu.Unlock()
	for _, a := range out {
		g.timedOut.Inc()
		if !a.noReply {
			_ = a.to.Send(netio.AppendError(nil, a.id, netio.CodeTimedOut, timedOutMessage(a.limit, g.watch)))
		}
	}
}

// close refuses new calls; the processes leave once they hold none.
func (g *Group) close() {
	g.mu.Lock()
	g.q.Close()
	g.closed.Store(true)
	g.tr.Close()
	g.mu.Unlock()
}

// flush answers the calls still waiting when the node gives up on them.
func (g *Group) flush(code netio.Code, msg string) {
	g.mu.Lock()
	left := g.q.Flush(nil)
	g.mu.Unlock()
	for _, cl := range left {
		cl.fail(code, msg)
		freeRequest(cl)
	}
}

// admit puts a call on the group's queue, or says why not: an unknown
// service, a group held or without a server here, a request too big, a
// server whose processes cannot start, a full queue.
func (g *Group) admit(c call.Caller, f *netio.Frame, node string) (netio.Code, string) {
	entry, ok := g.entries[string(f.Service)]
	if !ok {
		return netio.CodeNoSuchService, g.name + "/" + unknown(string(f.Service), func() []string { return serviceNames(g) })
	}
	if g.held.Load() {
		return netio.CodeServiceClosed, g.name + " is held"
	}
	if !g.serving.Load() {
		return netio.CodeServiceClosed, g.name + " has no server on node " + node
	}
	if len(f.Payload) > g.def.MaxMessageSize {
		return netio.CodeMessageTooBig, fmt.Sprintf("%d bytes, max_message_size %d", len(f.Payload), g.def.MaxMessageSize)
	}
	return g.submit(c, f, entry, time.Now())
}

func serviceNames(g *Group) []string {
	out := make([]string, 0, len(g.def.Services))
	for _, s := range g.def.Services {
		out = append(out, s.Name)
	}
	return out
}

// Name is the service group's name.
func (g *Group) Name() string { return g.name }

// Def is the user server's definition (its usr file); never modified.
func (g *Group) Def() *def.Server { return &g.def }

// Held reports whether the group is held (scdctl hold): it takes no call.
func (g *Group) Held() bool { return g.held.Load() }

// Serving reports whether the group takes calls here: always, but on a
// node with a service policy while its server is stopped or not started
// (server.go).
func (g *Group) Serving() bool { return g.serving.Load() }

// Level is the group's load level after its last load check.
func (g *Group) Level() loadlevel.Level { return g.load.level() }

// Failure is why the server's processes cannot start now (they die
// before they attach); nil when they can.
func (g *Group) Failure() error {
	if err := g.failing.Load(); err != nil {
		return *err
	}
	return nil
}

// InFlight counts calls waiting or held by a process.
func (g *Group) InFlight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.q.InFlight()
}

// Usage is what the kernel saw of the group's processes, ended ones
// included.
func (g *Group) Usage() bpf.Usage { return g.procs.Usage() }

// SetClasses makes classes the group's: the calls admitted from now on
// are classified by it and recorded into it (the routing manager, when a
// policy comes into force).
func (g *Group) SetClasses(classes *wlm.Classes) {
	g.mu.Lock()
	g.classes.Store(classes)
	g.mu.Unlock()
}

// TakeSamples returns the figures of the group's calls by class since the
// last time, and begins a new interval; nil when classes is not the
// group's any more (a policy being replaced).
func (g *Group) TakeSamples(classes *wlm.Classes) []wlm.Sample {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.classes.Load() != classes {
		return nil
	}
	return classes.Take()
}

func (g *Group) stats() schedq.Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.q.Stats()
}
