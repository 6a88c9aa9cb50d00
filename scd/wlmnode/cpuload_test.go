package wlmnode

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	const stat = `cpu  100 0 100 800 0 0 0 0 0 0
cpu0 10 1 9 70 5 2 3 0 0 0
cpu1 50 0 50 0 0 0 0 0 0 0
cpu2 1 2 3
intr 12345
`
	got, err := parseProcStat([]byte(stat), nil)
	if err != nil {
		t.Fatal(err)
	}
	// busy: user, nice, system, irq, softirq, steal; idle and iowait are not.
	if c := got[0]; c.busy != 10+1+9+2+3 || c.total != 100 {
		t.Errorf("cpu0 = %+v, want busy 25 of 100", c)
	}
	if c := got[1]; c.busy != 100 || c.total != 100 {
		t.Errorf("cpu1 = %+v", c)
	}
	if len(got) != 2 {
		t.Errorf("%d CPUs read, want 2 (cpu2's line is short)", len(got))
	}
	masked, err := parseProcStat([]byte(stat), map[int]bool{1: true})
	if err != nil || len(masked) != 1 || masked[1].busy != 100 {
		t.Errorf("mask {1}: %+v, %v", masked, err)
	}
	if _, err := parseProcStat([]byte(stat), map[int]bool{7: true}); err == nil {
		t.Error("no line for the mask's CPU: no error")
	}
	if _, err := parseProcStat([]byte("cpu0 1 x 3 4 5\n"), nil); err == nil || !strings.Contains(err.Error(), "cpu0: field 2") {
		t.Errorf("bad number: %v", err)
	}
}

// TestCPUSampler: the first sample sets the base; the next one counts each
// CPU's busy share since then, only for the CPUs of the mask.
func TestCPUSampler(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stat")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := &cpuSampler{path: path, cpus: map[int]bool{0: true, 1: true}}
	write("cpu0 0 0 0 0 0\ncpu1 0 0 0 0 0\ncpu2 0 0 0 0 0\n")
	if cpus, busy, err := s.sample(); err != nil || cpus != 2 || busy != 0 {
		t.Fatalf("first sample = %v, %v, %v; want 2 CPUs, 0 busy", cpus, busy, err)
	}
	write("cpu0 50 0 0 50 0\ncpu1 100 0 0 0 0\ncpu2 100 0 0 0 0\n")
	cpus, busy, err := s.sample()
	if err != nil || cpus != 2 || math.Abs(busy-1.5) > 1e-9 {
		t.Errorf("second sample = %v, %v, %v; want 2 CPUs, 1.5 busy", cpus, busy, err)
	}
	write("gone\n")
	if _, _, err := s.sample(); err == nil || !strings.Contains(err.Error(), "cpu load") {
		t.Errorf("unreadable stat: %v", err)
	}
}

func TestCPUDelay(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name                 string
		waits                bool
		onCPU, wait, service time.Duration
		want                 float64
	}{
		{"not measured", false, 10 * ms, 10 * ms, 100 * ms, -1},
		{"sleeping calls: waits at wake-up are nothing of the calls' time", true, 1 * ms, 1 * ms, 1000 * ms, 0.001},
		{"CPU-bound calls that wait half the time", true, 500 * ms, 500 * ms, 1000 * ms, 0.5},
		{"no call ended: the runnable time", true, 30 * ms, 10 * ms, 0, 0.25},
		{"never ran", true, 0, 0, 0, 0},
		{"wait longer than the calls that ended", true, 0, 900 * ms, 100 * ms, 1},
	}
	for _, tc := range cases {
		if got := cpuDelay(tc.waits, tc.onCPU, tc.wait, tc.service); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: cpuDelay = %v, want %v", tc.name, got, tc.want)
		}
	}
}
