package shm

import (
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Futex operations without FUTEX_PRIVATE_FLAG: the words live in a MAP_SHARED
// memfd mapping and are waited on and woken from different processes (and, in
// tests, from two mappings of the same memfd in one process); the kernel keys
// shared futexes by inode and offset.
const (
	futexWaitOp = 0 // FUTEX_WAIT
	futexWakeOp = 1 // FUTEX_WAKE
)

// maxSleep bounds every sleep so that a flag is seen even if a wake-up is
// lost (a hostile UAP can swallow its own). A variable only so that a test
// can make a lost wake-up show as a stall.
var maxSleep = 100 * time.Millisecond

// futexWait sleeps while *addr == val, at most d.
//
// While the process's waits are short (rawWaits, below), the first few
// milliseconds keep the goroutine's P (a raw system call,
// which the Go runtime does not see). Through syscall.Syscall the runtime
// marks the P as in a system call; in a UAP whose other Ps are idle that
// wakes sysmon from its deep sleep, sysmon hands the P to another thread,
// which finds nothing to run and sleeps again: three context switches for
// one wait where the futex itself costs one (a perf sched trace of a local
// call showed the pair at every wait of both UAPs). The raw wait is
// bounded by rawWaitMax; a signal (sysmon's preemption, or a
// stop-the-world for the garbage collector) may end it early with EINTR,
// and the caller looks again. With GOMAXPROCS 1 the P is the only one, and
// other goroutines of the UAP would wait for it: then every wait goes
// through the runtime.
//
// Long waits go through the runtime from their start, and so does every
// wait of a process whose waits are long (an idle process, or a caller
// whose calls queue behind many others). A raw wait while sysmon polls
// fast is what made 64 caller UAPs a cliff (issue 28): a wait through the
// runtime that outlasts sysmon's 10 ms retake lets sysmon sleep deeply,
// its end wakes sysmon with its poll delay reset to 20 us, and if the
// goroutine then waits raw, holding its P, sysmon polls every 20 us for
// about 50 rounds, each round sending the goroutine, which has not been
// through the scheduler for more than 10 ms, a preemption signal that wakes
// its thread (figures in docs/ARCHITECTURE.md, "Issue 28 item 1"). Through
// the runtime, sysmon takes the P of the waiting goroutine at its first
// round and sleeps deeply again.
func futexWait(addr *atomic.Uint32, val uint32, d time.Duration) {
	if d <= 0 {
		return
	}
	start := time.Now()
	if runtime.GOMAXPROCS(0) > 1 && rawWaits.Load() {
		r := min(d, rawWaitMax)
		switch futexWaitRaw(addr, val, r) {
		case unix.ETIMEDOUT:
			// Long after all: the rest through the runtime, and so
			// the next waits, until short ones bring the estimate down.
			rawWaits.Store(false)
			waitEstimate.Store(max(waitEstimate.Load(), int64(rawWaitMax)))
			if d == r {
				return
			}
			d -= r
		case unix.EINTR:
			return // a signal: the caller looks again
		default:
			learnWait(time.Since(start)) // woken, or the word moved
			return
		}
	}
	ts := unix.NsecToTimespec(int64(d))
	_, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWaitOp,
		uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
	if errno != unix.EINTR {
		learnWait(time.Since(start))
	}
}

// waitEstimate is the process's expected futex wait (nanoseconds), a
// moving average of its waits, each counted at most longWait; rawWaits
// says whether its waits start raw: from when the estimate falls under
// rawWaitMax/2 until it rises over 3/4 of it or a raw wait times out (a
// margin, so that a process on the edge does not switch at every wait).
// Goroutines waiting at once may overwrite each other's updates: an
// estimate, not an account.
var (
	waitEstimate atomic.Int64
	rawWaits     atomic.Bool
)

// longWait caps a wait's weight in waitEstimate: an idle process's 100 ms
// timeouts would otherwise hold it long after its waits turned short.
const longWait = 4 * rawWaitMax

// learnWait records a wait that lasted w and switches between raw waits
// and waits through the runtime.
func learnWait(w time.Duration) {
	w = min(w, longWait)
	e := waitEstimate.Load()
	e += (int64(w) - e) / 4
	waitEstimate.Store(e)
	switch {
	case e > int64(rawWaitMax)*3/4 && rawWaits.Load():
		rawWaits.Store(false)
	case e < int64(rawWaitMax)/2 && !rawWaits.Load():
		rawWaits.Store(true)
		// Through the scheduler once before the first raw wait: the
		// waits through the runtime left the goroutine, in sysmon's
		// eyes, running for as long as the process has waited, and
		// sysmon, just woken by this wait's end and polling every
		// 20 us, would signal it at every round.
		runtime.Gosched()
	}
}

// rawWaitMax bounds a wait that keeps its P: well under sysmon's 10 ms
// forced preemption, and longer than a call's round trip on a busy node.
const rawWaitMax = 5 * time.Millisecond

// futexWaitRaw is FUTEX_WAIT as a raw system call, returning its errno.
func futexWaitRaw(addr *atomic.Uint32, val uint32, d time.Duration) unix.Errno {
	ts := unix.NsecToTimespec(int64(d))
	_, _, errno := unix.RawSyscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWaitOp,
		uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
	return errno
}

// sleepOn sleeps on the futex word wake, at most d, unless ready: it says
// so in sleeping first and looks at ready once more after that, so a
// wake-up sent between the caller's last look and the announcement is not
// lost (the waker wakes only those that announced).
func sleepOn(wake, sleeping *atomic.Uint32, ready func() bool, d time.Duration) {
	w := wake.Load()
	sleeping.Store(1)
	if !ready() {
		futexWait(wake, w, d)
	}
	sleeping.Store(0)
}

// futexWake wakes up to n sleepers on addr.
func futexWake(addr *atomic.Uint32, n int) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWakeOp,
		uintptr(n), 0, 0, 0)
}

// spinMax is the upper bound of a UAP's adaptive spin, from
// TPSCHED_SPIN_US; readerSpinMax the reader's, from TPSCHED_READER_SPIN_US.
var (
	spinMax       = spinMaxFromEnv(os.Getenv("TPSCHED_SPIN_US"), defaultSpin)
	readerSpinMax = spinMaxFromEnv(os.Getenv("TPSCHED_READER_SPIN_US"), defaultReaderSpin)
)

const (
	defaultSpin       = 10 * time.Microsecond
	defaultReaderSpin = 100 * time.Microsecond
)

func spinMaxFromEnv(v string, def time.Duration) time.Duration {
	if v == "" {
		return def
	}
	us, err := strconv.Atoi(v)
	if err != nil || us < 0 {
		return def
	}
	return time.Duration(min(us, 1000)) * time.Microsecond
}

// spinner is one consumer's adaptive spin budget: it doubles when spinning
// found work and halves when work came only after a futex sleep (or not at
// all), between max/16 and max; max 0 never spins. Not safe for concurrent use
// (one per consumer).
//
// Measured on the 2-vCPU development VM (ping-pong of one request at a time):
// a bound of 0..20 µs gives 9-13 µs round trips (each hand-off pays a futex
// wake-up), 50 µs gives ~1.5 µs (both sides stay on CPU). A rule that also
// grew the budget after short sleeps oscillated and reached 35-58 µs at
// 10-20 µs bounds, so only spin successes grow it.
//
// A spin that finds the process was preempted in it (a gap between two of
// its looks at the clock) stops, and the spinner does not spin again for
// spinQuiet: the CPUs are oversubscribed, and a process that spins there
// takes the CPU the woken side, or anything else, needs. Five callers on
// lanes and their five callees, each spinning between calls, kept ten
// tasks runnable on two CPUs; scdd's dispatcher then went 1.6 s without a
// look (2026-12-06, docs/ARCHITECTURE.md "Lanes").
type spinner struct {
	budget, max time.Duration
	quiet       time.Time // no spin before
}

func newSpinner(max time.Duration) spinner {
	return spinner{budget: max / 4, max: max}
}

const (
	// preemptedGap is a gap between two looks at the clock in a spin (16
	// polls, well under a microsecond) that only a preemption (or a page
	// fault) makes.
	preemptedGap = 50 * time.Microsecond
	// spinQuiet is how long a spinner preempted in a spin does not spin.
	spinQuiet = 20 * time.Millisecond
)

// spin polls ready until it reports true or the budget, counted from start,
// is spent; false at once within spinQuiet of a spin that was preempted.
func (sp *spinner) spin(start time.Time, ready func() bool) bool {
	if sp.budget <= 0 || start.Before(sp.quiet) {
		return false
	}
	last := time.Now()
	for i := 1; ; i++ {
		if ready() {
			return true
		}
		if i%16 == 0 {
			now := time.Now()
			if now.Sub(last) > preemptedGap {
				sp.quiet = now.Add(spinQuiet)
				return false
			}
			if now.Sub(start) >= sp.budget {
				return false
			}
			last = now
		}
	}
}

// learn records that work came after waited (negative: it never came).
func (sp *spinner) learn(waited time.Duration) {
	if waited >= 0 && waited <= sp.budget {
		sp.budget = min(sp.max, 2*sp.budget+250*time.Nanosecond)
	} else {
		sp.budget = max(sp.max/16, sp.budget/2)
	}
}
