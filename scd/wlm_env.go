package scd

// This file is the routing manager's application environments (source
// document 004): service groups the cluster starts on demand. A node that
// defines one (its usr files name the group, so it has the module) starts
// no process for it until the cluster chooses it. Then:
//
//   - find server (a name lookup with service "find", scdctl find, the
//     client's FindServer option) answers the nodes that serve the
//     environment; when none does, it asks the deciding node to start one
//     and answers when that server is ready, within the caller's timeout.
//     A call for an environment no node serves waits for the same start
//     (parked), then goes where the server is.
//   - One node decides every start: the live node with the lowest node id
//     among those with a service policy (the name table says who is live).
//     The others send it their request; it starts one server at a time per
//     environment, remembers the servers it started until their announces
//     arrive, and places each on the node with the most spare CPU at the
//     environment's importance (scd/wlm.Place), at most one per node.
//   - A class that misses its goal after its CPU weight is raised gets one
//     more server of its environment on another node (wlm.go asks, the
//     decider places, at most one per environment per three intervals).
//   - The count never falls below the high-water mark except by quiesce or
//     policy change: a server that died (its node left, its processes keep
//     dying) is removed from every table and the decider starts another.
//   - scdctl quiesce, resume, refresh; scdctl policy reads svcpolicy again
//     on every node, and an environment it drops is quiesced.
//
// Every call gets exactly one answer: a parked call is owned by the parked
// list until the find ends (then it is served, sent on or answered) or its
// deadline passes (then it is answered 'timed out'), both under mu.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/netio"
	"tpsched/netio/rpcport"
	"tpsched/procmgr"
	"tpsched/scd/def"
	"tpsched/scd/names"
	"tpsched/scd/route"
	"tpsched/scd/wlm"
)

// Bounds of the routing manager's waits.
const (
	envStartTimeout   = 30 * time.Second // a find waits at most this long for a server to start
	envQuiesceTimeout = 30 * time.Second // a quiescing server's calls may take this long
	hintLife          = 15 * time.Second // the decider counts a server it started this long before its announce
	maxParked         = 4096             // calls waiting for a server, per environment
	maxFindWaiters    = 4096             // finds waiting for a server, node-wide
	growMinSpare      = 0.1              // CPUs a node needs at the importance to get one more server
	growIntervals     = 3                // policy intervals between two servers started for a missed goal
)

// Local states of an environment.
const (
	envDormant   = "dormant"   // no server here
	envStarting  = "starting"  // its processes are starting
	envServing   = "serving"   // it takes calls here
	envQuiescing = "quiescing" // it finishes its calls, then stops
)

// Why a start is decided.
const (
	purposeFirst     byte = 1 // no node serves it (find, a call)
	purposeGrow      byte = 2 // a class misses its goal
	purposeReplenish byte = 3 // fewer servers than the high-water mark: one died
)

var purposeNames = map[byte]string{purposeFirst: "first", purposeGrow: "goal", purposeReplenish: "replace"}

// envLocal is this node's side of one group under the policy.
type envLocal struct {
	g     *group
	procs *envProcs
	state string
	done  chan struct{} // closed when a start or quiesce ends
	// dropped: a policy dropped the environment; without a server here it
	// refuses calls until a policy names it again or the node restarts.
	dropped bool
}

// serverAt is a node that serves an environment.
type serverAt struct {
	node, addr string
	level      uint8
	pi         uint16
}

// flight is a find from this node, or a start at the decider, that others
// may wait for.
type flight struct {
	done    chan struct{}
	servers []serverAt
	err     error
}

type hint struct {
	node, addr string
	at         time.Time
}

// envManager keeps the environments of a node with a service policy.
type envManager struct {
	w     *wlmNode
	n     *Node
	peers *wlmPeers

	mu        sync.Mutex
	local     map[string]*envLocal
	states    map[string]wlm.EnvState // what this node knows of every environment
	finds     map[string]*flight      // finds from this node in progress
	decides   map[string]*flight      // as the decider: starts in progress
	hints     map[string][]hint       // as the decider: servers started, perhaps not announced yet
	lastGrow  map[string]time.Time    // as the decider: the last server started for a missed goal
	growAsked map[string]time.Time    // the last time this node asked for one
	parked    map[string][]*fwdCall   // calls waiting for a server

	changed chan struct{} // poke: the name table changed

	waiters atomic.Int32
	started *metrics.Counter
	stopped map[string]*metrics.Counter
	finds0  map[string]*metrics.Counter
}

func newEnvManager(w *wlmNode) *envManager {
	n := w.n
	m := &envManager{
		w: w, n: n, peers: newWLMPeers(n.cfg.System.NodeID, n.clusterKey()),
		local: map[string]*envLocal{}, states: map[string]wlm.EnvState{},
		finds: map[string]*flight{}, decides: map[string]*flight{}, hints: map[string][]hint{},
		changed:  make(chan struct{}, 1),
		lastGrow: map[string]time.Time{}, growAsked: map[string]time.Time{}, parked: map[string][]*fwdCall{},
		started: n.metrics.NewCounter(`tpsched_wlm_servers_started_total`),
		stopped: map[string]*metrics.Counter{}, finds0: map[string]*metrics.Counter{},
	}
	for _, why := range []string{"quiesce", "policy", "failing"} {
		m.stopped[why] = n.metrics.NewCounter(`tpsched_wlm_servers_stopped_total{reason="` + why + `"}`)
	}
	for _, r := range []string{"served", "started", "failed"} {
		m.finds0[r] = n.metrics.NewCounter(`tpsched_wlm_finds_total{result="` + r + `"}`)
	}
	n.metrics.NewGauge(`tpsched_wlm_calls_waiting_for_server`, func() float64 {
		m.mu.Lock()
		defer m.mu.Unlock()
		total := 0
		for _, l := range m.parked {
			total += len(l)
		}
		return float64(total)
	})
	return m
}

func (m *envManager) policy() *wlm.Policy { return m.w.policy.Load().p }

// isEnv reports whether group is an application environment of the policy.
func (m *envManager) isEnv(group string) bool { return m.policy().IsEnvironment(group) }

// serving reports whether g takes calls here now.
func (m *envManager) serving(g *group) bool { return g.servable() }

// startProcesses gives g its processes: for an application environment
// none yet; for any other group its server now, as without a policy.
func (m *envManager) startProcesses(g *group, spec procmgr.Spec) (processes, error) {
	e := &envProcs{g: g, pm: m.n.pm, spec: spec}
	l := &envLocal{g: g, procs: e, state: envDormant}
	m.mu.Lock()
	m.local[g.name] = l
	m.mu.Unlock()
	if m.isEnv(g.name) {
		return e, nil
	}
	if err := e.start(); err != nil {
		return nil, err
	}
	l.state = envServing
	e.serving.Store(true)
	return e, nil
}

func (m *envManager) start() {
	m.n.wg.Add(1)
	go func() {
		defer m.n.wg.Done()
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-m.n.stop:
				m.close()
				return
			case now := <-t.C:
				m.expireParked(now)
			case <-m.changed:
				m.observe()
			}
		}
	}()
}

// close answers the calls still waiting for a server: the node stops.
func (m *envManager) close() {
	m.mu.Lock()
	parked := m.parked
	m.parked = map[string][]*fwdCall{}
	m.mu.Unlock()
	for _, list := range parked {
		for _, fc := range list {
			answerErr(fc, netio.CodeShuttingDown, "the node stopped before a server of "+fc.group+" was ready")
		}
	}
	m.peers.close()
}

// schedule takes the calls for groups that have no server here: it
// reports handled when it answered or parked the call. *gp is set to nil
// for a group defined here without a server, so the usual path treats it
// as one only other nodes run.
//
// from is the peer that transferred the call (nil: a client's call, or a
// UAP's own, which is parked like a client's).
func (m *envManager) schedule(c caller, from *peerHello, f *netio.Frame, gp **group) (bool, netio.Code, string) {
	g := *gp
	if g != nil && g.servable() {
		return false, 0, ""
	}
	name := string(f.Group)
	here := n2s(m.n)
	if g != nil {
		*gp = nil
	}
	refused := from != nil || f.Flags&netio.FlagDestination != 0
	if !m.isEnv(name) {
		if g == nil {
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
	if g == nil && !m.knownEnv(name) {
		return false, 0, "" // no node can serve it: 'no such service group'
	}
	fc := &fwdCall{
		caller: c, callerID: f.ID, kind: f.Kind,
		group: name, service: string(f.Service), payload: append([]byte(nil), f.Payload...),
		timeoutMs: f.TimeoutMs, start: time.Now(),
	}
	switch {
	case f.TimeoutMs > 0:
		fc.deadline = fc.start.Add(time.Duration(f.TimeoutMs) * time.Millisecond)
	case g != nil && g.watch > 0:
		fc.deadline = fc.start.Add(g.watch)
	case m.n.cfg.System.WatchTime > 0:
		fc.deadline = fc.start.Add(m.n.cfg.System.WatchTime)
	}
	m.mu.Lock()
	if len(m.parked[name]) >= maxParked {
		m.mu.Unlock()
		return true, netio.CodeServerBusy, fmt.Sprintf("%d calls already wait for a server of %s", maxParked, name)
	}
	m.parked[name] = append(m.parked[name], fc)
	m.findLocked(name)
	m.mu.Unlock()
	return true, netio.CodeOK, ""
}

func n2s(n *Node) string { return "node " + n.cfg.System.NodeID }

// servedElsewhere reports whether another node serves group.
func (m *envManager) servedElsewhere(group string) bool {
	cl := m.n.cluster
	if cl == nil {
		return false
	}
	for _, e := range cl.names.Lookup(group) {
		if !e.Local && !e.Held {
			return true
		}
	}
	return false
}

// knownEnv reports whether some node can serve environment env.
func (m *envManager) knownEnv(env string) bool {
	m.mu.Lock()
	_, here := m.local[env]
	m.mu.Unlock()
	if here {
		return true
	}
	if cl := m.n.cluster; cl != nil {
		for _, info := range cl.names.Nodes() {
			if info.WLM != nil && slices.ContainsFunc(info.WLM.Envs, func(e names.EnvInfo) bool { return e.Env == env }) {
				return true
			}
		}
	}
	return false
}

// servers lists the nodes that serve env, those where its calls meet their
// goals first; with hints, also those the decider started lately.
func (m *envManager) servers(env string, hints bool) []serverAt {
	var out []serverAt
	self := m.n.cfg.System.NodeID
	if cl := m.n.cluster; cl != nil {
		for _, e := range cl.names.Lookup(env) {
			if e.Held {
				continue
			}
			if e.Local {
				if g := m.n.groups[env]; g == nil || !g.servable() {
					continue // the table may lag behind a quiesce here
				}
			}
			out = append(out, serverAt{node: e.Node, addr: e.Addr, level: uint8(e.Level), pi: e.PI})
		}
	} else if g := m.n.groups[env]; g != nil && g.servable() && !g.held.Load() {
		out = append(out, serverAt{node: self, addr: m.n.advertisedRPC(), level: uint8(g.level()), pi: m.w.groupPI(env)})
	}
	if hints {
		m.mu.Lock()
		for _, h := range m.hints[env] {
			if !slices.ContainsFunc(out, func(s serverAt) bool { return s.node == h.node }) {
				out = append(out, serverAt{node: h.node, addr: h.addr})
			}
		}
		m.mu.Unlock()
	}
	// Those that meet the goal (or have no figures yet) first, then by
	// level and index.
	goals := make([]wlm.NodeGoal, len(out))
	for i, s := range out {
		goals[i] = wlm.NodeGoal{PI: float64(s.pi) / 100, Known: s.pi > 0}
	}
	keep := make([]bool, len(out))
	wlm.Steer(goals, keep)
	idx := make([]int, len(out))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		x, y := idx[a], idx[b]
		if keep[x] != keep[y] {
			return keep[x]
		}
		if out[x].level != out[y].level {
			return out[x].level < out[y].level
		}
		return out[x].pi < out[y].pi
	})
	sorted := make([]serverAt, len(out))
	for i, j := range idx {
		sorted[i] = out[j]
	}
	return sorted
}

// findLocked starts a find for env unless one runs. Under mu.
func (m *envManager) findLocked(env string) *flight {
	if fl := m.finds[env]; fl != nil {
		return fl
	}
	fl := &flight{done: make(chan struct{})}
	m.finds[env] = fl
	go m.runFind(env, fl)
	return fl
}

func (m *envManager) runFind(env string, fl *flight) {
	fl.servers, fl.err = m.find(env, time.Now().Add(envStartTimeout))
	m.mu.Lock()
	delete(m.finds, env)
	parked := m.parked[env]
	delete(m.parked, env)
	m.mu.Unlock()
	close(fl.done)
	m.dispatch(parked, fl)
}

// find returns the servers of env, having one started when there is none.
func (m *envManager) find(env string, deadline time.Time) ([]serverAt, error) {
	self := m.n.cfg.System.NodeID
	for {
		if s := m.servers(env, false); len(s) > 0 {
			m.finds0["served"].Inc()
			return s, nil
		}
		if st := m.state(env); st.Quiesced {
			return nil, &netio.Error{Code: netio.CodeServiceClosed, Message: env + " is quiesced (scdctl resume " + env + ")"}
		}
		node, addr := m.decider()
		var s []serverAt
		var err error
		if node == self {
			s, err = m.decide(env, purposeFirst, deadline)
		} else {
			var b []byte
			if b, err = m.peers.request(node, addr, wlmDecide, env, []byte{purposeFirst}, deadline); err == nil {
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
		m.n.log.Debug("find server: trying again", "env", env, "decider", node, "err", err)
		select {
		case <-m.n.stop:
			return nil, &netio.Error{Code: netio.CodeShuttingDown, Message: "the node is stopping"}
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// retryable reports whether a failed request may succeed if sent again,
// perhaps to another decider: the node could not be reached or is going.
func retryable(err error) bool {
	if errors.Is(err, errPeerUnreachable) {
		return true
	}
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

// dispatch serves, sends on or answers the calls that waited for a find.
func (m *envManager) dispatch(parked []*fwdCall, fl *flight) {
	if fl.err != nil {
		code, msg := netio.CodeNoSuchGroup, fl.err.Error()
		var ne *netio.Error
		if errors.As(fl.err, &ne) {
			code, msg = ne.Code, ne.Message
		}
		for _, fc := range parked {
			answerErr(fc, code, msg)
		}
		return
	}
	self := m.n.cfg.System.NodeID
	for i, fc := range parked {
		s := fl.servers[i%len(fl.servers)]
		fc.retries = route.Retries(m.n.cfg.Sched.RetryOfCommError, len(fl.servers))
		if s.node == self {
			f := netio.Frame{
				Header:  netio.Header{Kind: fc.kind, ID: fc.callerID, TimeoutMs: remainingMs(fc)},
				Group:   []byte(fc.group),
				Service: []byte(fc.service),
				Payload: fc.payload,
			}
			if code, msg := m.n.serveLocal(fc.caller, &f, m.n.groups[fc.group]); code != netio.CodeOK {
				answerErr(fc, code, msg)
			}
			continue
		}
		if m.n.cluster == nil {
			answerErr(fc, netio.CodeNoSuchGroup, fc.group+": its server is on "+s.node+", which this node cannot reach")
			continue
		}
		fc.tried = append(fc.tried, s.node)
		if code, msg := m.n.cluster.fwd.send(s.node, s.addr, fc); code != netio.CodeOK {
			answerErr(fc, code, msg)
		}
	}
}

// remainingMs is the time a parked call's caller still waits, for a frame.
func remainingMs(fc *fwdCall) uint32 {
	if fc.deadline.IsZero() {
		return fc.timeoutMs
	}
	return uint32(max(time.Until(fc.deadline).Milliseconds(), 1))
}

// expireParked answers 'timed out' to the parked calls whose deadline passed.
func (m *envManager) expireParked(now time.Time) {
	var late []*fwdCall
	m.mu.Lock()
	for env, list := range m.parked {
		kept := list[:0]
		for _, fc := range list {
			if !fc.deadline.IsZero() && now.After(fc.deadline) {
				late = append(late, fc)
			} else {
				kept = append(kept, fc)
			}
		}
		clear(list[len(kept):])
		m.parked[env] = kept
	}
	m.mu.Unlock()
	for _, fc := range late {
		answerErr(fc, netio.CodeTimedOut, fmt.Sprintf("no server of %s was ready within %v", fc.group, roundLimit(fc.deadline.Sub(fc.start))))
	}
}

// decider is the node that decides starts: the live node with the lowest
// id among those with a service policy (this one without a cluster).
func (m *envManager) decider() (node, addr string) {
	self := m.n.cfg.System.NodeID
	cl := m.n.cluster
	if cl == nil {
		return self, ""
	}
	node = self
	for _, info := range cl.names.Nodes() { // sorted by node id
		if info.WLM != nil || info.Node == self {
			if info.Node < node {
				return info.Node, info.Addr
			}
			break
		}
	}
	return self, ""
}

// state is what this node knows of env.
func (m *envManager) state(env string) wlm.EnvState {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.states[env]
}

// decide starts a server of env if purpose calls for one, as the deciding
// node, and returns the servers of env then.
func (m *envManager) decide(env string, purpose byte, deadline time.Time) ([]serverAt, error) {
	if !m.isEnv(env) {
		return nil, &netio.Error{Code: netio.CodeNoSuchGroup, Message: env + " is not an application environment of the policy"}
	}
	m.mu.Lock()
	for {
		if m.states[env].Quiesced {
			m.mu.Unlock()
			return nil, &netio.Error{Code: netio.CodeServiceClosed, Message: env + " is quiesced"}
		}
		fl := m.decides[env]
		if fl == nil {
			break
		}
		m.mu.Unlock() // a start in progress: its result serves us too
		select {
		case <-fl.done:
		case <-time.After(time.Until(deadline)):
			return nil, &netio.Error{Code: netio.CodeTimedOut, Message: "a start of " + env + " is still in progress"}
		}
		if purpose == purposeFirst {
			return fl.servers, fl.err
		}
		m.mu.Lock()
	}
	m.expireHintsLocked(env, time.Now())
	m.mu.Unlock()
	servers := m.servers(env, true)
	m.mu.Lock()
	switch {
	case purpose == purposeFirst && len(servers) > 0,
		purpose == purposeGrow && time.Since(m.lastGrow[env]) < m.growCooldown(),
		purpose == purposeReplenish && m.states[env].Missing(len(servers)) == 0:
		m.mu.Unlock()
		return servers, nil
	}
	fl := &flight{done: make(chan struct{})}
	m.decides[env] = fl
	if purpose == purposeGrow {
		m.lastGrow[env] = time.Now()
	}
	m.mu.Unlock()
	fl.servers, fl.err = m.place(env, purpose, servers, deadline)
	m.mu.Lock()
	delete(m.decides, env)
	m.mu.Unlock()
	close(fl.done)
	return fl.servers, fl.err
}

// growCooldown is the time between two servers started for a missed goal.
func (m *envManager) growCooldown() time.Duration {
	return growIntervals * m.policy().Interval
}

// place chooses a node for one more server of env and starts it there.
func (m *envManager) place(env string, purpose byte, servers []serverAt, deadline time.Time) ([]serverAt, error) {
	p := m.policy()
	imp := p.Classes[p.Default].Importance
	if g := m.n.groups[env]; g != nil {
		imp = p.Importance(env, g.serviceNames())
	}
	hosts, addrs := m.hosts(env, imp, servers)
	minSpare := 0.0
	if purpose == purposeGrow {
		minSpare = growMinSpare
	}
	var lastErr error
	for {
		i := wlm.Place(hosts, minSpare)
		if i < 0 {
			if lastErr != nil {
				return servers, lastErr
			}
			if purpose == purposeFirst {
				return nil, &netio.Error{Code: netio.CodeNoSuchGroup, Message: "no node can start a server of " + env + " (none defines it)"}
			}
			return servers, nil // every node that could serves it, or has no spare CPU
		}
		h := hosts[i]
		err := m.startOn(h.Node, addrs[i], env, deadline)
		if err == nil {
			m.n.log.Info("routing manager: server started", "env", env, "node", h.Node, "why", purposeNames[purpose],
				"spare_cpus", fmt.Sprintf("%.2f", h.Spare), "importance", imp, "hosts", hostsLine(hosts))
			m.mu.Lock()
			m.hints[env] = append(m.hints[env], hint{node: h.Node, addr: addrs[i], at: time.Now()})
			m.states[env] = m.states[env].Saw(len(servers) + 1)
			m.mu.Unlock()
			return append(servers, serverAt{node: h.Node, addr: addrs[i]}), nil
		}
		m.n.log.Warn("routing manager: a server did not start; trying another node", "env", env, "node", h.Node, "err", err)
		lastErr = err
		hosts[i].Serving = true // not again
		if time.Now().After(deadline) {
			return servers, err
		}
	}
}

// hostsLine is the hosts a placement chose from, for the log: "n0=0.00
// n1=0.95 n2=0.90(excluded)"; excluded: serving it already, or its start failed.
func hostsLine(hosts []wlm.Host) string {
	var b strings.Builder
	for i, h := range hosts {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%.2f", h.Node, h.Spare)
		if h.Serving {
			b.WriteString("(excluded)")
		}
	}
	return b.String()
}

// hosts are the nodes that define env, with their spare CPU at importance
// imp, and their addresses.
func (m *envManager) hosts(env string, imp int, servers []serverAt) ([]wlm.Host, []string) {
	serving := func(node string) bool {
		return slices.ContainsFunc(servers, func(s serverAt) bool { return s.node == node })
	}
	self := m.n.cfg.System.NodeID
	cl := m.n.cluster
	if cl == nil {
		m.mu.Lock()
		_, ok := m.local[env]
		m.mu.Unlock()
		if !ok {
			return nil, nil
		}
		m.w.mu.Lock()
		spare := m.w.spare[imp]
		m.w.mu.Unlock()
		return []wlm.Host{{Node: self, Spare: spare, Serving: serving(self)}}, []string{m.n.advertisedRPC()}
	}
	var hosts []wlm.Host
	var addrs []string
	for _, info := range cl.names.Nodes() {
		if info.WLM == nil || !slices.ContainsFunc(info.WLM.Envs, func(e names.EnvInfo) bool { return e.Env == env }) {
			continue
		}
		served := 0
		for _, e := range info.WLM.Envs {
			if slices.ContainsFunc(info.Groups, func(g names.GroupInfo) bool { return g.Group == e.Env }) {
				served++
			}
		}
		hosts = append(hosts, wlm.Host{Node: info.Node, Spare: float64(info.WLM.Spare[imp-1]) / 1000,
			Serving: serving(info.Node), Servers: served})
		addrs = append(addrs, info.Addr)
	}
	return hosts, addrs
}

// startOn has node start a server of env and waits until it is ready.
func (m *envManager) startOn(node, addr, env string, deadline time.Time) error {
	if node == m.n.cfg.System.NodeID {
		return m.activate(env, deadline)
	}
	_, err := m.peers.request(node, addr, wlmStart, env, nil, deadline)
	return err
}

func (m *envManager) expireHintsLocked(env string, now time.Time) {
	list := m.hints[env]
	kept := list[:0]
	for _, h := range list {
		if now.Sub(h.at) < hintLife {
			kept = append(kept, h)
		}
	}
	if len(kept) == 0 {
		delete(m.hints, env)
		return
	}
	m.hints[env] = kept
}

// activate starts this node's server of env and returns when it is ready
// (a process attached); at once if it serves already.
func (m *envManager) activate(env string, deadline time.Time) error {
	m.mu.Lock()
	l := m.local[env]
	if l == nil || !m.isEnv(env) {
		m.mu.Unlock()
		return &netio.Error{Code: netio.CodeNoSuchGroup, Message: env + " is not an application environment " + n2s(m.n) + " can serve"}
	}
	for {
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
			select {
			case <-ch:
			case <-time.After(time.Until(deadline)):
				return &netio.Error{Code: netio.CodeTimedOut, Message: env + ": its server is " + l.state + " here"}
			}
			m.mu.Lock()
			continue
		}
		break
	}
	l.state, l.done, l.dropped = envStarting, make(chan struct{}), false
	m.mu.Unlock()
	g := l.g
	m.n.log.Info("application environment: starting the server here", "env", env)
	g.Failing(nil) // an earlier server's failure is not this one's
	err := l.procs.start()
	if err == nil {
		m.w.resetWeight(g)
		err = l.procs.waitReady(deadline)
	}
	if err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), uapStopTime)
		_ = l.procs.stop(ctx)
		cancel()
	}
	servers := 1 // this one, which the name table may not show yet
	if err == nil {
		for _, s := range m.servers(env, false) {
			if s.node != m.n.cfg.System.NodeID {
				servers++
			}
		}
	}
	m.mu.Lock()
	if err == nil {
		l.state = envServing
		l.procs.serving.Store(true)
		// Announced with the server: it counts everywhere even if it dies
		// before the next interval.
		m.states[env] = m.states[env].Saw(servers)
	} else {
		l.state = envDormant
	}
	close(l.done)
	m.mu.Unlock()
	if err != nil {
		return &netio.Error{Code: netio.CodeServerTerminated, Message: fmt.Sprintf("%s: the server did not start on %s: %v", env, n2s(m.n), err)}
	}
	m.started.Inc()
	m.n.log.Info("application environment: server ready here", "env", env)
	m.n.announce()
	return nil
}

// quiesceLocal stops this node's server of env: it stops taking calls
// (the other nodes stop sending them), finishes those it has, and its
// processes leave. why is "quiesce", "policy" or "failing".
func (m *envManager) quiesceLocal(env, why string) error {
	m.mu.Lock()
	l := m.local[env]
	if l == nil {
		m.mu.Unlock()
		return nil
	}
	for l.state == envStarting || l.state == envQuiescing {
		ch := l.done
		m.mu.Unlock()
		<-ch
		m.mu.Lock()
	}
	if why == "policy" {
		l.dropped = true
	}
	if l.state == envDormant {
		m.mu.Unlock()
		return nil
	}
	l.state, l.done = envQuiescing, make(chan struct{})
	l.procs.serving.Store(false)
	m.mu.Unlock()
	m.n.log.Info("application environment: quiescing the server here", "env", env, "why", why)
	m.n.announce()
	g := l.g
	deadline := time.Now().Add(envQuiesceTimeout)
	for g.inFlight() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), uapStopTime)
	err := l.procs.stop(ctx)
	cancel()
	g.flush(netio.CodeServiceClosed, env+" was quiesced before the call reached a process")
	m.mu.Lock()
	l.state = envDormant
	close(l.done)
	m.mu.Unlock()
	m.stopped[why].Inc()
	m.n.log.Info("application environment: server stopped here", "env", env, "why", why)
	return err
}

// refreshLocal replaces the processes of this node's server of env one at
// a time: each finishes the calls it holds, leaves, and is started again
// (a new module on disk takes effect); the others serve meanwhile.
func (m *envManager) refreshLocal(env string, deadline time.Time) (int, error) {
	m.mu.Lock()
	l := m.local[env]
	state := ""
	if l != nil {
		state = l.state
	}
	m.mu.Unlock()
	if state != envServing {
		return 0, nil
	}
	g := l.g
	resident := map[int]bool{}
	for _, pi := range l.procs.Processes() {
		resident[pi.Slot] = pi.Kind == "resident"
	}
	replaced := 0
	for _, slot := range g.occupied() {
		old, _ := g.slotProc(slot)
		l.procs.replace(slot) // an operator's action: logged and counted apart from crashes
		g.Stop(slot)
		if !resident[slot] {
			replaced++ // a non-resident process is not replaced: the Multiserver rule starts another when calls wait
			continue
		}
		for {
			p, attached := g.slotProc(slot)
			if p != nil && p != old && attached {
				replaced++
				break
			}
			if time.Now().After(deadline) {
				return replaced, fmt.Errorf("%s: slot %d has no new process attached in time", env, slot)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	m.n.log.Info("application environment: processes refreshed here", "env", env, "processes", replaced)
	return replaced, nil
}

// slotProc is the process in slot and whether it attached.
func (g *group) slotProc(slot int) (proc, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	si := &g.slots[slot]
	return si.p, si.attached
}

// grow asks the decider for one more server of env elsewhere: a class
// misses its goal here. At most one request per cooldown.
func (m *envManager) grow(env string) {
	now := time.Now()
	m.mu.Lock()
	if now.Sub(m.growAsked[env]) < m.growCooldown() {
		m.mu.Unlock()
		return
	}
	m.growAsked[env] = now
	m.mu.Unlock()
	go func() {
		deadline := now.Add(envStartTimeout)
		node, addr := m.decider()
		var err error
		if node == m.n.cfg.System.NodeID {
			_, err = m.decide(env, purposeGrow, deadline)
		} else {
			_, err = m.peers.request(node, addr, wlmDecide, env, []byte{purposeGrow}, deadline)
		}
		if err != nil {
			m.n.log.Info("routing manager: no more servers for a missed goal", "env", env, "decider", node, "err", err)
		}
	}()
}

// observe merges what the other nodes announced of every environment and
// raises the high-water marks to the servers seen; it returns the servers
// counted. It runs at every interval and whenever the name table changed
// (poke), so that a server seen for a moment counts even if it dies before
// the next interval.
func (m *envManager) observe() map[string]int {
	p := m.policy()
	if cl := m.n.cluster; cl != nil {
		nodes := cl.names.Nodes()
		m.mu.Lock()
		for _, info := range nodes {
			if info.WLM == nil || info.Node == m.n.cfg.System.NodeID {
				continue
			}
			for _, e := range info.WLM.Envs {
				m.states[e.Env] = m.states[e.Env].Merge(wlm.EnvState{Epoch: e.Epoch, HWM: int(e.HWM), Quiesced: e.Quiesced})
			}
		}
		m.mu.Unlock()
	}
	counts := map[string]int{}
	for _, env := range p.Environments {
		counts[env] = len(m.servers(env, false))
	}
	m.mu.Lock()
	for env, c := range counts {
		m.states[env] = m.states[env].Saw(c)
	}
	m.mu.Unlock()
	return counts
}

// poke asks the manager to observe the name table soon; it never blocks
// (the name table's receive loop calls it).
func (m *envManager) poke() {
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// interval observes the cluster, withdraws a server whose processes keep
// dying, and, on the deciding node, starts servers that bring an
// environment back to its high-water mark.
func (m *envManager) interval() {
	p := m.policy()
	counts := m.observe()
	m.mu.Lock()
	var failing []string
	for env, l := range m.local {
		if l.state == envServing && m.isEnv(env) && l.g.failing.Load() != nil {
			failing = append(failing, env)
		}
	}
	m.mu.Unlock()
	for _, env := range failing {
		go func() {
			m.n.log.Error("application environment: the server's processes keep dying; withdrawing it from the cluster", "env", env)
			_ = m.quiesceLocal(env, "failing")
		}()
	}
	if node, _ := m.decider(); node != m.n.cfg.System.NodeID {
		return
	}
	for _, env := range p.Environments {
		m.mu.Lock()
		m.expireHintsLocked(env, time.Now())
		missing := m.states[env].Missing(counts[env] + len(m.hints[env]))
		busy := m.decides[env] != nil
		m.mu.Unlock()
		if missing > 0 && !busy {
			m.n.log.Info("routing manager: fewer servers than the high-water mark; starting one", "env", env,
				"servers", counts[env], "high_water_mark", m.state(env).HWM)
			go func() { _, _ = m.decide(env, purposeReplenish, time.Now().Add(envStartTimeout)) }()
		}
	}
}

// announcedEnvs is what this node announces of the environments it can
// serve.
func (m *envManager) announcedEnvs() []names.EnvInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []names.EnvInfo
	for _, g := range m.n.order { // sorted by name
		if _, ok := m.local[g.name]; !ok || !m.isEnv(g.name) {
			continue
		}
		st := m.states[g.name]
		out = append(out, names.EnvInfo{Env: g.name, Epoch: st.Epoch, HWM: uint32(st.HWM), Quiesced: st.Quiesced})
	}
	return out
}

// The requests of other nodes (wlm_peer.go), and find.

// answerFind answers a find server lookup: the servers of the group, once
// there is one, within the frame's timeout.
func (m *envManager) answerFind(c *rpcport.Conn, f *netio.Frame) {
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
	go func() {
		defer m.waiters.Add(-1)
		t := time.NewTimer(max(time.Until(deadline), time.Millisecond))
		defer t.Stop()
		select {
		case <-fl.done:
		case <-t.C:
			_ = c.Send(netio.AppendError(nil, id, netio.CodeTimedOut, "no server of "+env+" was ready in time"))
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
	}()
}

// serveRequest answers another node's request; it runs on the event loop,
// so the work is done on a goroutine of its own.
func (m *envManager) serveRequest(c *rpcport.Conn, f *netio.Frame) {
	if forwardedBy(c, f) == nil {
		m.n.badRequests.Inc()
		c.SendNow(netio.AppendError(nil, f.ID, netio.CodeProtocol, "routing manager requests are taken only from a node that proved the cluster key (peer hello)"))
		return
	}
	id, service, env, payload := f.ID, string(f.Service), string(f.Group), append([]byte(nil), f.Payload...)
	deadline := time.Now().Add(envStartTimeout)
	if f.TimeoutMs > 0 {
		deadline = time.Now().Add(min(time.Duration(f.TimeoutMs)*time.Millisecond, 2*envStartTimeout))
	}
	go func() {
		out, err := m.handle(service, env, payload, deadline)
		if err != nil {
			code := netio.CodeNoSuchGroup
			var ne *netio.Error
			if errors.As(err, &ne) {
				code = ne.Code
			}
			msg := err.Error()
			if ne != nil {
				msg = ne.Message
			}
			_ = c.Send(netio.AppendError(nil, id, code, msg))
			return
		}
		_ = c.Send(netio.AppendFrame(nil, netio.Header{Kind: netio.KindReply, ID: id}, "", "", out))
	}()
}

func (m *envManager) handle(service, env string, payload []byte, deadline time.Time) ([]byte, error) {
	switch service {
	case wlmDecide:
		if len(payload) != 1 || payload[0] < purposeFirst || payload[0] > purposeReplenish {
			return nil, &netio.Error{Code: netio.CodeProtocol, Message: "decide: bad purpose"}
		}
		if node, _ := m.decider(); node != m.n.cfg.System.NodeID {
			// Our tables disagree for a moment (a node joining or leaving):
			// the asker tries again and finds the same decider as we do.
			return nil, &netio.Error{Code: netio.CodeTimedOut, Message: "node " + node + " decides starts, as far as " + n2s(m.n) + " knows"}
		}
		s, err := m.decide(env, payload[0], deadline)
		if err != nil {
			return nil, err
		}
		return appendServers(nil, s), nil
	case wlmStart:
		return nil, m.activate(env, deadline)
	case wlmQuiesce, wlmResume:
		epoch, k := binary.Uvarint(payload)
		if k <= 0 || k != len(payload) || epoch > 1<<32-1 {
			return nil, &netio.Error{Code: netio.CodeProtocol, Message: service + ": bad epoch"}
		}
		st := wlm.EnvState{Epoch: uint32(epoch), Quiesced: service == wlmQuiesce}
		m.mu.Lock()
		m.states[env] = m.states[env].Merge(st)
		m.mu.Unlock()
		if service == wlmQuiesce {
			m.answerParked(env, netio.CodeServiceClosed, env+" was quiesced")
			return nil, m.quiesceLocal(env, "quiesce")
		}
		m.n.announce()
		return nil, nil
	case wlmRefresh:
		n, err := m.refreshLocal(env, deadline)
		return binary.AppendUvarint(nil, uint64(n)), err
	case wlmPolicy:
		res, err := m.w.reloadLocal()
		if err != nil {
			return nil, &netio.Error{Code: netio.CodeApplication, Message: err.Error()}
		}
		return []byte(res), nil
	}
	return nil, &netio.Error{Code: netio.CodeProtocol, Message: "unknown request " + service}
}

// answerParked answers every call waiting for a server of env.
func (m *envManager) answerParked(env string, code netio.Code, msg string) {
	m.mu.Lock()
	parked := m.parked[env]
	delete(m.parked, env)
	m.mu.Unlock()
	for _, fc := range parked {
		answerErr(fc, code, msg)
	}
}

// appendServers encodes servers for a decide answer: uvarint count, then
// per server its node id and address as strings.
func appendServers(dst []byte, s []serverAt) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	for _, x := range s {
		dst = binary.AppendUvarint(dst, uint64(len(x.node)))
		dst = append(dst, x.node...)
		dst = binary.AppendUvarint(dst, uint64(len(x.addr)))
		dst = append(dst, x.addr...)
	}
	return dst
}

func parseServers(b []byte) ([]serverAt, error) {
	bad := errors.New("routing manager: bad decide answer")
	n, k := binary.Uvarint(b)
	if k <= 0 || n > names.MaxNodes {
		return nil, bad
	}
	b = b[k:]
	str := func() (string, bool) {
		l, k := binary.Uvarint(b)
		if k <= 0 || l == 0 || l > netio.MaxNameLen || uint64(len(b)-k) < l {
			return "", false
		}
		s := string(b[k : k+int(l)])
		b = b[k+int(l):]
		return s, true
	}
	out := make([]serverAt, 0, n)
	for range n {
		node, ok1 := str()
		addr, ok2 := str()
		if !ok1 || !ok2 {
			return nil, bad
		}
		out = append(out, serverAt{node: node, addr: addr})
	}
	if len(b) != 0 {
		return nil, bad
	}
	return out, nil
}

// The cluster-wide actions (scdctl quiesce, resume, refresh, policy).

// NodeResult is what one node did about a cluster-wide action.
type NodeResult struct {
	Node  string `json:"node"`
	Done  string `json:"done,omitempty"`
	Error string `json:"error,omitempty"`
}

// EnvActionResult answers scdctl quiesce, resume, refresh and policy.
type EnvActionResult struct {
	Env    string       `json:"env,omitempty"`
	Action string       `json:"action"`
	Nodes  []NodeResult `json:"nodes"`
}

// others are the other nodes with a service policy.
func (m *envManager) others() []names.NodeInfo {
	cl := m.n.cluster
	if cl == nil {
		return nil
	}
	var out []names.NodeInfo
	for _, info := range cl.names.Nodes() {
		if info.WLM != nil && info.Node != m.n.cfg.System.NodeID {
			out = append(out, info)
		}
	}
	return out
}

// everywhere runs local here and sends service to every other node, in
// parallel, and reports each node's result.
func (m *envManager) everywhere(env, service string, payload []byte, local func() (string, error)) []NodeResult {
	others := m.others()
	results := make([]NodeResult, len(others)+1)
	var wg sync.WaitGroup
	deadline := time.Now().Add(envQuiesceTimeout + 10*time.Second)
	for i, info := range others {
		wg.Go(func() {
			out, err := m.peers.request(info.Node, info.Addr, service, env, payload, deadline)
			results[i+1] = NodeResult{Node: info.Node}
			if err != nil {
				results[i+1].Error = err.Error()
			} else {
				results[i+1].Done = describe(service, out)
			}
		})
	}
	done, err := local()
	results[0] = NodeResult{Node: m.n.cfg.System.NodeID, Done: done}
	if err != nil {
		results[0].Error = err.Error()
	}
	wg.Wait()
	return results
}

func describe(service string, out []byte) string {
	switch service {
	case wlmRefresh:
		n, _ := binary.Uvarint(out)
		return fmt.Sprintf("%d process(es) replaced", n)
	case wlmPolicy:
		return string(out)
	}
	return "done"
}

// Quiesce stops every server of environment env in the cluster after the
// calls they hold (VARY WLM,QUIESCE): no server starts for it until Resume.
func (n *Node) Quiesce(env string) (EnvActionResult, error) {
	m, err := n.envFor(env)
	if err != nil {
		return EnvActionResult{}, err
	}
	m.mu.Lock()
	st := m.states[env].Quiesce()
	m.states[env] = st
	m.mu.Unlock()
	m.answerParked(env, netio.CodeServiceClosed, env+" was quiesced")
	res := EnvActionResult{Env: env, Action: "quiesce"}
	res.Nodes = m.everywhere(env, wlmQuiesce, binary.AppendUvarint(nil, uint64(st.Epoch)), func() (string, error) {
		if _, ok := n.groups[env]; !ok {
			return "no server here", nil
		}
		return "done", m.quiesceLocal(env, "quiesce")
	})
	n.announce()
	return res, nil
}

// Resume lets environment env have servers again, from none.
func (n *Node) Resume(env string) (EnvActionResult, error) {
	m, err := n.envFor(env)
	if err != nil {
		return EnvActionResult{}, err
	}
	m.mu.Lock()
	st := m.states[env].Resume()
	m.states[env] = st
	m.mu.Unlock()
	res := EnvActionResult{Env: env, Action: "resume"}
	res.Nodes = m.everywhere(env, wlmResume, binary.AppendUvarint(nil, uint64(st.Epoch)), func() (string, error) { return "done", nil })
	n.announce()
	return res, nil
}

// Refresh replaces the processes of every server of env in the cluster,
// one at a time per server (VARY WLM,REFRESH).
func (n *Node) Refresh(env string) (EnvActionResult, error) {
	m, err := n.envFor(env)
	if err != nil {
		return EnvActionResult{}, err
	}
	res := EnvActionResult{Env: env, Action: "refresh"}
	deadline := time.Now().Add(envQuiesceTimeout)
	res.Nodes = m.everywhere(env, wlmRefresh, nil, func() (string, error) {
		k, err := m.refreshLocal(env, deadline)
		return fmt.Sprintf("%d process(es) replaced", k), err
	})
	return res, nil
}

// ReloadPolicy makes every node read svcpolicy again.
func (n *Node) ReloadPolicy() (EnvActionResult, error) {
	if n.wlm == nil {
		return EnvActionResult{}, errNoPolicy
	}
	res := EnvActionResult{Action: "policy"}
	res.Nodes = n.wlm.envs.everywhere("", wlmPolicy, nil, n.wlm.reloadLocal)
	return res, nil
}

var errNoPolicy = errors.New("this node started without svcpolicy: it manages no goals (add the file and restart it)")

func (n *Node) envFor(env string) (*envManager, error) {
	if n.wlm == nil {
		return nil, errNoPolicy
	}
	if !n.wlm.envs.isEnv(env) {
		return nil, &netio.Error{Code: netio.CodeNoSuchGroup, Message: n.unknown(env, func() []string {
			return n.wlm.policy.Load().p.Environments
		}) + " is not an application environment of the policy"}
	}
	return n.wlm.envs, nil
}

// reloadLocal reads svcpolicy again and puts it in force here; the
// environments it drops are quiesced here.
func (w *wlmNode) reloadLocal() (string, error) {
	d, err := def.LoadPolicy(w.n.cfg.Dir)
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
		if l := m.local[env]; l != nil {
			l.dropped = false
		}
		m.mu.Unlock()
	}
	var errs []error
	for _, env := range dropped {
		m.answerParked(env, netio.CodeServiceClosed, env+" was dropped from the policy")
		errs = append(errs, m.quiesceLocal(env, "policy"))
		// A policy that names it again starts it from none, on demand: the
		// high-water mark belongs to the policy that dropped it. Every node
		// reads the policy, so every node moves to the same new epoch.
		m.mu.Lock()
		m.states[env] = m.states[env].Resume()
		m.mu.Unlock()
	}
	w.n.announce()
	w.log.Info("service policy read again", "classes", len(p.Classes), "environments", p.Environments, "dropped", dropped)
	out := fmt.Sprintf("%d classes, environments %v", len(p.Classes), p.Environments)
	if len(dropped) > 0 {
		out += ", quiesced " + strings.Join(dropped, ", ")
	}
	return out, errors.Join(errs...)
}
