package wlmnode

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"tpsched/netio"
	"tpsched/scd/names"
	"tpsched/scd/wlm"
)

// Why a start is decided.
const (
	purposeFirst     byte = 1 // no node serves it (find, a call)
	purposeGrow      byte = 2 // a class misses its goal
	purposeReplenish byte = 3 // fewer servers than the high-water mark: one died
)

var purposeNames = map[byte]string{purposeFirst: "first", purposeGrow: "goal", purposeReplenish: "replace"}

// hint is a server the decider started whose announce may not have
// reached it yet: counted as serving until the table can show it, but
// never past its life, the environment's epoch (a quiesce, resume or
// policy change since), its node's membership, or (this node's) its
// server.
type hint struct {
	node, addr string
	at         time.Time
	epoch      uint32 // the environment's epoch when the start was decided
}

// decider is the node's part as a deciding node. Every start of a
// server of one environment (or one subsystem instance's group of it) is
// decided by one node, the environment's decider (node). Its maps are
// guarded by the envs' mu.
type decider struct {
	m        *envs
	decides  map[string]*flight   // starts in progress
	hints    map[string][]hint    // servers started, perhaps not announced yet
	lastGrow map[string]time.Time // the last server started for a missed goal
}

// node is the node that decides env's starts. Among the live nodes with a
// service policy, in node id order (this one alone when it has none):
// the first for an environment without instances, and for an instance's
// group the one at the instance's place in the policy's instances (in
// name order), counted round. The seed applies the rules to each instance
// apart, and so the instances do not share one decider: a decider's death
// stalls only the instances it decided for until the others see it gone
// (with one decider, a kill -9 held up every instance's first find for
// the failure detection's time).
func (d *decider) node(env string) (node, addr string) {
	m := d.m
	type member struct{ node, addr string }
	live := []member{{m.self, ""}} // the table may not list this node yet
	for _, info := range m.names.Nodes() {
		if info.WLM != nil && info.Node != m.self {
			live = append(live, member{info.Node, info.Addr})
		}
	}
	slices.SortFunc(live, func(a, b member) int { return strings.Compare(a.node, b.node) })
	c := live[instanceIndex(m.policy().Instances, env)%len(live)]
	return c.node, c.addr
}

// instanceIndex is the place of env's instance among instances in name
// order; 0 for an environment without one.
func instanceIndex(instances []string, env string) int {
	_, in := wlm.SplitInstance(env)
	if in == "" {
		return 0
	}
	n := 0
	for _, other := range instances {
		if other < in {
			n++
		}
	}
	return n
}

// decide starts a server of env if purpose calls for one, as the deciding
// node, and returns the servers of env then.
func (d *decider) decide(ctx context.Context, env string, purpose byte, deadline time.Time) ([]serverAt, error) {
	m := d.m
	if !m.isEnv(env) {
		return nil, &netio.Error{Code: netio.CodeNoSuchGroup, Message: env + " is not an application environment of the policy"}
	}
	var servers []serverAt
	m.mu.Lock()
	for {
		if m.states[env].Quiesced {
			m.mu.Unlock()
			return nil, &netio.Error{Code: netio.CodeServiceClosed, Message: env + " is quiesced"}
		}
		fl := d.decides[env]
		if fl == nil {
			d.expireHintsLocked(env, time.Now())
			m.mu.Unlock()
			servers = m.servers(env, true)
			m.mu.Lock()
			if d.decides[env] == nil {
				break
			}
			// Another decide claimed the start while this one looked
			// at the servers (both would have started one): wait for
			// it as for one found at once.
			continue
		}
		m.mu.Unlock() // a start in progress: its result serves us too
		t := time.NewTimer(max(time.Until(deadline), 0))
		select {
		case <-fl.done:
			t.Stop()
		case <-t.C:
			return nil, &netio.Error{Code: netio.CodeTimedOut, Message: "a start of " + env + " is still in progress"}
		case <-ctx.Done():
			t.Stop()
			return nil, &netio.Error{Code: netio.CodeShuttingDown, Message: "the node is stopping"}
		}
		if purpose == purposeFirst {
			if len(fl.servers) > 0 {
				// The servers there are, even when the start we waited
				// for failed: a grow's or a replenish's failure is not
				// this find's (it asks for one server, not one more).
				return fl.servers, nil
			}
			return fl.servers, fl.err
		}
		m.mu.Lock()
	}
	switch {
	case purpose == purposeFirst && len(servers) > 0,
		purpose == purposeGrow && time.Since(d.lastGrow[env]) < d.growCooldown(),
		purpose == purposeReplenish && m.states[env].Missing(len(servers)) == 0:
		m.mu.Unlock()
		return servers, nil
	}
	fl := &flight{done: make(chan struct{})}
	d.decides[env] = fl
	if purpose == purposeGrow {
		d.lastGrow[env] = time.Now()
	}
	epoch := m.states[env].Epoch
	m.mu.Unlock()
	fl.servers, fl.err = d.place(ctx, env, purpose, servers, epoch, deadline)
	m.mu.Lock()
	delete(d.decides, env)
	m.mu.Unlock()
	close(fl.done)
	return fl.servers, fl.err
}

// growCooldown is the time between two servers started for a missed goal.
func (d *decider) growCooldown() time.Duration {
	m := d.m
	return growIntervals * m.policy().Interval
}

// place chooses a node for one more server of env and starts it there.
// A server it starts is hinted in the environment's epoch as it was when
// the start was decided.
func (d *decider) place(ctx context.Context, env string, purpose byte, servers []serverAt, epoch uint32, deadline time.Time) ([]serverAt, error) {
	m := d.m
	p := m.policy()
	imp := p.Classes[p.Default].Importance
	if g, ok := m.local.Group(env); ok {
		imp = p.Importance(env, serviceNames(g))
	}
	hosts, addrs, unmeasured := d.hosts(env, imp, servers)
	d.freshen(ctx, imp, hosts, addrs, unmeasured, deadline)
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
			if purpose == purposeGrow {
				// A missed goal asked for a server and none starts: say
				// why, or the report and the log only repeat the ask
				// (issue 30 item 4).
				return servers, noHostForGrow(env, imp, hosts)
			}
			return servers, nil // every node that could serves it
		}
		h := hosts[i]
		err := d.startOn(ctx, h.Node, addrs[i], env, deadline)
		if err == nil {
			m.log.Info("routing manager: server started", "env", env, "node", h.Node, "why", purposeNames[purpose],
				"spare_cpus", fmt.Sprintf("%.2f", h.Spare), "importance", imp, "hosts", hostsLine(hosts))
			m.mu.Lock()
			d.hints[env] = append(d.hints[env], hint{node: h.Node, addr: addrs[i], at: time.Now(), epoch: epoch})
			m.states[env] = m.states[env].Saw(len(servers) + 1)
			m.mu.Unlock()
			return append(servers, serverAt{node: h.Node, addr: addrs[i]}), nil
		}
		m.log.Warn("routing manager: a server did not start; trying another node", "env", env, "node", h.Node, "err", err)
		lastErr = err
		hosts[i].Serving = true // not again
		if time.Now().After(deadline) {
			return servers, err
		}
	}
}

// noHostForGrow says why no node gets one more server of env for a missed
// goal: each node's spare CPU at the importance against the growMinSpare
// a node needs, or that it serves env already.
func noHostForGrow(env string, imp int, hosts []wlm.Host) error {
	var b strings.Builder
	for i, h := range hosts {
		if i > 0 {
			b.WriteString(", ")
		}
		if h.Serving {
			fmt.Fprintf(&b, "%s serves it (or its start failed)", h.Node)
		} else {
			fmt.Fprintf(&b, "%s %.2f", h.Node, h.Spare)
		}
	}
	if len(hosts) == 0 {
		b.WriteString("no node defines it")
	}
	return &netio.Error{Code: netio.CodeServerBusy, Message: fmt.Sprintf(
		"no server of %s started: a node needs %.2f spare CPU at importance %d and none that does not serve it has (%s)",
		env, growMinSpare, imp, b.String())}
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
// imp, and their addresses; unmeasured[i] says host i announced no spare
// CPU at any importance: it has not measured yet, or its CPUs are full.
func (d *decider) hosts(env string, imp int, servers []serverAt) (hosts []wlm.Host, addrs []string, unmeasured []bool) {
	m := d.m
	serving := func(node string) bool {
		return slices.ContainsFunc(servers, func(s serverAt) bool { return s.node == node })
	}
	self := m.self
	if m.alone {
		m.mu.Lock()
		_, ok := m.here[env]
		m.mu.Unlock()
		if !ok {
			return nil, nil, nil
		}
		return []wlm.Host{{Node: self, Serving: serving(self)}}, []string{m.opts.Addr()}, []bool{true}
	}
	for _, info := range m.names.Nodes() {
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
		unmeasured = append(unmeasured, info.WLM.Spare == [names.Importances]uint32{})
	}
	return hosts, addrs, unmeasured
}

// measureTimeout bounds how long a placement waits for a host to measure
// its spare CPU; a host that does not answer in time keeps what it
// announced.
const measureTimeout = 2 * time.Second

// freshen gives the candidate hosts that announced no spare CPU at all
// (unmeasured) what they measure now, before a placement: right after a
// cluster starts, no node has ended a policy interval and every one
// announces 0.00, so the first server went to the lowest node id, busy or
// not (issue 22 item 4). This node measures itself (measureNow), the
// others are asked (wlm-measure), in parallel; a host measures at once if
// it never has, else it answers its last interval's figures. A host whose
// CPUs are full answers 0.00 again, and one that cannot be asked keeps
// what it announced.
func (d *decider) freshen(ctx context.Context, imp int, hosts []wlm.Host, addrs []string, unmeasured []bool, deadline time.Time) {
	m := d.m
	deadline = minTime(deadline, time.Now().Add(measureTimeout))
	var wg sync.WaitGroup
	for i := range hosts {
		if !unmeasured[i] || hosts[i].Serving {
			continue
		}
		wg.Go(func() {
			var spare [names.Importances]uint32
			if hosts[i].Node == m.self {
				mctx, cancel := context.WithDeadline(ctx, deadline)
				err := m.w.measureNow(mctx)
				cancel()
				if err != nil {
					return
				}
				spare = m.w.Announced().Spare
			} else {
				b, err := m.peers.Request(ctx, hosts[i].Node, addrs[i], wlmMeasure, "", nil, deadline)
				if err == nil {
					spare, err = parseSpare(b)
				}
				if err != nil {
					m.log.Info("routing manager: a host's spare cpu was not measured for a placement; using what it announced",
						"node", hosts[i].Node, "err", err)
					return
				}
			}
			hosts[i].Spare = float64(spare[imp-1]) / 1000 // each goroutine its own host
		})
	}
	wg.Wait()
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// startOn has node start a server of env and waits until it is ready.
func (d *decider) startOn(ctx context.Context, node, addr, env string, deadline time.Time) error {
	m := d.m
	if node == m.self {
		return m.activate(ctx, env, deadline)
	}
	_, err := m.peers.Request(ctx, node, addr, wlmStart, env, nil, deadline)
	return err
}

// expireHintsLocked forgets the servers started for env that may be gone:
// started longer than hintLife ago (their announces have come by now), in
// an earlier epoch (a quiesce stopped them, or a policy dropped env; after
// a resume a find must start one, not name one that stopped: issue 22),
// on a node that left the table, or, on this node, no longer serving.
// Under the envs' mu.
func (d *decider) expireHintsLocked(env string, now time.Time) {
	m := d.m
	list := d.hints[env]
	kept := list[:0]
	epoch := m.states[env].Epoch
	for _, h := range list {
		switch {
		case now.Sub(h.at) >= hintLife, h.epoch != epoch:
			continue
		case h.node == m.self:
			if l := m.here[env]; l == nil || l.state != envServing {
				continue
			}
		case !m.alone:
			if _, member := m.names.Get(h.node); !member {
				continue
			}
		}
		kept = append(kept, h)
	}
	clear(list[len(kept):])
	if len(kept) == 0 {
		delete(d.hints, env)
		return
	}
	d.hints[env] = kept
}

// grow asks the decider for one more server of env elsewhere: a class
// misses its goal here. At most one request per cooldown.
func (d *decider) grow(env string) {
	m := d.m
	if m.isHandedOver() {
		return // the new process measures and asks for itself
	}
	now := time.Now()
	m.mu.Lock()
	if now.Sub(m.growAsked[env]) < d.growCooldown() {
		m.mu.Unlock()
		return
	}
	m.growAsked[env] = now
	m.mu.Unlock()
	m.w.goTracked(func(ctx context.Context) {
		deadline := now.Add(envStartTimeout)
		node, addr := m.dec.node(env)
		var err error
		if node == m.self {
			_, err = d.decide(ctx, env, purposeGrow, deadline)
		} else {
			_, err = m.peers.Request(ctx, node, addr, wlmDecide, env, []byte{purposeGrow}, deadline)
		}
		if err != nil {
			m.log.Info("routing manager: no more servers for a missed goal", "env", env, "decider", node, "err", err)
		}
		m.w.grew(env, node, time.Now(), err)
	})
}

// replenish starts, on the deciding node, a server of each environment
// that has fewer than its high-water mark (counts are the servers seen
// now): one died, its node left, or its processes keep dying.
func (d *decider) replenish(counts map[string]int) {
	m := d.m
	if m.isHandedOver() {
		// The new process decides from the table it joins with: a
		// server placed from here could be counted by both.
		return
	}
	for _, env := range m.policy().Environments {
		if node, _ := d.node(env); node != m.self {
			continue
		}
		m.mu.Lock()
		d.expireHintsLocked(env, time.Now())
		missing := m.states[env].Missing(counts[env] + len(d.hints[env]))
		busy := d.decides[env] != nil
		m.mu.Unlock()
		if missing > 0 && !busy {
			m.log.Info("routing manager: fewer servers than the high-water mark; starting one", "env", env,
				"servers", counts[env], "high_water_mark", m.state(env).HWM)
			m.w.goTracked(func(ctx context.Context) {
				_, _ = d.decide(ctx, env, purposeReplenish, time.Now().Add(envStartTimeout))
			})
		}
	}
}
