package local

import (
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/bpf"
	"tpsched/internal/pace"
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
	// procs are set once by startGroup, then started says so: a call may
	// come (from another group's UAP) before, and waits in the queue.
	procs   processes
	started atomic.Bool
	server  *server // the server's lifecycle on a node with a service policy (server.go); nil otherwise
	held    atomic.Bool
	serving atomic.Bool           // it takes calls here: always, but for a server the routing manager stopped or has not started
	closed  atomic.Bool           // the node is stopping: the processes were told to leave
	failing atomic.Pointer[error] // the server's processes die before they attach
	log     logger
	tr      transport
	watch   time.Duration
	workDir string                                                   // its processes' working directory (uapdir.go)
	place   func(c call.Caller, f *netio.Frame) (netio.Code, string) // where its processes' own calls go
	rd      reader
	expiry  *pace.Loop // the scheduler's expiry loop, woken by each submit

	mu      sync.Mutex
	q       *schedq.Queue[*request]
	slots   []slotState
	late    []*request                // Expire's, reused
	actions []schedq.Action[*request] // the queue's, reused
	exits   []schedq.ExitedCall[*request]
	// refusing and undelivered are act's: calls a transport refused
	// (act's doc comment).
	refusing    []refusedHand
	undelivered undelivered
	// answering counts answers made from the queue under mu and not yet
	// sent: whoever takes a call out of the queue with its answer to send
	// after mu adds it there, and takes it off once sent. InFlight counts
	// them: a drain that sees no call left must find every answer written,
	// or the RPC port closes before it (an answer lost, its call run).
	answering atomic.Int64

	// classes are the service policy's classes of the group's calls and
	// their figures (wlm.NoClasses without a policy): set by the routing
	// manager, recorded into under mu.
	classes atomic.Pointer[wlm.Classes]

	load groupLoad

	lanes groupLanes // the lanes its processes serve (lanes.go), under mu

	bytes      groupBytes       // its admitted calls' requests, within the node's budget (budget.go)
	refused    *metrics.Counter // calls refused server busy: the queue was full
	overBudget *metrics.Counter // calls refused server busy: their request would pass the budget
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
	// Its doorbell's account (checkRings): the rings seen so far, the
	// causes seen and not yet matched by a ring (at most maxRingCredit),
	// the rings that found none, and whether it was killed for them.
	rings, credit, idleRings uint64
	ringKilled, leftSeen     bool
	warned                   bool // its missing entries were logged
	refusing                 bool // its transport refused a call in act's batch
	// killed: it broke the protocol and was killed; nothing more is read
	// from it (and logged) until it is reaped, however often it rings.
	killed bool
	// caller answers the calls it makes of its own (localcall.go); nil
	// until its first.
	caller *uapCaller
	// laneLeft: a lane it served was closed at this look, after it left
	// it (and rang for that).
	laneLeft bool

	// since is its last attach or completion: when its next call's
	// service began (the routing manager's service time).
	since time.Time
}

// request is one call from its admission to its answer and the end of its
// process's work on it.
type request struct {
	to       call.Caller
	id       uint64
	start    time.Time
	deadline int64 // unix ns; 0: wait for ever
	noReply  bool
	entry    string
	// payload is the node's own copy of the request, from admission until
	// the call ends. A process's mailbox is written from it and never read
	// back: a call taken back from a process (revoked, or its process died
	// before taking it) goes on with these bytes, whatever the process
	// wrote over its buffer meanwhile.
	payload    []byte
	charged    int         // len(payload), taken from budget at admission
	budget     *groupBytes // its group's, given back charged when the call ends
	dispatched bool        // handed to a process (the queue holds it until its completion or exit)
	class      uint16      // its service class (wlm.Classes)
}

var requestPool = sync.Pool{New: func() any { return new(request) }}

// maxPooledPayload keeps a huge request's copy from living on with a call
// in requestPool: larger copies go to bigPayloads, by size.
const maxPooledPayload = 64 << 10

// bigPayloads are the buffers of requests above maxPooledPayload, by
// power of two (up to def.MaxMaxMessageSize): a node that takes large
// calls reuses their copies instead of allocating one per call.
var bigPayloads [bits.UintSize]sync.Pool

// copyPayload copies req into the call's own buffer.
func (cl *request) copyPayload(req []byte) {
	if len(req) > cap(cl.payload) && len(req) > maxPooledPayload {
		class := bits.Len(uint(len(req) - 1))
		if b, ok := bigPayloads[class].Get().(*[]byte); ok {
			cl.payload = *b
		} else {
			cl.payload = make([]byte, 0, 1<<class)
		}
	}
	cl.payload = append(cl.payload[:0], req...)
}

func freeRequest(cl *request) {
	if cl.budget != nil {
		cl.budget.give(cl.charged)
	}
	p := cl.payload[:0]
	if c := cap(p); c > maxPooledPayload {
		if c&(c-1) == 0 { // one of bigPayloads'
			b := new([]byte)
			*b = p
			bigPayloads[bits.Len(uint(c-1))].Put(b)
		}
		p = nil
	}
	*cl = request{payload: p}
	requestPool.Put(cl)
}

// A process rings its doorbell after something the reader must see: its
// attach, a completion, a call of its own, its leaving. A ring that finds
// no such cause seen and not yet matched by another ring is idle; a
// process is killed after maxIdleRings idle rings in its life. An honest
// one makes a few at most (a ring that comes after the reader already
// matched its cause with an earlier ring, its leave).
//
// Causes the reader saw without a ring (it was awake and found them
// itself) are kept as credit for rings still to come, but at most
// maxRingCredit of them: an honest process has at most one ring on the way
// per thread that rings, while a banked credit would let a process first
// make thousands of calls while the reader is awake and then ring that
// many times without cause (issue 19 item 8).
const (
	maxIdleRings  = 256
	maxRingCredit = 64
)

// checkRings matches the rings seen since the last look with the causes
// this look found; it reports whether the process has now rung without
// cause too often. Under mu.
func (si *slotState) checkRings(rings, causes uint64) bool {
	if si.ringKilled {
		return false
	}
	fresh := rings - si.rings
	si.rings = rings
	si.credit = min(si.credit+causes, maxRingCredit)
	matched := min(fresh, si.credit)
	si.credit -= matched
	si.idleRings += fresh - matched
	if si.idleRings > maxIdleRings {
		si.ringKilled = true
		return true
	}
	return false
}

// submit admits a call: handed to a ready process at once, or waiting in
// the queue, or refused. It runs on an event loop and never blocks.
func (g *Group) submit(c call.Caller, f *netio.Frame, entry string, now time.Time) (netio.Code, string) {
	if err := g.failing.Load(); err != nil {
		return netio.CodeServerTerminated, (*err).Error()
	}
	if !g.bytes.take(len(f.Payload)) {
		g.overBudget.Inc()
		return netio.CodeServerBusy, g.bytes.refusal(g.name, len(f.Payload))
	}
	cl := requestPool.Get().(*request)
	cl.charged, cl.budget = len(f.Payload), &g.bytes
	cl.to, cl.id, cl.start, cl.noReply, cl.entry = c, f.ID, now, f.Kind == netio.KindCallNoReply, entry
	timeout := g.watch
	if f.TimeoutMs > 0 {
		timeout = time.Duration(f.TimeoutMs) * time.Millisecond
	}
	if timeout > 0 {
		cl.deadline = now.Add(timeout).UnixNano()
	}
	cl.class = g.classes.Load().Of(f.Service)
	cl.copyPayload(f.Payload) // the frame's is valid only until submit returns
	g.mu.Lock()
	if err := g.failing.Load(); err != nil {
		// Reported failing since the look above: Failing's flush, under
		// mu, may have answered the calls waiting already, and this one,
		// queued after it, would wait for its deadline (for ever with
		// watch_time 0) while no process can start.
		g.mu.Unlock()
		freeRequest(cl)
		return netio.CodeServerTerminated, (*err).Error()
	}
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
	waiting := g.q.Waiting()
	if waiting > 0 && len(g.lanes.open) > 0 {
		g.makeRoom(waiting, now)
	}
	u := g.takeUndelivered()
	g.mu.Unlock()
	g.expiry.Wake() // after the Submit, where its InFlight sees the call
	u.settle(g)
	if g.started.Load() { // else startGroup kicks once its processes run
		g.procs.Kick(waiting)
	}
	return netio.CodeOK, ""
}

// act carries out what the queue decided: calls handed to processes, and
// prefetched calls asked back (which may decide more). Under mu.
//
// A call the transport refuses (sizes were checked on admission, so a bug,
// or a socket process in a state the queue does not know) never reached
// the process: the slot is handed nothing more in this batch, the queue
// gives the refused calls back (Undelivered) and retires the slot. They
// are answered 'server terminated' and the process is killed by whoever
// called act, once mu is released (takeUndelivered).
func (g *Group) act() {
	for {
		g.actions = g.q.TakeActions(g.actions[:0])
		if len(g.actions) == 0 {
			return
		}
		for _, a := range g.actions {
			si := &g.slots[a.Slot]
			if si.refusing {
				continue // its calls from here on count as refused
			}
			p := si.p
			switch a.Kind {
			case schedq.Hand:
				cl := a.Call
				if err := p.Dispatch(cl.entry, cl.payload, cl.deadline); err != nil {
					g.logLater(slog.LevelError, "handing a call to a process failed; the call is answered and the process killed",
						"group", g.name, "slot", a.Slot, "pid", p.PID(), "err", err)
					si.refusing = true
					g.refusing = append(g.refusing, refusedHand{a.Slot, err})
					continue
				}
				cl.dispatched = true
				p.Wake()
			case schedq.Revoke:
				if !p.Revoke() {
					g.q.NotRevoked(a.Slot)
					continue
				}
				cl, free := g.q.Revoked(a.Slot)
				if free {
					freeRequest(cl)
					continue
				}
				cl.dispatched = false // it waits again, with its own copy
			}
		}
		clear(g.actions)
		for _, r := range g.refusing {
			si := &g.slots[r.slot]
			si.refusing = false
			// The calls of the slot its process does not hold are the
			// refused one and those handed after it in this batch.
			n := g.q.Held(r.slot) - si.p.Holding()
			why := "the node could not hand the call to the UAP process (" + r.err.Error() + "); it never ran"
			for _, e := range g.q.Undelivered(r.slot, n, nil) {
				if e.Outcome == schedq.Terminated {
					g.undelivered.calls = append(g.undelivered.calls, undeliveredCall{e.Call, why})
				} else {
					freeRequest(e.Call)
				}
			}
			g.undelivered.procs = append(g.undelivered.procs, slotPID{r.slot, si.p.PID()})
		}
		g.refusing = g.refusing[:0]
	}
}

// refusedHand is a slot whose transport refused a call, in act's batch.
type refusedHand struct {
	slot int
	err  error
}

// slotPID is the process a decision made under mu was about: procmgr is
// told after mu is released, when the slot may hold another process.
type slotPID struct{ slot, pid int }

// undelivered are the calls a transport refused, to be answered, and the
// processes to be killed for it: act's, until the caller of act takes
// them (takeUndelivered) to settle them without mu. The log records made
// under mu wait here too (logLater).
type undelivered struct {
	calls []undeliveredCall
	procs []slotPID // to kill
	logs  []logRecord
}

// logRecord is a log record made under mu, written once mu is let go
// (settle, or the reader's deliver): a write waits for the log's output,
// and a stderr that nobody reads held mu for as long, and with it the
// dispatcher and every event loop admitting a call to the group (issue 29
// item 7; internal/lockcheck finds a log write under a lock).
type logRecord struct {
	level slog.Level // LevelWarn or LevelError
	msg   string
	args  []any
}

func (r logRecord) write(l logger) {
	if r.level >= slog.LevelError {
		l.Error(r.msg, r.args...)
	} else {
		l.Warn(r.msg, r.args...)
	}
}

// logLater keeps a record for whoever takes undelivered to write without
// mu. Under mu.
func (g *Group) logLater(level slog.Level, msg string, args ...any) {
	g.undelivered.logs = append(g.undelivered.logs, logRecord{level, msg, args})
}

type undeliveredCall struct {
	cl  *request
	why string
}

// takeUndelivered hands over what act left to settle. Under mu; nothing to
// do (the usual case) costs three loads.
func (g *Group) takeUndelivered() undelivered {
	if len(g.undelivered.calls) == 0 && len(g.undelivered.procs) == 0 && len(g.undelivered.logs) == 0 {
		return undelivered{}
	}
	u := g.undelivered
	g.undelivered = undelivered{}
	g.answering.Add(int64(len(u.calls))) // the taker sends them
	return u
}

// settle writes the records made under mu, answers the refused calls
// 'server terminated' and kills their processes. Without mu.
func (u undelivered) settle(g *Group) {
	for _, r := range u.logs {
		r.write(g.log)
	}
	for _, c := range u.calls {
		g.terminated.Inc()
		c.cl.fail(netio.CodeServerTerminated, c.why)
		freeRequest(c.cl)
		g.answering.Add(-1)
	}
	for _, k := range u.procs {
		g.procs.Kill(k.slot, k.pid)
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
	for range g.expireLanes(now) {
		g.timedOut.Inc()
	}
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
	g.answering.Add(int64(len(out)))
	g.mu.Unlock()
	for _, a := range out {
		g.timedOut.Inc()
		if !a.noReply {
			_ = a.to.Send(netio.AppendError(nil, a.id, netio.CodeTimedOut, timedOutMessage(a.limit, g.watch)))
		}
		g.answering.Add(-1)
	}
}

// close refuses new calls; the processes leave once they hold none.
func (g *Group) close() {
	g.mu.Lock()
	g.q.Close()
	g.closed.Store(true)
	g.revokeLanes(time.Now(), revokeClosed)
	if g.tr != nil {
		g.tr.Close()
	}
	g.mu.Unlock()
}

// forgetProcesses lets go of every process's transport end before Close
// unmaps the areas: procmgr's Stop returns when its deadline passes even
// if a process killed is not reaped yet (a process in uninterruptible
// sleep), and that process's Exited, coming later, finds no area to read
// (it read the unmapped one: scdd's SIGSEGV).
func (g *Group) forgetProcesses() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := range g.slots {
		g.endLaneOf(i, "the node stopped")
	}
	for i := range g.slots {
		g.slots[i] = slotState{}
	}
}

// flush answers the calls still waiting when the node gives up on them.
func (g *Group) flush(code netio.Code, msg string) {
	g.mu.Lock()
	left := g.q.Flush(nil)
	g.answering.Add(int64(len(left)))
	g.mu.Unlock()
	for _, cl := range left {
		cl.fail(code, msg)
		freeRequest(cl)
		g.answering.Add(-1)
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

// InFlight counts calls waiting, held by a process, or answered and the
// answer not yet sent.
func (g *Group) InFlight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.q.InFlight() + len(g.undelivered.calls) + int(g.answering.Load())
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

// stats are the group's queue figures, with the calls its processes
// completed on lanes counted as queued and processed (when the dispatcher
// saw them completed): calls the group served, which the queue did not
// see. Its metrics, its status and its load level read them.
func (g *Group) stats() schedq.Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.q.Stats()
	st.Queued += g.lanes.served
	st.Processed += g.lanes.served
	return st
}
