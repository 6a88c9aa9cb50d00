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
