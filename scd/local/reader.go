package local

import (
	"errors"
	"log/slog"
	"time"

	"tpsched/netio"
	"tpsched/scd/call"
	"tpsched/scd/schedq"
	"tpsched/shm"
	"tpsched/shm/sockmode"
)

// This file is the reply reader: the one place where the node waits for
// its groups' processes and turns what they did into answers to callers,
// calls of their own, and news for procmgr.
//
// Every shared-memory group is read by one dispatcher (Scheduler.dispatch),
// a goroutine that waits on the node's doorbells (shm.Doorbells) and looks
// at every group after each wake. So a local call, from a process of one
// group to a process of another, is taken from the caller's area, handed
// to the callee, seen completed and answered into the caller's area by one
// thread: the caller and the callee are the only ones woken (the reader
// spins while the callee works, when a CPU is idle for it, see
// shm.Doorbells.Wait), where a reader per group woke the caller's reader
// and the callee's in between. A socket-receiving group keeps a reader of
// its own (run), since its transport waits on its socket.
//
// The contract with the rest of the package: a reader takes its group's
// mu only inside collect, answers callers and places the processes' own
// calls without it (call.Caller and the place function may take other
// locks), calls procmgr (Attached, Kill) without it, and writes what it
// logs without it (logLater: a log write waits for stderr).

// reader is one group's part of the reading and what it reuses between
// looks.
type reader struct {
	g        *Group
	batches  map[call.Caller][]byte // answers by caller, written once per look
	attached []slotPID              // processes that attached
	bad      []slotPID              // processes that broke the protocol
	calls    []localCall            // calls the processes made
	answered []outCaller            // calling processes answered in their areas, to wake without mu
	logs     []logRecord            // what collect found to log, written without mu
	owed     int                    // the answers in batches, in g.answering until deliver sends them
}

// owe puts an answer to to in its batch; collect adds what it owed to
// g.answering once, under mu.
func (r *reader) owe(to call.Caller, batch []byte) {
	r.batches[to] = batch
	r.owed++
}

// dispatch is the reader of every shared-memory group: wait on the
// doorbells, look at every group, deliver, until stop.
func (s *Scheduler) dispatch() {
	wait := dispatchWait
	for {
		select {
		case <-s.stop:
			return
		default:
		}
		// Stamped before each wait: a look that blocks (a caller's Send, a
		// log write, a bug) ages it, a wait of at most dispatchIdleWait
		// does not age it past dispatchStall.
		s.lastLook.Store(time.Now().UnixNano())
		if s.bells.Wait(wait) {
			wait = dispatchWait
		} else {
			wait = min(2*wait, dispatchIdleWait)
		}
		for _, r := range *s.readers.Load() {
			r.collect()
			r.deliver()
		}
	}
}

// dispatchWait bounds the dispatcher's wait for a doorbell while the
// processes ring: it looks at every group at least that often. The look
// without a ring is a safety net (every process rings for what the reader
// must see), so each wait that nothing ends doubles the bound, up to
// dispatchIdleWait: on a quiet node with many processes the looks at
// every process's area ten times a second were a large part of scdd's
// CPU. Close interrupts the wait.
const dispatchWait = 100 * time.Millisecond

// dispatchIdleWait is the longest wait of a dispatcher nothing woke.
const dispatchIdleWait = 500 * time.Millisecond

// dispatchStall is how long the dispatcher may go without a look before
// the watchdog warns: two of its longest waits.
const dispatchStall = 2 * dispatchIdleWait

// lookAge is how long ago, at now, the dispatcher last went back to wait
// after its looks.
func (s *Scheduler) lookAge(now time.Time) time.Duration {
	return now.Sub(time.Unix(0, s.lastLook.Load()))
}

// checkDispatcher is the dispatcher's watchdog, on the expiry loop: a
// warning once when it has not looked for dispatchStall while it reads
// groups (the calls of every shared-memory group then go unanswered), and
// a note when it looks again.
func (s *Scheduler) checkDispatcher(now time.Time) {
	if rs := s.readers.Load(); rs == nil || len(*rs) == 0 {
		return // no shared-memory group: it only waits
	}
	age := s.lookAge(now)
	switch {
	case !s.stalled && age > dispatchStall:
		s.stalled = true
		s.log.Warn("the dispatcher has not looked at the shared-memory groups for too long; their calls wait unanswered",
			"since", age.Round(time.Millisecond), "limit", dispatchStall)
	case s.stalled && age <= dispatchStall:
		s.stalled = false
		s.log.Info("the dispatcher looks at the shared-memory groups again")
	}
}

// run is a socket-receiving group's own reader: wait, look, deliver.
func (r *reader) run(stop <-chan struct{}) {
	g := r.g
	r.batches = make(map[call.Caller][]byte)
	for {
		select {
		case <-stop:
			return
		default:
		}
		g.tr.Wait(100 * time.Millisecond)
		r.collect()
		r.deliver()
	}
}

// deliver sends what collect gathered: each caller's answers in one Send,
// the processes' own calls to where they go, and the attaches and the
// processes to kill to procmgr. Without mu.
func (r *reader) deliver() {
	g := r.g
	for _, l := range r.logs {
		l.write(g.log)
	}
	clear(r.logs)
	r.logs = r.logs[:0]
	for _, p := range r.answered {
		p.WakeOutCaller()
	}
	clear(r.answered)
	r.answered = r.answered[:0]
	for c, b := range r.batches {
		_ = c.Send(b)
		delete(r.batches, c)
	}
	g.answering.Add(-int64(r.owed))
	r.owed = 0
	r.placeLocalCalls(r.calls)
	clear(r.calls)
	for _, a := range r.attached {
		g.procs.Attached(a.slot, a.pid)
	}
	for _, b := range r.bad {
		g.procs.Kill(b.slot, b.pid)
	}
}

// collect looks at every process once: attaches, completions, calls of
// its own, doorbells rung without cause. It appends the answers to
// batches and notes the slots that attached, those whose processes must
// be killed and the calls the processes made.
func (r *reader) collect() {
	g := r.g
	r.attached, r.bad, r.calls = r.attached[:0], r.bad[:0], r.calls[:0]
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now() // under mu: every call seen here was admitted before
	classes := g.classes.Load()
	if len(g.lanes.open) > 0 {
		g.lookLanes(now)
	}
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
		if si.laneLeft {
			si.laneLeft = false
			causes++
		}
		if p.Attach() {
			si.attached = true
			si.since = now
			causes++
			r.attached = append(r.attached, slotPID{slot, p.PID()})
			checkEntries(g, slot, si)
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
				// before Done, so the queue hands it nothing more; acted
				// on after Done, since p no longer holds the completed
				// call: the revoke of a call behind it must meet a queue
				// that no longer holds it either.
				g.misbehaved.Inc()
				g.logLater(slog.LevelError, "uap broke the protocol; killing it", "group", g.name, "slot", slot, "pid", p.PID(), "err", err)
				g.q.Retire(slot)
				var done schedq.Completion[*request]
				held := false
				if !errors.Is(err, sockmode.ErrNothingTaken) {
					// A socket process may break it holding no call it
					// was sent: what it holds was never run, and goes back
					// to the queue at its exit (settleExit), not answered.
					done, held = g.q.Done(slot)
				}
				g.act()
				if cl := done.Call; held {
					if !done.Answered {
						g.terminated.Inc()
					}
					if !done.Answered && !cl.noReply {
						r.owe(cl.to, netio.AppendError(r.batches[cl.to], cl.id, netio.CodeServerTerminated,
							"the UAP process serving the call broke the protocol and was killed"))
					}
					freeRequest(cl)
				}
				si.killed = true
				p.Ignore() // until its exit, which reads it once more
				r.bad = append(r.bad, slotPID{slot, p.PID()})
				break
			}
			done, held := g.q.Done(slot)
			if !held {
				// A completion of no call the queue holds: the transport
				// is out of step with the queue (a fault of ours). Nothing
				// to answer, and a nil call must not take the node down.
				g.logLater(slog.LevelError, "a completion of no call held", "group", g.name, "slot", slot, "pid", p.PID())
				break
			}
			cl := done.Call
			si.served++
			if !done.Answered && !cl.noReply {
				if u, ok := cl.to.(*uapCaller); ok && u.answer(cl.id, &c) {
					// Straight into the calling process's area, one copy:
					// no frame to make and decode again.
					r.answered = append(r.answered, u.p)
				} else {
					r.owe(cl.to, appendAnswer(r.batches[cl.to], cl.id, &c))
				}
			}
			g.latency.Update(now.Sub(cl.start).Seconds())
			if !done.Answered { // one answered 'timed out' was measured then (expire)
				classes.Record(cl.class, cl.start, si.since, now)
			}
			si.since = now
			u, _ := cl.to.(*uapCaller)
			freeRequest(cl)
			g.act() // after the reply was copied out of the mailbox
			if u != nil && u.laneLater.Load() != nil {
				g.offerLaneAtEnd(u, now) // after act: the process is free unless a call waited
			}
		}
		if si.killed {
			continue
		}
		if oc, ok := p.(outCaller); ok {
			if c, made, err := oc.OutCall(); err != nil {
				g.misbehaved.Inc()
				g.logLater(slog.LevelError, "uap broke the shared-memory protocol in a call of its own; killing it", "group", g.name, "slot", slot, "pid", p.PID(), "err", err)
				causes++
				g.q.Retire(slot)
				g.act()
				si.killed = true
				p.Ignore()
				r.bad = append(r.bad, slotPID{slot, p.PID()})
				continue
			} else if made {
				causes++
				if si.caller == nil || si.caller.p != oc {
					si.caller = &uapCaller{p: oc, maxMsg: g.def.MaxMessageSize, calls: g.localCalls, cpuGroup: g.inCPUGroup}
				}
				c.TimeoutMs = boundOutCall(c.TimeoutMs, g.q.CurrentDeadline(slot), now)
				r.calls = append(r.calls, localCall{si.caller, c})
			}
		}
		if !si.leftSeen && p.Left() {
			si.leftSeen = true
			causes++
		}
		if si.checkRings(rings, causes) {
			g.misbehaved.Inc()
			g.logLater(slog.LevelError, "uap rings the scheduler without cause; killing it", "group", g.name, "slot", slot, "pid", p.PID(),
				"rings", si.rings, "without_cause", si.idleRings)
			g.q.Retire(slot)
			g.act()
			si.killed = true
			p.Ignore()
			r.bad = append(r.bad, slotPID{slot, p.PID()})
		}
	}
	g.answering.Add(int64(r.owed)) // in the look that took them off the queue
	u := g.takeUndelivered()       // its calls are in g.answering: owed here
	for _, c := range u.calls {
		g.terminated.Inc()
		if !c.cl.noReply {
			r.batches[c.cl.to] = netio.AppendError(r.batches[c.cl.to], c.cl.id, netio.CodeServerTerminated, c.why)
		}
		r.owed++
		freeRequest(c.cl)
	}
	r.bad = append(r.bad, u.procs...)
	r.logs = append(r.logs, u.logs...) // collect's own records, logLater's, and act's
}

// appendAnswer is the answer frame of a completion, under the caller's
// id.
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
