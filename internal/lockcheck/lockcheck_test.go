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
	for _, dir := range []string{"netio", "netio/rpcport", "scd/local", "shm", "procmgr"} {
		found, err := Dir(filepath.Join(root, dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range found {
			t.Errorf("%s (remove the wait from under the lock, or say on the line why it cannot block: // lockcheck: why)", f)
		}
	}
}
