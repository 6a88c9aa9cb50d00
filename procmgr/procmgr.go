// Package procmgr owns the UAP processes of a node: it starts each user
// server's resident processes from its module, starts and stops
// non-resident ones by the Multiserver rule (scale.go), puts every process
// under its server's CPU priority (cgroup.go), gates non-resident starts on
// free memory, notices when a process dies and replaces resident ones with
// back-off. It decides nothing about routing and knows nothing of the wire
// or of shared memory: the schedule service connects it through Hooks.
//
// Every process is started from one goroutine locked to its OS thread,
// because Pdeathsig fires when the spawning thread exits, not the process.
// Each UAP gets its own process group so a stop can signal the UAP and any
// children it made.
//
// # Usage
//
//	m := procmgr.New(procmgr.Options{Logger: log, NodeCap: 64})
//	defer m.Close()
//	srv, err := m.Start(procmgr.Spec{Server: "echo", Module: "/usr/bin/uap-echo",
//		Segment: seg.File(), Resident: 2, Max: 8, BalanceCount: 3}, hooks)
//	srv.Kick(depth) // after an enqueue: wakes the scaler if the rule may want a process
//	...
//	srv.Stop(ctx) // after the segment was closed: waits, then kills
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
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"tpsched/bpf"
)

// Spec says how to run one user server's processes.
type Spec struct {
	Server       string        // user server name, for logs and the UAP's environment
	Group        string        // service group it serves
	Module       string        // path of the UAP executable
	Args         []string      // arguments after the module name
	Env          []string      // NAME=value added to the daemon's environment (putenv)
	Segment      *os.File      // the schedule queue, passed as fd 3 (see Hooks.File)
	Resident     int           // processes started with the server and kept running
	Max          int           // most processes, resident ones included; < Resident means Resident
	BalanceCount int           // balance_count of the Multiserver rule
	Priority     int           // schedule_priority 1 (highest) .. 16; 0 = 8
	Refresh      bool          // scd_refresh_process: each process serves one request
	IdleStop     time.Duration // how long a non-resident process idles before it may stop
	CPUWaitLimit int           // cpu_wait_limit percent: the CPU guard (see CPUBound); 0 = off
}

// SlotView is what the schedule queue says about a process slot.
type SlotView struct {
	Busy   bool   // serving a request
	Ready  bool   // attached to the queue (idle or busy)
	Served uint64 // requests it completed
}

// Hooks connect a server's processes to the schedule service.
type Hooks struct {
	// Prepare runs before a process is started into control-block slot.
	Prepare func(slot int) error
	// Exited runs after the process in slot has died and been reaped,
	// before any replacement is started into that slot.
	Exited func(slot, pid int, err error)
	// File, if set, gives the file to pass as fd 3, asked after Prepare
	// (a socket-receiving server gets a fresh socket per process).
	File func() *os.File
	// QueueDepth, Slot and RequestStop let the scaler see the queue and
	// stop a non-resident process after the request in its hands. Without
	// them no non-resident process is started.
	QueueDepth  func() int
	Slot        func(slot int) SlotView
	RequestStop func(slot int)
}

// Restart back-off: a process that dies soon after it started waits longer
// before its replacement, so a UAP that crashes at start-up cannot spin the
// node; one that lived a while is replaced at once.
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
func (m *Manager) spawnLoop() {
	defer m.wg.Done()
	runtime.LockOSThread()
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
	Kind     string    `json:"kind"` // "resident" or "nonresident"
	Restarts int       `json:"restarts"`
	Started  time.Time `json:"started"`
}

// Server is one user server's set of processes.
type Server struct {
	m     *Manager
	spec  Spec
	hooks Hooks
	cpu   *CPUGroup

	stop     chan struct{} // closed when the server stops; ends back-off waits
	stopOnce sync.Once
	running  atomic.Int32 // processes up or starting, for Kick's cheap test
	usage    *usageBook

	mu           sync.Mutex
	stopping     bool
	slots        []*slot
	crashBackoff time.Duration // non-resident crash loop: wait this long before the next start
	crashUntil   time.Time
	lastStart    time.Time      // of the last non-resident process, for the CPU guard
	wg           sync.WaitGroup // one per live process watcher
}

type slot struct {
	index     int
	resident  bool
	proc      *os.Process
	state     ProcState
	restarts  int
	started   time.Time
	stopAsked bool
	// idle tracking for non-resident processes
	lastServed uint64
	idleSince  time.Time
}

// Start starts the server's resident processes and supervises them. It
// fails if the first start of any process fails (a missing module, say),
// after killing the ones already started.
func (m *Manager) Start(spec Spec, hooks Hooks) (*Server, error) {
	spec.Max = max(spec.Max, spec.Resident)
	if spec.Max < 1 {
		return nil, fmt.Errorf("procmgr: %s: parallel_count allows no process", spec.Server)
	}
	if _, err := os.Stat(spec.Module); err != nil {
		return nil, fmt.Errorf("procmgr: %s: module: %w", spec.Server, err)
	}
	cpu, err := m.cpu.NewGroup(spec.Server, spec.Priority)
	if err != nil {
		return nil, fmt.Errorf("procmgr: %s: %w", spec.Server, err)
	}
	s := &Server{m: m, spec: spec, hooks: hooks, cpu: cpu, stop: make(chan struct{}), usage: newUsageBook(m.opts.Meter)}
	for i := range spec.Max {
		s.slots = append(s.slots, &slot{index: i, resident: i < spec.Resident, state: StateStopped})
	}
	for _, sl := range s.slots[:spec.Resident] {
		if err := s.spawn(sl); err != nil {
			s.kill()
			s.wg.Wait()
			_ = cpu.Remove()
			return nil, err
		}
		s.wg.Add(1)
		go s.supervise(sl)
	}
	m.mu.Lock()
	m.servers = append(m.servers, s)
	m.mu.Unlock()
	return s, nil
}

// errStopping keeps a replacement from starting once Stop has begun.
var errStopping = errors.New("procmgr: server stopping")

func (s *Server) spawn(sl *slot) error {
	if s.hooks.Prepare != nil {
		if err := s.hooks.Prepare(sl.index); err != nil {
			return fmt.Errorf("procmgr: %s: prepare slot %d: %w", s.spec.Server, sl.index, err)
		}
	}
	file := s.spec.Segment
	if s.hooks.File != nil {
		file = s.hooks.File()
	}
	for try := 0; ; try++ {
		cmd := exec.Command(s.spec.Module, s.spec.Args...)
		cmd.Env = append(os.Environ(), s.spec.Env...)
		cmd.Env = append(cmd.Env,
			"TPSCHED_SHM_FD=3",
			"TPSCHED_PROC_SLOT="+strconv.Itoa(sl.index),
			"TPSCHED_SERVER="+s.spec.Server,
			"TPSCHED_GROUP="+s.spec.Group,
		)
		if s.spec.Refresh {
			cmd.Env = append(cmd.Env, "TPSCHED_REFRESH=1")
		}
		cmd.ExtraFiles = []*os.File{file}
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
		cmd.SysProcAttr = attr
		after, err := s.cpu.Prepare(attr)
		if err != nil {
			return fmt.Errorf("procmgr: %s: %w", s.spec.Server, err)
		}
		// Start under mu so that kill, which sets stopping under mu, either
		// sees this process or keeps it from starting.
		s.mu.Lock()
		if s.stopping {
			sl.state = StateStopped
			s.mu.Unlock()
			return errStopping
		}
		if err := s.m.start(cmd); err != nil {
			s.mu.Unlock()
			if try == 0 && s.cpu.StartFailed(attr, err) {
				continue // clone into the cgroup refused: place by cgroup.procs
			}
			return fmt.Errorf("procmgr: %s: start %s: %w", s.spec.Server, s.spec.Module, err)
		}
		sl.proc, sl.state, sl.started, sl.stopAsked = cmd.Process, StateStarting, time.Now(), false
		if s.hooks.Slot == nil {
			sl.state = StateRunning // nobody to tell us when it attached
		}
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

// reap waits for the slot's process, tells the hooks, and reports how it
// ended.
func (s *Server) reap(sl *slot) (proc *os.Process, exitErr error, uptime time.Duration) {
	s.mu.Lock()
	proc = sl.proc
	s.mu.Unlock()
	state, err := proc.Wait()
	s.usage.forget(proc.Pid)
	if err != nil {
		exitErr = err
	} else if !state.Success() {
		exitErr = errors.New(state.String())
	}
	s.running.Add(-1)
	if s.hooks.Exited != nil {
		s.hooks.Exited(sl.index, proc.Pid, exitErr)
	}
	s.mu.Lock()
	uptime = time.Since(sl.started)
	s.mu.Unlock()
	return proc, exitErr, uptime
}

// supervise waits for a resident slot's process and replaces it until the
// server stops.
func (s *Server) supervise(sl *slot) {
	defer s.wg.Done()
	backoff := minBackoff
	for {
		proc, exitErr, uptime := s.reap(sl)
		s.mu.Lock()
		stopping := s.stopping
		sl.proc = nil
		if stopping {
			sl.state = StateStopped
		} else {
			sl.state = StateRestarting
			sl.restarts++
		}
		s.mu.Unlock()
		if stopping {
			return
		}
		if uptime >= stableUptime {
			backoff = minBackoff
		}
		s.m.log.Warn("uap terminated; restarting", "server", s.spec.Server, "slot", sl.index,
			"pid", proc.Pid, "status", fmt.Sprint(exitErr), "after", backoff)
		if !s.sleep(backoff) {
			return
		}
		backoff = min(backoff*2, maxBackoff)
		for {
			err := s.spawn(sl)
			if err == nil {
				break
			}
			if errors.Is(err, errStopping) {
				return
			}
			s.m.log.Error("uap restart failed", "server", s.spec.Server, "slot", sl.index, "err", err)
			if !s.sleep(backoff) {
				return
			}
			backoff = min(backoff*2, maxBackoff)
		}
	}
}

// watchNonResident waits for a non-resident process. It is not replaced:
// the scaler starts another when the rule wants one. A crash delays the
// server's next non-resident start with the same back-off as a resident
// restart, so a UAP that dies at once cannot be started in a tight loop.
func (s *Server) watchNonResident(sl *slot) {
	defer s.wg.Done()
	proc, exitErr, uptime := s.reap(sl)
	s.mu.Lock()
	asked := sl.stopAsked
	sl.state, sl.proc = StateStopped, nil
	crashed := exitErr != nil && !asked && !s.stopping
	if crashed {
		sl.restarts++
		if uptime >= stableUptime {
			s.crashBackoff = 0
		}
		s.crashBackoff = min(max(s.crashBackoff*2, minBackoff), maxBackoff)
		s.crashUntil = time.Now().Add(s.crashBackoff)
	} else if exitErr == nil {
		s.crashBackoff = 0
	}
	s.mu.Unlock()
	if crashed {
		s.m.log.Warn("non-resident uap terminated", "server", s.spec.Server, "slot", sl.index,
			"pid", proc.Pid, "status", fmt.Sprint(exitErr))
	}
	s.m.nonResidentEnded()
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
	if run >= s.spec.Max || depth <= s.spec.BalanceCount*run {
		return
	}
	select {
	case s.m.kick <- struct{}{}:
	default:
	}
}

// Processes lists the server's process slots.
func (s *Server) Processes() []ProcInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]ProcInfo, 0, len(s.slots))
	for _, sl := range s.slots {
		if !sl.resident && sl.proc == nil {
			continue // a non-resident slot at rest is not a process
		}
		pi := ProcInfo{Slot: sl.index, State: sl.state, Kind: "resident", Restarts: sl.restarts, Started: sl.started}
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
	go func() { s.wg.Wait(); close(done) }()
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
