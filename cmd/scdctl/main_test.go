package main

import "testing"

// TestDropped: the cluster line says how many announces were dropped and
// why, not Go's map[] (issue 23, item 10).
func TestDropped(t *testing.T) {
	for _, c := range []struct {
		in   map[string]uint64
		want string
	}{
		{nil, "none dropped"},
		{map[string]uint64{"full": 0}, "none dropped"},
		{map[string]uint64{"unauthenticated": 2, "full": 1, "invalid": 0}, "3 dropped (full 1, unauthenticated 2)"},
	} {
		if got := dropped(c.in); got != c.want {
			t.Errorf("dropped(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}
