package scd

// The routing manager's control actions (the VARY WLM commands of source
// document 004) on the control socket: quiesce, resume and refresh an
// application environment across the cluster, and read svcpolicy again on
// every node. Each answers an EnvActionResult with one line per node.

import (
	"encoding/json"
	"errors"
	"net/http"

	"tpsched/netio"
)

// wlmControl adds the routing manager's actions to the control socket.
func (n *Node) wlmControl(mux *http.ServeMux) {
	envAction := func(act func(string) (EnvActionResult, error)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			env := r.URL.Query().Get("env")
			if env == "" {
				http.Error(w, "missing env: the application environment (a service group of svcpolicy's environment lines)", http.StatusBadRequest)
				return
			}
			res, err := act(env)
			writeEnvAction(w, res, err)
		}
	}
	mux.HandleFunc("POST /quiesce", envAction(n.Quiesce))
	mux.HandleFunc("POST /resume", envAction(n.Resume))
	mux.HandleFunc("POST /refresh", envAction(n.Refresh))
	mux.HandleFunc("POST /policy", func(w http.ResponseWriter, _ *http.Request) {
		res, err := n.ReloadPolicy()
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
		case errors.Is(err, errNoPolicy):
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
