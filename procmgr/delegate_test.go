package procmgr

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// delegationHost makes, on the v2 hierarchy, <unique>/tpsched.service (a
// unit's cgroup, marked delegated as systemd marks one with Delegate=yes
// when delegated is set) and starts a process standing for scdd in it, or
// in its leaf <unit>/scdd when inLeaf is set. It returns the unit's
// cgroup and the process's pid.
func delegationHost(t *testing.T, delegated, inLeaf bool) (unit string, pid int) {
	t.Helper()
	needRoot(t)
	mounts, err := cgroupMounts(mountinfoPath)
	if err != nil {
		t.Fatal(err)
	}
	mount := ""
	for _, m := range mounts {
		if m.fstype == "cgroup2" {
			mount = m.point
			break
		}
	}
	if mount == "" {
		skipOrFail(t, "no cgroup v2 hierarchy")
	}
	top := filepath.Join(mount, uniqueParent())
	unit = filepath.Join(top, "tpsched.service")
	t.Cleanup(func() { rmdirTree(t, top) })
	if err := os.MkdirAll(filepath.Join(unit, daemonLeaf), 0o755); err != nil {
		t.Fatal(err)
	}
	if delegated {
		if err := unix.Setxattr(unit, "trusted.delegate", []byte("1"), 0); err != nil {
			skipOrFail(t, "cgroupfs takes no trusted.delegate xattr: "+err.Error())
		}
	}
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	in := unit
	if inLeaf {
		in = filepath.Join(unit, daemonLeaf)
	}
	if err := writeCgroupFile(filepath.Join(in, "cgroup.procs"), strconv.Itoa(cmd.Process.Pid)); err != nil {
		t.Fatal(err)
	}
	return unit, cmd.Process.Pid
}

// v2CgroupOf is pid's cgroup directory on the v2 hierarchy.
func v2CgroupOf(t *testing.T, pid int) string {
	t.Helper()
	own, err := ownCgroupV2("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	return own
}

// Under systemd with Delegate=yes the UAPs' v2 cgroups go under scdd's
// own cgroup (issue 29 item 5), scdd having moved itself into a leaf so
// that the unit's cgroup may enable controllers for its children; the log
// says so. Also when scdd starts in the leaf already (a restart's new
// scdd, or DelegateSubgroup=scdd).
func TestDelegatedCgroupHoldsTheUAPs(t *testing.T) {
	for _, inLeaf := range []bool{false, true} {
		t.Run("in leaf "+strconv.FormatBool(inLeaf), func(t *testing.T) {
			unit, self := delegationHost(t, true, inLeaf)
			parent := uniqueParent() + "/scdd-" + strconv.Itoa(self)
			m, log := loggedManager(t, Options{CPUParent: parent, selfPID: self})
			for _, p := range m.Containment().Paths {
				t.Cleanup(func() { rmdirTree(t, filepath.Dir(p)) }) // the v1 ones, at the top
			}
			if got := m.contain.v2dir; got != filepath.Join(unit, parent) {
				t.Fatalf("the UAPs' v2 parent is %q, want %q under the delegated cgroup; log:\n%s", got, filepath.Join(unit, parent), log)
			}
			leaf := filepath.Join(unit, daemonLeaf)
			if got := v2CgroupOf(t, self); !strings.HasSuffix(leaf, got) {
				t.Errorf("scdd is in %q, want the leaf %s", got, leaf)
			}
			if !strings.Contains(log.String(), "go under scdd's delegated cgroup") || !strings.Contains(log.String(), "moved="+strconv.FormatBool(!inLeaf)) {
				t.Errorf("the log does not say where the UAPs' cgroups went:\n%s", log)
			}
			dir := t.TempDir()
			srv := startServer(t, m, uapSpec("sleep", dir, 1), &hooks{})
			rep := readReport(t, dir, 0, 0)
			pid, _ := strconv.Atoi(rep["pid"])
			if got, want := v2CgroupOf(t, pid), filepath.Join(unit, parent, "srv-sleep"); !strings.HasSuffix(want, got) || !strings.Contains(got, "tpsched.service") {
				t.Errorf("the UAP is in %q, want %s", got, want)
			}
			stopNow(t, srv)
			m.Close()
			if _, err := os.Stat(filepath.Join(unit, parent)); !os.IsNotExist(err) {
				t.Errorf("the UAPs' parent under the unit is left after Close: %v", err)
			}
		})
	}
}

// A unit's cgroup that was not delegated (no Delegate=yes) is systemd's:
// the UAPs' cgroups stay at the hierarchy's top, scdd stays where it is,
// and the log says why.
func TestUndelegatedCgroupKeepsTheTopPlacement(t *testing.T) {
	unit, self := delegationHost(t, false, false)
	parent := uniqueParent() + "/scdd-" + strconv.Itoa(self)
	m, log := loggedManager(t, Options{CPUParent: parent, selfPID: self})
	for _, p := range m.Containment().Paths {
		t.Cleanup(func() { rmdirTree(t, filepath.Dir(p)) })
	}
	if got := m.contain.v2dir; got == "" || strings.HasPrefix(got, unit) {
		t.Errorf("the UAPs' v2 parent is %q, want one at the hierarchy's top", got)
	}
	if got := v2CgroupOf(t, self); !strings.HasSuffix(unit, got) {
		t.Errorf("scdd was moved to %q from %s", got, unit)
	}
	if !strings.Contains(log.String(), "go at each cgroup hierarchy's top") || !strings.Contains(log.String(), "not delegated") {
		t.Errorf("the log does not say why the UAPs' cgroups are at the top:\n%s", log)
	}
	m.Close()
}

// Under a delegated cgroup whose children have no cpu controller (as
// systemd leaves a Delegate=yes unit's), servers at the default priority
// share the unit's CPU with scdd: their cgroups contain them without the
// controller, and Path says they have no cpu cgroup. The first weight
// enables it for every server (the unit's cgroup.subtree_control), and
// sets the weighted one's cpu.weight; a server started with a priority
// of its own enables it at its start.
func TestSharedCPUGroupUnderDelegatedCgroupV2(t *testing.T) {
	for _, weighted := range []string{"by a weight", "by a server's priority"} {
		t.Run(weighted, func(t *testing.T) {
			unit, self := delegationHost(t, true, true)
			mount := filepath.Dir(filepath.Dir(unit))
			if !hasController(mount, "cpu") {
				// Not skipOrFail: make check-purev2 runs it, and fails if it skips.
				t.Skip("the v2 hierarchy has no cpu controller (bound to v1 on this host)")
			}
			for _, dir := range []string{mount, filepath.Dir(unit)} { // as systemd makes cpu a delegated unit's
				if err := enableController(dir, "cpu"); err != nil {
					skipOrFail(t, "no cpu controller to delegate: "+err.Error())
				}
			}
			parent := uniqueParent() + "/scdd-" + strconv.Itoa(self)
			m, log := loggedManager(t, Options{CPUParent: parent, selfPID: self})
			if m.cpu.mech != MechanismCgroup2 || !m.cpu.lazy {
				t.Fatalf("mechanism %s, lazy %v: want cgroup2 with the cpu controller off below the unit; log:\n%s", m.cpu.mech, m.cpu.lazy, log)
			}
			cpuOn := func() bool { return subtreeHas(unit, "cpu") }
			dir := t.TempDir()
			sp := uapSpec("sleep", dir, 1)
			sp.SharedCPU = true
			srv := startServer(t, m, sp, &hooks{})
			pid, _ := strconv.Atoi(readReport(t, dir, 0, 0)["pid"])
			srvDir := filepath.Join(unit, parent, sp.Server)
			if got := v2CgroupOf(t, pid); !strings.HasSuffix(srvDir, got) || !strings.Contains(got, "tpsched.service") {
				t.Errorf("the UAP is in %q, want its server's cgroup %s", got, srvDir)
			}
			if cpuOn() || srv.CPUGroup().Path() != "" || exists(filepath.Join(srvDir, "cpu.weight")) {
				t.Fatalf("a shared server has a cpu cgroup: the unit enables cpu %v, its path %q", cpuOn(), srv.CPUGroup().Path())
			}
			if !strings.Contains(m.cpu.Reason(), "share scdd's CPU") {
				t.Errorf("the reason does not say the servers share scdd's CPU: %s", m.cpu.Reason())
			}
			want := 150
			if weighted == "by a weight" {
				if err := srv.SetCPUWeight(want); err != nil {
					t.Fatal(err)
				}
			} else {
				odir := t.TempDir()
				own := uapSpec("sleep", odir, 1)
				own.Server, own.Priority = "srv-own", 3
				osrv := startServer(t, m, own, &hooks{})
				readReport(t, odir, 0, 0)
				if got := readInt(t, filepath.Join(osrv.CPUGroup().Path(), "cpu.weight")); got != Weight(3) {
					t.Errorf("the server at priority 3: cpu.weight %d, want %d", got, Weight(3))
				}
				want = Weight(DefaultPriority)
			}
			if !cpuOn() || srv.CPUGroup().Path() != srvDir {
				t.Fatalf("after a server needed a weight: the unit enables cpu %v, the shared server's path %q, want %s", cpuOn(), srv.CPUGroup().Path(), srvDir)
			}
			if got := readInt(t, filepath.Join(srvDir, "cpu.weight")); got != want {
				t.Errorf("the shared server's cpu.weight %d, want %d", got, want)
			}
			if got := v2CgroupOf(t, pid); !strings.HasSuffix(srvDir, got) {
				t.Errorf("the UAP moved to %q", got)
			}
		})
	}
}
