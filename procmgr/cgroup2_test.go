package procmgr

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestCPUWeightOnCgroup2Files runs the cgroup v2 cpu.weight path (the
// mechanism where the cpu controller is on the unified hierarchy) through
// detection, a server's group and a weight change (goal management's
// SetWeight), on a fake of the cgroup files: a directory tree laid out as
// the kernel lays out a cgroup2 mount with the cpu controller, and a
// mountinfo line that names it. This machine's v2 hierarchy has no cpu
// controller (v1 holds it), so no real cpu.weight can be written here.
//
// What it does not cover: that the kernel enforces the weight; that
// "+cpu" written to cgroup.subtree_control enables the controller (the
// fake only keeps what is written); the files the kernel makes in a new
// cgroup directory (the fake makes them first, and NewGroup reuses a
// directory that exists); and clone3 into such a cgroup, which
// TestCPUGroupCgroup2 does on a real cgroup2 mount without the cpu
// controller.
func TestCPUWeightOnCgroup2Files(t *testing.T) {
	mnt := t.TempDir()
	const parent = "tpsched/scdd-weight-test"
	write := func(rel, text string) {
		t.Helper()
		p := filepath.Join(mnt, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	read := func(rel string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(mnt, rel))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	// The root of the hierarchy, each level of the parent and each
	// server's group, with the interface files the kernel would make.
	write("cgroup.controllers", "cpuset cpu io memory pids\n")
	write("cgroup.subtree_control", "")
	write("cgroup.procs", "")
	for _, dir := range []string{"tpsched", parent} {
		write(filepath.Join(dir, "cgroup.controllers"), "cpu\n")
		write(filepath.Join(dir, "cgroup.subtree_control"), "")
		write(filepath.Join(dir, "cgroup.procs"), "")
	}
	for _, server := range []string{"hi", "lo"} {
		write(filepath.Join(parent, server, "cpu.weight"), "100\n")
		write(filepath.Join(parent, server, "cgroup.procs"), "")
	}
	mountinfo := filepath.Join(t.TempDir(), "mountinfo")
	if err := os.WriteFile(mountinfo, []byte("41 31 0:38 / "+mnt+" rw,nosuid shared:1 - cgroup2 cgroup2 rw,nsdelegate\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	c := detect(mountinfo, parent)
	if c.Mechanism() != MechanismCgroup2 || !c.weight || !strings.Contains(c.Reason(), "cgroup v2 at "+mnt) {
		t.Fatalf("detect: %s (%s), weight %v; want cgroup2 with cpu.weight", c.Mechanism(), c.Reason(), c.weight)
	}
	for _, dir := range []string{"", "tpsched", parent} {
		if got := read(filepath.Join(dir, "cgroup.subtree_control")); got != "+cpu" {
			t.Errorf("%s/cgroup.subtree_control = %q, want +cpu written (the controller enabled from the mount down)", dir, got)
		}
	}
	hi, err := c.NewGroup("hi", 1)
	if err != nil {
		t.Fatal(err)
	}
	lo, err := c.NewGroup("lo", 16)
	if err != nil {
		t.Fatal(err)
	}
	if got := read(filepath.Join(parent, "hi", "cpu.weight")); got != "1709" {
		t.Errorf("priority 1: cpu.weight %s, want 1709", got)
	}
	if got := read(filepath.Join(parent, "lo", "cpu.weight")); got != "4" {
		t.Errorf("priority 16: cpu.weight %s, want 4", got)
	}
	// Goal management moves a running server's weight.
	if err := hi.SetWeight(800, nil, nil); err != nil {
		t.Fatal(err)
	}
	if got := read(filepath.Join(parent, "hi", "cpu.weight")); got != "800" || hi.Weight() != 800 {
		t.Errorf("after SetWeight(800): cpu.weight %s, Weight %d", got, hi.Weight())
	}
	if err := lo.SetWeight(12, nil, nil); err != nil {
		t.Fatal(err)
	}
	if got := read(filepath.Join(parent, "lo", "cpu.weight")); got != "12" {
		t.Errorf("after SetWeight(12): cpu.weight %s", got)
	}
	// A child is to be born in the group (clone3 into its directory).
	attr := &syscall.SysProcAttr{}
	if _, err := hi.Prepare(attr); err != nil || !attr.UseCgroupFD || attr.CgroupFD <= 0 {
		t.Errorf("Prepare: %v, UseCgroupFD %v, CgroupFD %d; want the group's directory to clone into", err, attr.UseCgroupFD, attr.CgroupFD)
	}
	if st := c.Status(); st.Mechanism != MechanismCgroup2 || st.Path != filepath.Join(mnt, parent) || st.Placement != PlacementClone {
		t.Errorf("status %+v", st)
	}
	for _, g := range []*CPUGroup{hi, lo} {
		g.mu.Lock()
		if g.fd >= 0 {
			_ = syscall.Close(g.fd)
			g.fd = -1
		}
		g.closed = true
		g.mu.Unlock()
	}
}
