package scd

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/netio"
	"tpsched/procmgr"
	"tpsched/scd/def"
)

// Status is what `scdctl status` shows: the node and each service group.
type Status struct {
	Node     string            `json:"node"`
	RPC      string            `json:"rpc"`
	Draining bool              `json:"draining"`
	CPU      procmgr.CPUStatus `json:"cpu_priority"`
	Scaling  procmgr.Stats     `json:"scaling"`
	Groups   []GroupStatus     `json:"groups"`
}

// GroupStatus is one service group's state.
type GroupStatus struct {
	Group      string             `json:"group"`
	Server     string             `json:"server"`
	Held       bool               `json:"held"`
	Receive    string             `json:"receive_from"`
	Priority   int                `json:"schedule_priority"`
	Resident   int                `json:"resident"`
	Max        int                `json:"max_processes"`
	CPUGroup   string             `json:"cpu_group,omitempty"`
	QueueDepth int                `json:"queue_depth"`
	QueueSize  int                `json:"queue_size"`
	InFlight   int                `json:"in_flight"`
	Queued     uint64             `json:"queued"`
	Processed  uint64             `json:"processed"`
	Processes  []procmgr.ProcInfo `json:"processes"`
}

// Status reports the node's state now.
func (n *Node) Status() Status {
	st := Status{Node: n.cfg.System.NodeID, RPC: n.rpc.Addr(), Draining: n.draining.Load(),
		CPU: n.pm.CPU().Status(), Scaling: n.pm.Stats()}
	for _, g := range n.order {
		s := g.seg.Stats()
		st.Groups = append(st.Groups, GroupStatus{
			Group:      g.name,
			Server:     g.def.Name,
			Held:       g.held.Load(),
			Receive:    map[def.ReceiveFrom]string{def.ReceiveQueue: "queue", def.ReceiveSocket: "socket"}[g.def.ReceiveFrom],
			Priority:   g.def.SchedulePriority,
			Resident:   g.def.Resident,
			Max:        g.def.MaxProcesses,
			CPUGroup:   g.procs.CPUGroup().Path(),
			QueueDepth: s.Depth,
			QueueSize:  g.def.QueueSize,
			InFlight:   g.inFlight(),
			Queued:     s.Queued,
			Processed:  s.Done,
			Processes:  g.procs.Processes(),
		})
	}
	return st
}

// startAdmin serves the control API and /metrics on the sysconf metrics
// address (127.0.0.1 by default: hold and release must not be open to the
// network unless the operator says so).
func (n *Node) startAdmin() error {
	ln, err := net.Listen("tcp", n.cfg.System.MetricsAddress)
	if err != nil {
		return fmt.Errorf("metrics_address %s: %w", n.cfg.System.MetricsAddress, err)
	}
	n.adminLn = ln
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		n.metrics.WritePrometheus(w)
		metrics.WriteProcessMetrics(w)
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(n.Status())
	})
	mux.HandleFunc("POST /hold", func(w http.ResponseWriter, r *http.Request) {
		n.answerControl(w, n.Hold(r.URL.Query().Get("group")))
	})
	mux.HandleFunc("POST /release", func(w http.ResponseWriter, r *http.Request) {
		n.answerControl(w, n.Release(r.URL.Query().Get("group")))
	})
	// Profiles for performance engineers; the control address is loopback
	// unless the operator opened it.
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	n.admin = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := n.admin.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("control API stopped", "err", err)
		}
	}()
	return nil
}

func (n *Node) answerControl(w http.ResponseWriter, err error) {
	if err == nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	var te *netio.Error
	if errors.As(err, &te) && te.Code == netio.CodeNoSuchGroup {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	http.Error(w, err.Error(), http.StatusBadRequest)
}
