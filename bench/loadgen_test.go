package bench

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

func TestIntendedSchedule(t *testing.T) {
	start := time.Unix(1000, 0)
	for _, tc := range []struct {
		rate float64
		i    int64
		want time.Duration
	}{
		{1000, 0, 0},
		{1000, 1, time.Millisecond},
		{1000, 2500, 2500 * time.Millisecond},
		{3, 1, 333333333},
		{16000, 16000, time.Second},
	} {
		if got := intended(start, tc.rate, tc.i).Sub(start); got != tc.want {
			t.Errorf("rate %v call %d: due at +%v, want +%v", tc.rate, tc.i, got, tc.want)
		}
	}
}

// fakeCaller answers after a fixed service time, or refuses every n-th call.
type fakeCaller struct {
	service time.Duration
	refuse  int
	n       *atomic.Int64
}

func (f fakeCaller) Call(p []byte, deadline time.Time) (outcome, error) {
	k := f.n.Add(1)
	if f.refuse > 0 && k%int64(f.refuse) == 0 {
		return callRefused, nil
	}
	time.Sleep(f.service)
	return callOK, nil
}

func (fakeCaller) Close() error { return nil }

func TestClosedLoopCountsTheWindow(t *testing.T) {
	var n atomic.Int64
	var windows []bool
	r, err := closedLoop(context.Background(), load{
		Dial:     func() caller { return fakeCaller{service: time.Millisecond, refuse: 4, n: &n} },
		Conns:    4,
		Warmup:   20 * time.Millisecond,
		Duration: 200 * time.Millisecond,
		Window:   func(b bool) { windows = append(windows, b) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(windows) != 2 || !windows[0] || windows[1] {
		t.Errorf("window calls %v, want [true false]", windows)
	}
	// 4 connections of ~1 ms calls for 200 ms: about 800 calls, a quarter refused.
	total := r.Calls + r.Refused
	if total < 200 || total > 1000 {
		t.Errorf("%d calls in the window", total)
	}
	if r.Refused == 0 || r.Refused > total/2 {
		t.Errorf("%d of %d refused, want about a quarter", r.Refused, total)
	}
	if r.Latency.P50 < time.Millisecond {
		t.Errorf("p50 %v below the service time", r.Latency.P50)
	}
}

// An open loop faster than the server must show the queue: with one
// connection and 2 ms calls due every 1 ms, the n-th call waits about n ms,
// which a closed loop (or an open loop timing from the send) would hide.
func TestOpenLoopMeasuresFromTheIntendedTime(t *testing.T) {
	if testing.Short() {
		t.Skip("takes half a second")
	}
	var n atomic.Int64
	r, err := openLoop(context.Background(), load{
		Dial:     func() caller { return fakeCaller{service: 2 * time.Millisecond, n: &n} },
		Conns:    1,
		Duration: 300 * time.Millisecond,
		Rate:     1000,
		Timeout:  5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.Offered < 290 || r.Offered > 310 {
		t.Errorf("%d calls due in 300 ms at 1000/s", r.Offered)
	}
	// The last calls served waited about as long as the run had lasted.
	if r.Latency.Max < 100*time.Millisecond {
		t.Errorf("max latency %v: the queue behind the slow server is hidden", r.Latency.Max)
	}
	if r.Throughput > 600 {
		t.Errorf("throughput %v/s exceeds what a 2 ms server can do", r.Throughput)
	}
}

func TestOpenLoopTimesOutCallsThatWaitedTooLong(t *testing.T) {
	var n atomic.Int64
	r, err := openLoop(context.Background(), load{
		Dial:     func() caller { return fakeCaller{service: 5 * time.Millisecond, n: &n} },
		Conns:    1,
		Duration: 200 * time.Millisecond,
		Rate:     1000,
		Timeout:  20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.TimedOut == 0 {
		t.Errorf("no call timed out: %+v", r)
	}
	if r.Latency.Max > 20*time.Millisecond {
		t.Errorf("an admitted call took %v, beyond the 20 ms timeout", r.Latency.Max)
	}
}
