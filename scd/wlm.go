package scd

// This file is the node's routing manager (source document 004) as far as
// goals go: the service policy (svcpolicy), the class every call carries
// from its admission to its answer, what each class's calls took (queue
// time, service time, the UAP CPU charged to them), the performance index
// of each class at every policy interval, the node's spare CPU by
// importance, and what the node does when a class misses its goal (CPU
// weights; one more server elsewhere: wlm_env.go). The decisions are
// scd/wlm's; this file measures and acts. A node without svcpolicy has
// none of it (n.wlm is nil).
//
// Per call the cost is a map look-up at admission (the class of its
// service) and, at its answer, a few additions to its class's figures
// under the group's lock, which the reply reader holds anyway.

import (
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"tpsched/procmgr"
	"tpsched/scd/def"
	"tpsched/scd/local"
	"tpsched/scd/route"
	"tpsched/scd/wlm"
)

// piWindow is how many policy intervals a performance index is judged
// over: one quiet or noisy interval does not decide alone.
const piWindow = 3

// activePolicy is the service policy in force.
type activePolicy struct {
	def   *def.Policy
	p     *wlm.Policy
	since time.Time
}

// compilePolicy turns the definition into scd/wlm's policy.
func compilePolicy(d *def.Policy) (*wlm.Policy, error) {
	classes := make([]wlm.Class, len(d.Classes))
	for i, c := range d.Classes {
		g := wlm.Goal{Kind: wlm.GoalAverage, Target: c.ResponseTime}
		if c.Percent > 0 {
			g = wlm.Goal{Kind: wlm.GoalPercentile, Target: c.ResponseTime, Percent: c.Percent}
		}
		classes[i] = wlm.Class{Name: c.Name, Importance: c.Importance, Goal: g}
	}
	rules := make([]wlm.Rule, len(d.Rules))
	for i, r := range d.Rules {
		rules[i] = wlm.Rule{Group: r.Group, Service: r.Service, Class: r.Class}
	}
	p, err := wlm.NewPolicy(classes, d.DefaultClass, rules, d.Environments, d.Interval)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", d.File, err)
	}
	return p, nil
}

// classFigures are one class's figures on this node.
type classFigures struct {
	total   wlm.Sample  // since the policy came into force
	last    wlm.Sample  // the last interval
	window  *wlm.Window // the last piWindow intervals
	pi      float64     // over the window
	piKnown bool
}

// groupFigures are what the routing manager keeps of one group between
// intervals.
type groupFigures struct {
	windows           []*wlm.Window // by class
	lastCPU, lastWait time.Duration // the processes' usage at the last interval (it never goes back)
	base, weight      int           // CPU weight: from schedule_priority, and now
	delay             float64       // CPU delay over the last interval; -1 unknown
	pi                uint16        // announced: performance index x 100 over the window, 0 unknown
}

// wlmNode is the node's routing manager.
type wlmNode struct {
	n      *Node
	log    *slog.Logger
	policy atomic.Pointer[activePolicy]
	load   *cpuSampler

	mu        sync.Mutex // guards what follows, read by reports and /metrics
	classes   []classFigures
	groups    map[string]*groupFigures
	spare     [wlm.LeastImportant + 1]float64
	other     float64 // CPUs other programs used over the last interval (not the UAPs)
	loadErr   string  // why spare CPU is not measured, if it is not
	lastTick  time.Time
	decision  wlm.Decision
	intervals uint64
	last      wlmAnnounced // what the node announced last (wlm_report.go)
	// installed are the policy's classes of each group, as installed in
	// it; the interval takes its figures from the group with them.
	installed map[string]*wlm.Classes

	envs *envManager // wlm_env.go
}

// newWLM makes the routing manager of n, whose definitions have a service
// policy.
func newWLM(n *Node) (*wlmNode, error) {
	p, err := compilePolicy(n.cfg.Policy)
	if err != nil {
		return nil, err
	}
	w := &wlmNode{n: n, log: n.log, load: newCPUSampler(), groups: map[string]*groupFigures{}}
	w.install(&activePolicy{def: n.cfg.Policy, p: p, since: time.Now()})
	w.envs = newEnvManager(w)
	n.metrics.RegisterMetricsWriter(w.writeMetrics)
	return w, nil
}

// install makes ap the policy in force: new classes for every group,
// figures from zero.
func (w *wlmNode) install(ap *activePolicy) {
	w.mu.Lock()
	w.classes = make([]classFigures, len(ap.p.Classes))
	for i := range w.classes {
		w.classes[i].window = wlm.NewWindow(piWindow)
	}
	for _, g := range w.n.local.Groups() {
		gf := w.groups[g.Name()]
		if gf == nil {
			base := procmgr.Weight(g.Def().SchedulePriority)
			gf = &groupFigures{base: base, weight: base, delay: -1}
			w.groups[g.Name()] = gf
		}
		gf.windows = make([]*wlm.Window, len(ap.p.Classes))
		for i := range gf.windows {
			gf.windows[i] = wlm.NewWindow(piWindow)
		}
		gf.pi = 0
	}
	classes := make(map[string]*wlm.Classes, len(w.n.local.Groups()))
	for _, g := range w.n.local.Groups() {
		classes[g.Name()] = wlm.NewClasses(ap.p, g.Name(), serviceNames(g))
	}
	w.installed = classes
	w.mu.Unlock()
	w.policy.Store(ap)
	for _, g := range w.n.local.Groups() {
		g.SetClasses(classes[g.Name()])
	}
}

// serviceNames are the services of g's definition.
func serviceNames(g *local.Group) []string {
	out := make([]string, 0, len(g.Def().Services))
	for _, s := range g.Def().Services {
		out = append(out, s.Name)
	}
	return out
}

// mainClass is the class a group's CPU is charged to when none of its
// calls ended in an interval: the most important of its services'.
func mainClass(p *wlm.Policy, g *local.Group) int {
	best := p.Classify(g.Name(), "")
	for _, s := range g.Def().Services {
		if c := p.Classify(g.Name(), s.Name); p.Classes[c].Importance < p.Classes[best].Importance {
			best = c
		}
	}
	return best
}

// start runs the policy interval until the node stops.
func (w *wlmNode) start() {
	if _, _, err := w.load.sample(); err != nil {
		w.log.Warn("spare cpu is not measured; other programs' use counts as none", "err", err)
	}
	w.mu.Lock()
	w.lastTick = time.Now()
	w.mu.Unlock()
	w.n.wg.Add(1)
	go func() {
		defer w.n.wg.Done()
		for {
			ap := w.policy.Load()
			t := time.NewTimer(ap.p.Interval)
			select {
			case <-w.n.stop:
				t.Stop()
				return
			case now := <-t.C:
				w.interval(now)
			}
		}
	}()
	w.envs.start()
}

// interval ends one policy interval: it gathers every group's calls by
// class, charges their CPU, measures the node's spare CPU, computes every
// class's performance index and acts on it.
func (w *wlmNode) interval(now time.Time) {
	ap := w.policy.Load()
	p := ap.p
	nc := len(p.Classes)
	w.mu.Lock()
	elapsed := now.Sub(w.lastTick).Seconds()
	w.lastTick = now
	w.mu.Unlock()
	if elapsed <= 0 {
		return
	}
	waits := w.n.meter != nil && w.n.meter.Mechanism().Waits
	node := make([]wlm.Sample, nc)
	var load wlm.NodeLoad
	states := make([]wlm.GroupState, 0, len(w.n.local.Groups()))
	var stateGroups []*local.Group
	for _, g := range w.n.local.Groups() {
		w.mu.Lock()
		classes := w.installed[g.Name()]
		w.mu.Unlock()
		cur := g.TakeSamples(classes)
		if len(cur) != nc {
			continue // the policy is being replaced
		}
		u := g.Usage()
		w.mu.Lock()
		gf := w.groups[g.Name()]
		dCPU, dWait := max(u.OnCPU-gf.lastCPU, 0), max(u.Wait-gf.lastWait, 0)
		gf.lastCPU, gf.lastWait = u.OnCPU, u.Wait
		var service time.Duration
		for _, s := range cur {
			service += s.Service
		}
		main := mainClass(p, g)
		for c := range cur {
			share := 0.0
			switch {
			case service > 0:
				share = float64(cur[c].Service) / float64(service)
			case c == main:
				share = 1
			}
			cur[c].CPU = time.Duration(float64(dCPU) * share)
			imp := p.Classes[c].Importance
			load.UAP[imp].OnCPU += dCPU.Seconds() * share / elapsed
			load.UAP[imp].Wait += dWait.Seconds() * share / elapsed
			gf.windows[c].Push(cur[c])
			node[c].Add(cur[c])
		}
		gf.delay = cpuDelay(waits, dCPU, dWait, service)
		gs := wlm.GroupState{Name: g.Name(), Env: w.envs.isEnv(g.Name()), Calls: make([]uint64, nc), Weight: gf.weight, CPUDelay: gf.delay}
		var worst float64
		served := false
		for c := range nc {
			s := gf.windows[c].Sum()
			gs.Calls[c] = s.Calls
			served = served || s.Calls > 0
			if pi, ok := wlm.PI(p.Classes[c].Goal, s); ok {
				worst = max(worst, pi)
			}
		}
		if !served && dCPU > 0 {
			gs.Calls[main] = 1 // it works on calls that have not ended yet
		}
		gf.pi = announcedPI(worst)
		w.mu.Unlock()
		if g.Serving() {
			states = append(states, gs)
			stateGroups = append(stateGroups, g)
		}
	}
	cpus, busy, err := w.load.sample()
	load.CPUs, load.Busy = cpus, busy
	spare := wlm.Spare(load)
	classStates := make([]wlm.ClassState, nc)
	w.mu.Lock()
	w.loadErr = ""
	if err != nil {
		w.loadErr = err.Error()
	}
	w.spare = spare
	w.other = load.Busy
	for _, d := range load.UAP {
		w.other -= d.OnCPU
	}
	w.other = max(w.other, 0)
	for c := range nc {
		f := &w.classes[c]
		f.total.Add(node[c])
		f.last = node[c]
		f.window.Push(node[c])
		f.pi, f.piKnown = wlm.PI(p.Classes[c].Goal, f.window.Sum())
		classStates[c] = wlm.ClassState{Importance: p.Classes[c].Importance, PI: f.pi, Known: f.piKnown}
	}
	w.intervals++
	w.mu.Unlock()
	w.act(classStates, states, stateGroups)
	w.envs.interval()
	w.announceIfChanged()
}

// cpuDelay is how much of its calls' time a group's processes spent
// waiting for a CPU over an interval: the wait over the service time of the
// calls that ended in it, or, when none ended, over the time the processes
// were runnable; 0 when they never ran; -1 when waits are not measured. The
// service time is the better base: a process that mostly sleeps (it waits
// for a database, another server) waits for a CPU at every wake-up, which
// is much of its little runnable time but nothing of its calls' time, and
// more CPU weight would not help it.
func cpuDelay(waits bool, onCPU, wait, service time.Duration) float64 {
	switch {
	case !waits:
		return -1
	case service > 0:
		return min(float64(wait)/float64(service), 1)
	case onCPU+wait > 0:
		return float64(wait) / float64(onCPU+wait)
	}
	return 0
}

// announcedPI is a performance index as announced: x 100, 0 for none.
func announcedPI(pi float64) uint16 {
	if pi <= 0 || math.IsNaN(pi) {
		return 0
	}
	return uint16(min(math.Max(math.Round(pi*100), 1), math.MaxUint16))
}

// act carries out what the figures call for: CPU weights on this node,
// one more server of an environment elsewhere (wlm_env.go).
func (w *wlmNode) act(classes []wlm.ClassState, states []wlm.GroupState, groups []*local.Group) {
	d := wlm.Decide(classes, states, wlm.DefaultLimits)
	ap := w.policy.Load()
	p := ap.p
	w.mu.Lock()
	prev := w.decision
	w.decision = d
	w.mu.Unlock()
	if d.Receiver >= 0 && (prev.Receiver != d.Receiver || prev.Why != d.Why) {
		w.log.Info("service class misses its goal", "class", p.Classes[d.Receiver].Name,
			"pi", fmt.Sprintf("%.2f", classes[d.Receiver].PI), "action", d.Why, "goal_management", ap.def.Manage)
	}
	if !ap.def.Manage {
		return // goal_management = N: measured and reported, not acted on
	}
	for i, g := range groups {
		if d.Weights[i] != states[i].Weight {
			w.setWeight(g, d.Weights[i])
		}
	}
	if d.Grow != "" {
		w.envs.grow(d.Grow)
	}
}

// setWeight gives g's processes CPU weight weight (cgroup v2 scale).
func (w *wlmNode) setWeight(g *local.Group, weight int) {
	if err := g.SetCPUWeight(weight); err != nil {
		w.log.Warn("cpu weight not changed", "group", g.Name(), "weight", weight, "err", err)
		return
	}
	w.mu.Lock()
	w.groups[g.Name()].weight = weight
	w.mu.Unlock()
}

// resetWeights gives every group the weight of its schedule_priority
// again: goal management was turned off (goal_management = N).
func (w *wlmNode) resetWeights() {
	for _, g := range w.n.local.Groups() {
		w.mu.Lock()
		gf := w.groups[g.Name()]
		changed := gf != nil && gf.weight != gf.base
		w.mu.Unlock()
		if changed && g.Serving() {
			w.setWeight(g, gf.base)
		}
	}
}

// resetWeight forgets what goal management did to g's weight: its server
// (re)started with the weight of its schedule_priority.
func (w *wlmNode) resetWeight(g *local.Group) {
	w.mu.Lock()
	if gf := w.groups[g.Name()]; gf != nil {
		gf.weight = gf.base
	}
	w.mu.Unlock()
}

// steer drops from cands the nodes where group's calls are known to miss
// their goals while another candidate is known to meet them (wlm.Steer),
// so calls go towards the nodes that meet the goal. It keeps the order and
// works in place; with one candidate or none it does nothing.
func (w *wlmNode) steer(group string, cands []route.Candidate) []route.Candidate {
	if len(cands) < 2 || len(cands) > 64 || w.n.clusterNames() == nil || !w.policy.Load().def.Manage {
		return cands
	}
	entries := w.n.clusterNames().Lookup(group)
	var goals [64]wlm.NodeGoal
	var keep [64]bool
	anyKnown := false
	for i, c := range cands {
		goals[i] = wlm.NodeGoal{}
		for _, e := range entries {
			if e.Node == c.Node {
				goals[i] = wlm.NodeGoal{PI: float64(e.PI) / 100, Known: e.PI > 0}
				anyKnown = anyKnown || e.PI > 0
				break
			}
		}
	}
	if !anyKnown {
		return cands
	}
	wlm.Steer(goals[:len(cands)], keep[:len(cands)])
	out := cands[:0]
	for i, c := range cands {
		if keep[i] {
			out = append(out, c)
		}
	}
	return out
}

// namesChanged is called when a peer changed the name table: the routing
// manager counts the servers it shows at once (wlm_env.go's observe).
func (n *Node) namesChanged() {
	if n.wlm != nil {
		n.wlm.envs.poke()
	}
}
