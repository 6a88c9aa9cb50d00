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
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
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
	// SharedCPU: the processes share scdd's own cpu cgroup until a weight
	// is set (CPUControl.NewSharedGroup), where the host allows it
	// (cgroup v1, Manager.cpuShareable); Priority is then the default's.
	SharedCPU bool
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
	// the process, after the slot's last Exited, with one exception: a
	// server stopped while a process it killed was not reaped (Stop
	// returns at its bound) and started again prepares the slot before
	// the old process's Exited, which may then come at any time, even
	// before the new process's Started. The files stay the delegate's:
	// procmgr never closes them.
	Prepare(slot int) ([]*os.File, error)
	// Started runs once the process prepared for slot has started, with
	// its pid as the node sees it (what a process says of itself is not
	// trusted, and in its own pid namespace it is another number). It
	// comes before the process's Exited, and may come after it attached.
	Started(slot, pid int)
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
	// CheckInterval is how often the scaler looks without being kicked
	// while calls wait or non-resident processes run (a quiet node's
	// scaler looks once a second); default 50 ms. Stops happen on these
	// checks.
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
	// selfPID replaces the daemon's pid as the process whose v2 cgroup
	// may be delegated (delegate.go): tests show it a child of theirs in
	// a cgroup they made.
	selfPID int
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
	self := os.Getpid()
	if opts.selfPID != 0 {
		self = opts.selfPID
	}
	deleg, why := delegatedV2(mi, self)
	m := &Manager{
		log: opts.Logger, opts: opts,
		cpu:    detectIn(mi, opts.CPUParent, deleg),
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
	if deleg != nil {
		m.log.Info("uap cgroups on cgroup v2 go under scdd's delegated cgroup", "cgroup", deleg.dir,
			"scdd", filepath.Join(deleg.dir, daemonLeaf), "moved", deleg.moved)
	} else {
		m.log.Info("uap cgroups go at each cgroup hierarchy's top", "reason", why)
	}
	m.log.Info("uap cpu priority", "mechanism", m.cpu.Mechanism(), "reason", m.cpu.Reason())
	cs := m.contain.Status()
	m.log.Info("uap containment", "kill", cs.Kill, "pids_limit", cs.Pids, "memory_limit", cs.Memory, "reason", cs.KillReason)
	if cs.Kill == KillPgroup {
		// Short: the reason is in "uap containment" just above and in
		// status; the warning must read in one line (make demo).
		m.log.Warn("uap processes are killed by process group: no writable cgroup, so no pids or memory limit, " +
			"and a process that leaves its group outlives a stop (docs/WARNINGS.md#killed-by-process-group)")
	}
	var stale []string
	for _, p := range m.contain.parents() {
		stale = append(stale, staleDaemonGroups(p)...)
	}
	if removed, killed, err := removeStaleGroups(stale); len(removed) > 0 || killed > 0 || err != nil {
		m.log.Info("killed the processes of daemons that died without cleaning up and removed their cgroups",
			"killed", killed, "cgroups", removed)
		if err != nil {
			m.log.Warn("cgroups of dead daemons left", "err", err)
		}
	}
	started := make(chan struct{})
	m.wg.Add(2)
	go m.spawnLoop(started)
	go m.scaleLoop()
	<-started // homes and nnpErr are set
	return m
}

// CPU is how this node enforces CPU priority.
func (m *Manager) CPU() *CPUControl { return m.cpu }

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
