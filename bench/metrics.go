package bench

import (
	"fmt"
	"io"
	"net/http"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// nodeMetrics is what S6 reads of one node's /metrics.
type nodeMetrics struct {
	processed    float64 // tpsched_requests_processed_total{group="bench"}
	refusedBusy  float64 // tpsched_requests_refused_total{group="bench",reason="busy"}
	levelChanges float64 // tpsched_load_level_changes_total{group="bench"}
	forwarded    float64 // tpsched_forwarded_total, every series
	level        int     // tpsched_load_level{group="bench"}; -1 if absent
}

// metricFamilies is a /metrics page parsed by Prometheus' own text parser.
type metricFamilies map[string]*dto.MetricFamily

func parseMetrics(r io.Reader) (metricFamilies, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mf, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("bench: /metrics: %w", err)
	}
	return mf, nil
}

// value is the sample of family name whose labels include the name/value
// pairs given, and whether there is one.
func (m metricFamilies) value(name string, labels ...string) (float64, bool) {
	f := m[name]
	if f == nil {
		return 0, false
	}
	for _, s := range f.GetMetric() {
		if hasLabels(s, labels) {
			return sampleValue(s), true
		}
	}
	return 0, false
}

// sum adds up every sample of family name.
func (m metricFamilies) sum(name string) float64 {
	var t float64
	for _, s := range m[name].GetMetric() {
		t += sampleValue(s)
	}
	return t
}

func hasLabels(s *dto.Metric, pairs []string) bool {
	for i := 0; i+1 < len(pairs); i += 2 {
		found := false
		for _, l := range s.GetLabel() {
			if l.GetName() == pairs[i] && l.GetValue() == pairs[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func sampleValue(s *dto.Metric) float64 {
	switch {
	case s.Counter != nil:
		return s.GetCounter().GetValue()
	case s.Gauge != nil:
		return s.GetGauge().GetValue()
	}
	return s.GetUntyped().GetValue()
}

// benchMetrics picks S6's figures for group out of a node's metrics.
func benchMetrics(m metricFamilies, group string) nodeMetrics {
	n := nodeMetrics{level: -1}
	n.processed, _ = m.value("tpsched_requests_processed_total", "group", group)
	n.refusedBusy, _ = m.value("tpsched_requests_refused_total", "group", group, "reason", "busy")
	n.levelChanges, _ = m.value("tpsched_load_level_changes_total", "group", group)
	n.forwarded = m.sum("tpsched_forwarded_total")
	if v, ok := m.value("tpsched_load_level", "group", group); ok {
		n.level = int(v)
	}
	return n
}

// readMetrics reads S6's figures from the node whose control address is ctl.
func readMetrics(ctl string) (nodeMetrics, error) {
	resp, err := statusClient.Get("http://" + ctl + "/metrics")
	if err != nil {
		return nodeMetrics{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nodeMetrics{}, fmt.Errorf("%s/metrics: %s", ctl, resp.Status)
	}
	m, err := parseMetrics(resp.Body)
	if err != nil {
		return nodeMetrics{}, fmt.Errorf("%s: %w", ctl, err)
	}
	return benchMetrics(m, "bench"), nil
}
