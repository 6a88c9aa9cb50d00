package scd

import (
	"errors"
	"fmt"
	"math/bits"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/netio"
	"tpsched/procmgr"
	"tpsched/scd/def"
	"tpsched/scd/schedq"
	"tpsched/shm"
)

// group is one service group on this node: its schedule queue (calls
// waiting and held, scd/schedq), the transport to its processes (shared
// memory, or a socket for receive_from = socket) and the user server whose
// processes serve it. The group is procmgr's Delegate for those processes.
//
// mu orders everything the queue and the transport see: an enqueue from an
// event loop, a completion or an attach seen by the reply reader, a
// process's exit, an expiry. A call is handed to a process under mu, so no
// event can come between the queue's decision and the process's area.
// procmgr is never called with mu held (it calls back into the group).
type group struct {
	name    string
	def     def.Server
	entries map[string]string // service name -> entry name (interned)
	// procs are set once by Node.startGroup, then started says so: a call
	// may come (from another group's UAP) before, and waits in the queue.
	procs   processes
	started atomic.Bool
	// envAtStart: an application environment of the service policy when
	// the node started (wlm_env.go); before its start it is not servable.
	envAtStart bool
	held       atomic.Bool
	closed     atomic.Bool           // the node is stopping: the processes were told to leave
	failing    atomic.Pointer[error] // the server's processes die before they attach
	log        logger
	tr         transport
	watch      time.Duration
	readerOn   atomic.Bool // the reply reader runs
	workDir    string      // its processes' working directory (uapdir.go)

	mu      sync.Mutex
	q       *schedq.Queue[*call]
	slots   []slotState
	late    []*call                // Expire's, reused
	actions []schedq.Action[*call] // the queue's, reused
	exits   []schedq.ExitedCall[*call]
	// refusing and undelivered are act's: calls a transport refused
	// (act's doc comment).
	refusing    []refusedHand
	undelivered undelivered

	load groupLoad
	// classes are the service policy's classes of the group's calls and
	// their figures (wlm.go); nil without a policy.
	classes atomic.Pointer[groupClasses]

	// place routes a call a process of the group made (Node.placeLocal).
	place func(c caller, f *netio.Frame) (netio.Code, string)

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

	// since is its last attach or completion: when its next call's
	// service began (wlm.go).
	since time.Time
}

// call is one call from its admission to its answer and the end of its
// process's work on it.
type call struct {
	to       caller
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
	class      uint16      // its service class (wlm.go), when the node has a service policy
}

var callPool = sync.Pool{New: func() any { return new(call) }}

// maxPooledPayload keeps a huge request's copy from living on with a call
// in callPool: larger copies go to bigPayloads, by size.
const maxPooledPayload = 64 << 10

// bigPayloads are the buffers of requests above maxPooledPayload, by
// power of two (up to def.MaxMaxMessageSize): a node that takes large
// calls reuses their copies instead of allocating one per call.
var bigPayloads [bits.UintSize]sync.Pool

// copyPayload copies req into the call's own buffer.
func (cl *call) copyPayload(req []byte) {
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

func freeCall(cl *call) {
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
	*cl = call{payload: p}
	callPool.Put(cl)
}

// proc is the node's end of one UAP process: *shm.Proc, or *sockmode.Proc
// for a socket-receiving server. Every method but Files runs under the
// group's mu.
type proc interface {
	Files() []*os.File
	PID() int
	Attach() bool
	Entries() []string
	Dispatch(entry string, req []byte, deadline int64) error
	Wake()
	Completion() (shm.Completion, bool, error)
	Holding() int
	Taken() int
	Revoke() bool
	Rings() uint64
	Stop()
	Left() bool
}

// transport is a group's way to its processes: *shm.Group, or
// *sockmode.Transport. Wait runs on the reply reader, the rest under mu.
type transport interface {
	proc(slot int) proc
	newProc(slot int) (proc, error)
	Remove(slot int)
	Wait(timeout time.Duration)
	Close()
	Unmap() error
}

// procSource is the shape *shm.Group and *sockmode.Transport share.
type procSource[P interface {
	proc
	comparable
}] interface {
	Proc(slot int) P
	NewProc(slot int) (P, error)
	Remove(slot int)
	Wait(timeout time.Duration)
	Close()
	Unmap() error
}

// transportOf makes a procSource a transport.
type transportOf[P interface {
	proc
	comparable
}] struct{ procSource[P] }

func (t transportOf[P]) proc(slot int) proc {
	var none P
	if p := t.Proc(slot); p != none {
		return p
	}
	return nil
}

func (t transportOf[P]) newProc(slot int) (proc, error) {
	p, err := t.NewProc(slot)
	if err != nil {
		return nil, err
	}
	return p, nil
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
func (g *group) submit(c caller, f *netio.Frame, entry string, now time.Time) (netio.Code, string) {
	if err := g.failing.Load(); err != nil {
		return netio.CodeServerTerminated, (*err).Error()
	}
	if !g.bytes.take(len(f.Payload)) {
		g.overBudget.Inc()
		return netio.CodeServerBusy, g.bytes.refusal(g.name, len(f.Payload))
	}
	cl := callPool.Get().(*call)
	cl.charged, cl.budget = len(f.Payload), &g.bytes
	cl.to, cl.id, cl.start, cl.noReply, cl.entry = c, f.ID, now, f.Kind == netio.KindCallNoReply, entry
	if gc := g.classes.Load(); gc != nil {
		cl.class = gc.classOf(f.Service)
	}
	timeout := g.watch
	if f.TimeoutMs > 0 {
		timeout = time.Duration(f.TimeoutMs) * time.Millisecond
	}
	if timeout > 0 {
		cl.deadline = now.Add(timeout).UnixNano()
	}
	cl.copyPayload(f.Payload) // the frame's is valid only until submit returns
	g.mu.Lock()
	if err := g.q.Submit(cl, cl.deadline); err != nil {
		g.mu.Unlock()
		freeCall(cl)
		if errors.Is(err, schedq.ErrFull) {
			g.refused.Inc()
			return netio.CodeServerBusy, fmt.Sprintf("schedule queue of %s is full (queue_size %d)", g.name, g.def.QueueSize)
		}
		return netio.CodeShuttingDown, ""
	}
	g.act()
	waiting := g.q.Waiting()
	u := g.takeUndelivered()
	g.mu.Unlock()
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
func (g *group) act() {
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
					g.log.Error("handing a call to a process failed; the call is answered and the process killed",
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
					freeCall(cl)
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
					freeCall(e.Call)
				}
			}
			g.undelivered.slots = append(g.undelivered.slots, r.slot)
		}
		g.refusing = g.refusing[:0]
	}
}

// refusedHand is a slot whose transport refused a call, in act's batch.
type refusedHand struct {
	slot int
	err  error
}

// undelivered are the calls a transport refused, to be answered, and the
// slots whose processes are to be killed for it: act's, until the caller
// of act takes them (takeUndelivered) to settle them without mu.
type undelivered struct {
	calls []undeliveredCall
	slots []int
}

type undeliveredCall struct {
	cl  *call
	why string
}

// takeUndelivered hands over what act left to settle. Under mu; nothing to
// do (the usual case) costs two loads.
func (g *group) takeUndelivered() undelivered {
	if len(g.undelivered.calls) == 0 && len(g.undelivered.slots) == 0 {
		return undelivered{}
	}
	u := g.undelivered
	g.undelivered = undelivered{}
	return u
}

// settle answers the refused calls 'server terminated' and kills their
// processes. Without mu.
func (u undelivered) settle(g *group) {
	for _, c := range u.calls {
		g.terminated.Inc()
		c.cl.fail(netio.CodeServerTerminated, c.why)
		freeCall(c.cl)
	}
	for _, slot := range u.slots {
		g.procs.Kill(slot)
	}
}

// readReplies is the group's reply reader: it waits for its processes,
// hands calls to those that attached, answers completions (those to one
// connection found in the same look go out in one write) and gives each
// process its next call.
func (g *group) readReplies(stop <-chan struct{}) {
	g.readerOn.Store(true)
	defer g.readerOn.Store(false)
	batches := make(map[caller][]byte)
	var attached, bad []int
	var calls []localCall
	for {
		select {
		case <-stop:
			return
		default:
		}
		g.tr.Wait(100 * time.Millisecond)
		attached, bad, calls = g.collect(batches, attached[:0], bad[:0], calls[:0])
		for c, b := range batches {
			_ = c.Send(b)
			delete(batches, c)
		}
		g.placeLocalCalls(calls)
		clear(calls)
		for _, slot := range attached {
			g.procs.Attached(slot)
		}
		for _, slot := range bad {
			g.procs.Kill(slot)
		}
	}
}

// collect looks at every process once: attaches, completions, calls of
// its own, doorbells rung without cause. It appends the answers to
// batches and returns the slots that attached, those whose processes must
// be killed and the calls the processes made.
func (g *group) collect(batches map[caller][]byte, attached, bad []int, calls []localCall) ([]int, []int, []localCall) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now() // under mu: every call seen here was admitted before
	for slot := range g.slots {
		si := &g.slots[slot]
		p := si.p
		if p == nil || si.killed {
			continue
		}
		// The rings the reader's Wait counted before this look: each was
		// rung after its cause was published, so this look sees the cause
		// (or an earlier one saw it).
		rings, causes := p.Rings(), uint64(0)
		if p.Attach() {
			si.attached = true
			si.since = now
			causes++
			attached = append(attached, slot)
			g.checkEntries(slot, si)
			g.q.Ready(slot)
			g.act()
		}
		for {
			c, ok, err := p.Completion()
			if !ok {
				break
			}
			causes++
			if err != nil {
				// Its answer is unusable: the call ends as if the process
				// had died serving it, and the process is killed. Retired
				// first, so the queue hands it nothing more.
				g.misbehaved.Inc()
				g.log.Error("uap broke the shared-memory protocol; killing it", "group", g.name, "slot", slot, "err", err)
				g.q.Retire(slot)
				g.act()
				done, _ := g.q.Done(slot)
				cl := done.Call
				if !done.Answered && !cl.noReply {
					batches[cl.to] = netio.AppendError(batches[cl.to], cl.id, netio.CodeServerTerminated,
						"the UAP process serving the call broke the protocol and was killed")
				}
				freeCall(cl)
				g.act()
				si.killed = true
				bad = append(bad, slot)
				break
			}
			done, _ := g.q.Done(slot)
			cl := done.Call
			si.served++
			if !done.Answered && !cl.noReply {
				batches[cl.to] = appendAnswer(batches[cl.to], cl.id, &c)
			}
			g.latency.Update(now.Sub(cl.start).Seconds())
			if gc := g.classes.Load(); gc != nil {
				gc.record(cl.class, cl.start, si.since, now)
			}
			si.since = now
			freeCall(cl)
			g.act() // after the reply was copied out of the mailbox
		}
		if si.killed {
			continue
		}
		if oc, ok := p.(outCaller); ok {
			if c, made, err := oc.OutCall(); err != nil {
				g.misbehaved.Inc()
				g.log.Error("uap broke the shared-memory protocol in a call of its own; killing it", "group", g.name, "slot", slot, "err", err)
				causes++
				g.q.Retire(slot)
				g.act()
				si.killed = true
				bad = append(bad, slot)
				continue
			} else if made {
				causes++
				calls = append(calls, localCall{oc, c})
			}
		}
		if !si.leftSeen && p.Left() {
			si.leftSeen = true
			causes++
		}
		if si.checkRings(rings, causes) {
			g.misbehaved.Inc()
			g.log.Error("uap rings the scheduler without cause; killing it", "group", g.name, "slot", slot,
				"rings", si.rings, "without_cause", si.idleRings)
			g.q.Retire(slot)
			g.act()
			si.killed = true
			bad = append(bad, slot)
		}
	}
	u := g.takeUndelivered()
	for _, c := range u.calls {
		g.terminated.Inc()
		if !c.cl.noReply {
			batches[c.cl.to] = netio.AppendError(batches[c.cl.to], c.cl.id, netio.CodeServerTerminated, c.why)
		}
		freeCall(c.cl)
	}
	bad = append(bad, u.slots...)
	return attached, bad, calls
}

// checkEntries warns once per process when it does not offer an entry its
// definition names (a typo in `service = "name=entry"`, an old module).
func (g *group) checkEntries(slot int, si *slotState) {
	got := si.p.Entries()
	if got == nil || si.warned {
		return // socket mode does not say
	}
	have := make(map[string]bool, len(got))
	for _, e := range got {
		have[e] = true
	}
	for _, svc := range g.def.Services {
		if !have[svc.Entry] {
			si.warned = true
			g.log.Warn(g.def.Errorf("service", "entry %q of service %s is not registered by module %s (it registers %v)",
				svc.Entry, svc.Name, g.def.Module, got).Error(), "slot", slot, "pid", si.p.PID())
		}
	}
}

func appendAnswer(dst []byte, id uint64, c *shm.Completion) []byte {
	switch c.Status {
	case shm.StatusOK:
		return netio.AppendReply(dst, id, c.Reply)
	case shm.StatusAppError:
		return netio.AppendError(dst, id, netio.CodeApplication, string(c.Reply))
	case shm.StatusNoSuchService:
		return netio.AppendError(dst, id, netio.CodeNoSuchService, "entry "+string(c.Reply)+" is not registered by the UAP")
	case shm.StatusTimedOut:
		return netio.AppendError(dst, id, netio.CodeTimedOut, "its deadline passed while it waited in the schedule queue")
	}
	return netio.AppendError(dst, id, netio.CodeProtocol, "unknown completion status")
}

// fail sends an error answer to the call's caller unless it asked for none.
func (cl *call) fail(code netio.Code, msg string) {
	if !cl.noReply {
		_ = cl.to.Send(netio.AppendError(nil, cl.id, code, msg))
	}
}

// expire answers 'timed out' to every caller whose deadline has passed. A
// waiting call leaves the queue; one a process holds stays held (its
// completion is dropped) until the process finishes or dies.
func (g *group) expire(now time.Time) {
	g.mu.Lock()
	late := g.q.Expire(now.UnixNano(), g.late[:0])
	type answer struct {
		to      caller
		id      uint64
		noReply bool
		limit   time.Duration
	}
	out := make([]answer, 0, len(late))
	gc := g.classes.Load()
	for _, cl := range late {
		out = append(out, answer{cl.to, cl.id, cl.noReply, time.Duration(cl.deadline - cl.start.UnixNano())})
		if gc != nil {
			since := now // it never reached a process: all of it was queue time
			if cl.dispatched {
				since = cl.start
			}
			gc.record(cl.class, cl.start, since, now)
		}
		if !cl.dispatched {
			freeCall(cl) // it left the queue; nothing refers to it now
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

// inFlight counts calls waiting or held by a process.
func (g *group) inFlight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.q.InFlight()
}

func (g *group) stats() schedq.Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.q.Stats()
}

// close refuses new calls; the processes leave once they hold none.
func (g *group) close() {
	g.mu.Lock()
	g.q.Close()
	g.closed.Store(true)
	if g.tr != nil {
		g.tr.Close()
	}
	g.mu.Unlock()
}

// flush answers the calls still waiting when the node gives up on them.
func (g *group) flush(code netio.Code, msg string) {
	g.mu.Lock()
	left := g.q.Flush(nil)
	g.mu.Unlock()
	for _, cl := range left {
		cl.fail(code, msg)
		freeCall(cl)
	}
}

// The procmgr.Delegate methods.

// Prepare makes a fresh transport end for the process about to start in
// slot.
func (g *group) Prepare(slot int) ([]*os.File, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p, err := g.tr.newProc(slot)
	if err != nil {
		return nil, err
	}
	g.slots[slot] = slotState{p: p}
	return p.Files(), nil
}

// Exited settles the calls the dead process held: completions it managed
// to write are answered, a call it had taken is answered 'server
// terminated', one it never took goes back to the queue. procmgr calls it
// from one goroutine per slot, so two processes of the group may end at
// once: what is settled after mu is released is this call's own.
func (g *group) Exited(slot, pid int, exitErr error) {
	g.mu.Lock()
	si := &g.slots[slot]
	p := si.p
	if p == nil {
		g.mu.Unlock()
		return
	}
	g.q.Retire(slot) // no new call for it; its prefetched one is asked back
	g.act()
	type answer struct {
		to caller
		b  []byte
	}
	var answers []answer
	for {
		c, ok, err := p.Completion()
		if !ok || err != nil {
			break
		}
		done, _ := g.q.Done(slot)
		si.served++
		if !done.Answered && !done.Call.noReply {
			answers = append(answers, answer{done.Call.to, appendAnswer(nil, done.Call.id, &c)})
		}
		freeCall(done.Call)
	}
	g.exits = g.q.Exited(slot, p.Taken(), g.exits[:0])
	var settle []schedq.ExitedCall[*call] // g.exits is the next Exited's once mu is released
	for _, e := range g.exits {
		if e.Outcome == schedq.Requeued {
			e.Call.dispatched = false // it waits again, with its own copy
		} else {
			settle = append(settle, e)
		}
	}
	clear(g.exits)
	g.act()
	g.tr.Remove(slot)
	*si = slotState{}
	u := g.takeUndelivered()
	u.slots = slices.DeleteFunc(u.slots, func(s int) bool { return s == slot }) // dead already
	g.mu.Unlock()
	u.settle(g)
	for _, a := range answers {
		_ = a.to.Send(a.b)
	}
	why := "the UAP process serving the call died"
	if exitErr != nil {
		why += " (" + exitErr.Error() + ")"
	}
	for _, e := range settle {
		if e.Outcome == schedq.Terminated {
			g.terminated.Inc()
			e.Call.fail(netio.CodeServerTerminated, why)
		}
		freeCall(e.Call)
	}
}

// Waiting is the number of calls in the queue.
func (g *group) Waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.q.Waiting()
}

// Slot says what the process in slot does.
func (g *group) Slot(slot int) procmgr.SlotView {
	g.mu.Lock()
	defer g.mu.Unlock()
	si := &g.slots[slot]
	return procmgr.SlotView{Busy: g.q.Held(slot) > 0, Ready: si.attached && si.p != nil && !si.p.Left(), Served: si.served}
}

// Stop asks the process in slot to leave after the call it holds.
func (g *group) Stop(slot int) {
	g.mu.Lock()
	g.q.Retire(slot)
	g.act()
	if p := g.slots[slot].p; p != nil {
		p.Stop()
		p.Wake()
	}
	u := g.takeUndelivered()
	g.mu.Unlock()
	u.settle(g)
}

// Failing records that the server's processes cannot start (err) or can
// again (nil). While it fails, calls are refused at once, and those
// waiting are answered now rather than at their deadline.
func (g *group) Failing(err error) {
	if err == nil {
		g.failing.Store(nil)
		return
	}
	g.failing.Store(&err)
	g.flush(netio.CodeServerTerminated, err.Error())
}
