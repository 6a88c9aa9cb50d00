package itest

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"tpsched/internal/testenv"
)

// TestMakeInstallIntoDestDir runs `make install` into a temporary DESTDIR
// and checks the tree: the binaries (each answering -version with the
// Makefile's VERSION), the C UAP library (header, static library and a
// pkg-config file that the installed C example compiles with), the unit
// file with its paths rewritten for PREFIX, the docs, the Grafana
// dashboard and the examples, exactly the files git tracks (issue 23,
// item 6: a built binary and a live socket had been copied), the Go
// examples building against the checkout; the demo definitions, which a
// second install leaves alone; then `make uninstall`.
func TestMakeInstallIntoDestDir(t *testing.T) {
	testenv.Slow(t, "runs make install and builds the Go examples; 45 s without -race on a busy 2-core machine")
	skipShort(t)
	for _, tool := range []string{"make", "git", "gcc", "pkg-config"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: %v", tool, err)
		}
	}
	root := repoRoot(t)
	// What a user's build and run leave in examples/: a UAP built into
	// aplib/ (as the README says) and a node's control socket. Neither is
	// tracked (aplib/ is ignored), and neither may be installed.
	aplib := filepath.Join(root, "examples", "uap-go", "defs", "aplib")
	junk := filepath.Join(aplib, "uap-greet-itest")
	must(t, os.WriteFile(junk, []byte("\x7fELF not really"), 0o755))
	t.Cleanup(func() { os.Remove(junk) })
	sockLn, err := net.Listen("unix", filepath.Join(aplib, "itest.sock"))
	must(t, err)
	t.Cleanup(func() { sockLn.Close() })
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
	const doc = "/usr/local/share/doc/tpsched/"
	want := []string{
		"/etc/tpsched/scdsvcdef", "/etc/tpsched/sysconf", "/etc/tpsched/usr/demo",
		"/usr/local/bin/scdctl", "/usr/local/bin/scdd", "/usr/local/bin/uap-echo", "/usr/local/bin/uap-echo-c",
		"/usr/local/include/tpsched_uap.h", "/usr/local/lib/libtpsched_uap.a", "/usr/local/lib/pkgconfig/tpsched_uap.pc",
		"/usr/local/lib/systemd/system/tpsched.service",
	}
	// The docs the README links to, in its layout, and every example
	// file git tracks: nothing else.
	tracked := gitFiles(t, root, "examples")
	for _, f := range append([]string{"README.md", "docs/ARCHITECTURE.md", "docs/OPERANDS.md", "docs/RELIABILITY.md", "docs/SHM.md", "docs/WARNINGS.md",
		"docs/NODE.md", "docs/CLUSTER.md", "docs/UAP.md", "docs/METRICS.md", "docs/OPERATING.md", "docs/TESTING.md",
		"docs/img/dashboard.png", "docs/img/status-page.png", "dist/grafana/tpsched.json", "dist/tpsched.service"}, tracked...) {
		want = append(want, doc+f)
	}
	sort.Strings(want)
	got := tree()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("make install's tree:\n%s\nwant exactly:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, f := range tracked {
		if !strings.HasSuffix(f, "go.mod") {
			a, err := os.ReadFile(filepath.Join(root, f))
			must(t, err)
			if b, err := os.ReadFile(filepath.Join(dest, doc, f)); err != nil || !bytes.Equal(a, b) {
				t.Errorf("installed %s differs from the repository's (%v)", f, err)
			}
		}
	}
	t.Run("the installed C example builds with pkg-config", func(t *testing.T) {
		pc := exec.Command("pkg-config", "--cflags", "--libs", "tpsched_uap")
		// The staged .pc is relative to itself: no PKG_CONFIG_SYSROOT_DIR
		// (TestStagedInstallBuildsCUAP moves the tree too).
		pc.Env = append(os.Environ(), "PKG_CONFIG_PATH="+filepath.Join(dest, "usr/local/lib/pkgconfig"), "PKG_CONFIG_SYSROOT_DIR=")
		flags, err := pc.Output()
		if err != nil {
			t.Fatalf("pkg-config --cflags --libs tpsched_uap: %v", err)
		}
		exe := filepath.Join(t.TempDir(), "uap-echo-c")
		args := append([]string{"-std=c11", "-O2", "-Wall", "-Werror", "-o", exe, filepath.Join(dest, doc, "examples/uap-c/uap_echo.c")},
			strings.Fields(string(flags))...)
		if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
			t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		if out, err := exec.Command(exe, "-version").CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "uap-echo-c ") {
			t.Errorf("%s -version: %v: %s", exe, err, out)
		}
	})
	t.Run("the installed Go examples build against the checkout", func(t *testing.T) {
		for _, ex := range []string{"uap-go", "client-go"} {
			gomod, err := os.ReadFile(filepath.Join(dest, doc, "examples", ex, "go.mod"))
			must(t, err)
			if !strings.Contains(string(gomod), "\nreplace tpsched => "+root+"\n") {
				t.Errorf("installed examples/%s/go.mod does not point at the checkout %s:\n%s", ex, root, gomod)
			}
			// A copy, as a user would make one to start from.
			src := filepath.Join(t.TempDir(), ex)
			must(t, os.CopyFS(src, os.DirFS(filepath.Join(dest, doc, "examples", ex))))
			goBuild(t, src, filepath.Join(t.TempDir(), ex))
		}
	})
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

// gitFiles lists the files git tracks under dir of the repository at root,
// relative to root.
func gitFiles(t *testing.T, root, dir string) []string {
	t.Helper()
	out, err := exec.Command("git", "-C", root, "ls-files", "--", dir).Output()
	if err != nil {
		t.Fatalf("git ls-files %s: %v", dir, err)
	}
	return strings.Fields(string(out))
}

// TestStagedInstallBuildsCUAP: a DESTDIR install is usable where it lies
// and where it is moved to: pkg-config, given only the staged pkgconfig
// directory (no PKG_CONFIG_SYSROOT_DIR), names the staged header and
// library, a C UAP compiles against them, and a node serves a call with it
// (issue 31 item 3: the .pc named /usr/local, and gcc found no
// tpsched_uap.h).
func TestStagedInstallBuildsCUAP(t *testing.T) {
	skipShort(t)
	for _, tool := range []string{"make", "gcc", "pkg-config"} {
		testenv.RequireTool(t, tool, "make, gcc and pkg-config (or pkgconf) from Debian")
	}
	root := repoRoot(t)
	tmp := t.TempDir()
	staged := filepath.Join(tmp, "stage")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", "-C", root, "--no-print-directory", "install",
		"DESTDIR="+staged, "BIN="+filepath.Join(tmp, "bin"), "VERSION=v0.0.0-itest")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make install DESTDIR=%s: %v\n%s", staged, err, out)
	}
	// Moved, as a staged tree is when it is packed and unpacked: a .pc
	// that named DESTDIR's absolute paths would fail here too.
	moved := filepath.Join(tmp, "moved")
	must(t, os.Rename(staged, moved))

	pc := exec.CommandContext(ctx, "pkg-config", "--cflags", "--libs", "tpsched_uap")
	pc.Env = append(os.Environ(), "PKG_CONFIG_PATH="+filepath.Join(moved, "usr/local/lib/pkgconfig"),
		"PKG_CONFIG_SYSROOT_DIR=", "PKG_CONFIG_LIBDIR=")
	flags, err := pc.Output()
	if err != nil {
		t.Fatalf("pkg-config --cflags --libs tpsched_uap: %v", err)
	}
	for _, f := range strings.Fields(string(flags)) {
		if p, ok := strings.CutPrefix(f, "-I"); ok || strings.HasPrefix(f, "-L") {
			if !ok {
				p = f[2:]
			}
			if !strings.HasPrefix(p, moved+"/") {
				t.Errorf("pkg-config's %s is not in the staged tree %s", f, moved)
			}
		}
	}
	exe := filepath.Join(tmp, "uap-echo-c")
	args := append([]string{"-std=c11", "-O2", "-Wall", "-Werror", "-o", exe,
		filepath.Join(moved, "usr/local/share/doc/tpsched/examples/uap-c/uap_echo.c")}, strings.Fields(string(flags))...)
	if out, err := exec.CommandContext(ctx, "gcc", args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
	}

	// The UAP it built serves a call.
	dir := defDir(t, "", map[string]string{"cecho": `set service_group = "cecho"
set service = "echo=echo"
set module = "` + exe + `"
set parallel_count = 1
`})
	n := startNode(t, "-c", dir)
	out, err := n.client().Call(ctx, "cecho", "echo", []byte("staged"))
	if err != nil || string(out) != "staged" {
		t.Errorf("cecho/echo with the UAP built from the staged install: %q, %v", out, err)
	}
}
