package local

import (
	"testing"
	"time"
)

func TestTimedOutMessage(t *testing.T) {
	cases := []struct {
		limit, watch time.Duration
		want         string
	}{
		{180 * time.Second, 180 * time.Second, "no answer within 3m0s (watch_time)"},
		{1000 * time.Millisecond, 180 * time.Second, "no answer within 1s (the caller's timeout)"},
		{42 * time.Millisecond, 0, "no answer within 42ms (the caller's timeout)"},
		{1499*time.Millisecond + 600*time.Microsecond, 0, "no answer within 1.5s (the caller's timeout)"},
		{251 * time.Millisecond, 0, "no answer within 250ms (the caller's timeout)"},
	}
	for _, tc := range cases {
		if got := timedOutMessage(tc.limit, tc.watch); got != tc.want {
			t.Errorf("timedOutMessage(%v, %v) = %q, want %q", tc.limit, tc.watch, got, tc.want)
		}
	}
}
