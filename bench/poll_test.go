package bench

import (
	"context"
	"testing"
	"time"
)

func TestPollKeepsSuccessfulReadingsInOrder(t *testing.T) {
	n := 0
	stop := poll(context.Background(), time.Millisecond, func() (int, bool) {
		n++
		return n, n%2 == 1 // every other reading fails
	})
	time.Sleep(30 * time.Millisecond)
	seen := stop()
	if len(seen) < 3 {
		t.Fatalf("%d readings in 30 ms at 1 ms", len(seen))
	}
	for i, s := range seen {
		if s.V != 2*i+1 {
			t.Fatalf("reading %d is %d: want the odd ones only, in order", i, s.V)
		}
		if i > 0 && s.At.Before(seen[i-1].At) {
			t.Fatalf("readings out of time order at %d", i)
		}
	}
	if after := len(stop()); after != len(seen) {
		t.Errorf("stop called twice gave %d then %d readings", len(seen), after)
	}
}

func TestGiven(t *testing.T) {
	for _, tc := range []struct {
		flag  time.Duration
		quick bool
		want  time.Duration
	}{{0, false, 10}, {0, true, 2}, {7, false, 7}, {7, true, 7}, {-1, true, 2}} {
		if got := given(tc.flag, 10, 2, tc.quick); got != tc.want {
			t.Errorf("given(%v, 10, 2, %v) = %v, want %v", tc.flag, tc.quick, got, tc.want)
		}
	}
}
