package cluster

import (
	"sync"
	"sync/atomic"
	"time"

	"tpsched/netio"
	"tpsched/netio/rpcport"
	"tpsched/scd/call"
)

// This file holds the calls a node cannot place yet because it has not
// learned the cluster's name table: a node that joins others starts
// serving (its RPC port, or the sockets a restart handed it) before its
// first push/pull with a seed has told it which node runs which group. A
// call or a name lookup for a group no known node runs then waits, and is
// routed again once the table has settled: when its first join has asked
// every seed (names.Gossip.Joined), or settleBound after Join began when a
// seed has not answered by then. Answered at once, it met 'no such service
// group' for a group another node runs (a restart of the node that
// transfers: 8 calls in 17,000 over two hand-overs).
//
// A waiting call is answered 'timed out' at its deadline, and routed
// anyway (to the same refusal it would have met) after parkBound, so that
// a node that never joins delays nothing for long. At most maxParked wait;
// beyond them calls are routed at once.
//
// A node that stops or hands over before its table settled (a restart
// soon after a restart, with a seed not answering) stops learning it: a
// call or lookup for a group no known node runs and this node does not
// define is then refused as the stop's ('node shutting down', call again),
// not answered 'no such service group' for a group another node may well
// run (cutShort).

const (
	settleBound = 2 * time.Second
	parkBound   = 3 * time.Second
	maxParked   = 1024
)

// parking is the router's waiting room until its table settles.
type parking struct {
	settled    chan struct{} // closed by settle
	done       atomic.Bool   // settled is closed: the look on every call's path
	stopped    atomic.Bool   // settled by stop, before the table did (set before done)
	settleOnce sync.Once
	wake       chan struct{} // a call came with an earlier bound (capacity 1)
	bound      time.Duration // parkBound; shorter in tests

	mu      sync.Mutex
	waiting []parked
	placing int  // taken off waiting by release, not yet routed or answered
	running bool // a releaser goroutine owns waiting
	kept    int  // calls and lookups that waited, for the log
}

// parked is one waiting call or lookup: route places it, expire answers it
// at its deadline.
type parked struct {
	until, deadline time.Time
	route, expire   func()
}

func newParking() *parking {
	return &parking{settled: make(chan struct{}), wake: make(chan struct{}, 1), bound: parkBound}
}

// isSettled reports whether the table has settled; a nil parking (a node
// that joins nobody) always has.
func (p *parking) isSettled() bool {
	return p == nil || p.done.Load()
}

// settle releases every waiting call and lets no more wait. Once.
func (p *parking) settle() {
	if p != nil {
		p.settleOnce.Do(func() { p.done.Store(true); close(p.settled) })
	}
}

// stop settles the wait because the node stops learning the table (it
// leaves, or stops its membership for a new process): if the table had
// not settled, cutShort is true from now on.
func (p *parking) stop() {
	if p != nil {
		p.settleOnce.Do(func() { p.stopped.Store(true); p.done.Store(true); close(p.settled) })
	}
}

// cutShort reports whether the node stopped learning the table before it
// settled: what the table lacks may be what it never learned.
func (p *parking) cutShort() bool {
	return p != nil && p.stopped.Load()
}

// held is how many calls and lookups wait, or are being placed: a drain
// waits for them as for the calls queued (Router.Waiting).
func (p *parking) held() int {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.waiting) + p.placing
}

// waited is how many calls and lookups have waited.
func (p *parking) waited() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.kept
}

// park keeps pc until the table settles; false when it cannot wait (the
// table settled meanwhile, or the room is full), and the caller routes it
// now.
func (p *parking) park(pc parked) bool {
	p.mu.Lock()
	if p.isSettled() || len(p.waiting) >= maxParked {
		p.mu.Unlock()
		return false
	}
	p.waiting = append(p.waiting, pc)
	p.kept++
	start := !p.running
	p.running = true
	p.mu.Unlock()
	if start {
		go p.release()
	} else {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
	return true
}

// release routes the waiting calls when the table settles and ends each
// one's wait at its bound; it returns when none waits.
func (p *parking) release() {
	timer := time.NewTimer(p.bound)
	defer timer.Stop()
	for {
		now := time.Now()
		settled := p.isSettled()
		var due []parked
		next := now.Add(p.bound)
		p.mu.Lock()
		keep := p.waiting[:0]
		for _, pc := range p.waiting {
			switch {
			case settled || !pc.until.After(now):
				due = append(due, pc)
			default:
				keep = append(keep, pc)
				if pc.until.Before(next) {
					next = pc.until
				}
			}
		}
		clear(p.waiting[len(keep):])
		p.waiting = keep
		if len(due) == 0 && len(keep) == 0 {
			p.running = false
			p.mu.Unlock()
			return
		}
		p.placing = len(due) // held until each is answered or counted where it went
		p.mu.Unlock()
		for _, pc := range due {
			if !pc.deadline.IsZero() && !pc.deadline.After(now) {
				pc.expire()
			} else {
				pc.route()
			}
		}
		if len(due) > 0 {
			p.mu.Lock()
			p.placing = 0
			p.mu.Unlock()
			continue // calls may have come meanwhile
		}
		timer.Reset(time.Until(next))
		select {
		case <-p.settled:
		case <-p.wake:
		case <-timer.C:
		}
	}
}

// Settled is closed once the name table has settled (or the node stopped
// learning it); nil for a router that joins nobody, whose table is
// settled from the start. The routing manager decides nothing before.
func (r *Router) Settled() <-chan struct{} {
	if r.parking == nil {
		return nil
	}
	return r.parking.settled
}

// Waiting is how many calls (and lookups) wait for the table to settle or
// are being placed after it: the node's drain counts them as in flight.
func (r *Router) Waiting() int { return r.parking.held() }

// parkCall keeps a call Route could place nowhere while the table has not
// settled; false when it is not kept (park's look: it settled meanwhile,
// or the room is full). The frame is copied: its bytes are
// the event loop's.
func (r *Router) parkCall(c call.Caller, from call.From, f *netio.Frame, deadline time.Time) bool {
	fc := *f
	fc.Group = append([]byte(nil), f.Group...)
	fc.Service = append([]byte(nil), f.Service...)
	fc.Payload = append([]byte(nil), f.Payload...)
	now := time.Now()
	pc := parked{until: now.Add(r.parking.bound), deadline: deadline}
	if !deadline.IsZero() && deadline.Before(pc.until) {
		pc.until = deadline
	}
	pc.route = func() {
		if !deadline.IsZero() {
			// The time it has left, never a fresh budget: a call timed by
			// watch_time would have it measured again from here.
			fc.TimeoutMs = uint32(min(max(time.Until(deadline).Milliseconds(), 1), 1<<32-1))
		}
		handled, code, msg := r.route(c, from, &fc, false)
		if !handled {
			code, msg = r.opts.Local.Serve(c, &fc) // the stage after this one
		}
		if code != netio.CodeOK && fc.Kind == netio.KindCall {
			_ = c.Send(netio.AppendError(nil, fc.ID, code, msg))
		}
	}
	pc.expire = func() {
		if fc.Kind == netio.KindCall {
			_ = c.Send(netio.AppendError(nil, fc.ID, netio.CodeTimedOut,
				"its deadline passed while this node learned which nodes run "+string(fc.Group)))
		}
	}
	return r.parking.park(pc)
}

// parkLookup keeps a balancing client's lookup for a group no known node
// runs while the table has not settled; false when it is not kept.
func (r *Router) parkLookup(c *rpcport.Conn, f *netio.Frame) bool {
	group, id := string(f.Group), f.ID
	answer := func() { _ = c.Send(r.lookupAnswerFrom(id, group, r.names.Lookup(group))) }
	return r.parking.park(parked{until: time.Now().Add(r.parking.bound), route: answer, expire: answer})
}
