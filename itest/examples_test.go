package itest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"tpsched/internal/testenv"
)

// goBuild builds the module in dir (a standalone example module) into out.
func goBuild(t *testing.T, dir, out string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, ".")
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build in %s: %v\n%s", dir, err, b)
	}
}

// copyTree copies the regular files under src to dst, but for the
// directories named in skip, which it makes empty (a UAP built into the
// example's aplib/ by hand is not the one under test).
func copyTree(t *testing.T, src, dst string, skip ...string) {
	t.Helper()
	must(t, filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			if err := os.MkdirAll(filepath.Join(dst, rel), 0o755); err != nil {
				return err
			}
			for _, s := range skip {
				if rel == s {
					return filepath.SkipDir
				}
			}
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	}))
}

// TestExamplesBuildAndRun: examples/uap-go and examples/client-go build as
// the standalone modules they are; a node runs the example UAP from its
// definition directory (module found in aplib/), the example client calls
// it, and what the UAP writes goes to scdd's stderr, as the README says.
func TestExamplesBuildAndRun(t *testing.T) {
	testenv.Slow(t, "builds and runs the examples; 10 s without -race on a busy 2-core machine")
	skipShort(t)
	uapDir, clientDir := filepath.Join("..", "examples", "uap-go"), filepath.Join("..", "examples", "client-go")
	// The example's definitions, on ports of the test's choosing.
	// Not under t.TempDir (0700): a root scdd runs the UAP as an id of its
	// own, which must reach the module.
	top, err := os.MkdirTemp("", "tpsched-examples-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(top) })
	must(t, os.Chmod(top, 0o755))
	defs := filepath.Join(top, "defs")
	copyTree(t, filepath.Join(uapDir, "defs"), defs, "aplib")
	sys, err := os.ReadFile(filepath.Join(defs, "sysconf"))
	must(t, err)
	s := string(sys)
	for old, repl := range map[string]string{
		"set rpc_port = 12100": "set rpc_port = 0", `set metrics_address = "127.0.0.1:12101"`: `set metrics_address = "127.0.0.1:0"`,
	} {
		if !strings.Contains(s, old) {
			t.Fatalf("examples/uap-go/defs/sysconf has no %q any more: update this test", old)
		}
		s = strings.ReplaceAll(s, old, repl)
	}
	must(t, os.WriteFile(filepath.Join(defs, "sysconf"), []byte(s), 0o644))
	// Built where the README says: the definition's aplib/.
	goBuild(t, uapDir, filepath.Join(defs, "aplib", "uap-greet"))
	clientBin := filepath.Join(t.TempDir(), "greet-client")
	goBuild(t, clientDir, clientBin)

	n := startNode(t, "-c", defs)
	waitFor(t, 10*time.Second, "the UAP's start line on scdd's stderr", func() bool {
		return strings.Contains(n.stderr.String(), "uap-greet: pid ")
	}, n.stderr.String)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, clientBin, args...)
		// DCHOST wins over betranrc's dchost (the example node's fixed port).
		cmd.Env = append(os.Environ(), "DCHOST="+n.rpc)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("greet-client %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	out := run("-c", filepath.Join(clientDir, "betranrc"), "tpsched", "user")
	t.Logf("greet-client:\n%s", out)
	want := regexp.MustCompile(`^hello: hello, tpsched user \(from pid (\d+)\)
upper: TPSCHED USER
count: 3
fail: application error: greet cannot do that: tpsched user
nosuch: no such service: greet/nosuch
$`)
	m := want.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("greet-client output:\n%s\nwant it to match:\n%s", out, want)
	}
	if !strings.Contains(n.stderr.String(), "uap-greet: pid "+m[1]+" serving group greet") {
		t.Errorf("the UAP's line for pid %s is not on scdd's stderr:\n%s", m[1], n.stderr.String())
	}
	// The explicit destination, the same node.
	if out := run("-node", n.rpc, "again"); !strings.Contains(out, "upper: AGAIN") {
		t.Errorf("greet-client -node: %s", out)
	}
	// The UAP says goodbye on scdd's stderr when the node drains.
	n.signal(15)
	if err := n.waitExit(20 * time.Second); err != nil {
		t.Fatalf("scdd exit: %v", err)
	}
	if !regexp.MustCompile(`uap-greet: pid \d+ leaves after \d+ calls`).MatchString(n.stderr.String()) {
		t.Errorf("no leave line from the UAP on scdd's stderr:\n%s", n.stderr.String())
	}
}

// TestTwoGroupsExampleChecks: docs/NODE.md shows `bin/scdd -c
// examples/twogroups`; its definitions pass scdd -check as they are, with
// every module found as start-up would find it (beside scdd). Running it
// as shown would take the fixed port 12000, which another node on this
// machine may hold.
func TestTwoGroupsExampleChecks(t *testing.T) {
	skipShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin("scdd"), "-check", "-c", filepath.Join(repoRoot(t), "examples", "twogroups"))
	cmd.Env = append(os.Environ(), "DCCONFPATH=")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "2 user server(s), definitions OK") {
		t.Errorf("scdd -check -c examples/twogroups: %v\n%s", err, out)
	}
}
