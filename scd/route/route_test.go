package route

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"tpsched/scd/loadlevel"
)

// nodes builds candidates from a spec that reads like the tables: one word
// per node, "L<level>[:<in-flight>][*]", "*" marking this node. Node ids
// are n0, n1, ...
func nodes(spec string) []Candidate {
	var cs []Candidate
	for i, w := range strings.Fields(spec) {
		c := Candidate{Node: "n" + strconv.Itoa(i)}
		if rest, ok := strings.CutSuffix(w, "*"); ok {
			c.Local, w = true, rest
		}
		lv, inFlight, _ := strings.Cut(strings.TrimPrefix(w, "L"), ":")
		l, err := strconv.Atoi(lv)
		if err != nil {
			panic(fmt.Sprintf("bad node spec %q", w))
		}
		c.Level = loadlevel.Level(l)
		if inFlight != "" {
			if c.InFlight, err = strconv.Atoi(inFlight); err != nil {
				panic(fmt.Sprintf("bad node spec %q", w))
			}
		}
		cs = append(cs, c)
	}
	return cs
}

// dist is the probability of choosing each index.
type dist map[int]float64

// uni is the uniform distribution over idx.
func uni(idx ...int) dist {
	d := dist{}
	for _, i := range idx {
		d[i] = 1 / float64(len(idx))
	}
	return d
}

// scriptRand answers IntN from a script, then 0, and records every n asked.
type scriptRand struct {
	script []int
	asked  []int
}

func (s *scriptRand) IntN(n int) int {
	s.asked = append(s.asked, n)
	if k := len(s.asked) - 1; k < len(s.script) {
		return s.script[k]
	}
	return 0
}

// exact is the exact distribution of choose's result: it walks every
// sequence of draws choose can make, each with its probability. It fails
// the test if IntN is asked for n < 1 (math/rand/v2 would panic).
func exact(t testing.TB, choose func(Rand) int) dist {
	t.Helper()
	d := dist{}
	var walk func(script []int, p float64)
	walk = func(script []int, p float64) {
		r := &scriptRand{script: script}
		got := choose(r)
		if len(r.asked) <= len(script) {
			d[got] += p
			return
		}
		n := r.asked[len(script)]
		if n < 1 {
			t.Fatalf("IntN(%d) called after draws %v", n, script)
		}
		for v := range n {
			walk(append(script[:len(script):len(script)], v), p/float64(n))
		}
	}
	walk(nil, 1)
	return d
}

// sameDist reports whether got and want agree to rounding error.
func sameDist(got, want dist) bool {
	for i, p := range got {
		if math.Abs(p-want[i]) > 1e-9 {
			return false
		}
	}
	for i, p := range want {
		if math.Abs(p-got[i]) > 1e-9 {
			return false
		}
	}
	return true
}

func (d dist) String() string {
	keys := make([]int, 0, len(d))
	for k := range d {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%d:%.4f ", k, d[k])
	}
	return strings.TrimSpace(b.String())
}

type chooseCase struct {
	name  string
	cands string
	p     Policy
	r     Request
	want  dist
}

func runChooseCases(t *testing.T, cases []chooseCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cands := nodes(tc.cands)
			got := exact(t, func(rnd Rand) int { return Choose(cands, tc.p, tc.r, rnd) })
			if !sameDist(got, tc.want) {
				t.Errorf("Choose(%q, %+v, %+v) = {%v}, want {%v}", tc.cands, tc.p, tc.r, got, tc.want)
			}
		})
	}
}

var (
	announceY = Policy{Rule: OpenTP1, Announce: true, ScheduleRate: 50}
	announceN = Policy{Rule: OpenTP1, Announce: false, ScheduleRate: 50}
	tnf       = func(p Policy) Policy { p.ThisNodeFirst = true; return p }
	rate      = func(p Policy, r int) Policy { p.ScheduleRate = r; return p }
	retry     = Request{Retry: true}
	direct    = Request{Direct: true}
	socket    = Request{Socket: true}
)

func TestChooseEdges(t *testing.T) {
	for _, p := range []Policy{announceY, announceN, tnf(announceY), {Rule: P2C, Announce: true}} {
		if got := Choose(nil, p, Request{}, &scriptRand{}); got != -1 {
			t.Errorf("Choose(nil, %+v) = %d, want -1", p, got)
		}
		r := &scriptRand{}
		if got := Choose(nodes("L2"), p, Request{}, r); got != 0 || len(r.asked) != 0 {
			t.Errorf("Choose(one L2 node, %+v) = %d after draws %v, want 0 without a draw", p, got, r.asked)
		}
	}
}

// Table 3-7, announce Y and this_node_first N: "the request is scheduled
// to the node of the least-loaded schedulable server". A request that is
// not scheduler-direct (a balanced call that must move on) goes to the
// lowest level present, uniform among the nodes at it; a scheduler-direct
// one keeps schedule_rate (LEVEL0 against LEVEL1, LEVEL2 avoided unless
// all are LEVEL2; TestChooseScheduleRate); a re-schedule goes to the lowest
// level present either way.
func TestChooseAnnounceYThisNodeFirstN(t *testing.T) {
	runChooseCases(t, []chooseCase{
		{"lowest level: LEVEL0 over LEVEL1 and LEVEL2", "L2 L0 L1 L2", announceY, Request{}, uni(1)},
		{"lowest level: uniform among the LEVEL0 nodes", "L0 L1 L1 L0", announceY, Request{}, uni(0, 3)},
		{"no LEVEL0: uniform among LEVEL1", "L1 L2 L1 L2", announceY, Request{}, uni(0, 2)},
		{"all LEVEL2: any", "L2 L2 L2", announceY, Request{}, uni(0, 1, 2)},
		{"this node not preferred", "L1* L0 L0", announceY, Request{}, uni(1, 2)},
		{"this node one of the lowest: uniform", "L0* L0 L1", announceY, Request{}, uni(0, 1)},
		{"this node LEVEL2 avoided too", "L2* L0 L2", announceY, Request{}, uni(1)},
		{"level above LEVEL2 counts as LEVEL2", "L7 L1", announceY, Request{}, uni(1)},
		{"direct: schedule_rate 50 weighs LEVEL0 and LEVEL1 alike", "L0 L1 L1 L0 L2", announceY, direct, uni(0, 1, 2, 3)},
		{"direct: LEVEL2 avoided", "L2 L0 L1 L2", announceY, direct, uni(1, 2)},
		{"retry: LEVEL1 avoided", "L1 L0 L2 L0", announceY, retry, uni(1, 3)},
		{"retry: only LEVEL1/2: LEVEL2 still avoided", "L1 L2 L1", announceY, retry, uni(0, 2)},
		{"retry: all LEVEL2: any", "L2 L2", announceY, retry, uni(0, 1)},
		{"direct retry: LEVEL0 only", "L1 L0 L2 L0", announceY, Request{Direct: true, Retry: true}, uni(1, 3)},
	})
}

// Table 3-7, announce Y and this_node_first Y: this node unless it is
// LEVEL2 (or, on a re-schedule, not eligible); else as announce Y /
// this_node_first N among the others.
func TestChooseAnnounceYThisNodeFirstY(t *testing.T) {
	p := tnf(announceY)
	runChooseCases(t, []chooseCase{
		{"this node LEVEL0", "L0 L0* L0", p, Request{}, uni(1)},
		{"this node LEVEL1 beats others at LEVEL0", "L0 L1* L0", p, Request{}, uni(1)},
		{"this node LEVEL2: others, LEVEL2 avoided", "L0 L2* L1 L2", p, Request{}, uni(0, 2)},
		{"this node LEVEL2, all LEVEL2: the others", "L2 L2* L2", p, Request{}, uni(0, 2)},
		{"this node not a candidate: LEVEL0 and LEVEL1 alike", "L0 L1 L2", p, Request{}, uni(0, 1)},
		{"this node LEVEL2: LEVEL0 and LEVEL1 alike", "L1 L2* L0", p, Request{}, uni(0, 2)},
		{"direct: this node LEVEL1", "L0 L1* L0", p, direct, uni(1)},
		{"retry: this node LEVEL0", "L0* L0", p, retry, uni(0)},
		{"retry: this node LEVEL1, another LEVEL0", "L1* L0 L2 L1", p, retry, uni(1)},
		{"retry: this node LEVEL1, others LEVEL1/2", "L1* L1 L2", p, retry, uni(0)},
		{"retry: this node LEVEL2", "L2* L1 L2", p, retry, uni(1)},
	})
}

// Table 3-7, announce N and this_node_first N: uniform among all, levels
// ignored.
func TestChooseAnnounceNThisNodeFirstN(t *testing.T) {
	runChooseCases(t, []chooseCase{
		{"levels ignored", "L2 L0 L1* L2", announceN, Request{}, uni(0, 1, 2, 3)},
		{"retry: levels ignored", "L2 L0 L1", announceN, retry, uni(0, 1, 2)},
		{"direct: no schedule_rate without levels", "L0 L1 L2", rate(announceN, 80), direct, uni(0, 1, 2)},
		{"direct retry: levels ignored", "L2 L0 L1", announceN, Request{Direct: true, Retry: true}, uni(0, 1, 2)},
	})
}

// Table 3-7, announce N and this_node_first Y: this node unless it is
// LEVEL2 (it knows its own level); else uniform among the others.
func TestChooseAnnounceNThisNodeFirstY(t *testing.T) {
	p := tnf(announceN)
	runChooseCases(t, []chooseCase{
		{"this node LEVEL1", "L2 L1* L0", p, Request{}, uni(1)},
		{"this node LEVEL2: others, levels ignored", "L2 L2* L0", p, Request{}, uni(0, 2)},
		{"this node not a candidate", "L2 L1 L0", p, Request{}, uni(0, 1, 2)},
		{"retry: this node LEVEL1, another LEVEL0", "L1* L0", p, retry, uni(0)},
		{"direct: this node LEVEL1", "L0 L1* L0", p, direct, uni(1)},
		{"direct: this node LEVEL2: others, levels ignored", "L1 L2* L0", p, direct, uni(0, 2)},
	})
}

// Socket-receiving groups: no status check.
func TestChooseSocket(t *testing.T) {
	runChooseCases(t, []chooseCase{
		{"announce Y: levels ignored", "L2 L2 L0", announceY, socket, uni(0, 1, 2)},
		{"announce Y, retry: levels ignored", "L1 L0", announceY, Request{Socket: true, Retry: true}, uni(0, 1)},
		{"this node first, whatever its level", "L0 L2*", tnf(announceY), socket, uni(1)},
		{"this node first, not a candidate", "L0 L2", tnf(announceN), socket, uni(0, 1)},
	})
}

// schedule_rate: LEVEL0 weighs rate, LEVEL1 100-rate, LEVEL2 avoided.
func TestChooseScheduleRate(t *testing.T) {
	w := func(ws ...float64) dist { // weights in index order
		d, sum := dist{}, 0.0
		for _, x := range ws {
			sum += x
		}
		for i, x := range ws {
			if x > 0 {
				d[i] = x / sum
			}
		}
		return d
	}
	runChooseCases(t, []chooseCase{
		{"80: 3 LEVEL0 2 LEVEL1 is 240:40", "L0 L0 L1 L0 L1 L2", rate(announceY, 80), direct, w(80, 80, 20, 80, 20, 0)},
		{"50: uniform over LEVEL0/1", "L0 L1 L2", rate(announceY, 50), direct, uni(0, 1)},
		{"100: LEVEL1 never while LEVEL0 exists", "L1 L0 L1", rate(announceY, 100), direct, uni(1)},
		{"100, only LEVEL1/2: uniform over LEVEL1", "L1 L2 L1", rate(announceY, 100), direct, uni(0, 2)},
		{"all LEVEL2: uniform", "L2 L2", rate(announceY, 80), direct, uni(0, 1)},
		{"0 is clamped to 50", "L0 L1", rate(announceY, 0), direct, uni(0, 1)},
		{"150 is clamped to 100", "L0 L1", rate(announceY, 150), direct, uni(0)},
		{"retry: LEVEL0 only", "L0 L1 L0", rate(announceY, 80), Request{Direct: true, Retry: true}, uni(0, 2)},
		{"this node first wins", "L1 L1* L0", rate(tnf(announceY), 80), direct, uni(1)},
		{"this node LEVEL2: weighted among others", "L0 L2* L1", rate(tnf(announceY), 80), direct, w(80, 0, 20)},
		{"not direct: rate ignored, lowest level", "L0 L1 L0", rate(announceY, 80), Request{}, uni(0, 2)},
	})
}

// The P2C rule: two distinct draws by weight, lower (level, in-flight) wins,
// ties to this node, else to the first drawn.
func TestChooseP2C(t *testing.T) {
	p2c := Policy{Rule: P2C, Announce: true, ScheduleRate: 50}
	p2cN := Policy{Rule: P2C, Announce: false, ScheduleRate: 50}
	runChooseCases(t, []chooseCase{
		{"level beats in-flight", "L0:5 L1:0", p2c, Request{}, uni(0)},
		{"announce N: in-flight only", "L0:5 L1:0", p2cN, Request{}, uni(1)},
		{"same level: in-flight", "L1:5 L1:2", p2c, Request{}, uni(1)},
		{"tie: first drawn", "L0:1 L0:1", p2c, Request{}, uni(0, 1)},
		{"tie: this node", "L0:1 L0:1*", p2c, Request{}, uni(1)},
		{"the worst of three never wins", "L0:0 L0:1 L0:2", p2cN, Request{}, dist{0: 2. / 3, 1: 1. / 3}},
		{"LEVEL2 with no in-flight loses", "L2:0 L0:3 L1:0", p2c, Request{}, dist{1: 2. / 3, 2: 1. / 3}},
		{"all LEVEL2: in-flight", "L2:4 L2:0 L2:9", p2c, Request{}, dist{1: 2. / 3, 0: 1. / 3}},
		{"socket: levels ignored", "L0:3 L2:0", p2c, socket, uni(1)},
		{"retry: same rule", "L1:0 L0:3", p2c, retry, uni(1)},
		// Weights 3,1,1 (this node x 3 candidates); ties go to this node,
		// which is in the pair with probability 3/5 + 2/5 x 3/4 = 9/10.
		{"this node first weighs x n", "L0:0* L0:0 L0:0", tnf(p2c), Request{}, dist{0: 0.9, 1: 0.05, 2: 0.05}},
		// Weights 80,20,20: node 0 is drawn with probability
		// 2/3 + 2 x 1/6 x 4/5 = 14/15 and then wins on level.
		{"direct: schedule_rate weights", "L0:5 L1:0 L1:0", rate(p2c, 80), direct, dist{0: 14. / 15, 1: 1. / 30, 2: 1. / 30}},
		// Weights 100,1,1 (LEVEL1 floored at 1): 100/102 + 2 x 1/102 x 100/101.
		{"direct 100: LEVEL1 still drawable", "L0:5 L1:0 L1:0", rate(p2c, 100), direct,
			dist{0: 100./102 + 2*(1./102)*(100./101), 1: (1. / 102) * (1. / 101), 2: (1. / 102) * (1. / 101)}},
		{"direct, announce N: weights 1", "L0:0 L0:1 L0:2", rate(p2cN, 80), direct, dist{0: 2. / 3, 1: 1. / 3}},
	})
}

// 128 nodes, OpenTP1's limit.
func TestChoose128(t *testing.T) {
	many := make([]Candidate, MaxNodes)
	for i := range many {
		many[i] = Candidate{Node: "n" + strconv.Itoa(i), Level: loadlevel.Level2, InFlight: i}
	}
	many[77].Level = loadlevel.Level1
	t.Run("opentp1: the one not at LEVEL2", func(t *testing.T) {
		got := exact(t, func(rnd Rand) int { return Choose(many, announceY, Request{}, rnd) })
		if !sameDist(got, uni(77)) {
			t.Errorf("got {%v}, want {77:1}", got)
		}
	})
	t.Run("opentp1 announce N: uniform over 128", func(t *testing.T) {
		all := make([]int, MaxNodes)
		for i := range all {
			all[i] = i
		}
		got := exact(t, func(rnd Rand) int { return Choose(many, announceN, Request{}, rnd) })
		if !sameDist(got, uni(all...)) {
			t.Errorf("got {%v}, want uniform", got)
		}
	})
	t.Run("p2c announce N: node i wins the 127-i pairs above it", func(t *testing.T) {
		got := exact(t, func(rnd Rand) int { return Choose(many, Policy{Rule: P2C}, Request{}, rnd) })
		want := dist{}
		for i := range MaxNodes - 1 {
			want[i] = float64(MaxNodes-1-i) / float64(MaxNodes*(MaxNodes-1)/2)
		}
		if !sameDist(got, want) {
			t.Errorf("got {%v}, want {%v}", got, want)
		}
	})
}

// within checks that count successes out of n draws are within 5 binomial
// standard deviations of probability p: a real bias of that size is caught,
// and with a fixed seed the test never flakes.
func within(t *testing.T, what string, count, n int, p float64) {
	t.Helper()
	mean := float64(n) * p
	sigma := math.Sqrt(float64(n) * p * (1 - p))
	if d := math.Abs(float64(count) - mean); d > 5*sigma {
		t.Errorf("%s: %d of %d, want %.0f ± %.0f (5σ)", what, count, n, mean, 5*sigma)
	}
}

// schedule_rate 80 with three LEVEL0 and two LEVEL1 nodes: 240:40, drawn
// with the real math/rand/v2.
func TestScheduleRateStatistics(t *testing.T) {
	const draws = 200_000
	cands := nodes("L0 L1 L0 L2 L1 L0")
	rnd := rand.New(rand.NewPCG(1, 2))
	p := rate(announceY, 80)
	counts := make([]int, len(cands))
	for range draws {
		counts[Choose(cands, p, direct, rnd)]++
	}
	within(t, "LEVEL0 set", counts[0]+counts[2]+counts[5], draws, 240./280)
	for i, c := range cands {
		want := map[loadlevel.Level]float64{loadlevel.Level0: 80. / 280, loadlevel.Level1: 20. / 280}[c.Level]
		if want == 0 {
			if counts[i] != 0 {
				t.Errorf("LEVEL2 node %d chosen %d times", i, counts[i])
			}
			continue
		}
		within(t, "node "+c.Node, counts[i], draws, want)
	}
}

// The draws of both rules are fair with the real math/rand/v2.
func TestChooseStatistics(t *testing.T) {
	const draws = 200_000
	rnd := rand.New(rand.NewPCG(3, 4))
	t.Run("opentp1 announce N: uniform over 16", func(t *testing.T) {
		cands := nodes(strings.Repeat("L2 L0 L1 L0 ", 4))
		counts := make([]int, len(cands))
		for range draws {
			counts[Choose(cands, announceN, Request{}, rnd)]++
		}
		for i := range cands {
			within(t, cands[i].Node, counts[i], draws, 1./16)
		}
	})
	t.Run("p2c: the lower of a uniform pair", func(t *testing.T) {
		cands := nodes("L0:0 L0:1 L0:2 L0:3") // i wins the 3-i pairs above it, of 6
		counts := make([]int, len(cands))
		for range draws {
			counts[Choose(cands, Policy{Rule: P2C, Announce: true}, Request{}, rnd)]++
		}
		for i := range cands {
			within(t, cands[i].Node, counts[i], draws, float64(3-i)/6)
		}
	})
}

func TestTransfer(t *testing.T) {
	cases := []struct {
		name   string
		held   bool
		local  loadlevel.Level
		others string
		p      Policy
		want   bool
	}{
		{"held: leave", true, loadlevel.Level0, "L0", announceY, true},
		{"held, announce N: leave", true, loadlevel.Level0, "L0", announceN, true},
		{"held, no other node: leave (caller answers service closed)", true, loadlevel.Level0, "", announceY, true},
		{"LEVEL2, another LEVEL1: leave", false, loadlevel.Level2, "L2 L1", announceY, true},
		{"LEVEL2, another LEVEL0: leave", false, loadlevel.Level2, "L0", announceY, true},
		{"LEVEL2, all others LEVEL2: stay", false, loadlevel.Level2, "L2 L2", announceY, false},
		{"LEVEL2, no other node: stay", false, loadlevel.Level2, "", announceY, false},
		{"level above LEVEL2 is LEVEL2", false, loadlevel.Level(9), "L1", announceY, true},
		{"LEVEL1, another LEVEL0: stay", false, loadlevel.Level1, "L0 L0", announceY, false},
		{"LEVEL0: stay", false, loadlevel.Level0, "L0", announceY, false},
		{"announce N, LEVEL2, another lower: stay", false, loadlevel.Level2, "L0", announceN, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Transfer(tc.held, tc.local, nodes(tc.others), tc.p); got != tc.want {
				t.Errorf("Transfer(%v, %v, %q, announce=%v) = %v, want %v", tc.held, tc.local, tc.others, tc.p.Announce, got, tc.want)
			}
		})
	}
}

func TestRetries(t *testing.T) {
	cases := []struct {
		setting, nodes, want int
	}{
		{0, 3, 0},  // 0: return the error
		{1, 3, 1},  // within the others
		{2, 3, 2},  // exactly the others
		{5, 3, 2},  // capped at the 2 other nodes
		{1, 1, 0},  // no other node
		{3, 0, 0},  // no node at all
		{-1, 3, 0}, // nonsense setting: no retry
		{128, 128, 127},
	}
	for _, tc := range cases {
		if got := Retries(tc.setting, tc.nodes); got != tc.want {
			t.Errorf("Retries(%d, %d) = %d, want %d", tc.setting, tc.nodes, got, tc.want)
		}
	}
}

func TestRuleNames(t *testing.T) {
	cases := []struct {
		s       string
		want    Rule
		wantErr bool
	}{
		{"opentp1", OpenTP1, false},
		{"p2c", P2C, false},
		{"P2C", 0, true},
		{"least", 0, true},
		{"", 0, true},
	}
	for _, tc := range cases {
		got, err := ParseRule(tc.s)
		if (err != nil) != tc.wantErr || (!tc.wantErr && got != tc.want) {
			t.Errorf("ParseRule(%q) = %v, %v; want %v, error %v", tc.s, got, err, tc.want, tc.wantErr)
		}
		if !tc.wantErr && got.String() != tc.s {
			t.Errorf("%v.String() = %q, want %q", got, got.String(), tc.s)
		}
	}
	if got := Rule(9).String(); got != "Rule(9)" {
		t.Errorf("Rule(9).String() = %q", got)
	}
}

// benchCases are the policies Choose is measured and checked for
// allocations with.
var benchCases = []struct {
	name string
	p    Policy
	r    Request
}{
	{"opentp1-announceN", announceN, Request{}},
	{"opentp1-announceY", announceY, Request{}},
	{"opentp1-tnf-local2", tnf(announceY), Request{}},
	{"opentp1-direct80", rate(announceY, 80), direct},
	{"opentp1-retry", announceY, retry},
	{"p2c", Policy{Rule: P2C, Announce: true}, Request{}},
	{"p2c-direct-tnf", Policy{Rule: P2C, Announce: true, ThisNodeFirst: true, ScheduleRate: 80}, direct},
}

// benchNodes is n candidates with mixed levels and in-flight counts, this
// node (index 0) at LEVEL2 so that this_node_first falls through.
func benchNodes(n int) []Candidate {
	cs := make([]Candidate, n)
	for i := range cs {
		cs[i] = Candidate{Node: "n" + strconv.Itoa(i), Level: loadlevel.Level(i % 3), InFlight: (i * 7) % 5}
	}
	cs[0].Local, cs[0].Level = true, loadlevel.Level2
	return cs
}

func TestChooseDoesNotAllocate(t *testing.T) {
	rnd := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{2, 16, MaxNodes} {
		cands := benchNodes(n)
		for _, bc := range benchCases {
			if a := testing.AllocsPerRun(100, func() { Choose(cands, bc.p, bc.r, rnd) }); a != 0 {
				t.Errorf("%s with %d nodes: %.1f allocations per call, want 0", bc.name, n, a)
			}
		}
	}
}

func BenchmarkChoose(b *testing.B) {
	for _, n := range []int{16, MaxNodes} {
		cands := benchNodes(n)
		for _, bc := range benchCases {
			b.Run(fmt.Sprintf("%s/%d", bc.name, n), func(b *testing.B) {
				rnd := rand.New(rand.NewPCG(7, 8))
				b.ReportAllocs()
				for b.Loop() {
					Choose(cands, bc.p, bc.r, rnd)
				}
			})
		}
	}
}
