package procmgr

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"tpsched/bpf"
	"tpsched/internal/ratelog"
)

// This file is one user server's processes (Server): its slots, their
// start, supervision and restart, and their end.

// ProcState is the life stage of a process slot.
type ProcState string

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
	// reporting orders the delegate's Failing calls (reportFailing).
	reporting sync.Mutex
	// live counts processes started and not yet reaped: Add under mu
	// together with the stopping check, Done after Exited. So Stop, which
	// sets stopping first, returns only when no process of the server is
	// left and no start can follow.
	live sync.WaitGroup

	// reapGate orders signals by pid against reaping: killers hold it for
	// reading while they signal the processes on the slots, and reap
	// holds it to reap one (a process that has exited already, so never
	// for long). While a killer holds it, a process on a slot is not
	// reaped, so its pid, and the process group it leads, cannot be a
	// new process's: a kill by number reaches no stranger.
	reapGate sync.RWMutex

	restartLog ratelog.Limiter // "uap terminated; restarting", at most once a restartLogEvery
}

// restartLogEvery bounds a server's restart warnings: a UAP that dies after
// every call it serves is restarted at once each time (it is healthy), and
// a line per restart would flood the log. The restarts are all counted
// (the status's restarts, the metrics); the log keeps one line a second
// and says how many it left out.
const restartLogEvery = time.Second

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
	if err := checkDir(spec.Dir); err != nil {
		return nil, fmt.Errorf("procmgr: %s: %w", spec.Server, err)
	}
	var cpu *CPUGroup
	var err error
	if spec.SharedCPU && m.cpuShareable() {
		cpu, err = m.cpu.NewSharedGroup(spec.Server)
	} else {
		cpu, err = m.cpu.NewGroup(spec.Server, spec.Priority)
	}
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
		output: newOutputBook(m.opts.OutputRate, m.opts.OutputBurst), resident: spec.Resident,
		restartLog: ratelog.Limiter{Every: restartLogEvery}}
	s.maxProcs.Store(int32(spec.Max))
	s.residents.Store(int32(spec.Resident))
	for i := range spec.Max {
		s.slots = append(s.slots, &slot{index: i, resident: i < spec.Resident, state: StateStopped, watched: i < spec.Resident})
	}
	for _, sl := range s.slots[:spec.Resident] {
		if err := s.spawn(sl, false); err != nil {
			s.kill()
			s.waitLive(KillWait)
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

// Attached says that the process in slot, pid (0: whichever runs there),
// attached to its queue: it is running, and the server is not failing. A
// pid that is no longer the slot's (it died and another started since the
// caller looked) says nothing of the new one.
func (s *Server) Attached(slot, pid int) {
	s.mu.Lock()
	if slot < 0 || slot >= len(s.slots) || s.slots[slot].proc == nil || pid != 0 && s.slots[slot].proc.Pid != pid {
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
		s.reportFailing(nil)
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
	waitExited(proc.Pid) // not reaped: see reapGate
	// Read for the last time before the reap: until then /proc/<pid> is
	// the zombie's, with all it used, and the pid no other process's.
	s.usage.forget(proc.Pid)
	s.reapGate.Lock()
	state, err := proc.Wait() // lockcheck: it has exited (waitExited): this only reaps
	s.reapGate.Unlock()
	served := s.delegate.Slot(sl.index).Served // before Exited clears it
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
		failNow = s.startsFailingLocked()
	}
	s.mu.Unlock()
	if failNow {
		why := exitErr
		if why == nil {
			why = errors.New("exited before attaching to its queue")
		}
		s.m.log.Error("uap processes die before they attach; the server cannot serve", "server", s.spec.Server,
			"module", s.spec.Module, "deaths", failingAfter, "last", why.Error())
		s.reportFailing(fmt.Errorf("%d processes of %s (%s) in a row ended before they attached, the last: %w",
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
			s.ended(sl, proc, exitErr, healthy) // lockcheck: ended unlocks mu before it logs
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
		} else if n, ok := s.restartLog.Allow(); ok {
			args := []any{"server", s.spec.Server, "slot", sl.index, "pid", proc.Pid, "status", fmt.Sprint(exitErr), "after", backoff}
			if n > 1 {
				args = append(args, "not_logged_since_last", n-1)
			}
			s.m.log.Warn("uap terminated; restarting", args...)
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
	failNow := !s.stopping && s.startsFailingLocked()
	s.mu.Unlock()
	if failNow {
		s.reportFailing(err)
	}
}

// reportFailing tells the delegate that the server fails (err) or serves
// again (nil), unless the state moved on since the caller decided: a death
// and an attach, on two goroutines, decide under mu and report after it,
// and a report that overtook the other left the group refusing every call
// while a process served (or the other way round). Reports are made one at
// a time, and a stale one is dropped.
func (s *Server) reportFailing(err error) {
	s.reporting.Lock()
	defer s.reporting.Unlock()
	s.mu.Lock()
	failing := s.failing
	s.mu.Unlock()
	if failing != (err != nil) {
		return
	}
	s.delegate.Failing(err)
}

// startsFailingLocked reports, once, that the server has just become
// failing: failingAfter starts in a row ended before attaching, and no
// process of the server serves. While one serves, the server's calls go to
// it: a slot that cannot be refilled (no descriptors, a module being
// replaced) is no reason to refuse them all. Called with mu held.
func (s *Server) startsFailingLocked() bool {
	if s.failing || s.earlyDeaths < failingAfter {
		return false
	}
	for _, o := range s.slots {
		if o.proc != nil && o.attached {
			return false
		}
	}
	s.failing = true
	return true
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

// KillWait bounds how long a stop waits for killed processes to be
// reaped: a process in uninterruptible sleep (a hung NFS read) may take
// longer, and the node's stop must not hang on it.
const KillWait = 5 * time.Second

// Stop stops supervising and waits for the processes to exit, which they do
// once the caller has closed their segment. At ctx's end every process in
// the server's cgroups is killed (its process groups where there is no
// cgroup), and Stop waits at most KillWait more. Then whatever the
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
		case <-time.After(KillWait):
			err = errors.Join(err, fmt.Errorf("procmgr: %s: processes still not reaped %v after SIGKILL: %v",
				s.spec.Server, KillWait, s.livePIDs()))
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

// Kill ends the process in slot, pid (0: whichever runs there), at once,
// for one that broke the protocol: SIGKILL to the process itself and to
// its process group (its children, unless they left it). It is reaped as
// after a crash (and a resident one replaced). What it left outside its
// group stays in the server's cgroups, within its limits, until the server
// stops. A pid that is no longer the slot's is not killed: the caller
// decided on the process it saw, which has since died and may have been
// replaced by an innocent one.
func (s *Server) Kill(slot, pid int) {
	s.reapGate.RLock()
	defer s.reapGate.RUnlock()
	s.mu.Lock()
	var proc *os.Process
	if slot >= 0 && slot < len(s.slots) {
		proc = s.slots[slot].proc
	}
	if proc != nil && pid != 0 && proc.Pid != pid {
		proc = nil
	}
	s.mu.Unlock()
	if proc != nil {
		if f := beforeKill.Load(); f != nil {
			(*f)(proc.Pid)
		}
		killProcAndGroup(proc)
	}
}

// beforeKill, when set by a test, runs in Kill between taking the slot's
// process and signalling it: the window in which it must not be reaped.
var beforeKill atomic.Pointer[func(pid int)]

// killProcAndGroup sends SIGKILL to proc, through its pidfd (Go's
// os.Process holds one on Linux 5.4+), then to the process group it leads.
// The caller holds the server's reapGate for reading: proc is not reaped
// while it does, so the group's number is still proc's. A proc reaped
// before (Signal says os.ErrProcessDone) gets nothing.
func killProcAndGroup(proc *os.Process) {
	// The process itself first: one that left its group (setpgid) is not
	// in -pid's.
	if err := proc.Signal(syscall.SIGKILL); errors.Is(err, os.ErrProcessDone) {
		return
	}
	_ = syscall.Kill(-proc.Pid, syscall.SIGKILL)
}

// killKnown kills each process on the server's slots and its process
// group (killProcAndGroup) and returns how many there were.
func (s *Server) killKnown() int {
	s.reapGate.RLock()
	defer s.reapGate.RUnlock()
	s.mu.Lock()
	var procs []*os.Process
	for _, sl := range s.slots {
		if sl.proc != nil {
			procs = append(procs, sl.proc)
		}
	}
	s.mu.Unlock()
	for _, p := range procs {
		killProcAndGroup(p)
	}
	return len(procs)
}

// waitExited waits until pid, a child of this process, has exited,
// without reaping it (WNOWAIT), so that its pid stays its own.
func waitExited(pid int) {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			return // exited, or not ours to wait for (proc.Wait says why)
		}
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
	return s.box.killAll(s.killKnown)
}

// Limits are the server's resource limits in force and what they caught.
func (s *Server) Limits() LimitStatus { return s.box.limits() }

const (
	StateStarting   ProcState = "starting" // started, not yet attached to its queue
	StateRunning    ProcState = "running"
	StateStopping   ProcState = "stopping"   // asked to stop after the request in hand
	StateRestarting ProcState = "restarting" // waiting out the back-off
	StateStopped    ProcState = "stopped"    // no process (a non-resident slot at rest)
)
