// Package procmgr owns the UAP processes of a node: it starts each user
// server's resident processes from its module, starts and stops
// non-resident ones by the Multiserver rule (scale.go), puts every process
// under its server's CPU priority (cgroup.go), gates non-resident starts on
// free memory, notices when a process dies and replaces resident ones with
// back-off. It decides nothing about routing and knows nothing of the wire
// or of shared memory: the schedule service connects it through a Delegate.
//
// Every process is started from one goroutine locked to its OS thread,
// because Pdeathsig fires when the spawning thread exits, not the process.
// Each UAP gets its own process group so a stop can signal the UAP and any
// children it made, runs as the user and group its Spec names (never as
// root unless told), and sees a small environment (see Env).
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
	"runtime"
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
}

// Manager starts processes for any number of servers.
type Manager struct {
	log    *slog.Logger
	opts   Options
	cpu    *CPUControl
	spawns chan spawnReq
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
	cmd   *exec.Cmd
	reply chan error
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
	m := &Manager{
		log: opts.Logger, opts: opts,
		cpu:    DetectCPUControl(opts.CPUParent),
		spawns: make(chan spawnReq),
		kick:   make(chan struct{}, 1),
		done:   make(chan struct{}),
	}
	m.log.Info("uap cpu priority", "mechanism", m.cpu.Mechanism(), "reason", m.cpu.Reason())
	if stale := m.cpu.removeStaleDaemonGroups(); len(stale) > 0 {
		m.log.Info("removed cgroups of daemons that died without cleaning up", "cgroups", stale)
	}
	m.wg.Add(2)
	go m.spawnLoop()
	go m.scaleLoop()
	return m
}

// CPU is how this node enforces CPU priority.
func (m *Manager) CPU() *CPUControl { return m.cpu }

// spawnLoop starts every process from one locked thread so that Pdeathsig
// refers to a thread that lives as long as the daemon.
//
// The thread's scheduling policy is what every process starts with (a
// child inherits its parent thread's), so SchedBatch is set here, once,
// and no process runs a moment under another policy.
func (m *Manager) spawnLoop() {
	defer m.wg.Done()
	runtime.LockOSThread()
	if m.opts.SchedBatch {
		if err := unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_BATCH}, 0); err != nil {
			m.log.Warn("uap_sched_batch: processes start under the default policy", "err", err)
		}
	}
	for {
		select {
		case r := <-m.spawns:
			r.reply <- r.cmd.Start()
		case <-m.done:
			return
		}
	}
}

func (m *Manager) start(cmd *exec.Cmd) error {
	r := spawnReq{cmd: cmd, reply: make(chan error, 1)}
	select {
	case m.spawns <- r:
		return <-r.reply
	case <-m.done:
		return errors.New("procmgr: manager closed")
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
	s := &Server{m: m, spec: spec, delegate: d, cpu: cpu, stop: make(chan struct{}), usage: newUsageBook(m.opts.Meter),
		resident: spec.Resident}
	s.maxProcs.Store(int32(spec.Max))
	s.residents.Store(int32(spec.Resident))
	for i := range spec.Max {
		s.slots = append(s.slots, &slot{index: i, resident: i < spec.Resident, state: StateStopped, watched: i < spec.Resident})
	}
	for _, sl := range s.slots[:spec.Resident] {
		if err := s.spawn(sl, false); err != nil {
			s.kill()
			s.live.Wait()
			_ = cpu.Remove()
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
	for try := 0; ; try++ {
		cmd := exec.Command(s.spec.Module, s.spec.Args...)
		cmd.Env = s.env(sl.index)
		cmd.ExtraFiles = files
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
		if s.spec.UID >= 0 || s.spec.GID >= 0 {
			attr.Credential = s.credential()
		}
		cmd.SysProcAttr = attr
		after, err := s.cpu.Prepare(attr)
		if err != nil {
			return fmt.Errorf("procmgr: %s: %w", s.spec.Server, err)
		}
		// Start under mu so that kill, which sets stopping under mu, either
		// sees this process or keeps it from starting.
		s.mu.Lock()
		if s.stopping {
			sl.state, sl.watched = StateStopped, false
			s.mu.Unlock()
			return errStopping
		}
		if residentOnly && !sl.resident {
			sl.state, sl.watched = StateStopped, false
			s.mu.Unlock()
			return errNotResident
		}
		if err := s.m.start(cmd); err != nil {
			s.mu.Unlock()
			if try == 0 && s.cpu.StartFailed(attr, err) {
				continue // clone into the cgroup refused: place by cgroup.procs
			}
			return fmt.Errorf("procmgr: %s: start %s: %w", s.spec.Server, s.spec.Module, err)
		}
		s.live.Add(1)
		if f := afterStart.Load(); f != nil {
			(*f)()
		}
		sl.proc, sl.state, sl.started, sl.stopAsked, sl.attached = cmd.Process, StateStarting, time.Now(), false, false
		sl.lastServed, sl.idleSince = 0, time.Time{}
		s.running.Add(1)
		s.mu.Unlock()
		if err := after(cmd.Process.Pid); err != nil {
			s.m.log.Warn("uap cpu priority not applied", "server", s.spec.Server, "pid", cmd.Process.Pid, "err", err)
		}
		if err := s.usage.track(cmd.Process.Pid); err != nil {
			s.m.log.Warn("uap not measured", "server", s.spec.Server, "pid", cmd.Process.Pid, "err", err)
		}
		s.m.log.Debug("uap started", "server", s.spec.Server, "slot", sl.index, "pid", cmd.Process.Pid,
			"resident", sl.resident)
		return nil
	}
}

func (s *Server) credential() *syscall.Credential {
	c := &syscall.Credential{Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid()), NoSetGroups: false}
	if s.spec.UID >= 0 {
		c.Uid = uint32(s.spec.UID)
	}
	if s.spec.GID >= 0 {
		c.Gid = uint32(s.spec.GID)
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

// Stop stops supervising and waits for the processes to exit, which they do
// once the caller has closed their segment. At ctx's end the remaining
// process groups are killed. The server's cgroup is removed.
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
		n := s.kill()
		<-done
		err = fmt.Errorf("procmgr: %s: killed %d process(es) that did not exit in time", s.spec.Server, n)
	}
	if rerr := s.cpu.Remove(); rerr != nil {
		err = errors.Join(err, rerr)
	}
	return err
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

// Kill ends the process in slot at once (SIGKILL to its process group),
// for one that broke the protocol. It is reaped as after a crash (and a
// resident one replaced).
func (s *Server) Kill(slot int) {
	pid := 0
	s.mu.Lock()
	if slot >= 0 && slot < len(s.slots) && s.slots[slot].proc != nil {
		pid = s.slots[slot].proc.Pid // not reaped yet: the pid is still this process's
	}
	s.mu.Unlock()
	if pid > 0 {
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

// kill sends SIGKILL to every live process group of the server.
func (s *Server) kill() int {
	s.setStopping()
	s.mu.Lock()
	var pids []int
	for _, sl := range s.slots {
		if sl.proc != nil {
			pids = append(pids, sl.proc.Pid)
		}
	}
	s.mu.Unlock()
	for _, pid := range pids {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	return len(pids)
}
