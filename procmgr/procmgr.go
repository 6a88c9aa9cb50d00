// Package procmgr owns the UAP processes of a node: it starts each user
// server's resident processes from its module, starts and stops
// non-resident ones by the Multiserver rule (scale.go), puts every process
// under its server's CPU priority (cgroup.go) and into its server's
// cgroups, which bound its tasks and memory and kill everything it started
// together (contain.go), gates non-resident starts on free memory, notices
// when a process dies and replaces resident ones with back-off. It decides
// nothing about routing and knows nothing of the wire or of shared memory:
// the schedule service connects it through a Delegate.
//
// Every process is started from one goroutine locked to its OS thread,
// because Pdeathsig fires when the spawning thread exits, not the process;
// the same thread carries no_new_privs and joins a server's v1 cgroups for
// the fork, so a child is born in them. Each UAP runs as the user and group
// its Spec names (never as root unless told), in its server's working
// directory, with its stdout and stderr a pipe whose lines procmgr logs
// (output.go), no descriptor of the daemon's but the Delegate's files, and
// a small environment (see Env). It also gets its own process group, which
// a kill reaches where there is no cgroup.
//
// # Usage
//
//	m := procmgr.New(procmgr.Options{Logger: log, NodeCap: 64})
//	defer m.Close()
//	srv, err := m.Start(procmgr.Spec{Server: "echo", Module: "/usr/bin/uap-echo",
//		Resident: 2, Max: 8, BalanceCount: 3, UID: -1, GID: -1}, delegate)
//	srv.Kick(depth) // after an enqueue: wakes the scaler if the rule may want a process
//	kinds, err := srv.SetParallelCount(3, 8) // scdctl chprc: three resident processes now
//	...
//	srv.Stop(ctx) // after the queue was closed: waits, then kills
package procmgr

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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

// Spec says how to run one user server's processes.
type Spec struct {
	Server       string        // user server name, for logs and the UAP's environment
	Group        string        // service group it serves
	Module       string        // path of the UAP executable
	Args         []string      // arguments after the module name
	Env          []string      // NAME=value from the definition (putenv), after the base environment (see Env)
	UID, GID     int           // the user and group the processes run as; -1: the daemon's own
	Resident     int           // processes started with the server and kept running
	Max          int           // most processes, resident ones included; < Resident means Resident
	BalanceCount int           // balance_count of the Multiserver rule
	Priority     int           // schedule_priority 1 (highest) .. 16; 0 = 8
	Refresh      bool          // scd_refresh_process: each process serves one request
	IdleStop     time.Duration // how long a non-resident process idles before it may stop
	CPUWaitLimit int           // cpu_wait_limit percent: the CPU guard (see CPUBound); 0 = off
	// SlotGIDs runs the process in slot i with group GID+i: the processes
	// of the server share a user but no two have the same group, and
	// ptrace access (/proc/PID/fd, mem, environ) needs both to match, so
	// none can open another's area, not even before it attached (scd gives
	// this to the ids it derives; a definition's gid is kept as it is).
	SlotGIDs bool
	// PidsMax is the most tasks (processes and threads) the server's
	// processes may have together (pids.max of its cgroup); 0 = no limit.
	PidsMax int
	// MemoryMax is the most memory they may use together (memory.max, or
	// memory.limit_in_bytes on v1), in bytes; 0 = no limit.
	MemoryMax int64
	// Dir is the processes' working directory; "" = "/". It must exist and
	// be reachable by UID (scd prepares one per server).
	Dir string
}

// SlotView is what the schedule service says about a process slot.
type SlotView struct {
	Busy   bool   // serving a call
	Ready  bool   // attached and serving (idle or busy)
	Served uint64 // calls it completed
}

// Delegate is how a server's processes reach the schedule service, in the
// manner of memberlist's delegates. procmgr calls it from its own
// goroutines (a server's supervisors and the node's scaler), never from a
// gnet event loop and never with its own locks held. No method may block
// for more than a few microseconds.
type Delegate interface {
	// Prepare readies slot for a process about to start and returns the
	// files it gets as fd 3, 4, ... It runs on the goroutine that starts
	// the process, after the slot's last Exited. The files stay the
	// delegate's: procmgr never closes them.
	Prepare(slot int) ([]*os.File, error)
	// Exited runs once the process in slot has died and been reaped, on the
	// goroutine that waited for it, before any replacement is prepared.
	Exited(slot, pid int, err error)
	// Waiting is the number of calls waiting for a process: the
	// Multiserver rule's "remaining requests". The scaler calls it.
	Waiting() int
	// Slot says what the process in slot is doing. The scaler calls it.
	Slot(slot int) SlotView
	// Stop asks the process in slot to take no further call: it finishes
	// the one in hand and leaves. The scaler calls it.
	Stop(slot int)
	// Failing says that the server's processes keep dying before they
	// attach (err says how the last one ended), or, with nil, that one
	// attached again. Calls for the server cannot be served meanwhile.
	Failing(err error)
}

// Restart back-off: a process that dies soon after it started without
// completing a call waits longer before its replacement, so a UAP that
// crashes at start-up (or on every call) cannot spin the node; one that
// lived a while, or served calls, is replaced at once (an operator's kill
// -9 is no crash loop).
const (
	minBackoff   = 20 * time.Millisecond
	maxBackoff   = 5 * time.Second
	stableUptime = 10 * time.Second
)

// Options configure a Manager.
type Options struct {
	Logger *slog.Logger
	// CPUParent is the cgroup under which each server gets its own; default
	// "tpsched/scdd-<pid>" so that two daemons on one host never share one.
	CPUParent string
	// NodeCap is sysconf max_processes: processes on the node at most; 0 = none.
	NodeCap int
	// MemoryReserve is sysconf memory_reserve in bytes: with less memory
	// available, a non-resident process starts only after another ended.
	MemoryReserve int64
	// MemAvailable reports available memory; default MemAvailable (of the
	// host, or of the memory cgroup if that is tighter).
	MemAvailable func() (int64, error)
	// CheckInterval is how often the scaler looks without being kicked;
	// default 50 ms. Stops happen on these checks.
	CheckInterval time.Duration
	// Meter measures each process's CPU time and run-queue wait (eBPF or
	// /proc); nil measures nothing and so disables the CPU guard.
	Meter bpf.Meter
	// SchedBatch starts every process under SCHED_BATCH (sysconf
	// uap_sched_batch): a process woken for a call does not preempt the
	// thread that woke it, so a burst of calls is served in one go.
	SchedBatch bool
	// NoNamespaces keeps a non-root daemon from running UAPs in a user and
	// pid namespace of their own (the default where the kernel allows it).
	NoNamespaces bool
	// OutputRate is how many lines of output a server's processes may put
	// in the log per second, OutputBurst how many at once; beyond, lines
	// are dropped and counted. Defaults 100 and 1000.
	OutputRate, OutputBurst int
	// LinkDir is a directory of the daemon's that every UAP user can
	// search and none can write (a root daemon's: scd gives
	// /var/lib/tpsched/<node_id>/exec). A module executed through scdd's
	// descriptor is executed through a link there named as the module,
	// so that the process's name (comm, what ps and top show) is the
	// module's, not the descriptor's number. "" or unusable: the number.
	LinkDir string

	// mountinfo replaces /proc/self/mountinfo for the CPU mechanism's and
	// the containment's detection: tests show them a host with fewer
	// hierarchies.
	mountinfo string
}

// Manager starts processes for any number of servers.
type Manager struct {
	log     *slog.Logger
	opts    Options
	cpu     *CPUControl
	contain *Containment
	spawns  chan spawnReq
	// homes are the spawning thread's own v1 cgroups, by mount: where it
	// goes back after a fork it made in a server's (spawnLoop).
	homes map[string]string
	// execFD is the descriptor number every link in LinkDir names
	// (/proc/self/fd/<execFD>): the spawning thread puts the module's
	// descriptor there for a start and /dev/null back after it. -1: no
	// links, modules are executed as /proc/self/fd/N.
	execFD  int
	nullFD  int
	linkMu  sync.Mutex
	linkErr error // why the links could not be made; reported once
	// nnpErr is why no_new_privs could not be set on the spawning thread;
	// nil: every UAP starts with it.
	nnpErr error
	// userns: a non-root daemon runs each UAP in a user and pid namespace
	// of its own; nsErr says why not (set once a start without them
	// worked where one with them failed, or at New).
	nsMu   sync.Mutex
	userns bool
	nsErr  error
	kick   chan struct{}
	done   chan struct{}
	once   sync.Once
	wg     sync.WaitGroup

	mu        sync.Mutex
	servers   []*Server
	memLow    bool // the memory gate was closed at the last check
	permits   int  // non-resident exits not yet answered by a start while the gate is closed
	memErr    error
	starts    atomic.Uint64 // non-resident starts
	stops     atomic.Uint64 // non-resident stops asked by the rule
	gateHolds atomic.Uint64 // checks in which the memory gate held a start back
	cpuHolds  atomic.Uint64 // checks in which the CPU guard held a start back

	chprc    sync.Mutex // one SetParallelCount at a time, for the node-wide resident count
	checking sync.Mutex // one scaler check at a time (see check)
}

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

// New returns a Manager with its spawning thread and scaler running.
func New(opts Options) *Manager {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.CPUParent == "" {
		opts.CPUParent = "tpsched/scdd-" + strconv.Itoa(os.Getpid())
	}
	if opts.MemAvailable == nil {
		opts.MemAvailable = MemAvailable
	}
	if opts.CheckInterval == 0 {
		opts.CheckInterval = 50 * time.Millisecond
	}
	if opts.OutputRate <= 0 {
		opts.OutputRate = defaultOutputRate
	}
	if opts.OutputBurst <= 0 {
		opts.OutputBurst = defaultOutputBurst
	}
	mi := mountinfoPath
	if opts.mountinfo != "" {
		mi = opts.mountinfo
	}
	m := &Manager{
		log: opts.Logger, opts: opts,
		cpu:    detect(mi, opts.CPUParent),
		spawns: make(chan spawnReq),
		kick:   make(chan struct{}, 1),
		done:   make(chan struct{}),
	}
	if err := CloseOnExec(); err != nil {
		m.log.Warn("descriptors the daemon inherited may reach its UAPs", "err", err)
	}
	m.contain = detectContainment(mi, opts.CPUParent, m.cpu)
	m.cpu.byThread = true
	m.execFD, m.nullFD = -1, -1
	if opts.LinkDir != "" {
		if err := m.reserveExecFD(); err != nil {
			m.log.Warn("modules run through a descriptor show its number as their name", "err", err)
		}
	}
	switch {
	case os.Geteuid() == 0:
		m.nsErr = errors.New("root: each server's processes run as a user of their own")
	case opts.NoNamespaces:
		m.nsErr = errors.New("turned off")
	default:
		m.userns = true
	}
	m.log.Info("uap cpu priority", "mechanism", m.cpu.Mechanism(), "reason", m.cpu.Reason())
	cs := m.contain.Status()
	m.log.Info("uap containment", "kill", cs.Kill, "pids_limit", cs.Pids, "memory_limit", cs.Memory, "reason", cs.KillReason)
	if cs.Kill == KillPgroup {
		m.log.Warn("uap processes are killed by process group: " + cs.KillReason)
	}
	stale := m.cpu.removeStaleDaemonGroups()
	stale = append(stale, m.contain.removeStale()...)
	if len(stale) > 0 {
		m.log.Info("removed cgroups of daemons that died without cleaning up", "cgroups", stale)
	}
	started := make(chan struct{})
	m.wg.Add(2)
	go m.spawnLoop(started)
	go m.scaleLoop()
	<-started // homes and nnpErr are set
	return m
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

// CPU is how this node enforces CPU priority.
func (m *Manager) CPU() *CPUControl { return m.cpu }

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
func (m *Manager) spawnLoop(started chan<- struct{}) {
	defer m.wg.Done()
	// Never unlocked: when the loop ends the thread ends with it, so no
	// other goroutine runs with its no_new_privs or in a server's cgroup.
	runtime.LockOSThread()
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

// Containment is how this node contains UAP processes.
func (m *Manager) Containment() ContainStatus {
	st := m.contain.Status()
	st.NoNewPrivs = m.nnpErr == nil
	m.nsMu.Lock()
	defer m.nsMu.Unlock()
	if m.userns {
		st.Namespaces = "user+pid"
	} else {
		st.Namespaces = "none: " + m.nsErr.Error()
	}
	return st
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
	defer m.nsMu.Unlock()
	if m.userns {
		m.userns, m.nsErr = false, fmt.Errorf("the kernel refused a user and pid namespace: %w", err)
		m.log.Warn("uap processes run without a namespace of their own", "err", err)
	}
}

// Close stops the spawning thread and the scaler and removes the parent
// cgroup. Servers must be stopped first.
func (m *Manager) Close() {
	m.once.Do(func() {
		close(m.done)
		m.wg.Wait()
		if err := m.cpu.Close(); err != nil {
			m.log.Warn("removing the tpsched cgroup", "err", err)
		}
		if err := m.contain.Close(); err != nil {
			m.log.Warn("removing the tpsched cgroups", "err", err)
		}
		if m.execFD >= 0 {
			_ = unix.Close(m.execFD)
			_ = unix.Close(m.nullFD)
		}
	})
}

// Stats are node-wide scaling figures for status and metrics.
type Stats struct {
	NonResidentStarts uint64 `json:"nonresident_starts"`
	NonResidentStops  uint64 `json:"nonresident_stops"`
	MemoryGateClosed  bool   `json:"memory_gate_closed"`
	MemoryGateHolds   uint64 `json:"memory_gate_holds"`
	CPUGuardHolds     uint64 `json:"cpu_guard_holds"`
	MemoryError       string `json:"memory_error,omitempty"`
}

// Stats reports the scaler's figures.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := Stats{
		NonResidentStarts: m.starts.Load(),
		NonResidentStops:  m.stops.Load(),
		MemoryGateClosed:  m.memLow,
		MemoryGateHolds:   m.gateHolds.Load(),
		CPUGuardHolds:     m.cpuHolds.Load(),
	}
	if m.memErr != nil {
		st.MemoryError = m.memErr.Error()
	}
	return st
}

// ProcState is the life stage of a process slot.
type ProcState string

const (
	StateStarting   ProcState = "starting" // started, not yet attached to its queue
	StateRunning    ProcState = "running"
	StateStopping   ProcState = "stopping"   // asked to stop after the request in hand
	StateRestarting ProcState = "restarting" // waiting out the back-off
	StateStopped    ProcState = "stopped"    // no process (a non-resident slot at rest)
)

// ProcInfo describes one process slot for status output.
type ProcInfo struct {
	Slot     int       `json:"slot"`
	PID      int       `json:"pid"`
	State    ProcState `json:"state"`
	Kind     string    `json:"kind"`     // "resident" or "nonresident"
	Restarts int       `json:"restarts"` // started again after the process died
	// Replaced counts processes of the slot replaced at an operator's
	// request (scdctl refresh): they left when asked, so they are not
	// restarts.
	Replaced int       `json:"replaced"`
	Started  time.Time `json:"started"`
	// CPUSeconds is the on-CPU time of the process in the slot now, as the
	// node's meter sees it (eBPF or /proc; 0 when nothing is measured).
	CPUSeconds float64 `json:"cpu_seconds"`
}

// Server is one user server's set of processes.
type Server struct {
	m        *Manager
	spec     Spec
	delegate Delegate
	cpu      *CPUGroup
	box      *box        // its cgroups: placement, limits, killing them together
	output   *outputBook // its processes' stdout and stderr, into the log

	stop     chan struct{} // closed when the server stops; ends back-off waits
	stopOnce sync.Once
	running  atomic.Int32 // processes up or starting, for Kick's cheap test
	usage    *usageBook
	// parallel_count now: the definition's, or what SetParallelCount made
	// it. maxProcs is read by Kick without mu, residents by other servers'
	// SetParallelCount; both are written under mu, with resident.
	maxProcs  atomic.Int32
	residents atomic.Int32

	mu           sync.Mutex
	stopping     bool
	resident     int           // slots that serve resident processes now
	slots        []*slot       // as many as the definition's maximum: the schedule queue's process slots
	crashBackoff time.Duration // non-resident crash loop: wait this long before the next start
	crashUntil   time.Time
	lastStart    time.Time // of the last non-resident process, for the CPU guard
	earlyDeaths  int       // processes in a row that died before they attached
	failing      bool      // earlyDeaths reached failingAfter: the delegate was told
	// live counts processes started and not yet reaped: Add under mu
	// together with the stopping check, Done after Exited. So Stop, which
	// sets stopping first, returns only when no process of the server is
	// left and no start can follow.
	live sync.WaitGroup
}

type slot struct {
	index     int
	resident  bool
	proc      *os.Process
	state     ProcState
	restarts  int
	replaced  int         // processes replaced at an operator's request (Replace)
	replacing *os.Process // the process Replace was asked for: its exit is no crash
	started   time.Time
	attached  bool // the process attached to its queue (see Attached)
	stopAsked bool
	// watched: a goroutine starts, watches or restarts this slot's
	// process; the slot is not free for another start.
	watched bool
	// idle tracking for non-resident processes
	lastServed uint64
	idleSince  time.Time
}

// failingAfter is how many processes in a row may die before attaching
// before the server is reported failing (its calls cannot be served).
const failingAfter = 3

// Start starts the server's resident processes and supervises them. It
// fails if the first start of any process fails (a missing module, say),
// after killing the ones already started.
func (m *Manager) Start(spec Spec, d Delegate) (*Server, error) {
	spec.Max = max(spec.Max, spec.Resident)
	if spec.Max < 1 {
		return nil, fmt.Errorf("procmgr: %s: parallel_count allows no process", spec.Server)
	}
	if d == nil {
		return nil, fmt.Errorf("procmgr: %s: no delegate", spec.Server)
	}
	if _, err := os.Stat(spec.Module); err != nil {
		return nil, fmt.Errorf("procmgr: %s: module: %w", spec.Server, err)
	}
	cpu, err := m.cpu.NewGroup(spec.Server, spec.Priority)
	if err != nil {
		return nil, fmt.Errorf("procmgr: %s: %w", spec.Server, err)
	}
	bx, err := m.contain.newBox(spec.Server, cpu, spec.PidsMax, spec.MemoryMax)
	if err != nil {
		_ = cpu.Remove()
		return nil, fmt.Errorf("procmgr: %s: %w", spec.Server, err)
	}
	if bx.limitErr != nil {
		m.log.Warn("uap limits not set", "server", spec.Server, "err", bx.limitErr)
	}
	s := &Server{m: m, spec: spec, delegate: d, cpu: cpu, box: bx, stop: make(chan struct{}), usage: newUsageBook(m.opts.Meter),
		output: newOutputBook(m.opts.OutputRate, m.opts.OutputBurst), resident: spec.Resident}
	s.maxProcs.Store(int32(spec.Max))
	s.residents.Store(int32(spec.Resident))
	for i := range spec.Max {
		s.slots = append(s.slots, &slot{index: i, resident: i < spec.Resident, state: StateStopped, watched: i < spec.Resident})
	}
	for _, sl := range s.slots[:spec.Resident] {
		if err := s.spawn(sl, false); err != nil {
			s.kill()
			s.waitLive(killWait)
			_ = bx.remove()
			return nil, err
		}
		go s.watch(sl)
	}
	m.mu.Lock()
	m.servers = append(m.servers, s)
	m.mu.Unlock()
	return s, nil
}

// errStopping keeps a replacement from starting once Stop has begun;
// errNotResident keeps one from starting in a slot that stopped being
// resident while it waited (SetParallelCount).
var (
	errStopping    = errors.New("procmgr: server stopping")
	errNotResident = errors.New("procmgr: slot no longer resident")
)

// afterStart, when set by a test, runs between a process's start and the
// release of the server's lock: the window in which Stop must still see it.
var afterStart atomic.Pointer[func()]

// spawn starts a process in sl. With residentOnly (a restart) it starts
// none if sl stopped being resident meanwhile, and then, as when the server
// stops, gives the slot up (not watched).
func (s *Server) spawn(sl *slot, residentOnly bool) error {
	s.mu.Lock()
	if residentOnly && !sl.resident && !s.stopping {
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
		res := s.m.start(cmd, pl.tasks, out.linked)
		out.started()
		if res.err != nil {
			s.mu.Unlock()
			out.abandon()
			if try < 3 && withNS {
				withNS, nsErr = false, res.err // again without the namespaces
				continue
			}
			if try < 3 && s.box.startFailed(pl, attr, res.err) {
				continue // clone into the cgroup refused: place by cgroup.procs
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
	defer m.linkMu.Unlock()
	if got, err := os.Readlink(link); err == nil && got == target {
		return link, true
	}
	_ = os.Remove(link)
	err := os.Symlink(target, link)
	if err != nil {
		if m.linkErr == nil {
			m.linkErr = err
			m.log.Warn("modules run through a descriptor show its number as their name", "err", err)
		}
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

// Attached says that the process in slot attached to its queue: it is
// running, and the server is not failing.
func (s *Server) Attached(slot int) {
	s.mu.Lock()
	if slot < 0 || slot >= len(s.slots) || s.slots[slot].proc == nil {
		s.mu.Unlock()
		return
	}
	sl := s.slots[slot]
	sl.attached = true
	if sl.state == StateStarting {
		sl.state = StateRunning
	}
	s.earlyDeaths = 0
	recovered := s.failing
	s.failing = false
	s.mu.Unlock()
	if recovered {
		s.m.log.Info("uap attached again; the server serves", "server", s.spec.Server, "slot", slot)
		s.delegate.Failing(nil)
	}
}

// reap waits for the slot's process, tells the delegate, and reports how it
// ended and whether it was healthy: it lived stableUptime or served calls.
// The caller takes the process off the slot and then out of the live count
// (s.live.Done), so Stop never sees a reaped process on a slot.
func (s *Server) reap(sl *slot) (proc *os.Process, exitErr error, healthy bool) {
	s.mu.Lock()
	proc = sl.proc
	s.mu.Unlock()
	state, err := proc.Wait()
	served := s.delegate.Slot(sl.index).Served // before Exited clears it
	s.usage.forget(proc.Pid)
	if err != nil {
		exitErr = err
	} else if !state.Success() {
		exitErr = errors.New(state.String())
	}
	s.running.Add(-1)
	s.delegate.Exited(sl.index, proc.Pid, exitErr)
	s.mu.Lock()
	healthy = served > 0 || time.Since(sl.started) >= stableUptime
	early := !sl.attached && !s.stopping && !sl.stopAsked
	failNow := false
	if early {
		s.earlyDeaths++
		if s.earlyDeaths >= failingAfter && !s.failing {
			s.failing, failNow = true, true
		}
	}
	s.mu.Unlock()
	if failNow {
		why := exitErr
		if why == nil {
			why = errors.New("exited before attaching to its queue")
		}
		s.m.log.Error("uap processes die before they attach; the server cannot serve", "server", s.spec.Server,
			"module", s.spec.Module, "deaths", failingAfter, "last", why.Error())
		s.delegate.Failing(fmt.Errorf("%d processes of %s (%s) in a row ended before they attached, the last: %w",
			failingAfter, s.spec.Server, s.spec.Module, why))
	}
	return proc, exitErr, healthy
}

// watch waits for the process in sl and, while sl is resident and the
// server runs, starts it again after a back-off. A non-resident process is
// not replaced: the scaler starts another when the rule wants one. A slot
// can change kind while its process runs (SetParallelCount): what it is
// when the process ends decides.
func (s *Server) watch(sl *slot) {
	backoff := minBackoff
	for {
		proc, exitErr, healthy := s.reap(sl)
		s.mu.Lock()
		sl.proc = nil
		if !sl.resident || s.stopping {
			s.ended(sl, proc, exitErr, healthy) // unlocks
			return
		}
		sl.state = StateRestarting
		replaced := sl.replacing == proc
		sl.replacing = nil
		if replaced {
			sl.replaced++
		} else {
			sl.restarts++
		}
		s.mu.Unlock()
		s.live.Done()
		if healthy || replaced {
			backoff = minBackoff
		}
		if replaced {
			s.m.log.Info("uap replaced at the operator's request", "server", s.spec.Server, "slot", sl.index,
				"pid", proc.Pid, "status", fmt.Sprint(exitErr))
		} else {
			s.m.log.Warn("uap terminated; restarting", "server", s.spec.Server, "slot", sl.index,
				"pid", proc.Pid, "status", fmt.Sprint(exitErr), "after", backoff)
		}
		if !s.restart(sl, &backoff) {
			return
		}
	}
}

// restart starts sl's process again after backoff, and again with longer
// back-offs while starts fail. It reports false when the slot is not to be
// restarted any more: the server stops, or the slot stopped being resident.
func (s *Server) restart(sl *slot, backoff *time.Duration) bool {
	for {
		if !s.sleep(*backoff) {
			return false
		}
		*backoff = min(*backoff*2, maxBackoff)
		err := s.spawn(sl, true)
		if err == nil {
			return true
		}
		if errors.Is(err, errStopping) || errors.Is(err, errNotResident) {
			return false
		}
		s.m.log.Error("uap restart failed", "server", s.spec.Server, "slot", sl.index, "err", err)
		s.startFailed(err)
	}
}

// startFailed counts a start that failed outright (the module vanished, a
// credential refused) as a death before attaching.
func (s *Server) startFailed(err error) {
	s.mu.Lock()
	s.earlyDeaths++
	failNow := s.earlyDeaths >= failingAfter && !s.failing && !s.stopping
	if failNow {
		s.failing = true
	}
	s.mu.Unlock()
	if failNow {
		s.delegate.Failing(err)
	}
}

// ended settles a slot whose process ended and is not replaced: it was
// non-resident (or stopped being resident), or the server stops. Called with
// mu held; it unlocks. A non-resident crash delays the server's next
// non-resident start with the same back-off as a resident restart, so a
// UAP that dies at once cannot be started in a tight loop.
func (s *Server) ended(sl *slot, proc *os.Process, exitErr error, healthy bool) {
	asked, resident := sl.stopAsked, sl.resident
	sl.state, sl.watched = StateStopped, false
	crashed := !resident && exitErr != nil && !asked && !s.stopping
	if crashed {
		sl.restarts++
		if healthy {
			s.crashBackoff = 0
		}
		s.crashBackoff = min(max(s.crashBackoff*2, minBackoff), maxBackoff)
		s.crashUntil = time.Now().Add(s.crashBackoff)
	} else if exitErr == nil && !resident {
		s.crashBackoff = 0
	}
	s.mu.Unlock()
	s.live.Done()
	if crashed {
		s.m.log.Warn("non-resident uap terminated", "server", s.spec.Server, "slot", sl.index,
			"pid", proc.Pid, "status", fmt.Sprint(exitErr))
	}
	if !resident {
		s.m.nonResidentEnded()
	}
}

// sleep waits d unless the server stops first; it reports whether to go on.
func (s *Server) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.stop:
		s.mu.Lock()
		for _, sl := range s.slots {
			if sl.state == StateRestarting {
				sl.state = StateStopped
			}
		}
		s.mu.Unlock()
		return false
	}
}

// Kick tells the scaler that depth requests are waiting, so a non-resident
// process can start at once instead of at the next check. It is cheap
// enough to call after every enqueue: it wakes the scaler only when the
// rule may want a process.
func (s *Server) Kick(depth int) {
	run := int(s.running.Load())
	if run >= int(s.maxProcs.Load()) || depth <= s.spec.BalanceCount*run {
		return
	}
	select {
	case s.m.kick <- struct{}{}:
	default:
	}
}

// Processes lists the server's process slots: the resident ones, and the
// non-resident ones that have a process. CPU time is read after the list
// is made (a syscall per process with the /proc meter, not under the
// server's lock); a process that ended meanwhile shows 0.
func (s *Server) Processes() []ProcInfo {
	out := s.processes()
	for i := range out {
		if out[i].PID > 0 {
			out[i].CPUSeconds = s.usage.read(out[i].PID).OnCPU.Seconds()
		}
	}
	return out
}

func (s *Server) processes() []ProcInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]ProcInfo, 0, len(s.slots))
	for _, sl := range s.slots {
		if !sl.resident && sl.proc == nil {
			continue // a non-resident slot at rest is not a process
		}
		pi := ProcInfo{Slot: sl.index, State: sl.state, Kind: "resident", Restarts: sl.restarts, Replaced: sl.replaced, Started: sl.started}
		if !sl.resident {
			pi.Kind = "nonresident"
		}
		if sl.proc != nil {
			pi.PID = sl.proc.Pid
		}
		out = append(out, pi)
	}
	return out
}

// Running counts processes up or starting, by kind.
func (s *Server) Running() (resident, nonResident int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sl := range s.slots {
		if sl.proc == nil {
			continue
		}
		if sl.resident {
			resident++
		} else {
			nonResident++
		}
	}
	return resident, nonResident
}

// Usage is what the meter measured of the server's processes, those
// running and those that ended.
func (s *Server) Usage() bpf.Usage { return s.usage.total() }

// CPUSample is the CPU guard's last reading of the processes. Reading it
// does not move the guard's window: only the scaler does.
func (s *Server) CPUSample() CPUSample { return s.usage.lastSample() }

// CPUGroup is where the server's processes get their CPU priority.
func (s *Server) CPUGroup() *CPUGroup { return s.cpu }

// killWait bounds how long a stop waits for killed processes to be
// reaped: a process in uninterruptible sleep (a hung NFS read) may take
// longer, and the node's stop must not hang on it.
const killWait = 5 * time.Second

// Stop stops supervising and waits for the processes to exit, which they do
// once the caller has closed their segment. At ctx's end every process in
// the server's cgroups is killed (its process groups where there is no
// cgroup), and Stop waits at most killWait more. Then whatever the
// processes left behind in the cgroups (children in a process group or
// session of their own, daemons) is killed too, and the cgroups are
// removed.
func (s *Server) Stop(ctx context.Context) error {
	s.setStopping()
	s.m.mu.Lock()
	for i, other := range s.m.servers {
		if other == s {
			s.m.servers = append(s.m.servers[:i], s.m.servers[i+1:]...)
			break
		}
	}
	s.m.mu.Unlock()
	done := make(chan struct{})
	go func() { s.live.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		n, kerr := s.killAll()
		err = fmt.Errorf("procmgr: %s: killed %d process(es) that did not exit in time", s.spec.Server, n)
		if kerr != nil {
			err = errors.Join(err, fmt.Errorf("procmgr: %s: kill by %s: %w", s.spec.Server, s.box.c.kill, kerr))
		}
		select {
		case <-done:
		case <-time.After(killWait):
			err = errors.Join(err, fmt.Errorf("procmgr: %s: processes still not reaped %v after SIGKILL: %v",
				s.spec.Server, killWait, s.livePIDs()))
		}
	}
	s.m.vacate()
	if left, _ := s.box.members(); len(left) > 0 {
		n, kerr := s.box.killAll(nil)
		s.m.log.Warn("killed what the server's processes left behind", "server", s.spec.Server, "processes", n, "pids", left)
		if kerr != nil {
			err = errors.Join(err, kerr)
		}
	}
	if rerr := s.box.remove(); rerr != nil {
		err = errors.Join(err, rerr)
	}
	return err
}

// waitLive waits up to d for every process of the server to be reaped.
func (s *Server) waitLive(d time.Duration) bool {
	done := make(chan struct{})
	go func() { s.live.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// livePIDs are the pids of the processes on the server's slots.
func (s *Server) livePIDs() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var pids []int
	for _, sl := range s.slots {
		if sl.proc != nil {
			pids = append(pids, sl.proc.Pid)
		}
	}
	return pids
}

// Stopping tells the server that its processes are about to end on purpose
// (the caller is closing their queue): none is replaced from now on. Stop
// then waits for them.
func (s *Server) Stopping() { s.setStopping() }

func (s *Server) setStopping() {
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	s.stopOnce.Do(func() { close(s.stop) })
}

// Kill ends the process in slot at once, for one that broke the protocol:
// SIGKILL to the process itself and to its process group (its children,
// unless they left it). It is reaped as after a crash (and a resident one
// replaced). What it left outside its group stays in the server's cgroups,
// within its limits, until the server stops.
func (s *Server) Kill(slot int) {
	pid := 0
	s.mu.Lock()
	if slot >= 0 && slot < len(s.slots) && s.slots[slot].proc != nil {
		pid = s.slots[slot].proc.Pid // not reaped yet: the pid is still this process's
	}
	s.mu.Unlock()
	if pid > 0 {
		// The process itself first: one that left its group (setpgid)
		// is not in -pid's.
		_ = syscall.Kill(pid, syscall.SIGKILL)
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
}

// Replace marks the process in slot as one the operator replaces (scdctl
// refresh): the caller asks it to leave, and when it has, a resident slot
// starts a new one at once, logged as a replacement and counted in
// ProcInfo.Replaced, not as a restart after a death.
func (s *Server) Replace(slot int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if slot >= 0 && slot < len(s.slots) {
		s.slots[slot].replacing = s.slots[slot].proc
	}
}

// kill stops the server's starts and kills every process of it.
func (s *Server) kill() int {
	n, _ := s.killAll()
	return n
}

// killAll stops the server's starts and kills every process in its
// cgroups (box.killAll), the ones on its slots by pid and process group
// too.
func (s *Server) killAll() (int, error) {
	s.setStopping()
	s.m.vacate() // no start is under way for the server now: the thread may leave
	return s.box.killAll(s.livePIDs())
}

// Limits are the server's resource limits in force and what they caught.
func (s *Server) Limits() LimitStatus { return s.box.limits() }
