package scd

// This file is the node's read-only face: Status (what scdctl status shows)
// and the HTTP endpoint on metrics_address that serves it with /metrics
// (metrics.go) and the status page (statuspage.go).
// Control actions are on the control socket (control.go).

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"tpsched/bpf"
	"tpsched/netio"
	"tpsched/netio/rpcport"
	"tpsched/procmgr"
	"tpsched/scd/def"
)

// Status is what `scdctl status` shows: the node and each service group.
type Status struct {
	Node     string            `json:"node"`
	At       time.Time         `json:"at"`  // when the figures were read: rates are differences over it
	PID      int               `json:"pid"` // scdd's; a restart changes it
	RPC      string            `json:"rpc"`
	Draining bool              `json:"draining"`
	CPU      procmgr.CPUStatus `json:"cpu_priority"`
	// Contain is how the UAPs are contained: killed together, limited,
	// placed, isolated (procmgr/contain.go).
	Contain procmgr.ContainStatus `json:"uap_containment"`
	Probes  bpf.Mechanism         `json:"cpu_measurement"` // how UAP CPU time and run-queue wait are measured
	Scaling procmgr.Stats         `json:"scaling"`
	Groups  []GroupStatus         `json:"groups"`
	Cluster *ClusterStatus        `json:"cluster,omitempty"` // absent without all_node
	// ErrorAnswers are the calls answered with an error, by code, since
	// the node started (tpsched_error_answers_total); codes never used are
	// left out.
	ErrorAnswers map[string]uint64 `json:"error_answers"`
	// Receivers are the receiving sockets of every receiver group, and
	// Steering how each group's new connections are placed.
	Receivers []rpcport.ReceiverStats  `json:"receivers"`
	Steering  []rpcport.SteeringStatus `json:"steering"`
}

// GroupStatus is one service group's state.
type GroupStatus struct {
	Group     string `json:"group"`
	Server    string `json:"server"`
	Receivers string `json:"receiver_group,omitempty"` // scdmulti -g: the receiver group that takes its calls
	Held      bool   `json:"held"`
	// Environment is, for an application environment (svcpolicy), this
	// node's server of it: dormant (none here: the cluster starts one on
	// demand), starting, serving, quiescing or dropped; "" for any other
	// group.
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
	Busy               uint64 `json:"server_busy"`       // refused: the queue was full
	TimedOut           uint64 `json:"timed_out"`         // watch_time or the caller's deadline passed
	ServerTerminated   uint64 `json:"server_terminated"` // the UAP died during the call
	ProtocolViolations uint64 `json:"protocol_violations"`
}

// ProcessStatus is one process of a group: what procmgr knows of it and
// what the schedule queue does with it.
type ProcessStatus struct {
	procmgr.ProcInfo
	Calls  int    `json:"calls"`  // calls it holds now: its current one, and one handed over ahead
	Served uint64 `json:"served"` // calls it completed
}

// processes lists g's processes with their calls.
func (g *group) processes() []ProcessStatus {
	infos := g.procs.Processes()
	out := make([]ProcessStatus, len(infos))
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, pi := range infos {
		out[i] = ProcessStatus{ProcInfo: pi, Calls: g.q.Held(pi.Slot)}
		if si := &g.slots[pi.Slot]; si.p != nil {
			out[i].Served = si.served
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

func (g *group) usageStatus(hist bool) UsageStatus {
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

func (g *group) running() Running {
	res, nonres := g.procs.Running()
	return Running{Resident: res, NonResident: nonres}
}

// Status reports the node's state now.
func (n *Node) Status() Status {
	st := Status{Node: n.cfg.System.NodeID, At: time.Now(), PID: os.Getpid(), RPC: n.rpc.Addr(), Draining: n.draining.Load(),
		CPU: n.pm.CPUStatus(), Contain: n.pm.Containment(), Probes: n.meter.Mechanism(), Scaling: n.pm.Stats()}
	st.Cluster = n.clusterStatus()
	st.Receivers, st.Steering = n.rpc.Receivers(), n.rpc.Steering()
	st.ErrorAnswers = map[string]uint64{}
	for _, c := range netio.Codes() {
		if v := rpcport.ErrorAnswers(c); v > 0 {
			st.ErrorAnswers[c.String()] = v
		}
	}
	for _, g := range n.order {
		s, count := g.stats(), g.parallelCount()
		env := ""
		if n.wlm != nil && n.wlm.envs.isEnv(g.name) {
			env = n.wlm.envs.localState(g.name)
		}
		st.Groups = append(st.Groups, GroupStatus{
			Environment: env,
			Group:       g.name,
			Server:      g.def.Name,
			Receivers:   g.def.ReceiverGroup,
			Held:        g.held.Load(),
			Receive:     map[def.ReceiveFrom]string{def.ReceiveQueue: "queue", def.ReceiveSocket: "socket"}[g.def.ReceiveFrom],
			Priority:    g.def.SchedulePriority,
			Resident:    count.Resident,
			Max:         count.Max,
			CPUGroup:    g.procs.CPUGroupPath(),
			QueueDepth:  s.Waiting,
			QueueSize:   g.def.QueueSize,
			InFlight:    g.inFlight(),
			Queued:      s.Queued,
			Processed:   s.Processed,
			Processes:   g.processes(),
			Running:     g.running(),
			Errors: GroupErrors{Busy: g.refused.Get(), TimedOut: g.timedOut.Get(),
				ServerTerminated: g.terminated.Get(), ProtocolViolations: g.misbehaved.Get()},
			Load:    g.loadStatus(),
			Usage:   g.usageStatus(st.Probes.Histogram),
			Latency: g.latency.status(),
			Limits:  g.procs.Limits(),
			WorkDir: g.workDir,
			Output:  g.procs.Output(),
		})
	}
	return st
}

// startAdmin serves the read-only status page (/), /metrics and /status
// on the sysconf metrics address (127.0.0.1 by default), and the control
// actions on the control socket (control.go).
func (n *Node) startAdmin() error {
	if err := n.startControl(); err != nil {
		return err
	}
	// Bound before the UAPs started (bindPorts), else the old process's
	// on a restart.
	ln, err := n.adminBound, error(nil)
	n.adminBound = nil
	if inh := n.restart.inheritMetrics; inh != nil {
		n.restart.inheritMetrics = nil
		if ln == nil {
			ln = inh
		} else {
			_ = inh.Close()
		}
	}
	if ln == nil {
		ln, err = net.Listen("tcp", n.cfg.System.MetricsAddress)
	}
	if err != nil {
		return fmt.Errorf("metrics_address %s: %w", n.cfg.System.MetricsAddress, err)
	}
	n.adminLn = ln
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", serveStatusPage)
	mux.HandleFunc("GET /metrics", n.serveMetrics)
	mux.HandleFunc("GET /report", n.serveReport) // wlm_report.go: goals against actuals
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(n.Status())
	})
	n.admin, n.adminLimit = newHTTPServer(mux, metricsMaxConns, httpWriteTimeout) // httplimit.go
	go func() {
		if err := n.admin.Serve(n.adminLimit.listener(ln)); err != nil && !errors.Is(err, http.ErrServerClosed) && !n.restart.handedOver.Load() && !n.restart.running.Load() {
			n.log.Error("metrics and status endpoint stopped", "err", err)
		}
	}()
	return nil
}
