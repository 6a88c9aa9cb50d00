package bench

import (
	"bufio"
	"strings"
	"testing"
)

func sampleReport() *report {
	m := func(sys string, thr, p99, cpu float64) measurement {
		f := Figures{Throughput: thr, P50us: p99 / 3, P90us: p99 / 2, P99us: p99, P999us: 2 * p99, MeanUs: p99 / 2.5, CPUus: cpu, PeakRSSKiB: 20480,
			ServerVolCS: 2, ServerInvolCS: 0.25, ServerSyscalls: 7.5, LoadgenCPUus: cpu / 2, LoadgenVolCS: 1, LoadgenInvolCS: 0.125, LoadgenSyscalls: -1}
		return measurement{System: sys, Runs: []Figures{f, f, f}, Median: f}
	}
	return &report{
		Scenario: "S1", Title: "echo, closed loop", Date: "2026-01-02",
		Machine: machineInfo{Cores: 2, CPU: "test CPU", Kernel: "6.1", Go: "go1.26"},
		Runs:    3, Duration: 2, Warmup: 0.5,
		Systems: []string{nameGRPC, namePHPStatic, nameTpsched},
		Skipped: map[string]string{nameGnetEcho: "not built"},
		Cells: []gridCell{{Service: "echo", Payload: 128, Conns: 64, Results: []measurement{
			m(nameGRPC, 20000, 12000, 50),
			m(namePHPStatic, 10000, 10000, 125),
			m(nameTpsched, 50000, 3500, 20),
		}}, {Service: "echo", Payload: 4096, Conns: 1, Results: []measurement{
			{System: nameGRPC, Error: "connection refused\nmore"},
			m(namePHPStatic, 3000, 600, 200),
			m(nameTpsched, 4000, 500, 190),
		}}},
	}
}

func TestMarkdownTables(t *testing.T) {
	md := sampleReport().Markdown()
	for _, want := range []string{
		"# S1: echo, closed loop",
		"2 cores (test CPU), Linux 6.1, go1.26",
		"median of 3 interleaved runs",
		"**Not measured: gnet-echo**: not built",
		"| echo | 128 B | 64 | tpsched | 50000 | 1.17 ms | 1.75 ms | 3.50 ms | 7.00 ms | 1.40 ms | 20.0 us | 20.0 MiB | 0 |",
		"## Wake-ups per call",
		// Context switches voluntary + involuntary; system calls not counted (-1) show as "-".
		"| echo | 128 B | 64 | tpsched | 50000 | 20.0 us | 2.00 + 0.25 | 7.5 | 10.0 us | 1.00 + 0.12 | - |",
		"| echo | 4 KiB | 1 | grpc-go | failed: connection refused |",
		"| echo | 128 B | 64 | 2.50x / 0.29x / 0.40x | 5.00x / 0.35x / 0.16x |",
		"| echo | 4 KiB | 1 | - | 1.33x / 0.83x / 0.95x |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q\n%s", want, md)
		}
	}
	// Every table row has as many cells as its header.
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
		} else if n != cols && !strings.Contains(line, "failed:") {
			t.Errorf("row with %d cells under a header of %d: %s", n, cols, line)
		}
	}
}

func TestS1Targets(t *testing.T) {
	got := s1Targets(sampleReport())
	for _, want := range []string{"vs grpc-go: throughput 2.50x (target 2x: met), p99 3.50 ms vs 12.0 ms (met)",
		"vs nginx+php-fpm static: throughput 5.00x (target 3x: met)"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}
	r := sampleReport()
	r.Cells[0].Results[2].Median.Throughput = 30000
	r.Cells[0].Results[2].Median.P99us = 11000
	if got := s1Targets(r); !strings.Contains(got, "1.50x (target 2x: NOT met)") || !strings.Contains(got, "(NOT met)") {
		t.Errorf("missed targets not said: %q", got)
	}
}

func TestFormatting(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{dur(12.4), "12 us"}, {dur(1234), "1.23 ms"}, {dur(12345), "12.3 ms"}, {dur(2.5e6), "2.50 s"},
		{pct(0), "0"}, {pct(0.5), "50.0%"}, {pct(0.0001), "0.010%"},
		{payloadName(gridCell{Service: "echo", Payload: 65536}), "64 KiB"}, {payloadName(gridCell{Service: "echo", Payload: 128}), "128 B"},
		{payloadName(gridCell{Service: "burn"}), "200 us CPU"}, {payloadName(gridCell{Service: "cpu"}), "200 us thread CPU"},
		{ratio(3, 0), "-"}, {ratio(3, 2), "1.50x"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestMedianOfFigures(t *testing.T) {
	m := medianOf([]Figures{{Throughput: 3, P99us: 30}, {Throughput: 1, P99us: 50}, {Throughput: 2, P99us: 10}})
	if m.Throughput != 2 || m.P99us != 30 {
		t.Errorf("got %+v", m)
	}
}

func TestNines(t *testing.T) {
	for _, tc := range []struct{ q, want float64 }{{0, 0}, {0.9, 1}, {0.99, 2}, {1, 6}} {
		if got := nines(tc.q); got < tc.want-1e-9 || got > tc.want+1e-9 {
			t.Errorf("Nines(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
}

func TestLatencyTicks(t *testing.T) {
	var labels []string
	for _, tk := range (latencyTicks{}).Ticks(3000, 40000) {
		labels = append(labels, tk.Label)
	}
	if got := strings.Join(labels, ","); got != "5.00 ms,10.0 ms,20.0 ms" {
		t.Errorf("ticks %s", got)
	}
}
