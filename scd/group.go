package scd

import (
	"errors"
	"fmt"
	"os"
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
	name     string
	def      def.Server
	entries  map[string]string // service name -> entry name (interned)
	procs    processes
	held     atomic.Bool
	closed   atomic.Bool           // the node is stopping: the processes were told to leave
	failing  atomic.Pointer[error] // the server's processes die before they attach
	log      logger
	tr       transport
	watch    time.Duration
	readerOn atomic.Bool // the reply reader runs
	workDir  string      // its processes' working directory (uapdir.go)

	mu      sync.Mutex
	q       *schedq.Queue[*call]
	slots   []slotState
	late    []*call                // Expire's, reused
	actions []schedq.Action[*call] // the queue's, reused
	exits   []schedq.ExitedCall[*call]

	load groupLoad
	// classes are the service policy's classes of the group's calls and
	// their figures (wlm.go); nil without a policy.
	classes atomic.Pointer[groupClasses]

	// place routes a call a process of the group made (Node.placeLocal).
	place func(c caller, f *netio.Frame) (netio.Code, string)

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
	// service began (wlm.go).
	since time.Time
}

// call is one call from its admission to its answer and the end of its
// process's work on it.
type call struct {
	to         caller
	id         uint64
	start      time.Time
	deadline   int64 // unix ns; 0: wait for ever
	noReply    bool
	entry      string
	req        []byte // the request until a process has it: the frame's during submit, else payload
	payload    []byte // the call's own copy of its request, made when it has to wait
	dispatched bool   // handed to a process (the queue holds it until its completion or exit)
	class      uint16 // its service class (wlm.go), when the node has a service policy
}

var callPool = sync.Pool{New: func() any { return new(call) }}

// maxPooledPayload keeps a huge request's copy from living on in the pool.
const maxPooledPayload = 64 << 10

func freeCall(cl *call) {
	p := cl.payload[:0]
	if cap(p) > maxPooledPayload {
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
	Revoke() ([]byte, bool)
	Requests() [][]byte
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

// rings is how many doorbell rings past its attaches and completions a
// process may make before it is killed for ringing without cause.
const maxIdleRings = 256

// submit admits a call: handed to a ready process at once, or waiting in
// the queue, or refused. It runs on an event loop and never blocks.
func (g *group) submit(c caller, f *netio.Frame, entry string, now time.Time) (netio.Code, string) {
	if err := g.failing.Load(); err != nil {
		return netio.CodeServerTerminated, (*err).Error()
	}
	cl := callPool.Get().(*call)
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
	cl.req = f.Payload // the frame's, valid until submit returns
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
func (g *group) act() {
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
					freeCall(cl)
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
		if p.Attach() {
			si.attached = true
			si.since = now
			si.events++
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
			si.events++
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
				si.events++
				g.q.Retire(slot)
				g.act()
				si.killed = true
				bad = append(bad, slot)
				continue
			} else if made {
				si.events++
				calls = append(calls, localCall{oc, c})
			}
		}
		if p.Rings() > si.events+maxIdleRings {
			g.misbehaved.Inc()
			g.log.Error("uap rings the scheduler without cause; killing it", "group", g.name, "slot", slot,
				"rings", p.Rings(), "calls_and_attaches", si.events)
			g.q.Retire(slot)
			g.act()
			si.events = p.Rings() // once
			si.killed = true
			bad = append(bad, slot)
		}
	}
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
	g.tr.Close()
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
// terminated', one it never took goes back to the queue.
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
	taken, reqs := p.Taken(), p.Requests()
	g.exits = g.q.Exited(slot, taken, g.exits[:0])
	exits := g.exits
	for i, e := range exits {
		if e.Outcome == schedq.Requeued {
			// It never left the dead process's mailbox: copy it out
			// before the area goes.
			cl := e.Call
			if i >= len(reqs) { // the transport and the queue disagree: a bug
				g.log.Error("a call to requeue is not in the dead process's area", "group", g.name, "slot", slot)
				reqs = append(reqs, nil)
			}
			cl.payload = append(cl.payload[:0], reqs[i]...)
			cl.req, cl.dispatched = cl.payload, false
		}
	}
	g.act()
	g.tr.Remove(slot)
	*si = slotState{}
	var settle []*call
	for _, e := range exits {
		if e.Outcome != schedq.Requeued {
			settle = append(settle, e.Call)
		}
	}
	g.mu.Unlock()
	for _, a := range answers {
		_ = a.to.Send(a.b)
	}
	why := "the UAP process serving the call died"
	if exitErr != nil {
		why += " (" + exitErr.Error() + ")"
	}
	for i, cl := range settle {
		if exits[i].Outcome == schedq.Terminated {
			g.terminated.Inc()
			cl.fail(netio.CodeServerTerminated, why)
		}
		freeCall(cl)
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
	defer g.mu.Unlock()
	g.q.Retire(slot)
	g.act()
	if p := g.slots[slot].p; p != nil {
		p.Stop()
		p.Wake()
	}
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
