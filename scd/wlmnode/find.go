package wlmnode

import (
	"context"
	"errors"
	"fmt"
	"time"

	"tpsched/netio"
)

// findLocked starts a find for env unless one runs. Under mu.
func (m *envs) findLocked(env string) *flight {
	if fl := m.finds[env]; fl != nil {
		return fl
	}
	fl := &flight{done: make(chan struct{})}
	if !m.w.goTracked(func(ctx context.Context) { m.runFind(ctx, env, fl) }) {
		// The manager is closing: the find ends at once (its waiters
		// answer its error) and is not kept, and Close answers the
		// parked calls.
		fl.err = &netio.Error{Code: netio.CodeShuttingDown, Message: "the node is stopping"}
		close(fl.done)
		return fl
	}
	m.finds[env] = fl
	return fl
}

// runFind runs a find and then serves, sends on or answers the calls
// parked for it.
func (m *envs) runFind(ctx context.Context, env string, fl *flight) {
	fl.servers, fl.err = m.find(ctx, env, time.Now().Add(envStartTimeout))
	m.mu.Lock()
	delete(m.finds, env)
	parked := m.park.takeLocked(env)
	m.mu.Unlock()
	close(fl.done)
	m.park.dispatch(parked, fl)
}

// find returns the servers of env, having one started when there is none.
func (m *envs) find(ctx context.Context, env string, deadline time.Time) ([]serverAt, error) {
	self := m.self
	if err := m.awaitTable(ctx, deadline); err != nil {
		return nil, err
	}
	for {
		if s := m.servers(env, false); len(s) > 0 {
			m.finds0["served"].Inc()
			return s, nil
		}
		if st := m.state(env); st.Quiesced {
			return nil, &netio.Error{Code: netio.CodeServiceClosed, Message: env + " is quiesced (scdctl resume " + env + ")"}
		}
		node, addr := m.dec.node(env)
		var s []serverAt
		var err error
		if node == self {
			s, err = m.dec.decide(ctx, env, purposeFirst, deadline)
		} else {
			var b []byte
			if b, err = m.peers.Request(ctx, node, addr, wlmDecide, env, []byte{purposeFirst}, deadline); err == nil {
				s, err = parseServers(b)
			}
		}
		if err == nil && len(s) > 0 {
			m.finds0["started"].Inc()
			return s, nil
		}
		if err != nil && !retryable(err) {
			m.finds0["failed"].Inc()
			return nil, err
		}
		if time.Now().After(deadline) {
			m.finds0["failed"].Inc()
			if err == nil {
				err = errors.New("no server started")
			}
			return nil, &netio.Error{Code: netio.CodeTimedOut, Message: fmt.Sprintf("no server of %s within %v: %v", env, envStartTimeout, err)}
		}
		m.log.Debug("find server: trying again", "env", env, "decider", node, "err", err)
		select {
		case <-ctx.Done():
			return nil, &netio.Error{Code: netio.CodeShuttingDown, Message: "the node is stopping"}
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// awaitTable waits until the name table has settled (Options.Settled): a
// process that serves before it has joined (a restart's new one) knows no
// node, itself included, and a find then failed 'no such service group'
// ("none defines it") for an environment every node defines, or started a
// server of one the cluster had quiesced.
func (m *envs) awaitTable(ctx context.Context, deadline time.Time) error {
	if m.tableSettled() {
		return nil // no timer for every find once settled
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-m.opts.Settled:
		return nil
	case <-ctx.Done():
		return &netio.Error{Code: netio.CodeShuttingDown, Message: "the node is stopping"}
	case <-t.C:
		return &netio.Error{Code: netio.CodeTimedOut, Message: "node " + m.self + " did not learn the cluster's name table in time"}
	}
}

// tableSettled reports whether the name table has settled (without
// Options.Settled: from the start).
func (m *envs) tableSettled() bool {
	if m.opts.Settled == nil {
		return true
	}
	select {
	case <-m.opts.Settled:
		return true
	default:
		return false
	}
}

// retryable reports whether a failed request may succeed if sent again,
// perhaps to another decider: the node could not be reached ('network
// down': the pool could not send it) or is going.
func retryable(err error) bool {
	var ne *netio.Error
	if errors.As(err, &ne) {
		switch ne.Code {
		case netio.CodeShuttingDown, netio.CodeNetworkDown, netio.CodeTimedOut:
			return true
		}
		return false
	}
	return true // a connection lost during the request
}

// answerFind answers a find server lookup: the servers of the group, once
// there is one, within the frame's timeout.
func (m *envs) answerFind(c conn, f *netio.Frame) {
	env := string(f.Group)
	reply := func(id uint64, s []serverAt, send func([]byte) error) {
		nodes := make([]netio.NodeLevel, len(s))
		for i, x := range s {
			nodes[i] = netio.NodeLevel{Addr: x.addr, Level: x.level}
		}
		_ = send(netio.AppendFrame(nil, netio.Header{Kind: netio.KindReply, ID: id}, "", "", netio.AppendLookupAnswer(nil, nodes)))
	}
	if s := m.servers(env, false); len(s) > 0 {
		reply(f.ID, s, func(b []byte) error { c.SendNow(b); return nil })
		return
	}
	if why := m.perInstance(env); why != "" {
		c.SendNow(netio.AppendError(nil, f.ID, netio.CodeNoSuchGroup, why))
		return
	}
	if !m.isEnv(env) || !m.knownEnv(env) {
		why := env + ": no node serves it now"
		if m.isEnv(env) {
			why = "application environment " + env + ": no node defines it"
		}
		c.SendNow(netio.AppendError(nil, f.ID, netio.CodeNoSuchGroup, why))
		return
	}
	if m.waiters.Add(1) > maxFindWaiters {
		m.waiters.Add(-1)
		c.SendNow(netio.AppendError(nil, f.ID, netio.CodeServerBusy, "too many finds wait for servers"))
		return
	}
	id := f.ID
	deadline := time.Now().Add(envStartTimeout)
	if f.TimeoutMs > 0 {
		deadline = time.Now().Add(time.Duration(f.TimeoutMs) * time.Millisecond)
	}
	m.mu.Lock()
	fl := m.findLocked(env)
	m.mu.Unlock()
	started := m.w.goTracked(func(ctx context.Context) {
		defer m.waiters.Add(-1)
		t := time.NewTimer(max(time.Until(deadline), time.Millisecond))
		defer t.Stop()
		select {
		case <-fl.done:
		case <-t.C:
			_ = c.Send(netio.AppendError(nil, id, netio.CodeTimedOut, "no server of "+env+" was ready in time"))
			return
		case <-ctx.Done():
			_ = c.Send(netio.AppendError(nil, id, netio.CodeShuttingDown, "the node stopped before a server of "+env+" was ready"))
			return
		}
		if fl.err != nil {
			code, msg := netio.CodeNoSuchGroup, fl.err.Error()
			var ne *netio.Error
			if errors.As(fl.err, &ne) {
				code, msg = ne.Code, ne.Message
			}
			_ = c.Send(netio.AppendError(nil, id, code, msg))
			return
		}
		reply(id, fl.servers, c.Send)
	})
	if !started { // Close began after AnswerFind's check
		m.waiters.Add(-1)
		c.SendNow(netio.AppendError(nil, id, netio.CodeShuttingDown, "the node stopped before a server of "+env+" was ready"))
	}
}
