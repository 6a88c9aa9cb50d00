// Package schedq is one service group's schedule queue as pure logic: which
// calls wait, which process serves which call, and what every event means
// for the caller of each call.
//
// It owns three promises of the node:
//
//   - Admission is exact. A call goes to a ready process at once, or waits;
//     it is refused 'server busy' only when queue_size calls really wait. A
//     process that holds a call (running, preempted, stopped or dead and not
//     yet reaped) holds only that call: it takes no room in the queue and
//     blocks no other call.
//   - Every call is answered exactly once: with its process's completion,
//     with 'timed out' when its deadline passes first (the process may still
//     be running it; its completion is then dropped), or with 'server
//     terminated' when the process serving it dies. A call handed to a
//     process that died before it took the call never ran: it goes back to
//     the head of the queue, or to another ready process.
//   - Resident processes are served first, and among each kind the process
//     that became ready last: the others stay idle, so the Multiserver rule
//     can see idle non-resident processes and stop them.
//
// It does no I/O, keeps no clock, starts no goroutine and allocates nothing
// once its queue has grown to queue_size: the caller (scd) feeds it events
// under one lock per group and carries out what it returns (copy the
// request into the process's area, answer the caller, ...). C is the
// caller's handle for a call; the queue never looks inside it.
//
// # Usage
//
//	q := schedq.New[*call](schedq.Config{QueueSize: 256, Slots: 4, Resident: 2})
//	q.Ready(0)                          // the process in slot 0 attached and waits
//	d, err := q.Submit(cl, deadline)    // d.Slot >= 0: hand cl to that process now
//	done := q.Done(0)                   // slot 0 completed: answer done.Call unless
//	                                    // done.Answered; dispatch done.Next if set
//	ex := q.Exited(0, started)          // the process died: see ex.Outcome
//	late = q.Expire(now, late[:0])      // answer each 'timed out'
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
}

// Outcome is what a process's death means for the call it held.
type Outcome uint8

const (
	// NoCall: the process held no call, or its caller was answered already.
	NoCall Outcome = iota
	// Terminated: the process had taken the call: answer 'server terminated'.
	Terminated
	// Requeued: the process died before it took the call, which never ran;
	// it waits again at the head of the queue (or went to Dispatch.Slot).
	Requeued
)

// Dispatch tells the caller to hand Call to the process in Slot now; Slot
// is -1 when there is nothing to hand over.
type Dispatch[C any] struct {
	Slot int
	Call C
}

// Completion is what Done returns.
type Completion[C any] struct {
	Call C
	// Answered: the caller was answered already ('timed out'); drop the
	// reply, only free the call.
	Answered bool
	// Next, when Next.Slot >= 0, is the call the same process takes now.
	Next Dispatch[C]
}

// Exit is what Exited returns.
type Exit[C any] struct {
	Outcome Outcome
	Call    C // the call the process held, if Outcome != NoCall or it was answered
	Held    bool
	// Next: a requeued call that went straight to another ready process.
	Next Dispatch[C]
}

// Stats are the queue's counters; every one only grows, except Waiting
// and Busy.
type Stats struct {
	Queued     uint64 // calls admitted (to a process or to the queue)
	Processed  uint64 // completions
	Refused    uint64 // Submit refused: the queue was full
	TimedOut   uint64 // callers answered 'timed out'
	Terminated uint64 // callers answered 'server terminated'
	Requeued   uint64 // calls put back after their process died before taking them
	Waiting    int    // calls in the queue now (the documents' q)
	Busy       int    // processes holding a call now
}

type waitingCall[C any] struct {
	call     C
	deadline int64
}

type slotState uint8

const (
	slotEmpty    slotState = iota // no process attached
	slotReady                     // attached, holds no call, in a ready stack
	slotBusy                      // holds a call
	slotRetiring                  // asked to leave: gets no further call (may hold one)
)

type procSlot[C any] struct {
	state    slotState
	held     bool // holds call (busy, or retiring with a call)
	call     C
	deadline int64
	answered bool
}

// Queue is one group's schedule queue. It is not safe for concurrent use:
// the caller holds its group's lock around every method.
type Queue[C any] struct {
	cfg    Config
	wait   ring[waitingCall[C]]
	slots  []procSlot[C]
	ready  [2][]int // ready slots by kind (0 resident, 1 non-resident); the last is taken first
	closed bool
	st     Stats
}

// New returns an empty, open queue. Sizes below 1 count as 1.
func New[C any](cfg Config) *Queue[C] {
	cfg.QueueSize = max(cfg.QueueSize, 1)
	cfg.Slots = max(cfg.Slots, 1)
	cfg.Resident = min(max(cfg.Resident, 0), cfg.Slots)
	q := &Queue[C]{cfg: cfg, slots: make([]procSlot[C], cfg.Slots)}
	q.wait.limit = cfg.QueueSize
	q.ready[0] = make([]int, 0, cfg.Resident)
	q.ready[1] = make([]int, 0, cfg.Slots-cfg.Resident)
	return q
}

// Config is the configuration the queue was made with.
func (q *Queue[C]) Config() Config { return q.cfg }

func (q *Queue[C]) kind(slot int) int {
	if slot < q.cfg.Resident {
		return 0
	}
	return 1
}

func (q *Queue[C]) valid(slot int) bool { return slot >= 0 && slot < len(q.slots) }

// Submit admits call with its deadline (unix ns, 0 none). It returns the
// slot of the ready process to hand it to now, or Slot -1 when the call
// waits; ErrFull when QueueSize calls wait, ErrClosed after Close.
func (q *Queue[C]) Submit(call C, deadline int64) (Dispatch[C], error) {
	if q.closed {
		return Dispatch[C]{Slot: -1}, ErrClosed
	}
	if s := q.popReady(); s >= 0 {
		q.st.Queued++
		q.hold(s, call, deadline)
		return Dispatch[C]{Slot: s, Call: call}, nil
	}
	if !q.wait.push(waitingCall[C]{call, deadline}) {
		q.st.Refused++
		return Dispatch[C]{Slot: -1}, ErrFull
	}
	q.st.Queued++
	return Dispatch[C]{Slot: -1}, nil
}

// Ready says the process in slot attached and waits for a call: it gets
// the call at the head of the queue (returned) or joins the ready
// processes. A slot that is retiring, or that holds a call, is left as it is.
func (q *Queue[C]) Ready(slot int) Dispatch[C] {
	if !q.valid(slot) {
		return Dispatch[C]{Slot: -1}
	}
	sl := &q.slots[slot]
	if sl.state != slotEmpty {
		return Dispatch[C]{Slot: -1}
	}
	return q.next(slot)
}

// next gives the idle process in slot the head of the queue, or makes it ready.
func (q *Queue[C]) next(slot int) Dispatch[C] {
	if w, ok := q.wait.pop(); ok {
		q.hold(slot, w.call, w.deadline)
		return Dispatch[C]{Slot: slot, Call: w.call}
	}
	q.slots[slot] = procSlot[C]{state: slotReady}
	q.ready[q.kind(slot)] = append(q.ready[q.kind(slot)], slot)
	return Dispatch[C]{Slot: -1}
}

func (q *Queue[C]) hold(s int, call C, deadline int64) {
	q.slots[s] = procSlot[C]{state: slotBusy, held: true, call: call, deadline: deadline}
	q.st.Busy++
}

// release empties the call out of slot s and returns it.
func (q *Queue[C]) release(s int) (call C, answered bool) {
	sl := &q.slots[s]
	call, answered = sl.call, sl.answered
	var zero C
	sl.call, sl.held, sl.answered, sl.deadline = zero, false, false, 0
	q.st.Busy--
	return call, answered
}

// popReady takes a ready process: a resident one first, the last to
// become ready first. -1 if none is ready.
func (q *Queue[C]) popReady() int {
	for k := range q.ready {
		if n := len(q.ready[k]); n > 0 {
			s := q.ready[k][n-1]
			q.ready[k] = q.ready[k][:n-1]
			return s
		}
	}
	return -1
}

func (q *Queue[C]) unready(slot int) {
	k := q.kind(slot)
	for i, s := range q.ready[k] {
		if s == slot {
			q.ready[k] = append(q.ready[k][:i], q.ready[k][i+1:]...)
			return
		}
	}
}

// Done says the process in slot completed the call it held. The process
// takes the next waiting call (Completion.Next) unless it is retiring or
// the server refreshes its processes. ok is false when the slot held no
// call (the caller's bookkeeping and the queue disagree: nothing happens).
func (q *Queue[C]) Done(slot int) (c Completion[C], ok bool) {
	c.Next.Slot = -1
	if !q.valid(slot) || !q.slots[slot].held {
		return c, false
	}
	retiring := q.slots[slot].state == slotRetiring
	c.Call, c.Answered = q.release(slot)
	q.st.Processed++
	switch {
	case retiring || q.cfg.Refresh:
		q.slots[slot].state = slotRetiring // leaves; gets nothing more
	default:
		q.slots[slot].state = slotEmpty
		c.Next = q.next(slot)
	}
	return c, true
}

// Exited says the process in slot ended (its slot is empty until a new
// process is Ready there). started says whether it had taken the call it
// was handed: a call it never took goes back to the head of the queue (or
// at once to another ready process, in Exit.Next); a call it took is
// answered 'server terminated' unless its caller was answered already.
func (q *Queue[C]) Exited(slot int, started bool) (ex Exit[C]) {
	ex.Next.Slot = -1
	if !q.valid(slot) {
		return ex
	}
	sl := &q.slots[slot]
	if sl.state == slotReady {
		q.unready(slot)
	}
	if !sl.held {
		q.slots[slot] = procSlot[C]{}
		return ex
	}
	deadline := sl.deadline
	call, answered := q.release(slot)
	q.slots[slot] = procSlot[C]{}
	ex.Call, ex.Held = call, true
	switch {
	case answered:
		ex.Outcome = NoCall
	case started:
		ex.Outcome = Terminated
		q.st.Terminated++
	default:
		ex.Outcome = Requeued
		q.st.Requeued++
		if s := q.popReady(); s >= 0 {
			q.hold(s, call, deadline)
			ex.Next = Dispatch[C]{Slot: s, Call: call}
		} else {
			q.wait.pushFront(waitingCall[C]{call, deadline})
		}
	}
	return ex
}

// Retire stops handing calls to the process in slot (it is to stop, or its
// server shrinks). It reports whether the process still holds a call, which
// it finishes before it leaves.
func (q *Queue[C]) Retire(slot int) (holds bool) {
	if !q.valid(slot) {
		return false
	}
	sl := &q.slots[slot]
	if sl.state == slotReady {
		q.unready(slot)
	}
	sl.state = slotRetiring
	return sl.held
}

// Expire answers the calls whose deadline is at or before now: those
// waiting leave the queue, those held by a process are marked answered
// (the process may still finish them; Done then drops the reply). Each is
// appended to late, to be answered 'timed out'.
func (q *Queue[C]) Expire(now int64, late []C) []C {
	before := len(late)
	late = q.removeWaiting(func(w *waitingCall[C]) bool {
		return w.deadline != 0 && w.deadline <= now
	}, late)
	for i := range q.slots {
		sl := &q.slots[i]
		if sl.held && !sl.answered && sl.deadline != 0 && sl.deadline <= now {
			sl.answered = true
			late = append(late, sl.call)
		}
	}
	q.st.TimedOut += uint64(len(late) - before)
	return late
}

// Close refuses every later Submit with ErrClosed. Waiting calls stay and
// are still handed to processes.
func (q *Queue[C]) Close() { q.closed = true }

// Closed reports whether Close was called.
func (q *Queue[C]) Closed() bool { return q.closed }

// Flush empties the queue of waiting calls (the node stops with calls it
// could not serve) and appends them to out, to be answered.
func (q *Queue[C]) Flush(out []C) []C {
	return q.removeWaiting(func(*waitingCall[C]) bool { return true }, out)
}

// Held reports the call slot holds, if any, and whether its caller was
// answered already.
func (q *Queue[C]) Held(slot int) (call C, answered, ok bool) {
	if !q.valid(slot) || !q.slots[slot].held {
		return call, false, false
	}
	sl := &q.slots[slot]
	return sl.call, sl.answered, true
}

// Waiting is the number of calls in the queue (the documents' q).
func (q *Queue[C]) Waiting() int { return q.wait.n }

// InFlight counts the calls not yet finished: waiting or held by a process.
func (q *Queue[C]) InFlight() int { return q.wait.n + q.st.Busy }

// ReadyCount is the number of processes waiting for a call.
func (q *Queue[C]) ReadyCount() int { return len(q.ready[0]) + len(q.ready[1]) }

// Stats returns the counters.
func (q *Queue[C]) Stats() Stats {
	st := q.st
	st.Waiting = q.wait.n
	return st
}

// ring is a FIFO that grows up to limit entries and never shrinks.
type ring[T any] struct {
	buf   []T
	head  int // index of the first entry
	n     int
	limit int
}

func (r *ring[T]) push(v T) bool {
	if r.n >= r.limit {
		return false
	}
	r.grow()
	r.buf[(r.head+r.n)%len(r.buf)] = v
	r.n++
	return true
}

// pushFront puts v at the head; it may exceed limit by the calls requeued
// (each was admitted once already and must not be lost).
func (r *ring[T]) pushFront(v T) {
	r.grow()
	r.head = (r.head - 1 + len(r.buf)) % len(r.buf)
	r.buf[r.head] = v
	r.n++
}

func (r *ring[T]) grow() {
	if r.n < len(r.buf) {
		return
	}
	size := max(8, 2*len(r.buf))
	if size > r.limit && r.n < r.limit {
		size = r.limit
	}
	size = max(size, r.n+1)
	nb := make([]T, size)
	for i := range r.n {
		nb[i] = r.buf[(r.head+i)%len(r.buf)]
	}
	r.buf, r.head = nb, 0
}

func (r *ring[T]) pop() (T, bool) {
	var zero T
	if r.n == 0 {
		return zero, false
	}
	v := r.buf[r.head]
	r.buf[r.head] = zero
	r.head = (r.head + 1) % len(r.buf)
	r.n--
	return v, true
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
