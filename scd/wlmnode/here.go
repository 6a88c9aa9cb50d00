package wlmnode

// This file is this node's server of each application environment:
// started when the cluster chooses this node (activate), stopped on
// quiesce or when the policy drops it (quiesceLocal), its processes
// replaced one at a time (refreshLocal), passed to a restart's new
// process (HandOver, StartHere).

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"tpsched/netio"
	"tpsched/scd/wlm"
)

// activate starts this node's server of env and returns when it is ready
// (a process attached); at once if it serves already.
func (m *envs) activate(ctx context.Context, env string, deadline time.Time) error {
	return m.activateFor(ctx, env, deadline, false)
}

// activateFor is activate; forPeer says another node asked (wlm-start),
// which a process that handed over refuses ('node shutting down'), under
// the lock the start takes and at each pass of its wait: a HandOver in
// between would not name the server it started.
func (m *envs) activateFor(ctx context.Context, env string, deadline time.Time, forPeer bool) error {
	m.mu.Lock()
	l := m.here[env]
	if l == nil || !m.isEnv(env) {
		m.mu.Unlock()
		return &netio.Error{Code: netio.CodeNoSuchGroup, Message: env + " is not an application environment node " + m.self + " can serve"}
	}
	for {
		// At each pass: a start that waited for a quiesce or another
		// start to end may find HandOver done since, which did not name
		// the environment.
		if forPeer && m.handedOver {
			m.mu.Unlock()
			return m.handedOverError(wlmStart)
		}
		if m.states[env].Quiesced {
			m.mu.Unlock()
			return &netio.Error{Code: netio.CodeServiceClosed, Message: env + " is quiesced"}
		}
		switch l.state {
		case envServing:
			m.mu.Unlock()
			return nil
		case envStarting, envQuiescing:
			ch := l.done
			m.mu.Unlock()
			t := time.NewTimer(max(time.Until(deadline), 0))
			select {
			case <-ch:
				t.Stop()
			case <-t.C:
				return &netio.Error{Code: netio.CodeTimedOut, Message: env + ": its server is " + l.state + " here"}
			case <-ctx.Done():
				t.Stop()
				return &netio.Error{Code: netio.CodeShuttingDown, Message: "the node is stopping"}
			}
			m.mu.Lock()
			continue
		}
		break
	}
	l.state, l.done, l.dropped = envStarting, make(chan struct{}), false
	m.mu.Unlock()
	g := l.g
	m.log.Info("application environment: starting the server here", "env", env)
	m.w.resetWeight(g) // a new server has the weight of its schedule_priority
	err := g.StartServer(ctx, deadline)
	servers := 1 // this one, which the name table may not show yet
	if err == nil {
		for _, s := range m.servers(env, false) {
			if s.node != m.self {
				servers++
			}
		}
	}
	m.mu.Lock()
	if err == nil {
		l.state = envServing
		g.SetServing(true)
		// Announced with the server: it counts everywhere even if it dies
		// before the next interval.
		m.states[env] = m.states[env].Saw(servers)
	} else {
		l.state = envDormant
	}
	close(l.done)
	m.mu.Unlock()
	switch {
	case err != nil && ctx.Err() != nil:
		// The manager closed (ctx is its life) and cut the start short:
		// the server did not fail, the node stops.
		return &netio.Error{Code: netio.CodeShuttingDown, Message: "the node is stopping"}
	case err != nil:
		return &netio.Error{Code: netio.CodeServerTerminated, Message: fmt.Sprintf("%s: the server did not start on %s: %v", env, "node "+m.self, err)}
	}
	m.started.Inc()
	m.log.Info("application environment: server ready here", "env", env)
	m.opts.Announce()
	return nil
}

// quiesceLocal stops this node's server of env: it stops taking calls
// (the other nodes stop sending them), finishes those it has, and its
// processes leave. why is "quiesce", "policy" or "failing".
func (m *envs) quiesceLocal(ctx context.Context, env, why string) error {
	return m.quiesceLocalIf(ctx, env, why, 0, false)
}

// quiesceLocalIf is quiesceLocal for a quiesce of epoch (onlyAt): it stops
// nothing once the environment's state has moved past it (a resume came
// while it waited, or before it began), which would refuse the calls the
// resume let in.
func (m *envs) quiesceLocalIf(ctx context.Context, env, why string, epoch uint32, onlyAt bool) error {
	m.mu.Lock()
	l := m.here[env]
	if l == nil {
		m.mu.Unlock()
		return nil
	}
	for l.state == envStarting || l.state == envQuiescing {
		ch := l.done
		m.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return &netio.Error{Code: netio.CodeShuttingDown, Message: "the node is stopping"}
		}
		m.mu.Lock()
	}
	if st := m.states[env]; onlyAt && (!st.Quiesced || st.Epoch != epoch) {
		m.mu.Unlock()
		return nil
	}
	if why == "policy" {
		l.dropped = true
	}
	if l.state == envDormant {
		m.mu.Unlock()
		return nil
	}
	l.state, l.done = envQuiescing, make(chan struct{})
	l.g.SetServing(false)
	m.mu.Unlock()
	m.log.Info("application environment: quiescing the server here", "env", env, "why", why)
	m.opts.Announce()
	err := l.g.StopServer(ctx, envQuiesceTimeout, env+" was quiesced before the call reached a process")
	m.mu.Lock()
	l.state = envDormant
	close(l.done)
	m.mu.Unlock()
	m.stopped[why].Inc()
	m.log.Info("application environment: server stopped here", "env", env, "why", why)
	return err
}

// refreshLocal replaces the processes of this node's server of env one at
// a time: each finishes the calls it holds, leaves, and is started again
// (a new module on disk takes effect); the others serve meanwhile.
func (m *envs) refreshLocal(ctx context.Context, env string, deadline time.Time) (int, error) {
	m.mu.Lock()
	l := m.here[env]
	state := ""
	if l != nil {
		state = l.state
	}
	m.mu.Unlock()
	if state != envServing {
		return 0, nil
	}
	replaced, err := l.g.ReplaceProcesses(ctx, deadline)
	if err != nil {
		return replaced, err
	}
	m.log.Info("application environment: processes refreshed here", "env", env, "processes", replaced)
	return replaced, nil
}

// Handover is what a restart's old process passes to the new one of its
// application environments (HandOver, StartHere).
type Handover struct {
	// Serving: the environments whose server serves or starts here.
	Serving []string `json:"serving,omitempty"`
	// States: every environment's state as this node knows it, a quiesce
	// with its epoch above all: a node alone learns it from no other.
	States map[string]wlm.EnvState `json:"states,omitempty"`
}

// HandOver is a restart's old process giving its servers to the new one:
// it returns the environments whose server serves or starts here, which
// the new process starts before it serves (StartHere), and their states,
// and from now on it takes no start or decision from another node
// (activateFor, handedOverRefusal) and places none itself (grow,
// replenish): a server started here for the cluster would end
// with this process, while the decider counted it. Its own calls still
// start one here when they need it (they would fail otherwise), which
// serves them and ends with its drain. Without HandOver the new process
// started every environment dormant, and the calls the other nodes sent by
// the old process's announce met no server; and a node alone forgot a
// quiesce. TakeBack undoes it (the hand-over failed).
func (w *Manager) HandOver() Handover {
	m := w.envs
	m.mu.Lock()
	defer m.mu.Unlock()
	m.handedOver = true
	h := Handover{States: map[string]wlm.EnvState{}}
	for env, l := range m.here {
		if m.isEnv(env) && (l.state == envServing || l.state == envStarting) {
			h.Serving = append(h.Serving, env)
		}
	}
	sort.Strings(h.Serving)
	for env, st := range m.states {
		if m.isEnv(env) && st != (wlm.EnvState{}) {
			h.States[env] = st
		}
	}
	return h
}

// QuiescedOnly is h with only the states of quiesced environments: what
// must go over when all of them do not fit in the hand-over's message.
func (h Handover) QuiescedOnly() Handover {
	out := Handover{Serving: h.Serving, States: map[string]wlm.EnvState{}}
	for env, st := range h.States {
		if st.Quiesced {
			out.States[env] = st
		}
	}
	return out
}

// TakeBack undoes HandOver: the hand-over failed and this process serves
// on.
func (w *Manager) TakeBack() {
	m := w.envs
	m.mu.Lock()
	m.handedOver = false
	m.mu.Unlock()
}

// StartHere takes what the old process of a restart passed (HandOver):
// the environments' states, then a server of each environment it served,
// and returns when each is ready or failed, by deadline or ctx's end (the
// hand-over was undone). An environment the policy no longer names is
// skipped. A failure is logged, not returned: the environment is dormant
// here, as after a start, and the cluster starts a server where it
// decides.
func (w *Manager) StartHere(ctx context.Context, h Handover, deadline time.Time) {
	m := w.envs
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(w.ctx, cancel)() // the manager's end ends them too
	m.mu.Lock()
	for env, st := range h.States {
		if m.isEnv(env) {
			m.states[env] = m.states[env].Merge(st)
		}
	}
	m.mu.Unlock()
	var wg sync.WaitGroup
	for _, env := range h.Serving {
		if !m.isEnv(env) {
			m.log.Info("restart: the old process served an application environment the policy no longer names", "env", env)
			continue
		}
		wg.Go(func() {
			if err := m.activate(ctx, env, deadline); err != nil {
				m.log.Warn("restart: the old process's server of an application environment did not start here; "+
					"the cluster starts one where it decides", "env", env, "err", err)
			}
		})
	}
	wg.Wait()
}

// handedOverRefusal is the answer to another node's wlm-start or
// wlm-decide once this process handed over (nil before): the decider
// tries another node, and the asker of a decision asks again, on a new
// connection, which reaches the new process.
func (m *envs) handedOverRefusal(service string) error {
	if !m.isHandedOver() {
		return nil
	}
	return m.handedOverError(service)
}

// handedOverError is handedOverRefusal's answer.
func (m *envs) handedOverError(service string) error {
	if service == wlmStart {
		return &netio.Error{Code: netio.CodeShuttingDown, Message: "node " + m.self + " hands over to a new process, which starts its servers"}
	}
	return &netio.Error{Code: netio.CodeTimedOut, Message: "node " + m.self + " hands over to a new process: ask again"}
}

// isHandedOver reports whether HandOver was called and not taken back.
func (m *envs) isHandedOver() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.handedOver
}
