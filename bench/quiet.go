package bench

import (
	"context"
	"sync/atomic"
	"time"
)

// Quiet is how a run keeps other tenants of the machine out of its
// figures: before a run it waits (up to MaxWait) until the processes that
// are not the benchmark's used under Cores of CPU (and the hypervisor stole
// under Cores) over the last half second; a run whose window still had
// more is disturbed and, in the closed and open-loop grids, run again up
// to Retries times, the least disturbed attempt kept. The waits and the
// runs made again take at most Budget in a session; after that runs go
// ahead (and are marked disturbed), so a busy machine slows the session
// by Budget at most. Cores 0 turns this off.
type Quiet struct {
	Cores   float64
	MaxWait time.Duration
	Retries int
	Budget  time.Duration
	spent   *atomic.Int64 // of Budget, in nanoseconds, shared by the copies
}

// DefaultQuiet: on an idle machine the tenants measured here (the VM's
// agent, kdamond) use under 0.05 cores; 0.1 is 5% of two cores.
var DefaultQuiet = Quiet{Cores: 0.1, MaxWait: 10 * time.Second, Retries: 2, Budget: 10 * time.Minute}

// disturbed says whether a run's window had other tenants over the bound,
// or the harness, short of CPU, sampled less than minSampled of a window
// whose calls other processes counted.
func (q Quiet) disturbed(f Figures) bool {
	return q.Cores > 0 && f.OtherCPU+f.StealCPU >= q.Cores || f.Sampled > 0 && f.Sampled < minSampled
}

// minSampled is the least share of the calls' window a run's samples must
// cover to be kept undisturbed.
const minSampled = 0.9

// badness orders the attempts of a run, the least disturbed first: one
// whose samples covered too little of the window after any that covered
// enough, then by the other tenants' and the hypervisor's share.
func badness(f Figures) float64 {
	b := f.OtherCPU + f.StealCPU
	if f.Sampled > 0 && f.Sampled < minSampled {
		b += 1000
	}
	return b
}

// withBudget gives q a budget counter of its own, shared by its copies.
func (q Quiet) withBudget() Quiet {
	q.spent = new(atomic.Int64)
	return q
}

// left is what remains of the budget (all of it without a counter).
func (q Quiet) left() time.Duration {
	if q.spent == nil {
		return q.Budget
	}
	return q.Budget - time.Duration(q.spent.Load())
}

// spendRetry counts a run made again, which took took, against the
// budget: all of it but its wait for quiet, which counted itself (the
// budget had usedBefore spent when the run began). Counting the wait twice
// spent the budget at twice the rate and made the waits look longer than
// the session.
func (q Quiet) spendRetry(took, usedBefore time.Duration) {
	q.spend(max(took-(q.used()-usedBefore), 0))
}

// used is how much of the budget the session has spent (nothing without
// a counter).
func (q Quiet) used() time.Duration {
	if q.spent == nil {
		return 0
	}
	return time.Duration(q.spent.Load())
}

// budgetLeft is what the waits and retries may still spend: none when the
// bound is off (Cores 0) or spent.
func (q Quiet) budgetLeft() time.Duration {
	if q.Cores <= 0 {
		return 0
	}
	return max(q.left(), 0)
}

// spend counts d against the budget.
func (q Quiet) spend(d time.Duration) {
	if q.spent != nil {
		q.spent.Add(int64(d))
	}
}

// retry says whether a disturbed run may be run again: it was disturbed,
// retries remain, and so does the budget.
func (q Quiet) retry(f Figures, tries int) bool {
	return q.disturbed(f) && tries < q.Retries && q.left() > 0
}

// waitQuiet waits until the machine is quiet by q, ctx ends or q.MaxWait
// passes; it returns how long it waited and the other tenants' cores over
// the last half second.
func waitQuiet(ctx context.Context, q Quiet, peers []int) (waited time.Duration, other float64) {
	if q.Cores <= 0 || q.left() <= 0 {
		return 0, 0
	}
	const span = 500 * time.Millisecond
	start := time.Now()
	defer func() { q.spend(waited) }()
	prev := sampleCPU(nil, peers)
	_, stealPrev := machineCPU()
	for {
		if !sleepUntil(ctx, time.Now().Add(span)) {
			return time.Since(start), 0
		}
		cur := sampleCPU(nil, peers)
		_, steal := machineCPU()
		sp := splitCPU(prev, cur)
		other := sp.cores(sp.foreign) + (steal-stealPrev)/sp.elapsed.Seconds()
		if other < q.Cores || time.Since(start) >= min(q.MaxWait, q.left()) {
			return time.Since(start), other
		}
		prev, stealPrev = cur, steal
	}
}
