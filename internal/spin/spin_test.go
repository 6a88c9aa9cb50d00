package spin

import (
	"runtime"
	"syscall"
	"testing"
	"time"
)

// Wall lasts at least d and spends it on the CPU, not asleep.
func TestWall(t *testing.T) {
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_THREAD, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	const d = 50 * time.Millisecond
	// One thread: RUSAGE_THREAD must see the loop.
	done := make(chan [2]time.Duration)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		c0, t0 := cpu(), time.Now()
		Wall(d)
		done <- [2]time.Duration{time.Since(t0), cpu() - c0}
	}()
	r := <-done
	if r[0] < d {
		t.Errorf("Wall(%v) returned after %v", d, r[0])
	}
	// On a shared machine the thread may wait for a CPU; a quarter of the
	// time on it still tells spinning from sleeping.
	if r[1] < d/4 {
		t.Errorf("Wall(%v) used %v of CPU, want most of it", d, r[1])
	}
	Wall(0)
	Wall(-time.Second)
}
