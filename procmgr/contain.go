package procmgr

// Containment: what keeps a server's processes, and every process they
// make, together and within bounds. Each server gets a cgroup in every
// hierarchy the node can write, under the same parent as its CPU group
// (tpsched/scdd-<pid>/<server>):
//
//   - the cgroup v2 hierarchy (pure v2 hosts at /sys/fs/cgroup, hybrid
//     hosts at /sys/fs/cgroup/unified): cgroup.kill and cgroup.freeze even
//     when it carries no controller, and pids.max and memory.max where the
//     pids and memory controllers are on it;
//   - the v1 pids and memory hierarchies for the limits the v2 one cannot
//     hold, and the v1 freezer when there is no v2 hierarchy to kill by.
//
// A process is born in its server's cgroups, before it runs any code of its
// own: on v2 by clone3 into the cgroup (SysProcAttr.CgroupFD), on v1 by the
// spawning thread, which joins the server's v1 cgroups (their "tasks"
// files, one thread) for the fork and goes back after it. A child it forks
// in a C constructor or a Go init is in them too.
//
// Stopping a server kills every process in its cgroup, whatever process
// group or session it made for itself: cgroup.kill (Linux 5.14+), else
// freeze, SIGKILL each member, thaw (v2 cgroup.freeze or the v1 freezer),
// else SIGKILL each member until none is left. With no writable cgroup at
// all the node falls back to SIGKILL of each process and its process group,
// which a process that left its group escapes; status and a metric say so.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// KillMechanism is how the processes of a server are killed together.
type KillMechanism string

const (
	KillCgroupKill KillMechanism = "cgroup.kill"   // cgroup v2: one write kills every member, new forks included
	KillFreezeV2   KillMechanism = "cgroup.freeze" // cgroup v2 before 5.14: freeze, SIGKILL each member, thaw
	KillFreezerV1  KillMechanism = "freezer"       // cgroup v1 freezer: FROZEN, SIGKILL each member, THAWED
	KillMembers    KillMechanism = "cgroup.procs"  // a cgroup without a freezer: SIGKILL each member until none is left
	KillPgroup     KillMechanism = "process group" // no writable cgroup: SIGKILL to each process and its process group
)

// LimitMechanism is how a server's pids or memory limit is enforced.
type LimitMechanism string

const (
	LimitCgroup2 LimitMechanism = "cgroup2" // pids.max / memory.max on the v2 hierarchy
	LimitCgroup1 LimitMechanism = "cgroup1" // pids.max / memory.limit_in_bytes on the v1 hierarchy
	LimitNone    LimitMechanism = "none"    // not enforced (Reason says why)
)

// ContainStatus says how the node contains UAP processes, for scdctl
// status and the metrics.
type ContainStatus struct {
	Kill         KillMechanism  `json:"kill"`
	KillReason   string         `json:"kill_reason"`
	Pids         LimitMechanism `json:"pids_limit"`
	PidsReason   string         `json:"pids_limit_reason"`
	Memory       LimitMechanism `json:"memory_limit"`
	MemoryReason string         `json:"memory_limit_reason"`
	// Placement is how a new process gets into its cgroups: "clone3"
	// (v2), "spawning thread" (v1), "cgroup.procs" (after the start, the
	// fallback), joined by " + ".
	Placement string `json:"placement"`
	// Paths are the parent cgroups, by hierarchy ("v2", "pids", ...).
	Paths map[string]string `json:"paths,omitempty"`
	// Namespaces is what a non-root node runs UAPs in: "user+pid",
	// "none" with the reason.
	Namespaces string `json:"namespaces"`
	// NoNewPrivs: every UAP starts with no_new_privs, so no setuid or
	// file-capability binary it runs gains privileges.
	NoNewPrivs bool   `json:"no_new_privs"`
	Reasons    string `json:"reasons,omitempty"` // what was tried and failed, for the operator
}

// v1Hier is one v1 hierarchy the node places processes in.
type v1Hier struct {
	controller string // "cpu", "pids", "memory" or "freezer"
	mount      string
	dir        string // <mount>/<parent>
}

// Containment is the node's set of cgroup parents beside the CPU
// mechanism's, detected once by detectContainment. Its methods are safe
// for concurrent use.
type Containment struct {
	parent string
	cpu    *CPUControl

	v2dir    string // <v2 mount>/<parent>; "" with no writable v2 hierarchy
	v2shared bool   // v2dir is the CPU mechanism's own (cgroup2 cpu): one directory per server
	v2pids   bool   // pids controller enabled on v2
	v2mem    bool   // memory controller enabled on v2
	v2kill   bool   // cgroup.kill exists
	v2freeze bool   // cgroup.freeze exists

	v1 []v1Hier // pids, memory, freezer on v1, as needed; cpu's is the CPU mechanism's

	kill               KillMechanism
	killWhy            string
	pids, mem          LimitMechanism
	pidsWhy, memWhy    string
	failures           []string
	mu                 sync.Mutex
	cloneErr           error // clone3 into the v2 cgroup failed where cgroup.procs worked
	threadErr          error // the spawning thread could not join a v1 cgroup: placement after start
	threadPlacementsOK bool  // at least one start was placed by the thread
}

// detectContainment finds the hierarchies the node can contain servers
// with, under parent (the CPU mechanism's parent). It never fails: what it
// cannot use it says in the status.
func detectContainment(mountinfo, parent string, cpu *CPUControl) *Containment {
	c := &Containment{parent: parent, cpu: cpu, pids: LimitNone, mem: LimitNone}
	if err := checkParent(parent); err != nil {
		c.failures = append(c.failures, err.Error())
		c.settle()
		return c
	}
	mounts, err := cgroupMounts(mountinfo)
	if err != nil {
		c.failures = append(c.failures, "no cgroup: "+err.Error())
		c.settle()
		return c
	}
	cpu.deleg.apply(mounts)
	// The v2 hierarchy: the CPU mechanism's when it is there, else the
	// first writable one.
	var v2mount string
	if cpu.mech == MechanismCgroup2 {
		c.v2dir, c.v2shared, v2mount = cpu.dir, true, cpu.mount
	} else {
		for _, m := range mounts {
			if m.fstype != "cgroup2" {
				continue
			}
			dir, err := makeParent(m.point, parent, nil)
			if err == nil {
				err = unix.Access(filepath.Join(dir, "cgroup.procs"), unix.W_OK)
			}
			if err != nil {
				c.failures = append(c.failures, fmt.Sprintf("cgroup v2 at %s: %v", m.point, err))
				continue
			}
			c.v2dir, v2mount = dir, m.point
			break
		}
	}
	if c.v2dir != "" {
		c.v2kill = exists(filepath.Join(c.v2dir, "cgroup.kill"))
		c.v2freeze = exists(filepath.Join(c.v2dir, "cgroup.freeze"))
		for _, ctl := range []string{"pids", "memory"} {
			if !hasController(v2mount, ctl) {
				continue
			}
			if err := enableAlong(v2mount, parent, ctl); err != nil {
				c.failures = append(c.failures, fmt.Sprintf("cgroup v2 at %s: %v", v2mount, err))
				continue
			}
			if ctl == "pids" {
				c.v2pids, c.pids, c.pidsWhy = true, LimitCgroup2, "pids controller on cgroup v2 at "+v2mount
			} else {
				c.v2mem, c.mem, c.memWhy = true, LimitCgroup2, "memory controller on cgroup v2 at "+v2mount
			}
		}
	}
	// v1 for what v2 does not hold.
	want := []string{}
	if !c.v2pids {
		want = append(want, "pids")
	}
	if !c.v2mem {
		want = append(want, "memory")
	}
	if !c.v2kill && !c.v2freeze {
		want = append(want, "freezer")
	}
	for _, ctl := range want {
		var tried []string
		for _, m := range mounts {
			if m.fstype != "cgroup" || !hasWord(strings.ReplaceAll(m.opts, ",", " "), ctl) {
				continue
			}
			dir, err := makeParent(m.point, parent, nil)
			if err == nil {
				err = unix.Access(filepath.Join(dir, "tasks"), unix.W_OK)
			}
			if err != nil {
				tried = append(tried, fmt.Sprintf("cgroup v1 %s at %s: %v", ctl, m.point, err))
				continue
			}
			c.v1 = append(c.v1, v1Hier{controller: ctl, mount: m.point, dir: dir})
			tried = nil
			switch ctl {
			case "pids":
				c.pids, c.pidsWhy = LimitCgroup1, "pids controller on cgroup v1 at "+m.point
			case "memory":
				c.mem, c.memWhy = LimitCgroup1, "memory controller on cgroup v1 at "+m.point
			}
			break
		}
		c.failures = append(c.failures, tried...)
	}
	c.settle()
	return c
}

// settle chooses the kill mechanism and words the reasons of what is not
// enforced.
func (c *Containment) settle() {
	why := ""
	if len(c.failures) > 0 {
		why = ": " + strings.Join(c.failures, "; ")
	}
	switch {
	case c.v2kill:
		c.kill, c.killWhy = KillCgroupKill, "cgroup.kill in "+c.v2dir
	case c.v2freeze:
		c.kill, c.killWhy = KillFreezeV2, "cgroup.freeze in "+c.v2dir+" (no cgroup.kill: Linux before 5.14)"
	case c.v1dir("freezer") != "":
		c.kill, c.killWhy = KillFreezerV1, "cgroup v1 freezer at "+c.v1dir("freezer")
	case c.memberDir("") != "":
		c.kill, c.killWhy = KillMembers, "no freezer: each member of "+c.memberDir("")+" is killed until none is left"
	default:
		c.kill, c.killWhy = KillPgroup, "no writable cgroup"+why+
			"; a process that leaves its process group, and its children, outlive a stop"
	}
	if c.pids == LimitNone {
		c.pidsWhy = "no writable pids controller" + why
	}
	if c.mem == LimitNone {
		c.memWhy = "no writable memory controller" + why
	}
}

func (c *Containment) v1dir(ctl string) string {
	for _, h := range c.v1 {
		if h.controller == ctl {
			return h.dir
		}
	}
	return ""
}

// memberDir is the cgroup whose cgroup.procs lists every process of the
// server (server "" gives the parent): the v2 one, else any v1 one the
// processes are placed in.
func (c *Containment) memberDir(server string) string {
	for _, d := range []string{c.v2dir, c.v1dir("freezer"), c.v1dir("pids"), c.v1dir("memory"), c.cpuV1Dir()} {
		if d != "" {
			return filepath.Join(d, server)
		}
	}
	return ""
}

// cpuV1Dir is the CPU mechanism's parent when it is v1 (placed by the
// spawning thread like the other v1 cgroups).
func (c *Containment) cpuV1Dir() string {
	if c.cpu != nil && c.cpu.mech == MechanismCgroup1 {
		return c.cpu.dir
	}
	return ""
}

// Status describes the containment for scdctl status.
func (c *Containment) Status() ContainStatus {
	st := ContainStatus{Kill: c.kill, KillReason: c.killWhy, Pids: c.pids, PidsReason: c.pidsWhy,
		Memory: c.mem, MemoryReason: c.memWhy, Paths: map[string]string{}}
	c.mu.Lock()
	defer c.mu.Unlock()
	var place []string
	if c.v2dir != "" {
		st.Paths["v2"] = c.v2dir
		if c.cloneErr == nil && (!c.v2shared || c.cpu.cloneOK()) {
			place = append(place, "clone3")
		} else {
			place = append(place, "cgroup.procs")
		}
	}
	for _, h := range c.v1 {
		st.Paths[h.controller] = h.dir
	}
	if d := c.cpuV1Dir(); d != "" {
		st.Paths["cpu"] = d
	}
	if len(c.v1) > 0 || c.cpuV1Dir() != "" {
		if c.threadErr == nil {
			place = append(place, "spawning thread")
		} else {
			place = append(place, "cgroup.procs (the spawning thread could not join: "+c.threadErr.Error()+")")
		}
	}
	if len(place) == 0 {
		place = append(place, "none")
	}
	st.Placement = strings.Join(place, " + ")
	if c.cloneErr != nil {
		st.Reasons = "clone3 into the cgroup failed: " + c.cloneErr.Error()
	}
	if len(c.failures) > 0 {
		st.Reasons = strings.TrimPrefix(st.Reasons+"; "+strings.Join(c.failures, "; "), "; ")
	}
	return st
}

// Close removes the parent cgroups if they are empty.
func (c *Containment) Close() error {
	var errs []error
	dirs := []string{}
	if c.v2dir != "" && !c.v2shared {
		dirs = append(dirs, c.v2dir)
	}
	for _, h := range c.v1 {
		dirs = append(dirs, h.dir)
	}
	for _, d := range dirs {
		if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("procmgr: remove cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// parents lists the parent cgroups of the node's servers on each
// hierarchy it places them in (the CPU mechanism's with them).
func (c *Containment) parents() []string {
	var out []string
	if c.cpu != nil && c.cpu.dir != "" {
		out = append(out, c.cpu.dir)
	}
	if c.v2dir != "" && !c.v2shared {
		out = append(out, c.v2dir)
	}
	for _, h := range c.v1 {
		out = append(out, h.dir)
	}
	return out
}

func (c *Containment) cloneOK() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cloneErr == nil
}

func (c *Containment) noClone(err error) {
	c.mu.Lock()
	if c.cloneErr == nil {
		c.cloneErr = err
	}
	c.mu.Unlock()
}

func (c *Containment) threadJoined(err error) {
	c.mu.Lock()
	if err != nil && c.threadErr == nil {
		c.threadErr = err
	}
	if err == nil {
		c.threadPlacementsOK = true
	}
	c.mu.Unlock()
}

// enableAlong enables controller ctl in cgroup.subtree_control from mount
// down to (not including the children of) <mount>/<parent>.
func enableAlong(mount, parent, ctl string) error {
	dir := mount
	if err := enableController(dir, ctl); err != nil {
		return err
	}
	for comp := range strings.SplitSeq(parent, "/") {
		dir = filepath.Join(dir, comp)
		if err := enableController(dir, ctl); err != nil {
			return err
		}
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// MemTotal is the host's memory (/proc/meminfo MemTotal), in bytes.
func MemTotal() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/meminfo: MemTotal: %w", err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("/proc/meminfo has no MemTotal")
}
