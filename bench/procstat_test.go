package bench

import (
	"os"
	"slices"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	// A command name with spaces and parentheses, as a process may choose.
	line := "4242 (php-fpm: pool (x) y) S 4200 4200 4200 0 -1 4194560 1234 0 0 0 150 35 7 3 20 0 1 0 100 200000 2000 18446744073709551615\n"
	s, err := ParseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	want := ProcStat{PID: 4242, PPID: 4200, Utime: 150, Stime: 35, CUtime: 7, CStime: 3}
	if s != want {
		t.Errorf("got %+v, want %+v", s, want)
	}
	if s.Ticks() != 195 {
		t.Errorf("ticks %d, want 195", s.Ticks())
	}
	for _, bad := range []string{"", "12 no name", "12 (x) S 1 2", "x (a) S 1 1 1 0 -1 0 0 0 0 0 1 2 3 4"} {
		if _, err := ParseStat([]byte(bad)); err == nil {
			t.Errorf("ParseStat(%q) accepted", bad)
		}
	}
}

func TestParseStatOfThisProcess(t *testing.T) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Skip("no /proc:", err)
	}
	s, err := ParseStat(b)
	if err != nil {
		t.Fatal(err)
	}
	if s.PID != os.Getpid() || s.PPID != os.Getppid() {
		t.Errorf("pid %d ppid %d, want %d %d", s.PID, s.PPID, os.Getpid(), os.Getppid())
	}
}

func TestParseVmHWM(t *testing.T) {
	status := "Name:\tscdd\nVmPeak:\t 3203844 kB\nVmHWM:\t   12044 kB\nVmRSS:\t   11000 kB\n"
	kb, err := ParseVmHWM([]byte(status))
	if err != nil || kb != 12044 {
		t.Errorf("got %d, %v", kb, err)
	}
	if _, err := ParseVmHWM([]byte("Name:\tkthreadd\n")); err == nil {
		t.Error("a status without VmHWM accepted")
	}
}

func TestTreeFollowsDescendants(t *testing.T) {
	parents := map[int]int{1: 0, 10: 1, 11: 10, 12: 10, 13: 11, 20: 1, 21: 20, 30: 99}
	got := Tree(parents, []int{10, 30, 77})
	slices.Sort(got)
	if want := []int{10, 11, 12, 13, 30}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestFiguresCPUPerCall(t *testing.T) {
	res := Result{Offered: 1100, Calls: 900, Refused: 100, TimedOut: 100, Throughput: 900}
	// 150 ticks = 1.5 s of server CPU over 1000 answered calls: 1500 us each.
	f := figuresOf(res, time.Second, true, 150, 20, 2048)
	if f.CPUus != 1500 || f.LoadgenCPUus != 200 {
		t.Errorf("cpu %v us, loadgen %v us per call", f.CPUus, f.LoadgenCPUus)
	}
	if f.Offered != 1100 || f.PeakRSSKiB != 2048 {
		t.Errorf("offered %v rss %v", f.Offered, f.PeakRSSKiB)
	}
	if f.RefusedShare != 100.0/1100 || f.TimeoutShare != 100.0/1100 {
		t.Errorf("shares %v %v", f.RefusedShare, f.TimeoutShare)
	}
	if z := figuresOf(Result{}, time.Second, false, 10, 0, 0); z.CPUus != 0 || z.Offered != 0 {
		t.Errorf("no calls: %+v", z)
	}
}
