package uapcall

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestRunRoundTrip(t *testing.T) {
	start := time.Unix(1700000000, 123456789)
	r := Run{Group: "bench", Service: "echo", Payload: 4096, Start: start, End: start.Add(2 * time.Second)}
	got, err := ParseRun(r.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if got.Group != r.Group || got.Service != r.Service || got.Payload != r.Payload || !got.Start.Equal(r.Start) || !got.End.Equal(r.End) {
		t.Errorf("got %+v, want %+v", got, r)
	}
	for _, bad := range []string{
		"", "run1 bench echo 128 1 2 extra", "run0 bench echo 128 1 2", "run1 bench echo -1 1 2",
		"run1 bench echo 128 x 2", "run1 bench echo 128 5 4", // ends before it starts
	} {
		if _, err := ParseRun([]byte(bad)); err == nil {
			t.Errorf("ParseRun(%q) accepted", bad)
		}
	}
}

func TestOutcomeOf(t *testing.T) {
	req := Payload(128)
	for _, c := range []struct {
		code  uint32
		reply []byte
		want  Outcome
	}{
		{0, slices.Clone(req), OK},
		{0, req[:127], Bad},
		{0, append([]byte{0}, req[1:]...), Bad},
		{CodeServerBusy, nil, Refused},
		{CodeTimedOut, nil, TimedOut},
		{7, []byte("no such service"), Failed},
	} {
		if got := OutcomeOf(c.code, c.reply, req); got != c.want {
			t.Errorf("code %d reply of %d B: %d, want %d", c.code, len(c.reply), got, c.want)
		}
	}
	if OutcomeOf(0, nil, nil) != OK {
		t.Error("an empty echo of an empty request is not OK")
	}
}

// The tally follows the harness's closed loop: calls sent in the window
// count with their outcome, and throughput counts what was answered in
// the window, warm-up calls included.
func TestTallyWindowRules(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tl := Tally{Start: t0.Add(time.Second), End: t0.Add(3 * time.Second)}
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tl.Count(at(100), at(200), OK)       // warm-up, answered in the warm-up: nothing
	tl.Count(at(990), at(1010), OK)      // sent in the warm-up, answered in the window: throughput only
	tl.Count(at(995), at(1005), Refused) // warm-up refusal: nothing
	tl.Count(at(1000), at(1001), OK)     // the first measured call
	tl.Count(at(2000), at(2500), TimedOut)
	tl.Count(at(2500), at(2600), Refused)
	tl.Count(at(2600), at(2700), Failed)
	tl.Count(at(2700), at(2701), Bad)
	tl.Count(at(2999), at(3005), OK) // sent in the window, answered after it: latency, not throughput
	want := Summary{OK: 2, Refused: 1, Failed: 1, TimedOut: 1, Bad: 1, InWindow: 2}
	got := tl.Summary
	got.Hist = Histogram{}
	if got.OK != want.OK || got.Refused != want.Refused || got.Failed != want.Failed || got.TimedOut != want.TimedOut ||
		got.Bad != want.Bad || got.InWindow != want.InWindow {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if tl.Sent() != 6 {
		t.Errorf("sent %d, want 6", tl.Sent())
	}
	d := tl.Hist.Durations()
	if len(d) != 2 || !near(d[0], time.Millisecond) || !near(d[1], 6*time.Millisecond) {
		t.Errorf("latencies %v, want about [1ms 6ms]", d)
	}
}

func near(got, want time.Duration) bool {
	return math.Abs(float64(got-want)) <= float64(want)/64
}

func TestHistogramBuckets(t *testing.T) {
	// Buckets tile the line: each starts where the one before ends.
	next := uint64(0)
	for i := range 40 << subBits {
		low, width := bucketRange(i)
		if low != next {
			t.Fatalf("bucket %d starts at %d, want %d", i, low, next)
		}
		if bucketOf(low) != i || bucketOf(low+width-1) != i {
			t.Fatalf("bucket %d [%d, +%d) does not hold its own ends", i, low, width)
		}
		if low >= 128 && float64(width) > float64(low)/64 {
			t.Fatalf("bucket %d is %d wide at %d: over 1/64", i, width, low)
		}
		next = low + width
	}
	// Every value lands within 1/64 of its bucket's middle.
	for _, v := range []time.Duration{0, 1, 127, 128, 1000, 49 * time.Microsecond, 3*time.Millisecond + 7, 10 * time.Second} {
		var h Histogram
		h.Add(v)
		if got := h.Durations()[0]; v >= 128 && !near(got, v) || v < 128 && got != v {
			t.Errorf("%v comes back as %v", v, got)
		}
	}
}

func TestSummaryRoundTripAndMerge(t *testing.T) {
	var a, b Summary
	a.PID, a.OK, a.Refused, a.InWindow = 42, 3, 1, 3
	for _, d := range []time.Duration{50 * time.Microsecond, 50 * time.Microsecond, time.Millisecond} {
		a.Hist.Add(d)
	}
	got, err := ParseSummary(a.Append(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got.PID != 42 || got.OK != 3 || got.Refused != 1 || got.InWindow != 3 || got.Hist.Count() != 3 {
		t.Errorf("got %+v", got)
	}
	if !slices.Equal(got.Hist.Durations(), a.Hist.Durations()) {
		t.Errorf("histogram %v, want %v", got.Hist.Durations(), a.Hist.Durations())
	}
	b.OK = 1
	b.Hist.Add(20 * time.Microsecond)
	got.Hist.Merge(b.Hist)
	if d := got.Hist.Durations(); len(d) != 4 || !near(d[0], 20*time.Microsecond) || !near(d[3], time.Millisecond) {
		t.Errorf("merged %v", d)
	}
	// An empty summary (a caller that made no call in the window) parses too.
	if _, err := ParseSummary(Summary{PID: 1}.Append(nil)); err != nil {
		t.Errorf("empty summary: %v", err)
	}
	for _, bad := range []string{
		"", "pid=1 ok=1 refused=0 failed=0 timedout=0 bad=0 inwindow=1 hist=", // a call without its latency
		"pid=1 ok=0 refused=0 failed=0 timedout=0 bad=0 inwindow=0",                 // no histogram
		"pid=1 ok=0 refused=0 failed=0 timedout=0 inwindow=0 hist=",                 // no bad
		"pid=1 ok=0 refused=0 failed=0 timedout=0 bad=0 inwindow=0 hist= extra=1",   // unknown field
		"pid=1 pid=2 ok=0 refused=0 failed=0 timedout=0 bad=0 inwindow=0 hist=",     // twice
		"pid=1 ok=1 refused=0 failed=0 timedout=0 bad=0 inwindow=0 hist=99999999:1", // bucket out of range
		"pid=1 ok=1 refused=0 failed=0 timedout=0 bad=0 inwindow=0 hist=5-1",        // no bucket:count
		"pid=x ok=0 refused=0 failed=0 timedout=0 bad=0 inwindow=0 hist=",           // not a number
	} {
		if _, err := ParseSummary([]byte(bad)); err == nil {
			t.Errorf("ParseSummary(%q) accepted", bad)
		} else if !strings.HasPrefix(err.Error(), "uapcall: ") {
			t.Errorf("error %q lacks the package prefix", err)
		}
	}
}
