package scd

import (
	"context"

	"tpsched/bpf"
	"tpsched/procmgr"
)

// processManager starts every user server's UAP processes: procmgr in
// scdd. A node's tests give it in-process UAPs instead (inproc_test.go), so
// the whole call path runs without root and without processes.
type processManager interface {
	// Start starts a server's resident processes; d is the group.
	Start(spec procmgr.Spec, d procmgr.Delegate) (processes, error)
	CPUStatus() procmgr.CPUStatus
	Containment() procmgr.ContainStatus
	Stats() procmgr.Stats
	Close()
}

// processes are one user server's UAP processes. Kick, Attached and Kill
// are called without the group's lock: procmgr calls back into the group.
type processes interface {
	Kick(waiting int)  // calls wait: the scaler may want another process
	Attached(slot int) // the process in slot attached to its queue
	Kill(slot int)     // the process in slot broke the protocol
	Running() (resident, nonResident int)
	Processes() []procmgr.ProcInfo
	Usage() bpf.Usage
	CPUSample() procmgr.CPUSample
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

// procmgrManager is procmgr.Manager as a processManager.
type procmgrManager struct{ *procmgr.Manager }

func (m procmgrManager) Start(spec procmgr.Spec, d procmgr.Delegate) (processes, error) {
	s, err := m.Manager.Start(spec, d)
	if err != nil {
		return nil, err
	}
	return procmgrServer{s}, nil
}

func (m procmgrManager) CPUStatus() procmgr.CPUStatus { return m.CPU().Status() }

// procmgrServer is procmgr.Server as processes.
type procmgrServer struct{ *procmgr.Server }

func (s procmgrServer) CPUGroupPath() string { return s.CPUGroup().Path() }
