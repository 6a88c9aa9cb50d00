package scd

// This file is /metrics: the node's series as Prometheus text, every
// family with HELP and TYPE, histograms with le buckets. The series live
// in n.metrics (VictoriaMetrics/metrics); the ones whose values are kept
// elsewhere (the queue's counters, procmgr's, the gossip's, the kernel's)
// are read at each scrape by writeScraped, a metrics writer of n.metrics.

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"sync"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/bpf"
	"tpsched/internal/exposition"
	"tpsched/netio/rpcport"
	"tpsched/scd/wlmnode"
)

// metricHelp is the HELP text of every family scd registers, by name.
var metricHelp = map[string]string{
	// Per service group: the schedule queue and the calls.
	"tpsched_queue_depth":                      "Calls waiting in the group's schedule queue now (q).",
	"tpsched_requests_queued_total":            "Calls put on the group's schedule queue, and local calls its processes completed on lanes.",
	"tpsched_requests_processed_total":         "Calls the group's UAP processes completed (a reply or an application error), on lanes too.",
	"tpsched_request_duration_seconds":         "Time from a call's arrival in the group's queue to its completion by a UAP process, by group; calls on lanes never reach the queue and are not in it (tpsched_lane_calls_total counts them).",
	"tpsched_requests_refused_total":           "Calls refused before queueing: reason busy (the group's queue was full: 'server busy'), budget (the requests of admitted calls would pass rpc_buffer_budget: 'server busy'), protocol (a frame the node does not take) or wrong_receiver (it came on another receiver group than its group's).",
	"tpsched_admitted_request_bytes":           "Bytes of the requests of the calls admitted and not yet ended (waiting, prefetched or running), node-wide; kept within rpc_buffer_budget.",
	"tpsched_requests_timed_out_total":         "Calls answered 'timed out': their watch_time or the caller's deadline passed.",
	"tpsched_requests_server_terminated_total": "Calls answered 'server terminated': the UAP process serving them died.",
	"tpsched_uap_protocol_violations_total":    "UAP processes killed for breaking the shared-memory protocol.",
	"tpsched_local_calls_total":                "Calls the group's UAPs made to services through their shared memory (UAP.Call), by calling group, on lanes too.",
	"tpsched_lane_grants_total":                "Lanes granted to callers of the group's services: one of its processes lent to one caller process's calls.",
	"tpsched_lane_calls_total":                 "Calls the group's processes completed on lanes (not in the queue's counters).",
	"tpsched_lane_revokes_total":               "Lanes of the group ended, by why: waiting (a call waited for a process), closed (held, not serving here, the node closing), level, caller_gone, unmapped (the callee did not take its grant), idle, stopped, died (the callee), timed_out (the node ruled a call on it).",
	"tpsched_local_call_stalls_total":          "Times every process of the group waited for a call of its own for a second while calls waited for it (a call cycle with too few processes).",
	"tpsched_dispatcher_last_look_age_seconds": "Seconds since the dispatcher, the one reader of every shared-memory group, last looked at the groups; it looks at least every 0.1 s while its processes ring, every 0.5 s on a quiet node, and above 1 the node logs a warning: it is stuck and those groups' calls go unanswered.",
	"tpsched_group_held":                       "1 while the group is held (scdctl hold: new calls get 'service closed'), else 0.",
	"tpsched_processes":                        "UAP processes of the group running now, by kind (resident, nonresident).",
	"tpsched_uap_tasks":                        "Tasks (processes and threads) in the group's server's cgroup now, against its uap_pids_max.",
	"tpsched_uap_pids_limit_hits_total":        "Forks the group's server's processes made that failed at uap_pids_max.",
	"tpsched_uap_memory_bytes":                 "Memory charged to the group's server's cgroup now, against its uap_memory_max.",
	"tpsched_uap_oom_kills_total":              "Processes of the group's server the kernel killed at uap_memory_max.",
	"tpsched_uap_output_lines_total":           "Lines the group's UAP processes wrote to stdout and stderr that went to scdd's log.",
	"tpsched_uap_output_dropped_lines_total":   "Lines the group's UAP processes wrote beyond the rate a server may log (100 a second, 1000 at once): dropped.",
	// Load levels (Table 3-12 and 3-14).
	"tpsched_load_level":               "The group's load level after its last load check: 0, 1 or 2 (LEVEL0-2).",
	"tpsched_load_queued_in_interval":  "Q of the group's last load check: calls queued during the interval.",
	"tpsched_load_remaining":           "q of the group's last load check: calls waiting in the queue at the check.",
	"tpsched_load_processing_ratio":    "X of the group's last load check (the processing rate) as a ratio: processed / (Q + q); NaN when Q + q = 0.",
	"tpsched_load_level_changes_total": "Changes of the group's load level.",
	// Processes node-wide.
	"tpsched_cpu_priority_mechanism":   "How schedule_priority becomes CPU priority (cgroup v2, cgroup v1 or nice): 1 for the mechanism in use.",
	"tpsched_memory_gate_closed":       "1 while memory is short (MemAvailable under memory_reserve) and non-resident processes are held back, else 0.",
	"tpsched_nonresident_starts_total": "Non-resident UAP processes started.",
	"tpsched_nonresident_stops_total":  "Non-resident UAP processes stopped after their idle time.",
	"tpsched_cpu_guard_holds_total":    "Non-resident starts the CPU guard held back (cpu_wait_limit): the group's processes were waiting for a CPU.",
	"tpsched_uap_kill_mechanism":       "How a server's processes and everything they started are killed together (cgroup.kill, cgroup.freeze, freezer, cgroup.procs, or process group without a cgroup): 1 for the mechanism in use.",
	"tpsched_uap_limit_mechanism":      "How uap_pids_max (limit=pids) and uap_memory_max (limit=memory) are enforced (cgroup2, cgroup1, none): 1 for the mechanism in use.",
	// CPU use of the UAP processes, as the kernel saw it.
	"tpsched_cpu_measurement":                      "How UAP CPU time and run-queue wait are measured (tp_btf, raw_tp, tracepoint: eBPF; proc: /proc): 1 for the mechanism in use.",
	"tpsched_group_cpu_seconds_total":              "CPU time the group's UAP processes ran, ended processes included.",
	"tpsched_group_runqueue_wait_seconds_total":    "Time the group's UAP processes waited for a CPU while runnable, ended processes included.",
	"tpsched_group_runqueue_wait_ratio":            "Share of the group's processes' runnable time spent waiting for a CPU over the CPU guard's last window (absent when the mechanism cannot see waits); read it beside tpsched_group_runnable_ratio: a group runnable under 0.2 of the time has too little runnable time for the ratio to mean much (the status page shows -).",
	"tpsched_group_runnable_ratio":                 "Runnable time per process of the group over the CPU guard's last window, as a ratio of the window (above 1 for several busy threads).",
	"tpsched_group_runqueue_wait_duration_seconds": "Run-queue waits of the group's UAP processes by length (eBPF only).",
	// Control socket.
	"tpsched_control_refused_total": "Requests on the control socket refused: the peer was neither scdd's user nor root.",
	// Cluster.
	"tpsched_forwarded_total":            "Calls this node transferred to another node, by node.",
	"tpsched_requests_received_total":    "Calls other nodes transferred here, by node (unknown: not a proved member of the name table).",
	"tpsched_receiver_misdirected_total": "Calls without an answer (call-no-reply) that came on another receiver group than their group's, by the group they came on: taken there, since no one would hear a refusal.",
	"tpsched_transfer_retries_total":     "Calls sent on to another node: reason unreachable (the node could not be reached) or refused (it refused the call before running it).",
	"tpsched_peer_hellos_refused_total":  "Peer hellos refused (bad key, replay, malformed, out of order); the connection is closed.",
	"tpsched_cluster_members":            "Nodes memberlist counts alive, this one included.",
	"tpsched_cluster_nodes_known":        "Nodes in the name table (their groups and levels are known here).",
	"tpsched_announces_sent_total":       "This node's own announces handed to the gossip.",
	"tpsched_announces_received_total":   "Announces applied to the name table, relays included.",
	"tpsched_announce_bytes_sent_total":  "Bytes of announces handed to the gossip.",
	"tpsched_announces_dropped_total":    "Announces dropped, by reason (unauthenticated, malformed, full: the 128-node table is full, invalid).",
}

// scrapedCounter is a counter whose value is kept elsewhere and read at
// each scrape.
type scrapedCounter struct {
	name string
	get  func() uint64
}

// scrapedSeries are the node's series read at scrape time.
type scrapedSeries struct {
	mu       sync.Mutex
	counters []scrapedCounter
}

// counter registers the counter name, read from get at each scrape.
// (The library's callback series are gauges; a _total is a counter.)
func (s *scrapedSeries) counter(name string, get func() uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counters = append(s.counters, scrapedCounter{name, get})
}

// writeScraped writes the series read at scrape time, through a Set of
// their own so that the library groups each family under one HELP and
// TYPE. It is a metrics writer of n.metrics (New).
func (d *doors) writeScraped(w io.Writer) {
	n := d.n
	s := metrics.NewSet()
	n.scraped.mu.Lock()
	counters := n.scraped.counters
	n.scraped.mu.Unlock()
	for _, c := range counters {
		s.NewCounter(c.name).Set(c.get())
	}
	if n.meter == nil {
		s.WritePrometheus(w)
		return
	}
	// Usage is a read per process: once per group and scrape.
	mech := n.meter.Mechanism()
	s.NewGauge(`tpsched_cpu_measurement{mechanism=`+strconv.Quote(mech.Name)+`}`, nil).Set(1)
	type hist struct {
		lbl string
		u   bpf.Usage
	}
	var hists []hist
	for _, g := range n.local.Groups() {
		lbl := `{group="` + g.Name() + `"}`
		u, cpu := g.Usage(), g.CPUSample()
		s.NewFloatCounter(`tpsched_group_cpu_seconds_total` + lbl).Set(u.OnCPU.Seconds())
		s.NewFloatCounter(`tpsched_group_runqueue_wait_seconds_total` + lbl).Set(u.Wait.Seconds())
		if cpu.Wait >= 0 {
			s.NewGauge(`tpsched_group_runqueue_wait_ratio`+lbl, nil).Set(float64(cpu.Wait) / 100)
		}
		s.NewGauge(`tpsched_group_runnable_ratio`+lbl, nil).Set(float64(cpu.Busy) / 100)
		if mech.Histogram {
			hists = append(hists, hist{`group="` + g.Name() + `"`, u})
		}
	}
	s.WritePrometheus(w)
	if len(hists) > 0 {
		const family = "tpsched_group_runqueue_wait_duration_seconds"
		metrics.WriteMetadataIfNeeded(w, family, "histogram")
		for _, h := range hists {
			writeWaitHistogram(w, family, h.lbl, h.u)
		}
	}
}

// writeWaitHistogram writes the eBPF run-queue wait histogram of u, whose
// log2 slots the kernel counts: the library's histograms count their own
// observations and cannot be given counts, so these lines are written here.
//
// The kernel counts a wait in Waits and then in its slot, on any CPU, and
// a read of the map copies Waits before the slots: a read while waits are
// counted can hold more in the slots than in Waits. The count written is
// the larger of the two, so the buckets never pass +Inf.
func writeWaitHistogram(w io.Writer, family, lbl string, u bpf.Usage) {
	var b []byte
	var cum uint64
	for _, c := range u.Hist {
		cum += c
	}
	count := max(cum, u.Waits)
	cum = 0
	for i, c := range u.Hist[:len(u.Hist)-1] {
		cum += c
		b = append(b, family+"_bucket{"+lbl+`,le="`...)
		b = strconv.AppendFloat(b, bpf.HistBound(i).Seconds(), 'g', -1, 64)
		b = append(b, `"} `...)
		b = strconv.AppendUint(b, cum, 10)
		b = append(b, '\n')
	}
	b = append(b, family+"_bucket{"+lbl+`,le="+Inf"} `...)
	b = strconv.AppendUint(b, count, 10)
	b = append(b, "\n"+family+"_sum{"+lbl+"} "...)
	b = strconv.AppendFloat(b, u.Wait.Seconds(), 'g', -1, 64)
	b = append(b, "\n"+family+"_count{"+lbl+"} "...)
	b = strconv.AppendUint(b, count, 10)
	b = append(b, '\n')
	_, _ = w.Write(b)
}

// serveMetrics is GET /metrics.
func (d *doors) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	n := d.n
	var b bytes.Buffer
	n.metrics.WritePrometheus(&b)
	metrics.WriteProcessMetrics(&b)
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_ = exposition.Write(w, b.Bytes(), metricHelp, wlmnode.MetricHelp, rpcport.MetricHelp, exposition.Runtime)
}
