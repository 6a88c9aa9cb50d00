package bench

import (
	"bufio"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func sample(atMs int, procs, waitPct int, cpu, wait float64, holds, starts uint64) statusSample {
	return statusSample{At: time.Duration(atMs) * time.Millisecond, Procs: procs, WaitPct: waitPct,
		CPUSeconds: cpu, WaitSeconds: wait, GuardHolds: holds, Starts: starts}
}

func TestSummarizeSamples(t *testing.T) {
	// Out of order on purpose: they are sorted by time.
	samples := []statusSample{
		sample(200, 2, 40, 0.4, 0.9, 9, 15),
		sample(-50, 1, -1, 0, 0, 0, 0),
		sample(50, 4, 20, 0.1, 0.1, 0, 3),
		sample(100, 16, 90, 0.2, 0.5, 5, 15), // in force at the window's start
		sample(250, 3, -1, 0.5, 1.0, 9, 16),  // wait not known: left out of the percent
		sample(400, 17, 100, 1, 2, 20, 20),   // after the window
	}
	f := summarizeSamples(samples, 100*time.Millisecond, 300*time.Millisecond)
	// 16 for 100 ms, 2 for 50 ms, 3 for 50 ms, over 200 ms.
	want := ProcFigures{
		MeanProcs: (16*100 + 2*50 + 3*50) / 200.0, MaxProcs: 16, PeakProcs: 17,
		MeanWaitPct: 65, MaxWaitPct: 90,
		Waiting: 0.5 / 0.15, CPUCores: 0.3 / 0.15, WaitShare: 0.5 / 0.8,
		GuardHolds: 4, Starts: 1, RunGuardHolds: 20, RunStarts: 20,
	}
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"mean processes", f.MeanProcs, want.MeanProcs},
		{"max processes", f.MaxProcs, want.MaxProcs},
		{"peak processes", f.PeakProcs, want.PeakProcs},
		{"mean wait %", f.MeanWaitPct, want.MeanWaitPct},
		{"max wait %", f.MaxWaitPct, want.MaxWaitPct},
		{"waiting", f.Waiting, want.Waiting},
		{"group CPU", f.CPUCores, want.CPUCores},
		{"wait share", f.WaitShare, want.WaitShare},
		{"guard holds", f.GuardHolds, want.GuardHolds},
		{"starts", f.Starts, want.Starts},
		{"run guard holds", f.RunGuardHolds, want.RunGuardHolds},
		{"run starts", f.RunStarts, want.RunStarts},
	} {
		if !near(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}

	// The sample in force at the start counts toward max even if read
	// before it; a window with no sample before it starts at the first.
	f = summarizeSamples([]statusSample{sample(0, 5, 10, 0, 0, 0, 0), sample(150, 1, 20, 1, 1, 0, 0)},
		100*time.Millisecond, 200*time.Millisecond)
	if !near(f.MeanProcs, 3) || f.MaxProcs != 5 || f.MeanWaitPct != 20 {
		t.Errorf("in force at the start: %+v", f)
	}
	f = summarizeSamples([]statusSample{sample(150, 4, 10, 0, 0, 0, 0), sample(190, 2, 10, 0, 0, 0, 0)},
		100*time.Millisecond, 200*time.Millisecond)
	if !near(f.MeanProcs, (4*40+2*10)/50.0) || f.MaxProcs != 4 {
		t.Errorf("no sample before the window: %+v", f)
	}
}

func TestSummarizeSamplesMachine(t *testing.T) {
	a := sample(0, 2, 10, 0, 0, 0, 0)
	a.MachineBusy, a.MachineSteal = 100, 5
	b := sample(500, 2, 10, 0, 0, 0, 0)
	b.MachineBusy, b.MachineSteal = 100.9, 5.05
	f := summarizeSamples([]statusSample{a, b}, 0, time.Second)
	if !near(f.MachineCores, 1.8) || !near(f.StealCores, 0.1) {
		t.Errorf("machine %v cores, steal %v, want 1.8, 0.1", f.MachineCores, f.StealCores)
	}
}

func TestParseProcStatCPU(t *testing.T) {
	stat := []byte("cpu  1000 50 300 9000 20 10 40 7 0 0\ncpu0 500 25 150 4500 10 5 20 3 0 0\nintr 1\n")
	busy, steal, err := parseProcStatCPU(stat)
	if err != nil {
		t.Fatal(err)
	}
	if !near(busy, (1000+50+300+10+40)/100.0) || !near(steal, 0.07) {
		t.Errorf("busy %v steal %v", busy, steal)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5 6 7 8", "cpu 1 2 3", "cpu 1 2 3 x 5 6 7 8"} {
		if _, _, err := parseProcStatCPU([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestSummarizeSamplesEmpty(t *testing.T) {
	for _, tc := range []struct {
		name     string
		s        []statusSample
		from, to time.Duration
	}{
		{"no samples", nil, 0, time.Second},
		{"empty window", []statusSample{sample(0, 3, 10, 0, 0, 0, 0)}, time.Second, time.Second},
		{"all after the window", []statusSample{sample(2000, 3, 10, 0, 0, 0, 0)}, 0, time.Second},
	} {
		f := summarizeSamples(tc.s, tc.from, tc.to)
		if f.MeanProcs != 0 || f.MaxProcs != 0 || f.MeanWaitPct != -1 || f.MaxWaitPct != -1 || f.Waiting != 0 {
			t.Errorf("%s: %+v", tc.name, f)
		}
	}
	// Wait never known: -1, not 0.
	f := summarizeSamples([]statusSample{sample(0, 2, -1, 0, 0, 0, 0), sample(500, 2, -1, 0, 0, 0, 0)}, 0, time.Second)
	if f.MeanWaitPct != -1 || f.MaxWaitPct != -1 || !near(f.MeanProcs, 2) {
		t.Errorf("unknown wait: %+v", f)
	}
}

const statusJSON = `{
  "node": "n1", "rpc": "127.0.0.1:1",
  "cpu_measurement": {"name": "tp_btf", "histogram": true},
  "scaling": {"nonresident_starts": 15, "nonresident_stops": 2, "memory_gate_closed": false, "memory_gate_holds": 0, "cpu_guard_holds": 42},
  "groups": [
    {"group": "other", "queue_depth": 9, "processes": [{"slot": 0, "pid": 7, "state": "running", "kind": "resident"}],
     "cpu": {"cpu_seconds": 9, "runqueue_wait_seconds": 9, "runqueue_wait_percent": 99, "cpu_wait_limit": 30}},
    {"group": "bench", "queue_depth": 31, "processes": [
      {"slot": 0, "pid": 100, "state": "running", "kind": "resident"},
      {"slot": 1, "pid": 101, "state": "starting", "kind": "nonresident"},
      {"slot": 2, "pid": 0, "state": "stopped", "kind": "nonresident"}],
     "load": {},
     "cpu": {"cpu_seconds": 1.5, "runqueue_wait_seconds": 0.25, "runqueue_wait_percent": 37, "cpu_wait_limit": 30,
             "runqueue_waits": [{"up_to_us": 2, "count": 5}, {"count": 1}]}}
  ]
}`

func TestNodeStatusSample(t *testing.T) {
	var st nodeStatus
	if err := json.Unmarshal([]byte(statusJSON), &st); err != nil {
		t.Fatal(err)
	}
	if st.Probes.Name != "tp_btf" {
		t.Errorf("probes %q", st.Probes.Name)
	}
	got := st.Sample("bench")
	want := statusSample{Procs: 2, QueueDepth: 31, WaitPct: 37, CPUSeconds: 1.5, WaitSeconds: 0.25, GuardHolds: 42, Starts: 15}
	if got != want {
		t.Errorf("sample = %+v, want %+v", got, want)
	}
	if got := st.Sample("missing"); got.Procs != 0 || got.WaitPct != -1 || got.GuardHolds != 42 {
		t.Errorf("missing group: %+v", got)
	}
}

func guardFig(thr, p99, procs float64) guardFigures {
	return guardFigures{Figures: Figures{Offered: 9000, Throughput: thr, P50us: p99 / 4, P90us: p99 / 2, P99us: p99, P999us: 2 * p99, CPUus: 140},
		ProcFigures: ProcFigures{MeanProcs: procs, MaxProcs: math.Ceil(procs), PeakProcs: math.Ceil(procs), MeanWaitPct: 80, MaxWaitPct: 100,
			Waiting: procs, WaitShare: 0.9, CPUCores: 0.8, GuardHolds: 3, RunGuardHolds: 10},
		UAPCPUus: 150, Due: 36000, Refused: 1000}
}

func TestMedianOfGuardFigures(t *testing.T) {
	runs := []guardFigures{guardFig(5000, 30000, 16), guardFig(7000, 10000, 2), guardFig(6000, 20000, 3)}
	m := medianOf(runs)
	if m.Throughput != 6000 || m.P99us != 20000 || m.MeanProcs != 3 || m.Offered != 9000 || m.Refused != 1000 || m.UAPCPUus != 150 {
		t.Errorf("median = %+v", m)
	}
	if i := throughputRun(runs); i != 2 {
		t.Errorf("median throughput run = %d, want 2", i)
	}
	if i := throughputRun(runs[:2]); i != 0 {
		t.Errorf("median of two = %d, want the lower (0)", i)
	}
	if i := throughputRun(nil); i != -1 {
		t.Errorf("no runs: %d", i)
	}
	// The embedded figures flatten into one JSON object.
	js, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{`"throughput_per_s":6000`, `"processes_mean":3`, `"uap_cpu_us_per_completed_call":150`} {
		if !strings.Contains(string(js), k) {
			t.Errorf("JSON lacks %s: %s", k, js)
		}
	}
}

func guardResults(on, off []guardFigures) []guardResult {
	return []guardResult{
		{System: nameTpschedGuard, WaitLimit: 30, Probes: "tp_btf", runSet: runSet[guardFigures]{Runs: on, Median: medianOf(on), Drawn: throughputRun(on)}},
		{System: nameTpschedGuardOff, WaitLimit: 0, Probes: "tp_btf", runSet: runSet[guardFigures]{Runs: off, Median: medianOf(off), Drawn: throughputRun(off)}},
	}
}

func TestGuardVerdict(t *testing.T) {
	good := guardVerdict(guardResults(
		[]guardFigures{guardFig(7000, 10000, 2.5), guardFig(7100, 11000, 3), guardFig(7200, 9000, 2)},
		[]guardFigures{guardFig(6000, 30000, 16), guardFig(6100, 40000, 16), guardFig(5900, 35000, 16)}), 2, 16)
	for _, want := range []string{
		"processes with the guard 2.5 on average, 3 at most (near the 2 cores, mean at most 4: met; without: 16.0, 16 at most)",
		"completed calls/s 7100 vs 6000 (1.18x; no lower: met)",
		"p99 10.0 ms vs 35.0 ms (0.29x; lower: met)",
		"near the cores in 3 of 3 runs; it held starts back (cpu_guard_holds above 0 over the run) in 3.",
		"completed/s ranged 7000-7200 with the guard and 5900-6100 without",
	} {
		if !strings.Contains(good, want) {
			t.Errorf("verdict lacks %q:\n%s", want, good)
		}
	}
	if strings.Contains(good, "overlap") || strings.Contains(good, "By outcome") {
		t.Errorf("separate ranges called overlapping:\n%s", good)
	}
	bad := guardVerdict(guardResults(
		[]guardFigures{guardFig(5000, 30000, 16), guardFig(7000, 10000, 2), guardFig(6000, 50000, 16)},
		[]guardFigures{guardFig(6500, 30000, 16), guardFig(5500, 40000, 16), guardFig(6200, 35000, 16)}), 2, 16)
	for _, want := range []string{"mean at most 4: NOT met", "no lower: NOT met", "lower: met", "near the cores in 1 of 3 runs",
		"the ranges overlap",
		"**By outcome**: in the 1 runs where the guard held the group below the maximum (2.0 processes), completed/s 7000 and p99 10.0 ms (medians); " +
			"in the 2 where it grew to the maximum (16.0 processes), 5500/s and p99 40.0 ms; without the guard 6200/s and p99 35.0 ms.",
		"Held runs against the same round without the guard: run 2: 7000 vs 5500/s (1.27x), p99 10.0 ms vs 40.0 ms (0.25x)."} {
		if !strings.Contains(bad, want) {
			t.Errorf("verdict lacks %q:\n%s", want, bad)
		}
	}
	grown := guardVerdict(guardResults(
		[]guardFigures{guardFig(7000, 10000, 16), guardFig(7100, 11000, 16), guardFig(7200, 9000, 16)},
		[]guardFigures{guardFig(6000, 30000, 16), guardFig(6100, 40000, 16), guardFig(5900, 35000, 16)}), 2, 16)
	if !strings.Contains(grown, "In every run the guard's group grew to the 16 processes it grows to without the guard") ||
		strings.Contains(grown, "By outcome") {
		t.Errorf("grown everywhere:\n%s", grown)
	}
	if v := guardVerdict(guardResults(nil, nil)[:1], 2, 16); !strings.Contains(v, "not checked") {
		t.Errorf("one system: %s", v)
	}
}

func TestGuardMarkdown(t *testing.T) {
	on := []guardFigures{guardFig(7000, 10000, 2), guardFig(7100, 11000, 3), guardFig(7200, 9000, 2)}
	off := []guardFigures{guardFig(6000, 30000, 16), guardFig(6100, 40000, 16), guardFig(5900, 35000, 16)}
	off[0].Waiting = 20 // more than its 16 processes
	r := &report{Scenario: "S5", Title: "the CPU guard", Date: "2026-01-02",
		Machine: machineInfo{Cores: 2, CPU: "test CPU", Kernel: "6.1", Go: "go1.26"}, Runs: 3,
		Guard:        &guardSetup{Capacity: 6500, Factor: 1.4, Rate: 9100, Carriers: 256, Queue: 32, Poll: s5Poll, WaitLimit: 30, Cores: 2},
		GuardResults: guardResults(on, off), Setup: []string{"setup line"}, Notes: []string{"a note"},
		Skipped: map[string]string{"x": "why"}}
	md := r.Markdown()
	for _, want := range []string{
		"# S5: the CPU guard",
		"- setup line",
		"**Not measured: x**: why",
		"| tpsched guard | 30 | 9000 | 7100 | 1000 (0) | 0 | 0 (0) | 2.50 ms | 5.00 ms | 10.0 ms | 20.0 ms | 2.0 / 2 / 2 | 80% / 100% | 2.00 | 90.0% | 0.80 cores | 150 us | 140 us | 3 / 10 | 0 / 0 | tp_btf |",
		"| tpsched guard off | 1 (plotted) | 6000 |",
		"'Waiting' above the number of processes",
		"a note",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q\n%s", want, md)
		}
	}
	sc := bufio.NewScanner(strings.NewReader(md))
	cols := 0
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "|") {
			cols = 0
			continue
		}
		n := strings.Count(line, "|")
		if cols == 0 {
			cols = n
		} else if n != cols {
			t.Errorf("row has %d cells, header %d: %s", n-1, cols-1, line)
		}
	}
}

func TestPlotGuardSeries(t *testing.T) {
	on := []guardFigures{guardFig(7000, 10000, 2)}
	off := []guardFigures{guardFig(6000, 30000, 16)}
	r := &report{Scenario: "S5", Date: "2026-01-02", Warmup: 1,
		Guard:        &guardSetup{Rate: 9100, Carriers: 256, Poll: s5Poll, WaitLimit: 30},
		GuardResults: guardResults(on, off)}
	r.GuardResults[0].Samples = [][]statusSample{{sample(0, 1, -1, 0, 0, 0, 0), sample(50, 2, 40, 0, 0, 0, 0), sample(100, 2, 90, 0, 0, 0, 0)}}
	r.GuardResults[1].Samples = [][]statusSample{{sample(0, 1, -1, 0, 0, 0, 0), sample(50, 16, 100, 0, 0, 0, 0)}}
	dir := t.TempDir()
	for _, what := range []string{"processes", "wait"} {
		name, err := plotGuardSeries(r, dir, what)
		if err != nil || name != "2026-01-02-S5-"+what+"-over-time.png" {
			t.Errorf("%s: %q, %v", what, name, err)
		}
	}
	if _, err := plotGuardSeries(r, dir, "nonsense"); err == nil {
		t.Error("an unknown series: no error")
	}
	if name, err := plotGuardSeries(&report{}, dir, "processes"); name != "" || err != nil {
		t.Errorf("no S5: %q, %v", name, err)
	}
}
