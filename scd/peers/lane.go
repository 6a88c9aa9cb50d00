package peers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"tpsched/netio"
	"tpsched/scd/def"
)

// peerQueue bounds the calls waiting for one target's lanes: beyond it a
// call is refused server busy rather than buffered without limit.
const peerQueue = 4096

// writeBatch is how many bytes of queued calls a lane gathers into one
// write.
const writeBatch = 64 << 10

// maxRedirects bounds the 'wrong receiver' answers one call may meet.
const maxRedirects = 2

// maxPeerLanes bounds a peer's lanes, over all its targets: twice the
// receiving sockets a node can have (256, netio's and the definitions'
// limit), room for a node whose receivers moved. The receivers lookups that
// start lanes are the other node's answers; past the bound a call goes to
// the node's RPC port, which answers what it cannot take.
const maxPeerLanes = 512

// lookupTimeout bounds a receivers lookup.
const lookupTimeout = 2 * time.Second

// target is one address of a peer's node, with its queue and lanes.
type target struct {
	p     *peer
	addr  string
	group string // a service group received here, for its lanes' receivers lookups
	queue chan *Call
	lanes int // guarded by p.mu: lanes started
	held  int // guarded by p.mu: calls dialling lanes took off the queue, counted in its bound
	// serving is the lanes with a connection; guarded by p.mu. While one
	// has, a dialling lane leaves the queue to it.
	serving int
	taken   map[int]int // guarded by p.mu: receiving socket -> lanes connected to it
}

// runLane keeps one connection to the target while calls come.
func (t *target) runLane() {
	p := t.p
	defer p.pool.wg.Done()
	defer func() {
		p.mu.Lock()
		p.lanesRunning--
		p.mu.Unlock()
	}()
	var carried []*Call // taken off the queue, not sent: they go first on the next connection
	here := -1          // the receiving socket of the lane's connection, when known
	for {
		if len(carried) == 0 {
			var first *Call
			select {
			case <-p.stop:
			case first = <-t.queue:
				carried = append(carried, first)
			}
		}
		select {
		case <-p.stop:
			for _, cl := range carried {
				p.handOn(cl)
			}
			t.emptyQueue()
			return
		default:
		}
		var mc *netio.MuxConn
		var err error
		mc, carried, err = t.dialWatching(&here, carried)
		if errors.Is(err, errPeerStopped) {
			continue // its calls were handed on; the loop's top ends the lane
		}
		if err != nil {
			if errors.Is(err, ErrHelloRefused) {
				p.pool.log.Warn("peer hello failed", "node", p.node, "addr", t.addr, "err", err)
			} else {
				p.pool.log.Debug("peer unreachable", "node", p.node, "addr", t.addr, "err", err)
			}
			if t.addr != p.addr {
				p.forgetAddr(t.addr)
			}
			// Before any answer: the caller told may call again at once.
			p.dialFailedUnlessConnected()
			// While another lane of the target has its connection, the
			// node is reached: the calls go out there.
			var sibling bool
			carried, sibling = t.requeue(carried)
			for _, cl := range carried {
				p.retry(cl, err)
			}
			carried = carried[:0]
			if !sibling {
				t.retryQueued(err)
			}
			continue
		}
		carried = t.serve(mc, carried)
		t.release(&here)
	}
}

// siblingRecheck is how often a dialling lane of a target with several
// lanes looks whether another has its connection (to leave it the calls)
// or, having left them to one, whether it still has.
const siblingRecheck = 50 * time.Millisecond

// errPeerStopped ends a dial the peer stopped during: the calls waiting
// for it were handed on, and its connection, if it came, closed.
var errPeerStopped = errors.New("the peer stopped while its lane dialled")

// dialWatching dials (dial) on another goroutine while the lane keeps the
// calls that wait for the connection: carried, and those queued meanwhile,
// which it takes off the queue (held counts them against the queue's
// bound) unless another lane of the target has a connection to send them
// on. A call whose deadline passes meanwhile is answered 'timed out'
// then, not when the dial ends (the connect and the hello may take their
// bounds): the lane is the one owner of every call it holds, so each gets
// one answer. When the peer stops meanwhile its calls are handed on at
// once, and the dial is waited for and its connection closed
// (errPeerStopped). It returns the calls still waiting, in their order.
func (t *target) dialWatching(here *int, carried []*Call) (*netio.MuxConn, []*Call, error) {
	p := t.p
	type dialled struct {
		mc   *netio.MuxConn
		here int
		err  error
	}
	res := make(chan dialled, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		d := dialled{here: -1}
		d.mc, d.err = t.dial(ctx, &d.here)
		res <- d
	}()
	// carried[:before] came with the lane; the rest it took off the
	// queue, mine of t.held (each lane gives back its own).
	before, mine := len(carried), 0
	setMine := func(n int) {
		p.mu.Lock()
		t.held += n - mine
		p.mu.Unlock()
		mine = n
	}
	defer setMine(0)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var next time.Time // the earliest deadline in carried; zero: none
	watch := func(cl *Call) {
		if !cl.Deadline.IsZero() && (next.IsZero() || cl.Deadline.Before(next)) {
			next = cl.Deadline
			timer.Reset(time.Until(next))
		}
	}
	for _, cl := range carried {
		watch(cl)
	}
	stop := p.stop
	for {
		queue := t.queue
		var recheck <-chan time.Time
		p.mu.Lock()
		sibling, multi := t.serving > 0, t.lanes > 1
		p.mu.Unlock()
		if multi {
			// A sibling lane that connects wakes nobody: look again
			// soon (calls held here would wait for this dial).
			recheck = time.After(siblingRecheck)
		}
		if sibling && stop != nil {
			// Another lane sends them at once: those held go back to
			// the queue, and it is left to that lane; look again soon,
			// in case its connection ends.
			rest, _ := t.requeue(carried)
			back := len(carried) - len(rest)
			clear(carried[:back])
			carried, before = rest, max(before-back, 0)
			setMine(len(carried) - before)
			queue, recheck = nil, time.After(siblingRecheck)
		}
		select {
		case <-recheck:
		case d := <-res:
			if stop == nil { // stopped: its calls went on already
				if d.mc != nil {
					d.mc.Close(fmt.Errorf("connection to node %s closed: its peer stopped", p.node))
				}
				t.release(&d.here)
				return nil, nil, errPeerStopped
			}
			*here = d.here
			return d.mc, carried, d.err
		case <-stop:
			for _, cl := range carried {
				p.handOn(cl)
			}
			carried, before = nil, 0
			setMine(0)
			t.emptyQueue()
			cancel()   // the dial ends at once
			stop = nil // and is waited for
		case cl := <-queue:
			if stop == nil {
				p.handOn(cl) // queued before the stop, taken after it
				continue
			}
			setMine(mine + 1)
			carried = append(carried, cl)
			watch(cl)
		case <-timer.C:
			now := time.Now()
			kept, keptBefore := carried[:0], 0
			next = time.Time{}
			for i, cl := range carried {
				if _, ok := cl.TimeLeft(now); !ok {
					cl.FailLate("while a connection to node " + p.node + " was dialled")
					p.count(cl, -1) // after the answer: see Answer
					continue
				}
				if i < before {
					keptBefore++
				}
				kept = append(kept, cl)
				if !cl.Deadline.IsZero() && (next.IsZero() || cl.Deadline.Before(next)) {
					next = cl.Deadline
				}
			}
			clear(carried[len(kept):])
			carried, before = kept, keptBefore
			setMine(len(kept) - keptBefore)
			if !next.IsZero() {
				timer.Reset(time.Until(next))
			}
		}
	}
}

// requeue puts calls back in the queue, in their order, while another
// lane of the target has its connection to send them on. It returns those
// it did not put back (no lane has a connection, the peer stopped, or the
// queue is full), and whether a lane has one.
func (t *target) requeue(calls []*Call) (rest []*Call, sibling bool) {
	p := t.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped || t.serving == 0 {
		return calls, false
	}
	for i, cl := range calls {
		select {
		case t.queue <- cl: // never waits: the queue is full or not
		default:
			return calls[i:], true
		}
	}
	return nil, true
}

// dial connects a lane: the hello, then, when the target has several
// lanes, a receivers lookup that says which receiving socket the
// connection landed on. A connection on a socket another lane of the
// target has already is dialled again, a few times (the kernel's hash
// places connections; the steering program gives each new one to the
// socket with the least work, so it rarely needs to).
func (t *target) dial(ctx context.Context, here *int) (*netio.MuxConn, error) {
	p := t.p
	for attempt := 0; ; attempt++ {
		nc, fr, err := dial(ctx, t.addr, p.pool.self, p.node, p.pool.key, p.pool.userTimeout)
		if err != nil {
			return nil, err
		}
		mc := netio.NewMuxConn(nc, netio.MuxOptions{MaxPayload: def.MaxMaxMessageSize, Reader: fr})
		p.mu.Lock()
		lanes := t.lanes
		p.mu.Unlock()
		if lanes < 2 {
			return mc, nil
		}
		// ctx ending (the peer stops) ends the lookup too: its
		// connection closes, and the lane closes it at once after.
		cut := context.AfterFunc(ctx, func() { mc.Close(ctx.Err()) })
		r, err := lookupReceivers(mc, t.group, time.Now().Add(lookupTimeout))
		cut()
		if err != nil || r.Here < 0 {
			return mc, nil // served all the same; the node answers what it cannot take
		}
		p.mu.Lock()
		busy := t.taken[r.Here] > 0 && attempt < 3*lanes
		if !busy {
			t.taken[r.Here]++
			*here = r.Here
		}
		p.mu.Unlock()
		if !busy {
			return mc, nil
		}
		mc.Close(errors.New("another lane has this receiving socket"))
	}
}

// release forgets the receiving socket of a lane's connection that ended.
func (t *target) release(here *int) {
	if *here < 0 {
		return
	}
	t.p.mu.Lock()
	if t.taken[*here]--; t.taken[*here] <= 0 {
		delete(t.taken, *here)
	}
	t.p.mu.Unlock()
	*here = -1
}

// lookupReceivers asks the node on mc where group is received, waiting
// for the answer until deadline.
func lookupReceivers(mc *netio.MuxConn, group string, deadline time.Time) (netio.Receivers, error) {
	w := &lookupWaiter{ch: make(chan lookupResult, 1)}
	_, sent, err := mc.Call(netio.Header{Kind: netio.KindNameLookup}, group, netio.LookupReceivers, nil, deadline, w)
	if !sent {
		return netio.Receivers{}, err
	}
	wait := time.NewTimer(time.Until(deadline))
	defer wait.Stop()
	select {
	case r := <-w.ch:
		if r.err != nil {
			return netio.Receivers{}, r.err
		}
		if r.f.Kind != netio.KindReply {
			return netio.Receivers{}, &netio.Error{Code: r.f.Code, Message: string(r.f.Payload)}
		}
		return netio.ParseReceivers(r.f.Payload)
	case <-wait.C:
		return netio.Receivers{}, errors.New("receivers lookup: no answer in time")
	}
}

type lookupResult struct {
	f   netio.Frame
	err error
}

type lookupWaiter struct{ ch chan lookupResult }

func (w *lookupWaiter) Answer(f netio.Frame, err error) { w.ch <- lookupResult{f, err} }

// serve writes calls to mc until it fails, the node asks the lane to go
// away or the peer stops; mc's reader answers the callers. It returns the
// calls it took but could not send because mc had closed or was going
// away.
func (t *target) serve(mc *netio.MuxConn, calls []*Call) (unsent []*Call) {
	p := t.p
	p.mu.Lock()
	if p.stopped {
		// Stopped while it dialled: Close (or NodeLeft) may have looked
		// at conns already, so nothing is written here; the lane hands
		// the calls on.
		p.mu.Unlock()
		mc.Close(fmt.Errorf("connection to node %s closed: its peer stopped", p.node))
		return calls
	}
	p.conns[mc] = true
	t.serving++
	p.dialFailed.Store(0) // under mu: dialFailedUnlessConnected looks at serving and stores under it
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		t.serving--
		replaced, left := p.replaced, p.left
		p.mu.Unlock()
		if replaced || left {
			// Its node moved or left: no new call here, but the answers
			// of those sent still come (a silent link's connection is
			// closed by NodeLeft or its TCP_USER_TIMEOUT).
			mc.Retire()
		}
		if mc.GoingAway() {
			// The calls on it are answered by the node that asked (or the
			// node that moved); the connection closes itself after the last.
			go func() {
				<-mc.Done()
				p.mu.Lock()
				delete(p.conns, mc)
				p.mu.Unlock()
			}()
			return
		}
		p.mu.Lock()
		delete(p.conns, mc)
		p.mu.Unlock()
		mc.Close(fmt.Errorf("connection to node %s closed", p.node)) // answers what was sent
	}()
	buf := make([]byte, 0, writeBatch)
	var dl time.Time // the earliest deadline of the calls in buf, which bounds its write
	add := func(cl *Call) {
		if len(unsent) > 0 {
			unsent = append(unsent, cl) // keep their order
			return
		}
		if cl.lookup {
			// The lookup waits for the node (lookupTimeout at most): the
			// calls framed before it go out now, not after it, when their
			// deadlines may have passed and their callers been answered
			// 'timed out' (the connection's expiry answers them).
			if len(buf) > 0 {
				if _, err := mc.Write(buf, dl); err != nil {
					unsent = append(unsent, cl)    // those in buf: the close answered them
					buf, dl = buf[:0], time.Time{} // never written again below
					return
				}
				buf, dl = buf[:0], time.Time{}
			}
			if t.redirect(mc, cl) {
				return
			}
		}
		var ok bool
		if buf, ok = p.frame(buf, mc, cl); !ok {
			unsent = append(unsent, cl)
			return
		}
		d := cl.Deadline
		if d.IsZero() {
			d = time.Now() // none: its write still ends (netio's least bound)
		}
		if dl.IsZero() || d.Before(dl) {
			dl = d
		}
	}
	for _, cl := range calls {
		add(cl)
	}
	for {
	gather:
		for len(buf) < writeBatch && len(unsent) == 0 {
			select {
			case cl := <-t.queue:
				add(cl)
			default:
				break gather
			}
		}
		if len(buf) > 0 {
			// Bounded: a node that stops reading fails the connection
			// (its calls are answered) instead of holding the lane and
			// the calls queued behind it.
			if _, err := mc.Write(buf, dl); err != nil {
				return unsent
			}
		}
		if len(unsent) > 0 {
			return unsent
		}
		if cap(buf) > 4*writeBatch {
			buf = make([]byte, 0, writeBatch) // a huge call's buffer is not kept
		}
		buf, dl = buf[:0], time.Time{}
		select {
		case <-p.stop:
			return nil
		case <-mc.Done():
			return nil
		case cl := <-t.queue:
			add(cl)
		}
	}
}

// redirect asks the node on mc where cl's group is received and, when that
// is another target (or more lanes), hands cl there; it reports whether it
// did. A failed lookup leaves cl to be sent here: the node answers what it
// cannot take. The lookup waits no longer than cl may: past its deadline
// cl is answered 'timed out' (frame), not when the lookup ends.
func (t *target) redirect(mc *netio.MuxConn, cl *Call) bool {
	p := t.p
	cl.lookup = false
	limit := time.Now().Add(lookupTimeout)
	if !cl.Deadline.IsZero() && cl.Deadline.Before(limit) {
		limit = cl.Deadline
	}
	r, err := lookupReceivers(mc, cl.Group, limit)
	if err != nil {
		return false
	}
	p.learned(cl.Group, recvRoute{addr: r.Addr, count: r.Count})
	multi := p.pool.multiSchedule(cl.Group)
	p.mu.Lock()
	lanes := t.lanes
	p.mu.Unlock()
	if r.Addr == t.addr && (!multi || lanes >= r.Count) {
		return false
	}
	// enqueue counts it again; the count it holds goes once it is queued
	// or answered, so that a drain never sees it in neither.
	switch p.enqueue(cl) {
	case enqueued:
		p.count(cl, -1)
	case queueFull:
		cl.Fail(netio.CodeServerBusy, "too many calls waiting for node "+p.node)
		p.count(cl, -1) // after the answer: see Answer
	default:
		p.handOn(cl) // takes its count off
	}
	return true
}

// frame appends cl's frame under a fresh id of mc, which answers it; false
// if mc has closed or is going away. A call whose deadline passed while it
// was queued (a lane dialling) is answered 'timed out' here and not sent:
// the other node would have run it after its caller gave up.
func (p *peer) frame(dst []byte, mc *netio.MuxConn, cl *Call) ([]byte, bool) {
	timeout, ok := cl.TimeLeft(time.Now())
	if !ok {
		cl.FailLate("while it waited to be sent to node " + p.node)
		p.count(cl, -1) // after the answer: see Answer
		return dst, true
	}
	h := netio.Header{Kind: cl.Kind, Flags: netio.FlagForwarded, TimeoutMs: timeout}
	if cl.wantsAnswer() {
		id, err := mc.Expect(cl.Deadline, cl)
		if err != nil {
			return dst, false
		}
		h.ID = id
	} else {
		if mc.Err() != nil || mc.GoingAway() {
			return dst, false
		}
		p.count(cl, -1) // nobody waits for an answer
	}
	if !cl.request {
		p.sentTo.Inc()
	}
	return netio.AppendFrame(dst, h, cl.Group, cl.Service, cl.Payload), true
}

func (t *target) retryQueued(err error) {
	for {
		select {
		case cl := <-t.queue:
			t.p.retry(cl, err)
		default:
			return
		}
	}
}

// emptyQueue deals with the calls still queued when the peer stopped.
func (t *target) emptyQueue() {
	for {
		select {
		case cl := <-t.queue:
			t.p.handOn(cl)
		default:
			return
		}
	}
}
