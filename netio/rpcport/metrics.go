package rpcport

import (
	"strconv"
	"sync"
	"tpsched/netio"

	"github.com/VictoriaMetrics/metrics"
)

// MetricHelp is the HELP text of every series a Port puts in
// Options.Metrics, by family name: the library writes HELP lines without
// text, and the daemon that serves the Set fills them in from this table.
var MetricHelp = map[string]string{
	"tpsched_bad_frames_total":              "Connections closed because a frame had a bad magic, version or kind.",
	"tpsched_slow_reader_closes_total":      "Connections closed because their unsent answers passed the outbound cap (a caller that does not read).",
	"tpsched_unread_answers_refusals_total": "Calls answered 'server busy' without running because their connection had more unsent answers than the unread limit (a caller that does not read).",
	"tpsched_connections":                   "RPC connections open now.",
	"tpsched_accept_errors_total":           "Failed accepts on the RPC port (EMFILE and the like); the port pauses and retries.",
	"tpsched_connections_refused_total":     "Connections closed at once because max_connections were open.",
	"tpsched_oversized_frames_total":        "Frames answered 'message too big' and skipped unkept: their payload passed the largest max_message_size.",
	"tpsched_frame_timeouts_total":          "Connections closed because a frame did not arrive whole within frame_timeout.",
	"tpsched_buffer_budget_closes_total":    "Connections closed to keep the bytes held in partial frames and unsent answers under rpc_buffer_budget.",
	"tpsched_buffered_bytes":                "Bytes held now in partial frames and unsent answers, all connections together.",
	"tpsched_answers_undelivered_total":     "Answers owed to callers that could not be written because their connection ended first (the caller reset or closed it, or it was closed for a limit); such a connection ends with a reset, never a clean close.",
	"tpsched_error_answers_total":           "Error answers the RPC port wrote to callers, by code (OpenTP1's error names): a transferred call that failed on another node counts there and, passed back, here.",

	"tpsched_receiver_connections":           "Connections open now on one receiving socket of a receiver group.",
	"tpsched_receiver_in_flight":             "Calls one receiving socket has read and not yet answered.",
	"tpsched_receiver_accepted_total":        "Connections one receiving socket accepted.",
	"tpsched_receiver_calls_total":           "Calls one receiving socket read.",
	"tpsched_receiver_read_bytes_per_second": "Bytes per second one receiving socket read lately (what steering weighs).",
	"tpsched_receiver_steering":              "1 for each receiver group, labelled with how its new connections are placed: bpf (the SK_REUSEPORT program), hash (the kernel's) or none (one socket).",
}

// errorAnswers counts the error frames written to callers, by code. The
// count is the process's, not a Port's: scdd runs one node per process,
// so for it the two are the same.
var errorAnswers = func() (s struct {
	set *metrics.Set
	by  map[netio.Code]*metrics.Counter
}) {
	s.set = metrics.NewSet()
	s.by = make(map[netio.Code]*metrics.Counter)
	for _, c := range netio.Codes() {
		s.by[c] = s.set.NewCounter(`tpsched_error_answers_total{code=` + strconv.Quote(c.String()) + `}`)
	}
	return s
}()

// errorAnswerSets are the Sets the error counters are written to already:
// Ports that share a Set must not write the family twice.
var errorAnswerSets sync.Map // *metrics.Set -> struct{}

func countErrorAnswer(code netio.Code) {
	if c := errorAnswers.by[code]; c != nil {
		c.Inc()
	}
}

// registerMetrics puts the Port's series in m.
func (s *Port) registerMetrics(m *metrics.Set) {
	// GetOrCreate: servers sharing a Set share the series.
	s.mBad = m.GetOrCreateCounter("tpsched_bad_frames_total")
	s.mSlow = m.GetOrCreateCounter("tpsched_slow_reader_closes_total")
	s.mUnread = m.GetOrCreateCounter("tpsched_unread_answers_refusals_total")
	s.mConns = m.GetOrCreateGauge("tpsched_connections", nil)
	s.mAcceptErr = m.GetOrCreateCounter("tpsched_accept_errors_total")
	s.mRefused = m.GetOrCreateCounter(`tpsched_connections_refused_total{reason="max_connections"}`)
	s.mOversized = m.GetOrCreateCounter("tpsched_oversized_frames_total")
	s.mTimeout = m.GetOrCreateCounter("tpsched_frame_timeouts_total")
	s.mBudget = m.GetOrCreateCounter("tpsched_buffer_budget_closes_total")
	s.mUndelivered = m.GetOrCreateCounter("tpsched_answers_undelivered_total")
	m.GetOrCreateGauge("tpsched_buffered_bytes", func() float64 { return float64(s.held.Load()) })
	if _, dup := errorAnswerSets.LoadOrStore(m, struct{}{}); !dup {
		m.RegisterMetricsWriter(errorAnswers.set.WritePrometheus)
	}
}

// ErrorAnswers is how many error frames with code the ports of this
// process wrote (tpsched_error_answers_total).
func ErrorAnswers(code netio.Code) uint64 {
	if c := errorAnswers.by[code]; c != nil {
		return c.Get()
	}
	return 0
}
