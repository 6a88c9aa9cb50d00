package itest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"tpsched/internal/freeport"
	"tpsched/internal/testenv"
)

// TestDemoShowsStartupWarnings: make demo's script (tools/demo.sh) shows
// the warnings scdd logs at start, each as its one short line naming
// docs/WARNINGS.md, though it hides the rest of scdd's log (issue 31 item
// 4: a non-root user never saw "scdd runs as uid N, not as root"). The
// script runs as make demo runs it, on definitions that DCCONFPATH names
// (free ports rather than the embedded default's 12000, which another
// test or user may hold), whose sysconf holds cluster_key at mode 0644: a
// warning scdd gives as root too.
func TestDemoShowsStartupWarnings(t *testing.T) {
	skipShort(t)
	ports, err := freeport.Common([]string{"127.0.0.1"}, 2)
	if err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	sys := fmt.Sprintf("set node_id = \"demotest\"\nset rpc_address = \"127.0.0.1\"\nset rpc_port = %d\n"+
		"set metrics_address = \"127.0.0.1:%d\"\nset cluster_key = \"0123456789abcdef0123\"\n", ports[0], ports[1]) + ownControlSocket
	must(t, os.WriteFile(filepath.Join(dir, "sysconf"), []byte(sys), 0o644))
	must(t, os.MkdirAll(filepath.Join(dir, "usr"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "usr", "demo"), []byte(strings.ReplaceAll(echoDef("demo", 1, 16, 1<<20), "MODULE", fmt.Sprintf("%q", bin("uap-echo")))), 0o644))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(repoRoot(t), "tools", "demo.sh"), binDir)
	cmd.Env = append(os.Environ(), "DCCONFPATH="+dir, "TPSCHED_RPC=", "TPSCHED_HTTP=", "TPSCHED_CONTROL_SOCKET=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("tools/demo.sh: %v\n%s", err, out)
	}
	text := string(out)
	t.Logf("make demo:\n%s", text)
	want := "scdd warned at start (docs/WARNINGS.md explains each):\n  sysconf: it holds cluster_key and users other than its owner can read it (mode 0644)"
	if !strings.Contains(text, want) {
		t.Errorf("the demo does not show scdd's warning; want %q in:\n%s", want, text)
	}
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "  ") && strings.Contains(l, "docs/WARNINGS.md#") && len(l) > 300 {
			t.Errorf("a warning line of %d characters: %s", len(l), l)
		}
	}
	if !strings.Contains(text, "hello") || !strings.Contains(text, "demo: scdd stopped") {
		t.Errorf("the demo did not call and stop the node:\n%s", text)
	}
}

// TestClusterDemoChecksItsCaptions: make cluster-demo's script
// (tools/cluster.sh) runs to its end on three real nodes, every caption
// checked against the output under it by the script itself, which ends
// with status 1 and "cluster-demo: FAILED" when one does not hold (issue
// 31 item 1: n4 fell back to LEVEL0 under "n4 is LEVEL2 now", and calls
// went to it under "none goes to n4"). Free ports on the demo's addresses
// stand in for 12100-12102, which another user's demo may hold.
func TestClusterDemoChecksItsCaptions(t *testing.T) {
	testenv.Slow(t, "runs make cluster-demo's script: three nodes, about 20 s")
	skipShort(t)
	ports, err := freeport.Common(clusterIPs, 3)
	if err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(repoRoot(t), "tools", "cluster.sh"), binDir)
	// At the deadline the script gets SIGTERM, which stops its nodes and
	// feeder through its EXIT trap; whatever of its process group is left
	// after 10 s is killed, also when the test fails. (SIGKILL of bash
	// alone left three nodes and the feeder running, under init.)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	t.Cleanup(func() {
		if cmd.Process != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	})
	cmd.Env = append(os.Environ(), "DCCONFPATH=", "TPSCHED_RPC=", "TPSCHED_HTTP=", "TPSCHED_CONTROL_SOCKET=",
		fmt.Sprintf("CLUSTER_DEMO_RPC_PORT=%d", ports[0]), fmt.Sprintf("CLUSTER_DEMO_HTTP_PORT=%d", ports[1]),
		fmt.Sprintf("CLUSTER_DEMO_NAME_PORT=%d", ports[2]))
	out, err := cmd.CombinedOutput()
	t.Logf("make cluster-demo:\n%s", out)
	if err != nil || strings.Contains(string(out), "FAILED") {
		t.Fatalf("tools/cluster.sh: %v", err)
	}
	for _, want := range []string{"# on n2: n4 is LEVEL2 now", "# 30 calls through n2: none goes to n4",
		"cluster-demo: every caption above matched the output under it"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
}
