package wlm

import (
	"fmt"
	"math"
)

// ClassState is a class as Decide sees it: its importance and its
// performance index over the last window, if it had calls.
type ClassState struct {
	Importance int
	PI         float64
	Known      bool
}

// GroupState is one service group of the node as Decide sees it.
type GroupState struct {
	Name string
	Env  bool // an application environment: it can have servers on other nodes
	// Calls are the calls the group served over the window, by class index.
	Calls []uint64
	// Weight is the CPU weight of its processes now (cgroup v2 scale,
	// 1..10000, 100 the default).
	Weight int
	// CPUDelay is the share of its calls' service time its processes spent
	// waiting for a CPU over the last interval (0..1; the share of their
	// runnable time when no call ended); below 0 when it cannot be
	// measured.
	CPUDelay float64
}

// Limits bound what Decide does.
type Limits struct {
	MinWeight, MaxWeight int // the CPU weights a group may be given
	// MinDelay is the CPU delay below which more weight cannot help a
	// class: its processes hardly wait for a CPU.
	MinDelay float64
	// Step is the factor by which a receiver's weight rises and a donor's
	// falls in one interval.
	Step int
}

// DefaultLimits: weights of cgroup v2 (1..10000), doubling per interval,
// weight judged useless below 5% CPU delay.
var DefaultLimits = Limits{MinWeight: 1, MaxWeight: 10000, MinDelay: 0.05, Step: 2}

// Decision is what to do after an interval.
type Decision struct {
	// Receiver is the class helped: the most important one missing its
	// goal (the highest PI among equals); -1 when every class meets its
	// goal or has no calls.
	Receiver int
	// Weights are the groups' new CPU weights, in the order given; a group
	// left alone keeps its weight.
	Weights []int
	// Grow names the application environment that should get one more
	// server on another node; "" none.
	Grow string
	Why  string
}

// Decide chooses what the node does about the goals after an interval.
//
// The receiver is the most important class that misses its goal (PI > 1).
// Its groups are those on this node that served its calls; the donors are
// the groups that served calls only of less important classes. First,
// when the receiver's processes wait for a CPU (CPUDelay at least
// MinDelay, or not measurable) and a receiver group can rise or a donor
// fall, receiver groups' weights are multiplied by Step (up to MaxWeight)
// and donors' divided by it (down to MinWeight). Otherwise, the receiver's
// application environment with the most of its calls grows by one server
// elsewhere. Routing towards the nodes where the class meets its goal is
// Steer's, applied to every call.
func Decide(classes []ClassState, groups []GroupState, lim Limits) Decision {
	d := Decision{Receiver: -1, Weights: make([]int, len(groups))}
	for i, g := range groups {
		d.Weights[i] = g.Weight
	}
	for i, c := range classes {
		if !c.Known || c.PI <= 1 {
			continue
		}
		if r := d.Receiver; r < 0 || c.Importance < classes[r].Importance ||
			(c.Importance == classes[r].Importance && c.PI > classes[r].PI) {
			d.Receiver = i
		}
	}
	if d.Receiver < 0 {
		d.Why = "every class meets its goal"
		return d
	}
	r := d.Receiver
	imp := classes[r].Importance
	var receivers, donors []int
	delayed := false
	for i, g := range groups {
		if r < len(g.Calls) && g.Calls[r] > 0 {
			receivers = append(receivers, i)
			delayed = delayed || g.CPUDelay < 0 || g.CPUDelay >= lim.MinDelay
			continue
		}
		served, lesser := false, true
		for c, n := range g.Calls {
			if n == 0 || c >= len(classes) {
				continue
			}
			served = true
			lesser = lesser && classes[c].Importance > imp
		}
		if served && lesser {
			donors = append(donors, i)
		}
	}
	if len(receivers) == 0 {
		d.Why = "the class that misses its goal has no calls on this node"
		return d
	}
	step := max(lim.Step, 2)
	if delayed {
		changed := false
		for _, i := range receivers {
			if w := min(d.Weights[i]*step, lim.MaxWeight); w > d.Weights[i] {
				d.Weights[i], changed = w, true
			}
		}
		for _, i := range donors {
			if w := max(d.Weights[i]/step, lim.MinWeight); w < d.Weights[i] {
				d.Weights[i], changed = w, true
			}
		}
		if changed {
			d.Why = fmt.Sprintf("CPU weight to %d group(s) of the class from %d group(s) of less important classes", len(receivers), len(donors))
			return d
		}
	}
	var best uint64
	for _, i := range receivers {
		if g := groups[i]; g.Env && g.Calls[r] > best {
			d.Grow, best = g.Name, g.Calls[r]
		}
	}
	switch {
	case d.Grow != "" && !delayed:
		d.Why = "its processes do not wait for a CPU here: one more server elsewhere"
	case d.Grow != "":
		d.Why = "CPU weights at their bounds: one more server elsewhere"
	case !delayed:
		d.Why = "its processes do not wait for a CPU here and it has no application environment to grow"
	default:
		d.Why = "CPU weights at their bounds and no application environment to grow"
	}
	return d
}

// NodeGoal is how a class does on one node that could take its calls.
type NodeGoal struct {
	PI    float64
	Known bool // the node measured calls of the class lately
}

// Steer says which nodes a class's calls may go to: when some node is
// known to meet the goal, the nodes known to miss it are left out (nodes
// with nothing measured stay: a new server has no figures yet). Otherwise
// every node stays. keep must be as long as nodes.
func Steer(nodes []NodeGoal, keep []bool) {
	meets := false
	for _, n := range nodes {
		meets = meets || (n.Known && n.PI <= 1)
	}
	for i, n := range nodes {
		keep[i] = !meets || !n.Known || n.PI <= 1
	}
}

// EnvState is the cluster's record of an application environment: how
// many servers it had at most since the last quiesce or policy change (the
// high-water mark), and whether it is quiesced. Every node keeps one and
// announces it; Merge makes them agree. Epoch orders quiesce and resume:
// the newer epoch wins whole.
type EnvState struct {
	Epoch    uint32 `json:"epoch,omitempty"`
	HWM      int    `json:"hwm,omitempty"`
	Quiesced bool   `json:"quiesced,omitempty"`
}

// Merge is the state that holds after a and b were both seen.
func (a EnvState) Merge(b EnvState) EnvState {
	switch {
	case epochAfter(b.Epoch, a.Epoch):
		return b
	case epochAfter(a.Epoch, b.Epoch):
		return a
	}
	return EnvState{Epoch: a.Epoch, HWM: max(a.HWM, b.HWM), Quiesced: a.Quiesced || b.Quiesced}
}

// epochAfter reports whether epoch a is newer than b, in serial number
// arithmetic (RFC 1982): a peer may announce any epoch, the last one
// too, and Quiesce and Resume after it wrap to 0, which must still win
// or the environment keeps that peer's state whatever the operator does.
// Epochs half the circle apart: the higher.
func epochAfter(a, b uint32) bool {
	d := int32(a - b)
	return d > 0 || d == math.MinInt32 && a > b
}

// Saw raises the high-water mark to servers, unless quiesced.
func (a EnvState) Saw(servers int) EnvState {
	if !a.Quiesced {
		a.HWM = max(a.HWM, servers)
	}
	return a
}

// Quiesce is the state after scdctl quiesce: no server, none to start.
func (a EnvState) Quiesce() EnvState { return EnvState{Epoch: a.Epoch + 1, Quiesced: true} }

// Resume is the state after scdctl resume: servers start on demand again,
// from none.
func (a EnvState) Resume() EnvState { return EnvState{Epoch: a.Epoch + 1} }

// Missing is how many servers must start to bring servers back to the
// high-water mark: a server that died is replaced, elsewhere if need be.
func (a EnvState) Missing(servers int) int {
	if a.Quiesced {
		return 0
	}
	return max(a.HWM-servers, 0)
}
