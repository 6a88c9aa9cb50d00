package procmgr

import (
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// A start with namespaces that fails for a reason that is not the kernel
// refusing them (EAGAIN at a pids limit, here) fails that one start and
// leaves the namespaces on; only EPERM, EINVAL, ENOSPC and EUSERS turn
// them off, once a start without them has worked (issue 29 item 6: any
// error did, for the whole node, for good).
func TestOnlyARefusalTurnsNamespacesOff(t *testing.T) {
	for _, tc := range []struct {
		errno   syscall.Errno
		refusal bool
	}{
		{syscall.EAGAIN, false},
		{syscall.ENOMEM, false},
		{syscall.EPERM, true},
		{syscall.ENOSPC, true},
	} {
		t.Run(tc.errno.Error(), func(t *testing.T) {
			m := testManager(t)
			m.nsMu.Lock()
			m.userns, m.nsErr = true, nil // as for a non-root daemon
			m.nsMu.Unlock()
			var faults atomic.Int32
			fault := func(withNS bool) error {
				if withNS && faults.Add(1) == 1 {
					return &fs.PathError{Op: "fork/exec", Path: "uap", Err: tc.errno}
				}
				return nil
			}
			startFault.Store(&fault)
			defer startFault.Store(nil)
			srv, err := m.Start(uapSpec("sleep", t.TempDir(), 1), &hooks{})
			if err == nil {
				t.Cleanup(func() { stopNow(t, srv) })
			}
			ns := m.Containment().Namespaces
			if tc.refusal {
				if err != nil {
					t.Fatalf("Start after the kernel refused the namespaces = %v, want a start without them", err)
				}
				if !strings.HasPrefix(ns, "none: the kernel refused") {
					t.Errorf("namespaces %q after a refusal, want none and why", ns)
				}
				return
			}
			// Start may go again after a failed start (as it does after a
			// crash); it must not have gone on without the namespaces.
			if err != nil && !strings.Contains(err.Error(), tc.errno.Error()) {
				t.Errorf("Start with a transient %v = %v, want that error or a start with namespaces", tc.errno, err)
			}
			if faults.Load() == 0 {
				t.Fatal("no start with namespaces was tried")
			}
			if ns != "user+pid" {
				t.Errorf("namespaces %q after a transient %v, want still user+pid", ns, tc.errno)
			}
		})
	}
}

// startSleeper starts a server of one process that sleeps, and returns
// it, its exits and the process's pid.
func startSleeper(t *testing.T) (*Server, *exitLog, int) {
	t.Helper()
	dir := t.TempDir()
	exits := newExitLog()
	srv := startServer(t, testManager(t), uapSpec("sleep", dir, 1), &hooks{exited: exits.hook})
	pid, _ := strconv.Atoi(readReport(t, dir, 0, 0)["pid"])
	return srv, exits, pid
}

// Kill signals a process by its pid and process group number: the process
// must not be reaped meanwhile, or both numbers are free for a stranger.
// Here the process dies on its own just as Kill takes it from its slot
// (issue 29 item 6: the reaper reaped it, and Kill went on to signal a pid
// that was no longer its).
func TestKillNeverSignalsAReapedPid(t *testing.T) {
	srv, exits, pid := startSleeper(t)
	var reapedAt atomic.Int64
	hook := killWatchingTheReap(pid, &reapedAt)
	beforeKill.Store(&hook)
	defer beforeKill.Store(nil)
	srv.Kill(0, pid)
	if e := exits.next(t); e.pid != pid {
		t.Fatalf("Exited(%d, %d), want pid %d", e.slot, e.pid, pid)
	}
	if d := reapedAt.Load(); d != 0 {
		t.Errorf("pid %d was reaped %v after its death, while Kill was about to signal it and its group by number", pid, time.Duration(d))
	}
}

// Kill names the process its caller decided on: scd decides under its
// group's lock and calls Kill after releasing it, by when that process may
// have died and another started in its slot. A pid that is not the slot's
// process is not killed.
func TestKillSparesAReplacement(t *testing.T) {
	srv, exits, pid := startSleeper(t)
	srv.Kill(0, pid+1) // not the slot's process: one before it, say
	time.Sleep(200 * time.Millisecond)
	if got := exits.all(); len(got) != 0 {
		t.Fatalf("exits %v after a kill of a pid that is not the slot's", got)
	}
	srv.Kill(0, pid)
	if e := exits.next(t); e.pid != pid {
		t.Fatalf("Exited(%d, %d), want pid %d", e.slot, e.pid, pid)
	}
}

// killWatchingTheReap is a hook for pid: it SIGKILLs the process and
// waits up to 300 ms for its /proc entry to go (reaped), storing in
// reapedAt how long that took; other pids pass.
func killWatchingTheReap(pid int, reapedAt *atomic.Int64) func(int) {
	return func(p int) {
		if p != pid {
			return
		}
		_ = syscall.Kill(pid, syscall.SIGKILL) // it dies on its own
		start := time.Now()
		for time.Since(start) < 300*time.Millisecond {
			if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err != nil {
				reapedAt.Store(int64(time.Since(start)))
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
}
