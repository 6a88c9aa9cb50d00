package wlm

import (
	"math"
	"testing"
	"time"
)

func TestBucketOf(t *testing.T) {
	cases := []struct {
		rt, target time.Duration
		want       int
	}{
		{0, ms(200), 0},
		{ms(100), ms(200), 0},              // exactly 50%: the first bucket
		{ms(100) + 1, ms(200), 1},          // just over 50%
		{ms(120), ms(200), 1},              // 60%
		{ms(200), ms(200), 5},              // exactly the goal: the 100% bucket
		{ms(200) + 1, ms(200), 6},          // a nanosecond over: 110%
		{ms(300), ms(200), 10},             // 150%
		{ms(301), ms(200), 11},             // (150%, 200%]
		{ms(800), ms(200), 12},             // 400%
		{ms(801), ms(200), 13},             // beyond 400%
		{time.Hour, ms(1), NumBuckets - 1}, // far beyond, no overflow
		{-5, ms(200), 0},                   // a clock that went back is no response time at all
		{ms(5), 0, NumBuckets - 1},         // no target: nothing is within it
	}
	for _, tc := range cases {
		if got := BucketOf(tc.rt, tc.target); got != tc.want {
			t.Errorf("BucketOf(%v, %v) = %d, want %d", tc.rt, tc.target, got, tc.want)
		}
	}
	if BucketLimit(0) != 50 || BucketLimit(5) != 100 || BucketLimit(12) != 400 || BucketLimit(13) != 0 || BucketLimit(-1) != 0 {
		t.Error("BucketLimit")
	}
	if NumBuckets != 14 {
		t.Errorf("NumBuckets %d, want 14 (50..150 by 10, 200, 400, beyond)", NumBuckets)
	}
}

// sampleOf records calls with the given response times against goal.
func sampleOf(goal Goal, resp ...int) Sample {
	var s Sample
	for _, r := range resp {
		s.Record(ms(r), 0, goal)
	}
	return s
}

func repeat(n, v int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func TestPI(t *testing.T) {
	g90 := pct(90, 200)
	cases := []struct {
		name string
		goal Goal
		s    Sample
		want float64
		ok   bool
	}{
		{"no calls", g90, Sample{}, 0, false},
		{"average met", avg(100), sampleOf(avg(100), 50, 100), 0.75, true},
		{"average missed", avg(100), sampleOf(avg(100), 100, 200), 1.5, true},
		{"average exactly", avg(100), sampleOf(avg(100), 100, 100), 1, true},
		// 90% within 200ms: 9 of 10 calls at 100ms: the 90th call is in the
		// 50% bucket.
		{"percentile, 90% in the 50% bucket", g90, sampleOf(g90, append(repeat(9, 100), 1000)...), 0.5, true},
		// 8 of 10 fast, 2 at 230ms (120%): the 90% is reached at 120%.
		{"percentile, 90% reached at 120%", g90, sampleOf(g90, append(repeat(8, 100), 230, 230)...), 1.2, true},
		// exactly 90% at the goal.
		{"percentile, 90% at 100%", g90, sampleOf(g90, append(repeat(9, 200), 5000)...), 1, true},
		// 89 of 100 within the goal is not 90%: the 90th call is at 250ms.
		{"percentile, 89% within", g90, sampleOf(g90, append(append(repeat(89, 200), 250), repeat(10, 5000)...)...), 1.3, true},
		{"percentile, beyond 400%", g90, sampleOf(g90, repeat(10, 900)...), PIBeyond, true},
		{"buckets that do not add up", g90, Sample{Calls: 3}, PIBeyond, true},
	}
	for _, tc := range cases {
		got, ok := PI(tc.goal, tc.s)
		if ok != tc.ok || math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: PI = %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

func TestWithinGoal(t *testing.T) {
	g := pct(50, 100)
	s := sampleOf(g, 10, 100, 101, 1000)
	if got, ok := WithinGoal(s); !ok || got != 0.5 {
		t.Errorf("WithinGoal = %v, %v; want 0.5", got, ok)
	}
	if _, ok := WithinGoal(Sample{}); ok {
		t.Error("WithinGoal of nothing")
	}
}

func TestRecordSplitsQueueAndService(t *testing.T) {
	var s Sample
	g := avg(100)
	s.Record(ms(30), ms(10), g)
	s.Record(ms(50), ms(80), g) // a queue time beyond the response is the response
	s.Record(ms(20), -ms(5), g) // a negative queue time is none
	if s.Calls != 3 || s.Response != ms(100) || s.Queue != ms(60) || s.Service != ms(40) {
		t.Errorf("sample %+v", s)
	}
	if s.Average(s.Queue) != ms(20) || (&Sample{}).Average(time.Second) != 0 {
		t.Error("Average")
	}
}

func TestWindow(t *testing.T) {
	w := NewWindow(3)
	for i := 1; i <= 5; i++ {
		w.Push(Sample{Calls: uint64(i), CPU: time.Duration(i)})
	}
	if s := w.Sum(); s.Calls != 3+4+5 || s.CPU != 12 {
		t.Errorf("window of the last 3 = %+v, want 12 calls", s)
	}
	if w.Last().Calls != 5 {
		t.Errorf("last = %+v", w.Last())
	}
	one := NewWindow(0)
	one.Push(Sample{Calls: 7})
	one.Push(Sample{Calls: 2})
	if one.Sum().Calls != 2 || one.Last().Calls != 2 {
		t.Error("a window of one interval")
	}
}
