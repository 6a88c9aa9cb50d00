package bench

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseSwitches(t *testing.T) {
	status := "Name:\tscdd\nState:\tS (sleeping)\nvoluntary_ctxt_switches:\t12345\nnonvoluntary_ctxt_switches:\t67\n"
	vol, invol, err := parseSwitches([]byte(status))
	if err != nil || vol != 12345 || invol != 67 {
		t.Errorf("got %d, %d, %v", vol, invol, err)
	}
	for _, bad := range []string{
		"Name:\tx\n", // a kernel without the counts
		"voluntary_ctxt_switches:\t1\n",
		"voluntary_ctxt_switches:\tx\nnonvoluntary_ctxt_switches:\t1\n",
	} {
		if _, _, err := parseSwitches([]byte(bad)); err == nil {
			t.Errorf("parseSwitches(%q) accepted", bad)
		}
	}
}

// The kernel counts per thread: a process's switches are its threads'.
func TestReadSwitchesOfThisProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/task"); err != nil {
		t.Skip("no /proc:", err)
	}
	got := readSwitches([]int{os.Getpid()})
	main, ok := got[os.Getpid()]
	if !ok || main.pid != os.Getpid() {
		t.Fatalf("the main thread is missing: %v", got)
	}
	if len(got) < 2 {
		t.Errorf("%d threads read; a Go test binary has several", len(got))
	}
	for tid, ts := range got {
		if ts.pid != os.Getpid() {
			t.Errorf("thread %d counted for process %d", tid, ts.pid)
		}
	}
}

func TestSwitchesBetween(t *testing.T) {
	a := map[int]taskSwitches{
		10: {pid: 10, vol: 100, invol: 10},
		11: {pid: 10, vol: 50, invol: 5},
		12: {pid: 10, vol: 70, invol: 7}, // ends before b
		20: {pid: 20, vol: 9, invol: 9},
		30: {pid: 30, vol: 500, invol: 0}, // its tid is reused by another process in b
	}
	b := map[int]taskSwitches{
		10: {pid: 10, vol: 130, invol: 12},
		11: {pid: 10, vol: 51, invol: 5},
		13: {pid: 10, vol: 4, invol: 1}, // a thread new in the window
		20: {pid: 20, vol: 9, invol: 9},
		30: {pid: 31, vol: 3, invol: 1},
	}
	got := switchesBetween(a, b)
	for pid, want := range map[int]taskSwitches{
		10: {pid: 10, vol: 30 + 1 + 4, invol: 2 + 0 + 1},
		20: {pid: 20},
		31: {pid: 31, vol: 3, invol: 1},
	} {
		if got[pid] != want {
			t.Errorf("process %d: %+v, want %+v", pid, got[pid], want)
		}
	}
	if _, ok := got[30]; ok {
		t.Error("a process gone from b still counted")
	}
}

// splitCPUSets puts each process in its part: the server's and an external
// load generator's with their waited-for children, this process and other
// tenants with their own CPU only.
func TestSplitCPUSets(t *testing.T) {
	self := os.Getpid()
	a := cpuSample{
		at:    time.Unix(100, 0),
		ticks: map[int]uint64{10: 100, 20: 50, 30: 10, 40: 7, self: 500},
		own:   map[int]uint64{10: 90, 20: 40, 30: 10, 40: 5, self: 300},
		start: map[int]uint64{10: 1, 20: 2, 30: 3, 40: 4, self: 5},
	}
	b := cpuSample{
		at:    time.Unix(102, 0),
		ticks: map[int]uint64{10: 160, 20: 80, 30: 12, 40: 20, self: 900, 50: 6},
		own:   map[int]uint64{10: 140, 20: 60, 30: 12, 40: 8, self: 330, 50: 6},
		start: map[int]uint64{10: 1, 20: 2, 30: 3, 40: 4, self: 5, 50: 9}, // 50 started in the window
	}
	got := splitCPUSets(a, b, []int{10, 50}, []int{self, 20}, []int{30})
	want := cpuSplit{server: 60 + 6, self: 30 + 30, peers: 2, foreign: 3, elapsed: 2 * time.Second}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if c := got.cores(got.server); c != 0.33 {
		t.Errorf("server cores %v, want 0.33", c)
	}
}

// attribute: callers in the server's tree count as the load generator,
// idle callers with the idle systems, system calls per process.
func TestWindowAttribute(t *testing.T) {
	self := os.Getpid()
	parents := map[int]int{10: 1, 11: 10, 12: 10, 13: 10, 30: 1, self: 1}
	cpu := func(at int64, ticks map[int]uint64) cpuSample {
		start := map[int]uint64{}
		for p := range ticks {
			start[p] = 1
		}
		return cpuSample{at: time.Unix(at, 0), ticks: ticks, own: ticks, start: start, parents: parents,
			server: processTree(parents, []int{10}), peers: processTree(parents, []int{30})}
	}
	sw := func(n uint64) map[int]taskSwitches {
		return map[int]taskSwitches{
			10: {pid: 10, vol: 10 * n, invol: n}, 11: {pid: 11, vol: 2 * n}, 12: {pid: 12, vol: 3 * n, invol: n},
			13: {pid: 13, vol: n}, self: {pid: self, vol: 5 * n},
		}
	}
	w := &window{server: []int{10}, peers: []int{30}, begun: true, ended: true}
	w.first = windowSample{cpu: cpu(0, map[int]uint64{10: 0, 11: 0, 12: 0, 13: 0, 30: 0, self: 0}), switches: sw(1),
		sys: map[int]uint64{10: 100, 11: 10, 12: 20, self: 5}, steal: 1}
	w.last = windowSample{cpu: cpu(2, map[int]uint64{10: 40, 11: 20, 12: 30, 13: 2, 30: 4, self: 6}), switches: sw(3),
		sys: map[int]uint64{10: 300, 11: 30, 12: 60, 13: 3, self: 9}, steal: 1.5,
		rss: map[int]int64{10: 1000, 11: 500, 12: 700, 13: 600}}
	// 12 is the caller that ran, 13 one that idled.
	acc, err := w.attribute([]int{12}, []int{13})
	if err != nil {
		t.Fatal(err)
	}
	want := accounting{
		elapsed:    2 * time.Second,
		server:     usage{ticks: 40 + 20, vol: 2 * (10 + 2), invol: 2 * 1, syscalls: 200 + 20},
		loadgen:    usage{ticks: 6 + 30, vol: 2 * (5 + 3), invol: 2 * 1, syscalls: 4 + 40},
		peersTicks: 4 + 2, stealSeconds: 0.5, syscalls: true, rssKiB: 1500,
	}
	if acc != want {
		t.Errorf("got  %+v\nwant %+v", acc, want)
	}
	var f Figures
	f.perCall(acc, 8, 0)
	if f.ServerVolCS != 3 || f.ServerInvolCS != 0.25 || f.ServerSyscalls != 27.5 || f.LoadgenVolCS != 2 || f.LoadgenInvolCS != 0.25 || f.LoadgenSyscalls != 5.5 {
		t.Errorf("per call: %+v", f)
	}
	// Without the syscall counter the figures say so (-1), not 0.
	w.last.sys = nil
	acc, _ = w.attribute([]int{12}, []int{13})
	f.perCall(acc, 8, 0)
	if f.ServerSyscalls != -1 || f.LoadgenSyscalls != -1 || f.ServerVolCS != 3 {
		t.Errorf("not counted: %+v", f)
	}
	f.perCall(acc, 0, 0)
	if f.ServerVolCS != 0 {
		t.Errorf("no calls: %v switches per call", f.ServerVolCS)
	}
	// Calls counted by other processes over a window the samples covered
	// a quarter of: a quarter of them are the samples' (S10's callers).
	f.perCall(acc, 32, 0.25)
	if f.ServerVolCS != 3 {
		t.Errorf("a quarter sampled: %v switches per call, want 3", f.ServerVolCS)
	}
	if _, err := (&window{begun: true}).attribute(nil, nil); err == nil {
		t.Error("a window never ended was accounted")
	}
}

func TestCountBetween(t *testing.T) {
	a := map[int]uint64{1: 10, 2: 50}
	b := map[int]uint64{1: 15, 2: 7, 3: 4} // 2 was evicted and counted anew; 3 is new
	for pid, want := range map[int]uint64{1: 5, 2: 7, 3: 4, 4: 0} {
		if got := countBetween(a, b, pid); got != want {
			t.Errorf("pid %d: %d, want %d", pid, got, want)
		}
	}
}

// measure runs a system with a driver of its own and skips the cells a
// system says it does not measure, recording why.
func TestMeasureSkipsAndDrives(t *testing.T) {
	drive := func(_ context.Context, o runOptions, c *gridCell, w *window) (result, error) {
		w.begin()
		w.end()
		n := 1000 * c.Conns
		return result{Calls: n, Offered: n, Throughput: float64(n) / o.Duration.Seconds(),
			Latency: latency{Mean: 50 * time.Microsecond, P50: 40 * time.Microsecond}}, nil
	}
	a := &system{Name: "a", drive: drive}
	b := &system{Name: "b", drive: drive, skip: func(c gridCell) string {
		if c.Conns > 5 {
			return "too many callers"
		}
		return ""
	}}
	cells := []gridCell{{Service: "echo", Payload: 128, Conns: 1}, {Service: "echo", Payload: 128, Conns: 64}}
	opts := runOptions{Runs: 3, Duration: time.Second, Log: io.Discard}
	measure(context.Background(), opts, []*system{a, b}, cells, nil)
	for _, c := range cells {
		ma := c.Result("a")
		if len(ma.Runs) != 3 || ma.Median.Throughput != float64(1000*c.Conns) || ma.Median.MeanUs != 50 || ma.Median.P50us != 40 {
			t.Errorf("a in %d conns: %+v", c.Conns, ma)
		}
	}
	if mb := cells[0].Result("b"); len(mb.Runs) != 3 || mb.Skipped != "" {
		t.Errorf("b at 1 conn: %+v", mb)
	}
	if mb := cells[1].Result("b"); len(mb.Runs) != 0 || mb.Skipped != "too many callers" || mb.Error != "" {
		t.Errorf("b at 64 conns: %+v", mb)
	}
	r := &report{Scenario: "S10", Cells: cells, Systems: []string{"a", "b"}}
	if md := r.Markdown(); !strings.Contains(md, "Not measured: b in echo 128 B x 64 (too many callers).") {
		t.Errorf("the report does not say what was not measured:\n%s", md)
	}
}
