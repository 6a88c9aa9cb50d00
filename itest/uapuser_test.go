package itest

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// procUID is the real uid of a process, from /proc.
func procUID(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	must(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
			uid, err := strconv.Atoi(f[1])
			must(t, err)
			return uid
		}
	}
	t.Fatalf("no Uid line in /proc/%d/status", pid)
	return -1
}

// TestRootRunsUAPsAsTheirOwnUsers: a root scdd runs no UAP as root; each
// server whose definition names no user gets an id of its own, and its
// replacement after a kill runs as the same.
func TestRootRunsUAPsAsTheirOwnUsers(t *testing.T) {
	skipShort(t)
	if os.Geteuid() != 0 {
		t.Skip("the UAPs' users are chosen by a root daemon")
	}
	dir := defDir(t, "", map[string]string{"alpha": echoDef("alpha", 1, 16, 4096), "beta": echoDef("beta", 1, 16, 4096)})
	n := startNode(t, "-c", dir)
	uids := map[string]int{}
	for _, g := range []string{"alpha", "beta"} {
		pid := groupStatus(t, n, g).Processes[0].PID
		uids[g] = procUID(t, pid)
		if uids[g] == 0 {
			t.Fatalf("%s's UAP runs as root", g)
		}
	}
	if uids["alpha"] == uids["beta"] {
		t.Fatalf("alpha and beta share uid %d", uids["alpha"])
	}
	// A process that served a call is restarted at once, one that did not
	// after a back-off.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := n.client().Call(ctx, "alpha", "echo", []byte("x"))
	must(t, err)
	old := groupStatus(t, n, "alpha").Processes[0].PID
	must(t, syscall.Kill(old, syscall.SIGKILL))
	waitFor(t, 10*time.Second, "alpha's replacement", func() bool {
		p := groupStatus(t, n, "alpha").Processes[0]
		return p.PID != 0 && p.PID != old
	})
	if uid := procUID(t, groupStatus(t, n, "alpha").Processes[0].PID); uid != uids["alpha"] {
		t.Errorf("alpha's replacement runs as %d, the first as %d", uid, uids["alpha"])
	}
}
