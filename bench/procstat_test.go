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
	s, err := parseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	want := procStat{PID: 4242, PPID: 4200, State: 'S', Utime: 150, Stime: 35, CUtime: 7, CStime: 3, Start: 100}
	if s != want {
		t.Errorf("got %+v, want %+v", s, want)
	}
	if s.Ticks() != 195 {
		t.Errorf("ticks %d, want 195", s.Ticks())
	}
	for _, bad := range []string{"", "12 no name", "12 (x) S 1 2", "x (a) S 1 1 1 0 -1 0 0 0 0 0 1 2 3 4"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("ParseStat(%q) accepted", bad)
		}
	}
}

func TestParseStatOfThisProcess(t *testing.T) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Skip("no /proc:", err)
	}
	s, err := parseStat(b)
	if err != nil {
		t.Fatal(err)
	}
	if s.PID != os.Getpid() || s.PPID != os.Getppid() {
		t.Errorf("pid %d ppid %d, want %d %d", s.PID, s.PPID, os.Getpid(), os.Getppid())
	}
}

func TestParseVmHWM(t *testing.T) {
	status := "Name:\tscdd\nVmPeak:\t 3203844 kB\nVmHWM:\t   12044 kB\nVmRSS:\t   11000 kB\n"
	kb, err := parseVmHWM([]byte(status))
	if err != nil || kb != 12044 {
		t.Errorf("got %d, %v", kb, err)
	}
	if _, err := parseVmHWM([]byte("Name:\tkthreadd\n")); err == nil {
		t.Error("a status without VmHWM accepted")
	}
}

func TestTreeFollowsDescendants(t *testing.T) {
	parents := map[int]int{1: 0, 10: 1, 11: 10, 12: 10, 13: 11, 20: 1, 21: 20, 30: 99}
	got := processTree(parents, []int{10, 30, 77})
	slices.Sort(got)
	if want := []int{10, 11, 12, 13, 30}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestFiguresCPUPerCall(t *testing.T) {
	res := result{Offered: 1100, Calls: 900, Refused: 100, TimedOut: 100, Throughput: 900}
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
	if z := figuresOf(result{}, time.Second, false, 10, 0, 0); z.CPUus != 0 || z.Offered != 0 {
		t.Errorf("no calls: %+v", z)
	}
}

// TestSplitCPU attributes CPU between two samples: the server's tree and
// the idle peers' with their reaped children, this process and other
// tenants with their own CPU only, new processes whole, a reused pid as
// new, and a process the first sample missed (a read race) not at all.
func TestSplitCPU(t *testing.T) {
	self := os.Getpid()
	at := time.Unix(1000, 0)
	type proc struct{ ticks, own, start uint64 }
	sample := func(at time.Time, server, peers []int, procs map[int]proc) cpuSample {
		s := cpuSample{at: at, ticks: map[int]uint64{}, own: map[int]uint64{}, start: map[int]uint64{}, server: server, peers: peers}
		for pid, p := range procs {
			s.ticks[pid], s.own[pid], s.start[pid] = p.ticks, p.own, p.start
		}
		return s
	}
	a := sample(at, []int{100, 101}, []int{200}, map[int]proc{
		100: {50, 40, 10}, 101: {5, 5, 11}, 200: {7, 7, 12}, self: {900, 300, 5},
		300: {1000, 100, 1}, // a tenant that will reap a child
		400: {30, 30, 13},   // a tenant whose pid will be reused
		600: {10, 10, 20},   // the newest process a saw
	})
	b := sample(at.Add(2*time.Second), []int{100, 101}, []int{200}, map[int]proc{
		100: {80, 60, 10}, 101: {9, 9, 11}, 200: {8, 8, 12}, self: {1500, 340, 5},
		300: {1900, 110, 1}, // reaped a child: +900 children's ticks, +10 own
		400: {6, 6, 25},     // a new process with the old pid
		500: {15, 15, 22},   // new
		600: {10, 10, 20},
		700: {70, 70, 3}, // missed by a although it started earlier
	})
	got := splitCPU(a, b)
	want := cpuSplit{server: 30 + 4, peers: 1, self: 40, foreign: 10 + 6 + 15, elapsed: 2 * time.Second}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if c := got.cores(got.server); c != 0.17 {
		t.Errorf("server %v cores, want 0.17", c)
	}
}
