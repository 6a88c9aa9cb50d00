package bench

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func runsOf(thr ...float64) []Figures {
	var out []Figures
	for _, t := range thr {
		out = append(out, Figures{Throughput: t})
	}
	return out
}

func measured(system string, thr ...float64) measurement {
	runs := runsOf(thr...)
	return measurement{System: system, Runs: runs, Median: medianOf(runs)}
}

// TestNoiseFlagsTheUnsteadySystem: in a cell where three systems' runs
// spread 4-8%, the one whose runs spread 50% (grpc-go at 44k, 22k, 40k, as
// the committed full run had it) is unsteady; one at 12% is not.
func TestNoiseFlagsTheUnsteadySystem(t *testing.T) {
	c := gridCell{Service: "echo", Payload: 128, Conns: 64, Results: []measurement{
		measured("gnet-echo", 140e3, 135e3, 145e3),
		measured("tpsched", 62e3, 64e3, 60e3),
		measured("grpc-go", 44e3, 22e3, 40e3),
		measured("nginx+php-fpm static", 17e3, 17.5e3, 17.2e3),
		measured("x", 100, 112, 106),
	}}
	n := noiseOf(c)
	if n.Noise < 0.05 || n.Noise > 0.08 {
		t.Errorf("noise %.3f, want the median spread, about 0.07", n.Noise)
	}
	if len(n.Unsteady) != 1 || n.Unsteady[0] != "grpc-go" {
		t.Errorf("unsteady %v, want [grpc-go]", n.Unsteady)
	}
	// A system with one run has no spread and is never flagged.
	c.Results = append(c.Results, measured("one run", 5))
	if _, ok := noiseOf(c).Spread["one run"]; ok {
		t.Error("a single run has a spread")
	}
}

// TestCompareGridsFlagsTheSystemThatMoved: the whole machine 20% slower in
// the full grid moves no one; grpc-go at half its quick figure is flagged.
func TestCompareGridsFlagsTheSystemThatMoved(t *testing.T) {
	cell := func(g, tp, grpc float64) gridCell {
		return gridCell{Service: "echo", Payload: 128, Conns: 64, Results: []measurement{
			measured("gnet-echo", g, 1.03*g, 0.98*g),
			measured("tpsched", tp, 1.02*tp, 0.97*tp),
			measured("grpc-go", grpc, 1.04*grpc, 0.99*grpc),
		}}
	}
	quick := &report{Scenario: "S1", Cells: []gridCell{cell(140e3, 62e3, 44e3), {Service: "echo", Payload: 4096, Conns: 1}}}
	full := &report{Scenario: "S1", Cells: []gridCell{cell(112e3, 50e3, 35e3)}}
	for _, m := range compareGrids(full, quick) {
		if m.Flagged {
			t.Errorf("%s flagged after a common shift of %.2f: %+v", m.System, m.Shift, m)
		}
	}
	full.Cells = []gridCell{cell(140e3, 62e3, 22e3)}
	moves := compareGrids(full, quick)
	if len(moves) != 3 {
		t.Fatalf("%d moves, want 3 (one shared cell)", len(moves))
	}
	for _, m := range moves {
		if m.Flagged != (m.System == "grpc-go") {
			t.Errorf("%s flagged %v (ratio %.2f, shift %.2f, tolerance %.2f)", m.System, m.Flagged, m.Ratio, m.Shift, m.Tolerance)
		}
	}
}

func TestCheckValidityComparesOnlyOnTheSameMachine(t *testing.T) {
	dir := t.TempDir()
	mk := func(cpu string, grpc float64) *report {
		return &report{Scenario: "S1", Date: "2026-12-01", Machine: machineInfo{Cores: 2, CPU: cpu}, Cells: []gridCell{{
			Service: "echo", Payload: 128, Conns: 64, Results: []measurement{
				measured("gnet-echo", 140e3, 141e3, 139e3), measured("grpc-go", grpc, grpc, grpc), measured("tpsched", 60e3, 61e3, 59e3),
			}}}}
	}
	ref := mk("AMD EPYC", 44e3)
	if _, err := ref.Write(dir); err != nil {
		t.Fatal(err)
	}
	path := newestReport(dir, "S1")
	if filepath.Base(path) != "2026-12-01-S1.json" {
		t.Fatalf("newest report %q", path)
	}
	r := mk("AMD EPYC", 20e3)
	r.Cells[0].Results[1].Runs[1].Disturbed = true
	r.Cells[0].Results[1].Retried = 2
	checkValidity(r, DefaultQuiet, false, path)
	v := r.Validity
	if v.Compared != path || len(v.Moves) != 3 || v.Retried != 2 || len(v.Disturbed) != 1 {
		t.Fatalf("validity %+v", v)
	}
	md := v.markdown()
	for _, want := range []string{"**moved**", "grpc-go in echo 128 B x 64 (0.45x", "Kept although disturbed"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	spent := Quiet{Cores: 0.1, Budget: time.Second}.withBudget()
	spent.spend(time.Second)
	checkValidity(r, spent, false, "")
	if !r.Validity.BudgetSpent || !strings.Contains(r.Validity.markdown(), "went ahead on a busy machine") {
		t.Errorf("a spent budget not reported: %+v", r.Validity)
	}
	other := mk("Intel Xeon", 20e3)
	checkValidity(other, DefaultQuiet, false, path)
	if other.Validity.Compared != "" || !strings.Contains(other.Validity.NotCompared, "another machine") {
		t.Errorf("compared across machines: %+v", other.Validity)
	}
	// A scenario redefined since (S10's systems were): its systems' names
	// no longer mean what they measured, so nothing is compared.
	redefined := mk("AMD EPYC", 20e3)
	redefined.Title = "local calls"
	checkValidity(redefined, DefaultQuiet, false, path)
	if redefined.Validity.Compared != "" || !strings.Contains(redefined.Validity.NotCompared, "another setup") {
		t.Errorf("compared across setups: %+v", redefined.Validity)
	}
}
