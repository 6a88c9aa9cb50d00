package bench

import (
	"testing"
	"time"
)

// TestQuietBudget: retries stop when the session's budget is spent, and
// copies of a Quiet share one budget.
func TestQuietBudget(t *testing.T) {
	q := Quiet{Cores: 0.1, Retries: 2, Budget: time.Minute}.withBudget()
	busy := Figures{OtherCPU: 0.5}
	if !q.retry(busy, 0) || !q.retry(busy, 1) || q.retry(busy, 2) {
		t.Error("retries not bounded by Retries")
	}
	if q.retry(Figures{}, 0) {
		t.Error("a quiet run retried")
	}
	copied := q
	copied.spend(time.Minute)
	if q.left() > 0 || q.retry(busy, 0) {
		t.Errorf("budget left %v after a copy spent it all", q.left())
	}
	if w, _ := waitQuiet(t.Context(), q, nil); w != 0 {
		t.Errorf("waited %v with no budget left", w)
	}
}

func TestQuietDisturbed(t *testing.T) {
	q := Quiet{Cores: 0.1}
	for _, c := range []struct {
		other, steal float64
		want         bool
	}{{0, 0, false}, {0.05, 0.04, false}, {0.08, 0.02, true}, {0.5, 0, true}} {
		if got := q.disturbed(Figures{OtherCPU: c.other, StealCPU: c.steal}); got != c.want {
			t.Errorf("other %.2f steal %.2f: disturbed %v, want %v", c.other, c.steal, got, c.want)
		}
	}
	if (Quiet{}).disturbed(Figures{OtherCPU: 2}) {
		t.Error("a zero Quiet (off) called a run disturbed")
	}
}

// A run made again says which attempt's figures it keeps (issue 23,
// item 9: the log said "disturbed ... again" and then printed figures that
// were the first attempt's without saying so).
func TestKeptNote(t *testing.T) {
	for _, c := range []struct {
		kept, attempts int
		disturbed      bool
		want           string
	}{
		{1, 1, false, ""},
		{1, 3, false, " (attempt 1 of 3 kept: the least disturbed)"},
		{2, 3, true, " (attempt 2 of 3 kept: the least disturbed, still disturbed)"},
	} {
		if got := keptNote(c.kept, c.attempts, c.disturbed); got != c.want {
			t.Errorf("keptNote(%d, %d, %v) = %q, want %q", c.kept, c.attempts, c.disturbed, got, c.want)
		}
	}
}

// A run made again spends the budget once: its wait for quiet counted
// itself, the rest of its time is added (issue 23, item 9: the wait was
// counted twice, so the budget went at twice the rate and the log said
// 10m0s of 6m32s went to waiting).
func TestSpendRetry(t *testing.T) {
	q := Quiet{Cores: 0.1, Budget: time.Minute}.withBudget()
	q.spend(3 * time.Second) // earlier waits
	before := q.used()
	q.spend(5 * time.Second) // the retry's own wait for quiet, inside it
	q.spendRetry(7*time.Second, before)
	if got := q.used(); got != 10*time.Second {
		t.Errorf("used %v after a 7 s retry of which 5 s waiting, on 3 s: want 10s", got)
	}
	if left := q.budgetLeft(); left != 50*time.Second {
		t.Errorf("budget left %v, want 50s", left)
	}
}
