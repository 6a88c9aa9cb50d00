package itest

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestKilledNodesEscapedChildrenDieAtNextStart (issue 27 break 5): a UAP
// starts a child in a session of its own, and scdd is killed with kill -9.
// The UAP dies with it (Pdeathsig), its child does not: it lives on in
// tpsched/scdd-<dead pid>/a. The next scdd kills it as it starts and
// removes the dead daemon's cgroups (before, it only tried rmdir, which
// a populated cgroup refuses, so child and cgroups stayed for good).
func TestKilledNodesEscapedChildrenDieAtNextStart(t *testing.T) {
	skipShort(t)
	needRootForContainment(t)
	tok := hostileToken(t)
	dir := defDir(t, ownControlSocket, map[string]string{
		"a": hostileServer("a", "escape", tok, 1, ""),
	})
	first := startNode(t, "-c", dir)
	waitUAPLine(t, first, 10*time.Second, "HOSTILE: escape: joined scdd's process group")
	deadPID := first.cmd.Process.Pid
	first.signal(syscall.SIGKILL)
	if err := first.waitExit(10 * time.Second); err == nil {
		t.Fatal("scdd survived SIGKILL")
	}
	// The UAP itself dies of its Pdeathsig; what it started in a session
	// of its own does not.
	var orphans []int
	waitFor(t, 10*time.Second, "only the UAP's children left", func() bool {
		orphans = tokenProcesses(tok)
		for _, pid := range orphans {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(b)) != "sleep" {
				return false
			}
		}
		return len(orphans) > 0
	})
	stale, _ := filepath.Glob(fmt.Sprintf("/sys/fs/cgroup/*/tpsched/scdd-%d", deadPID))
	if len(stale) == 0 {
		t.Fatalf("the killed scdd %d left no cgroup behind", deadPID)
	}

	next := startNode(t, "-c", dir)
	waitFor(t, 10*time.Second, "the killed node's orphans dead", func() bool {
		return !slices.ContainsFunc(orphans, func(pid int) bool { return slices.Contains(tokenProcesses(tok), pid) })
	})
	for _, d := range stale {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("the killed node's cgroup %s is still there (%v)", d, err)
		}
	}
	if !strings.Contains(next.stderr.String(), "killed the processes of daemons that died without cleaning up") {
		t.Errorf("the next node does not say what it killed:\n%s", next.stderr.String())
	}
	chaosFigures(t, "kill -9 of scdd left %d processes in sessions of their own and %d cgroups; the next scdd killed them and removed the cgroups",
		len(orphans), len(stale))
}
