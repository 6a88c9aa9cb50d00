package bench

import (
	"strings"
	"testing"
	"time"
)

// A restart's figures: the calls counted by outcome, their p99 before,
// in the first second from and after the restart, and how long after the
// restart calls still failed.
func TestRestartFigures(t *testing.T) {
	setup := restartSetup{restartLoad: restartLoad{Before: time.Second, After: 3 * time.Second}, Window: 100 * time.Millisecond, Timeout: 2 * time.Second}
	var trace []callTrace
	for i := range 400 { // one call due every 10 ms
		due := time.Duration(i) * 10 * time.Millisecond
		c := callTrace{Due: due, Latency: time.Millisecond, Outcome: callOK}
		switch {
		case due >= 1050*time.Millisecond && due < 1150*time.Millisecond:
			c.Outcome, c.Latency = callFailed, 0 // the port was closed
		case due >= 1150*time.Millisecond && due < 1200*time.Millisecond:
			c.Latency = 30 * time.Millisecond // the new process warming up
		case due == 1500*time.Millisecond:
			c.Outcome = callRefused
		case due >= 3*time.Second:
			c.Latency = 2 * time.Millisecond
		}
		trace = append(trace, c)
	}
	f := restartFiguresOf(trace, setup)
	if f.Due != 400 || f.Failed != 10 || f.Refused != 1 || f.TimedOut != 0 || f.OK != 389 {
		t.Errorf("counts %+v", f)
	}
	if f.P99BeforeUs != 1000 || f.P99AroundUs != 30000 || f.P99AfterUs != 2000 {
		t.Errorf("p99 before / around / after %v / %v / %v, want 1 ms / 30 ms / 2 ms", f.P99BeforeUs, f.P99AroundUs, f.P99AfterUs)
	}
	// The last window with a refusal is [500, 600) ms from the restart.
	if f.DisruptedMs != 600 {
		t.Errorf("disrupted %v ms, want 600", f.DisruptedMs)
	}
	clean := restartFiguresOf(trace[:100], setup)
	if clean.DisruptedMs != 0 || clean.Failed != 0 {
		t.Errorf("no call failed: %+v", clean)
	}
	ws := restartWindows(trace, setup)
	if len(ws) != 40 || ws[10].FromStepMs != 0 || ws[10].Failed != 5 || ws[11].Failed != 5 || ws[11].OK != 5 {
		t.Errorf("windows: %d, the restart's %+v and the next %+v", len(ws), ws[10], ws[11])
	}
}

// S8's and S9's reports: their tables, a row a system and a run, and "-"
// for a latency of no call.
func TestSkewAndRestartMarkdown(t *testing.T) {
	head := report{Date: "2026-01-02", Machine: machineInfo{Cores: 2, CPU: "test CPU"}, Runs: 2}
	skew := head
	skew.Scenario, skew.Title = "S8", "skewed"
	skew.Skew = &skewSetup{Receivers: 2, Light: 20}
	hash := skewFigures{LightPerS: 800, LightP99us: 15000, LightOnHeavy: 10, P99WithHeavyUs: 17000, P99ApartUs: 12000,
		Placement: []float64{10, 10}, HeavyAt: []float64{1, 0}}
	steer := skewFigures{LightPerS: 820, LightP99us: 12000, P99ApartUs: 12000, Placement: []float64{0, 20}, HeavyAt: []float64{1, 0}}
	skew.SkewResults = []skewResult{
		{System: nameSkewHash, Mechanism: "hash", runSet: runSet[skewFigures]{Runs: []skewFigures{hash, hash}, Median: hash}},
		{System: nameSkewSteer, Mechanism: "bpf", runSet: runSet[skewFigures]{Runs: []skewFigures{steer, steer}, Median: steer}},
	}
	skew.Notes = []string{skewVerdict(skew.SkewResults, *skew.Skew)}
	md := skew.Markdown()
	for _, want := range []string{
		"| hash (steering off) | 10 of 20 | 800 |",
		"| steering (SK_REUSEPORT) | 0 of 20 | 820 |",
		"| - / 12.0 ms |",
		"light connections on a socket with a heavy one 0 against 10 of 20; light p99 12.0 ms against 15.0 ms (0.80x)",
		"| steering (SK_REUSEPORT) | 2 | 0 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("S8 markdown lacks %q\n%s", want, md)
		}
	}
	if v := skewVerdict(skew.SkewResults[:1], *skew.Skew); !strings.Contains(v, "not both measured") {
		t.Errorf("one system: %q", v)
	}

	rs := head
	rs.Scenario, rs.Title = "S9", "restart"
	rs.Restart = &restartSetup{Rate: 2000, Window: 100 * time.Millisecond}
	handOff := restartFigures{Due: 8000, OK: 8000, P99AroundUs: 15000, P99BeforeUs: 2000, BackMs: 50}
	stopStart := restartFigures{Due: 8000, OK: 7880, Failed: 120, P99AroundUs: 7000, P99BeforeUs: 2000, BackMs: 90, DisruptedMs: 100}
	rs.RestartResults = []restartResult{
		{System: nameRestartHandOff, runSet: runSet[restartFigures]{Runs: []restartFigures{handOff, handOff}, Median: handOff}},
		{System: nameRestartStopStart, runSet: runSet[restartFigures]{Runs: []restartFigures{stopStart, stopStart}, Median: stopStart}},
	}
	rs.Notes = []string{restartVerdict(rs.RestartResults)}
	md = rs.Markdown()
	for _, want := range []string{
		"| restart (hand-off) | 8000 | 8000 | 0 | 0 | 0 | 2.00 ms | 15.0 ms | 0 us | 50 ms | 0 ms |",
		"| stop and start | 8000 | 7880 | 0 | 120 | 0 |",
		"stop and start: 120 of 8000 calls not answered OK (0 refused, 120 failed, 0 timed out)",
		"| stop and start | 2 | 8000 | 7880 | 0 / 120 / 0 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("S9 markdown lacks %q\n%s", want, md)
		}
	}
}
