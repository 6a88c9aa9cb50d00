package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

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

// TestMisspeltCommand: a misspelt command gets a did-you-mean and a short
// usage, not the 60 lines of -h (issue 31 item 6), and needs no node.
func TestMisspeltCommand(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-c", t.TempDir(), "stauts"}, &stdout, &stderr); code != 2 {
		t.Errorf("scdctl stauts: exit %d, want 2", code)
	}
	out := stderr.String()
	if !strings.Contains(out, `unknown command "stauts" (did you mean status?)`) {
		t.Errorf("scdctl stauts says no did-you-mean:\n%s", out)
	}
	if n := strings.Count(out, "\n"); n > 5 || !strings.Contains(out, "scdctl -h") {
		t.Errorf("scdctl stauts prints %d lines, want at most 5 ending with a pointer to -h:\n%s", n, out)
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout: %q", stdout.String())
	}
}

// TestCommandsAreTheUsages: the short usage's list is every command the
// long usage describes, in its order.
func TestCommandsAreTheUsages(t *testing.T) {
	long := usage[strings.Index(usage, "Commands:"):strings.Index(usage, "\ncall and find")]
	var described []string
	for _, l := range strings.Split(long, "\n") {
		if f := strings.Fields(l); len(l) > 2 && l[2] != ' ' && len(f) > 0 && f[0] != "Commands:" {
			described = append(described, f[0])
		}
	}
	if !slices.Equal(described, commands) {
		t.Errorf("usage describes %v, commands lists %v", described, commands)
	}
}
