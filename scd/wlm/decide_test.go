package wlm

import (
	"math"
	"reflect"
	"testing"
)

func TestSpare(t *testing.T) {
	type imp = [LeastImportant + 1]Demand
	cases := []struct {
		name string
		load NodeLoad
		want [LeastImportant + 1]float64
	}{
		{"idle node", NodeLoad{CPUs: 2}, [6]float64{0, 2, 2, 2, 2, 2}},
		// A CPU hog (not tpsched's) takes one of two CPUs from every importance.
		{"hog", NodeLoad{CPUs: 2, Busy: 1}, [6]float64{0, 1, 1, 1, 1, 1}},
		// Batch at importance 3 uses one CPU: importance 1 and 2 may have it.
		{"batch", NodeLoad{CPUs: 2, Busy: 1, UAP: imp{3: {OnCPU: 1}}}, [6]float64{0, 2, 2, 1, 1, 1}},
		// Online work at importance 1 ran 0.5 and waited 0.25: less for everyone below.
		{"online waits", NodeLoad{CPUs: 2, Busy: 0.5, UAP: imp{1: {OnCPU: 0.5, Wait: 0.25}}}, [6]float64{0, 1.25, 1.25, 1.25, 1.25, 1.25}},
		// Batch that wants more than the node has leaves nothing to importance 3-5.
		{"saturated by batch", NodeLoad{CPUs: 2, Busy: 2, UAP: imp{3: {OnCPU: 2, Wait: 3}}}, [6]float64{0, 2, 2, 0, 0, 0}},
		// The meter saw more UAP CPU than /proc/stat busy: other work is not negative.
		{"measurements disagree", NodeLoad{CPUs: 1, Busy: 0.2, UAP: imp{2: {OnCPU: 0.4}}}, [6]float64{0, 1, 0.6, 0.6, 0.6, 0.6}},
		{"no CPUs", NodeLoad{}, [6]float64{}},
	}
	for _, tc := range cases {
		got := Spare(tc.load)
		for i := range got {
			if math.Abs(got[i]-tc.want[i]) > 1e-9 {
				t.Errorf("%s: Spare = %v, want %v", tc.name, got, tc.want)
				break
			}
		}
	}
}

func TestQuantize(t *testing.T) {
	cases := map[float64]uint32{0: 0, -1: 0, math.NaN(): 0, 0.049: 0, 0.05: 50, 0.0999: 50, 1.234: 1200, 2: 2000, 1.95: 1950}
	for in, want := range cases {
		if got := Quantize(in); got != want {
			t.Errorf("Quantize(%v) = %d, want %d", in, got, want)
		}
	}
}

func TestPlace(t *testing.T) {
	cases := []struct {
		name     string
		hosts    []Host
		minSpare float64
		want     int
	}{
		{"none", nil, 0, -1},
		{"most spare", []Host{{Node: "a", Spare: 0.5}, {Node: "b", Spare: 1.5}, {Node: "c", Spare: 1}}, 0, 1},
		{"a node that serves it already is never chosen (one server per node)", []Host{{Node: "a", Spare: 2, Serving: true}, {Node: "b", Spare: 0.1}}, 0, 1},
		{"all serve it", []Host{{Node: "a", Serving: true}, {Node: "b", Serving: true}}, 0, -1},
		{"tie: fewer environments", []Host{{Node: "a", Spare: 1, Servers: 2}, {Node: "b", Spare: 1, Servers: 1}}, 0, 1},
		{"tie: lowest node id", []Host{{Node: "c", Spare: 1}, {Node: "b", Spare: 1}, {Node: "d", Spare: 1}}, 0, 1},
		{"every node busy: the first server still starts", []Host{{Node: "b", Spare: 0}, {Node: "a", Spare: 0}}, 0, 1},
		{"growth needs spare CPU", []Host{{Node: "a", Spare: 0.05}, {Node: "b", Spare: 0}}, 0.1, -1},
		{"growth where there is some", []Host{{Node: "a", Spare: 0.05}, {Node: "b", Spare: 0.2}}, 0.1, 1},
	}
	for _, tc := range cases {
		if got := Place(tc.hosts, tc.minSpare); got != tc.want {
			t.Errorf("%s: Place = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestDecide(t *testing.T) {
	// Classes: 0 importance 1, 1 importance 3, 2 importance 1 too.
	classes := func(pi0, pi1, pi2 float64) []ClassState {
		return []ClassState{
			{Importance: 1, PI: pi0, Known: pi0 > 0},
			{Importance: 3, PI: pi1, Known: pi1 > 0},
			{Importance: 1, PI: pi2, Known: pi2 > 0},
		}
	}
	online := GroupState{Name: "online", Env: true, Calls: []uint64{10, 0, 0}, Weight: 100, CPUDelay: 0.3}
	batch := GroupState{Name: "batch", Calls: []uint64{0, 50, 0}, Weight: 100, CPUDelay: 0.6}
	mixed := GroupState{Name: "mixed", Calls: []uint64{0, 5, 5}, Weight: 100, CPUDelay: 0.1}
	idle := GroupState{Name: "idle", Weight: 100}
	with := func(g GroupState, f func(*GroupState)) GroupState { f(&g); return g }

	cases := []struct {
		name     string
		classes  []ClassState
		groups   []GroupState
		receiver int
		weights  []int
		grow     string
	}{
		{"every goal met", classes(0.8, 0.5, 0), []GroupState{online, batch}, -1, []int{100, 100}, ""},
		{"no figures", classes(0, 0, 0), []GroupState{online, batch}, -1, []int{100, 100}, ""},
		{"only batch misses: batch is helped, online is no donor (more important)",
			classes(0.5, 2, 0), []GroupState{online, batch}, 1, []int{100, 200}, ""},
		{"online misses, CPU delayed: weight from batch",
			classes(1.3, 0.5, 0), []GroupState{online, batch, idle}, 0, []int{200, 50, 100}, ""},
		{"the more important class wins over a higher PI",
			classes(1.1, 3, 0), []GroupState{online, batch}, 0, []int{200, 50}, ""},
		{"among equals the higher PI",
			classes(1.1, 0, 1.5), []GroupState{online, mixed}, 2, []int{100, 200}, ""},
		{"a group with a more important class is no donor",
			classes(1.5, 0.5, 0.5), []GroupState{online, mixed}, 0, []int{200, 100}, ""},
		{"weights at the bounds: grow the environment",
			classes(1.3, 0.5, 0), []GroupState{with(online, func(g *GroupState) { g.Weight = 10000 }), with(batch, func(g *GroupState) { g.Weight = 1 })},
			0, []int{10000, 1}, "online"},
		{"receiver at the top, donor can still fall",
			classes(1.3, 0.5, 0), []GroupState{with(online, func(g *GroupState) { g.Weight = 10000 }), with(batch, func(g *GroupState) { g.Weight = 3 })},
			0, []int{10000, 1}, ""},
		{"no CPU delay: weight cannot help, grow",
			classes(1.3, 0.5, 0), []GroupState{with(online, func(g *GroupState) { g.CPUDelay = 0.01 }), batch}, 0, []int{100, 100}, "online"},
		{"delay unknown: try weight first",
			classes(1.3, 0.5, 0), []GroupState{with(online, func(g *GroupState) { g.CPUDelay = -1 }), batch}, 0, []int{200, 50}, ""},
		{"no CPU delay and not an environment: nothing to do",
			classes(1.3, 0.5, 0), []GroupState{with(online, func(g *GroupState) { g.CPUDelay = 0; g.Env = false }), batch}, 0, []int{100, 100}, ""},
		{"receiver has no group here",
			classes(1.3, 0.5, 0), []GroupState{batch}, 0, []int{100}, ""},
		{"two environments: the one with more of the class's calls grows",
			classes(1.3, 0.5, 0), []GroupState{
				with(online, func(g *GroupState) { g.CPUDelay = 0 }),
				with(online, func(g *GroupState) { g.Name = "online2"; g.Calls = []uint64{30, 0, 0}; g.CPUDelay = 0 })},
			0, []int{100, 100}, "online2"},
	}
	for _, tc := range cases {
		d := Decide(tc.classes, tc.groups, DefaultLimits)
		if d.Receiver != tc.receiver || !reflect.DeepEqual(d.Weights, tc.weights) || d.Grow != tc.grow {
			t.Errorf("%s: Decide = receiver %d weights %v grow %q (%s); want %d %v %q",
				tc.name, d.Receiver, d.Weights, d.Grow, d.Why, tc.receiver, tc.weights, tc.grow)
		}
		if d.Why == "" {
			t.Errorf("%s: no reason given", tc.name)
		}
	}
}

func TestSteer(t *testing.T) {
	n := func(pi float64) NodeGoal { return NodeGoal{PI: pi, Known: pi > 0} }
	cases := []struct {
		name  string
		nodes []NodeGoal
		want  []bool
	}{
		{"all meet", []NodeGoal{n(0.5), n(1)}, []bool{true, true}},
		{"all miss: nowhere better, keep all", []NodeGoal{n(1.5), n(2)}, []bool{true, true}},
		{"one meets: the others are left out", []NodeGoal{n(1.5), n(0.8), n(3)}, []bool{false, true, false}},
		{"a new server without figures stays", []NodeGoal{n(1.5), n(0.8), n(0)}, []bool{false, true, true}},
		{"no figures anywhere", []NodeGoal{n(0), n(0)}, []bool{true, true}},
		{"none", nil, []bool{}},
	}
	for _, tc := range cases {
		keep := make([]bool, len(tc.nodes))
		Steer(tc.nodes, keep)
		if !reflect.DeepEqual(keep, tc.want) {
			t.Errorf("%s: Steer = %v, want %v", tc.name, keep, tc.want)
		}
	}
}

func TestEnvState(t *testing.T) {
	s := EnvState{}.Saw(1).Saw(3).Saw(2)
	if s.HWM != 3 {
		t.Fatalf("high-water mark %d after 1, 3, 2 servers, want 3", s.HWM)
	}
	if got := s.Missing(1); got != 2 {
		t.Errorf("Missing(1) = %d with HWM 3, want 2 (servers that died are replaced)", got)
	}
	if got := s.Missing(4); got != 0 {
		t.Errorf("Missing(4) = %d", got)
	}
	q := s.Quiesce()
	if !q.Quiesced || q.HWM != 0 || q.Epoch != 1 || q.Missing(0) != 0 || q.Saw(2).HWM != 0 {
		t.Errorf("quiesced %+v: no server, none to start, none counted", q)
	}
	r := q.Resume()
	if r.Quiesced || r.HWM != 0 || r.Epoch != 2 || r.Saw(1).HWM != 1 {
		t.Errorf("resumed %+v", r)
	}
	cases := []struct {
		name string
		a, b EnvState
		want EnvState
	}{
		{"same epoch: the higher mark", EnvState{1, 2, false}, EnvState{1, 3, false}, EnvState{1, 3, false}},
		{"same epoch: quiesced sticks", EnvState{1, 0, true}, EnvState{1, 0, false}, EnvState{1, 0, true}},
		{"newer epoch wins whole (a quiesce over a stale mark)", EnvState{1, 5, false}, EnvState{2, 0, true}, EnvState{2, 0, true}},
		{"older epoch loses (a stale mark after a quiesce)", EnvState{2, 0, true}, EnvState{1, 5, false}, EnvState{2, 0, true}},
		// A peer announced the last epoch (it may send any number): the
		// resume after it, epoch 0 again, is still the newer one, or the
		// environment would stay quiesced whatever the operator did.
		{"a resume after the last epoch wins", EnvState{math.MaxUint32, 0, true}, EnvState{math.MaxUint32, 0, true}.Resume(), EnvState{0, 0, false}},
		{"epochs half the circle apart: the higher", EnvState{1, 0, false}, EnvState{1 + 1<<31, 0, true}, EnvState{1 + 1<<31, 0, true}},
	}
	for _, tc := range cases {
		if got := tc.a.Merge(tc.b); got != tc.want {
			t.Errorf("%s: %+v.Merge(%+v) = %+v, want %+v", tc.name, tc.a, tc.b, got, tc.want)
		}
		if got := tc.b.Merge(tc.a); got != tc.want {
			t.Errorf("%s (swapped): = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
