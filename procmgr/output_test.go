package procmgr

import (
	"bufio"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A server whose output stays over the rate has its dropping said twice:
// once when it begins and once, with the count, when the output fits the
// rate again. Each line a token lets through meanwhile is logged, and
// nothing more: a steady flood made three records of each (the line,
// "dropped N" and "over the rate" again).
func TestOutputDropsAreSaidOncePerFlood(t *testing.T) {
	b := newOutputBook(100, 10)
	now := b.last
	var logged, starts, summaries, dropped uint64
	line := func() {
		ok, n, first := b.take(now)
		if ok {
			logged++
		}
		if first {
			starts++
		}
		if n > 0 {
			summaries++
			dropped += n
		}
	}
	// Ten seconds of 1000 lines a second, ten times the rate.
	for range 10000 {
		now = now.Add(time.Millisecond)
		line()
	}
	if starts != 1 || summaries != 0 {
		t.Errorf("during the flood: dropping said to begin %d times, summed %d times; want 1 and 0", starts, summaries)
	}
	if logged < 1000 || logged > 1020 {
		t.Errorf("%d lines logged in 10 s at 100 a second (burst 10)", logged)
	}
	// Then a line a second: the first ends the flood and says its count.
	for range 3 {
		now = now.Add(time.Second)
		line()
	}
	st := b.read()
	if starts != 1 || summaries != 1 || dropped != st.Dropped || st.Lines != logged || st.Lines+st.Dropped != 10003 {
		t.Errorf("after the flood: begun %d, summed %d (%d lines); stats %+v; want 1, 1, every dropped line", starts, summaries, dropped, st)
	}
	if n := b.flush(); n != 0 {
		t.Errorf("flush: %d lines not said", n)
	}
}

// A UAP that writes as fast as it can costs scdd little CPU: while its
// server's output is over the rate, its pipe is read in bulk every
// skipPause and its lines counted as dropped. Read and dropped line by
// line as fast as it wrote, it took scdd's reader a CPU (1.8 s of 2 s
// with /usr/bin/yes as the UAP). Not parallel: the test process's CPU
// time is the reader's.
func TestFloodingUAPCostsScddLittleCPU(t *testing.T) {
	m, logged := loggedManager(t, Options{})
	dir := t.TempDir()
	srv := startServer(t, m, uapSpec("flood", dir, 1), &hooks{})
	readReport(t, dir, 0, 0)
	waitUntil(t, "lines dropped", func() bool { return srv.Output().Dropped > 0 })
	before := srv.Output()
	var r0, r1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
	start := time.Now()
	time.Sleep(time.Second)
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
	took := time.Since(start)
	after := srv.Output()
	cpu := time.Duration(r1.Utime.Nano() - r0.Utime.Nano() + r1.Stime.Nano() - r0.Stime.Nano())
	t.Logf("in %v: %v of CPU; %d lines logged, %d dropped", took, cpu, after.Lines-before.Lines, after.Dropped-before.Dropped)
	if cpu > took/4 {
		t.Errorf("scdd spent %v of CPU in %v on a UAP's output", cpu, took)
	}
	if after.Lines-before.Lines < 50 || after.Dropped-before.Dropped < 10000 {
		t.Errorf("in %v: %d lines logged, %d dropped; want the rate's (100 a second) logged and the rest read and counted",
			took, after.Lines-before.Lines, after.Dropped-before.Dropped)
	}
	if n := strings.Count(logged.String(), "uap output over the rate"); n != 1 {
		t.Errorf("the dropping said to begin %d times", n)
	}
}

// skipOutput counts each line it drops once, the one under way when it
// began too when it was not counted yet, and says whether it stopped in
// the middle of a line (counted; its rest is to be skipped).
func TestSkippedOutputIsCounted(t *testing.T) {
	for _, c := range []struct {
		in     string
		inLine bool
		want   uint64
		cut    bool
	}{
		{"rest of a counted line\nline 2\nline 3\npart", true, 3, true},
		{"rest of a counted line\nline 2\nline 3\npart", false, 4, true},
		{"rest\nline 2\n", true, 1, false},
		{"\n", true, 0, false},
		{"", false, 0, false},
	} {
		s := &Server{output: newOutputBook(1, 1)}
		s.output.tokens = 0
		br := bufio.NewReaderSize(strings.NewReader(c.in), 16)
		cut, more := s.skipOutput(br, make([]byte, 64), c.inLine)
		if got := s.output.read().Dropped; got != c.want || cut != c.cut || more {
			t.Errorf("%q (in a line %v): dropped %d, cut %v, more %v; want %d, %v, false", c.in, c.inLine, got, cut, more, c.want, c.cut)
		}
	}
}
