package wlmnode

import (
	"context"
	"fmt"
	"math"
	"time"

	"tpsched/scd/wlm"
)

// interval ends one policy interval: it gathers every group's calls by
// class, charges their CPU, measures the node's spare CPU, computes every
// class's performance index and acts on it. One interval ends at a time
// (the policy loop's, or measureNow's).
func (w *Manager) interval(now time.Time) {
	w.measuring <- struct{}{} // waits at most for a measureNow, which its ctx bounds
	defer func() { <-w.measuring }()
	w.endInterval(now)
}

// minMeasure is the shortest time spare CPU is measured over: /proc/stat
// counts clock ticks (10 ms), so a shorter window is mostly rounding.
const minMeasure = 250 * time.Millisecond

// measureNow ends the first policy interval at once when none has ended
// yet, so that a placement right after the node started decides by the
// CPU it measured, not by the 0.00 spare CPU every node reads before its
// first interval (then the first server went to the lowest node id, busy
// or not: issue 22 item 4). It waits until minMeasure has passed since the
// node began measuring (Start). Once an interval has ended it does
// nothing: the figures of the last one stand. It waits for the measuring
// token no longer than ctx lets it (a placement bounds its wait by
// measureTimeout), and logs after letting it go.
func (w *Manager) measureNow(ctx context.Context) error {
	select {
	case w.measuring <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	ended, err := w.measureFirst(ctx)
	<-w.measuring
	if ended {
		w.log.Info("routing manager: measured spare cpu at once for a placement before the first policy interval ended")
	}
	return err
}

// measureFirst is measureNow's work, with the measuring token held: it
// reports whether it ended the first interval.
func (w *Manager) measureFirst(ctx context.Context) (bool, error) {
	w.mu.Lock()
	measured, since := w.intervals > 0, w.lastTick
	w.mu.Unlock()
	if measured || since.IsZero() { // measured, or not started: nothing to measure from
		return false, nil
	}
	if wait := time.Until(since.Add(minMeasure)); wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false, ctx.Err()
		}
	}
	w.endInterval(time.Now())
	return true, nil
}

// endInterval is interval's work, with the measuring token held.
func (w *Manager) endInterval(now time.Time) {
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
	waits := w.opts.MeasuresWaits()
	node := make([]wlm.Sample, nc)
	var load wlm.NodeLoad
	states := make([]wlm.GroupState, 0, len(w.local.Groups()))
	var stateGroups []Group
	for _, g := range w.local.Groups() {
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
func (w *Manager) act(classes []wlm.ClassState, states []wlm.GroupState, groups []Group) {
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
		w.envs.dec.grow(d.Grow)
	}
}

// setWeight gives g's processes CPU weight weight (cgroup v2 scale).
func (w *Manager) setWeight(g Group, weight int) {
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
func (w *Manager) resetWeights() {
	for _, g := range w.local.Groups() {
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
func (w *Manager) resetWeight(g Group) {
	w.mu.Lock()
	if gf := w.groups[g.Name()]; gf != nil {
		gf.weight = gf.base
	}
	w.mu.Unlock()
}

// mainClass is the class a group's CPU is charged to when none of its
// calls ended in an interval: the most important of its services'.
func mainClass(p *wlm.Policy, g Group) int {
	best := p.Classify(g.Name(), "")
	for _, s := range g.Def().Services {
		if c := p.Classify(g.Name(), s.Name); p.Classes[c].Importance < p.Classes[best].Importance {
			best = c
		}
	}
	return best
}

// serviceNames are the services of g's definition.
func serviceNames(g Group) []string {
	out := make([]string, 0, len(g.Def().Services))
	for _, s := range g.Def().Services {
		out = append(out, s.Name)
	}
	return out
}
