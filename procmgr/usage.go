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
	last        CPUSample // of the last full window
}

// CPUSample is what the CPU guard saw of a server's processes over one
// window.
type CPUSample struct {
	// Wait is the percent of the processes' runnable time (running or
	// waiting for a CPU) spent waiting; -1 when the meter cannot see waits.
	Wait int
	// Busy is the runnable time per process, in percent of the window:
	// near 0 for a service that sleeps on I/O, 100 or more for one that
	// computes (threads add up).
	Busy int
	// Since is when the window began: a start the guard allowed counts as
	// seen once a window that began after it has ended.
	Since time.Time
}

func newUsageBook(m bpf.Meter) *usageBook {
	b := &usageBook{meter: m, live: map[int]struct{}{}, last: CPUSample{Wait: -1}}
	if m != nil && m.Mechanism().Waits {
		// Nothing has run yet: no wait, and a window open from now, so the
		// guard judges from the first start on.
		b.last, b.windowStart = CPUSample{Since: time.Now()}, time.Now()
	}
	return b
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

// read is pid's usage so far, if it is one of the server's running
// processes; zero otherwise.
func (b *usageBook) read(pid int) bpf.Usage {
	if b.meter == nil {
		return bpf.Usage{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.live[pid]; !ok {
		return bpf.Usage{}
	}
	return b.meter.Read(pid)
}

// lastSample is the reading of the last full window.
func (b *usageBook) lastSample() CPUSample {
	if b.meter == nil {
		return CPUSample{Wait: -1}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.last
}

// cpuSample is the CPU guard's reading: the last window of at least
// cpuWaitWindow, ending now if the previous one ended that long ago.
//
// The share waiting is taken of runnable time, not of wall-clock time, so
// that it does not depend on how many threads a UAP has; Busy tells a
// process that sleeps on I/O (and so waits a few µs after each wake-up, a
// large share of its short runs) from one that computes.
func (b *usageBook) cpuSample(now time.Time) CPUSample {
	if b.meter == nil {
		return CPUSample{Wait: -1}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	elapsed := now.Sub(b.windowStart)
	if elapsed < cpuWaitWindow {
		return b.last
	}
	u := b.totalLocked()
	ran, waited := u.OnCPU-b.windowBase.OnCPU, u.Wait-b.windowBase.Wait
	s := CPUSample{Wait: -1, Since: b.windowStart}
	switch {
	case !b.meter.Mechanism().Waits:
		// /proc without sched_info: waits are not known
	case ran+waited <= 0:
		s.Wait = 0
	default:
		s.Wait = int(100 * waited / (ran + waited))
		if n := len(b.live); n > 0 {
			s.Busy = int(100 * (ran + waited) / (elapsed * time.Duration(n)))
		}
	}
	b.last = s
	b.windowStart, b.windowBase = now, u
	return s
}
