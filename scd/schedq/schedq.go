// Package schedq is one service group's schedule queue as pure logic: which
// calls wait, which process serves which call, and what every event means
// for the caller of each call.
//
// It owns three promises of the node:
//
//   - Admission is exact. A call goes to a ready process at once, or waits;
//     it is refused 'server busy' only when queue_size calls really wait. A
//     process that holds a call (running, preempted, stopped, or dead and
//     not yet reaped) holds only its own: it takes no room in the queue and
//     blocks no other call.
//   - Every call is answered exactly once: with its process's completion,
//     with 'timed out' when its deadline passes first (the process may still
//     run it; its completion is then dropped), or with 'server terminated'
//     when the process serving it dies. A call handed to a process that died
//     before it took the call never ran: it goes back to the head of the
//     queue, or to another ready process.
//   - Resident processes are served first, and among each kind the process
//     that became ready last: the others stay idle, so the Multiserver rule
//     can see idle non-resident processes and stop them. Which slots serve
//     resident processes is Config.Resident at first; SetResident changes a
//     slot's kind while the queue runs (scdctl chprc).
//
// With Config.Depth above 1 a busy process is also handed its next calls,
// up to Depth in all, so it goes on without waiting for the node to see
// its completions; such a (prefetched) call still counts as waiting. The
// queue asks the last prefetched call of a process back (a Revoke action)
// when another process becomes ready with nothing to do, and all of them
// when the other processes have completed stuckAfter calls since the first
// was handed over (its process is on a long call, preempted or stopped); a
// call the busy process has not taken goes back to the head of the queue.
// So a call never waits behind a long one while other processes serve.
//
// It does no I/O, keeps no clock, starts no goroutine and allocates nothing
// once grown: the caller (scd) feeds it events under one lock per group,
// then carries out the actions it queued (TakeActions) and what the events
// returned (answers). C is the caller's handle for a call; the queue never
// looks inside it.
//
// # Usage
//
//	q := schedq.New[*call](schedq.Config{QueueSize: 256, Slots: 4, Resident: 2, Depth: 8})
//	q.Ready(0)                       // the process in slot 0 attached and waits
//	err := q.Submit(cl, deadline)    // admitted, or ErrFull / ErrClosed
//	done, ok := q.Done(0)            // slot 0 completed its oldest call: answer
//	                                 // done.Call unless done.Answered
//	for _, a := range q.TakeActions(acts[:0]) {
//		switch a.Kind {
//		case schedq.Hand:   // give a.Call to the process in a.Slot
//		case schedq.Revoke: // take back a.Slot's last call, then
//			// q.Revoked(a.Slot) or q.NotRevoked(a.Slot)
//		}
//	}                                // (until no action is left)
//	ex := q.Exited(0, taken, ex[:0]) // taken: how many of its calls it took
//	ex = q.Undelivered(0, 1, ex[:0]) // its transport refused the last call handed over
//	late = q.Expire(now, late[:0])   // answer each 'timed out'
package schedq

import "errors"

// Errors of Submit.
var (
	ErrFull   = errors.New("schedq: queue_size calls are waiting")
	ErrClosed = errors.New("schedq: queue closed")
)

// Config sizes a queue.
type Config struct {
	QueueSize int  // calls that may wait for a process (queue_size); at least 1
	Slots     int  // process slots (the most processes of parallel_count); at least 1
	Resident  int  // slots [0, Resident) serve resident processes; the rest non-resident
	Refresh   bool // scd_refresh_process: a process serves one call, then leaves
	// Depth is how many calls a process may hold: its current one and
	// those handed over ahead (prefetched). 1 (or less): one at a time.
	// Above 1 the transport must be able to take back a call its process
	// has not taken.
	Depth int
}

// ActionKind says what an Action asks of the caller.
type ActionKind uint8

const (
	// Hand: give Call to the process in Slot, after the calls it holds.
	Hand ActionKind = iota
	// Revoke: take back the last call handed to the process in Slot if the
	// process has not taken it, and report with Revoked or NotRevoked.
	Revoke
)

// Action is one thing the caller must do to its processes, in order.
type Action[C any] struct {
	Kind ActionKind
	Slot int
	Call C // for Hand
}

// Outcome is what a process's death means for a call it held.
type Outcome uint8

const (
	// Free: the caller was answered already ('timed out'): only free it.
	Free Outcome = iota
	// Terminated: the process had taken the call: answer 'server terminated'.
	Terminated
	// Requeued: the process died before it took the call, which never ran;
	// it waits again at the head of the queue (or was handed on).
	Requeued
)

// Completion is what Done returns.
type Completion[C any] struct {
	Call C
	// Answered: the caller was answered already ('timed out'); drop the
	// reply, only free the call.
	Answered bool
}

// ExitedCall is a call a dead process held, and what becomes of it.
type ExitedCall[C any] struct {
	Call    C
	Outcome Outcome
}

// Stats are the queue's counters; each only grows, except Waiting and Busy.
type Stats struct {
	Queued     uint64 // calls admitted
	Processed  uint64 // completions
	Refused    uint64 // Submit refused: the queue was full
	TimedOut   uint64 // callers answered 'timed out'
	Terminated uint64 // callers answered 'server terminated'
	Requeued   uint64 // calls put back after their process died, or gave them back, before taking them
	Waiting    int    // calls waiting for a process, prefetched ones included (the documents' q)
	Busy       int    // processes holding a call now, or lent to a lane
}

type waitingCall[C any] struct {
	call     C
	deadline int64
}

type slotState uint8

const (
	slotEmpty    slotState = iota // no process attached
	slotReady                     // attached, holds no call, in a ready stack
	slotBusy                      // holds its current call, maybe a prefetched one
	slotRetiring                  // asked to leave: gets no further call (may hold some)
	slotLent                      // lent to a lane (Lend): gets no call until Return
)

type heldCall[C any] struct {
	call     C
	deadline int64
	answered bool
	at       uint64 // the queue's completion count when it was handed over
}

type procSlot[C any] struct {
	state slotState
	// calls are those handed to the process, in order: calls[0] is its
	// current call, the others prefetched. Capacity Depth, never grown.
	calls []heldCall[C]
	// taken: the process is known to have taken calls[:taken] (it takes
	// them in order), so they cannot be revoked.
	taken int
	// revokeAsked: a Revoke of its last call was queued; it gets no call
	// until the answer (Revoked or NotRevoked), so "its last" stays that call.
	revokeAsked bool
	// noPrefetch: a call was asked back from it; it gets no other until its
	// current call ends (its transport's mailbox ring needs that too).
	noPrefetch bool
	// lent: the process serves a lane (Lend) and gets no call from the
	// queue until Return; it counts as busy.
	lent bool
}

// Queue is one group's schedule queue. It is not safe for concurrent use:
// the caller holds its group's lock around every method.
type Queue[C any] struct {
	cfg   Config
	wait  ring[waitingCall[C]]
	slots []procSlot[C]
	ready readyStacks

	prefetched int // calls handed to busy processes ahead of their current one
	lent       int // processes lent to lanes (counted in Busy, not in InFlight)
	closed     bool
	st         Stats
	actions    []Action[C]
}

// New returns an empty, open queue. Sizes below 1 count as 1.
func New[C any](cfg Config) *Queue[C] {
	cfg.QueueSize = max(cfg.QueueSize, 1)
	cfg.Slots = max(cfg.Slots, 1)
	cfg.Resident = min(max(cfg.Resident, 0), cfg.Slots)
	cfg.Depth = max(cfg.Depth, 1)
	if cfg.Refresh {
		cfg.Depth = 1 // a process serves one call
	}
	q := &Queue[C]{cfg: cfg, slots: make([]procSlot[C], cfg.Slots), ready: newReadyStacks(cfg.Slots, cfg.Resident)}
	for i := range q.slots {
		q.slots[i].calls = make([]heldCall[C], 0, cfg.Depth)
	}
	q.wait.limit = cfg.QueueSize
	return q
}

// SetResident says whether slot serves a resident process from now on:
// the server's resident count changed while it runs. A ready process in it
// moves to the ready stack of its new kind, as the last to become ready;
// calls it holds stay with it. Nothing else changes: the caller starts and
// stops the processes.
func (q *Queue[C]) SetResident(slot int, resident bool) {
	if !q.valid(slot) || q.ready.resident[slot] == resident {
		return
	}
	ready := q.slots[slot].state == slotReady
	if ready {
		q.ready.remove(slot)
	}
	q.ready.resident[slot] = resident
	if ready {
		q.ready.push(slot)
	}
}

func (q *Queue[C]) valid(slot int) bool { return slot >= 0 && slot < len(q.slots) }

// TakeActions appends the actions queued since the last call to out, in
// order, and forgets them. Carry them out before the next event; Revoked
// and NotRevoked may queue more.
func (q *Queue[C]) TakeActions(out []Action[C]) []Action[C] {
	out = append(out, q.actions...)
	clear(q.actions)
	q.actions = q.actions[:0]
	return out
}

// Submit admits call with its deadline (unix ns, 0 none): handed to a
// ready process, prefetched to a busy one, or put in the queue. ErrFull
// when QueueSize calls wait, ErrClosed after Close.
func (q *Queue[C]) Submit(call C, deadline int64) error {
	if q.closed {
		return ErrClosed
	}
	if s := q.ready.pop(); s >= 0 {
		q.st.Queued++
		q.hold(s, call, deadline)
		return nil
	}
	if q.Waiting() >= q.cfg.QueueSize && q.waitingUnanswered() >= q.cfg.QueueSize {
		q.st.Refused++
		return ErrFull
	}
	q.st.Queued++
	if s := q.prefetchable(); s >= 0 {
		q.hold(s, call, deadline)
		return nil
	}
	q.wait.push(waitingCall[C]{call, deadline})
	return nil
}

// waitingUnanswered is Waiting without the prefetched calls answered
// already ('timed out'): they wait for nobody, though their processes, busy
// with a long call, hold them until they get to them. Counted only when
// the queue looks full.
func (q *Queue[C]) waitingUnanswered() int {
	n := q.Waiting()
	for s := range q.slots {
		for _, h := range q.slots[s].calls[min(1, len(q.slots[s].calls)):] {
			if h.answered {
				n--
			}
		}
	}
	return n
}

// hold gives call to slot s (as its current call, or after the ones it
// holds) and queues the Hand.
func (q *Queue[C]) hold(s int, call C, deadline int64) {
	sl := &q.slots[s]
	if len(sl.calls) == 0 {
		q.st.Busy++
		if sl.state != slotRetiring {
			sl.state = slotBusy
		}
	} else {
		q.prefetched++
	}
	sl.calls = append(sl.calls, heldCall[C]{call: call, deadline: deadline, at: q.st.Processed})
	q.actions = append(q.actions, Action[C]{Kind: Hand, Slot: s, Call: call})
}

// reset empties the slot to state st, keeping its calls' storage.
func (sl *procSlot[C]) reset(st slotState) {
	clear(sl.calls)
	*sl = procSlot[C]{state: st, calls: sl.calls[:0]}
}

// prefetchable is a busy process that can be handed another call: the one
// holding the fewest, a resident one first among equals. -1 if none (or
// Depth is 1).
func (q *Queue[C]) prefetchable() int {
	best := -1
	for s := range q.slots {
		sl := &q.slots[s]
		if sl.state != slotBusy || len(sl.calls) >= q.cfg.Depth || sl.noPrefetch || sl.revokeAsked {
			continue
		}
		// Which slots serve residents is SetResident's, not the lowest
		// indexes once chprc has changed them.
		if best < 0 || len(sl.calls) < len(q.slots[best].calls) ||
			len(sl.calls) == len(q.slots[best].calls) && q.ready.resident[s] && !q.ready.resident[best] {
			best = s
		}
	}
	return best
}

// revocable reports whether slot s's last call may be asked back.
func (sl *procSlot[C]) revocable() bool {
	return len(sl.calls) > 1 && sl.taken < len(sl.calls) && !sl.revokeAsked
}

// stealable is the process holding the most calls that can be asked
// back. -1 if none.
func (q *Queue[C]) stealable() int {
	best := -1
	for s := range q.slots {
		if sl := &q.slots[s]; sl.revocable() && (best < 0 || len(sl.calls) > len(q.slots[best].calls)) {
			best = s
		}
	}
	return best
}

func (q *Queue[C]) revoke(s int) {
	q.slots[s].revokeAsked = true
	q.actions = append(q.actions, Action[C]{Kind: Revoke, Slot: s})
}

// stuck reports whether slot s's prefetched calls have waited while the
// others completed stuckAfter calls: twice the process slots, so a process
// serving calls as fast as the others is never robbed, and one stuck on a
// long call (or stopped) gives its calls up after a few of theirs. (The
// first of them waited longest; the process completed nothing meanwhile,
// or it would be its current call.)
func (q *Queue[C]) stuck(sl *procSlot[C]) bool {
	stuckAfter := 2*uint64(len(q.slots)) + 2
	return len(sl.calls) > 1 && q.st.Processed-sl.calls[1].at >= stuckAfter
}

// balance asks calls back from stuck processes, hands waiting calls to
// ready processes, prefetches to busy ones, and asks a prefetched call back
// when a process is ready with nothing to do.
func (q *Queue[C]) balance() {
	if q.prefetched > 0 {
		for s := range q.slots {
			if sl := &q.slots[s]; sl.revocable() && (q.stuck(sl) || sl.state == slotRetiring) {
				q.revoke(s)
			}
		}
	}
	for q.wait.n > 0 {
		s := q.ready.pop()
		if s < 0 {
			break
		}
		w, _ := q.wait.pop()
		q.hold(s, w.call, w.deadline)
	}
	for q.wait.n > 0 {
		s := q.prefetchable()
		if s < 0 {
			break
		}
		w, _ := q.wait.pop()
		q.hold(s, w.call, w.deadline)
	}
	if q.wait.n == 0 && q.ready.count() > 0 && q.prefetched > 0 {
		if s := q.stealable(); s >= 0 {
			q.revoke(s)
		}
	}
}

// Ready says the process in slot attached and waits for a call. A slot
// that is retiring, or holds a call, is left as it is.
func (q *Queue[C]) Ready(slot int) {
	if !q.valid(slot) || q.slots[slot].state != slotEmpty {
		return
	}
	q.makeReady(slot)
	q.balance()
}

func (q *Queue[C]) makeReady(slot int) {
	q.slots[slot].reset(slotReady)
	q.ready.push(slot)
}

// Done says the process in slot completed its current call. Its next call,
// if it had one, becomes its current; it gets more unless it is retiring or
// the server refreshes its processes. ok is false when the slot held no
// call (the caller and the queue disagree: nothing happens).
func (q *Queue[C]) Done(slot int) (c Completion[C], ok bool) {
	if !q.valid(slot) || len(q.slots[slot].calls) == 0 {
		return c, false
	}
	sl := &q.slots[slot]
	c.Call, c.Answered = sl.calls[0].call, sl.calls[0].answered
	q.st.Processed++
	n := copy(sl.calls, sl.calls[1:])
	sl.calls[n] = heldCall[C]{}
	sl.calls = sl.calls[:n]
	sl.taken = max(sl.taken-1, 0)
	sl.noPrefetch = false
	if n > 1 {
		// Its next call waits for the others' completions from now on
		// (stuck), not from when it was handed over with this one.
		sl.calls[1].at = q.st.Processed
	}
	if n > 0 {
		q.prefetched--
	} else {
		q.st.Busy--
	}
	switch {
	case sl.state == slotRetiring || q.cfg.Refresh:
		sl.state = slotRetiring // it leaves when it holds nothing
	case n == 0:
		q.makeReady(slot)
	}
	q.balance()
	return c, true
}

// Revoked says the last call handed to slot was taken back before its
// process took it, and returns it: it goes to a ready process (a Hand
// action) or the head of the queue. If its caller was answered already
// ('timed out') it goes nowhere: free is true, for the caller to free it.
// The process gets no other call until its current one ends.
func (q *Queue[C]) Revoked(slot int) (call C, free bool) {
	if !q.valid(slot) || len(q.slots[slot].calls) < 2 || q.slots[slot].taken == len(q.slots[slot].calls) {
		return call, false // nothing it could have given back: the caller is wrong
	}
	sl := &q.slots[slot]
	last := len(sl.calls) - 1
	h := sl.calls[last]
	sl.calls[last] = heldCall[C]{}
	sl.calls = sl.calls[:last]
	sl.revokeAsked, sl.noPrefetch = false, true
	q.prefetched--
	if h.answered {
		q.balance()
		return h.call, true
	}
	q.st.Requeued++
	q.wait.pushFront(waitingCall[C]{h.call, h.deadline})
	q.balance()
	return h.call, false
}

// NotRevoked says the process of slot had taken the last call handed to
// it (and so every one before it): none of them is asked for again. A
// slot that holds one call by now (its current one ended since the revoke
// was asked) says nothing of whether it took the other: a process gives
// back no current call.
func (q *Queue[C]) NotRevoked(slot int) {
	if q.valid(slot) {
		sl := &q.slots[slot]
		if len(sl.calls) > 1 {
			sl.taken = len(sl.calls)
		}
		sl.revokeAsked = false
	}
	q.balance()
}

// Exited says the process in slot ended; its slot is empty until a new
// process is Ready there. taken is how many of its calls, from its current
// one on, it had taken: those are answered 'server terminated' unless their
// callers were answered already; the others never ran and go back to the
// head of the queue, in order. The calls it held are appended to out, its
// current one first. A requeued call may be handed on at once (a Hand
// action): copy its request out of the dead process's area before acting.
func (q *Queue[C]) Exited(slot int, taken int, out []ExitedCall[C]) []ExitedCall[C] {
	if !q.valid(slot) {
		return out
	}
	sl := &q.slots[slot]
	if sl.state == slotReady {
		q.ready.remove(slot)
	}
	n := len(sl.calls)
	if n > 0 || sl.lent {
		q.st.Busy--
	}
	if sl.lent {
		q.lent--
	}
	if n > 0 {
		q.prefetched -= n - 1
	}
	taken = max(taken, sl.taken)
	first := len(out)
	for i, h := range sl.calls {
		switch {
		case h.answered:
			out = append(out, ExitedCall[C]{h.call, Free})
		case i < taken:
			q.st.Terminated++
			out = append(out, ExitedCall[C]{h.call, Terminated})
		default:
			q.st.Requeued++
			out = append(out, ExitedCall[C]{h.call, Requeued})
		}
	}
	for i := n - 1; i >= 0; i-- { // in reverse: the oldest ends up at the head
		if out[first+i].Outcome == Requeued {
			q.wait.pushFront(waitingCall[C]{sl.calls[i].call, sl.calls[i].deadline})
		}
	}
	q.slots[slot].reset(slotEmpty)
	q.balance()
	return out
}

// Undelivered says the last n calls handed to slot never reached its
// process: its transport refused them. They leave the slot and are
// appended to out, Terminated (to be answered) unless their callers were
// answered already (Free). The slot is retired: a process whose transport
// refused a call gets none again (the caller stops it); the calls it did
// receive stay its own, settled by Done or Exited. A Revoke asked of the
// slot and not yet answered is forgotten.
func (q *Queue[C]) Undelivered(slot int, n int, out []ExitedCall[C]) []ExitedCall[C] {
	if !q.valid(slot) {
		return out
	}
	sl := &q.slots[slot]
	n = min(max(n, 0), len(sl.calls))
	keep := len(sl.calls) - n
	for i := keep; i < len(sl.calls); i++ {
		h := sl.calls[i]
		if h.answered {
			out = append(out, ExitedCall[C]{h.call, Free})
		} else {
			q.st.Terminated++
			out = append(out, ExitedCall[C]{h.call, Terminated})
		}
		sl.calls[i] = heldCall[C]{}
	}
	switch {
	case n == 0:
	case keep == 0:
		q.st.Busy--
		q.prefetched -= n - 1
	default:
		q.prefetched -= n
	}
	sl.calls = sl.calls[:keep]
	sl.taken = min(sl.taken, keep)
	if sl.state == slotReady {
		q.ready.remove(slot)
	}
	sl.state, sl.revokeAsked = slotRetiring, false
	q.balance()
	return out
}

// Retire stops handing calls to the process in slot (it is to stop, or
// its server shrinks). Its prefetched call, if any, is asked back (a
// Revoke action). It reports whether the process still holds a call,
// which it finishes before it leaves.
func (q *Queue[C]) Retire(slot int) (holds bool) {
	if !q.valid(slot) {
		return false
	}
	sl := &q.slots[slot]
	if sl.state == slotReady {
		q.ready.remove(slot)
	}
	sl.state = slotRetiring
	if sl.revocable() {
		q.revoke(slot) // and the ones before it, as each comes back (balance)
	}
	return len(sl.calls) > 0
}

// Lend takes a ready process that holds no call out of the queue's hands
// for a lane (a caller's calls straight to it, outside the queue): the
// one ready longest among those ok accepts, residents first. It counts as
// busy and gets no call until Return. -1 if no ready process is accepted.
func (q *Queue[C]) Lend(ok func(slot int) bool) int {
	for k := range q.ready.stacks {
		for _, s := range q.ready.stacks[k] { // bottom first: ready longest
			if ok(s) {
				q.ready.remove(s)
				sl := &q.slots[s]
				sl.state, sl.lent = slotLent, true
				q.st.Busy++
				q.lent++
				return s
			}
		}
	}
	return -1
}

// Lendable reports whether Lend(ok) would lend a process now, lending
// none.
func (q *Queue[C]) Lendable(ok func(slot int) bool) bool {
	for k := range q.ready.stacks {
		for _, s := range q.ready.stacks[k] {
			if ok(s) {
				return true
			}
		}
	}
	return false
}

// Return gives back a process Lend took: it is ready again (unless it
// was retired meanwhile: it then leaves, holding nothing).
func (q *Queue[C]) Return(slot int) {
	if !q.valid(slot) || !q.slots[slot].lent {
		return
	}
	sl := &q.slots[slot]
	sl.lent = false
	q.st.Busy--
	q.lent--
	if sl.state == slotLent {
		q.makeReady(slot)
	}
	q.balance()
}

// Lent reports whether slot's process is lent (Lend) and not returned.
func (q *Queue[C]) Lent(slot int) bool { return q.valid(slot) && q.slots[slot].lent }

// Renew says a new process is about to start in slot. A retire asked of
// the slot while no process ran there (a stop that came just after its
// process exited, or after a start that failed) is over: only an exit
// ended one, and the new process would attach and never be handed a
// call. A slot that still holds calls is left as it is: Exited settles
// them.
func (q *Queue[C]) Renew(slot int) {
	if !q.valid(slot) {
		return
	}
	if sl := &q.slots[slot]; sl.state == slotRetiring && len(sl.calls) == 0 {
		if sl.lent { // never returned: its process is gone
			q.st.Busy--
			q.lent--
		}
		sl.reset(slotEmpty)
	}
}

// Expire answers the calls whose deadline is at or before now: those
// waiting leave the queue, those held by a process (prefetched ones too)
// are marked answered (the process may still finish them; Done then drops
// the reply). Each is appended to late, to be answered 'timed out'.
func (q *Queue[C]) Expire(now int64, late []C) []C {
	before := len(late)
	late = q.removeWaiting(func(w *waitingCall[C]) bool {
		return w.deadline > 0 && w.deadline <= now
	}, late)
	for i := range q.slots {
		sl := &q.slots[i]
		for j := range sl.calls {
			h := &sl.calls[j]
			if !h.answered && h.deadline != 0 && h.deadline <= now {
				h.answered = true
				late = append(late, h.call)
			}
		}
	}
	q.st.TimedOut += uint64(len(late) - before)
	return late
}

// Close refuses every later Submit with ErrClosed. Waiting calls stay and
// are still handed to processes.
func (q *Queue[C]) Close() { q.closed = true }

// Flush empties the queue of waiting calls (the node stops with calls it
// could not serve, or its processes cannot start) and appends them to
// out, to be answered. Prefetched calls stay with their processes.
func (q *Queue[C]) Flush(out []C) []C {
	return q.removeWaiting(func(*waitingCall[C]) bool { return true }, out)
}

// Held reports how many calls slot holds (its current call and the ones
// handed over ahead).
func (q *Queue[C]) Held(slot int) (n int) {
	if !q.valid(slot) {
		return 0
	}
	return len(q.slots[slot].calls)
}

// CurrentDeadline is the deadline (unix ns, 0 none) of the call slot's
// process serves now; 0 when it holds none.
func (q *Queue[C]) CurrentDeadline(slot int) int64 {
	if !q.valid(slot) || len(q.slots[slot].calls) == 0 {
		return 0
	}
	return q.slots[slot].calls[0].deadline
}

// Waiting is the number of calls waiting for a process, prefetched ones
// included (the documents' q).
func (q *Queue[C]) Waiting() int { return q.wait.n + q.prefetched }

// InFlight counts the calls not yet finished: waiting or held by a
// process. A process lent to a lane holds none of the queue's.
func (q *Queue[C]) InFlight() int { return q.wait.n + q.st.Busy - q.lent + q.prefetched }

// Stats returns the counters.
func (q *Queue[C]) Stats() Stats {
	st := q.st
	st.Waiting = q.Waiting()
	return st
}

// removeWaiting removes the waiting calls that match, keeping the order of
// the rest, and appends each removed one to out.
func (q *Queue[C]) removeWaiting(match func(*waitingCall[C]) bool, out []C) []C {
	r := &q.wait
	var zero waitingCall[C]
	kept := 0
	for i := range r.n {
		e := &r.buf[(r.head+i)%len(r.buf)]
		if match(e) {
			out = append(out, e.call)
			continue
		}
		if kept != i {
			r.buf[(r.head+kept)%len(r.buf)] = *e
		}
		kept++
	}
	for i := kept; i < r.n; i++ {
		r.buf[(r.head+i)%len(r.buf)] = zero
	}
	r.n = kept
	return out
}
