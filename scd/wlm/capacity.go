package wlm

import (
	"math"
	"strings"
)

// Demand is CPU wanted by some processes over an interval, in CPUs (CPU
// seconds per second): the time they ran and the time they waited,
// runnable, for a CPU.
type Demand struct {
	OnCPU float64
	Wait  float64
}

// NodeLoad is what a node measured over an interval.
type NodeLoad struct {
	CPUs float64 // CPUs the node may run on (its affinity mask)
	Busy float64 // CPUs busy on them, with everything that ran there
	// UAP is what tpsched's UAP processes of the node used, by the
	// importance of the work they did (index 1..5; 0 unused).
	UAP [LeastImportant + 1]Demand
}

// Spare is the CPU available to work of each importance (index 1..5; 0
// unused), in CPUs: what the node's CPUs have beyond what other programs
// use and what work of that importance or more important asks (ran and
// waited for). Work less important than i gives way to work of importance
// i (its cgroup weight goes down), so its CPU counts as available to i;
// other programs' does not, since tpsched does not manage them.
func Spare(l NodeLoad) [LeastImportant + 1]float64 {
	var out [LeastImportant + 1]float64
	var managed float64
	for _, d := range l.UAP[MostImportant:] {
		managed += max(d.OnCPU, 0)
	}
	other := max(l.Busy-managed, 0)
	used := other
	for i := MostImportant; i <= LeastImportant; i++ {
		d := l.UAP[i]
		used += max(d.OnCPU, 0) + max(d.Wait, 0)
		out[i] = min(max(l.CPUs-used, 0), max(l.CPUs, 0))
	}
	return out
}

// Quantum is the step in which spare CPU is announced: finer than this is
// noise, and every change announced is gossip.
const Quantum = 0.05

// Quantize rounds spare CPU down to a multiple of Quantum, in thousandths
// of a CPU.
func Quantize(cpus float64) uint32 {
	if cpus <= 0 || math.IsNaN(cpus) {
		return 0
	}
	q := math.Floor(cpus/Quantum+1e-9) * Quantum
	return uint32(math.Min(q*1000, math.MaxUint32))
}

// Host is a node that could run a server of an application environment.
type Host struct {
	Node    string
	Spare   float64 // CPUs available to work of the environment's importance
	Serving bool    // it serves the environment already
	Servers int     // application environments it serves, for ties
}

// Place returns the index of the host that gets the next server of an
// environment: among those that do not serve it yet (at most one server
// per node and environment) and have at least minSpare, the one with the
// most spare CPU at the environment's importance; ties go to the host with
// fewer environments, then to the lowest node id (so every node that
// decides from the same figures decides alike). -1 when none qualifies.
func Place(hosts []Host, minSpare float64) int {
	best := -1
	for i, h := range hosts {
		if h.Serving || h.Spare < minSpare {
			continue
		}
		if best < 0 || better(h, hosts[best]) {
			best = i
		}
	}
	return best
}

func better(a, b Host) bool {
	if a.Spare != b.Spare {
		return a.Spare > b.Spare
	}
	if a.Servers != b.Servers {
		return a.Servers < b.Servers
	}
	return strings.Compare(a.Node, b.Node) < 0
}
