package wlmnode

import (
	"context"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/scd/names"
	"tpsched/scd/peers"
	"tpsched/scd/wlm"
)

// Bounds of the routing manager's waits.
const (
	envStartTimeout   = 30 * time.Second // a find waits at most this long for a server to start
	envQuiesceTimeout = 30 * time.Second // a quiescing server's calls may take this long
	hintLife          = 15 * time.Second // the decider counts a server it started this long before its announce
	maxParked         = 4096             // calls waiting for a server, per environment
	maxFindWaiters    = 4096             // finds waiting for a server, node-wide
	maxRequests       = 4096             // other nodes' requests in progress, node-wide
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

// envLocal is this node's side of one group under the policy.
type envLocal struct {
	g     Group
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

// envs keeps the environments of a node with a service policy: what this
// node knows of each (states), its own server of each (local), the finds
// it runs. mu guards its maps and those of its decider and its parking.
type envs struct {
	w     *Manager
	self  string
	log   *slog.Logger
	local Local
	names *names.Table
	alone bool // no other node: the name table stays empty
	peers Peers
	opts  *Options
	dec   *decider
	park  *parking

	mu        sync.Mutex
	here      map[string]*envLocal
	states    map[string]wlm.EnvState // what this node knows of every environment
	finds     map[string]*flight      // finds from this node in progress
	growAsked map[string]time.Time    // the last time this node asked for one more server

	changed chan struct{} // poke: the name table changed

	requests atomic.Int32 // other nodes' requests in progress (serveRequest)

	// handedOver: a restart's new process takes this node's servers over
	// (HandOver); this process takes no start or decision from another
	// node. Under mu.
	handedOver bool

	waiters atomic.Int32
	started *metrics.Counter
	stopped map[string]*metrics.Counter
	finds0  map[string]*metrics.Counter
}

func newEnvs(w *Manager) *envs {
	o := &w.opts
	m := &envs{
		w: w, self: o.Self, log: o.Log, local: o.Local, names: o.Names, alone: o.Alone, peers: o.Peers, opts: o,
		here: map[string]*envLocal{}, states: map[string]wlm.EnvState{},
		finds: map[string]*flight{}, growAsked: map[string]time.Time{},
		changed: make(chan struct{}, 1),
		started: o.Metrics.NewCounter(`tpsched_wlm_servers_started_total`),
		stopped: map[string]*metrics.Counter{}, finds0: map[string]*metrics.Counter{},
	}
	m.dec = &decider{m: m, decides: map[string]*flight{}, hints: map[string][]hint{}, lastGrow: map[string]time.Time{}}
	m.park = &parking{m: m, parked: map[string][]*peers.Call{}}
	for _, why := range []string{"quiesce", "policy", "failing"} {
		m.stopped[why] = o.Metrics.NewCounter(`tpsched_wlm_servers_stopped_total{reason="` + why + `"}`)
	}
	for _, r := range []string{"served", "started", "failed"} {
		m.finds0[r] = o.Metrics.NewCounter(`tpsched_wlm_finds_total{result="` + r + `"}`)
	}
	o.Metrics.NewGauge(`tpsched_wlm_calls_waiting_for_server`, func() float64 { return float64(m.park.waiting()) })
	for _, g := range o.Local.Groups() {
		l := &envLocal{g: g, state: envServing}
		if m.isEnv(g.Name()) {
			l.state = envDormant // no process until the cluster chooses this node
		}
		m.here[g.Name()] = l
	}
	return m
}

func (m *envs) policy() *wlm.Policy { return m.w.policy.Load().p }

// isEnv reports whether group is an application environment of the policy.
func (m *envs) isEnv(group string) bool { return m.policy().IsEnvironment(group) }

// run is the environments' background loop until the manager closes: it
// answers the parked calls whose deadline passed and observes the name
// table when it changed.
func (m *envs) run(ctx context.Context) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			m.park.expire(now)
		case <-m.changed:
			m.observe()
		}
	}
}

// servedElsewhere reports whether another node serves group.
func (m *envs) servedElsewhere(group string) bool {
	for _, e := range m.names.Lookup(group) { // none alone
		if !e.Local && !e.Held {
			return true
		}
	}
	return false
}

// knownEnv reports whether some node can serve environment env.
func (m *envs) knownEnv(env string) bool {
	m.mu.Lock()
	_, here := m.here[env]
	m.mu.Unlock()
	if here {
		return true
	}
	for _, info := range m.names.Nodes() { // none alone
		if info.WLM != nil && slices.ContainsFunc(info.WLM.Envs, func(e names.EnvInfo) bool { return e.Env == env }) {
			return true
		}
	}
	return false
}

// servers lists the nodes that serve env, those where its calls meet their
// goals first; with hints, also those the decider started lately.
func (m *envs) servers(env string, hints bool) []serverAt {
	var out []serverAt
	self := m.self
	if !m.alone {
		for _, e := range m.names.Lookup(env) {
			if e.Held {
				continue
			}
			if e.Local {
				if g, ok := m.local.Group(env); !ok || !g.Serving() {
					continue // the table may lag behind a quiesce here
				}
			}
			out = append(out, serverAt{node: e.Node, addr: e.Addr, level: uint8(e.Level), pi: e.PI})
		}
	} else if g, ok := m.local.Group(env); ok && g.Serving() && !g.Held() {
		out = append(out, serverAt{node: self, addr: m.opts.Addr(), level: uint8(g.Level()), pi: m.w.GroupPI(env)})
	}
	if hints {
		m.mu.Lock()
		m.dec.expireHintsLocked(env, time.Now())
		for _, h := range m.dec.hints[env] {
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

// state is what this node knows of env.
func (m *envs) state(env string) wlm.EnvState {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.states[env]
}

// observe merges what the other nodes announced of every environment and
// raises the high-water marks to the servers seen; it returns the servers
// counted. It runs at every interval and whenever the name table changed
// (poke), so that a server seen for a moment counts even if it dies before
// the next interval.
func (m *envs) observe() map[string]int {
	p := m.policy()
	nodes := m.names.Nodes()
	epochs := make(map[string]uint32, len(p.Environments))
	m.mu.Lock()
	for _, info := range nodes {
		if info.WLM == nil || info.Node == m.self {
			continue
		}
		for _, e := range info.WLM.Envs {
			if !p.IsEnvironment(e.Env) {
				// Not ours: a peer may announce any names, new ones each
				// time, and a state kept for each would grow for ever
				// (holding the announce its name is cut from). A policy
				// that names it later learns it from the next announce.
				continue
			}
			m.states[e.Env] = m.states[e.Env].Merge(wlm.EnvState{Epoch: e.Epoch, HWM: int(e.HWM), Quiesced: e.Quiesced})
		}
	}
	for _, env := range p.Environments {
		epochs[env] = m.states[env].Epoch
	}
	m.mu.Unlock()
	counts := map[string]int{}
	for _, env := range p.Environments {
		counts[env] = len(m.servers(env, false))
	}
	type quiesced struct {
		env   string
		epoch uint32
	}
	var stop []quiesced
	m.mu.Lock()
	for env, c := range counts {
		// A count belongs to the epoch and the policy it was taken under:
		// a resume or a policy that dropped env while it was taken starts
		// from none, and the servers counted may be the ones it stopped.
		if m.states[env].Epoch != epochs[env] || !m.isEnv(env) {
			continue
		}
		m.states[env] = m.states[env].Saw(c)
	}
	for _, env := range p.Environments {
		if l := m.here[env]; l != nil && m.states[env].Quiesced && (l.state == envServing || l.state == envStarting) {
			stop = append(stop, quiesced{env, m.states[env].Epoch})
		}
	}
	m.mu.Unlock()
	for _, q := range stop {
		// A quiesce this node learned from the others' announces, not
		// from the request that stops the servers: the request went to
		// the process before a restart (which had passed its servers on
		// already), or this node was cut off when it was sent.
		m.log.Info("application environment: quiesced in the cluster while its server ran here; stopping it", "env", q.env)
		m.w.goTracked(func(ctx context.Context) { _ = m.quiesceLocalIf(ctx, q.env, "quiesce", q.epoch, true) })
	}
	return counts
}

// poke asks the manager to observe the name table soon; it never blocks
// (the name table's receive loop calls it).
func (m *envs) poke() {
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// interval observes the cluster, withdraws a server whose processes keep
// dying, and, on the deciding node, starts servers that bring an
// environment back to its high-water mark.
func (m *envs) interval() {
	counts := m.observe()
	m.mu.Lock()
	var failing []string
	for env, l := range m.here {
		if l.state == envServing && m.isEnv(env) && l.g.Failure() != nil {
			failing = append(failing, env)
		}
	}
	m.mu.Unlock()
	for _, env := range failing {
		m.w.goTracked(func(ctx context.Context) {
			m.log.Error("application environment: the server's processes keep dying; withdrawing it from the cluster", "env", env)
			_ = m.quiesceLocal(ctx, env, "failing")
		})
	}
	m.dec.replenish(counts)
}

// announcedEnvs is what this node announces of the environments it can
// serve.
func (m *envs) announcedEnvs() []names.EnvInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []names.EnvInfo
	for _, g := range m.local.Groups() { // sorted by name
		if _, ok := m.here[g.Name()]; !ok || !m.isEnv(g.Name()) {
			continue
		}
		st := m.states[g.Name()]
		out = append(out, names.EnvInfo{Env: g.Name(), Epoch: st.Epoch, HWM: uint32(st.HWM), Quiesced: st.Quiesced})
	}
	return out
}

// localState is this node's state of group under the policy; "" when it
// does not define it.
func (m *envs) localState(group string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.here[group]
	switch {
	case l == nil:
		return ""
	case l.dropped && l.state == envDormant:
		return "dropped"
	}
	return l.state
}

// definers are the nodes that can serve env, sorted.
func (m *envs) definers(env string) []string {
	var out []string
	if !m.alone {
		for _, info := range m.names.Nodes() {
			if info.WLM == nil {
				continue
			}
			for _, e := range info.WLM.Envs {
				if e.Env == env {
					out = append(out, info.Node)
				}
			}
		}
		return out
	}
	if m.localState(env) != "" {
		out = append(out, m.self)
	}
	return out
}
