package procmgr

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// This file is how a process is started: every one from the spawning
// thread (spawnLoop), locked to its OS thread so that Pdeathsig refers to a
// thread that lives as long as the daemon, placed in its server's cgroups
// and namespaces, with its user, descriptors and environment.

type spawnReq struct {
	cmd    *exec.Cmd // nil: go home (vacate)
	tasks  []string  // v1 tasks files the spawning thread joins for the fork
	module int       // the module's descriptor to put at execFD for the fork; -1: none
	reply  chan spawnResult
}

type spawnResult struct {
	err     error // the start's
	joinErr error // joining the v1 cgroups failed: place the child after the start
}

// CloseOnExec marks every descriptor of the process from 3 up
// close-on-exec. os/exec passes a child only the files it is given, but a
// descriptor the process inherited without close-on-exec (a file an init
// system or a shell left open) would reach every child as well: a UAP
// could read a root-only file through it. New calls it; a daemon calls it
// early in main too, before it starts anything. Descriptors the process
// itself uses stay open; a child that must have one gets it explicitly
// (exec.Cmd.ExtraFiles).
func CloseOnExec() error {
	err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
		return nil
	}
	// Before Linux 5.11: one by one.
	ents, rerr := os.ReadDir("/proc/self/fd")
	if rerr != nil {
		return fmt.Errorf("close_range: %w; /proc/self/fd: %w", err, rerr)
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC)
		}
	}
	return nil
}

// spawnLoop starts every process from one locked thread so that Pdeathsig
// refers to a thread that lives as long as the daemon.
//
// The thread's scheduling policy is what every process starts with (a
// child inherits its parent thread's), so SchedBatch is set here, once,
// and no process runs a moment under another policy.
//
// no_new_privs is set on this thread alone, for the same reason: every
// process it starts inherits it, so no setuid or file-capability program a
// UAP runs gains privileges, and scdd's other threads (which start a new
// scdd on a restart) keep theirs. The thread never runs an exec itself.
//
// For a start into v1 cgroups the thread joins them (one write of its tid
// to each "tasks" file: v1 moves single threads) so that the child is born
// there (joinAndStart). It stays there until a start for another server,
// or until that server stops (vacate): a move takes the kernel's
// cgroup_threadgroup_rwsem for writing, which costs a grace period when
// the lock was idle (milliseconds on a busy host), so the non-resident
// starts of one busy server pay for none.
func (m *Manager) spawnLoop(started chan struct{}) {
	defer m.wg.Done()
	// Never unlocked: when the loop ends the thread ends with it, so no
	// other goroutine runs with its no_new_privs or in a server's cgroup.
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		// The main thread: a goroutine started while the main goroutine
		// waits for it (scdd calls New from main) runs there. It owns the
		// address space, and v1 charges all the process's memory to its
		// owner's memory cgroup: joined to a server's, scdd's memory
		// counted against that server's limit, and scdd stood in its
		// OOM killer's way. Held here, the main thread leaves the loop to
		// another until that one runs.
		m.wg.Add(1)
		go m.spawnLoop(started)
		<-started
		runtime.UnlockOSThread()
		return
	}
	if m.opts.SchedBatch {
		if err := unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_BATCH}, 0); err != nil {
			m.log.Warn("uap_sched_batch: processes start under the default policy", "err", err)
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		m.nnpErr = os.NewSyscallError("prctl PR_SET_NO_NEW_PRIVS", err)
		m.log.Warn("uap processes start without no_new_privs", "err", m.nnpErr)
	}
	m.homes = threadHomes(m.contain, "/proc/thread-self/cgroup")
	tid := strconv.Itoa(unix.Gettid())
	close(started)
	var joined []string // the tasks files the thread is in; nil: its own cgroups
	for {
		select {
		case r := <-m.spawns:
			if r.cmd == nil {
				m.goHome(joined, tid)
				joined = nil
				r.reply <- spawnResult{}
				continue
			}
			var res spawnResult
			joined, res = m.joinAndStart(r, joined, tid)
			r.reply <- res
		case <-m.done:
			return
		}
	}
}

// vacate takes the spawning thread out of the servers' cgroups, back into
// its own: before a server's cgroups are frozen, killed or removed (a
// thread of scdd's in them would be frozen, listed among the members, and
// would keep them from being removed).
func (m *Manager) vacate() {
	r := spawnReq{reply: make(chan spawnResult, 1)}
	select {
	case m.spawns <- r:
		<-r.reply
	case <-m.done:
	}
}

// joinAndStart starts r.cmd with the spawning thread in the v1 cgroups
// r.tasks names, where it stays; joined are the ones it is in now, and it
// returns those it is in after. If a join fails the thread goes home and
// the start goes on: the child is placed by cgroup.procs after it
// (spawnResult.joinErr).
func (m *Manager) joinAndStart(r spawnReq, joined []string, tid string) ([]string, spawnResult) {
	if r.module >= 0 {
		if err := unix.Dup3(r.module, m.execFD, unix.O_CLOEXEC); err != nil {
			return joined, spawnResult{err: fmt.Errorf("put the module at fd %d: %w", m.execFD, err)}
		}
		// /dev/null back after the fork: the module's file is not held.
		defer func() { _ = unix.Dup3(m.nullFD, m.execFD, unix.O_CLOEXEC) }()
	}
	var joinErr error
	if !slices.Equal(joined, r.tasks) {
		// Straight from one server's cgroups to the next one's: a write
		// per hierarchy moves the thread.
		var now []string
		for _, tasks := range r.tasks {
			if err := writeCgroupFile(tasks, tid); err != nil {
				joinErr = err
				break
			}
			now = append(now, tasks)
		}
		if joinErr != nil {
			m.goHome(append(now, joined...), tid)
			now = nil
		}
		joined = now
	}
	// Again at each start, not only in New: a descriptor opened since
	// without close-on-exec (a library's raw open) would reach this UAP.
	// One system call; a descriptor opened between it and the fork still
	// could, which Go's own opens never are.
	_ = CloseOnExec()
	err := r.cmd.Start()
	if len(r.tasks) > 0 {
		m.contain.threadJoined(joinErr)
	}
	return joined, spawnResult{err: err, joinErr: joinErr}
}

// goHome moves the spawning thread back from the cgroups it joined (a
// hierarchy may be named twice: it goes home once).
func (m *Manager) goHome(joined []string, tid string) {
	done := map[string]bool{}
	for _, tasks := range joined {
		home := ""
		for mount, h := range m.homes {
			if strings.HasPrefix(tasks, mount+"/") {
				home = h
				break
			}
		}
		if done[home] {
			continue
		}
		done[home] = true
		err := errors.New("no home cgroup known for its hierarchy")
		if home != "" {
			err = writeCgroupFile(home, tid)
		}
		if err != nil {
			// Its next starts are still placed right (it joins each
			// server's cgroups first), but the server's cgroup cannot be
			// removed while the thread is in it.
			m.log.Error("the spawning thread could not leave a server's cgroup", "tasks", tasks, "err", err)
		}
	}
}

// cpuShareable says whether a server's processes can share scdd's own cpu
// cgroup (Spec.SharedCPU): on cgroup v1, with the cpu hierarchy apart
// from every hierarchy that contains the server, another cgroup of the
// server to find its processes in (a stop kills them all, a weight moves
// them), and the spawning thread's home on the cpu hierarchy known; on
// cgroup v2 under scdd's delegated cgroup while the cpu controller is off
// below it (CPUControl.lazy).
func (m *Manager) cpuShareable() bool {
	if m.cpu.mech == MechanismCgroup2 {
		return m.cpu.lazy
	}
	if m.cpu.mech != MechanismCgroup1 || m.homes[m.cpu.mount] == "" {
		return false
	}
	for _, h := range m.contain.v1 {
		if h.mount == m.cpu.mount {
			return false
		}
	}
	return m.contain.v2dir != "" || len(m.contain.v1) > 0
}

// tasksFor lists the v1 "tasks" files the spawning thread joins for a
// start placed by pl: a shared CPU group's is the thread's home on the cpu
// hierarchy (where scdd runs).
func (m *Manager) tasksFor(pl *placement) []string {
	if !pl.cpuHome {
		return pl.tasks
	}
	return append(slices.Clip(pl.tasks), m.homes[m.cpu.mount]) // known: cpuShareable
}

// threadHomes reads the calling thread's v1 cgroups (from
// /proc/thread-self/cgroup) for each v1 hierarchy the containment places
// processes in, as "tasks" files by mount point.
func threadHomes(c *Containment, file string) map[string]string {
	homes := map[string]string{}
	b, err := os.ReadFile(file)
	if err != nil {
		return homes
	}
	hiers := append([]v1Hier(nil), c.v1...)
	if c.cpu != nil && c.cpu.mech == MechanismCgroup1 {
		hiers = append(hiers, v1Hier{controller: "cpu", mount: c.cpu.mount})
	}
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		for _, h := range hiers {
			if hasWord(strings.ReplaceAll(f[1], ",", " "), h.controller) {
				homes[h.mount] = filepath.Join(h.mount, f[2], "tasks")
			}
		}
	}
	return homes
}

func (m *Manager) start(cmd *exec.Cmd, tasks []string, module int) spawnResult {
	r := spawnReq{cmd: cmd, tasks: tasks, module: module, reply: make(chan spawnResult, 1)}
	select {
	case m.spawns <- r:
		return <-r.reply
	case <-m.done:
		return spawnResult{err: errors.New("procmgr: manager closed")}
	}
}

// namespaces says whether the next start runs in a user and pid namespace.
func (m *Manager) namespaces() bool {
	m.nsMu.Lock()
	defer m.nsMu.Unlock()
	return m.userns
}

// noNamespaces turns the namespaces off for the node: a start with them
// failed with err where one without worked.
func (m *Manager) noNamespaces(err error) {
	m.nsMu.Lock()
	was := m.userns
	if was {
		m.userns, m.nsErr = false, fmt.Errorf("the kernel refused a user and pid namespace: %w", err)
	}
	m.nsMu.Unlock()
	if was {
		m.log.Warn("uap processes run without a namespace of their own", "err", err)
	}
}

// nsRefused says whether a start with a user and pid namespace failed
// because the kernel refused the namespaces (clone(2)): EPERM (unprivileged
// user namespaces disabled, or a security module), EINVAL (a kernel built
// without them), ENOSPC (a max_*_namespaces limit or the nesting depth),
// EUSERS (the nesting depth before Linux 4.9). Any other error (EAGAIN at a
// pids limit, ENOMEM, a module that cannot be executed) fails that one
// start and leaves the namespaces on for the next: a transient error whose
// retry without them worked used to turn them off for the node for good.
func nsRefused(err error) bool {
	return errors.Is(err, unix.EPERM) || errors.Is(err, unix.EINVAL) ||
		errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EUSERS)
}

// startFault, when set by a test, is called before each start with
// whether it uses namespaces; an error it returns stands for the start's.
var startFault atomic.Pointer[func(withNS bool) error]

// afterStart, when set by a test, runs between a process's start and the
// release of the server's lock: the window in which Stop must still see it.
var afterStart atomic.Pointer[func()]

// spawn starts a process in sl. With residentOnly (a restart) it starts
// none if sl stopped being resident meanwhile, and then, as when the server
// stops, gives the slot up (not watched).
func (s *Server) spawn(sl *slot, residentOnly bool) error {
	s.mu.Lock()
	if s.stopping {
		// Not even prepared: the delegate's slot of a stopping server
		// would be readied for a process that never starts.
		sl.state, sl.watched = StateStopped, false
		s.mu.Unlock()
		return errStopping
	}
	if residentOnly && !sl.resident {
		sl.state, sl.watched = StateStopped, false
		s.mu.Unlock()
		return errNotResident
	}
	s.mu.Unlock()
	files, err := s.delegate.Prepare(sl.index)
	if err != nil {
		return fmt.Errorf("procmgr: %s: prepare slot %d: %w", s.spec.Server, sl.index, err)
	}
	// Each try that fails for a reason of ours goes again without it: a
	// kernel that refuses the namespaces, or clone3 into the cgroup.
	withNS := s.m.namespaces()
	var nsErr error
	for try := 0; ; try++ {
		cmd, attr, out, err := s.command(sl.index, files, withNS)
		if err != nil {
			return fmt.Errorf("procmgr: %s: %w", s.spec.Server, err)
		}
		pl, err := s.box.prepare(attr)
		if err != nil {
			out.abandon()
			return fmt.Errorf("procmgr: %s: %w", s.spec.Server, err)
		}
		// Start under mu so that kill, which sets stopping under mu, either
		// sees this process or keeps it from starting.
		s.mu.Lock()
		if s.stopping {
			sl.state, sl.watched = StateStopped, false
			s.mu.Unlock()
			out.abandon()
			return errStopping
		}
		if residentOnly && !sl.resident {
			sl.state, sl.watched = StateStopped, false
			s.mu.Unlock()
			out.abandon()
			return errNotResident
		}
		// s.mu is held across the spawn so that the slot's state and its
		// process change together (a stop meanwhile would miss the new
		// process); the spawning thread takes no server's lock, and a fork
		// is bounded.
		var res spawnResult
		if f := startFault.Load(); f != nil {
			res.err = (*f)(withNS)
		}
		if res.err == nil {
			res = s.m.start(cmd, s.m.tasksFor(pl), out.linked) // lockcheck: as above
		}
		out.started()
		if res.err != nil {
			s.mu.Unlock()
			out.abandon()
			if try < 3 && withNS && nsRefused(res.err) {
				withNS, nsErr = false, res.err // again without the namespaces
				continue
			}
			if try < 3 && s.box.startFailed(pl, attr, res.err) {
				continue // clone into the cgroup refused: place by cgroup.procs
			}
			if derr := checkDir(s.spec.Dir); derr != nil {
				// The child's failed chdir comes back as the exec's own
				// error, naming the module's path ("fork/exec
				// /proc/self/fd/14: no such file or directory").
				res.err = fmt.Errorf("%w (%v)", derr, res.err)
			}
			return fmt.Errorf("procmgr: %s: start %s: %w", s.spec.Server, s.spec.Module, res.err)
		}
		s.live.Add(1)
		if f := afterStart.Load(); f != nil {
			(*f)()
		}
		sl.proc, sl.state, sl.started, sl.stopAsked, sl.attached = cmd.Process, StateStarting, time.Now(), false, false
		sl.lastServed, sl.idleSince = 0, time.Time{}
		s.running.Add(1)
		s.mu.Unlock()
		pid := cmd.Process.Pid
		s.delegate.Started(sl.index, pid)
		if nsErr != nil {
			s.m.noNamespaces(nsErr)
		}
		go s.copyOutput(out.r, pid)
		if err := s.box.placed(pl, pid, res.joinErr); err != nil {
			s.m.log.Warn("uap not placed in all its cgroups", "server", s.spec.Server, "pid", pid, "err", err)
		}
		if err := s.usage.track(pid); err != nil {
			s.m.log.Warn("uap not measured", "server", s.spec.Server, "pid", pid, "err", err)
		}
		s.m.log.Debug("uap started", "server", s.spec.Server, "slot", sl.index, "pid", pid, "resident", sl.resident)
		return nil
	}
}

// launch is what scdd holds open for one start until the child runs:
// the read end r of the child's output pipe (kept: copyOutput reads it),
// the write end w the child gets as stdout and stderr, and the module's
// descriptor when it is executed through one.
type launch struct {
	r, w   *os.File
	module int // -1: executed by path
	linked int // module, when it is executed through a link in LinkDir; -1 otherwise
}

// started closes what the child has its own copies of now.
func (l *launch) started() {
	if l.w != nil {
		_ = l.w.Close()
		l.w = nil
	}
	if l.module >= 0 {
		_ = unix.Close(l.module)
		l.module = -1
	}
}

// abandon closes everything of a start that did not happen.
func (l *launch) abandon() {
	l.started()
	if l.r != nil {
		_ = l.r.Close()
		l.r = nil
	}
}

// checkDir reports why dir cannot be a UAP's working directory, as scdd
// sees it; nil for "" (the default, /).
func checkDir(dir string) error {
	if dir == "" {
		return nil
	}
	fi, err := os.Stat(dir)
	switch {
	case err != nil:
		return fmt.Errorf("working directory: %w", err)
	case !fi.IsDir():
		return fmt.Errorf("working directory %s: not a directory", dir)
	}
	return nil
}

// command builds one start of the server's module in slot, with files as
// fd 3, 4, ...: its environment, working directory, user, output pipe,
// and, for a non-root daemon (withNS), its user and pid namespace.
//
// A UAP that runs as another user than scdd is executed through a
// descriptor scdd opened (/proc/self/fd/N, closed at exec), so that the
// module needs only to be executable by that user, not reachable along
// its path: a clone under /root works. A script (#!) is executed by its
// path, because its interpreter opens it by the name it is given.
func (s *Server) command(slot int, files []*os.File, withNS bool) (*exec.Cmd, *syscall.SysProcAttr, *launch, error) {
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if s.spec.UID >= 0 || s.spec.GID >= 0 {
		attr.Credential = s.credential(slot)
	}
	if withNS {
		// No id map: scdd is not dumpable, so its child's
		// /proc/PID/uid_map is root's and scdd could not write it. The
		// UAP keeps scdd's user for everything outside (files, signals,
		// sockets); inside, getuid says 65534 (the overflow id).
		attr.Cloneflags = syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID
	}
	l := &launch{module: -1, linked: -1}
	path := s.spec.Module
	if attr.Credential != nil {
		if fd, ok := openModule(s.spec.Module, moduleFDFloor(len(files))); ok {
			path, l.module = "/proc/self/fd/"+strconv.Itoa(fd), fd
			if link, ok := s.m.moduleLink(s.spec.Module, len(files)); ok {
				path, l.linked = link, fd
			}
		}
	}
	var err error
	if l.r, l.w, err = os.Pipe(); err != nil {
		l.abandon()
		return nil, nil, nil, fmt.Errorf("output pipe: %w", err)
	}
	dir := s.spec.Dir
	if dir == "" {
		dir = "/"
	}
	cmd := &exec.Cmd{
		Path:        path,
		Args:        append([]string{s.spec.Module}, s.spec.Args...),
		Env:         s.env(slot),
		Dir:         dir,
		ExtraFiles:  files,
		Stdout:      l.w,
		Stderr:      l.w,
		SysProcAttr: attr,
	}
	return cmd, attr, l, nil
}

// reserveExecFD reserves a descriptor number for the links of LinkDir:
// /dev/null there until a start puts a module's descriptor in its place.
func (m *Manager) reserveExecFD() error {
	null, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	fd, err := unix.FcntlInt(uintptr(null), unix.F_DUPFD_CLOEXEC, 100)
	if err != nil {
		unix.Close(null)
		return err
	}
	m.execFD, m.nullFD = fd, null
	return nil
}

// moduleLink is the link in LinkDir named as module that leads to the
// descriptor at execFD, made if it is not there; false when there is none
// to use (the child's descriptors would reach execFD, or the link cannot
// be made: said once).
func (m *Manager) moduleLink(module string, extra int) (string, bool) {
	if m.execFD < 0 || moduleFDFloor(extra) > m.execFD {
		return "", false
	}
	link := filepath.Join(m.opts.LinkDir, filepath.Base(module))
	target := "/proc/self/fd/" + strconv.Itoa(m.execFD)
	m.linkMu.Lock()
	if got, err := os.Readlink(link); err == nil && got == target {
		m.linkMu.Unlock()
		return link, true
	}
	_ = os.Remove(link)
	err := os.Symlink(target, link)
	first := err != nil && m.linkErr == nil
	if first {
		m.linkErr = err
	}
	m.linkMu.Unlock()
	if first {
		m.log.Warn("modules run through a descriptor show its number as their name", "err", err)
	}
	if err != nil {
		return "", false
	}
	return link, true
}

// moduleFDFloor is the lowest descriptor number the module's may have so
// that the child's fd shuffle (syscall.forkAndExecInChild: files moved to
// 0..n-1, some first above n) never lands on it before the exec.
func moduleFDFloor(extra int) int { return 2*(3+extra) + 8 }

// openModule opens the module for an exec through /proc/self/fd: a
// close-on-exec descriptor numbered floor or above. It reports false for a
// script (#!: its interpreter would be given the descriptor's name, closed
// by then) or a module scdd cannot open; those are executed by path.
func openModule(path string, floor int) (int, bool) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, false
	}
	defer unix.Close(fd)
	var magic [2]byte
	if n, _ := unix.Pread(fd, magic[:], 0); n == 2 && string(magic[:]) == "#!" {
		return -1, false
	}
	hi, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, floor)
	if err != nil {
		return -1, false
	}
	return hi, true
}

func (s *Server) credential(slot int) *syscall.Credential {
	c := &syscall.Credential{Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid()), NoSetGroups: false}
	if s.spec.UID >= 0 {
		c.Uid = uint32(s.spec.UID)
	}
	if s.spec.GID >= 0 {
		c.Gid = uint32(s.spec.GID)
		if s.spec.SlotGIDs {
			c.Gid += uint32(slot)
		}
	}
	c.Groups = []uint32{} // no supplementary groups: not the daemon's
	return c
}

// baseEnv are the variables of the daemon's environment a UAP inherits;
// with TPSCHED_* (the shm library's and the example UAP's knobs) and the
// definition's putenv, that is all it sees.
var baseEnv = []string{"PATH", "LANG", "LC_ALL", "TZ"}

// defaultPath is a UAP's PATH when the daemon has none.
const defaultPath = "/usr/local/bin:/usr/bin:/bin"

// Env is the environment a process of the server starts with: PATH, LANG,
// LC_ALL and TZ from the daemon's (PATH defaults to /usr/local/bin:
// /usr/bin:/bin), every TPSCHED_* variable of the daemon's, the server's
// putenv, then what procmgr sets: TPSCHED_SHM_FD, TPSCHED_PROC_SLOT,
// TPSCHED_SERVER, TPSCHED_GROUP and, in refresh mode, TPSCHED_REFRESH.
func (s *Server) env(slot int) []string {
	env := make([]string, 0, 16)
	for _, k := range baseEnv {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		} else if k == "PATH" {
			env = append(env, "PATH="+defaultPath)
		}
	}
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "TPSCHED_") {
			env = append(env, kv)
		}
	}
	env = append(env, s.spec.Env...)
	env = append(env,
		"TPSCHED_SHM_FD=3",
		"TPSCHED_PROC_SLOT="+strconv.Itoa(slot),
		"TPSCHED_SERVER="+s.spec.Server,
		"TPSCHED_GROUP="+s.spec.Group,
	)
	if s.spec.Refresh {
		env = append(env, "TPSCHED_REFRESH=1")
	}
	return env
}
