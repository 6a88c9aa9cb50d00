package lockcheck

import (
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestFindsTheOldReserve: the check names the reserve's enroll as it was
// before break 1 was fixed, and a wait one call deeper.
func TestFindsTheOldReserve(t *testing.T) {
	found, err := Dir("testdata/oldreserve")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range found {
		got = append(got, f.String())
	}
	all := strings.Join(got, "\n")
	for _, want := range []string{"r.mu held across a call of the callback register", "r.mu held across r.waitLoop (a channel receive)"} {
		if !strings.Contains(all, want) {
			t.Errorf("the check did not find %q; it found:\n%s", want, all)
		}
	}
	if len(found) != 2 {
		t.Errorf("found %d sites, want 2:\n%s", len(found), all)
	}
}

// TestNoLockHeldAcrossAWait runs the check over the packages whose locks
// the event loops, the dispatcher and the process manager share.
func TestNoLockHeldAcrossAWait(t *testing.T) {
	_, self, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(self), "..", "..")
	for _, dir := range []string{"netio", "netio/rpcport", "scd/local", "shm", "procmgr", "scd/names", "scd/wlm", "scd/wlmnode"} {
		// A log write under a lock is a wait where the dispatcher and the
		// event loops take the lock (issue 29 item 7), in procmgr
		// where the reapers, the scaler and status reads take it, and in
		// scd/names, whose mu memberlist's callbacks take under its
		// node lock, and in the routing manager (scd/wlm, scd/wlmnode),
		// whose locks the event loops take (finds, steering). rpcport
		// still logs under its locks (budget.go, conn.go, write.go's
		// countSlow): not yet checked.
		cfg := Config{Logs: dir != "netio/rpcport"}
		found, err := cfg.Dir(filepath.Join(root, dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range found {
			t.Errorf("%s (remove the wait from under the lock, or say on the line why it cannot block: // lockcheck: why)", f)
		}
	}
}

// TestFindsALogWriteUnderALock: with Config.Logs, a log write under a
// lock is a finding, directly and through a function of the package (the
// reader's collect logged under the group's lock: issue 29 item 7).
func TestFindsALogWriteUnderALock(t *testing.T) {
	found, err := Config{Logs: true}.Dir("testdata/logunderlock")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range found {
		got = append(got, f.String())
	}
	all := strings.Join(got, "\n")
	for _, want := range []string{"g.mu held across g.log.Error (a log write", "g.mu held across g.act (g.log.Warn (a log write",
		"g.mu held across slog.Info (a log write"} {
		if !strings.Contains(all, want) {
			t.Errorf("the check did not find %q; it found:\n%s", want, all)
		}
	}
	if len(found) != 3 {
		t.Errorf("found %d sites, want 3:\n%s", len(found), all)
	}
	if found, _ := Dir("testdata/logunderlock"); len(found) != 0 {
		t.Errorf("without Config.Logs, log writes are no finding; found %v", found)
	}
}
