package local

import (
	"errors"
	"log/slog"
	"os"
	"slices"
	"time"

	"tpsched/netio"
	"tpsched/procmgr"
	"tpsched/scd/call"
	"tpsched/scd/schedq"
	"tpsched/shm/sockmode"
)

// delegate is a group as procmgr's Delegate for its server's processes
// (procmgr.Delegate says what each method may do). procmgr calls it
// without its own locks, from its goroutines; each method takes the
// group's mu for a few microseconds and calls nothing of procmgr under it.
type delegate Group

// Prepare makes a fresh transport end for the process about to start in
// slot. The transport removes what the slot had first, whether or not it
// makes the new end (out of descriptors, say): the slot is emptied before,
// so that the reader never looks at a removed area.
func (d *delegate) Prepare(slot int) ([]*os.File, error) {
	g := (*Group)(d)
	g.mu.Lock()
	if old := g.slots[slot].p; old != nil && old.PID() != 0 {
		// The slot's last process was never reaped: its server was
		// stopped, killed it, gave up waiting for its exit (uninterruptible
		// sleep) and is starting again. It runs no more code; its calls
		// are settled now as at its exit, which will find another process
		// here and do nothing. Left to that exit, they would wait for it
		// (forever, maybe), and the slot with them.
		g.settleExit(slot, old, errNotReaped) // releases mu
		g.mu.Lock()
	}
	defer g.mu.Unlock()
	g.slots[slot] = slotState{}
	g.q.Renew(slot)
	p, err := g.tr.newProc(slot)
	if err != nil {
		return nil, err
	}
	g.slots[slot] = slotState{p: p}
	return p.Files(), nil
}

// Started gives the process in slot the pid it was started with, for the
// log's lines about it.
func (d *delegate) Started(slot, pid int) {
	g := (*Group)(d)
	g.mu.Lock()
	defer g.mu.Unlock()
	if p := g.slots[slot].p; p != nil {
		p.SetPID(pid)
	}
}

// Exited settles the calls the dead process held: completions it managed
// to write are answered, a call it had taken is answered 'server
// terminated', one it never took goes back to the queue. procmgr calls it
// from one goroutine per slot, so two processes of the group may end at
// once: what is settled after mu is released is this call's own.
func (d *delegate) Exited(slot, pid int, exitErr error) {
	g := (*Group)(d)
	g.mu.Lock()
	si := &g.slots[slot]
	p := si.p
	if p == nil || pid != 0 && p.PID() != pid {
		// Nothing, or another process: a server stopped while a process
		// it killed was not yet reaped, and started again, has a new
		// process in the slot (started or about to), which the old one's
		// exit must not end.
		g.mu.Unlock()
		return
	}
	g.settleExit(slot, p, exitErr)
}

// errNotReaped is why the calls of a process settled before its exit was
// seen (Prepare) end.
var errNotReaped = errors.New("killed, not reaped")

// settleExit is Exited's work for the process p of slot, which runs no
// more code. mu is held, and released before the answers go out.
func (g *Group) settleExit(slot int, p proc, exitErr error) {
	si := &g.slots[slot]
	g.q.Retire(slot) // no new call for it; its prefetched one is asked back
	g.act()
	why := "the UAP process serving the call died"
	if exitErr != nil {
		why += " (" + exitErr.Error() + ")"
	}
	if g.endLaneOf(slot, why) {
		g.terminated.Inc()
	}
	type answer struct {
		to call.Caller
		b  []byte
	}
	var answers []answer
	for {
		c, ok, err := p.Completion()
		if !ok {
			break
		}
		if errors.Is(err, sockmode.ErrNothingTaken) {
			g.misbehaved.Inc()
			break // what it holds it never had whole: Exited below requeues it
		}
		// A completion is the end of its call even when it is unusable:
		// the queue is told, or it would count the call among those never
		// taken and hand it to another process, to run a second time.
		done, held := g.q.Done(slot)
		if !held {
			// A completion of no call the queue holds: the transport is
			// out of step with the queue (a fault of ours, not the
			// process's). Nothing to answer; a nil call here took the
			// node down once (5248678).
			g.logLater(slog.LevelError, "a completion of no call held, at a process's exit", "group", g.name, "slot", slot, "pid", p.PID())
			break
		}
		if err != nil {
			g.misbehaved.Inc()
			if !done.Answered {
				g.terminated.Inc()
			}
			if !done.Answered && !done.Call.noReply {
				answers = append(answers, answer{done.Call.to, netio.AppendError(nil, done.Call.id,
					netio.CodeServerTerminated, "the UAP process serving the call broke the protocol and died")})
			}
			freeRequest(done.Call)
			break // what it completed after a broken answer is not trusted either: taken calls end 'server terminated'
		}
		si.served++
		if !done.Answered && !done.Call.noReply {
			answers = append(answers, answer{done.Call.to, appendAnswer(nil, done.Call.id, &c)})
		}
		freeRequest(done.Call)
	}
	g.exits = g.q.Exited(slot, p.Taken(), g.exits[:0])
	var settle []schedq.ExitedCall[*request] // g.exits is the next Exited's once mu is released
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
	u.procs = slices.DeleteFunc(u.procs, func(k slotPID) bool { return k.slot == slot }) // dead already
	g.answering.Add(int64(len(answers) + len(settle)))
	g.mu.Unlock()
	u.settle(g)
	for _, a := range answers {
		_ = a.to.Send(a.b)
		g.answering.Add(-1)
	}
	for _, e := range settle {
		if e.Outcome == schedq.Terminated {
			g.terminated.Inc()
			e.Call.fail(netio.CodeServerTerminated, why)
		}
		freeRequest(e.Call)
		g.answering.Add(-1)
	}
}

// Waiting is the number of calls in the queue.
func (d *delegate) Waiting() int {
	g := (*Group)(d)
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.q.Waiting()
}

// Slot says what the process in slot does.
func (d *delegate) Slot(slot int) procmgr.SlotView {
	g := (*Group)(d)
	g.mu.Lock()
	defer g.mu.Unlock()
	si := &g.slots[slot]
	return procmgr.SlotView{Busy: g.q.Held(slot) > 0 || g.q.Lent(slot), Ready: si.attached && si.p != nil && !si.p.Left(), Served: si.served}
}

// Stop asks the process in slot to leave after the call it holds.
func (d *delegate) Stop(slot int) { (*Group)(d).stopSlot(slot) }

// stopSlot asks the process in slot to leave after the call it holds.
func (g *Group) stopSlot(slot int) {
	g.mu.Lock()
	g.q.Retire(slot)
	g.act()
	for _, ls := range g.lanes.open {
		if ls.slot == slot {
			g.revokeLane(ls, time.Now(), revokeStopped)
		}
	}
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
func (d *delegate) Failing(err error) {
	g := (*Group)(d)
	if err == nil {
		g.failing.Store(nil)
		return
	}
	g.failing.Store(&err)
	g.flush(netio.CodeServerTerminated, err.Error())
}
