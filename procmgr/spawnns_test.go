package procmgr

import (
	"io/fs"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
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
