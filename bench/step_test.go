package bench

import (
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestProfileIntended(t *testing.T) {
	start := time.Unix(1000, 0)
	phases := []phase{{1000, time.Second}, {100, time.Second}, {10, 500 * time.Millisecond}}
	for _, tc := range []struct {
		i    int64
		want time.Duration
		ok   bool
	}{
		{0, 0, true},
		{999, 999 * time.Millisecond, true},
		{1000, time.Second, true},
		{1001, time.Second + 10*time.Millisecond, true},
		{1099, 1990 * time.Millisecond, true},
		{1100, 2 * time.Second, true},
		{1104, 2400 * time.Millisecond, true},
		{1105, 0, false},
	} {
		got, ok := profileIntended(start, phases, tc.i)
		if ok != tc.ok || (ok && got.Sub(start) != tc.want) {
			t.Errorf("call %d: +%v %v, want +%v %v", tc.i, got.Sub(start), ok, tc.want, tc.ok)
		}
	}
	if d := profileDuration(phases); d != 2500*time.Millisecond {
		t.Errorf("ProfileDuration = %v", d)
	}
}

func TestOpenLoopProfileTraces(t *testing.T) {
	var n atomic.Int64
	r, err := openLoop(t.Context(), load{
		Dial:    func() caller { return fakeCaller{service: 100 * time.Microsecond, refuse: 10, n: &n} },
		Conns:   4,
		Profile: []phase{{200, 100 * time.Millisecond}, {1000, 100 * time.Millisecond}},
		Trace:   true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.Offered != 120 || len(r.Trace) != 120 {
		t.Fatalf("offered %d, traced %d, want 120", r.Offered, len(r.Trace))
	}
	refused := 0
	for _, c := range r.Trace {
		if c.Due < 0 || c.Due >= 200*time.Millisecond || c.Late < 0 || (c.Outcome == callOK && c.Latency < c.Late) {
			t.Fatalf("bad trace entry %+v", c)
		}
		if c.Outcome == callRefused {
			refused++
		}
	}
	if refused != r.Refused || refused == 0 {
		t.Errorf("refused %d in the trace, %d in the result", refused, r.Refused)
	}
	if r.Begin.IsZero() {
		t.Error("no Begin")
	}
}

const ms100 = 100 * time.Millisecond

func call(due, lat time.Duration, o outcome) callTrace {
	return callTrace{Due: due, Latency: lat, Outcome: o}
}

func TestWindows(t *testing.T) {
	calls := []callTrace{
		call(10*time.Millisecond, time.Millisecond, callOK),
		call(20*time.Millisecond, 3*time.Millisecond, callOK),
		call(150*time.Millisecond, 0, callTimedOut),
		call(160*time.Millisecond, time.Millisecond, callOK),
		call(170*time.Millisecond, 0, callRefused),
		call(250*time.Millisecond, 0, callFailed),
		call(-time.Millisecond, time.Millisecond, callOK), // outside: ignored
		call(400*time.Millisecond, time.Millisecond, callOK),
	}
	samples := []workerSample{{40 * time.Millisecond, 1}, {90 * time.Millisecond, 2}, {140 * time.Millisecond, 1}}
	ws := stepWindows(calls, samples, 200*time.Millisecond, 300*time.Millisecond, ms100, 2*time.Second)
	if len(ws) != 3 {
		t.Fatalf("%d windows, want 3", len(ws))
	}
	want := []stepWindow{
		{FromStepMs: -200, Calls: 2, OK: 2, P99us: 3000, Workers: 2},
		{FromStepMs: -100, Calls: 3, OK: 1, Refused: 1, TimedOut: 1, P99us: 2e6, Workers: 1},
		{FromStepMs: 0, Calls: 1, Failed: 1, P99us: 0, Workers: 1}, // no sample: the last count
	}
	for i := range want {
		if ws[i] != want[i] {
			t.Errorf("window %d = %+v, want %+v", i, ws[i], want[i])
		}
	}
	if ws := stepWindows(nil, nil, 0, 250*time.Millisecond, ms100, time.Second); len(ws) != 3 || ws[0].Workers != -1 {
		t.Errorf("empty run: %+v", ws)
	}
}

func TestRecoveryTime(t *testing.T) {
	w := func(p99 float64) stepWindow { return stepWindow{OK: 10, Calls: 10, P99us: p99} }
	refused := stepWindow{OK: 9, Refused: 1, Calls: 10, P99us: 100}
	empty := stepWindow{}
	for _, tc := range []struct {
		name string
		ws   []stepWindow
		want time.Duration
		ok   bool
	}{
		{"never hurt", []stepWindow{w(100), w(100), w(100)}, 0, true},
		{"hurt then recovered", []stepWindow{w(900), w(800), w(100), w(100)}, 200 * time.Millisecond, true},
		{"a late spike resets it", []stepWindow{w(900), w(100), w(900), w(100), w(100)}, 300 * time.Millisecond, true},
		{"still over at the end", []stepWindow{w(100), w(100), w(900)}, 0, false},
		{"at the limit is over", []stepWindow{w(500), w(100)}, 100 * time.Millisecond, true},
		{"a refusal is not recovered", []stepWindow{w(100), refused, w(100)}, 200 * time.Millisecond, true},
		{"an empty window is not recovered", []stepWindow{w(100), empty, w(100)}, 200 * time.Millisecond, true},
	} {
		got, ok := recoveryTime(tc.ws, 0, len(tc.ws), 500, ms100)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: %v %v, want %v %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
	// Only the step's windows count: a bad window before from or after to does not.
	ws := []stepWindow{w(900), w(100), w(100), w(900)}
	if got, ok := recoveryTime(ws, 1, 3, 500, ms100); got != 0 || !ok {
		t.Errorf("sub-range: %v %v", got, ok)
	}
	if _, ok := recoveryTime(ws, 2, 2, 500, ms100); ok {
		t.Error("empty range recovered")
	}
}

func TestWorkerTimes(t *testing.T) {
	s := []workerSample{
		{0, 1}, {50 * time.Millisecond, 2}, {100 * time.Millisecond, 1}, // before the step at 150 ms
		{160 * time.Millisecond, 1}, {210 * time.Millisecond, 3}, {260 * time.Millisecond, 4}, {310 * time.Millisecond, 4},
		{410 * time.Millisecond, 3}, // the drop is at 400 ms
		{460 * time.Millisecond, 2}, {510 * time.Millisecond, 1},
	}
	f := workerTimes(s, 150*time.Millisecond, 400*time.Millisecond)
	want := workerFigures{Baseline: 1, FirstExtra: 60 * time.Millisecond, HasExtra: true, Peak: 4, ToPeak: 110 * time.Millisecond,
		Back: 110 * time.Millisecond, IsBack: true}
	if f != want {
		t.Errorf("got %+v\nwant %+v", f, want)
	}
	// Already at the most before the step: no extra worker, never back below.
	f = workerTimes([]workerSample{{0, 4}, {200 * time.Millisecond, 4}, {500 * time.Millisecond, 4}}, 150*time.Millisecond, 400*time.Millisecond)
	if f.HasExtra || f.Peak != 4 || !f.IsBack || f.Back != 100*time.Millisecond {
		t.Errorf("at max: %+v", f)
	}
	f = workerTimes([]workerSample{{0, 1}, {200 * time.Millisecond, 2}, {500 * time.Millisecond, 2}}, 150*time.Millisecond, 400*time.Millisecond)
	if f.IsBack {
		t.Errorf("came back without a count at the baseline: %+v", f)
	}
}

func TestStepFiguresOf(t *testing.T) {
	sl := stepLoad{Base: 100, Peak: 1000, Before: time.Second, During: time.Second, After: 500 * time.Millisecond,
		Settle: 200 * time.Millisecond, Window: ms100, Timeout: time.Second, Limit: 2}
	var calls []callTrace
	add := func(from, to time.Duration, every time.Duration, lat func(time.Duration) time.Duration) {
		for d := from; d < to; d += every {
			calls = append(calls, callTrace{Due: d, Latency: lat(d), Late: 100 * time.Microsecond, Outcome: callOK})
		}
	}
	add(0, sl.Settle, 10*time.Millisecond, func(time.Duration) time.Duration { return 50 * time.Millisecond }) // left out
	add(sl.Settle, sl.Step(), 10*time.Millisecond, func(time.Duration) time.Duration { return time.Millisecond })
	// The step: 30 ms latency for 300 ms, then 1 ms.
	add(sl.Step(), sl.Drop(), time.Millisecond, func(d time.Duration) time.Duration {
		if d < sl.Step()+300*time.Millisecond {
			return 30 * time.Millisecond
		}
		return time.Millisecond
	})
	add(sl.Drop(), sl.End(), 10*time.Millisecond, func(time.Duration) time.Duration { return time.Millisecond })
	calls = append(calls, callTrace{Due: sl.Drop() + time.Millisecond, Outcome: callRefused})
	samples := []workerSample{{500 * time.Millisecond, 1}, {sl.Step() + 40*time.Millisecond, 1}, {sl.Step() + 90*time.Millisecond, 2},
		{sl.Step() + 140*time.Millisecond, 3}, {sl.Drop() + 50*time.Millisecond, 3}, {sl.Drop() + 300*time.Millisecond, 1}}
	f, ws := stepFiguresOf(sl, calls, samples)
	if len(ws) != 25 {
		t.Fatalf("%d windows", len(ws))
	}
	check := func(name string, got, want float64) {
		t.Helper()
		if got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	check("pre p99", f.PreP99us, 1000)
	check("late p99", f.PreLateP99us, 100)
	check("limit", f.LimitUs, 2000)
	check("step p99", f.StepP99us, 30000)
	check("post p99", f.PostP99us, 1000)
	check("recovery", f.RecoveryMs, 300)
	check("windows over", f.OverLimit, 3)
	check("first extra", f.FirstExtraMs, 90)
	check("baseline", f.BaselineWorkers, 1)
	check("peak", f.PeakWorkers, 3)
	check("to peak", f.ToPeakMs, 140)
	check("back", f.BackMs, 300)
	check("refused", f.Refused, 1)
	check("offered", f.Offered, float64(len(calls)))
}

func TestMedianStepFiguresNever(t *testing.T) {
	runs := []stepFigures{{RecoveryMs: 200, FirstExtraMs: -1}, {RecoveryMs: -1, FirstExtraMs: -1}, {RecoveryMs: 100, FirstExtraMs: 5}}
	m := medianOf(runs)
	if m.RecoveryMs != 200 || m.FirstExtraMs != -1 {
		t.Errorf("median recovery %v, first extra %v; want 200, -1", m.RecoveryMs, m.FirstExtraMs)
	}
	if got := recoveryRun(runs); got != 0 {
		t.Errorf("MedianRun = %d, want 0 (200 ms)", got)
	}
	if got := recoveryRun([]stepFigures{{RecoveryMs: -1}, {RecoveryMs: 50}}); got != 1 {
		t.Errorf("MedianRun of two = %d, want 1", got)
	}
}

func TestCountWorkers(t *testing.T) {
	var st struct {
		Groups []statusGroup `json:"groups"`
	}
	js := `{"groups":[{"group":"other","processes":[{"pid":5,"kind":"resident"}]},
		{"group":"bench","processes":[{"pid":10,"kind":"resident","state":"running"},{"pid":11,"kind":"nonresident"},
		{"pid":0,"kind":"resident","state":"restarting"}]}]}`
	if err := json.Unmarshal([]byte(js), &st); err != nil {
		t.Fatal(err)
	}
	if n := countWorkers(st.Groups, "bench"); n != 2 {
		t.Errorf("CountWorkers = %d, want 2", n)
	}
}

func TestParseChildren(t *testing.T) {
	got := parseChildren([]byte("12 345 6789 \n"))
	if len(got) != 3 || got[0] != 12 || got[2] != 6789 {
		t.Errorf("ParseChildren = %v", got)
	}
	if got := parseChildren(nil); len(got) != 0 {
		t.Errorf("empty: %v", got)
	}
}

func TestStepMarkdown(t *testing.T) {
	sl := s3QuickLoad
	r := &report{Scenario: "S3", Title: "step", Date: "2026-01-01", Runs: 3, Step: &sl,
		StepResults: []stepResult{{System: nameTpschedNonRes, runSet: runSet[stepFigures]{Drawn: 1,
			Runs:   []stepFigures{{RecoveryMs: 100}, {RecoveryMs: -1}, {RecoveryMs: 300}},
			Median: stepFigures{RecoveryMs: 300, FirstExtraMs: -1, PeakWorkers: 4, PreP99us: 1500}}}}}
	md := r.Markdown()
	for _, want := range []string{"| tpsched non-resident | 300 ms |", "never", "### Each run", "| 2 (plotted) | never |", "1.50 ms"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}
