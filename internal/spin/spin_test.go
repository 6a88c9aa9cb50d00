package spin

import (
	"fmt"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// schedstat is the calling thread's time on a CPU and time runnable but
// waiting for one (/proc/thread-self/schedstat, nanoseconds).
func schedstat() (run, wait time.Duration, err error) {
	b, err := os.ReadFile("/proc/thread-self/schedstat")
	if err != nil {
		return 0, 0, err
	}
	var r, w, n int64
	if _, err := fmt.Sscan(string(b), &r, &w, &n); err != nil {
		return 0, 0, err
	}
	return time.Duration(r), time.Duration(w), nil
}

// Wall lasts at least d and spends it on the CPU, not asleep: the thread
// is on a CPU or waiting for one (runnable) for nearly all of d, however
// busy the machine is; a sleeping loop would be neither.
func TestWall(t *testing.T) {
	const d = 50 * time.Millisecond
	type result struct {
		wall, cpu, runnable time.Duration
		err                 error
	}
	// One thread: the thread's own counters must see the loop.
	done := make(chan result)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var ru0, ru1 syscall.Rusage
		r0, w0, err := schedstat()
		_ = syscall.Getrusage(syscall.RUSAGE_THREAD, &ru0)
		t0 := time.Now()
		Wall(d)
		wall := time.Since(t0)
		r1, w1, err1 := schedstat()
		_ = syscall.Getrusage(syscall.RUSAGE_THREAD, &ru1)
		cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
		if err == nil {
			err = err1
		}
		done <- result{wall, cpu, (r1 - r0) + (w1 - w0), err}
	}()
	r := <-done
	if r.wall < d {
		t.Errorf("Wall(%v) returned after %v", d, r.wall)
	}
	if r.err != nil {
		// No schedstat (CONFIG_SCHED_INFO off): CPU time alone, with the
		// margin a shared machine needs.
		t.Logf("no schedstat (%v): judging by CPU time", r.err)
		if r.cpu < d/10 {
			t.Errorf("Wall(%v) used %v of CPU in %v, want a good part of it", d, r.cpu, r.wall)
		}
	} else if r.runnable < r.wall*8/10 {
		t.Errorf("Wall(%v): the thread was on a CPU or waiting for one %v of its %v (CPU %v): it slept", d, r.runnable, r.wall, r.cpu)
	}
	t.Logf("Wall(%v): %v wall, %v CPU, %v on a CPU or runnable", d, r.wall, r.cpu, r.runnable)
	Wall(0)
	Wall(-time.Second)
}

// The measure tells sleeping from spinning: a thread that sleeps for d is
// runnable for little of it.
func TestSchedstatSeesSleep(t *testing.T) {
	done := make(chan [3]time.Duration)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		r0, w0, err := schedstat()
		if err != nil {
			done <- [3]time.Duration{-1}
			return
		}
		t0 := time.Now()
		time.Sleep(50 * time.Millisecond)
		wall := time.Since(t0)
		r1, w1, _ := schedstat()
		done <- [3]time.Duration{0, wall, (r1 - r0) + (w1 - w0)}
	}()
	r := <-done
	if r[0] < 0 {
		t.Skip("no /proc/thread-self/schedstat here")
	}
	if r[2] >= r[1]*8/10 {
		t.Errorf("a 50ms sleep counted %v of %v on a CPU or runnable: the measure cannot tell sleep from work", r[2], r[1])
	}
}
