package procmgr

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tpsched/internal/testenv"
)

// skipOrFail skips with why, or fails when CI demands the privileged paths
// (testenv: CI=true or TPSCHED_REQUIRE_BPF=1).
func skipOrFail(t *testing.T, why string) {
	t.Helper()
	testenv.SkipOrFail(t, "%s", why)
}

func needRoot(t *testing.T) {
	t.Helper()
	testenv.RequireRoot(t, "creating cgroups")
}

func uniqueParent() string {
	return fmt.Sprintf("tpsched-test-%d-%d", os.Getpid(), time.Now().UnixNano())
}

// rmdirTree removes the cgroup directories under dir, deepest first (cgroup
// files cannot be unlinked, so os.RemoveAll does not work on cgroupfs).
func rmdirTree(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if e.IsDir() {
			rmdirTree(t, filepath.Join(dir, e.Name()))
		}
	}
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		t.Errorf("cleanup: rmdir %s: %v", dir, err)
	}
}

func TestCPUWeightSharesNice(t *testing.T) {
	tests := []struct {
		priority, weight, shares, nice int
	}{
		{1, 1709, 17500, -10},
		{2, 1139, 11663, -9},
		{7, 150, 1536, -1},
		{8, 100, 1024, 0},
		{9, 67, 686, 1},
		{16, 4, 40, 10},
		{0, 100, 1024, 0},  // unset: default
		{17, 100, 1024, 0}, // out of range: default
		{-3, 100, 1024, 0},
	}
	for _, tt := range tests {
		w := Weight(tt.priority)
		if w != tt.weight || Shares(w) != tt.shares || Nice(tt.priority) != tt.nice {
			t.Errorf("priority %d: weight %d shares %d nice %d, want %d %d %d",
				tt.priority, w, Shares(w), Nice(tt.priority), tt.weight, tt.shares, tt.nice)
		}
	}
	for p := 1; p <= 16; p++ {
		w := Weight(p)
		if w < 1 || w > 10000 {
			t.Errorf("Weight(%d) = %d, outside cpu.weight's 1..10000", p, w)
		}
		if n := Nice(p); n < -20 || n > 19 {
			t.Errorf("Nice(%d) = %d, outside -20..19", p, n)
		}
		if p > 1 {
			if Weight(p) >= Weight(p-1) || Shares(Weight(p)) >= Shares(Weight(p-1)) || Nice(p) <= Nice(p-1) {
				t.Errorf("priority %d is not strictly lower than %d", p, p-1)
			}
			if r := float64(Weight(p-1)) / float64(Weight(p)); r < 1.3 || r > 1.7 {
				t.Errorf("Weight(%d)/Weight(%d) = %.2f, want ~1.5", p-1, p, r)
			}
		}
	}
	for _, tt := range []struct{ weight, shares int }{{0, 2}, {1, 10}, {100, 1024}, {10000, 102400}, {1 << 20, 262144}} {
		if got := Shares(tt.weight); got != tt.shares {
			t.Errorf("Shares(%d) = %d, want %d", tt.weight, got, tt.shares)
		}
	}
}

func TestCPUMountinfoParse(t *testing.T) {
	tests := []struct {
		line string
		ok   bool
		want cgroupMount
	}{
		{"32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu", true,
			cgroupMount{"/sys/fs/cgroup/cpu", "cgroup", true, "rw,cpu"}},
		{"32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw shared:9 - cgroup cgroup rw,cpu,cpuacct", true,
			cgroupMount{"/sys/fs/cgroup/cpu,cpuacct", "cgroup", true, "rw,cpu,cpuacct"}},
		{"33 31 0:30 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct", true,
			cgroupMount{"/sys/fs/cgroup/cpuacct", "cgroup", false, "rw,cpuacct"}},
		{"34 31 0:31 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset", true,
			cgroupMount{"/sys/fs/cgroup/cpuset", "cgroup", false, "rw,cpuset"}},
		{`41 31 0:38 / /mnt/my\040cg rw shared:1 master:2 - cgroup2 cgroup2 rw,nsdelegate`, true,
			cgroupMount{"/mnt/my cg", "cgroup2", false, "rw,nsdelegate"}},
		{"31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755", false, cgroupMount{}},
		{"garbage", false, cgroupMount{}},
	}
	for _, tt := range tests {
		got, ok := parseMountinfoLine(tt.line)
		if ok != tt.ok || got != tt.want {
			t.Errorf("%q: got %+v %v, want %+v %v", tt.line, got, ok, tt.want, tt.ok)
		}
	}
}

func TestCPUDetectFallsBackToNice(t *testing.T) {
	mi := filepath.Join(t.TempDir(), "mountinfo")
	line := "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
	if err := os.WriteFile(mi, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	c := detect(mi, "tpsched")
	if c.Mechanism() != MechanismNice || !strings.Contains(c.Reason(), "no cpu controller") {
		t.Fatalf("got %s (%s), want nice for no cpu controller", c.Mechanism(), c.Reason())
	}
	if st := c.Status(); st.Placement != PlacementNice || st.Path != "" {
		t.Errorf("status %+v", st)
	}
	if c := detect(mi, "../x"); c.Mechanism() != MechanismNice || !strings.Contains(c.Reason(), "bad cgroup parent") {
		t.Errorf("bad parent: got %s (%s)", c.Mechanism(), c.Reason())
	}
	// A v1 cpu "mount" that is a plain directory is not writable as a
	// cgroup: the reason names it.
	dir := t.TempDir()
	line = "32 31 0:29 / " + dir + " rw - cgroup cgroup rw,cpu\n"
	if err := os.WriteFile(mi, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	c = detect(mi, "tpsched")
	if c.Mechanism() != MechanismNice || !strings.Contains(c.Reason(), "no writable cgroup: cgroup v1 at "+dir) {
		t.Fatalf("got %s (%s)", c.Mechanism(), c.Reason())
	}
}

func TestCPUDetect(t *testing.T) {
	needRoot(t)
	c := DetectCPUControl(uniqueParent())
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	t.Logf("mechanism %s: %s", c.Mechanism(), c.Reason())
	if c.Mechanism() == MechanismNice {
		skipOrFail(t, "no writable cgroup: "+c.Reason())
	}
	if hasController("/sys/fs/cgroup", "cpu") {
		if c.Mechanism() != MechanismCgroup2 || !strings.Contains(c.Reason(), "cgroup v2 at /sys/fs/cgroup") {
			t.Errorf("cpu on the unified hierarchy: got %s (%s)", c.Mechanism(), c.Reason())
		}
	} else if _, err := os.Stat("/sys/fs/cgroup/cpu/cpu.shares"); err == nil {
		// This development machine.
		if c.Mechanism() != MechanismCgroup1 || !strings.Contains(c.Reason(), "/sys/fs/cgroup/cpu") {
			t.Errorf("cpu on v1 at /sys/fs/cgroup/cpu: got %s (%s)", c.Mechanism(), c.Reason())
		}
	}
	if fi, err := os.Stat(c.Status().Path); err != nil || !fi.IsDir() {
		t.Errorf("parent cgroup %q: %v", c.Status().Path, err)
	}
}

// v1Control sets up the v1 cpu hierarchy under a unique parent, skipping
// when this host has none.
func v1Control(t *testing.T) *CPUControl {
	t.Helper()
	// Skips where cpu is on cgroup v2 instead; fails in CI where it is on
	// neither.
	testenv.RequireCgroup(t, 1, "cpu")
	mounts, err := cgroupMounts(mountinfoPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		if m.fstype == "cgroup" && m.cpu {
			c, err := setupV1(m.point, uniqueParent())
			if err != nil {
				skipOrFail(t, "v1 cpu hierarchy not writable: "+err.Error())
			}
			t.Cleanup(func() { rmdirTree(t, c.dir) })
			return c
		}
	}
	t.Fatalf("cpu is on cgroup v1 (testenv) but %s lists no v1 cpu mount", mountinfoPath)
	return nil
}

// v2Control mounts a cgroup2 hierarchy at a temporary directory and sets up
// a unique parent in it. Where the cpu controller is bound to v1 (this
// machine) it cannot be enabled, so only placement is tested, not cpu.weight.
func v2Control(t *testing.T) *CPUControl {
	t.Helper()
	needRoot(t)
	mnt := t.TempDir()
	if err := unix.Mount("none", mnt, "cgroup2", 0, ""); err != nil {
		skipOrFail(t, "mount -t cgroup2: "+err.Error())
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("umount %s: %v", mnt, err)
		}
	})
	withCPU := hasController(mnt, "cpu")
	if !withCPU {
		t.Log("cgroup2 hierarchy has no cpu controller (bound to v1 here): testing placement only, not cpu.weight")
	}
	c, err := setupV2(mnt, uniqueParent(), withCPU)
	if err != nil {
		skipOrFail(t, "cgroup2 not usable: "+err.Error())
	}
	t.Cleanup(func() { rmdirTree(t, c.dir) })
	return c
}

// startIn starts `sleep 30` in g the way procmgr does: Prepare, Start, after.
func startIn(t *testing.T, g *CPUGroup) (*exec.Cmd, *syscall.SysProcAttr) {
	t.Helper()
	cmd := exec.Command("sleep", "30")
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	cmd.SysProcAttr = attr
	after, err := g.Prepare(attr)
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if err := after(cmd.Process.Pid); err != nil {
		t.Errorf("after: %v", err)
	}
	return cmd, attr
}

// procCgroup returns the child's cgroup path on the hierarchy whose
// /proc/<pid>/cgroup controller field satisfies match.
func procCgroup(t *testing.T, pid int, match func(ctrls string) bool) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 && match(f[1]) {
			return f[2]
		}
	}
	t.Fatalf("pid %d: no matching line in %s", pid, b)
	return ""
}

func readInt(t *testing.T, file string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return n
}

func stopAndRemove(t *testing.T, cmd *exec.Cmd, g *CPUGroup) {
	t.Helper()
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(g.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still there after Remove: %v", g.Path(), err)
	}
	if _, err := g.Prepare(&syscall.SysProcAttr{}); err == nil {
		t.Error("Prepare after Remove succeeded")
	}
}

func TestCPUGroupCgroup1(t *testing.T) {
	c := v1Control(t)
	hi, err := c.NewGroup("hi", 1)
	if err != nil {
		t.Fatal(err)
	}
	lo, err := c.NewGroup("lo", 16)
	if err != nil {
		t.Fatal(err)
	}
	if got := readInt(t, filepath.Join(hi.Path(), "cpu.shares")); got != 17500 {
		t.Errorf("priority 1: cpu.shares %d, want 17500", got)
	}
	if got := readInt(t, filepath.Join(lo.Path(), "cpu.shares")); got != 40 {
		t.Errorf("priority 16: cpu.shares %d, want 40", got)
	}
	cmd, attr := startIn(t, hi)
	if attr.UseCgroupFD {
		t.Error("cgroup1 set UseCgroupFD")
	}
	want := strings.TrimPrefix(hi.Path(), "/sys/fs/cgroup/cpu")
	got := procCgroup(t, cmd.Process.Pid, func(c string) bool { return hasWord(strings.ReplaceAll(c, ",", " "), "cpu") })
	if !strings.HasSuffix(got, "/"+filepath.Base(c.dir)+"/hi") {
		t.Errorf("child in cpu cgroup %q, want %q", got, want)
	}
	stopAndRemove(t, cmd, hi)
	if err := lo.Remove(); err != nil {
		t.Fatal(err)
	}
	if st := c.Status(); st.Mechanism != MechanismCgroup1 || st.Placement != PlacementProcs {
		t.Errorf("status %+v", st)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(c.dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("parent %s still there after Close: %v", c.dir, err)
	}
}

func TestCPUGroupCgroup2(t *testing.T) {
	c := v2Control(t)
	hi, err := c.NewGroup("hi", 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hi.Remove() })
	if c.weight {
		if got := readInt(t, filepath.Join(hi.Path(), "cpu.weight")); got != 1709 {
			t.Errorf("priority 1: cpu.weight %d, want 1709", got)
		}
	}
	isV2 := func(c string) bool { return c == "" }
	wantSuffix := "/" + filepath.Base(c.dir) + "/hi"

	// Placement at clone.
	cmd, attr := startIn(t, hi)
	if !attr.UseCgroupFD || attr.CgroupFD <= 0 {
		t.Errorf("cgroup2 Prepare: UseCgroupFD %v CgroupFD %d", attr.UseCgroupFD, attr.CgroupFD)
	}
	if got := procCgroup(t, cmd.Process.Pid, isV2); !strings.HasSuffix(got, wantSuffix) {
		t.Errorf("child (clone) in %q, want ...%s", got, wantSuffix)
	}
	if st := c.Status(); st.Placement != PlacementClone {
		t.Errorf("status %+v, want placement clone", st)
	}

	// A Start that failed with the cgroup fd: retry places by cgroup.procs,
	// and once that works the node keeps to it.
	if !hi.StartFailed(attr, unix.ENOSYS) || attr.UseCgroupFD {
		t.Fatal("StartFailed did not ask for a retry without UseCgroupFD")
	}
	if hi.StartFailed(attr, unix.ENOSYS) {
		t.Error("StartFailed asked for a retry of a start without UseCgroupFD")
	}
	cmd2, attr2 := startIn(t, hi)
	if attr2.UseCgroupFD {
		t.Error("retry Prepare set UseCgroupFD")
	}
	if got := procCgroup(t, cmd2.Process.Pid, isV2); !strings.HasSuffix(got, wantSuffix) {
		t.Errorf("child (cgroup.procs) in %q, want ...%s", got, wantSuffix)
	}
	if st := c.Status(); st.Placement != PlacementProcs || !strings.Contains(st.Reason, "clone into cgroup failed") {
		t.Errorf("status %+v, want placement cgroup.procs with the reason", st)
	}
	lo, err := c.NewGroup("lo", 16)
	if err != nil {
		t.Fatal(err)
	}
	cmd3, attr3 := startIn(t, lo)
	if attr3.UseCgroupFD {
		t.Error("Prepare used clone after the node downgraded")
	}
	if got := procCgroup(t, cmd3.Process.Pid, isV2); !strings.HasSuffix(got, "/lo") {
		t.Errorf("child in %q, want .../lo", got)
	}

	// Remove waits for the tasks; with one left it reports EBUSY.
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err := hi.Remove(); !errors.Is(err, unix.EBUSY) || !strings.Contains(err.Error(), strconv.Itoa(cmd2.Process.Pid)) {
		t.Errorf("Remove with a live process: %v, want EBUSY naming pid %d", err, cmd2.Process.Pid)
	}
	stopAndRemove(t, cmd2, hi)
	stopAndRemove(t, cmd3, lo)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// statNice reads field 19 (nice) of /proc/<pid>/stat.
func statNice(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]) // f[0] is field 3
	n, err := strconv.Atoi(f[19-3])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestCPUGroupNice(t *testing.T) {
	c := niceControl("test")
	prios := []int{12} // nice +5: allowed to anyone
	if os.Geteuid() == 0 {
		prios = append(prios, 1, 16)
	}
	for _, p := range prios {
		g, err := c.NewGroup(fmt.Sprintf("n%d", p), p)
		if err != nil {
			t.Fatal(err)
		}
		if g.Path() != "" {
			t.Errorf("nice group has a path %q", g.Path())
		}
		cmd, attr := startIn(t, g)
		if attr.UseCgroupFD {
			t.Error("nice set UseCgroupFD")
		}
		if got := statNice(t, cmd.Process.Pid); got != Nice(p) {
			t.Errorf("priority %d: child nice %d, want %d", p, got, Nice(p))
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if err := g.Remove(); err != nil {
			t.Error(err)
		}
	}
	if err := c.Close(); err != nil {
		t.Error(err)
	}
}

// A daemon killed without cleaning up leaves tpsched/scdd-<pid>/<server>;
// the next one removes it, and leaves a live daemon's alone.
func TestCPUStaleDaemonGroupsRemoved(t *testing.T) {
	needRoot(t)
	base := uniqueParent()
	probe := DetectCPUControl(base + "/probe")
	if probe.Mechanism() == MechanismNice {
		skipOrFail(t, "no writable cgroup: "+probe.Reason())
	}
	root := filepath.Dir(probe.Status().Path)
	t.Cleanup(func() { _ = probe.Close(); rmdirTree(t, root) })
	const deadPID = 4194304 + 7 // above Linux's largest pid_max: no such process
	dead := filepath.Join(root, fmt.Sprintf("scdd-%d", deadPID))
	live := filepath.Join(root, fmt.Sprintf("scdd-%d", os.Getppid()))
	for _, d := range []string{filepath.Join(dead, "echo"), filepath.Join(live, "echo")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	m := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		CPUParent: filepath.Base(root) + "/scdd-" + strconv.Itoa(os.Getpid())})
	for _, p := range m.Containment().Paths {
		t.Cleanup(func() { rmdirTree(t, filepath.Dir(p)) }) // the base level of the other hierarchies
	}
	m.Close()
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("the dead daemon's cgroup %s is still there (%v)", dead, err)
	}
	if _, err := os.Stat(filepath.Join(live, "echo")); err != nil {
		t.Errorf("a live daemon's cgroup was touched: %v", err)
	}
}

// startDeadDaemonsUAP starts a process that stands for a UAP of a daemon
// killed with kill -9: placed in the given cgroups (one per hierarchy) and
// in a process group of its own, it forks a grandchild in a session of
// its own, which no kill by pid or process group of the daemon's reaches.
// It returns both pids; they are killed at cleanup whatever the test did.
func startDeadDaemonsUAP(t *testing.T, cgroups []string) (pid, gpid int, exited <-chan error) {
	t.Helper()
	cmd := exec.Command("sh", "-c", "read x; setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $!; exec sleep 600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid = cmd.Process.Pid
	// Registered after the cgroups' removal, so run before it: the
	// processes must have left the cgroups for rmdir to work.
	t.Cleanup(func() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		if gpid > 0 {
			_ = syscall.Kill(gpid, syscall.SIGKILL)
		}
		deadline := time.Now().Add(waitLimit)
		for !(gone(pid) && (gpid <= 0 || gone(gpid))) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	})
	// Placed before it forks, so the grandchild is born in the cgroups.
	for _, d := range cgroups {
		if err := writeCgroupFile(filepath.Join(d, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := in.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 32)
	n, err := out.Read(line)
	if err != nil {
		t.Fatal(err)
	}
	if gpid, err = strconv.Atoi(strings.TrimSpace(string(line[:n]))); err != nil {
		t.Fatalf("grandchild pid %q: %v", line[:n], err)
	}
	ch := make(chan error, 1)
	go func() { ch <- cmd.Wait() }()
	return pid, gpid, ch
}

// A daemon killed with kill -9 leaves its servers' processes running in
// tpsched/scdd-<pid>/<server>, among them children in process groups and
// sessions of their own. The next daemon kills them, whatever hierarchies
// hold them, and removes the cgroups (issue 27 break 5; on the old code,
// which only rmdir'd, the processes lived on and rmdir failed with EBUSY).
func TestStaleDaemonGroupsProcessesAreKilled(t *testing.T) {
	needRoot(t)
	base := uniqueParent()
	probeParent := base + "/probe"
	probe := DetectCPUControl(probeParent)
	if probe.Mechanism() == MechanismNice {
		skipOrFail(t, "no writable cgroup: "+probe.Reason())
	}
	pc := detectContainment(mountinfoPath, probeParent, probe)
	parents := []string{probe.dir}
	if pc.v2dir != "" && !pc.v2shared {
		parents = append(parents, pc.v2dir)
	}
	for _, h := range pc.v1 {
		parents = append(parents, h.dir)
	}
	const deadPID = 4194304 + 7 // above Linux's largest pid_max: no such process
	var dead []string
	for _, p := range parents {
		root := filepath.Dir(p)
		t.Cleanup(func() { rmdirTree(t, root) })
		d := filepath.Join(root, fmt.Sprintf("scdd-%d", deadPID), "echo")
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		dead = append(dead, d)
	}
	t.Logf("dead daemon's cgroups: %v", dead)
	pid, gpid, exited := startDeadDaemonsUAP(t, dead)

	buf := &testenv.SyncBuffer{}
	m := New(Options{Logger: slog.New(slog.NewTextHandler(buf, nil)),
		CPUParent: base + "/scdd-" + strconv.Itoa(os.Getpid())})
	m.Close()
	select {
	case err := <-exited:
		if ws, ok := err.(*exec.ExitError); !ok || ws.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("the dead daemon's UAP ended with %v, want SIGKILL", err)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("the dead daemon's UAP %d still runs 10s after the next daemon started; log:\n%s", pid, buf)
	}
	waitUntil(t, "the grandchild in a session of its own dead", func() bool { return gone(gpid) })
	for _, d := range dead {
		if _, err := os.Stat(filepath.Dir(d)); !os.IsNotExist(err) {
			t.Errorf("the dead daemon's cgroup %s is still there (%v)", filepath.Dir(d), err)
		}
	}
	if !strings.Contains(buf.String(), "killed=2") {
		t.Errorf("the log does not say 2 processes were killed:\n%s", buf)
	}
}

// Each way of killing a dead daemon's cgroup, on the one hierarchy that
// offers it: cgroup.kill (v2), the v1 freezer, and SIGKILL to each member
// until none is left (v1 pids, which has neither).
func TestStaleDaemonGroupKilledByEachMechanism(t *testing.T) {
	needRoot(t)
	mounts, err := cgroupMounts(mountinfoPath)
	if err != nil {
		t.Fatal(err)
	}
	find := func(match func(m cgroupMount) bool) string {
		for _, m := range mounts {
			if match(m) {
				return m.point
			}
		}
		return ""
	}
	v1 := func(ctl string) func(m cgroupMount) bool {
		return func(m cgroupMount) bool {
			return m.fstype == "cgroup" && hasWord(strings.ReplaceAll(m.opts, ",", " "), ctl)
		}
	}
	for _, tc := range []struct {
		name  string
		mount string
	}{
		{"cgroup.kill", find(func(m cgroupMount) bool { return m.fstype == "cgroup2" })},
		{"freezer", find(v1("freezer"))},
		{"each member", find(v1("pids"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.mount == "" {
				skipOrFail(t, "no hierarchy for "+tc.name+" on this host")
			}
			root := filepath.Join(tc.mount, uniqueParent())
			t.Cleanup(func() { rmdirTree(t, root) })
			dead := filepath.Join(root, "scdd-4194311")
			if err := os.MkdirAll(filepath.Join(dead, "echo"), 0o755); err != nil {
				t.Fatal(err)
			}
			if tc.name == "cgroup.kill" && !exists(filepath.Join(dead, "cgroup.kill")) {
				skipOrFail(t, "no cgroup.kill (Linux before 5.14)")
			}
			pid, gpid, exited := startDeadDaemonsUAP(t, []string{filepath.Join(dead, "echo")})
			stale := staleDaemonGroups(filepath.Join(root, "scdd-"+strconv.Itoa(os.Getpid())))
			if len(stale) != 1 || stale[0] != dead {
				t.Fatalf("stale groups %v, want [%s]", stale, dead)
			}
			removed, killed, err := removeStaleGroups(stale)
			if err != nil || killed != 2 || len(removed) != 1 {
				t.Errorf("removeStaleGroups = %v, %d killed, %v; want [%s], 2, nil", removed, killed, err, dead)
			}
			select {
			case <-exited:
			case <-time.After(waitLimit):
				t.Errorf("process %d still runs", pid)
			}
			waitUntil(t, "the grandchild dead", func() bool { return gone(gpid) })
			if _, err := os.Stat(dead); !os.IsNotExist(err) {
				t.Errorf("%s is still there (%v)", dead, err)
			}
		})
	}
}

// A scdd-<pid> group whose pid is alive counts as a running daemon's only
// if that process started before the group was made: one that started
// after has the dead daemon's pid again, and the group is stale (before,
// a reused pid kept the dead daemon's escaped UAPs alive through every
// later start).
func TestStaleDaemonGroupOfAReusedPid(t *testing.T) {
	base := t.TempDir()
	self := filepath.Join(base, "scdd-1")
	alive := os.Getpid() // alive, and started before the group below was made
	dir := filepath.Join(base, "scdd-"+strconv.Itoa(alive))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if stale := staleDaemonGroups(self); len(stale) != 0 {
		t.Fatalf("stale groups %v; want none: its daemon runs", stale)
	}
	real := procStarted
	t.Cleanup(func() { procStarted = real })
	procStarted = func(pid int) (time.Time, error) { // the pid taken by a process started later
		if pid == alive {
			return time.Now().Add(5 * time.Second), nil
		}
		return real(pid)
	}
	if stale := staleDaemonGroups(self); len(stale) != 1 || stale[0] != dir {
		t.Fatalf("stale groups %v; want [%s]: its pid is another process's now", stale, dir)
	}
}
