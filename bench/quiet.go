package bench

import (
	"context"
	"time"
)

// Quiet is how a run keeps other tenants of the machine out of its
// figures: before a run it waits (up to MaxWait) until the processes that
// are not the benchmark's used under Cores of CPU (and the hypervisor stole
// under Cores) over the last half second; a run whose window still had
// more is disturbed and, in the closed and open-loop grids, run again up
// to Retries times, the least disturbed attempt kept. Cores 0 turns this
// off.
type Quiet struct {
	Cores   float64
	MaxWait time.Duration
	Retries int
}

// DefaultQuiet: on an idle machine the tenants measured here (the VM's
// agent, kdamond) use under 0.05 cores; 0.1 is 5% of two cores.
var DefaultQuiet = Quiet{Cores: 0.1, MaxWait: 30 * time.Second, Retries: 2}

// disturbed says whether a run's window had other tenants over the bound.
func (q Quiet) disturbed(f Figures) bool {
	return q.Cores > 0 && f.OtherCPU+f.StealCPU >= q.Cores
}

// waitQuiet waits until the machine is quiet by q, ctx ends or q.MaxWait
// passes; it returns how long it waited and the other tenants' cores over
// the last half second.
func waitQuiet(ctx context.Context, q Quiet, peers []int) (time.Duration, float64) {
	if q.Cores <= 0 {
		return 0, 0
	}
	const span = 500 * time.Millisecond
	start := time.Now()
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
		if other < q.Cores || time.Since(start) >= q.MaxWait {
			return time.Since(start), other
		}
		prev, stealPrev = cur, steal
	}
}
