package scd

// This file is the node's read-only face: Status (what scdctl status shows)
// and the HTTP endpoint on metrics_address that serves it with /metrics
// (metrics.go) and the status page (statuspage.go).
// Control actions are on the control socket (control.go).

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"tpsched/bpf"
	"tpsched/netio"
	"tpsched/netio/rpcport"
	"tpsched/procmgr"
	"tpsched/scd/local"
)

// The status of a group and its processes, as the local scheduler reports
// them (scd/local), under the names scdctl and the tests know.
type (
	GroupStatus    = local.GroupStatus
	Running        = local.Running
	GroupErrors    = local.GroupErrors
	ProcessStatus  = local.ProcessStatus
	UsageStatus    = local.UsageStatus
	WaitBucket     = local.WaitBucket
	LatencyStatus  = local.LatencyStatus
	LoadStatus     = local.LoadStatus
	GroupProcesses = local.GroupProcesses
	ParallelCount  = local.ParallelCount
	ChprcResult    = local.ChprcResult
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

// status reports the node's state now.
func (d *doors) status() Status {
	n := d.n
	st := Status{Node: n.cfg.System.NodeID, At: time.Now(), PID: os.Getpid(), RPC: n.rpc.Addr(), Draining: n.draining.Load(),
		CPU: n.pm.CPUStatus(), Contain: n.pm.Containment(), Probes: n.meter.Mechanism(), Scaling: n.pm.Stats()}
	if n.inCluster {
		st.Cluster = n.router.Status()
	}
	st.Receivers, st.Steering = n.rpc.Receivers(), n.rpc.Steering()
	st.ErrorAnswers = map[string]uint64{}
	for _, c := range netio.Codes() {
		if v := rpcport.ErrorAnswers(c); v > 0 {
			st.ErrorAnswers[c.String()] = v
		}
	}
	for _, g := range n.local.Groups() {
		gs := g.Status(st.Probes.Histogram)
		if n.wlm != nil {
			gs.Environment = n.wlm.EnvironmentState(gs.Group)
		}
		st.Groups = append(st.Groups, gs)
	}
	return st
}

// startHTTP serves the read-only status page (/), /metrics, /status and
// /report on the sysconf metrics address (127.0.0.1 by default): on ln,
// the old process's on a restart, or a listener of its own.
func (d *doors) startHTTP(ln net.Listener) error {
	n := d.n
	var err error
	if ln == nil {
		ln, err = net.Listen("tcp", n.cfg.System.MetricsAddress)
	}
	if err != nil {
		return fmt.Errorf("metrics_address %s: %w", n.cfg.System.MetricsAddress, err)
	}
	d.httpLn = ln
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", serveStatusPage)
	mux.HandleFunc("GET /metrics", d.serveMetrics)
	mux.HandleFunc("GET /report", d.serveReport) // node_wlm.go: goals against actuals
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(d.status())
	})
	d.http, d.httpLimit = newHTTPServer(mux, metricsMaxConns, httpWriteTimeout) // httplimit.go
	go d.run(d.http, d.httpLimit.listener(ln), "metrics and status endpoint")
	return nil
}
