package bench

import (
	"strings"
	"testing"
	"time"

	"tpsched/bench/uapcall"
	"tpsched/netio"
)

// The caller UAP classifies error answers by the frame protocol's codes,
// which it cannot import.
func TestCallerCodesAreTheProtocols(t *testing.T) {
	if uapcall.CodeServerBusy != int(netio.CodeServerBusy) || uapcall.CodeTimedOut != int(netio.CodeTimedOut) {
		t.Errorf("uapcall's codes %d, %d; netio's %d, %d", uapcall.CodeServerBusy, uapcall.CodeTimedOut, netio.CodeServerBusy, netio.CodeTimedOut)
	}
}

func summaryOf(pid, ok, inWindow int, lat time.Duration) uapcall.Summary {
	s := uapcall.Summary{PID: pid, OK: ok, InWindow: inWindow}
	for range ok {
		s.Hist.Add(lat)
	}
	return s
}

func TestMergeSummaries(t *testing.T) {
	a, b := summaryOf(101, 300, 310, 40*time.Microsecond), summaryOf(102, 100, 95, 200*time.Microsecond)
	b.Refused, b.TimedOut = 2, 1
	r, err := mergeSummaries([]uapcall.Summary{a, b}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r.Calls != 400 || r.Refused != 2 || r.TimedOut != 1 || r.Offered != 403 || r.Throughput != 202.5 {
		t.Errorf("got calls %d refused %d timed out %d offered %d thr %v", r.Calls, r.Refused, r.TimedOut, r.Offered, r.Throughput)
	}
	if len(r.Loadgen) != 2 || r.Loadgen[0] != 101 || r.Loadgen[1] != 102 {
		t.Errorf("callers %v", r.Loadgen)
	}
	// 300 of 400 at 40 us: the p50 is theirs, the p90 the slower caller's.
	near := func(got time.Duration, want time.Duration) bool { return got > want*63/64 && got < want*65/64 }
	if !near(r.Latency.P50, 40*time.Microsecond) || !near(r.Latency.P90, 200*time.Microsecond) || r.Latency.N != 400 {
		t.Errorf("latency %+v", r.Latency)
	}
	if len(r.CDF) == 0 {
		t.Error("no distribution")
	}
	for name, bad := range map[string][]uapcall.Summary{
		"two runs on one caller": {a, summaryOf(101, 1, 1, time.Millisecond)},
		"a reply not echoed":     {a, {PID: 103, Bad: 1}},
		"no call answered":       {{PID: 104, Failed: 3}},
	} {
		if _, err := mergeSummaries(bad, time.Second); err == nil {
			t.Errorf("%s: merged", name)
		}
	}
}

func TestExbenchFile(t *testing.T) {
	b := []byte("\"Configuration\" \"MsgSize\" \"CallsPerSec\"\n\"run\" 192 36504\n\"run\" 4160 27720\n")
	size, tps, err := parseExbench(b)
	if err != nil || size != 4160 || tps != 27720 {
		t.Errorf("got %v %v %v", size, tps, err)
	}
	for _, bad := range []string{"", "\"Configuration\" \"MsgSize\" \"CallsPerSec\"\n", "\"run\" 192 lots\n"} {
		if _, _, err := parseExbench([]byte(bad)); err == nil {
			t.Errorf("parseExbench(%q) accepted", bad)
		}
	}
}

// exbenchcl reports calls/s only: the window's calls follow from it, and
// the mean latency of N closed loops from Little's law.
func TestExbenchResult(t *testing.T) {
	r := exbenchResult(20000, 1, 2*time.Second)
	if r.Calls != 40000 || r.Offered != 40000 || r.Throughput != 20000 || r.Latency.Mean != 50*time.Microsecond {
		t.Errorf("1 caller: %+v", r)
	}
	if r := exbenchResult(40000, 5, time.Second); r.Latency.Mean != 125*time.Microsecond || r.Latency.P50 != 0 {
		t.Errorf("5 callers: mean %v p50 %v", r.Latency.Mean, r.Latency.P50)
	}
	if r := exbenchResult(0, 5, time.Second); r.Latency.Mean != 0 || r.Calls != 0 {
		t.Errorf("no calls: %+v", r)
	}
}

func TestExbenchTimeHoldsTheWindow(t *testing.T) {
	for _, c := range []struct {
		warm, win time.Duration
		want      int
	}{{250 * time.Millisecond, 750 * time.Millisecond, 2}, {500 * time.Millisecond, 2 * time.Second, 3}, {0, time.Millisecond, 1}} {
		got := exbenchTime(c.warm, c.win)
		if got != c.want {
			t.Errorf("warm-up %v window %v: -t %d, want %d", c.warm, c.win, got, c.want)
		}
		if time.Duration(got)*time.Second < c.warm+c.win+500*time.Millisecond {
			t.Errorf("-t %d does not hold %v + %v with room", got, c.warm, c.win)
		}
	}
}

func TestEnduroXConfig(t *testing.T) {
	c := enduroxConfig("/tmp/x", 5)
	for _, want := range []string{"<server name=\"exbenchsv\">", "<srvid>100</srvid>", "<min>5</min>", "<max>5</max>", "-e /tmp/x/exbenchsv.log"} {
		if !strings.Contains(c, want) {
			t.Errorf("config lacks %q:\n%s", want, c)
		}
	}
}

func s10Report() *report {
	m := func(sys string, thr, p50, mean, cpu float64) measurement {
		f := Figures{Throughput: thr, P50us: p50, P99us: 4 * p50, MeanUs: mean, CPUus: cpu, LoadgenCPUus: 10}
		return measurement{System: sys, Runs: []Figures{f, f, f}, Median: f}
	}
	return &report{
		Scenario: "S10", Title: "local calls", Date: "2026-01-02", Runs: 3,
		Systems: []string{nameTpsched, nameTpschedLocal, nameTpschedLocalC, nameTpschedNested, nameEnduroX},
		Cells: []gridCell{{Service: "echo", Payload: 128, Conns: 1, Results: []measurement{
			m(nameTpsched, 8000, 100, 120, 60),
			m(nameTpschedLocal, 25000, 30, 40, 20),
			m(nameTpschedLocalC, 22000, 35, 45, 18),
			m(nameTpschedNested, 4000, 200, 250, 110),
			m(nameEnduroX, 20000, 0, 50, 10),
		}}, {Service: "echo", Payload: 128, Conns: 5, Results: []measurement{
			m(nameTpsched, 20000, 200, 250, 40),
			m(nameTpschedLocal, 30000, 150, 160, 20),
			m(nameTpschedLocalC, 36000, 130, 140, 16),
			m(nameTpschedNested, 8000, 500, 600, 100),
			m(nameEnduroX, 40000, 0, 125, 10),
		}}, {Service: "echo", Payload: 128, Conns: 64, Results: []measurement{
			m(nameTpsched, 40000, 1500, 1600, 15),
			m(nameTpschedLocal, 33000, 1900, 1940, 20),
			m(nameTpschedLocalC, 50000, 1200, 1280, 14),
			m(nameTpschedNested, 9000, 7000, 7100, 90),
			{System: nameEnduroX, Skipped: "more than 5 callers"},
		}}},
	}
}

func TestS10Targets(t *testing.T) {
	n := s10Notes(s10Report())
	for _, want := range []string{
		"128 B x 1: local 25.0k calls/s vs Enduro/X 1x1 20.0k (1.25x, met), p50 30 us vs Enduro/X mean 50 us (met)",
		"nested p50 200 us vs direct + local 130 us (NOT met), CPU 110.0 vs 90.0 us/call (NOT met)",
		"128 B x 5: local 30.0k calls/s vs Enduro/X 5x5 40.0k (0.75x, NOT met)",
		"128 B x 64: local 33.0k calls/s vs direct 40.0k (0.82x, target 0.8x: met); local vs 5 callers 30.0k (1.10x, target 0.9x: met), p99 7.60 ms (target 5 ms: NOT met)",
		"met). With C UAPs (tpsched C local call): 128 B x 1: C 22.0k calls/s vs Enduro/X 1x1 20.0k (1.10x, met); " +
			"128 B x 5: C 36.0k calls/s vs Enduro/X 5x5 40.0k (0.90x, NOT met); " +
			"128 B x 64: C 50.0k calls/s; C vs 5 callers 36.0k (1.39x, target 0.9x: met), p99 4.80 ms (target 5 ms: met).",
	} {
		if !strings.Contains(n, want) {
			t.Errorf("notes lack %q:\n%s", want, n)
		}
	}
}

// In S10 the ratio table sets the local calls against Enduro/X, with the
// means where Enduro/X has no percentile.
func TestS10RatioTable(t *testing.T) {
	md := s10Report().Markdown()
	for _, want := range []string{
		"## tpsched local call against each peer",
		"| echo | 128 B | 1 | 1.25x / 0.80x / 2.00x |",
		"| echo | 128 B | 64 | - |",
		"| echo | 128 B | 1 | Enduro/X | 20000 | - | - | - | - | 50 us | 10.0 us |",
		"Not measured: Enduro/X in echo 128 B x 64 (more than 5 callers).",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q\n%s", want, md)
		}
	}
	if strings.Contains(md, "vs tpsched nested call") || strings.Contains(md, "vs tpsched:") {
		t.Error("tpsched's own variants are set against it as peers")
	}
}

// TestSampledShare: the part of the callers' window the harness's samples
// cover, when it samples late (short of CPU) or early.
func TestSampledShare(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, tc := range []struct {
		began, ended int
		want         float64
	}{
		{0, 800, 1},      // on time
		{200, 800, 0.75}, // began late
		{0, 900, 1},      // ended late: the samples cover the whole window
		{900, 950, 1e-9}, // began after the window's end: nothing of it sampled
		{400, 600, 0.25},
	} {
		if got := sampledShare(at(0), at(800), at(tc.began), at(tc.ended)); got != tc.want {
			t.Errorf("samples at %d and %d ms of a window of 800: share %v, want %v", tc.began, tc.ended, got, tc.want)
		}
	}
	if got := sampledShare(at(0), at(800), time.Time{}, time.Time{}); got != 0 {
		t.Errorf("no samples: share %v, want 0 (the harness's own count)", got)
	}
}
