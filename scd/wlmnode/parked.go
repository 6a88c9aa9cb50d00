package wlmnode

import (
	"errors"
	"fmt"
	"time"

	"tpsched/netio"
	"tpsched/scd/call"
	"tpsched/scd/peers"
	"tpsched/scd/route"
)

// parking is the calls that wait for a server of an environment no node
// serves yet (the routing manager's stage parks them): each is owned by
// the parked list until the find ends (then it is served, sent on or
// answered) or its deadline passes (then it is answered 'timed out'), both
// under the envs' mu, so every call gets exactly one answer.
type parking struct {
	m      *envs
	parked map[string][]*peers.Call // by environment; guarded by m.mu
	closed bool                     // guarded by m.mu: the manager closed, no call is parked any more
	// handing is how many calls were taken off parked and are not yet
	// served, sent on or answered (guarded by m.mu): by a find for
	// dispatch, or by a deadline, a quiesce or the close for their
	// answers. held counts them, so that a drain does not see none
	// between the take and the answer sent or the local queue or the
	// peer pool that counts them next.
	handing int
}

// waiting is the calls waiting for a server, every environment's.
func (p *parking) waiting() int {
	p.m.mu.Lock()
	defer p.m.mu.Unlock()
	total := 0
	for _, l := range p.parked {
		total += len(l)
	}
	return total
}

// held is the calls the routing manager holds: parked, or being handed on
// by dispatch.
func (p *parking) held() int {
	p.m.mu.Lock()
	defer p.m.mu.Unlock()
	total := p.handing
	for _, l := range p.parked {
		total += len(l)
	}
	return total
}

// schedule takes the calls for groups that have no server here (the
// routing manager's stage): it reports handled when it answered or parked
// the call. A group defined here without a server passes on as one only
// other nodes run: the later stages ask for the group only if it has a
// server here.
//
// from.Peer is the node that transferred the call ("": a client's call,
// or a UAP's own, which is parked like a client's).
func (p *parking) schedule(c call.Caller, from call.From, f *netio.Frame) (bool, netio.Code, string) {
	m := p.m
	name := string(f.Group)
	g, _ := m.local.Group(name)
	if g != nil && g.Serving() {
		return false, 0, ""
	}
	here := "node " + m.self
	refused := from.Peer != "" || f.Flags&netio.FlagDestination != 0
	if !m.isEnv(name) {
		if g == nil {
			if why := m.perInstance(name); why != "" {
				return true, netio.CodeNoSuchGroup, why
			}
			return false, 0, "" // not ours to judge: the usual path
		}
		if refused || !m.servedElsewhere(name) {
			return true, netio.CodeServiceClosed, name + " has no server on " + here + " (its server was stopped)"
		}
		return false, 0, ""
	}
	if refused {
		return true, netio.CodeServiceClosed, "application environment " + name + " has no server on " + here
	}
	if m.servedElsewhere(name) {
		return false, 0, "" // the usual path sends it there
	}
	if g == nil && !m.knownEnv(name) && m.tableSettled() {
		// No node can serve it: 'no such service group'. Before the
		// table settled (a restart's new process that has not joined
		// yet) no node is known at all: the call waits, and its find
		// with it (awaitTable). Passed on, it waited in the router for
		// the table and met no server of the environment there (a
		// dormant one has none), and this node's scheduler answered
		// 'no such service group'.
		return false, 0, ""
	}
	fc := &peers.Call{
		Caller: c, CallerID: f.ID, Kind: f.Kind,
		Group: name, Service: string(f.Service), Payload: append([]byte(nil), f.Payload...),
		TimeoutMs: f.TimeoutMs, Start: time.Now(),
	}
	switch {
	case f.TimeoutMs > 0:
		fc.Deadline = fc.Start.Add(time.Duration(f.TimeoutMs) * time.Millisecond)
	case g != nil && g.Def().WatchTime > 0:
		fc.Deadline = fc.Start.Add(g.Def().WatchTime)
	case m.opts.WatchTime > 0:
		fc.Deadline = fc.Start.Add(m.opts.WatchTime)
	}
	m.mu.Lock()
	if p.closed {
		m.mu.Unlock()
		return true, netio.CodeShuttingDown, ""
	}
	if len(p.parked[name]) >= maxParked {
		m.mu.Unlock()
		return true, netio.CodeServerBusy, fmt.Sprintf("%d calls already wait for a server of %s", maxParked, name)
	}
	p.parked[name] = append(p.parked[name], fc)
	m.findLocked(name)
	m.mu.Unlock()
	return true, netio.CodeOK, ""
}

// dispatch serves, sends on or answers the calls that waited for a find.
func (p *parking) dispatch(parked []*peers.Call, fl *flight) {
	m := p.m
	defer p.handed(len(parked)) // each is counted by the local queue or the peer pool now, or answered
	if fl.err != nil {
		code, msg := netio.CodeNoSuchGroup, fl.err.Error()
		var ne *netio.Error
		if errors.As(fl.err, &ne) {
			code, msg = ne.Code, ne.Message
		}
		for _, fc := range parked {
			fc.Fail(code, msg)
		}
		return
	}
	self := m.self
	for i, fc := range parked {
		s := fl.servers[i%len(fl.servers)]
		fc.Retries = route.Retries(m.opts.Retries, len(fl.servers))
		timeout, inTime := fc.TimeLeft(time.Now())
		if !inTime {
			// expire has not come to it yet: served now, it would run
			// after its caller was told 'timed out'.
			fc.FailLate("before a server of " + fc.Group + " was ready")
			continue
		}
		if s.node == self {
			f := netio.Frame{
				Header:  netio.Header{Kind: fc.Kind, ID: fc.CallerID, TimeoutMs: timeout},
				Group:   []byte(fc.Group),
				Service: []byte(fc.Service),
				Payload: fc.Payload,
			}
			if code, msg := m.local.Serve(fc.Caller, &f); code != netio.CodeOK {
				fc.Fail(code, msg)
			}
			continue
		}
		if m.alone {
			fc.Fail(netio.CodeNoSuchGroup, fc.Group+": its server is on "+s.node+", which this node cannot reach")
			continue
		}
		fc.Tried = append(fc.Tried, s.node)
		if code, msg := m.peers.Send(s.node, s.addr, fc); code != netio.CodeOK {
			fc.Fail(code, msg)
		}
	}
}

// expire answers 'timed out' to the parked calls whose deadline passed.
func (p *parking) expire(now time.Time) {
	m := p.m
	var late []*peers.Call
	m.mu.Lock()
	for env, list := range p.parked {
		kept := list[:0]
		for _, fc := range list {
			if !fc.Deadline.IsZero() && now.After(fc.Deadline) {
				late = append(late, fc)
			} else {
				kept = append(kept, fc)
			}
		}
		clear(list[len(kept):])
		p.parked[env] = kept
	}
	p.handing += len(late)
	m.mu.Unlock()
	for _, fc := range late {
		fc.Fail(netio.CodeTimedOut, fmt.Sprintf("no server of %s was ready within %v", fc.Group, call.RoundLimit(fc.Deadline.Sub(fc.Start))))
	}
	p.handed(len(late))
}

// answerAll answers every call waiting for a server of env.
func (p *parking) answerAll(env string, code netio.Code, msg string) {
	m := p.m
	m.mu.Lock()
	parked := p.takeLocked(env)
	m.mu.Unlock()
	for _, fc := range parked {
		fc.Fail(code, msg)
	}
	p.handed(len(parked))
}

// close answers the calls still waiting for a server and parks no more:
// the node stops.
func (p *parking) close() {
	m := p.m
	m.mu.Lock()
	p.closed = true
	var parked []*peers.Call
	for env := range p.parked {
		parked = append(parked, p.takeLocked(env)...)
	}
	m.mu.Unlock()
	for _, fc := range parked {
		fc.Fail(netio.CodeShuttingDown, "the node stopped before a server of "+fc.Group+" was ready")
	}
	p.handed(len(parked))
}

// takeLocked takes the calls parked for env, counted in handing until
// the taker has answered them or passed them on and called handed (a
// find's end: dispatch, which they must be given to). Under m.mu.
func (p *parking) takeLocked(env string) []*peers.Call {
	parked := p.parked[env]
	delete(p.parked, env)
	p.handing += len(parked)
	return parked
}

// handed counts off n calls taken off parked: answered, or counted by the
// local queue or the peer pool now.
func (p *parking) handed(n int) {
	if n == 0 {
		return
	}
	p.m.mu.Lock()
	p.handing -= n
	p.m.mu.Unlock()
}
