package bench

import (
	"fmt"
	"testing"
	"time"
)

// sleeper starts a system of three processes that only sleep: a shell and
// two children of it.
func sleeper(t *testing.T, name string) *system {
	t.Helper()
	s, err := newSystem(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	if err := s.start("sleep.log", nil, "sh", "-c", "sleep 60 & sleep 60 & wait"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); len(treeOf(s)) < 3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d processes after 5 s, want 3", name, len(treeOf(s)))
		}
	}
	return s
}

func treeOf(s *system) []int { return treeIn(readStats(), s.Roots()) }

func TestHoldOthersStopsTheSystemsNotMeasured(t *testing.T) {
	a, b := sleeper(t, "a"), sleeper(t, "b")
	for _, measured := range []*system{a, b, a} {
		if err := holdOthers(measured); err != nil {
			t.Fatal(err)
		}
		stats := readStats()
		for _, s := range []*system{a, b} {
			for _, pid := range treeOf(s) {
				if st := stats[pid].State; stoppedState(st) != (s != measured) {
					t.Errorf("measuring %s: process %d of %s is in state %c", measured.Name, pid, s.Name, st)
				}
			}
		}
	}
	// b is stopped now. Stop ends it at once: stopped, its processes would
	// not act on SIGTERM, and Stop would wait 5 s for its SIGKILL.
	pids := treeOf(b)
	start := time.Now()
	b.Stop()
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Stop of a stopped system took %v", took.Round(time.Millisecond))
	}
	// Stop's SIGKILL of the process group is delivered as each process
	// next runs: give them the time a busy machine takes.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		stats, left := readStats(), ""
		for _, pid := range pids {
			if st, ok := stats[pid]; ok && st.State != 'Z' && st.State != 'X' {
				left += fmt.Sprintf(" %d (%c)", pid, st.State)
			}
		}
		if left == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes of b still there 5 s after Stop:%s", left)
		}
	}
}
