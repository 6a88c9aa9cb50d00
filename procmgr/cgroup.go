package procmgr

// CPU priority for UAP processes: schedule_priority (1 highest .. 16
// lowest, default 8) becomes a CPU weight, enforced by the first of these
// that works on the host, chosen once per node by DetectCPUControl:
//
//   - cgroup2: cpu.weight in <mount>/<parent>/<server> on the unified
//     hierarchy, when it carries the cpu controller and "+cpu" can be enabled
//     in cgroup.subtree_control from the mount down to <parent>. Children are
//     placed at clone (SysProcAttr.UseCgroupFD, clone3, Linux 5.7+).
//   - cgroup1: cpu.shares in the same layout under the v1 cpu hierarchy found
//     in /proc/self/mountinfo (cpu or cpu,cpuacct). Children are born in it:
//     the spawning thread joins the cgroup's "tasks" before the fork
//     (spawn.go); cgroup.procs is written after Start only when it could not.
//   - nice: no cgroup is writable; setpriority on every thread of the child
//     as soon as Start returns. Negative nice values need CAP_SYS_NICE (or
//     RLIMIT_NICE); without it high priorities are reported and not applied.
//
// Needs root for cgroup1. cgroup2 needs root too, or a scdd that runs in a
// systemd unit with Delegate=yes (delegate.go): its UAPs' cgroups then go
// under the unit's own cgroup.

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"tpsched/bpf"
)

// Mechanism says how UAP CPU priority is enforced on this host.
type Mechanism string

const (
	MechanismCgroup2 Mechanism = "cgroup2" // cpu.weight on the unified hierarchy
	MechanismCgroup1 Mechanism = "cgroup1" // cpu.shares on the v1 cpu hierarchy
	MechanismNice    Mechanism = "nice"    // setpriority; no writable cgroup
)

// Placement says how a child gets into its CPU group.
const (
	PlacementClone = "clone"        // clone3 CLONE_INTO_CGROUP via SysProcAttr.UseCgroupFD
	PlacementProcs = "cgroup.procs" // pid written to cgroup.procs after Start
	PlacementNice  = "setpriority"  // no group: nice set after Start
	// PlacementThread: the spawning thread joins the v1 cgroup (its tasks
	// file) for the fork, so the child is born in it (procmgr's Manager).
	PlacementThread = "spawning thread"
)

const (
	mountinfoPath = "/proc/self/mountinfo"
	// removeWait bounds how long Remove waits for exited tasks to leave a
	// cgroup before it reports EBUSY.
	removeWait = time.Second
)

// weights maps schedule_priority 1..16 to a cgroup v2 cpu.weight:
// round(100 * 1.5^(8-priority)), so each step is 1.5x the CPU share of the
// next lower one and the default 8 is the kernel's default weight 100.
// Priority 1 gets ~427 times the CPU of priority 16 when both are busy.
var weights = [16]int{1709, 1139, 759, 506, 338, 225, 150, 100, 67, 44, 30, 20, 13, 9, 6, 4}

// nices maps schedule_priority 1..16 to a nice value for the fallback: 0 at
// the default 8, -10 at 1 and +10 at 16, linear on each side. CFS makes each
// nice step ~1.25x, so this range is narrower than the weights' range.
var nices = [16]int{-10, -9, -7, -6, -4, -3, -1, 0, 1, 3, 4, 5, 6, 8, 9, 10}

// DefaultPriority is schedule_priority when none is configured.
const DefaultPriority = 8

func priorityIndex(priority int) int {
	if priority < 1 || priority > 16 {
		priority = DefaultPriority
	}
	return priority - 1
}

// Weight maps schedule_priority 1 (highest) .. 16 (lowest) to a cgroup v2
// cpu.weight (1709 .. 4; 8 -> 100, each step 1.5x). A priority outside
// 1..16 is treated as unset, i.e. the default 8.
func Weight(priority int) int { return weights[priorityIndex(priority)] }

// Shares converts a v2 weight to v1 cpu.shares: weight x 1024 / 100 (100 ->
// the v1 default 1024), clamped to cpu.shares' range 2..262144.
func Shares(weight int) int { return min(max(weight*1024/100, 2), 262144) }

// Nice maps schedule_priority to the fallback's nice value (1 -> -10, 8 ->
// 0, 16 -> +10). A priority outside 1..16 is treated as the default 8.
func Nice(priority int) int { return nices[priorityIndex(priority)] }

// CPUControl is the node's CPU-priority mechanism, detected once by
// DetectCPUControl. Its methods are safe for concurrent use.
type CPUControl struct {
	mech   Mechanism
	reason string
	mount  string // the hierarchy's mount point; "" with nice
	dir    string // <mount>/<parent>; "" with nice
	weight bool   // cgroup2: write cpu.weight (false only in tests on a hierarchy without cpu)
	// byThread: cgroup1 children are placed by procmgr's spawning thread
	// (contain.go), not by cgroup.procs after the start.
	byThread bool

	// deleg: the v2 hierarchy's groups go under scdd's delegated cgroup
	// (delegate.go); nil: at its top. The containment uses the same.
	deleg *v2Delegation
	// lazy (cgroup2 under a delegated cgroup that had no cpu controller
	// for its children): the controller is enabled below it only when a
	// group first needs its own weight (enableCPU). Until then every
	// server's cgroup carries its limits alone, and its processes share
	// the delegated cgroup's CPU with scdd (NewSharedGroup).
	lazy  bool
	cpuOn atomic.Bool // lazy: enableCPU has enabled it

	mu       sync.Mutex
	cloneErr error // cgroup2: clone3 into the cgroup failed where cgroup.procs worked
}

// CPUStatus is the mechanism as shown by scdctl status.
type CPUStatus struct {
	Mechanism Mechanism `json:"mechanism"`
	Reason    string    `json:"reason"`
	Path      string    `json:"path,omitempty"` // the tpsched parent cgroup
	Placement string    `json:"placement"`
}

// DetectCPUControl finds how this node can enforce UAP CPU priority and
// prepares the parent cgroup (e.g. "tpsched"; a relative path is allowed)
// under the chosen hierarchy's mount. It never fails: when no cgroup can be
// used it returns the nice mechanism, and Reason says why.
func DetectCPUControl(parent string) *CPUControl { return detect(mountinfoPath, parent) }

func detect(mountinfo, parent string) *CPUControl { return detectIn(mountinfo, parent, nil) }

// detectIn is detect with the v2 hierarchy's groups under deleg's cgroup
// (nil: at the hierarchy's top).
func detectIn(mountinfo, parent string, deleg *v2Delegation) *CPUControl {
	c := detectMounts(mountinfo, parent, deleg)
	c.deleg = deleg
	return c
}

func detectMounts(mountinfo, parent string, deleg *v2Delegation) *CPUControl {
	if err := checkParent(parent); err != nil {
		return niceControl(err.Error())
	}
	mounts, err := cgroupMounts(mountinfo)
	if err != nil {
		return niceControl(fmt.Sprintf("no cgroup: %v", err))
	}
	deleg.apply(mounts)
	var failed, absent []string
	for _, m := range mounts {
		if m.fstype != "cgroup2" {
			continue
		}
		if !hasController(m.point, "cpu") {
			absent = append(absent, "cgroup v2 at "+m.point+" has no cpu controller")
			continue
		}
		lazy := deleg != nil && !subtreeHas(m.point, "cpu")
		c, err := setupV2(m.point, parent, !lazy)
		if err == nil {
			if lazy {
				c.weight, c.lazy = true, true
			}
			return c
		}
		failed = append(failed, fmt.Sprintf("cgroup v2 at %s: %v", m.point, err))
	}
	for _, m := range mounts {
		if m.fstype != "cgroup" || !m.cpu {
			continue
		}
		c, err := setupV1(m.point, parent)
		if err == nil {
			if len(failed) > 0 {
				c.reason += "; " + strings.Join(failed, "; ")
			}
			return c
		}
		failed = append(failed, fmt.Sprintf("cgroup v1 at %s: %v", m.point, err))
	}
	if len(failed) > 0 {
		return niceControl("no writable cgroup: " + strings.Join(failed, "; "))
	}
	if len(absent) > 0 {
		return niceControl("no cpu controller mounted: " + strings.Join(absent, "; "))
	}
	return niceControl("no cpu controller mounted")
}

func niceControl(reason string) *CPUControl {
	return &CPUControl{mech: MechanismNice, reason: reason}
}

// setupV2 creates <mount>/<parent>, enabling the cpu controller in
// cgroup.subtree_control from the mount down to parent when withCPU is set.
func setupV2(mount, parent string, withCPU bool) (*CPUControl, error) {
	if withCPU {
		if err := enableController(mount, "cpu"); err != nil {
			return nil, err
		}
	}
	dir, err := makeParent(mount, parent, func(dir string) error {
		if withCPU {
			return enableController(dir, "cpu")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := unix.Access(filepath.Join(dir, "cgroup.procs"), unix.W_OK); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, "cgroup.procs"), err)
	}
	return &CPUControl{mech: MechanismCgroup2, mount: mount, dir: dir, weight: withCPU,
		reason: "cpu controller on cgroup v2 at " + mount}, nil
}

// setupV1 creates <mount>/<parent> on the v1 cpu hierarchy.
func setupV1(mount, parent string) (*CPUControl, error) {
	dir, err := makeParent(mount, parent, nil)
	if err != nil {
		return nil, err
	}
	for _, f := range []string{"cpu.shares", "cgroup.procs"} {
		if err := unix.Access(filepath.Join(dir, f), unix.W_OK); err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(dir, f), err)
		}
	}
	return &CPUControl{mech: MechanismCgroup1, mount: mount, dir: dir,
		reason: "cpu controller on cgroup v1 at " + mount}, nil
}

// makeParent creates each missing level of parent under mount, calling
// each(level) after it exists. On failure it removes the levels it created.
func makeParent(mount, parent string, each func(dir string) error) (string, error) {
	dir := mount
	var created []string
	undo := func() {
		for i := len(created) - 1; i >= 0; i-- {
			_ = unix.Rmdir(created[i])
		}
	}
	for comp := range strings.SplitSeq(parent, "/") {
		dir = filepath.Join(dir, comp)
		if err := os.Mkdir(dir, 0o755); err == nil {
			created = append(created, dir)
		} else if !errors.Is(err, fs.ErrExist) {
			undo()
			return "", err
		}
		if each != nil {
			if err := each(dir); err != nil {
				undo()
				return "", err
			}
		}
	}
	return dir, nil
}

// subtreeHas says whether dir's cgroup.subtree_control enables ctl for its
// children.
func subtreeHas(dir, ctl string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	return err == nil && hasWord(string(b), ctl)
}

// enableController makes sure controller ctl ("cpu", "pids", "memory") is
// in dir's cgroup.subtree_control.
func enableController(dir, ctl string) error {
	file := filepath.Join(dir, "cgroup.subtree_control")
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if hasWord(string(b), ctl) {
		return nil
	}
	if err := writeCgroupFile(file, "+"+ctl); err != nil {
		hint := ""
		switch {
		case errors.Is(err, unix.EBUSY):
			hint = " (no-internal-process rule: the cgroup has processes of its own)"
		case errors.Is(err, unix.ENOENT):
			hint = " (" + ctl + " is not in this cgroup's cgroup.controllers)"
		case errors.Is(err, unix.EOPNOTSUPP):
			hint = " (threaded cgroup or controller bound elsewhere)"
		}
		return fmt.Errorf("enable +%s: %w%s", ctl, err, hint)
	}
	return nil
}

// Mechanism says how UAP CPU priority is enforced on this node.
func (c *CPUControl) Mechanism() Mechanism { return c.mech }

// Reason says why this mechanism was chosen, e.g. "cpu controller on cgroup
// v1 at /sys/fs/cgroup/cpu" or "no writable cgroup: ...: permission denied".
func (c *CPUControl) Reason() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	reason := c.reason
	if c.lazy && !c.cpuOn.Load() {
		reason += "; off below " + c.mount + " until a server needs a weight: servers at the default priority share scdd's CPU"
	}
	if c.cloneErr != nil {
		return fmt.Sprintf("%s; placement by cgroup.procs: clone into cgroup failed: %v", reason, c.cloneErr)
	}
	return reason
}

// cpuEnabled says whether the servers' cgroups carry the cpu controller:
// always but on a lazy hierarchy before enableCPU.
func (c *CPUControl) cpuEnabled() bool { return !c.lazy || c.cpuOn.Load() }

// enableCPU enables the cpu controller from the delegated cgroup down to
// the servers' cgroups on a lazy hierarchy, once: every server's cgroup is
// then a cpu group of its own, at the default weight unless given one.
func (c *CPUControl) enableCPU() error {
	if c.cpuEnabled() {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cpuOn.Load() {
		return nil
	}
	parent, err := filepath.Rel(c.mount, c.dir)
	if err == nil {
		err = enableAlong(c.mount, parent, "cpu")
	}
	if err != nil {
		return fmt.Errorf("procmgr: cpu controller below %s: %w", c.mount, err)
	}
	c.cpuOn.Store(true)
	return nil
}

// Status describes the mechanism for scdctl status.
func (c *CPUControl) Status() CPUStatus {
	st := CPUStatus{Mechanism: c.mech, Reason: c.Reason(), Path: c.dir, Placement: PlacementProcs}
	switch {
	case c.mech == MechanismNice:
		st.Placement = PlacementNice
	case c.mech == MechanismCgroup2 && c.cloneOK():
		st.Placement = PlacementClone
	case c.mech == MechanismCgroup1 && c.byThread:
		st.Placement = PlacementThread
	}
	return st
}

func (c *CPUControl) cloneOK() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cloneErr == nil
}

func (c *CPUControl) noClone(err error) {
	c.mu.Lock()
	if c.cloneErr == nil {
		c.cloneErr = err
	}
	c.mu.Unlock()
}

// Close removes the parent cgroup if it is empty (every group Removed). It
// leaves any intermediate levels of a nested parent and the controllers it
// enabled.
func (c *CPUControl) Close() error {
	if c.dir == "" {
		return nil
	}
	err := unix.Rmdir(c.dir)
	switch {
	case err == nil, errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.EBUSY), errors.Is(err, unix.ENOTEMPTY):
		return fmt.Errorf("procmgr: remove cgroup %s: %w (groups or processes still in it)", c.dir, err)
	}
	return fmt.Errorf("procmgr: remove cgroup %s: %w", c.dir, err)
}

// CPUGroup is one user server's CPU group: a cgroup, or a nice value.
type CPUGroup struct {
	c      *CPUControl
	server string
	weight int
	nice   int

	mu  sync.Mutex
	dir string // "" with nice, and while shared
	// shared (cgroup1, NewSharedGroup): no cgroup of its own yet; the
	// processes are born in scdd's own cpu cgroup until SetWeight makes one.
	shared   bool
	fd       int // cgroup2: O_PATH directory fd for SysProcAttr.CgroupFD
	closed   bool
	retry    bool  // cgroup2: next Prepare uses cgroup.procs (StartFailed)
	retryErr error // the Start error that caused retry
}

// NewGroup creates <mount>/<parent>/<server> and sets its weight from
// schedule_priority (cpu.weight = Weight(priority), or cpu.shares =
// Shares(Weight(priority))). With nice it creates nothing. An existing
// directory (left by an earlier run) is reused.
func (c *CPUControl) NewGroup(server string, priority int) (*CPUGroup, error) {
	if err := checkGroupName(server); err != nil {
		return nil, err
	}
	if c.mech == MechanismCgroup2 {
		if err := c.enableCPU(); err != nil {
			return nil, fmt.Errorf("procmgr: cpu group %s: %w", server, err)
		}
	}
	return c.newGroup(server, priority)
}

// newGroup is NewGroup with the cpu controller as it is.
func (c *CPUControl) newGroup(server string, priority int) (*CPUGroup, error) {
	g := &CPUGroup{c: c, server: server, weight: Weight(priority), nice: Nice(priority), fd: -1}
	if c.mech == MechanismNice {
		return g, nil
	}
	g.dir = filepath.Join(c.dir, server)
	created := true
	if err := os.Mkdir(g.dir, 0o755); errors.Is(err, fs.ErrExist) {
		created = false
		if fi, err := os.Stat(g.dir); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("procmgr: cpu group %s: %s exists and is not a cgroup", server, g.dir)
		}
	} else if err != nil {
		return nil, fmt.Errorf("procmgr: cpu group %s: %w", server, err)
	}
	err := g.setup()
	if err != nil {
		if g.fd >= 0 {
			_ = unix.Close(g.fd)
		}
		if created {
			_ = unix.Rmdir(g.dir)
		}
		return nil, fmt.Errorf("procmgr: cpu group %s: %w", server, err)
	}
	return g, nil
}

// checkGroupName refuses a server name that is no directory name.
func checkGroupName(server string) error {
	if server == "" || server == "." || server == ".." || strings.ContainsAny(server, "/\x00") {
		return fmt.Errorf("procmgr: cpu group: bad server name %q", server)
	}
	return nil
}

// NewSharedGroup is NewGroup at the default priority for a server whose
// processes share scdd's own cpu cgroup until SetWeight gives them another
// weight, which makes their cgroup and moves them into it. Processes that
// wake each other without pause (two UAPs on a lane) in a cpu cgroup of
// their own kept every process outside it from the CPU for seconds (the
// kernel's group scheduling, docs/ARCHITECTURE.md "Lanes"); in scdd's
// cgroup they are tasks beside its own threads. On cgroup v1 the cpu
// hierarchy is apart from the ones that contain the server. On a lazy v2
// hierarchy the server's cgroup, which contains it, is made as NewGroup
// makes it, without the cpu controller: its processes share the delegated
// cgroup's CPU with scdd until a weight enables the controller for every
// server. Elsewhere on v2 this is NewGroup.
func (c *CPUControl) NewSharedGroup(server string) (*CPUGroup, error) {
	if err := checkGroupName(server); err != nil {
		return nil, err
	}
	switch {
	case c.mech == MechanismCgroup2 && c.lazy:
		return c.newGroup(server, DefaultPriority)
	case c.mech != MechanismCgroup1:
		return c.NewGroup(server, DefaultPriority)
	}
	return &CPUGroup{c: c, server: server, weight: Weight(DefaultPriority), nice: Nice(DefaultPriority), fd: -1, shared: true}, nil
}

func (g *CPUGroup) setup() error {
	switch g.c.mech {
	case MechanismCgroup1:
		return writeCgroupFile(filepath.Join(g.dir, "cpu.shares"), strconv.Itoa(Shares(g.weight)))
	case MechanismCgroup2:
		if g.c.weight && g.c.cpuEnabled() {
			if err := writeCgroupFile(filepath.Join(g.dir, "cpu.weight"), strconv.Itoa(g.weight)); err != nil {
				return err
			}
		}
		fd, err := unix.Open(g.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return &fs.PathError{Op: "open", Path: g.dir, Err: err}
		}
		g.fd = fd
	}
	return nil
}

// Path is the group's cpu cgroup directory: "" with nice and while the
// processes share scdd's cgroup (NewSharedGroup).
func (g *CPUGroup) Path() string {
	if g.c.mech == MechanismCgroup2 && !g.c.cpuEnabled() {
		return ""
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.dir
}

// own makes a shared group's cgroup, with weight's shares, and reports
// whether it did: from here its processes are started in it. Under mu.
func (g *CPUGroup) own(weight int) (made bool, err error) {
	if !g.shared {
		return false, nil
	}
	dir := filepath.Join(g.c.dir, g.server)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return false, fmt.Errorf("procmgr: cpu group %s: %w", g.server, err)
	}
	if err := writeCgroupFile(filepath.Join(dir, "cpu.shares"), strconv.Itoa(Shares(weight))); err != nil {
		_ = unix.Rmdir(dir)
		return false, fmt.Errorf("procmgr: cpu group %s: %w", g.server, err)
	}
	g.dir, g.shared = dir, false
	return true, nil
}

// joinOwn is the after of a start in scdd's cpu cgroup: if SetWeight made
// the group's cgroup meanwhile, the process goes there, and what it forked
// already (members: the server's other cgroups), as SetWeight moved the
// processes it saw and this one may have been started after.
func (g *CPUGroup) joinOwn(pid int, members func() ([]int, error)) error {
	if g.Path() == "" {
		return nil
	}
	return errors.Join(g.moveIn([]int{pid}), g.moveMembers(members, []int{pid}))
}

// Prepare readies attr (the SysProcAttr of a command about to be started)
// for the group and returns what to call with the child's pid right after
// a successful Start. With cgroup2 it sets attr.UseCgroupFD and
// attr.CgroupFD so the child is born in the group (clone3, Linux 5.7+) and
// after does nothing; if Start then fails, call StartFailed. With cgroup1
// after writes the pid to cgroup.procs; with nice it sets the nice value of
// every thread of the child. An error from after means the child runs at the
// default priority: report it, the child is fine otherwise.
//
// Prepare must not be called after Remove.
func (g *CPUGroup) Prepare(attr *syscall.SysProcAttr) (after func(pid int) error, err error) {
	if attr == nil {
		return nil, errors.New("procmgr: cpu group: nil SysProcAttr")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, fmt.Errorf("procmgr: cpu group %s: removed", g.server)
	}
	attr.UseCgroupFD, attr.CgroupFD = false, 0
	switch g.c.mech {
	case MechanismNice:
		return g.setNice, nil
	case MechanismCgroup1:
		return g.writeProcs, nil
	}
	if g.retry {
		g.retry = false
		cause := g.retryErr
		return func(pid int) error {
			err := g.writeProcs(pid)
			if err == nil {
				// cgroup.procs works where clone3 did not: keep to it.
				g.c.noClone(cause)
			}
			return err
		}, nil
	}
	if !g.c.cloneOK() {
		return g.writeProcs, nil
	}
	attr.UseCgroupFD, attr.CgroupFD = true, g.fd
	return func(int) error { return nil }, nil
}

// StartFailed is called when cmd.Start failed (with startErr) after Prepare.
// It reports whether Prepare had asked for placement at clone; then it has
// cleared attr.UseCgroupFD and the caller should build the command again
// (an exec.Cmd cannot be started twice), call Prepare, which now places the
// child by cgroup.procs, and Start once more. If that second start works,
// the node keeps to cgroup.procs from then on and Reason says why; if it
// fails too, the error was not the cgroup's and clone placement stays.
func (g *CPUGroup) StartFailed(attr *syscall.SysProcAttr, startErr error) (retry bool) {
	if attr == nil || !attr.UseCgroupFD || g.c.mech != MechanismCgroup2 {
		return false
	}
	attr.UseCgroupFD, attr.CgroupFD = false, 0
	g.mu.Lock()
	g.retry, g.retryErr = true, startErr
	g.mu.Unlock()
	return true
}

func (g *CPUGroup) writeProcs(pid int) error {
	file := filepath.Join(g.Path(), "cgroup.procs")
	if err := writeCgroupFile(file, strconv.Itoa(pid)); err != nil {
		return fmt.Errorf("procmgr: cpu group %s: move pid %d: %w", g.server, pid, err)
	}
	return nil
}

// setNice sets the nice value of every thread of pid: setpriority with
// PRIO_PROCESS acts on one thread, and a UAP may have started more by now.
func (g *CPUGroup) setNice(pid int) error {
	g.mu.Lock()
	nice := g.nice // SetWeight may change it
	g.mu.Unlock()
	if nice == 0 {
		return nil
	}
	return g.applyNice(pid, nice)
}

// applyNice sets nice on every thread of pid.
func (g *CPUGroup) applyNice(pid, nice int) error {
	tids := []int{pid}
	if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid)); err == nil {
		tids = tids[:0]
		for _, e := range ents {
			if tid, err := strconv.Atoi(e.Name()); err == nil {
				tids = append(tids, tid)
			}
		}
	}
	var errs []error
	for _, tid := range tids {
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, nice); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("thread %d: %w", tid, os.NewSyscallError("setpriority", err)))
		}
	}
	if err := errors.Join(errs...); err != nil {
		hint := ""
		if nice < 0 {
			hint = " (a negative nice needs CAP_SYS_NICE or RLIMIT_NICE)"
		}
		return fmt.Errorf("procmgr: cpu group %s: nice %d for pid %d: %w%s", g.server, nice, pid, err, hint)
	}
	return nil
}

// Remove deletes the group's cgroup once the server's processes are gone
// (killed and reaped). It waits up to a second for exiting tasks to leave;
// if some remain it returns an error wrapping EBUSY that names them, and may
// be called again. With nice it does nothing.
func (g *CPUGroup) Remove() error {
	g.mu.Lock()
	g.closed = true
	if g.fd >= 0 {
		_ = unix.Close(g.fd)
		g.fd = -1
	}
	dir := g.dir
	g.mu.Unlock()
	if dir == "" {
		return nil
	}
	return rmdirWait(dir, "cpu group "+g.server, "; kill them and Remove again")
}

// writeCgroupFile writes one value to an existing cgroup interface file
// (truncating it, as a shell's > does: the kernel ignores it, a file that
// stands for one in a test needs it).
func writeCgroupFile(file, value string) error {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", value, file, err)
	}
	return nil
}

type cgroupMount struct {
	point  string
	fstype string // "cgroup" or "cgroup2"
	cpu    bool   // v1: the cpu controller is bound here
	opts   string // the super options: on v1, the controllers bound here ("rw,cpu,cpuacct")
}

// cgroupMounts lists the cgroup and cgroup2 mounts in a mountinfo file.
func cgroupMounts(mountinfo string) ([]cgroupMount, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []cgroupMount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if m, ok := parseMountinfoLine(sc.Text()); ok {
			out = append(out, m)
		}
	}
	return out, sc.Err()
}

// parseMountinfoLine reads "id parent maj:min root point opts [optional...]
// - fstype source superopts" (proc(5)).
func parseMountinfoLine(line string) (cgroupMount, bool) {
	f := strings.Fields(line)
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if len(f) < 5 || sep < 0 || sep+3 >= len(f) {
		return cgroupMount{}, false
	}
	m := cgroupMount{point: unescapeMount(f[4]), fstype: f[sep+1], opts: f[sep+3]}
	if m.fstype != "cgroup" && m.fstype != "cgroup2" {
		return cgroupMount{}, false
	}
	m.cpu = m.fstype == "cgroup" && hasWord(strings.ReplaceAll(f[sep+3], ",", " "), "cpu")
	return m, true
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func hasController(dir, name string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	return err == nil && hasWord(string(b), name)
}

func hasWord(s, w string) bool {
	for f := range strings.FieldsSeq(s) {
		if f == w {
			return true
		}
	}
	return false
}

func checkParent(parent string) error {
	if parent == "" || filepath.IsAbs(parent) {
		return fmt.Errorf("bad cgroup parent name %q", parent)
	}
	for comp := range strings.SplitSeq(parent, "/") {
		if comp == "" || comp == "." || comp == ".." || strings.ContainsRune(comp, 0) {
			return fmt.Errorf("bad cgroup parent name %q", parent)
		}
	}
	return nil
}

// staleDaemonGroups lists the scdd-<pid> cgroups beside dir (a parent
// <mount>/tpsched/scdd-<pid>) whose daemon no longer runs: what a daemon
// killed without cleaning up (kill -9, a crash) left behind.
func staleDaemonGroups(dir string) []string {
	base, self := filepath.Dir(dir), filepath.Base(dir)
	entries, err := os.ReadDir(base)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		name := e.Name()
		pid, err := strconv.Atoi(strings.TrimPrefix(name, "scdd-"))
		if !e.IsDir() || name == self || !strings.HasPrefix(name, "scdd-") || err != nil || pid <= 0 {
			continue
		}
		if err := unix.Kill(pid, 0); !errors.Is(err, unix.ESRCH) && !startedAfter(pid, filepath.Join(base, name)) {
			continue // alive (or not ours to judge)
		}
		out = append(out, filepath.Join(base, name))
	}
	return out
}

// startedAfter reports whether process pid started after the cgroup dir
// was made: then it is not the daemon that made it (which made it after it
// started) but another process that has its pid now, the daemon being
// dead. Taken for alive, a reused pid kept the dead daemon's escaped UAPs
// alive through every later start. Any doubt (a time not read, a second
// either way: the directory's change time, which a later chmod moves on,
// against a start read in ticks of the boot clock) says no.
func startedAfter(pid int, dir string) bool {
	var st unix.Stat_t
	if unix.Stat(dir, &st) != nil {
		return false
	}
	started, err := procStarted(pid)
	return err == nil && started.After(time.Unix(st.Ctim.Unix()).Add(time.Second))
}

// procStarted is bpf.ProcStarted; a test may replace it.
var procStarted = bpf.ProcStarted

// staleWait bounds how long removeStaleGroups waits for the processes it
// killed to leave a dead daemon's cgroups. Longer than removeWait: it runs
// once at start, and an exit under memory pressure or on a busy host can
// take a while, where giving up leaves the group for the next start.
const staleWait = 5 * time.Second

// removeStaleGroups kills every process in the given cgroups of dead
// daemons (with their server cgroups) and removes them. A dead daemon's
// UAPs are its children no longer, and what they forked in process groups
// or sessions of their own was never reachable by pid: the cgroup is the
// one place that still lists them all. The cgroups are killed strongest
// mechanism first (cgroup.kill, then a freezer, then each member until
// none is left), as each holds the same processes on its hierarchy. It
// returns the cgroups removed and how many processes were killed.
func removeStaleGroups(dirs []string) (removed []string, killed int, err error) {
	rank := func(d string) int {
		switch {
		case exists(filepath.Join(d, "cgroup.kill")):
			return 0
		case exists(filepath.Join(d, "cgroup.freeze")), exists(filepath.Join(d, "freezer.state")):
			return 1
		}
		return 2
	}
	dirs = slices.Clone(dirs)
	slices.SortStableFunc(dirs, func(a, b string) int { return rank(a) - rank(b) })
	var errs []error
	seen := map[int]bool{} // a process is in the dead daemon's cgroups on every hierarchy
	for _, d := range dirs {
		pids, err := killCgroupTree(d)
		for _, p := range pids {
			if !seen[p] {
				seen[p] = true
				killed++
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("procmgr: kill what %s holds: %w", d, err))
		}
	}
	for _, d := range dirs {
		if err := rmdirTreeWait(d, time.Now().Add(staleWait)); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, d)
	}
	return removed, killed, errors.Join(errs...)
}

// treeMembers lists the processes in dir and every cgroup below it, the
// daemon's own left out, and says whether the daemon is one of them.
func treeMembers(dir string) (pids []int, hasSelf bool) {
	self := os.Getpid()
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		in, _ := readPids(filepath.Join(path, "cgroup.procs"))
		for _, p := range in {
			if p == self {
				hasSelf = true
			} else {
				pids = append(pids, p)
			}
		}
		return nil
	})
	return pids, hasSelf
}

// killCgroupTree kills every process in the cgroup dir and its
// descendants and returns their pids: by cgroup.kill (v2, Linux
// 5.14+), else by freezing the tree (v2 cgroup.freeze or the v1 freezer),
// SIGKILL to each member and a thaw, else by SIGKILL to each member until
// none is left. A tree that holds the daemon itself is never killed
// whole: only its other members are.
func killCgroupTree(dir string) ([]int, error) {
	members, self := treeMembers(dir)
	if len(members) == 0 {
		return nil, nil
	}
	killEach := func(pids []int) {
		for _, p := range pids {
			_ = unix.Kill(p, unix.SIGKILL)
		}
	}
	var freeze, thaw, state string
	var frozen func() bool
	switch {
	case !self && exists(filepath.Join(dir, "cgroup.kill")):
		return members, writeCgroupFile(filepath.Join(dir, "cgroup.kill"), "1")
	case exists(filepath.Join(dir, "cgroup.freeze")):
		state, freeze, thaw = filepath.Join(dir, "cgroup.freeze"), "1", "0"
		frozen = func() bool { return cgroupEvent(filepath.Join(dir, "cgroup.events"), "frozen") == 1 }
	case exists(filepath.Join(dir, "freezer.state")):
		state, freeze, thaw = filepath.Join(dir, "freezer.state"), "FROZEN", "THAWED"
		frozen = func() bool {
			s, _ := os.ReadFile(filepath.Join(dir, "freezer.state"))
			return strings.TrimSpace(string(s)) == "FROZEN"
		}
	}
	if state != "" && !self {
		// Frozen, nothing in the tree can fork while its members are
		// listed and killed; the thaw delivers the kills.
		if err := writeCgroupFile(state, freeze); err == nil {
			deadline := time.Now().Add(time.Second)
			for !frozen() && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			members, _ = treeMembers(dir)
			killEach(members)
			return members, writeCgroupFile(state, thaw)
		}
	}
	// No freezer: a member may fork while it is being killed, so go round
	// until none is left. Bounded by time, not rounds: a member killed by a
	// stronger mechanism on another hierarchy may still be exiting (a large
	// address space takes a while to tear down on a busy host).
	all := slices.Clone(members)
	deadline := time.Now().Add(staleWait)
	for len(members) > 0 {
		if time.Now().After(deadline) {
			return all, fmt.Errorf("members still there after %v of SIGKILL: %v", staleWait, members)
		}
		killEach(members)
		time.Sleep(5 * time.Millisecond)
		members, _ = treeMembers(dir)
		for _, p := range members {
			if !slices.Contains(all, p) {
				all = append(all, p)
			}
		}
	}
	return all, nil
}

// rmdirTreeWait removes the cgroup dir and those below it, deepest first,
// waiting until deadline for exiting tasks to leave each.
func rmdirTreeWait(dir string, deadline time.Time) error {
	ents, _ := os.ReadDir(dir)
	var errs []error
	for _, e := range ents {
		if e.IsDir() {
			errs = append(errs, rmdirTreeWait(filepath.Join(dir, e.Name()), deadline))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			pids, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			return fmt.Errorf("procmgr: remove a dead daemon's cgroup: rmdir %s: %w (processes still in it: [%s])",
				dir, err, strings.Join(strings.Fields(string(pids)), " "))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
