package scd

// This file is the node's read-only face: Status (what scdctl status shows)
// and the HTTP endpoint on metrics_address that serves it with /metrics.
// Control actions are on the control socket (control.go).

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/bpf"
	"tpsched/netio"
	"tpsched/procmgr"
	"tpsched/scd/def"
)

// Status is what `scdctl status` shows: the node and each service group.
type Status struct {
	Node     string            `json:"node"`
	PID      int               `json:"pid"` // scdd's; a restart changes it
	RPC      string            `json:"rpc"`
	Draining bool              `json:"draining"`
	CPU      procmgr.CPUStatus `json:"cpu_priority"`
	Probes   bpf.Mechanism     `json:"cpu_measurement"` // how UAP CPU time and run-queue wait are measured
	Scaling  procmgr.Stats     `json:"scaling"`
	Groups   []GroupStatus     `json:"groups"`
	Cluster  *ClusterStatus    `json:"cluster,omitempty"` // absent without all_node
	// Receivers are the receiving sockets of every receiver group, and
	// Steering how each group's new connections are placed.
	Receivers []netio.ReceiverStats  `json:"receivers"`
	Steering  []netio.SteeringStatus `json:"steering"`
}

// GroupStatus is one service group's state.
type GroupStatus struct {
	Group      string          `json:"group"`
	Server     string          `json:"server"`
	Receivers  string          `json:"receiver_group,omitempty"` // scdmulti -g: the receiver group that takes its calls
	Held       bool            `json:"held"`
	Receive    string          `json:"receive_from"`
	Priority   int             `json:"schedule_priority"`
	Resident   int             `json:"resident"`
	Max        int             `json:"max_processes"`
	CPUGroup   string          `json:"cpu_group,omitempty"`
	QueueDepth int             `json:"queue_depth"`
	QueueSize  int             `json:"queue_size"`
	InFlight   int             `json:"in_flight"`
	Queued     uint64          `json:"queued"`
	Processed  uint64          `json:"processed"`
	Processes  []ProcessStatus `json:"processes"`
	Load       LoadStatus      `json:"load"`
	Usage      UsageStatus     `json:"cpu"`
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
	// waiting for a CPU over the CPU guard's last window; -1 when not known.
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

// writeUsageMetrics writes each group's CPU seconds and run-queue wait,
// read once per scrape: a Meter read is a syscall per process.
func (n *Node) writeUsageMetrics(w io.Writer) {
	mech := n.meter.Mechanism()
	fmt.Fprintf(w, "tpsched_cpu_measurement{mechanism=%q} 1\n", mech.Name)
	for _, g := range n.order {
		u := g.procs.Usage()
		lbl := fmt.Sprintf("group=%q", g.name)
		fmt.Fprintf(w, "tpsched_group_cpu_seconds_total{%s} %g\n", lbl, u.OnCPU.Seconds())
		fmt.Fprintf(w, "tpsched_group_runqueue_wait_seconds_total{%s} %g\n", lbl, u.Wait.Seconds())
		cpu := g.procs.CPUSample()
		fmt.Fprintf(w, "tpsched_group_runqueue_wait_percent{%s} %d\n", lbl, cpu.Wait)
		fmt.Fprintf(w, "tpsched_group_runnable_percent{%s} %d\n", lbl, cpu.Busy)
		if !mech.Histogram {
			continue
		}
		var cum uint64
		for i, c := range u.Hist[:len(u.Hist)-1] {
			cum += c
			fmt.Fprintf(w, "tpsched_group_runqueue_wait_duration_seconds_bucket{%s,le=\"%g\"} %d\n", lbl, bpf.HistBound(i).Seconds(), cum)
		}
		fmt.Fprintf(w, "tpsched_group_runqueue_wait_duration_seconds_bucket{%s,le=\"+Inf\"} %d\n", lbl, u.Waits)
		fmt.Fprintf(w, "tpsched_group_runqueue_wait_duration_seconds_sum{%s} %g\n", lbl, u.Wait.Seconds())
		fmt.Fprintf(w, "tpsched_group_runqueue_wait_duration_seconds_count{%s} %d\n", lbl, u.Waits)
	}
}

// Status reports the node's state now.
func (n *Node) Status() Status {
	st := Status{Node: n.cfg.System.NodeID, PID: os.Getpid(), RPC: n.rpc.Addr(), Draining: n.draining.Load(),
		CPU: n.pm.CPUStatus(), Probes: n.meter.Mechanism(), Scaling: n.pm.Stats()}
	st.Cluster = n.clusterStatus()
	st.Receivers, st.Steering = n.rpc.Receivers(), n.rpc.Steering()
	for _, g := range n.order {
		s := g.stats()
		st.Groups = append(st.Groups, GroupStatus{
			Group:      g.name,
			Server:     g.def.Name,
			Receivers:  g.def.ReceiverGroup,
			Held:       g.held.Load(),
			Receive:    map[def.ReceiveFrom]string{def.ReceiveQueue: "queue", def.ReceiveSocket: "socket"}[g.def.ReceiveFrom],
			Priority:   g.def.SchedulePriority,
			Resident:   g.def.Resident,
			Max:        g.def.MaxProcesses,
			CPUGroup:   g.procs.CPUGroupPath(),
			QueueDepth: s.Waiting,
			QueueSize:  g.def.QueueSize,
			InFlight:   g.inFlight(),
			Queued:     s.Queued,
			Processed:  s.Processed,
			Processes:  g.processes(),
			Load:       g.loadStatus(),
			Usage:      g.usageStatus(st.Probes.Histogram),
		})
	}
	return st
}

// startAdmin serves the read-only /metrics and /status on the sysconf
// metrics address (127.0.0.1 by default), and the control actions on the
// control socket (control.go).
func (n *Node) startAdmin() error {
	if err := n.startControl(); err != nil {
		return err
	}
	ln, err := n.restart.inheritMetrics, error(nil) // the old process's, on a restart
	if ln == nil {
		ln, err = net.Listen("tcp", n.cfg.System.MetricsAddress)
	}
	if err != nil {
		return fmt.Errorf("metrics_address %s: %w", n.cfg.System.MetricsAddress, err)
	}
	n.adminLn = ln
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		n.metrics.WritePrometheus(w)
		n.writeUsageMetrics(w)
		metrics.WriteProcessMetrics(w)
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(n.Status())
	})
	n.admin = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := n.admin.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) && !n.restart.handedOver.Load() && !n.restart.running.Load() {
			n.log.Error("metrics and status endpoint stopped", "err", err)
		}
	}()
	return nil
}
