package procmgr

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
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// This file is one server's box (Containment.newBox): its cgroups, the
// placement of each new process in them, its limits, and the kill of
// everything in it.

// LimitStatus is a server's resource limits as they are in force, and what
// they caught.
type LimitStatus struct {
	PidsMax       int64  `json:"pids_max"`          // 0: none
	Pids          int64  `json:"pids"`              // tasks (processes and threads) now
	PidsHits      uint64 `json:"pids_limit_hits"`   // forks refused at pids_max
	MemoryMax     int64  `json:"memory_max_bytes"`  // 0: none
	Memory        int64  `json:"memory_bytes"`      // charged now
	OOMKills      uint64 `json:"oom_kills"`         // processes the kernel killed at memory_max
	KillMechanism string `json:"kill"`              // how the server's processes are killed together
	Cgroup        string `json:"cgroup,omitempty"`  // the cgroup that lists every process
	Error         string `json:"error,omitempty"`   // a limit that could not be set
	Pending       bool   `json:"pending,omitempty"` // placement fell back to cgroup.procs at least once
}

// box is one server's cgroups: its CPU group plus the containment ones.
type box struct {
	c      *Containment
	server string
	cpu    *CPUGroup

	v2dir    string // the server's v2 cgroup; == cpu.dir when shared
	v2fd     int    // O_PATH fd of v2dir when not shared, for clone3
	v1       []string
	limitErr error

	mu       sync.Mutex
	retryV2  bool // the last start with clone3 failed: place by cgroup.procs once
	retryErr error
	removed  bool
	fallback bool        // a start was placed after it began
	caught   LimitStatus // once removed: what its limits caught, read just before
}

// newBox creates the server's cgroups and sets its limits (pidsMax tasks,
// memMax bytes; 0 = none). A limit the node cannot enforce is reported by
// Limits, not refused: the status says which limit is live.
func (c *Containment) newBox(server string, cpu *CPUGroup, pidsMax int, memMax int64) (*box, error) {
	b := &box{c: c, server: server, cpu: cpu, v2fd: -1}
	var created []string
	fail := func(err error) (*box, error) {
		if b.v2fd >= 0 {
			_ = unix.Close(b.v2fd)
		}
		for i := len(created) - 1; i >= 0; i-- {
			_ = unix.Rmdir(created[i])
		}
		return nil, fmt.Errorf("procmgr: cgroups of %s: %w", server, err)
	}
	mk := func(parent string) (string, error) {
		dir := filepath.Join(parent, server)
		err := os.Mkdir(dir, 0o755)
		switch {
		case err == nil:
			created = append(created, dir)
		case !errors.Is(err, fs.ErrExist):
			return "", err
		default:
			// Left by an earlier run, or a file of the parent's own
			// (a server named pids.max): that is no cgroup of the server.
			if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
				return "", fmt.Errorf("%s exists and is not a cgroup", dir)
			}
		}
		return dir, nil
	}
	if c.v2dir != "" {
		if c.v2shared {
			b.v2dir = cpu.dir
		} else {
			dir, err := mk(c.v2dir)
			if err != nil {
				return fail(err)
			}
			b.v2dir = dir
			fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return fail(&fs.PathError{Op: "open", Path: dir, Err: err})
			}
			b.v2fd = fd
		}
	}
	for _, h := range c.v1 {
		dir, err := mk(h.dir)
		if err != nil {
			return fail(err)
		}
		b.v1 = append(b.v1, dir)
	}
	var errs []error
	if pidsMax > 0 {
		switch c.pids {
		case LimitCgroup2:
			errs = append(errs, writeCgroupFile(filepath.Join(b.v2dir, "pids.max"), strconv.Itoa(pidsMax)))
		case LimitCgroup1:
			errs = append(errs, writeCgroupFile(filepath.Join(c.v1dir("pids"), server, "pids.max"), strconv.Itoa(pidsMax)))
		}
	}
	if memMax > 0 {
		switch c.mem {
		case LimitCgroup2:
			errs = append(errs, writeCgroupFile(filepath.Join(b.v2dir, "memory.max"), strconv.FormatInt(memMax, 10)))
			// Swap counts as memory: a limit a process can page around
			// bounds nothing on a host with swap.
			if exists(filepath.Join(b.v2dir, "memory.swap.max")) {
				_ = writeCgroupFile(filepath.Join(b.v2dir, "memory.swap.max"), "0")
			}
		case LimitCgroup1:
			errs = append(errs, writeCgroupFile(filepath.Join(c.v1dir("memory"), server, "memory.limit_in_bytes"), strconv.FormatInt(memMax, 10)))
		}
	}
	b.limitErr = errors.Join(errs...)
	return b, nil
}

// placement is how one start puts its child in the server's cgroups.
type placement struct {
	tasks []string // v1 "tasks" files the spawning thread joins for the fork
	byBox bool     // attr.CgroupFD is the box's own v2 cgroup (not the CPU group's)
	// cpuHome: the spawning thread goes back to its own v1 cpu cgroup for
	// the fork (a shared CPU group; it may be in another server's).
	cpuHome bool
	after   func(pid int) error
	cpu     func(pid int) error // the CPU group's after (nice, or cgroup.procs after a clone3 failure)
}

// prepare readies attr for a start in the server's cgroups.
func (b *box) prepare(attr *syscall.SysProcAttr) (*placement, error) {
	b.mu.Lock()
	if b.removed {
		b.mu.Unlock()
		return nil, fmt.Errorf("procmgr: cgroups of %s: removed", b.server)
	}
	retry, retryErr := b.retryV2, b.retryErr
	b.retryV2 = false
	// Read with removed: remove closes it under mu. Once read, it stays
	// open for the start: Stop sets the server's stopping, which the
	// spawn checks under the server's lock, before it removes the box.
	v2fd := b.v2fd
	b.mu.Unlock()
	pl := &placement{}
	if b.cpu.c.mech == MechanismCgroup1 {
		// Like the other v1 cgroups: joined by the spawning thread; a
		// shared group's is scdd's own (the thread's home).
		attr.UseCgroupFD, attr.CgroupFD = false, 0
		if dir := b.cpu.Path(); dir != "" {
			pl.tasks = append(pl.tasks, filepath.Join(dir, "tasks"))
			pl.cpu = func(int) error { return nil }
		} else {
			pl.cpuHome = true
			pl.cpu = func(pid int) error { return b.cpu.joinOwn(pid, b.members) }
		}
	} else {
		after, err := b.cpu.Prepare(attr)
		if err != nil {
			return nil, err
		}
		pl.cpu = after
	}
	for _, d := range b.v1 {
		pl.tasks = append(pl.tasks, filepath.Join(d, "tasks"))
	}
	if b.v2dir != "" && !b.c.v2shared {
		if retry || !b.c.cloneOK() {
			dir := b.v2dir
			pl.after = func(pid int) error {
				err := writeCgroupFile(filepath.Join(dir, "cgroup.procs"), strconv.Itoa(pid))
				if err == nil && retry {
					b.c.noClone(retryErr) // cgroup.procs works where clone3 did not: keep to it
				}
				return err
			}
		} else {
			attr.UseCgroupFD, attr.CgroupFD = true, v2fd
			pl.byBox = true
		}
	}
	return pl, nil
}

// startFailed is the box's part of CPUGroup.StartFailed: a start with its
// own v2 cgroup fd failed, so the next prepare places by cgroup.procs.
func (b *box) startFailed(pl *placement, attr *syscall.SysProcAttr, err error) bool {
	if pl.byBox && attr.UseCgroupFD {
		attr.UseCgroupFD, attr.CgroupFD = false, 0
		b.mu.Lock()
		b.retryV2, b.retryErr = true, err
		b.mu.Unlock()
		return true
	}
	return b.cpu.StartFailed(attr, err)
}

// placed runs after a successful start: the CPU group's and the v2 after,
// and, when the spawning thread could not join (joinErr), cgroup.procs of
// each v1 cgroup.
func (b *box) placed(pl *placement, pid int, joinErr error) error {
	var errs []error
	if pl.after != nil {
		errs = append(errs, pl.after(pid))
	}
	if joinErr != nil {
		b.mu.Lock()
		b.fallback = true
		b.mu.Unlock()
		for _, tasks := range pl.tasks {
			errs = append(errs, writeCgroupFile(filepath.Join(filepath.Dir(tasks), "cgroup.procs"), strconv.Itoa(pid)))
		}
	}
	if pl.cpu != nil {
		errs = append(errs, pl.cpu(pid))
	}
	return errors.Join(errs...)
}

// members lists the pids in the server's member cgroup, scdd's own left
// out: on v1 a process is listed when one of its threads is in the cgroup,
// and procmgr's spawning thread stays in the last server it started a
// process for (Manager.vacate takes it out before a kill).
func (b *box) members() ([]int, error) {
	dir := b.memberDir()
	if dir == "" {
		return nil, nil
	}
	pids, err := readPids(filepath.Join(dir, "cgroup.procs"))
	self := os.Getpid()
	return slices.DeleteFunc(pids, func(p int) bool { return p == self }), err
}

func (b *box) memberDir() string {
	switch {
	case b.v2dir != "":
		return b.v2dir
	case len(b.v1) > 0:
		return b.v1[0]
	case b.cpu != nil && b.cpu.c.mech == MechanismCgroup1:
		return b.cpu.Path()
	}
	return ""
}

// killAll kills every process in the server's cgroups and returns how many
// there were. known kills the processes procmgr knows and their process
// groups (Server.killKnown, safe against their reaping) and says how many:
// with no cgroup they are all it can kill. nil: none.
func (b *box) killAll(known func() int) (int, error) {
	nKnown := 0
	killKnown := func() {
		if known != nil {
			nKnown = known()
		}
	}
	members, _ := b.members()
	switch b.c.kill {
	case KillCgroupKill:
		err := writeCgroupFile(filepath.Join(b.v2dir, "cgroup.kill"), "1")
		if err != nil {
			killKnown()
			return nKnown, err
		}
		return len(members), nil
	case KillFreezeV2:
		return b.freezeKill(filepath.Join(b.v2dir, "cgroup.freeze"), "1", "0", func() bool {
			return cgroupEvent(filepath.Join(b.v2dir, "cgroup.events"), "frozen") == 1
		}, killKnown)
	case KillFreezerV1:
		dir := filepath.Join(b.c.v1dir("freezer"), b.server)
		return b.freezeKill(filepath.Join(dir, "freezer.state"), "FROZEN", "THAWED", func() bool {
			s, _ := os.ReadFile(filepath.Join(dir, "freezer.state"))
			return strings.TrimSpace(string(s)) == "FROZEN"
		}, killKnown)
	case KillMembers:
		killKnown()
		n := len(members)
		// A member may fork while it is being killed: go round again
		// until none is left (bounded: pids_max bounds the forks).
		for range 100 {
			left, err := b.members()
			if err != nil || len(left) == 0 {
				return max(n, nKnown), err
			}
			for _, pid := range left {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			time.Sleep(time.Millisecond)
		}
		return n, fmt.Errorf("procmgr: %s: members still forking after 100 rounds of SIGKILL", b.server)
	}
	killKnown()
	return nKnown, nil
}

// freezeKill freezes the cgroup so that nothing in it can fork, kills
// every member, and thaws it so the kills are delivered.
func (b *box) freezeKill(file, freeze, thaw string, frozen func() bool, killKnown func()) (int, error) {
	if err := writeCgroupFile(file, freeze); err != nil {
		killKnown()
		return 0, err
	}
	deadline := time.Now().Add(time.Second)
	for !frozen() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	members, err := b.members()
	for _, pid := range members {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	killKnown()
	if terr := writeCgroupFile(file, thaw); terr != nil {
		err = errors.Join(err, terr)
	}
	return len(members), err
}

// limits reads the server's limits and what they caught. Once the
// cgroups are removed, what they caught is what they held at the end: the
// counts are counters and must not fall to 0 with the server's stop.
func (b *box) limits() LimitStatus {
	l := LimitStatus{KillMechanism: string(b.c.kill), Cgroup: b.memberDir()}
	if b.limitErr != nil {
		l.Error = b.limitErr.Error()
	}
	b.mu.Lock()
	l.Pending = b.fallback
	removed, caught := b.removed, b.caught
	b.mu.Unlock()
	if removed {
		l.PidsHits, l.OOMKills = caught.PidsHits, caught.OOMKills
		return l
	}
	var pdir string
	switch b.c.pids {
	case LimitCgroup2:
		pdir = b.v2dir
	case LimitCgroup1:
		pdir = filepath.Join(b.c.v1dir("pids"), b.server)
	}
	if pdir != "" {
		l.PidsMax = readLimit(filepath.Join(pdir, "pids.max"))
		l.Pids = readLimit(filepath.Join(pdir, "pids.current"))
		l.PidsHits = uint64(max(cgroupEvent(filepath.Join(pdir, "pids.events"), "max"), 0))
	}
	switch b.c.mem {
	case LimitCgroup2:
		l.MemoryMax = readLimit(filepath.Join(b.v2dir, "memory.max"))
		l.Memory = readLimit(filepath.Join(b.v2dir, "memory.current"))
		l.OOMKills = uint64(max(cgroupEvent(filepath.Join(b.v2dir, "memory.events"), "oom_kill"), 0))
	case LimitCgroup1:
		dir := filepath.Join(b.c.v1dir("memory"), b.server)
		l.MemoryMax = readLimit(filepath.Join(dir, "memory.limit_in_bytes"))
		if l.MemoryMax >= 1<<62 { // v1's "no limit" is PAGE_COUNTER_MAX pages
			l.MemoryMax = 0
		}
		l.Memory = readLimit(filepath.Join(dir, "memory.usage_in_bytes"))
		l.OOMKills = uint64(max(cgroupEvent(filepath.Join(dir, "memory.oom_control"), "oom_kill"), 0))
	}
	return l
}

// remove deletes the server's cgroups once its processes are gone,
// waiting up to removeWait for exiting tasks to leave each.
func (b *box) remove() error {
	caught := b.limits()
	b.mu.Lock()
	b.removed, b.caught = true, caught
	if b.v2fd >= 0 {
		_ = unix.Close(b.v2fd)
		b.v2fd = -1
	}
	b.mu.Unlock()
	var dirs []string
	if b.v2dir != "" && !b.c.v2shared {
		dirs = append(dirs, b.v2dir)
	}
	dirs = append(dirs, b.v1...)
	var errs []error
	for _, d := range dirs {
		errs = append(errs, rmdirWait(d, "cgroup of "+b.server, ""))
	}
	errs = append(errs, b.cpu.Remove())
	return errors.Join(errs...)
}

// rmdirWait removes a cgroup directory, waiting up to removeWait for
// exiting tasks to leave it. subject names the cgroup in an error ("cgroup
// of SERVER"); advice, if any, follows the processes still in it.
func rmdirWait(dir, subject, advice string) error {
	deadline := time.Now().Add(removeWait)
	for {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("procmgr: %s: rmdir %s: %w", subject, dir, err)
		}
		if time.Now().After(deadline) {
			pids, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			return fmt.Errorf("procmgr: %s: rmdir %s: %w (processes still in it: [%s]%s)",
				subject, dir, err, strings.Join(strings.Fields(string(pids)), " "), advice)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// readPids reads a cgroup.procs file.
func readPids(file string) ([]int, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var out []int
	for f := range strings.FieldsSeq(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out, nil
}

// readLimit reads a number from a cgroup file; "max" and errors give 0.
func readLimit(file string) int64 {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// cgroupEvent reads key's value from a flat keyed file ("key value" lines:
// cgroup.events, pids.events, memory.events, memory.oom_control); -1 when
// absent.
func cgroupEvent(file, key string) int64 {
	f, err := os.Open(file)
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return -1
}
