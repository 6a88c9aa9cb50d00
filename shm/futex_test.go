package shm

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A wait that keeps its P must not hold off a stop-the-world: the runtime's
// preemption signal ends it with EINTR. Were it not so, the collection below
// would wait out the whole second (and a wait with no timeout, which the
// kernel restarts after the signal, would hang the test binary).
func TestRawWaitLetsTheCollectorStopTheWorld(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("GOMAXPROCS 1: waits go through the runtime")
	}
	var word atomic.Uint32
	got := make(chan unix.Errno, 1)
	go func() { got <- futexWaitRaw(&word, 0, time.Second) }()
	time.Sleep(20 * time.Millisecond) // asleep in the kernel by now
	start := time.Now()
	runtime.GC()
	took := time.Since(start)
	word.Add(1)
	futexWake(&word, 1)
	if errno := <-got; errno == unix.ETIMEDOUT {
		t.Errorf("the raw wait ran to its timeout (%v): no signal ended it", errno)
	}
	if took > 500*time.Millisecond {
		t.Errorf("a collection took %v while a goroutine waited raw: the wait held off the stop-the-world", took)
	}
}

// futexWait returns when woken, whether or not the wake came within the raw
// part of the wait.
func TestFutexWaitWakes(t *testing.T) {
	for _, after := range []time.Duration{time.Millisecond, rawWaitMax + 20*time.Millisecond} {
		var word atomic.Uint32
		done := make(chan time.Duration, 1)
		start := time.Now()
		go func() { futexWait(&word, 0, 5*time.Second); done <- time.Since(start) }()
		time.Sleep(after)
		word.Add(1)
		futexWake(&word, 1)
		select {
		case took := <-done:
			if took > 3*time.Second {
				t.Errorf("woken after %v, the wait returned after %v", after, took)
			}
		case <-time.After(4 * time.Second):
			t.Fatalf("woken after %v, the wait did not return", after)
		}
	}
}
