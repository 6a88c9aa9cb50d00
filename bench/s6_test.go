package bench

import (
	"strings"
	"testing"
	"time"
)

type rrFake struct {
	id     int
	calls  *[]int
	closed bool
}

func (f *rrFake) Call([]byte, time.Time) (outcome, error) {
	*f.calls = append(*f.calls, f.id)
	return callOK, nil
}

func (f *rrFake) Close() error { f.closed = true; return nil }

// Calls go to the nodes in turn from the start given; Close closes every
// node's connection.
func TestRoundRobin(t *testing.T) {
	var got []int
	var fakes []*rrFake
	var cs []caller
	for i := range 3 {
		f := &rrFake{id: i, calls: &got}
		fakes = append(fakes, f)
		cs = append(cs, f)
	}
	c := roundRobin(cs, 4) // 4 mod 3: starts at node 1
	for range 5 {
		if o, err := c.Call(nil, time.Time{}); o != callOK || err != nil {
			t.Fatalf("call: %v %v", o, err)
		}
	}
	if want := []int{1, 2, 0, 1, 2}; !equalInts(got, want) {
		t.Errorf("calls went to %v, want %v", got, want)
	}
	c.Close()
	for _, f := range fakes {
		if !f.closed {
			t.Errorf("caller %d not closed", f.id)
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestParseMetrics reads a /metrics page as scdd writes it (VictoriaMetrics'
// text: labels in its order, le buckets, NaN, metadata or none) with
// Prometheus' parser, and refuses a page that is not exposition text.
func TestParseMetrics(t *testing.T) {
	text := `# HELP tpsched_requests_processed_total Calls the group's processes took from the queue.
# TYPE tpsched_requests_processed_total counter
tpsched_requests_processed_total{group="bench"} 1234
tpsched_requests_processed_total{group="other"} 99
tpsched_requests_refused_total{reason="busy",group="bench"} 7
tpsched_requests_refused_total{reason="stopped",group="bench"} 3
tpsched_forwarded_total{to="n1"} 5
tpsched_load_level{group="bench"} 2
tpsched_load_processing_ratio{group="bench"} NaN
tpsched_request_duration_seconds_bucket{group="bench",le="0.001"} 3
go_goroutines 12
tpsched_forwarded_total{to="n2"} 7
`
	m, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	got := benchMetrics(m, "bench")
	want := nodeMetrics{processed: 1234, refusedBusy: 7, forwarded: 12, level: 2}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if v, ok := m.value("tpsched_load_processing_ratio", "group", "bench"); !ok || v == v {
		t.Errorf("NaN series: %v %v, want NaN", v, ok)
	}
	if _, ok := m.value("tpsched_requests_processed_total", "group", "none"); ok {
		t.Error("a series with other labels matched")
	}
	if n := benchMetrics(metricFamilies{}, "bench"); n.level != -1 || n.processed != 0 {
		t.Errorf("empty page: %+v", n)
	}
	for _, bad := range []string{"not a metric line\n", "tpsched_load_level{group=\"bench\" 2\n", "x 1 2 3\n"} {
		if _, err := parseMetrics(strings.NewReader(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestLevelShares(t *testing.T) {
	at := func(ms int, levels ...int) levelSample {
		return levelSample{At: time.Duration(ms) * time.Millisecond, Levels: levels}
	}
	// Out of order on purpose. Window [100, 300) ms.
	samples := []levelSample{
		at(200, 2, 0),
		at(50, 0, 1), // in force at the window's start
		at(250, 0, -1),
		at(0, 1, 1),
		at(300, 2, 2), // at the end: does not count
	}
	got := levelShares(samples, 2, 100*time.Millisecond, 300*time.Millisecond)
	want := [][3]float64{
		{0.5 + 0.25, 0, 0.25}, // 0 for 100 ms, 2 for 50, 0 for 50
		{0.25, 0.5, 0},        // 1 for 100 ms, 0 for 50, unknown for 50
	}
	for k := range want {
		for l := range 3 {
			if !near(got[k][l], want[k][l]) {
				t.Errorf("node %d LEVEL%d: %v, want %v (all %v)", k, l, got[k][l], want[k][l], got)
			}
		}
	}
	// No sample before the window: the first holds from its start.
	got = levelShares([]levelSample{at(150, 1), at(200, 2)}, 1, 100*time.Millisecond, 300*time.Millisecond)
	if !near(got[0][1], 0.5) || !near(got[0][2], 0.5) {
		t.Errorf("first sample after the start: %v, want half LEVEL1, half LEVEL2", got)
	}
	if got := levelShares(nil, 3, 0, time.Second); len(got) != 3 || got[2] != [3]float64{} {
		t.Errorf("no samples: %v", got)
	}
}

func clusterRunFig(p99, refused float64, served []float64, slowL2 float64) clusterFigures {
	return clusterFigures{Figures: Figures{P99us: p99}, Refused: refused, Served: served,
		LevelTime: [][3]float64{{1, 0, 0}, {1, 0, 0}, {1 - slowL2, 0, slowL2}}, LevelChanges: []float64{0, 0, 2}}
}

func TestMedianOfClusterFigures(t *testing.T) {
	runs := []clusterFigures{
		clusterRunFig(300, 5, []float64{300, 310, 150}, 0.5),
		clusterRunFig(100, 0, []float64{340, 330, 140}, 0.25),
		clusterRunFig(200, 1, []float64{320, 290, 160}, 0.75),
	}
	m := medianOf(runs)
	if m.P99us != 200 || m.Refused != 1 {
		t.Errorf("p99 %v refused %v, want 200 and 1", m.P99us, m.Refused)
	}
	if want := []float64{320, 310, 150}; len(m.Served) != 3 || m.Served[0] != want[0] || m.Served[1] != want[1] || m.Served[2] != want[2] {
		t.Errorf("served %v, want each node's own median %v", m.Served, want)
	}
	if !near(m.LevelTime[2][2], 0.5) || !near(m.LevelTime[2][0], 0.5) || m.LevelChanges[2] != 2 {
		t.Errorf("slow node level time %v changes %v", m.LevelTime[2], m.LevelChanges)
	}
	if got := p99Run(runs); got != 2 {
		t.Errorf("median p99 run %d, want 2", got)
	}
	if medianOf[clusterFigures](nil).Served != nil {
		t.Error("no runs: want zero figures")
	}
}

func TestClusterVerdict(t *testing.T) {
	res := func(name string, p99s ...float64) clusterResult {
		r := clusterResult{System: name}
		for _, p := range p99s {
			r.Runs = append(r.Runs, clusterFigures{Figures: Figures{P99us: p}})
		}
		r.Median = medianOf(r.Runs)
		return r
	}
	random := res(nameClusterRandom, 1.6e6, 1.5e6, 1.7e6)
	for _, c := range []struct {
		name    string
		results []clusterResult
		want    []string
	}{
		{"P2C meets it, OpenTP1 does not", []clusterResult{random, res(nameClusterOpenTP1, 0.9e6, 0.8e6, 1.6e6), res(nameClusterP2C, 25e3, 30e3, 24e3)},
			[]string{"OpenTP1 rule p99 900.0 ms", "0.56x: NOT met", "P2C p99 25.0 ms", "0.02x: met", "**Target met.**", "random p99 1.60 s (runs 1.50 s-1.70 s)"}},
		{"met by the median, not by the worst run", []clusterResult{random, res(nameClusterOpenTP1, 0.7e6, 0.75e6, 1.6e6)},
			[]string{"0.47x: met (but its worst run is 1.07x random's best)", "**Target met.**"}},
		{"neither", []clusterResult{random, res(nameClusterOpenTP1, 1e6), res(nameClusterP2C, 0.9e6)},
			[]string{"**Target NOT met.**"}},
		{"no random", []clusterResult{res(nameClusterP2C, 1)}, []string{"not checked"}},
		{"no rule", []clusterResult{random}, []string{"no balancing rule measured"}},
	} {
		got := clusterVerdict(c.results, s6Target)
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q\nlacks %q", c.name, got, w)
			}
		}
	}
	// A rule that refuses what random served is called out: its p99
	// leaves those calls out.
	lossy := res(nameClusterP2C, 1e3)
	lossy.Median.Refused = 500
	if got := clusterVerdict([]clusterResult{random, lossy}, s6Target); !strings.Contains(got, "lost more calls than random: 500") {
		t.Errorf("lossy rule not called out: %q", got)
	}
}

func TestS6Definitions(t *testing.T) {
	if got := nominalCapacity(2, 3); got < 166.6 || got > 166.7 {
		t.Errorf("capacity of 2 ms x 3: %v", got)
	}
	var got []string
	for _, s := range s6Systems() {
		got = append(got, s.schedLines())
	}
	want := []string{
		"set scd_announce_server_status = N\n",
		"set scd_announce_server_status = Y\nset scd_balance_rule = opentp1\n",
		"set scd_announce_server_status = Y\nset scd_balance_rule = p2c\n",
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("scdsvcdef lines %q, want %q", got, want)
	}
}

func TestClusterMarkdown(t *testing.T) {
	setup := clusterSetup{IPs: s6IPs, Slow: 2, Slowdown: 3, SleepMs: 2, NodeCapacity: []float64{500, 500, 166.7}, Capacity: 1166.7,
		Factor: 0.7, Rate: 816.7, Carriers: 1024, Queue: 256, LevelUp: S6LevelUp, LevelDown: s6LevelDown, LoadCheck: 1, Poll: s6Poll}
	f := clusterRunFig(1.6e6, 400, []float64{280, 270, 158}, 1)
	f.Share = []float64{0.4, 0.38, 0.22}
	f.NodeRefused = []float64{0, 0, 400}
	r := &report{Scenario: "S6", Title: "t", Date: "2026-01-01", Runs: 2, Cluster: &setup,
		ClusterResults: []clusterResult{{System: nameClusterRandom, runSet: runSet[clusterFigures]{Runs: []clusterFigures{f, f}, Median: f}}},
		Setup:          s6Setup(setup, runOptions{Runs: 2, Warmup: time.Second, Duration: time.Second, Timeout: time.Second}, false, s6Systems(), "loadgen")}
	r.Notes = append(r.Notes, slowNotSlow(r.ClusterResults, setup))
	md := r.Markdown()
	for _, w := range []string{"# S6: t", "served/s n0 / n1 / n2 (slow)", "| random (announce N) |", "280 / 270 / 158", "40.0 / 38.0 / 22.0%",
		"0 / 0 / 400", "0/0/100%", "### Each run", "The slowdown took", "putenv TPSCHED_ECHO_SLOWDOWN 3",
		"queue_size / its rate = 256 / 158/s = 1.62 s (measured 1.60 s)"} {
		if !strings.Contains(md, w) {
			t.Errorf("markdown lacks %q:\n%s", w, md)
		}
	}
	f.Served[2] = 270
	if n := slowNotSlow([]clusterResult{{System: nameClusterRandom, runSet: runSet[clusterFigures]{Median: f}}}, setup); !strings.Contains(n, "not 3 times slower") {
		t.Errorf("a slow node serving 270/s is not called out: %q", n)
	}
}
