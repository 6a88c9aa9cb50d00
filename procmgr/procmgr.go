// Package procmgr owns the UAP processes of a node: it starts each user
// server's processes from its module, hands them the service group's
// shared-memory segment, notices when one dies and starts a replacement with
// back-off. It decides nothing about routing and knows nothing of the wire;
// the schedule service learns about deaths through Hooks.
//
// Every process is started from one goroutine locked to its OS thread,
// because Pdeathsig fires when the spawning thread exits, not the process.
// Each UAP gets its own process group so a stop can signal the UAP and any
// children it made.
//
// # Usage
//
//	m := procmgr.New(logger)
//	defer m.Close()
//	srv, err := m.Start(procmgr.Spec{Server: "echo", Module: "/usr/bin/uap-echo",
//		Segment: seg.File(), Resident: 2}, hooks)
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
	"syscall"
	"time"
)

// Spec says how to run one user server's processes.
type Spec struct {
	Server   string   // user server name, for logs and the UAP's environment
	Group    string   // service group it serves
	Module   string   // path of the UAP executable
	Args     []string // arguments after the module name
	Env      []string // NAME=value added to the daemon's environment (putenv)
	Segment  *os.File // the schedule queue's memfd, passed as fd 3
	Resident int      // processes started with the server and kept running
}

// Hooks connect a server's processes to the schedule service.
type Hooks struct {
	// Prepare runs before a process is started into control-block slot.
	Prepare func(slot int) error
	// Exited runs after the process in slot has died and been reaped, before
	// any replacement is started into that slot.
	Exited func(slot, pid int, err error)
}

// Restart back-off: a process that dies soon after it started waits longer
// before its replacement, so a UAP that crashes at start-up cannot spin the
// node; one that lived a while is replaced at once.
const (
	minBackoff   = 20 * time.Millisecond
	maxBackoff   = 5 * time.Second
	stableUptime = 10 * time.Second
)

// Manager starts processes for any number of servers.
type Manager struct {
	log    *slog.Logger
	spawns chan spawnReq
	done   chan struct{}
	once   sync.Once
}

type spawnReq struct {
	cmd   *exec.Cmd
	reply chan error
}

// New returns a Manager with its spawning thread running.
func New(log *slog.Logger) *Manager {
	if log == nil {
		log = slog.Default()
	}
	m := &Manager{log: log, spawns: make(chan spawnReq), done: make(chan struct{})}
	go m.spawnLoop()
	return m
}

// spawnLoop starts every process from one locked thread so that Pdeathsig
// refers to a thread that lives as long as the daemon.
func (m *Manager) spawnLoop() {
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

// Close stops the spawning thread. Servers must be stopped first.
func (m *Manager) Close() { m.once.Do(func() { close(m.done) }) }

// ProcState is the life stage of a process slot.
type ProcState string

const (
	StateStarting   ProcState = "starting"
	StateRunning    ProcState = "running"
	StateRestarting ProcState = "restarting" // waiting out the back-off
	StateStopped    ProcState = "stopped"
)

// ProcInfo describes one process slot for status output.
type ProcInfo struct {
	Slot     int       `json:"slot"`
	PID      int       `json:"pid"`
	State    ProcState `json:"state"`
	Kind     string    `json:"kind"` // "resident"
	Restarts int       `json:"restarts"`
	Started  time.Time `json:"started"`
}

// Server is one user server's set of processes.
type Server struct {
	m     *Manager
	spec  Spec
	hooks Hooks

	stop     chan struct{} // closed when the server stops; ends back-off waits
	stopOnce sync.Once

	mu       sync.Mutex
	stopping bool
	slots    []*slot
	wg       sync.WaitGroup // one per live slot goroutine
}

type slot struct {
	index    int
	proc     *os.Process
	state    ProcState
	restarts int
	started  time.Time
}

// Start starts the server's resident processes and supervises them. It
// fails if the first start of any process fails (a missing module, say),
// after killing the ones already started.
func (m *Manager) Start(spec Spec, hooks Hooks) (*Server, error) {
	if spec.Resident < 1 {
		return nil, fmt.Errorf("procmgr: %s: no resident process to start", spec.Server)
	}
	if _, err := os.Stat(spec.Module); err != nil {
		return nil, fmt.Errorf("procmgr: %s: module: %w", spec.Server, err)
	}
	s := &Server{m: m, spec: spec, hooks: hooks, stop: make(chan struct{})}
	for i := range spec.Resident {
		sl := &slot{index: i, state: StateStarting}
		s.slots = append(s.slots, sl)
		if err := s.spawn(sl); err != nil {
			s.kill()
			return nil, err
		}
		s.wg.Add(1)
		go s.supervise(sl)
	}
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
	cmd := exec.Command(s.spec.Module, s.spec.Args...)
	cmd.Env = append(os.Environ(), s.spec.Env...)
	cmd.Env = append(cmd.Env,
		"TPSCHED_SHM_FD=3",
		"TPSCHED_PROC_SLOT="+strconv.Itoa(sl.index),
		"TPSCHED_SERVER="+s.spec.Server,
		"TPSCHED_GROUP="+s.spec.Group,
	)
	cmd.ExtraFiles = []*os.File{s.spec.Segment}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
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
		return fmt.Errorf("procmgr: %s: start %s: %w", s.spec.Server, s.spec.Module, err)
	}
	sl.proc, sl.state, sl.started = cmd.Process, StateRunning, time.Now()
	s.mu.Unlock()
	s.m.log.Debug("uap started", "server", s.spec.Server, "slot", sl.index, "pid", cmd.Process.Pid)
	return nil
}

// supervise waits for the slot's process and replaces it until the server
// stops.
func (s *Server) supervise(sl *slot) {
	defer s.wg.Done()
	backoff := minBackoff
	for {
		s.mu.Lock()
		proc := sl.proc
		s.mu.Unlock()
		state, err := proc.Wait()
		var exitErr error
		if err != nil {
			exitErr = err
		} else if !state.Success() {
			exitErr = errors.New(state.String())
		}
		if s.hooks.Exited != nil {
			s.hooks.Exited(sl.index, proc.Pid, exitErr)
		}
		s.mu.Lock()
		stopping := s.stopping
		uptime := time.Since(sl.started)
		if stopping {
			sl.state, sl.proc = StateStopped, nil
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

// Processes lists the server's process slots.
func (s *Server) Processes() []ProcInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]ProcInfo, 0, len(s.slots))
	for _, sl := range s.slots {
		pi := ProcInfo{Slot: sl.index, State: sl.state, Kind: "resident", Restarts: sl.restarts, Started: sl.started}
		if sl.proc != nil && sl.state == StateRunning {
			pi.PID = sl.proc.Pid
		}
		out = append(out, pi)
	}
	return out
}

// Running counts processes that are up.
func (s *Server) Running() int {
	n := 0
	for _, p := range s.Processes() {
		if p.State == StateRunning {
			n++
		}
	}
	return n
}

// Stop stops supervising and waits for the processes to exit, which they do
// once the caller has closed their segment. At ctx's end the remaining
// process groups are killed.
func (s *Server) Stop(ctx context.Context) error {
	s.setStopping()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	n := s.kill()
	<-done
	return fmt.Errorf("procmgr: %s: killed %d process(es) that did not exit in time", s.spec.Server, n)
}

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
		if sl.proc != nil && sl.state == StateRunning {
			pids = append(pids, sl.proc.Pid)
		}
	}
	s.mu.Unlock()
	for _, pid := range pids {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	return len(pids)
}
