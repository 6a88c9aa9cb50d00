package shm

import (
	"os"
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

// maxSleep bounds every futex sleep so that closed flags are seen even if a
// wake-up is lost (for example when the waker died). A variable only so that
// a test can make a lost wake-up show as a stall.
var maxSleep = 100 * time.Millisecond

// futexWait sleeps while *addr == val, at most d.
func futexWait(addr *atomic.Uint32, val uint32, d time.Duration) {
	if d <= 0 {
		return
	}
	ts := unix.NsecToTimespec(int64(d))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWaitOp,
		uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes up to n sleepers on addr.
func futexWake(addr *atomic.Uint32, n int) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWakeOp,
		uintptr(n), 0, 0, 0)
}

// waitq is one futex word in shared memory with the counts that let wakers
// skip the syscall. Sleepers count themselves in waiters, load the word,
// look for work once more and only then sleep on the loaded value, so no
// wake-up is lost: every operation is sequentially consistent.
//
// wake is a wake-up in flight: the first waker sets it and makes the
// syscall; later wakers skip theirs until a sleeper clears it, on waking or
// before sleeping again. Without it every enqueue in the tens of
// microseconds between a FUTEX_WAKE and the sleeper running again made a
// syscall that woke nobody (a third of the scheduler's CPU at 64
// connections). A sleeper that finds more work than it takes passes the
// wake-up on (chain), so a burst still reaches every sleeper.
type waitq struct {
	word    atomic.Uint32
	waiters atomic.Uint32
	wake    atomic.Uint32
	_       [52]byte
}

// signal bumps the word and wakes one sleeper if any sleeps and no wake-up
// is in flight.
func (w *waitq) signal() {
	w.word.Add(1)
	if w.waiters.Load() != 0 && w.wake.CompareAndSwap(0, 1) {
		futexWake(&w.word, 1)
	}
}

// prepare counts the caller as a sleeper and returns the value to sleep on;
// the caller must look for work once more before sleep, and call done if it
// found some.
func (w *waitq) prepare() uint32 {
	w.waiters.Add(1)
	w.wake.Store(0)
	return w.word.Load()
}

// sleep waits while the word is still v, at most d, then uncounts the
// caller.
func (w *waitq) sleep(v uint32, d time.Duration) {
	futexWait(&w.word, v, d)
	w.done()
}

// done uncounts a sleeper that did not sleep, or woke.
func (w *waitq) done() {
	w.waiters.Add(^uint32(0))
	w.wake.Store(0)
}

// wakeAll wakes every sleeper (closing, stopping).
func (w *waitq) wakeAll() {
	w.word.Add(1)
	futexWake(&w.word, 1<<30)
}

// spinMax is the upper bound of the adaptive spin, from TPSCHED_SPIN_US.
var spinMax = spinMaxFromEnv(os.Getenv("TPSCHED_SPIN_US"))

const defaultSpin = 10 * time.Microsecond

func spinMaxFromEnv(v string) time.Duration {
	if v == "" {
		return defaultSpin
	}
	us, err := strconv.Atoi(v)
	if err != nil || us < 0 {
		return defaultSpin
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
type spinner struct {
	budget, max time.Duration
}

func newSpinner() spinner {
	return spinner{budget: spinMax / 4, max: spinMax}
}

// spin polls ready until it reports true or the budget, counted from start,
// is spent.
func (sp *spinner) spin(start time.Time, ready func() bool) bool {
	if sp.budget <= 0 {
		return false
	}
	for i := 1; ; i++ {
		if ready() {
			return true
		}
		if i%16 == 0 && time.Since(start) >= sp.budget {
			return false
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
