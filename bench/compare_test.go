package bench

import (
	"strings"
	"testing"
)

// TestCompare pools two builds' reports and takes the ratios within each
// report: after's local calls run at 2x and 3x Enduro/X in its two
// reports (median 2.5), before's at 1x.
func TestCompare(t *testing.T) {
	write := func(dir string, local, endurox float64) {
		t.Helper()
		r := report{Scenario: "S10", Date: "2026-12-01", Cells: []gridCell{{
			Service: "echo", Payload: 128, Conns: 1,
			Results: []measurement{
				{System: "tpsched local call", Runs: []Figures{{Throughput: local, P50us: 50}}},
				{System: "Enduro/X", Runs: []Figures{{Throughput: endurox}}},
			},
		}}}
		if _, err := r.Write(dir); err != nil {
			t.Fatal(err)
		}
	}
	b1, a1, a2 := t.TempDir(), t.TempDir(), t.TempDir()
	write(b1, 1000, 1000)
	write(a1, 2000, 1000)
	write(a2, 6000, 2000)
	out, err := Compare([]string{b1}, []string{a1, a2}, CompareRatios)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Reports: 1 before, 2 after.",
		"| S10 | echo 128 B x 1 | tpsched local call | 1000 | 4000 | 4.00x | 50 / 50 |",
		"| S10 | echo 128 B x 1 | Enduro/X | 1000 | 1500 | 1.50x | - |",
		"| tpsched local call / Enduro/X | S10 echo 128 B x 1 | 1.00 (1) | 2.50 (2) |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
}
