package bench

import (
	"os"
	"os/exec"
	"syscall"
	"testing"

	"tpsched/internal/testenv"
)

// The counter sees a process's own system calls, and not many more than
// it made.
func TestSyscallCounterCountsAProcess(t *testing.T) {
	testenv.RequireBPF(t)
	c, err := newSyscallCounter()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	// A process of its own makes the calls: this one's other threads (the
	// runtime's, the race detector's) make calls of their own meanwhile,
	// thousands in a window on a busy machine.
	cmd := exec.Command(os.Args[0], "-test.run=^TestSyscallCounterHelper$")
	cmd.Env = append(os.Environ(), syscallHelperEnv+"=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the helper: %v\n%s", err, out)
	}
	after, err := c.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	got := after[cmd.Process.Pid]
	// The helper's start and exit (the runtime's, the test framework's)
	// come on top, but not thousands.
	t.Logf("counted %d system calls of the helper, which made %d getppid", got, syscallHelperCalls)
	if got < syscallHelperCalls || got > syscallHelperCalls+2000 {
		t.Errorf("counted %d system calls of the helper, which made %d (and its start's)", got, syscallHelperCalls)
	}
}

const (
	syscallHelperEnv   = "TPSCHED_SYSCOUNT_HELPER"
	syscallHelperCalls = 5000
)

// TestSyscallCounterHelper is TestSyscallCounterCountsAProcess's process
// making the calls; it does nothing otherwise.
func TestSyscallCounterHelper(t *testing.T) {
	if os.Getenv(syscallHelperEnv) == "" {
		return
	}
	for range syscallHelperCalls {
		syscall.Getppid()
	}
}

func TestNilSyscallCounter(t *testing.T) {
	var c *syscallCounter
	if m, err := c.snapshot(); m != nil || err != nil {
		t.Errorf("nil counter: %v, %v", m, err)
	}
	c.Close()
}
