package local

import (
	"context"

	"tpsched/bpf"
	"tpsched/procmgr"
)

// ProcessManager starts every user server's UAP processes: procmgr in
// scdd (Procmgr). A node's tests give it in-process UAPs instead, so the
// whole call path runs without root and without processes. The contract is
// procmgr's: it calls a group's procmgr.Delegate from its own goroutines,
// without its locks held, and the Delegate never blocks.
type ProcessManager interface {
	// Start starts a server's resident processes; d is the group's
	// Delegate.
	Start(spec procmgr.Spec, d procmgr.Delegate) (Processes, error)
	CPUStatus() procmgr.CPUStatus
	Containment() procmgr.ContainStatus
	Stats() procmgr.Stats
	Close()
}

// Processes are one user server's UAP processes. Kick, Attached and Kill
// are called without the group's lock: procmgr calls back into the group.
type Processes interface {
	Kick(waiting int)       // calls wait: the scaler may want another process
	Attached(slot, pid int) // the process in slot, pid (0: unknown), attached to its queue
	Kill(slot, pid int)     // the process in slot, pid (0: unknown), broke the protocol
	// Replace: the process in slot is to leave at the operator's request
	// (scdctl refresh), so its end is no crash (procmgr logs and counts it
	// apart); the caller then asks it to leave.
	Replace(slot int)
	Running() (resident, nonResident int)
	Processes() []procmgr.ProcInfo
	Usage() bpf.Usage
	CPUSample() procmgr.CPUSample
	// CPUGroupPath is the processes' cpu cgroup; "": scdd's own (nice,
	// or procmgr's shared CPU group until a weight is set).
	CPUGroupPath() string
	Limits() procmgr.LimitStatus // its pids and memory limits and what they caught
	Output() procmgr.OutputStats // its stdout and stderr lines, logged and dropped
	Stopping()
	Stop(ctx context.Context) error
	// ParallelCount is resident,max now; SetParallelCount changes it while
	// the server runs (chprc) and returns, by slot, which are resident.
	ParallelCount() (resident, maxProcs int)
	SetParallelCount(resident, maxProcs int) ([]bool, error)
}

// processes is Processes inside the package.
type processes = Processes

// Procmgr is procmgr.Manager as a ProcessManager.
func Procmgr(m *procmgr.Manager) ProcessManager { return procmgrManager{m} }

// procmgrManager is procmgr.Manager as a ProcessManager.
type procmgrManager struct{ *procmgr.Manager }

func (m procmgrManager) Start(spec procmgr.Spec, d procmgr.Delegate) (Processes, error) {
	s, err := m.Manager.Start(spec, d)
	if err != nil {
		return nil, err
	}
	return procmgrServer{s}, nil
}

func (m procmgrManager) CPUStatus() procmgr.CPUStatus { return m.CPU().Status() }

// procmgrServer is procmgr.Server as Processes.
type procmgrServer struct{ *procmgr.Server }

func (s procmgrServer) CPUGroupPath() string { return s.CPUGroup().Path() }
