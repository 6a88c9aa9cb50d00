package scd

import (
	"encoding/json"
	"errors"
	"net/http"

	"tpsched/netio"
	"tpsched/scd/call"
	"tpsched/scd/local"
	"tpsched/scd/wlmnode"
)

// This file wires the routing manager (scd/wlmnode) of a node with a
// service policy and serves its doors: scdctl report (GET /report) and
// the control socket's quiesce, resume, refresh and policy.

// prepareWLM makes the routing manager, after the router, whose name table
// it reads, and installs the policy's classes in every group.
func (n *Node) prepareWLM() error {
	w, err := wlmnode.New(wlmnode.Options{
		Self:        n.cfg.System.NodeID,
		Dir:         n.cfg.Dir,
		Policy:      n.cfg.Policy,
		Log:         n.log,
		Metrics:     n.metrics,
		BadRequests: n.badRequests,
		Local:       wlmLocal{n.local},
		Peers:       n.pool,
		Names:       n.router.Names(),
		Alone:       !n.inCluster,
		Settled:     n.router.Settled(),
		Addr:        n.advertisedRPC,
		Announce:    n.announce,
		MeasuresWaits: func() bool {
			return n.meter != nil && n.meter.Mechanism().Waits
		},
		Retries:   n.cfg.Sched.RetryOfCommError,
		WatchTime: n.cfg.System.WatchTime,
		ProcStat:  n.opts.ProcStat,
	})
	if err != nil {
		return err
	}
	n.wlm = w
	n.metrics.RegisterMetricsWriter(w.WriteMetrics)
	return nil
}

// wlmLocal is the local scheduler as the routing manager sees it.
type wlmLocal struct{ s *local.Scheduler }

func (l wlmLocal) Groups() []wlmnode.Group {
	out := make([]wlmnode.Group, 0, len(l.s.Groups()))
	for _, g := range l.s.Groups() {
		out = append(out, g)
	}
	return out
}

func (l wlmLocal) Group(name string) (wlmnode.Group, bool) {
	g, ok := l.s.Group(name)
	if !ok {
		return nil, false
	}
	return g, true
}

func (l wlmLocal) Serve(c call.Caller, f *netio.Frame) (netio.Code, string) { return l.s.Serve(c, f) }

// namesChanged is called when a peer changed the name table: the routing
// manager counts the servers it shows at once.
func (n *Node) namesChanged() {
	if n.wlm != nil {
		n.wlm.NamesChanged()
	}
}

// The routing manager's report and actions, under the names scdctl and
// the tests know.
type (
	Report          = wlmnode.Report
	ClassReport     = wlmnode.ClassReport
	GoalBucket      = wlmnode.GoalBucket
	GroupReport     = wlmnode.GroupReport
	EnvReport       = wlmnode.EnvReport
	EnvServer       = wlmnode.EnvServer
	NodeResult      = wlmnode.NodeResult
	EnvActionResult = wlmnode.EnvActionResult
	GrowReport      = wlmnode.GrowReport
)

// serveReport is GET /report.
func (d *doors) serveReport(w http.ResponseWriter, _ *http.Request) {
	n := d.n
	if n.wlm == nil {
		http.Error(w, wlmnode.ErrNoPolicy.Error(), http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(n.wlm.Report())
}

// wlmControl adds the routing manager's actions (the VARY WLM commands of
// source document 004) to the control socket: quiesce, resume and refresh
// an application environment across the cluster, and read svcpolicy again
// on every node. Each answers an EnvActionResult with one line per node.
func (d *doors) wlmControl(mux *http.ServeMux) {
	n := d.n
	envAction := func(act func(*wlmnode.Manager, string) (EnvActionResult, error)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			env := r.URL.Query().Get("env")
			if env == "" {
				http.Error(w, "missing env: the application environment (a service group of svcpolicy's environment lines)", http.StatusBadRequest)
				return
			}
			if n.wlm == nil {
				writeEnvAction(w, EnvActionResult{}, wlmnode.ErrNoPolicy)
				return
			}
			res, err := act(n.wlm, env)
			writeEnvAction(w, res, err)
		}
	}
	mux.HandleFunc("POST /quiesce", envAction((*wlmnode.Manager).Quiesce))
	mux.HandleFunc("POST /resume", envAction((*wlmnode.Manager).Resume))
	mux.HandleFunc("POST /refresh", envAction((*wlmnode.Manager).Refresh))
	mux.HandleFunc("POST /policy", func(w http.ResponseWriter, _ *http.Request) {
		if n.wlm == nil {
			writeEnvAction(w, EnvActionResult{}, wlmnode.ErrNoPolicy)
			return
		}
		res, err := n.wlm.ReloadPolicy()
		writeEnvAction(w, res, err)
	})
}

// writeEnvAction answers a cluster-wide action: 404 for an environment
// the policy does not name, 409 without a policy, else the nodes' results
// (each node's error is in its line).
func writeEnvAction(w http.ResponseWriter, res EnvActionResult, err error) {
	if err != nil {
		status := http.StatusBadRequest
		var ne *netio.Error
		switch {
		case errors.Is(err, wlmnode.ErrNoPolicy):
			status = http.StatusConflict
		case errors.As(err, &ne) && ne.Code == netio.CodeNoSuchGroup:
			status = http.StatusNotFound
		}
		http.Error(w, err.Error(), status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(res)
}
