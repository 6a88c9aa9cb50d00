package itest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tpsched/internal/testenv"
)

// TestScdctlReadsOnlySysconf: scdctl -c DIR needs only the node's
// addresses, so a definition file being edited (here a usr file with an
// unknown operand) does not keep call, status or hold from the node, and
// restart reaches it and answers why the new scdd refused to start, while
// the node serves on (issue 23, item 2: scdctl parsed the whole directory
// and stopped at the broken file).
func TestScdctlReadsOnlySysconf(t *testing.T) {
	skipShort(t)
	dir := defDir(t, "", map[string]string{"g": echoDef("g", 1, 16, 1<<20)})
	n := startNode(t, "-c", dir)
	// The node listened on ports of its choosing: write them into its
	// sysconf, as an operator's fixed ports would be.
	_, rpcPort, _ := strings.Cut(n.rpc, ":")
	sys := "set node_id = \"itest\"\nset rpc_address = \"127.0.0.1\"\nset rpc_port = " + rpcPort + "\n" +
		"set metrics_address = \"" + n.ctl + "\"\n" + ownControlSocket
	must(t, os.WriteFile(filepath.Join(dir, "sysconf"), []byte(sys), 0o644))
	usr := filepath.Join(dir, "usr", "g")
	body, err := os.ReadFile(usr)
	must(t, err)
	must(t, os.WriteFile(usr, append(body, "set parallel_cont = 2\n"...), 0o644))

	scdctl := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin("scdctl"), append([]string{"-c", dir}, args...)...)
		cmd.Env = append(os.Environ(), "DCCONFPATH=", "TPSCHED_RPC=", "TPSCHED_HTTP=", "TPSCHED_CONTROL_SOCKET=")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"call", "g", "echo", "hi"}, "hi\n"},
		{[]string{"status"}, "PROCESSES"},
		{[]string{"hold", "g"}, "held service group g"},
		{[]string{"release", "g"}, "released service group g"},
	} {
		if out, err := scdctl(c.args...); err != nil || !strings.Contains(out, c.want) {
			t.Errorf("scdctl -c DIR %s with a broken usr file: %v\n%s", strings.Join(c.args, " "), err, out)
		}
	}
	out, err := scdctl("restart")
	if err == nil || !strings.Contains(out, "usr/g:") || !strings.Contains(out, "parallel_cont: unknown operand (did you mean parallel_count?)") {
		t.Errorf("scdctl -c DIR restart: %v\n%s\nwant the new scdd's definition error", err, out)
	}
	if out, err := scdctl("call", "g", "echo", "still"); err != nil || out != "still\n" {
		t.Errorf("after the refused restart the node does not serve: %v\n%s", err, out)
	}
}

// TestScdctlFindsTheOnlyNode: scdctl without definitions computes the
// control socket from the embedded default's node_id (the host name); a
// node started with another node_id puts its socket beside, under its own
// name. scdctl uses that socket when it is the only one that answers, and
// when two nodes' are there it says so and lists them (issue 23, item 3).
// Node and scdctl run as nobody with a runtime directory of their own, so
// that no other socket on the machine is seen.
func TestScdctlFindsTheOnlyNode(t *testing.T) {
	skipShort(t)
	testenv.RequireRoot(t, "runs scdd and scdctl as nobody, to keep them off /run/tpsched")
	testenv.RequireTool(t, "setpriv", "util-linux")
	base, err := os.MkdirTemp("", "tpfind")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(base) })
	must(t, os.Chmod(base, 0o755))
	must(t, os.Chmod(binDir, 0o755))
	runtime, tmp := filepath.Join(base, "xdg"), filepath.Join(base, "tmp")
	for _, d := range []string{runtime, tmp} {
		must(t, os.Mkdir(d, 0o700))
		must(t, os.Chown(d, nobody, nobody))
	}
	env := []string{"XDG_RUNTIME_DIR=" + runtime, "TMPDIR=" + tmp, "DCCONFPATH=", "TPSCHED_CONTROL_SOCKET="}
	node := func(id string) *node {
		defs := filepath.Join(base, id)
		must(t, os.MkdirAll(filepath.Join(defs, "usr"), 0o755))
		must(t, os.WriteFile(filepath.Join(defs, "sysconf"), []byte("set node_id = \""+id+"\"\nset rpc_port = 0\n"+
			"set metrics_address = \"127.0.0.1:0\"\n"), 0o644))
		must(t, os.WriteFile(filepath.Join(defs, "usr", "g"), []byte(strings.ReplaceAll(echoDef("g", 1, 16, 1<<20), "MODULE", bin("uap-echo"))), 0o644))
		return startCommand(t, "env", append(env, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
			bin("scdd"), "-c", defs, "-cpu-probes", "off")...)
	}
	scdctl := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, "env", append(env, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
			bin("scdctl"))...)
		cmd.Args = append(cmd.Args, args...)
		cmd.Dir = "/"
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	mine := node("mynode")
	want := filepath.Join(runtime, "tpsched", "mynode.sock")
	if mine.sock != want {
		t.Fatalf("the node's control socket is %s, want %s", mine.sock, want)
	}
	if out, err := scdctl("hold", "g"); err != nil || !strings.Contains(out, "held service group g") || !groupStatus(t, mine, "g").Held {
		t.Fatalf("scdctl hold without -c, one node with another node_id: %v\n%s", err, out)
	}
	node("other")
	out, err := scdctl("release", "g")
	if err == nil || !strings.Contains(out, want) || !strings.Contains(out, filepath.Join(runtime, "tpsched", "other.sock")) ||
		!strings.Contains(out, "-s names one") {
		t.Errorf("scdctl release without -c, two nodes: %v\n%s\nwant an error that lists both sockets", err, out)
	}
	if !groupStatus(t, mine, "g").Held {
		t.Error("the ambiguous release released a group")
	}
}

// TestStatusOfAnIdleNode: what scdctl status says of a node at rest after
// some calls (issue 23, item 10): WAIT% is "-" (idle processes' few
// wake-ups make a share that says nothing; it read 71-98%), an
// application environment that never started reads env:dormant with a
// line saying what that is, not plain "open", and /status carries each
// group's latency counts (the status page's percentiles).
func TestStatusOfAnIdleNode(t *testing.T) {
	skipShort(t)
	dir := defDir(t, "", map[string]string{"orders": ordersServer, "g": echoDef("g", 2, 16, 1<<20)})
	must(t, os.WriteFile(filepath.Join(dir, "svcpolicy"), []byte(ordersPolicy), 0o644))
	n := startNode(t, "-c", dir)
	c := n.client()
	for i := range 30 {
		if _, err := c.Call(ctxT(t, 10*time.Second), "g", "echo", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	// At rest: the CPU guard's window (20 ms, every scaler tick) sees no
	// runnable time. Both readings in one look: on a busy machine an idle
	// process's rare wake-up can wait long enough for a CPU to make one
	// window's share, so a reading after the other may see the next
	// window.
	var out string
	wait := 0
	waitFor(t, 10*time.Second, "WAIT% to read - at rest, in scdctl status and /status", func() bool {
		var err error
		out, err = n.scdctl("status")
		must(t, err)
		wait = groupStatus(t, n, "g").Usage.WaitPercent
		return waitColumn(t, out, "g") == "-" && wait == -1
	}, func() string { return fmt.Sprintf("/status runqueue_wait_percent %d, scdctl status:\n%s", wait, out) })
	row := statusRow(t, out, "orders")
	if row["STATE"] != "env:dormant" || row["PROCESSES"] != "0+0/1" || row["PIDS"] != "-" {
		t.Errorf("an environment that never started: STATE %q, PROCESSES %q, PIDS %q; want env:dormant, 0+0/1, -\n%s",
			row["STATE"], row["PROCESSES"], row["PIDS"], out)
	}
	if !strings.Contains(out, "env:dormant has no server here until the cluster starts one") {
		t.Errorf("status does not say what env:dormant is:\n%s", out)
	}
	if row := statusRow(t, out, "g"); row["STATE"] != "open" {
		t.Errorf("a group that is no environment: STATE %q, want open", row["STATE"])
	}
	lat := groupStatus(t, n, "g").Latency
	var total uint64
	for _, c := range lat.Counts {
		total += c
	}
	if len(lat.Counts) != len(lat.UpToSeconds)+1 || total != 30 {
		t.Errorf("/status latency of g: %+v, want %d buckets and one more, 30 calls", lat, len(lat.UpToSeconds))
	}
	if _, err := c.Call(ctxT(t, 10*time.Second), "orders", "echo", nil); err != nil {
		t.Fatal(err)
	}
	out, err := n.scdctl("status")
	must(t, err)
	if row := statusRow(t, out, "orders"); row["STATE"] != "env:serving" {
		t.Errorf("the environment after a call: STATE %q, want env:serving\n%s", row["STATE"], out)
	}
}

// waitColumn is group's WAIT% in scdctl status's second table.
func waitColumn(t *testing.T, out, group string) string {
	t.Helper()
	var header []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == "GROUP" && len(f) > 1 && f[1] == "LOAD" {
			header = f
			continue
		}
		if header != nil && len(f) >= len(header)-1 && f[0] == group {
			for i, h := range header {
				if h == "WAIT%" {
					return f[i]
				}
			}
		}
	}
	t.Fatalf("no WAIT%% for %s in:\n%s", group, out)
	return ""
}
