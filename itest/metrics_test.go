package itest

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"tpsched/internal/exposition/promcheck"
	"tpsched/internal/testenv"
)

// TestMetricsOfACluster parses /metrics of every node of a real
// three-node cluster, after calls that were transferred between them, with
// Prometheus' text parser (the checks of promcheck.Check) and lints it with
// promtool check metrics (the whole endpoint passes: issue 23, item 8;
// the eBPF histogram and the cluster's families included), and finds there
// every family the Grafana dashboard queries: the cluster's families that a
// one-node test cannot see (scd's TestDashboardQueriesNameExposedMetrics
// lists them) included. The eBPF run-queue histogram is required only
// where the node measures with eBPF.
func TestMetricsOfACluster(t *testing.T) {
	testenv.Slow(t, "nodes started and stopped; 4 s without -race on a busy 2-core machine")
	skipShort(t)
	nodes := startCluster(t, clusterOpts{})
	c := nodes[0].client()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 60 {
		if _, err := c.Call(ctx, "work", "echo", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	queries, err := promcheck.DashboardQueries("../dist/grafana/tpsched.json")
	must(t, err)
	for i, n := range nodes {
		text := n.metrics()
		fams, errs := promcheck.Check(text)
		for _, err := range errs {
			t.Errorf("n%d: %v", i, err)
		}
		promtoolCheck(t, fmt.Sprintf("n%d", i), text)
		st, err := n.status()
		must(t, err)
		ebpf := st.Probes.Histogram
		for _, q := range queries {
			for _, s := range promcheck.Selectors(q.Expr) {
				if _, ok := fams.Family(s.Metric); !ok && (ebpf || promcheck.HistogramBase(s.Metric) != "tpsched_group_runqueue_wait_duration_seconds") {
					t.Errorf("n%d: panel %q: %s is not in /metrics", i, q.Panel, s.Metric)
				}
			}
		}
		if t.Failed() {
			t.Logf("n%d /metrics:\n%s", i, text)
		}
	}
	fams, _ := promcheck.Check(nodes[0].metrics())
	var sent float64
	for j := 1; j < len(nodes); j++ {
		if v := fams.Value("tpsched_forwarded_total", "to", fmt.Sprintf("n%d", j)); v == v {
			sent += v
		}
	}
	if sent == 0 {
		t.Errorf("n0 transferred none of 60 calls: the cluster's transfer series were not exercised")
	}
}

// promtoolCheck runs Prometheus' linter, promtool check metrics, on the
// text of a /metrics and fails t on anything it says. Without promtool
// it skips, but not in CI (TPSCHED_REQUIRE_BPF), whose .ci/run installs
// Debian's prometheus.
func promtoolCheck(t *testing.T, what, text string) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if req := testenv.Required(); req != "" {
			t.Fatalf("promtool is not installed, and %s: it must run (.ci/run installs Debian's prometheus)", req)
		}
		t.Logf("promtool is not installed: /metrics not linted (Debian: apt-get install prometheus)")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("%s: promtool check metrics: %v\n%s", what, err, out)
	}
}
