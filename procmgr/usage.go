package procmgr

import (
	"sync"
	"time"

	"tpsched/bpf"
)

// cpuWaitWindow is the shortest span the CPU guard measures over: long
// enough for a few time slices, short enough that a burst cannot start
// every process before the guard has looked.
const cpuWaitWindow = 20 * time.Millisecond

// usageBook keeps what the Meter measured of one server's processes: the
// running ones are read on demand, the ended ones were read once at exit
// and summed, so a group's totals never go back.
type usageBook struct {
	meter bpf.Meter // nil: nothing is measured

	mu      sync.Mutex
	live    map[int]struct{}
	retired bpf.Usage
	// The CPU guard's window.
	windowStart time.Time
	windowBase  bpf.Usage
	waitPct     int // over the last full window; -1 unknown
}

func newUsageBook(m bpf.Meter) *usageBook {
	return &usageBook{meter: m, live: map[int]struct{}{}, waitPct: -1}
}

func (b *usageBook) track(pid int) error {
	if b.meter == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.live[pid] = struct{}{}
	return b.meter.Track(pid)
}

// forget takes pid's last reading into the retired sum.
func (b *usageBook) forget(pid int) {
	if b.meter == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.live[pid]; ok {
		delete(b.live, pid)
		b.retired.Add(b.meter.Forget(pid))
	}
}

// total is the server's usage so far, ended processes included.
func (b *usageBook) total() bpf.Usage {
	if b.meter == nil {
		return bpf.Usage{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.totalLocked()
}

func (b *usageBook) totalLocked() bpf.Usage {
	u := b.retired
	for pid := range b.live {
		u.Add(b.meter.Read(pid))
	}
	return u
}

// cpuWait is the percent of the last window (at least cpuWaitWindow) that
// the server's processes, on average, spent runnable but waiting for a
// CPU; -1 when the meter cannot see run-queue wait.
//
// It is measured against wall-clock time, not against the time they ran:
// a process that sleeps on I/O and waits a few µs for a CPU after each
// wake-up has a high share of its short runs waiting, yet more processes
// would still help it. One that waits a third of all the time would not.
func (b *usageBook) cpuWait(now time.Time) int {
	if b.meter == nil {
		return -1
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	elapsed := now.Sub(b.windowStart)
	if elapsed < cpuWaitWindow {
		return b.waitPct
	}
	u := b.totalLocked()
	waited := u.Wait - b.windowBase.Wait
	switch {
	case b.windowStart.IsZero():
		// The first reading only opens the window.
	case !b.meter.Mechanism().Histogram && u.Wait == 0:
		b.waitPct = -1 // /proc without sched_info: wait is not known
	case len(b.live) == 0:
		b.waitPct = 0
	default:
		b.waitPct = int(min(100, 100*waited/(elapsed*time.Duration(len(b.live)))))
	}
	b.windowStart, b.windowBase = now, u
	return b.waitPct
}
