package sim

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"tpsched/scd/loadlevel"
	"tpsched/scd/route"
)

// near fails the test unless got is within rel (relative) of want.
func near(t *testing.T, what string, got, want, rel float64) {
	t.Helper()
	if math.Abs(got-want) > rel*want {
		t.Errorf("%s = %.4f, want %.4f ± %.1f%%", what, got, want, 100*rel)
	}
}

func random() Balancer { return Balancers[0] }

// One node at load 0.5 is M/M/1 with λ = 0.5, μ = 1: the response time is
// exponential with rate μ-λ, so its mean is 2 and its q-quantile
// -ln(1-q)/(μ-λ). The seed is fixed, so the tolerances only have to hold
// for this run; they are a few standard errors wide.
func TestMM1(t *testing.T) {
	r, err := Run(Config{Nodes: 1, Load: 0.5, Thresholds: DefaultThresholds, Balancer: random(),
		Requests: 400_000, Warmup: 10_000, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	const rate = 1 - 0.5
	t.Logf("mean %.4f p50 %.4f p99 %.4f p99.9 %.4f", r.Mean, r.P50, r.P99, r.P999)
	near(t, "mean", r.Mean, 1/rate, 0.02)
	near(t, "p50", r.P50, math.Ln2/rate, 0.03)
	near(t, "p99", r.P99, -math.Log(0.01)/rate, 0.04)
	near(t, "p99.9", r.P999, -math.Log(0.001)/rate, 0.08)
}

// With levels not announced, random routing splits the Poisson stream
// evenly: every node is an M/M/1 at the offered load.
func TestRandomIsMM1PerNode(t *testing.T) {
	r, err := Run(Config{Nodes: 16, Load: 0.7, Staleness: 10, Thresholds: DefaultThresholds, Balancer: random(),
		Requests: 400_000, Warmup: 20_000, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	const rate = 1 - 0.7
	t.Logf("mean %.4f p99 %.4f", r.Mean, r.P99)
	near(t, "mean", r.Mean, 1/rate, 0.03)
	near(t, "p99", r.P99, -math.Log(0.01)/rate, 0.05)
}

// With U1,U2,D0,D1 = 1,2,0,1 there is no hysteresis: a node is at LEVEL2
// exactly when 2 or more requests wait, that is 3 or more are there, which
// an M/M/1 node is a fraction ρ³ of the time.
func TestLevel2Share(t *testing.T) {
	r, err := Run(Config{Nodes: 1, Load: 0.5, Thresholds: loadlevel.Thresholds{U1: 1, U2: 2, D0: 0, D1: 1},
		Balancer: random(), Requests: 400_000, Warmup: 10_000, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("LEVEL2 share %.4f", r.Level2Share)
	near(t, "LEVEL2 share", r.Level2Share, 0.125, 0.05)
}

// The claim's shape at load 0.9: with fresh levels every level-aware
// balancer beats random; with levels 100 service times old, OpenTP1's
// LEVEL2 avoidance herds (worse than random) while P2C on in-flight alone
// does not care.
func TestStalenessHerds(t *testing.T) {
	run := func(b Balancer, staleness float64) Result {
		t.Helper()
		r, err := Run(Config{Nodes: 16, Load: 0.9, Staleness: staleness, Thresholds: DefaultThresholds, Balancer: b,
			Requests: 150_000, Warmup: 30_000, Seed: 4})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	rnd := run(Balancers[0], 0)
	for _, b := range Balancers[1:] {
		if r := run(b, 0); r.P99 >= rnd.P99 {
			t.Errorf("fresh levels: %s p99 %.1f, not below random's %.1f", b.Name, r.P99, rnd.P99)
		}
	}
	if r := run(Balancers[1], 100); r.P99 <= 2*rnd.P99 {
		t.Errorf("levels 100 old: opentp1 p99 %.1f, want above twice random's %.1f (herding)", r.P99, rnd.P99)
	}
	fresh, stale := run(Balancers[3], 0), run(Balancers[3], 100)
	if fresh.Config = stale.Config; fresh != stale {
		t.Errorf("p2c-inflight reads no level, yet staleness changed it: %+v vs %+v", fresh, stale)
	}
}

func TestDeterministic(t *testing.T) {
	c := Config{Nodes: 8, Load: 0.8, Staleness: 5, Thresholds: DefaultThresholds, Balancer: Balancers[2],
		Requests: 20_000, Warmup: 1_000, Seed: 9}
	a, err := Run(c)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Run(c)
	if a != b {
		t.Errorf("same config, different results:\n%+v\n%+v", a, b)
	}
	c.Seed++
	if d, _ := Run(c); d == a {
		t.Errorf("another seed gave the same result %+v", d)
	}
}

func TestValidate(t *testing.T) {
	ok := Config{Nodes: 16, Load: 0.9, Staleness: 10, Thresholds: DefaultThresholds, Balancer: random(), Requests: 1}
	cases := []struct {
		name   string
		change func(*Config)
		want   string // in the error; "" = valid
	}{
		{"valid", func(*Config) {}, ""},
		{"no nodes", func(c *Config) { c.Nodes = 0 }, "0 nodes"},
		{"4097 nodes", func(c *Config) { c.Nodes = MaxNodes + 1 }, "4097 nodes"},
		{"load 1", func(c *Config) { c.Load = 1 }, "load 1"},
		{"load 0", func(c *Config) { c.Load = 0 }, "load 0"},
		{"load NaN", func(c *Config) { c.Load = math.NaN() }, "load NaN"},
		{"negative staleness", func(c *Config) { c.Staleness = -1 }, "staleness -1"},
		{"infinite staleness", func(c *Config) { c.Staleness = math.Inf(1) }, "staleness +Inf"},
		{"no requests", func(c *Config) { c.Requests = 0 }, "0 requests"},
		{"negative warm-up", func(c *Config) { c.Warmup = -1 }, "-1 warm-up"},
		{"D0 >= U1", func(c *Config) { c.Thresholds = loadlevel.Thresholds{U1: 2, U2: 4, D0: 2, D1: 3} }, "thresholds"},
		{"D1 >= U2", func(c *Config) { c.Thresholds = loadlevel.Thresholds{U1: 2, U2: 4, D0: 1, D1: 4} }, "thresholds"},
		{"U1 > U2", func(c *Config) { c.Thresholds = loadlevel.Thresholds{U1: 5, U2: 4, D0: 1, D1: 3} }, "thresholds"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.change(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate() = %v, want an error with %q", err, tc.want)
			}
			if _, runErr := Run(c); (runErr != nil) != (err != nil) {
				t.Errorf("Run error %v, Validate error %v", runErr, err)
			}
		})
	}
}

// The stale view shows each change exactly Staleness later, and forgets
// what it has shown.
func TestStaleView(t *testing.T) {
	v := &staleView{staleness: 10, cands: make([]route.Candidate, 2)}
	for i := 1; i <= 3000; i++ {
		v.made(change{at: float64(i), node: int32(i % 2), level: loadlevel.Level(i % 3)})
	}
	cases := []struct {
		now   float64
		want0 loadlevel.Level // node 0's level seen
		want1 loadlevel.Level
	}{
		{5, loadlevel.Level0, loadlevel.Level0},      // before any change is seen
		{10.5, loadlevel.Level0, loadlevel.Level0},   // still the start
		{11, loadlevel.Level0, loadlevel.Level1},     // change 1 (node 1 to LEVEL1) counts from its instant + 10
		{12.9, loadlevel.Level2, loadlevel.Level1},   // change 2: node 0 to LEVEL2
		{3009.5, loadlevel.Level1, loadlevel.Level2}, // 2998: node 0 to 2998 % 3 = 1; 2999: node 1 to 2; 3000 not yet
		{5000, loadlevel.Level0, loadlevel.Level2},   // 3000: node 0 to LEVEL0
	}
	for _, tc := range cases {
		v.advance(tc.now)
		if got0, got1 := v.cands[0].Level, v.cands[1].Level; got0 != tc.want0 || got1 != tc.want1 {
			t.Errorf("at %v: levels seen %v and %v, want %v and %v", tc.now, got0, got1, tc.want0, tc.want1)
		}
	}
	if len(v.pending)-v.head != 0 || len(v.pending) > 1024 {
		t.Errorf("the view kept %d changes (%d unseen) after the clock passed them all", len(v.pending), len(v.pending)-v.head)
	}
	fresh := &staleView{cands: make([]route.Candidate, 1)}
	fresh.made(change{at: 1, level: loadlevel.Level2})
	if fresh.cands[0].Level != loadlevel.Level2 {
		t.Error("with no staleness a change is not seen at once")
	}
}

// A queue that grows and drains many times keeps its order.
func TestNodeQueueIsFIFO(t *testing.T) {
	var n node
	next, want := 0, 0
	for round := range 50 {
		for range 100 + round*37 {
			n.push(job{arrived: float64(next)})
			next++
		}
		for n.len() > round {
			if got := n.pop().arrived; got != float64(want) {
				t.Fatalf("popped %v, want %v", got, want)
			}
			want++
		}
	}
}

func TestGridAndSweep(t *testing.T) {
	g := Grid{
		Base:       Config{Nodes: 4, Thresholds: DefaultThresholds, Requests: 5_000, Warmup: 500, Seed: 5},
		Thresholds: []loadlevel.Thresholds{DefaultThresholds, {U1: 1, U2: 2, D0: 0, D1: 1}},
		Loads:      []float64{0.5, 0.8},
		Staleness:  []float64{0, 10},
		Balancers:  Balancers[:2],
	}
	cs := g.Configs()
	if len(cs) != 2*2*2*2 {
		t.Fatalf("%d configs, want 16", len(cs))
	}
	if c := cs[5]; c.Thresholds != DefaultThresholds || c.Load != 0.8 || c.Staleness != 0 || c.Balancer.Name != "opentp1" {
		t.Errorf("configs[5] = %+v, want default thresholds, load 0.8, staleness 0, opentp1", c)
	}
	results, err := Sweep(cs, 3)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range cs {
		want, _ := Run(c)
		if results[i] != want {
			t.Errorf("Sweep result %d differs from Run: %+v vs %+v", i, results[i], want)
		}
	}
	bad := append(cs[:1:1], Config{})
	if _, err := Sweep(bad, 2); err == nil {
		t.Error("Sweep with an invalid config: no error")
	}
}

func TestWriteMarkdown(t *testing.T) {
	r := Result{Config: Config{Nodes: 16, Load: 0.9, Staleness: 10, Thresholds: DefaultThresholds, Balancer: Balancers[2],
		Requests: 100, Warmup: 10, Seed: 1}, Mean: 6.07, P50: 5.14, P99: 20.34, P999: 27.1, MaxQueue: 33, Level2Share: 0.253}
	other := r
	other.Staleness = 0
	sens := r
	sens.Thresholds = loadlevel.Thresholds{U1: 1, U2: 2, D0: 0, D1: 1}
	var b bytes.Buffer
	rep := Report{Results: []Result{other, r}, HeadlineLoad: 0.9, HeadlineStaleness: 10, Sensitivity: []Result{sens}}
	if err := rep.WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"levelup_queue_count = 4,8 and leveldown_queue_count = 2,6",
		"## Load 0.90, levels 10 time units old\n\n| balancer | p50 | p99 | p99.9 | mean | max queue | L2 share |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n| p2c | 5.14 | 20.3 | 27.1 | 6.07 | 33 | 25.3% |\n\n",
		"| 0.90 | 0 | p2c | 5.14 | 20.3 | 27.1 | 6.07 | 33 | 25.3% |",
		"| 4,8,2,6 | p2c | 5.14 |",
		"| 1,2,0,1 | p2c | 5.14 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

// The oracle runs at the first staleness only; PerNode sizes each run by
// its nodes; the report sets every rule against the oracle and says what
// fresh levels cost.
func TestOracleGridAndReport(t *testing.T) {
	g := Grid{
		Base:      Config{Thresholds: DefaultThresholds, Seed: 3},
		Nodes:     []int{4, 8},
		Loads:     []float64{0.8},
		Staleness: []float64{0, 20},
		Balancers: []Balancer{Balancers[2], Balancers[5]},
		PerNode:   2000,
	}
	cs := g.Configs()
	if len(cs) != 2*(2+1) {
		t.Fatalf("%d configs, want 6 (the oracle once per node count)", len(cs))
	}
	for _, c := range cs {
		if c.Requests != 2000*c.Nodes || c.Warmup != 2000*c.Nodes {
			t.Errorf("%d nodes: %d requests after %d, want %d each", c.Nodes, c.Requests, c.Warmup, 2000*c.Nodes)
		}
		if c.Balancer.Fresh && c.Staleness != 0 {
			t.Errorf("the oracle at staleness %v", c.Staleness)
		}
	}
	results, err := Sweep(cs, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		if r.LevelChanges <= 0 {
			t.Errorf("%s at %d nodes: no level change counted", r.Balancer.Name, r.Nodes)
		}
	}
	// The oracle ignores staleness: the same run at any age.
	if !cs[1].Balancer.Fresh {
		t.Fatalf("configs[1] is %s, want the oracle", cs[1].Balancer.Name)
	}
	older := cs[1]
	older.Staleness = 50
	a, _ := Run(cs[1])
	b, _ := Run(older)
	if b.Config = a.Config; a != b {
		t.Errorf("the oracle's run changed with the staleness: %+v vs %+v", a, b)
	}
	var md bytes.Buffer
	if err := (Report{Results: results, HeadlineLoad: 0.8, HeadlineStaleness: 20}).WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	out := md.String()
	for _, want := range []string{"## Against the oracle", "| 8 | 0.80 | p2c |", "## What fresh levels cost", "| 4 | 0.80 | oracle |",
		"2000 per node (8000, 16000) requests measured", "| 8 | 0.80 | fresh | oracle |"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}
