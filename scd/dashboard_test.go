package scd

import (
	"testing"

	"tpsched/internal/exposition"
	"tpsched/internal/exposition/promcheck"
)

// dashboard is the Grafana dashboard shipped in the repository.
const dashboard = "../dist/grafana/tpsched.json"

// onlyElsewhere are the families the dashboard queries that a one-node
// in-process node does not expose, and why. itest's TestMetricsOfACluster
// finds them on a real cluster.
var onlyElsewhere = map[string]string{
	"tpsched_forwarded_total":                      "cluster: a series per node a call was transferred to",
	"tpsched_requests_received_total":              "cluster: calls other nodes transferred here",
	"tpsched_transfer_retries_total":               "cluster",
	"tpsched_cluster_members":                      "cluster",
	"tpsched_announces_sent_total":                 "cluster",
	"tpsched_announces_received_total":             "cluster",
	"tpsched_announce_bytes_sent_total":            "cluster",
	"tpsched_announces_dropped_total":              "cluster",
	"tpsched_group_runqueue_wait_duration_seconds": "eBPF only (tp_btf, raw_tp, tracepoint): the /proc mechanism keeps no histogram",
}

// TestDashboardQueriesNameExposedMetrics: every query of the Grafana
// dashboard selects a family that /metrics of a running node exposes
// (under the name it has there, not the library's before a rename),
// with labels its series carry (instance and job are Prometheus'), or one
// listed in onlyElsewhere with the reason, which the node then must not
// expose (else the list is stale).
func TestDashboardQueriesNameExposedMetrics(t *testing.T) {
	queries, err := promcheck.DashboardQueries(dashboard)
	if err != nil {
		t.Fatal(err)
	}
	fams := checkExposition(t, scrape(t, metricsNode(t)))
	used := map[string]bool{}
	for _, q := range queries {
		sels := promcheck.Selectors(q.Expr)
		if len(sels) == 0 {
			t.Errorf("panel %q: %s names no tpsched metric", q.Panel, q.Expr)
		}
		for _, s := range sels {
			if r, ok := exposition.Renamed[s.Metric]; ok && r.Name != s.Metric {
				t.Errorf("panel %q: %s is the library's name: /metrics has it as %s (internal/exposition.Renamed)", q.Panel, s.Metric, r.Name)
			}
			fam, ok := fams.Family(s.Metric)
			if !ok {
				base := promcheck.HistogramBase(s.Metric)
				if why, listed := onlyElsewhere[base]; listed {
					used[base] = true
					t.Logf("panel %q: %s exists only with %s", q.Panel, s.Metric, why)
				} else {
					t.Errorf("panel %q: %s is not in /metrics", q.Panel, s.Metric)
				}
				continue
			}
			if why, listed := onlyElsewhere[fam]; listed {
				t.Errorf("%s is listed as %q but this node exposes it", fam, why)
			}
			for _, l := range s.Labels {
				if l != "instance" && l != "job" && !fams.HasLabel(fam, l) {
					t.Errorf("panel %q: %s has no label %s", q.Panel, fam, l)
				}
			}
		}
	}
	for fam := range onlyElsewhere {
		if !used[fam] {
			t.Errorf("%s is listed in onlyElsewhere but no query uses it", fam)
		}
	}
}
