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

	"tpsched/internal/freeport"
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
