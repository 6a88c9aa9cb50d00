package bench

import (
	"os"
	"syscall"
	"testing"

	"tpsched/internal/testenv"
)

// The counter sees this process's own system calls, and no more of them
// than it made (the other threads of the test binary are idle).
func TestSyscallCounterCountsThisProcess(t *testing.T) {
	testenv.RequireBPF(t)
	c, err := newSyscallCounter()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	before, err := c.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	const n = 5000
	for range n {
		syscall.Getppid()
	}
	after, err := c.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	got := after[os.Getpid()] - before[os.Getpid()]
	// The snapshots' own bpf(2) calls and the runtime's (a timer, a GC
	// wake-up) come on top, but not thousands.
	if got < n || got > n+2000 {
		t.Errorf("counted %d system calls of this process, made %d (and a few more)", got, n)
	}
}

func TestNilSyscallCounter(t *testing.T) {
	var c *syscallCounter
	if m, err := c.snapshot(); m != nil || err != nil {
		t.Errorf("nil counter: %v, %v", m, err)
	}
	c.Close()
}
