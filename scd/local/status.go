package local

import (
	"tpsched/bpf"
	"tpsched/procmgr"
	"tpsched/scd/def"
)

// This file is what status and scdctl prc show of a group.

// GroupStatus is one service group's state.
type GroupStatus struct {
	Group     string `json:"group"`
	Server    string `json:"server"`
	Receivers string `json:"receiver_group,omitempty"` // scdmulti -g: the receiver group that takes its calls
	Held      bool   `json:"held"`
	// Environment is, for an application environment (svcpolicy), this
	// node's server of it: dormant (none here: the cluster starts one on
	// demand), starting, serving, quiescing or dropped; "" for any other
	// group. The routing manager fills it in (scd/wlmnode).
	Environment string          `json:"environment,omitempty"`
	Receive     string          `json:"receive_from"`
	Priority    int             `json:"schedule_priority"`
	Resident    int             `json:"resident"`      // parallel_count now (chprc may have changed it)
	Max         int             `json:"max_processes"` // likewise
	CPUGroup    string          `json:"cpu_group,omitempty"`
	QueueDepth  int             `json:"queue_depth"`
	QueueSize   int             `json:"queue_size"`
	InFlight    int             `json:"in_flight"`
	Queued      uint64          `json:"queued"`
	Processed   uint64          `json:"processed"`
	Processes   []ProcessStatus `json:"processes"`
	Running     Running         `json:"running"`
	Errors      GroupErrors     `json:"errors"`
	Load        LoadStatus      `json:"load"`
	Usage       UsageStatus     `json:"cpu"`
	Latency     LatencyStatus   `json:"latency"`
	// Limits are the server's pids and memory limits in force and what
	// they caught; WorkDir its processes' working directory; Output what
	// they wrote to stdout and stderr.
	Limits  procmgr.LimitStatus `json:"limits"`
	WorkDir string              `json:"working_directory"`
	Output  procmgr.OutputStats `json:"output"`
}

// LatencyStatus is the group's calls by how long they took from arrival to
// completion, since the node started: tpsched_request_duration_seconds's
// buckets. Percentiles over a span are read off the difference of two
// readings (the status page does, between its refreshes).
type LatencyStatus struct {
	UpToSeconds []float64 `json:"up_to_seconds"` // each bucket's upper bound (le); the last bucket has none
	Counts      []uint64  `json:"counts"`        // calls per bucket, not cumulative: one more than UpToSeconds
}

// Running counts a group's processes running now, by kind
// (tpsched_processes).
type Running struct {
	Resident    int `json:"resident"`
	NonResident int `json:"nonresident"`
}

// GroupErrors count a group's calls that failed here, by why, since the
// node started.
type GroupErrors struct {
	Busy               uint64 `json:"server_busy"`       // refused: the queue was full, or rpc_buffer_budget
	TimedOut           uint64 `json:"timed_out"`         // watch_time or the caller's deadline passed
	ServerTerminated   uint64 `json:"server_terminated"` // the UAP died during the call
	ProtocolViolations uint64 `json:"protocol_violations"`
}

// ProcessStatus is one process of a group: what procmgr knows of it and
// what the schedule queue does with it.
type ProcessStatus struct {
	procmgr.ProcInfo
	Calls  int    `json:"calls"`  // calls it holds now: its current one, and one handed over ahead
	Served uint64 `json:"served"` // calls it completed, on a lane too
	// LaneFor is the pid of the process whose calls it serves on a lane
	// (lent out of the queue: lanes.go); 0 none.
	LaneFor int `json:"lane_for,omitempty"`
}

// processStatuses lists g's processes with their calls.
func processStatuses(g *Group) []ProcessStatus {
	infos := g.procs.Processes()
	out := make([]ProcessStatus, len(infos))
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, pi := range infos {
		out[i] = ProcessStatus{ProcInfo: pi, Calls: g.q.Held(pi.Slot)}
		if si := &g.slots[pi.Slot]; si.p != nil {
			out[i].Served = si.served
		}
		for _, ls := range g.lanes.open {
			if ls.slot == pi.Slot && ls.revoked.IsZero() {
				out[i].LaneFor = ls.l.Caller().PID()
			}
		}
	}
	return out
}

// UsageStatus is what the kernel saw of a group's processes, ended ones
// included.
type UsageStatus struct {
	Seconds     float64 `json:"cpu_seconds"`
	WaitSeconds float64 `json:"runqueue_wait_seconds"`
	// WaitPercent is the share of the processes' runnable time they spent
	// waiting for a CPU over the CPU guard's last window; -1 when not known,
	// or when they were runnable less than procmgr.CPUBusyFloor percent of
	// it: a few wake-ups of an idle process make a share of a few µs that
	// says nothing (it read 71-98% on an idle node), and the guard ignores
	// it too.
	WaitPercent int `json:"runqueue_wait_percent"`
	// BusyPercent is their runnable time per process over that window.
	BusyPercent int `json:"runnable_percent"`
	WaitLimit   int `json:"cpu_wait_limit"` // 0: no guard
	// Waits are run-queue waits by length, in log2 slots (eBPF only).
	Waits []WaitBucket `json:"runqueue_waits,omitempty"`
}

// WaitBucket counts run-queue waits shorter than UpTo (and not counted in
// a smaller bucket); the last one has no bound.
type WaitBucket struct {
	UpToMicros int64  `json:"up_to_us,omitempty"`
	Count      uint64 `json:"count"`
}

func usageStatus(g *Group, hist bool) UsageStatus {
	u, cpu := g.procs.Usage(), g.procs.CPUSample()
	us := UsageStatus{
		Seconds:     u.OnCPU.Seconds(),
		WaitSeconds: u.Wait.Seconds(),
		WaitPercent: cpu.Wait,
		BusyPercent: cpu.Busy,
		WaitLimit:   g.def.CPUWaitLimit,
	}
	if cpu.Busy < procmgr.CPUBusyFloor {
		us.WaitPercent = -1
	}
	if !hist {
		return us
	}
	last := 0
	for i, c := range u.Hist {
		if c > 0 {
			last = i
		}
	}
	for i, c := range u.Hist[:last+1] {
		b := WaitBucket{Count: c}
		if i < len(u.Hist)-1 {
			b.UpToMicros = bpf.HistBound(i).Microseconds()
		}
		us.Waits = append(us.Waits, b)
	}
	return us
}

func running(g *Group) Running {
	res, nonres := g.procs.Running()
	return Running{Resident: res, NonResident: nonres}
}

// Status is the group's state now, as scdctl status shows it; hist adds
// the run-queue wait histogram (eBPF only).
func (g *Group) Status(hist bool) GroupStatus {
	s, count := g.stats(), parallelCount(g)
	return GroupStatus{
		Group:      g.name,
		Server:     g.def.Name,
		Receivers:  g.def.ReceiverGroup,
		Held:       g.held.Load(),
		Receive:    map[def.ReceiveFrom]string{def.ReceiveQueue: "queue", def.ReceiveSocket: "socket"}[g.def.ReceiveFrom],
		Priority:   g.def.SchedulePriority,
		Resident:   count.Resident,
		Max:        count.Max,
		CPUGroup:   g.procs.CPUGroupPath(),
		QueueDepth: s.Waiting,
		QueueSize:  g.def.QueueSize,
		InFlight:   g.InFlight(),
		Queued:     s.Queued,
		Processed:  s.Processed,
		Processes:  processStatuses(g),
		Running:    running(g),
		Errors:     g.errors(),
		Load:       g.load.status(&g.def),
		Usage:      usageStatus(g, hist),
		Latency:    g.latency.status(),
		Limits:     g.procs.Limits(),
		WorkDir:    g.workDir,
		Output:     g.procs.Output(),
	}
}

// CPUSample is the CPU guard's last window of the group's processes.
func (g *Group) CPUSample() procmgr.CPUSample { return g.procs.CPUSample() }

// errors are the group's failed calls by why. Busy counts every call the
// group answered 'server busy', whichever limit refused it, as the caller
// saw it; /metrics keeps the reasons apart.
func (g *Group) errors() GroupErrors {
	return GroupErrors{Busy: g.refused.Get() + g.overBudget.Get(), TimedOut: g.timedOut.Get(),
		ServerTerminated: g.terminated.Get(), ProtocolViolations: g.misbehaved.Get()}
}
