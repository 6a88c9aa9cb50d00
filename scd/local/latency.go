package local

import (
	"sort"
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"
)

// requestDurationBuckets are the le bounds of tpsched_request_duration_seconds:
// from an echo through shared memory (tens of µs) to watch_time's default
// (180 s).
var requestDurationBuckets = []float64{
	50e-6, 100e-6, 250e-6, 500e-6,
	.001, .0025, .005, .01, .025, .05, .1, .25, .5,
	1, 2.5, 5, 10, 30, 60, 180,
}

// latencyHistogram is a group's tpsched_request_duration_seconds and the
// same counts kept where /status can read them (the library's histogram
// cannot be read back): the status page's latency percentiles.
type latencyHistogram struct {
	prom   *metrics.PrometheusHistogram
	counts []atomic.Uint64 // per bucket of requestDurationBuckets, not cumulative; the last is beyond the last bound
}

func newLatencyHistogram(prom *metrics.PrometheusHistogram) *latencyHistogram {
	return &latencyHistogram{prom: prom, counts: make([]atomic.Uint64, len(requestDurationBuckets)+1)}
}

// Update counts one call that took v seconds.
func (h *latencyHistogram) Update(v float64) {
	h.prom.Update(v)
	h.counts[sort.SearchFloat64s(requestDurationBuckets, v)].Add(1) // the first bound >= v, as le
}

// status is the counts for /status.
func (h *latencyHistogram) status() LatencyStatus {
	ls := LatencyStatus{UpToSeconds: requestDurationBuckets, Counts: make([]uint64, len(h.counts))}
	for i := range h.counts {
		ls.Counts[i] = h.counts[i].Load()
	}
	return ls
}
