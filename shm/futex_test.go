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

// A process's waits start raw only while they are short: short waits turn
// raw waits on, one wait on the edge does not turn them off, long waits
// and a raw wait that times out do (issue 28: a caller whose calls queue
// for tens of milliseconds must wait through the runtime).
func TestRawWaitsFollowTheWaits(t *testing.T) {
	defer func(e int64, r bool) { waitEstimate.Store(e); rawWaits.Store(r) }(waitEstimate.Load(), rawWaits.Load())
	waitEstimate.Store(int64(longWait))
	rawWaits.Store(false)
	n := 0
	for ; !rawWaits.Load() && n < 50; n++ {
		learnWait(100 * time.Microsecond)
	}
	if n < 3 || n > 12 {
		t.Fatalf("raw waits on after %d short waits, want a few (3-12)", n)
	}
	learnWait(rawWaitMax * 3 / 5)
	if !rawWaits.Load() {
		t.Fatal("one wait of 3/5 rawWaitMax turned raw waits off")
	}
	for n = 0; rawWaits.Load() && n < 50; n++ {
		learnWait(20 * time.Millisecond)
	}
	if n > 2 {
		t.Errorf("raw waits still on after %d waits of 20 ms", n)
	}

	if runtime.GOMAXPROCS(0) < 2 {
		return // every wait goes through the runtime
	}
	waitEstimate.Store(0)
	rawWaits.Store(true)
	var word atomic.Uint32
	for i := 0; i < 3 && rawWaits.Load(); i++ { // again if a signal ended it early
		futexWait(&word, 0, rawWaitMax+time.Millisecond) // nobody wakes it
	}
	if rawWaits.Load() {
		t.Error("a raw wait timed out and raw waits stayed on")
	}
}

// TestSpinStopsWhenPreempted: a spin in which the process lost its CPU (a
// gap between two of its looks at the clock, here a poll that sleeps)
// stops, and the spinner does not spin again for spinQuiet.
func TestSpinStopsWhenPreempted(t *testing.T) {
	sp := newSpinner(time.Second)
	sp.budget = time.Second
	polls := 0
	start := time.Now()
	if sp.spin(start, func() bool {
		polls++
		if polls == 5 {
			time.Sleep(time.Millisecond) // as if preempted here
		}
		return false
	}) {
		t.Fatal("nothing was ready")
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Fatalf("a preempted spin went on for %v of its 1 s budget", took)
	}
	polls = 0
	if sp.spin(time.Now(), func() bool { polls++; return true }) || polls != 0 {
		t.Fatalf("spun (%d polls) within spinQuiet of a preempted spin", polls)
	}
	time.Sleep(spinQuiet + 5*time.Millisecond)
	if !sp.spin(time.Now(), func() bool { return true }) {
		t.Fatal("no spin after spinQuiet")
	}
	// An undisturbed spin finds what comes within its budget.
	n := 0
	if !sp.spin(time.Now(), func() bool { n++; return n == 1000 }) {
		t.Fatal("an undisturbed spin gave up before its budget")
	}
}
