package wlmnode

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"tpsched/netio"
	"tpsched/scd/def"
)

// NodeResult is what one node did about a cluster-wide action.
type NodeResult struct {
	Node string `json:"node"`
	// Env is the instance's group the result is for, when the action
	// covered every instance of an environment (scdctl quiesce orders with
	// instances east and west: orders@east, orders@west); else "".
	Env   string `json:"env,omitempty"`
	Done  string `json:"done,omitempty"`
	Error string `json:"error,omitempty"`
}

// EnvActionResult answers scdctl quiesce, resume, refresh and policy.
type EnvActionResult struct {
	Env    string       `json:"env,omitempty"`
	Action string       `json:"action"`
	Nodes  []NodeResult `json:"nodes"`
}

// add appends the results of the action on key; each is marked with key
// when the action covers several.
func (r *EnvActionResult) add(key string, several bool, nodes []NodeResult) {
	for _, n := range nodes {
		if several {
			n.Env = key
		}
		r.Nodes = append(r.Nodes, n)
	}
}

// Quiesce stops every server of environment env in the cluster after the
// calls they hold (VARY WLM,QUIESCE): no server starts for it until Resume.
// env may name one instance's group (orders@east), or an environment
// served per instance: then every instance's.
func (w *Manager) Quiesce(env string) (EnvActionResult, error) {
	keys, err := envKeys(w.policy.Load().p, env)
	if err != nil {
		return EnvActionResult{}, err
	}
	m := w.envs
	res := EnvActionResult{Env: env, Action: "quiesce"}
	for _, key := range keys {
		m.mu.Lock()
		st := m.states[key].Quiesce()
		m.states[key] = st
		m.mu.Unlock()
		m.park.answerAll(key, netio.CodeServiceClosed, key+" was quiesced")
		res.add(key, len(keys) > 1, m.everywhere(key, wlmQuiesce, binary.AppendUvarint(nil, uint64(st.Epoch)), func() (string, error) {
			if _, ok := w.local.Group(key); !ok {
				return "no server here", nil
			}
			return "done", m.quiesceLocal(w.ctx, key, "quiesce")
		}))
	}
	w.opts.Announce()
	return res, nil
}

// Resume lets environment env (or each of its instances, as Quiesce) have
// servers again, from none.
func (w *Manager) Resume(env string) (EnvActionResult, error) {
	keys, err := envKeys(w.policy.Load().p, env)
	if err != nil {
		return EnvActionResult{}, err
	}
	m := w.envs
	res := EnvActionResult{Env: env, Action: "resume"}
	for _, key := range keys {
		m.mu.Lock()
		st := m.states[key].Resume()
		m.states[key] = st
		m.mu.Unlock()
		res.add(key, len(keys) > 1, m.everywhere(key, wlmResume, binary.AppendUvarint(nil, uint64(st.Epoch)),
			func() (string, error) { return "done", nil }))
	}
	w.opts.Announce()
	return res, nil
}

// Refresh replaces the processes of every server of env (or of each of
// its instances, as Quiesce) in the cluster, one at a time per server
// (VARY WLM,REFRESH).
func (w *Manager) Refresh(env string) (EnvActionResult, error) {
	keys, err := envKeys(w.policy.Load().p, env)
	if err != nil {
		return EnvActionResult{}, err
	}
	m := w.envs
	res := EnvActionResult{Env: env, Action: "refresh"}
	for _, key := range keys {
		deadline := time.Now().Add(envQuiesceTimeout)
		res.add(key, len(keys) > 1, m.everywhere(key, wlmRefresh, nil, func() (string, error) {
			k, err := m.refreshLocal(w.ctx, key, deadline)
			return fmt.Sprintf("%d process(es) replaced", k), err
		}))
	}
	return res, nil
}

// ReloadPolicy makes every node read svcpolicy again.
func (w *Manager) ReloadPolicy() (EnvActionResult, error) {
	res := EnvActionResult{Action: "policy"}
	res.Nodes = w.envs.everywhere("", wlmPolicy, nil, w.reloadLocal)
	return res, nil
}

// ErrNoPolicy is what a node without a service policy answers the routing
// manager's actions.
var ErrNoPolicy = errors.New("this node started without svcpolicy: it manages no goals (add the file and restart it)")

// reloadLocal reads svcpolicy again and puts it in force here; the
// environments it drops are quiesced here.
func (w *Manager) reloadLocal() (string, error) {
	d, err := def.LoadPolicy(w.opts.Dir)
	if err != nil {
		return "", err
	}
	if d == nil {
		return "", errors.New("svcpolicy is gone: remove a policy by restarting the node without it")
	}
	p, err := compilePolicy(d)
	if err != nil {
		return "", err
	}
	old := w.policy.Load().p
	if err := checkInstances(w.local, old, p); err != nil {
		return "", err
	}
	w.install(&activePolicy{def: d, p: p, since: time.Now()})
	if !d.Manage {
		w.resetWeights()
	}
	var dropped, added []string
	for _, env := range old.Environments {
		if !p.IsEnvironment(env) {
			dropped = append(dropped, env)
		}
	}
	for _, env := range p.Environments {
		if !old.IsEnvironment(env) {
			added = append(added, env)
		}
	}
	m := w.envs
	for _, env := range added {
		m.mu.Lock()
		if l := m.here[env]; l != nil {
			l.dropped = false
		}
		m.mu.Unlock()
	}
	var errs []error
	for _, env := range dropped {
		m.park.answerAll(env, netio.CodeServiceClosed, env+" was dropped from the policy")
		errs = append(errs, m.quiesceLocal(w.ctx, env, "policy"))
		// A policy that names it again starts it from none, on demand: the
		// high-water mark belongs to the policy that dropped it. Every node
		// reads the policy, so every node moves to the same new epoch.
		m.mu.Lock()
		m.states[env] = m.states[env].Resume()
		m.mu.Unlock()
	}
	w.opts.Announce()
	w.log.Info("service policy read again", "classes", len(p.Classes), "environments", p.Environments, "dropped", dropped)
	out := fmt.Sprintf("%d classes, environments %v", len(p.Classes), p.Environments)
	if len(dropped) > 0 {
		out += ", quiesced " + strings.Join(dropped, ", ")
	}
	return out, errors.Join(errs...)
}
