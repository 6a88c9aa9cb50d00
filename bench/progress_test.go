package bench

import (
	"strings"
	"testing"
	"time"
)

// fakeClock is a clock the test moves.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time       { return c.t }
func (c *fakeClock) pass(d time.Duration) { c.t = c.t.Add(d) }
func newFakeClock() *fakeClock            { return &fakeClock{t: time.Unix(1_000_000, 0)} }

// The estimate is the plan still to come, scaled by how the steps done so
// far compared with theirs.
func TestProgressEstimate(t *testing.T) {
	clk := newFakeClock()
	var log strings.Builder
	p := newProgress(&log, clk.now, []scenarioPlan{plan("S1", 4, 10*time.Second), plan("S2", 2, 30*time.Second)})

	p.announce()
	if want := "session: S1 4 steps, S2 2 steps; planned about 1m40s"; !strings.HasPrefix(log.String(), want) {
		t.Errorf("announce: %q, want it to start %q", log.String(), want)
	}
	log.Reset()
	if scen, session := p.left(); scen != 0 || session != 100*time.Second {
		t.Fatalf("before anything: left %v / %v, want 0 / 1m40s (the plan as it stands)", scen, session)
	}
	p.begin(plan("S1", 4, 10*time.Second))
	if _, session := p.left(); session != 100*time.Second {
		t.Fatalf("begun: session left %v, want 1m40s", session)
	}
	// Each step takes twice its plan: what is left doubles too.
	clk.pass(20 * time.Second)
	p.step(10 * time.Second)
	p.report("cell 1/4 (echo 128 B x 1) done")
	if scen, session := p.left(); scen != 60*time.Second || session != 180*time.Second {
		t.Errorf("after one slow step: left %v / %v, want 1m0s / 3m0s", scen, session)
	}
	want := "  [S1 1/4] cell 1/4 (echo 128 B x 1) done; 20s so far, about 1m0s left in S1, 3m0s in the session\n"
	if log.String() != want {
		t.Errorf("report:\n%q\nwant\n%q", log.String(), want)
	}
	// A system that did not start takes its runs out of the plan.
	p.drop(2, 10*time.Second)
	if scen, session := p.left(); scen != 20*time.Second || session != 140*time.Second {
		t.Errorf("after dropping two steps: left %v / %v, want 20s / 2m20s", scen, session)
	}
	clk.pass(20 * time.Second)
	p.step(10 * time.Second)
	// The next scenario begins with fewer steps than planned (one of its
	// systems is not selected): its own plan replaces the session's.
	p.begin(plan("S2", 1, 30*time.Second))
	if scen, session := p.left(); scen != 60*time.Second || session != 60*time.Second {
		t.Errorf("S2 begun: left %v / %v, want 1m0s / 1m0s", scen, session)
	}
	clk.pass(30 * time.Second)
	p.step(30 * time.Second)
	if scen, session := p.left(); scen != 0 || session != 0 {
		t.Errorf("all done: left %v / %v, want 0 / 0", scen, session)
	}
	var nilProgress *progress // scenarios run without a session (tests) have none
	nilProgress.begin(plan("S1", 1, time.Second))
	nilProgress.step(time.Second)
	nilProgress.drop(1, time.Second)
	nilProgress.report("nothing")
}

func TestRoughly(t *testing.T) {
	for _, c := range []struct{ in, want time.Duration }{
		{1499 * time.Millisecond, time.Second},
		{9*time.Minute + 59400*time.Millisecond, 9*time.Minute + 59*time.Second},
		{12*time.Minute + 34*time.Second, 12*time.Minute + 30*time.Second},
	} {
		if got := roughly(c.in); got != c.want {
			t.Errorf("roughly(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// The session's plan counts the steps each scenario will make: cells x
// selected systems x runs for the grids, runs per system for the others.
func TestSessionPlan(t *testing.T) {
	opts := runOptions{Runs: 3, Warmup: 250 * time.Millisecond, Duration: 750 * time.Millisecond}
	cfg := Config{Quick: true, Runs: 3, Scenarios: []string{"S1", "S3", "S4", "S6", "S9"}, Systems: []string{nameTpsched, namePHPStatic, nameClusterP2C}}
	got := map[string]scenarioPlan{}
	var order []string
	for _, p := range sessionPlan(cfg, opts) {
		got[p.id] = p
		order = append(order, p.id)
	}
	if strings.Join(order, ",") != "S1,S3,S4,S6,S9" {
		t.Fatalf("order %v, want S1,S3,S4,S6,S9", order)
	}
	step := opts.stepTime()
	// S1 quick: 2 payloads x 2 connection counts, 2 of its systems selected.
	if p := got["S1"]; p.steps != 4*2*3 || p.planned != 24*step {
		t.Errorf("S1: %+v, want 24 steps of %v", p, step)
	}
	// S3 quick: one run each, and only its tpsched system is not selected
	// here (the PHP pools there have other names).
	if p := got["S3"]; p.steps != 0 {
		t.Errorf("S3: %+v, want no step (none of its systems selected)", p)
	}
	// S4: two of its three systems, their capacity measured first (no S2).
	if p := got["S4"]; p.steps != 2*3*2 || p.planned != 6*s4Options(opts).stepTime()+6*step {
		t.Errorf("S4: %+v", p)
	}
	if p := got["S6"]; p.steps != 3 || p.planned != 3*s6RunTime(s6Timing(cfg, opts)) {
		t.Errorf("S6: %+v, want the P2C system's 3 runs", p)
	}
	if p := got["S9"]; p.steps != 0 {
		t.Errorf("S9: %+v, want no step (none of its systems selected)", p)
	}
}
