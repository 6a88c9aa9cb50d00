package itest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"tpsched/internal/testenv"
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
	testenv.RequireRoot(t, "the UAPs' users are chosen by a root daemon")
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

// TestSameServerOnTwoNodesHasTwoUsers (issue 19 item 10): two nodes on one
// host with a server of the same name give it two users (the id is
// derived from the node's id and the server's name), and within a server
// each process has a group of its own.
func TestSameServerOnTwoNodesHasTwoUsers(t *testing.T) {
	skipShort(t)
	testenv.RequireRoot(t, "the UAPs' users are chosen by a root daemon")
	uids := map[string]int{}
	for _, id := range []string{"itest-one", "itest-two"} {
		dir := defDir(t, "", map[string]string{"echo": echoDef("echo", 2, 16, 4096)})
		sys := filepath.Join(dir, "sysconf")
		b, err := os.ReadFile(sys)
		must(t, err)
		must(t, os.WriteFile(sys, []byte(strings.Replace(string(b), `set node_id = "itest"`, `set node_id = "`+id+`"`, 1)), 0o644))
		n := startNode(t, "-c", dir)
		procs := groupStatus(t, n, "echo").Processes
		uids[id] = procUID(t, procs[0].PID)
		gids := map[string]bool{}
		for _, p := range procs {
			if uid := procUID(t, p.PID); uid != uids[id] {
				t.Errorf("%s: the server's processes run as %d and %d", id, uids[id], uid)
			}
			st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID))
			must(t, err)
			for _, line := range strings.Split(string(st), "\n") {
				if f := strings.Fields(line); len(f) > 1 && f[0] == "Gid:" {
					gids[f[1]] = true
				}
			}
		}
		if len(gids) != len(procs) {
			t.Errorf("%s: %d processes share %d groups: %v", id, len(procs), len(gids), gids)
		}
	}
	if uids["itest-one"] == uids["itest-two"] {
		t.Errorf("server echo runs as uid %d on both nodes", uids["itest-one"])
	}
}
