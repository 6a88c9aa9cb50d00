package bench

import (
	"context"
	"errors"
	"io"
	"strings"
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

func TestInterleaved(t *testing.T) {
	names := []string{"a", "b", "c"}
	var order []string
	ran := map[int]int{}
	skipped := map[string]string{}
	errs, err := interleaved(context.Background(), io.Discard, nil, 0, names, 3, true, skipped, func(r, i int) (error, error) {
		order = append(order, names[i])
		switch {
		case names[i] == "b":
			return errors.New("b will not start"), nil
		case names[i] == "c" && r == 1:
			return nil, errors.New("c broke in run 2")
		}
		ran[i]++
		return nil, nil
	}, func(i int) bool { return ran[i] > 0 })
	if err != nil {
		t.Fatal(err)
	}
	// Round 1: a b c. Round 2 rotates to b c a and reverses that to
	// b a c: b is gone, c fails. Round 3: only a is left.
	if got := strings.Join(order, " "); got != "a b c a c a" {
		t.Errorf("order %q, want %q", got, "a b c a c a")
	}
	if skipped["b"] != "b will not start" || errs[2] != "c broke in run 2" || ran[2] != 1 {
		t.Errorf("skipped %v, errs %q, c ran %d", skipped, errs, ran[2])
	}
	if _, ok := skipped["c"]; ok {
		t.Error("c had a good run but was reported as skipped")
	}
}
