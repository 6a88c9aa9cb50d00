package itest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// TestMakeInstallIntoDestDir runs `make install` into a temporary DESTDIR
// and checks the tree: the binaries (each answering -version with the
// Makefile's VERSION), the unit file with its paths rewritten for PREFIX,
// the docs, the demo definitions, which a second install leaves alone;
// then `make uninstall`.
func TestMakeInstallIntoDestDir(t *testing.T) {
	skipShort(t)
	if _, err := exec.LookPath("make"); err != nil {
		t.Skipf("needs make: %v", err)
	}
	root := repoRoot(t)
	tmp := t.TempDir()
	dest := filepath.Join(tmp, "dest")
	runMake := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "make", append([]string{"-C", root, "--no-print-directory",
			"DESTDIR=" + dest, "BIN=" + filepath.Join(tmp, "bin"), "VERSION=v0.0.0-itest"}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	tree := func() []string {
		var files []string
		must(t, filepath.Walk(dest, func(p string, fi os.FileInfo, err error) error {
			if err != nil || fi.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(dest, p)
			files = append(files, "/"+rel)
			return nil
		}))
		sort.Strings(files)
		return files
	}
	mode := func(p string) os.FileMode {
		fi, err := os.Stat(filepath.Join(dest, p))
		must(t, err)
		return fi.Mode().Perm()
	}

	runMake("install")
	want := []string{
		"/etc/tpsched/scdsvcdef", "/etc/tpsched/sysconf", "/etc/tpsched/usr/demo",
		"/usr/local/bin/scdctl", "/usr/local/bin/scdd", "/usr/local/bin/uap-echo",
		"/usr/local/lib/systemd/system/tpsched.service",
		"/usr/local/share/doc/tpsched/ARCHITECTURE.md", "/usr/local/share/doc/tpsched/README.md",
		"/usr/local/share/doc/tpsched/examples/twogroups/sysconf",
	}
	got := tree()
	for _, w := range want {
		if i := sort.SearchStrings(got, w); i == len(got) || got[i] != w {
			t.Errorf("make install did not install %s; the tree:\n%s", w, strings.Join(got, "\n"))
		}
	}
	for _, b := range []string{"scdd", "scdctl", "uap-echo"} {
		p := "/usr/local/bin/" + b
		if m := mode(p); m != 0o755 {
			t.Errorf("%s mode %v, want 0755", p, m)
		}
		out, err := exec.Command(filepath.Join(dest, p), "-version").CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), b+" v0.0.0-itest (go") {
			t.Errorf("%s -version: %q, %v; want the Makefile's VERSION", p, out, err)
		}
	}
	unitPath := "/usr/local/lib/systemd/system/tpsched.service"
	if m := mode(unitPath); m != 0o644 {
		t.Errorf("unit mode %v, want 0644", m)
	}
	unit := unitOptions(t, filepath.Join(dest, unitPath))
	if got := unit["ExecStart"]; len(got) != 1 || got[0] != "/usr/local/bin/scdd -c /etc/tpsched -drain-timeout 30s" {
		t.Errorf("ExecStart=%q", got)
	}
	out, err := exec.Command(filepath.Join(dest, "usr/local/bin/scdd"), "-check", "-c", filepath.Join(dest, "etc/tpsched")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "definitions OK") {
		t.Errorf("installed scdd -check of the installed definitions: %v: %s", err, out)
	}

	t.Run("systemd-analyze verify", func(t *testing.T) {
		if _, err := exec.LookPath("systemd-analyze"); err != nil {
			t.Skipf("needs systemd-analyze: %v", err)
		}
		// verify checks that the commands exist: point them into DESTDIR.
		body, err := os.ReadFile(filepath.Join(dest, unitPath))
		must(t, err)
		local := filepath.Join(t.TempDir(), "tpsched.service")
		must(t, os.WriteFile(local, []byte(strings.ReplaceAll(string(body), "/usr/local/bin/", filepath.Join(dest, "usr/local/bin")+"/")), 0o644))
		if out, err := exec.Command("systemd-analyze", "verify", local).CombinedOutput(); err != nil {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	})

	// The operator's definitions survive a second install; another
	// PREFIX rewrites the unit's paths.
	sysconf := filepath.Join(dest, "etc/tpsched/sysconf")
	must(t, os.WriteFile(sysconf, []byte("set node_id = \"edited\"\n"), 0o644))
	runMake("install", "PREFIX=/opt/tp", "SYSCONFDIR=/opt/tp/etc")
	out2 := runMake("install")
	if !strings.Contains(out2, "exists, left as it is") {
		t.Errorf("second install says nothing about the definitions it kept:\n%s", out2)
	}
	if b, _ := os.ReadFile(sysconf); string(b) != "set node_id = \"edited\"\n" {
		t.Errorf("a second install overwrote the operator's sysconf: %q", b)
	}
	opt := unitOptions(t, filepath.Join(dest, "opt/tp/lib/systemd/system/tpsched.service"))
	if got := opt["ExecStart"]; len(got) != 1 || got[0] != "/opt/tp/bin/scdd -c /opt/tp/etc/tpsched -drain-timeout 30s" {
		t.Errorf("PREFIX=/opt/tp: ExecStart=%q", got)
	}

	runMake("uninstall")
	for _, f := range tree() {
		if strings.HasPrefix(f, "/usr/local/") {
			t.Errorf("make uninstall left %s", f)
		}
	}
	if _, err := os.Stat(sysconf); err != nil {
		t.Errorf("make uninstall removed the definitions: %v", err)
	}
}
