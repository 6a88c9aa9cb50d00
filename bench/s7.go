package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gometrics "github.com/hashicorp/go-metrics"

	"tpsched/scd/loadlevel"
	scdnames "tpsched/scd/names"
)

// S7: announce propagation at the cluster's limit, at three sizes. n
// names.Gossip members (memberlist with tpsched's production timing) run
// in this process on 127.0.0.1, each with its own sockets, memberlist and
// name table and one service group; n is 32, 64 and 128, each size run
// afresh, the sizes interleaved over the runs. After every table knows all
// n, a quiet spell measures the periodic re-announce alone; then, one at a
// time, a random member announces a new level for its group and the time
// until every other table holds it is measured. The same is measured over
// real scdd processes (s7real.go), and bench/sim's routing rules over
// 1,000 simulated nodes say how far a full table of levels is worth having
// (s7sim.go).

// S7 sizing.
const (
	S7Nodes        = scdnames.MaxNodes
	s7Seeds        = 3 // each member is seeded with the first and up to two other earlier members
	s7Runs         = 3
	s7QuickRuns    = 1
	s7Probes       = 30
	s7QuickProbes  = 10
	s7Quiet        = 20 * time.Second // one refresh period: every member re-announces once
	s7QuickQuiet   = 5 * time.Second
	s7JoinLimit    = 60 * time.Second
	s7ProbeLimit   = 10 * time.Second // a change not everywhere by then is reported as not converged
	s7Gap          = 300 * time.Millisecond
	s7Refresh      = 20 * time.Second // names.GossipConfig's default Refresh
	s7Group        = "bench"
	s7JoinInterval = 50 * time.Millisecond
	// A member whose Stats or Leave takes longer is stuck; S7 reports it
	// and goes on without it rather than hanging.
	s7StatsLimit = 5 * time.Second
	s7LeaveLimit = 5 * time.Second
	// S7's target: p99 of the time until every other table holds a change.
	S7Target = 300 * time.Millisecond
)

var (
	s7Sizes      = []int{32, 64, 128}
	s7QuickSizes = []int{16, 32, 64}
)

// gossipSetup is how one S7 run was made.
type gossipSetup struct {
	Nodes      int           `json:"nodes"`
	Seeds      int           `json:"seeds_per_node"`
	Probes     int           `json:"probes"`
	Quiet      time.Duration `json:"quiet_ns"`
	Refresh    time.Duration `json:"refresh_ns"`
	ProbeLimit time.Duration `json:"probe_limit_ns"`
	Gap        time.Duration `json:"gap_ns"`
	Fast       bool          `json:"fast_failure_detection"`
	Cores      int           `json:"cores"` // the machine's, which all members share
}

// gossipGrid is S7: each size's runs and what they come to, the real
// nodes, and the simulation.
type gossipGrid struct {
	Sizes []int         `json:"sizes"`
	Runs  int           `json:"runs"`
	Setup gossipSetup   `json:"setup"` // Nodes is the largest size
	Size  []gossipSize  `json:"by_size"`
	Real  *realGossip   `json:"real_nodes,omitempty"`
	Sim   *simBeyond128 `json:"simulation,omitempty"`
}

// gossipSize is one size's runs, the changes of all runs pooled, and the
// median of each run's traffic.
type gossipSize struct {
	Nodes        int             `json:"nodes"`
	Runs         []*gossipResult `json:"runs"`
	JoinSeconds  float64         `json:"join_s"` // median
	Changes      int             `json:"changes_measured"`
	NotConverged int             `json:"not_converged"`
	AllP50Ms     float64         `json:"all_p50_ms"` // of every run's changes, pooled
	AllP99Ms     float64         `json:"all_p99_ms"`
	AllMaxMs     float64         `json:"all_max_ms"`
	TableP50Ms   float64         `json:"table_p50_ms"`
	TableP99Ms   float64         `json:"table_p99_ms"`
	TableMaxMs   float64         `json:"table_max_ms"`
	Quiet        traffic         `json:"quiet"`    // each figure the median over the runs; the health counts summed, the smallest table the least
	Changing     traffic         `json:"changing"` // the changes phase, the same way
	// Announce messages a change cost each member: the changes phase's
	// messages less what its refreshes cost (the quiet phase's rate), per
	// change, per member. The median over the runs.
	MsgsPerChangePerNode float64 `json:"messages_per_change_per_member"`
	DroppedTotal         uint64  `json:"announces_dropped"`
	Stuck                int     `json:"stuck_members"`
	// The runs in which memberlist kept every member alive (the join
	// converged, no table lost a member, nobody stuck), and their changes
	// pooled: a run in which live members were declared dead measures
	// memberlist's failure detection short of CPU, not the announces.
	HealthyRuns         int     `json:"healthy_runs"`
	HealthyChanges      int     `json:"healthy_changes"`
	HealthyNotConverged int     `json:"healthy_not_converged"`
	HealthyAllP50Ms     float64 `json:"healthy_all_p50_ms"`
	HealthyAllP99Ms     float64 `json:"healthy_all_p99_ms"`
	HealthyAllMaxMs     float64 `json:"healthy_all_max_ms"`
}

// healthy reports whether memberlist kept every member alive in r.
func (r *gossipResult) healthy() bool {
	return r.Joined && r.Quiet.TableDrops == 0 && r.Changes.TableDrops == 0 && len(r.Stuck) == 0 && r.LeaveStuck == 0
}

// probeResult is one announced change: who, and when the others' tables
// held it.
type probeResult struct {
	Node  string  `json:"node"`
	Level string  `json:"level"`
	Seen  int     `json:"tables_seen"` // of Nodes - 1
	AllMs float64 `json:"all_ms"`      // until the last table held it; 0 if not all did
	P50Ms float64 `json:"median_table_ms"`
	// Each other table's delay, in ms (-1: not within the limit).
	DelaysMs []float64 `json:"delays_ms"`
}

// gossipResult is S7's measurement.
type gossipResult struct {
	Setup gossipSetup `json:"setup"`
	// Join: from the first Join call until every table held every node.
	Joined       bool          `json:"joined"`
	JoinSeconds  float64       `json:"join_s"`
	JoinKnownMin int           `json:"join_known_min"` // the smallest table at the end of the join wait
	MembersMin   int           `json:"members_min"`    // memberlist members, over the nodes, after the probes
	MembersMax   int           `json:"members_max"`
	Probes       []probeResult `json:"probes"`
	NotConverged int           `json:"not_converged"`
	AllP50Ms     float64       `json:"all_p50_ms"` // of the converged probes' AllMs
	AllP99Ms     float64       `json:"all_p99_ms"`
	AllMaxMs     float64       `json:"all_max_ms"`
	TableP50Ms   float64       `json:"table_p50_ms"` // of every table's delay, pooled
	TableP99Ms   float64       `json:"table_p99_ms"`
	TableMaxMs   float64       `json:"table_max_ms"`
	Quiet        traffic       `json:"quiet"`
	Changes      traffic       `json:"changes"`
	DroppedTotal uint64        `json:"announces_dropped"` // over every node, any reason, at the end
	JoinCPUCores float64       `json:"join_cpu_cores"`    // this process's CPU while joining
	// Members whose names.Gossip.Stats did not return within
	// S7StatsLimit after the changes: their memberlist is stuck (it
	// takes memberlist's node lock); and members whose Leave had not
	// returned S7LeaveLimit after the end.
	Stuck          []string `json:"stuck_members,omitempty"`
	LeaveStuck     int      `json:"leave_stuck,omitempty"`
	GoroutinesPeak int      `json:"goroutines"`
}

// traffic is what the members sent over one phase.
type traffic struct {
	Seconds float64 `json:"seconds"`
	// Announce bytes handed to gossip (names.GossipStats.BytesSent,
	// relays included) per node per second, and own announces queued.
	BytesPerNodeS float64 `json:"announce_bytes_per_node_per_s"`
	Announces     float64 `json:"announces_sent"`
	// All loopback traffic on the machine (/proc/net/dev lo), per node
	// per second: memberlist's probes, gossip and push/pull included, and
	// anything else that used loopback meanwhile.
	// For the real nodes on the lab (-net lab), what their links into the
	// bridge carried instead.
	LoopbackBytesPerNodeS float64 `json:"loopback_bytes_per_node_per_s"`
	LoopbackPktsPerNodeS  float64 `json:"loopback_packets_per_node_per_s"`
	// What the members' memberlists sent, all of it (probes, acks,
	// gossip, push/pull, announces; UDP and TCP, with memberlist's
	// headers), per member per second: go-metrics' memberlist.udp.sent
	// and memberlist.tcp.sent. Only this process's; none for real nodes.
	MemberlistBytesPerNodeS float64 `json:"memberlist_bytes_per_node_per_s"`
	MemberlistPktsPerNodeS  float64 `json:"memberlist_udp_packets_per_node_per_s"`
	// Announce messages handed to memberlist (names.GossipStats.MessagesSent),
	// per node per second.
	MessagesPerNodeS float64 `json:"announce_messages_per_node_per_s"`
	CPUCores         float64 `json:"process_cpu_cores"` // this process (the 128 members)
	// The machine's busy and stolen CPU (/proc/stat), in cores: busy well
	// above CPUCores means something else ran.
	MachineCores float64 `json:"machine_busy_cores"`
	StealCores   float64 `json:"machine_steal_cores"`
	// Health: how many times a table lost a member (memberlist declared it
	// dead; nobody leaves during the phase, so every one is false) and the
	// smallest table seen.
	TableDrops int `json:"table_drops"`
	MinTable   int `json:"min_table"`
	// Members whose Stats did not answer at the phase's end (stuck).
	Stuck int `json:"stuck_members"`
}

// memberlistSink counts what every memberlist in this process sends: it
// is the process's go-metrics sink while S7 runs, and memberlist counts
// each UDP packet and TCP message it sends (memberlist.udp.sent,
// memberlist.tcp.sent, in bytes).
type memberlistSink struct{ udp, tcp, udpPkts atomic.Uint64 }

func (s *memberlistSink) IncrCounterWithLabels(key []string, val float32, _ []gometrics.Label) {
	n := len(key)
	if n < 3 || key[n-3] != "memberlist" || key[n-1] != "sent" {
		return
	}
	switch key[n-2] {
	case "udp":
		s.udp.Add(uint64(val))
		s.udpPkts.Add(1)
	case "tcp":
		s.tcp.Add(uint64(val))
	}
}

func (s *memberlistSink) IncrCounter(key []string, val float32) {
	s.IncrCounterWithLabels(key, val, nil)
}
func (*memberlistSink) SetGauge([]string, float32)                               {}
func (*memberlistSink) SetGaugeWithLabels([]string, float32, []gometrics.Label)  {}
func (*memberlistSink) EmitKey([]string, float32)                                {}
func (*memberlistSink) AddSample([]string, float32)                              {}
func (*memberlistSink) AddSampleWithLabels([]string, float32, []gometrics.Label) {}

// sent is the bytes and UDP packets counted so far.
func (s *memberlistSink) sent() (bytes, pkts uint64) {
	return s.udp.Load() + s.tcp.Load(), s.udpPkts.Load()
}

// s7Sink installs the sink once for the process.
var s7Sink = sync.OnceValue(func() *memberlistSink {
	sink := &memberlistSink{}
	cfg := gometrics.DefaultConfig("")
	cfg.EnableHostname, cfg.EnableRuntimeMetrics = false, false
	if _, err := gometrics.NewGlobal(cfg, sink); err != nil {
		return &memberlistSink{} // counts nothing; the report shows zeros
	}
	return sink
})

// parseNetDev reads an interface's transmitted bytes and packets from
// /proc/net/dev.
func parseNetDev(b []byte, iface string) (txBytes, txPackets uint64, err error) {
	for line := range strings.Lines(string(b)) {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(name) != iface {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 10 {
			return 0, 0, fmt.Errorf("bench: /proc/net/dev: %s has %d fields, want 16", iface, len(f))
		}
		if txBytes, err = strconv.ParseUint(f[8], 10, 64); err != nil {
			return 0, 0, fmt.Errorf("bench: /proc/net/dev: %w", err)
		}
		if txPackets, err = strconv.ParseUint(f[9], 10, 64); err != nil {
			return 0, 0, fmt.Errorf("bench: /proc/net/dev: %w", err)
		}
		return txBytes, txPackets, nil
	}
	return 0, 0, fmt.Errorf("bench: /proc/net/dev: no interface %s", iface)
}

func loopback() (bytes, pkts uint64) {
	b, err := os.ReadFile("/proc/net/dev")
	if err != nil {
		return 0, 0
	}
	bytes, pkts, _ = parseNetDev(b, "lo")
	return bytes, pkts
}

// s7SeedsOf picks member i's seeds among the earlier members: the first,
// and up to n-1 others drawn at random.
func s7SeedsOf(i, n int, rnd *rand.Rand) []int {
	if i == 0 || n <= 0 {
		return nil
	}
	out := []int{0}
	others := make([]int, 0, i-1)
	for k := 1; k < i; k++ {
		others = append(others, k)
	}
	rnd.Shuffle(len(others), func(a, b int) { others[a], others[b] = others[b], others[a] })
	for _, k := range others {
		if len(out) == n {
			break
		}
		out = append(out, k)
	}
	return out
}

// percentileMs is the nearest-rank percentile of v (ms), 0 for none.
func percentileMs(v []float64, p float64) float64 {
	d := make([]time.Duration, len(v))
	for i, x := range v {
		d[i] = time.Duration(x * float64(time.Millisecond))
	}
	slices.Sort(d)
	return ms(percentile(d, p))
}

// s7Probe is one change being watched for.
type s7Probe struct {
	node  int
	level loadlevel.Level
	start time.Time
	seen  []atomic.Int64 // ns after start; 0: not yet
	left  atomic.Int64
	done  chan struct{}
}

func (p *s7Probe) mark(j int, tables []*scdnames.Table, nodeName func(int) string) {
	if j == p.node || p.seen[j].Load() != 0 {
		return
	}
	info, ok := tables[j].Get(nodeName(p.node))
	if !ok || len(info.Groups) == 0 || info.Groups[0].Level != p.level {
		return
	}
	if p.seen[j].CompareAndSwap(0, max(int64(time.Since(p.start)), 1)) && p.left.Add(-1) == 0 {
		close(p.done)
	}
}

// s7Stats reads every member's Stats at once. A member whose Stats has
// not returned within limit (its memberlist is stuck: Stats takes
// memberlist's node lock) is left out of the map and listed in stuck; its
// goroutine is abandoned.
func s7Stats(members []*s7Member, limit time.Duration) (map[int]scdnames.GossipStats, []int) {
	type one struct {
		i  int
		st scdnames.GossipStats
	}
	ch := make(chan one, len(members))
	for i, m := range members {
		go func() { ch <- one{i, m.c.Stats()} }()
	}
	got := make(map[int]scdnames.GossipStats, len(members))
	timeout := time.NewTimer(limit)
	defer timeout.Stop()
	for len(got) < len(members) {
		select {
		case x := <-ch:
			got[x.i] = x.st
		case <-timeout.C:
			var stuck []int
			for i := range members {
				if _, ok := got[i]; !ok {
					stuck = append(stuck, i)
				}
			}
			return got, stuck
		}
	}
	return got, nil
}

// s7Health counts, from OnChange, each time a table loses a member, and
// the smallest table since the last reset.
type s7Health struct {
	last  []atomic.Int64
	drops atomic.Int64
	least atomic.Int64
}

func (h *s7Health) changed(j int, t *scdnames.Table) {
	l := int64(t.Len())
	if prev := h.last[j].Swap(l); l < prev {
		h.drops.Add(1)
	}
	for {
		m := h.least.Load()
		if l >= m || h.least.CompareAndSwap(m, l) {
			return
		}
	}
}

type s7Member struct {
	c     *scdnames.Gossip
	table *scdnames.Table
	level loadlevel.Level
}

// s7Sizing is S7's setup of one run for the session (Nodes is the
// largest size), its sizes and its runs.
func s7Sizing(cfg Config) (gossipSetup, []int, int) {
	setup := gossipSetup{Seeds: s7Seeds, Probes: cfg.S7Probes, Quiet: cfg.S7Quiet,
		Refresh: s7Refresh, ProbeLimit: s7ProbeLimit, Gap: s7Gap, Fast: false, Cores: runtime.NumCPU()}
	sizes, runs := cfg.S7Sizes, cfg.S7Runs
	if len(sizes) == 0 {
		sizes = s7Sizes
		if cfg.Quick {
			sizes = s7QuickSizes
		}
	}
	if runs <= 0 {
		runs = s7Runs
		if cfg.Quick {
			runs = s7QuickRuns
		}
	}
	setup.Nodes = slices.Max(sizes)
	if setup.Probes <= 0 {
		setup.Probes = s7Probes
		if cfg.Quick {
			setup.Probes = s7QuickProbes
		}
	}
	if setup.Quiet <= 0 {
		setup.Quiet = s7Quiet
		if cfg.Quick {
			setup.Quiet = s7QuickQuiet
		}
	}
	// The quiet spell measures one refresh period: each member
	// re-announces once in it. A shorter spell (quick) shortens the period.
	setup.Refresh = min(s7Refresh, setup.Quiet)
	return setup, sizes, runs
}

// s7RunTime is one run of n members: they join, the quiet spell, each
// change and the gap after it (a change takes well under a second to
// reach every member), and the members leave.
func s7RunTime(setup gossipSetup, n int) time.Duration {
	return time.Duration(n)*s7JoinInterval + setup.Quiet + time.Duration(setup.Probes)*(setup.Gap+time.Second) + s7LeaveLimit
}

// s7Plan is S7's steps: each size's runs, the real nodes, the simulation.
func s7Plan(cfg Config) scenarioPlan {
	setup, sizes, runs := s7Sizing(cfg)
	p := scenarioPlan{id: "S7"}
	for _, n := range sizes {
		p = p.and(runs, s7RunTime(setup, n))
	}
	if rs := s7RealSizing(cfg); rs.Nodes > 0 {
		p = p.and(1, s7RealTime(rs))
	}
	if ss := s7SimSizing(cfg); len(ss.Nodes) > 0 {
		p = p.and(1, ss.estimate())
	}
	return p
}

func runS7(ctx context.Context, cfg Config,
	newReport newReportFunc) error {
	setup, sizes, runs := s7Sizing(cfg)
	cfg.progress.begin(s7Plan(cfg))
	fmt.Fprintf(cfg.Log, "S7: %v members in this process, %d runs each, quiet %v, %d changes a run\n", sizes, runs, setup.Quiet, setup.Probes)
	grid := &gossipGrid{Sizes: sizes, Runs: runs, Setup: setup}
	bySize := map[int][]*gossipResult{}
	for run := range runs {
		// Interleaved, and the order reversed every other run, so that a
		// busy spell of the machine does not fall on one size only.
		order := slices.Clone(sizes)
		if run%2 == 1 {
			slices.Reverse(order)
		}
		for _, n := range order {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			one := setup
			one.Nodes = n
			fmt.Fprintf(cfg.Log, "S7 run %d/%d, %d members:\n", run+1, runs, n)
			res, err := gossipRun(ctx, one, cfg.Log)
			if err != nil {
				return fmt.Errorf("S7: %d members: %w", n, err)
			}
			bySize[n] = append(bySize[n], res)
			cfg.progress.step(s7RunTime(setup, n))
			cfg.progress.report(fmt.Sprintf("%d members, run %d", n, run+1))
		}
	}
	for _, n := range sizes {
		grid.Size = append(grid.Size, summarizeGossip(n, bySize[n]))
	}
	if rs := s7RealSizing(cfg); rs.Nodes > 0 && ctx.Err() == nil {
		grid.Real = runS7Real(ctx, cfg, rs)
		cfg.progress.step(s7RealTime(rs))
		cfg.progress.report(fmt.Sprintf("%d scdd nodes", rs.Nodes))
	}
	if ss := s7SimSizing(cfg); len(ss.Nodes) > 0 && ctx.Err() == nil {
		sim, err := runS7Sim(ss, cfg.Log)
		if err != nil {
			return fmt.Errorf("S7: simulation: %w", err)
		}
		grid.Sim = sim
		cfg.progress.step(ss.estimate())
		cfg.progress.report("the simulation")
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	title := fmt.Sprintf("announce propagation and traffic at %s members", listOf(sizes))
	if grid.Real != nil && grid.Real.Setup.Network != "" {
		title += fmt.Sprintf(" (real nodes: %s)", grid.Real.Setup.Network)
	}
	rep := newReport("S7", title, []string{"tpsched names (memberlist)"},
		nil, runOptions{Runs: runs})
	rep.Gossip = grid
	rep.Setup = s7Setup(grid, cfg.Quick)
	rep.Notes = append(rep.Notes, gossipVerdict(grid, S7Target))
	return writeReport(cfg, rep)
}

// summarizeGossip pools one size's runs.
func summarizeGossip(n int, runs []*gossipResult) gossipSize {
	g := gossipSize{Nodes: n, Runs: runs}
	var all, healthy, pooled, joins, perChange []float64
	var quiet, changing []traffic
	for _, r := range runs {
		joins = append(joins, r.JoinSeconds)
		if r.healthy() {
			g.HealthyRuns++
		}
		for _, p := range r.Probes {
			g.Changes++
			if r.healthy() {
				g.HealthyChanges++
			}
			switch {
			case p.Seen == n-1 && r.healthy():
				healthy = append(healthy, p.AllMs)
				fallthrough
			case p.Seen == n-1:
				all = append(all, p.AllMs)
			case r.healthy():
				g.HealthyNotConverged++
				g.NotConverged++
			default:
				g.NotConverged++
			}
			for _, d := range p.DelaysMs {
				if d >= 0 {
					pooled = append(pooled, d)
				}
			}
		}
		quiet, changing = append(quiet, r.Quiet), append(changing, r.Changes)
		if len(r.Probes) > 0 {
			extra := (r.Changes.MessagesPerNodeS - r.Quiet.MessagesPerNodeS) * r.Changes.Seconds
			perChange = append(perChange, extra/float64(len(r.Probes)))
		}
		g.DroppedTotal += r.DroppedTotal
		g.Stuck += len(r.Stuck)
	}
	g.JoinSeconds = median(joins)
	if len(all) > 0 {
		g.AllP50Ms, g.AllP99Ms, g.AllMaxMs = percentileMs(all, 50), percentileMs(all, 99), slices.Max(all)
	}
	if len(healthy) > 0 {
		g.HealthyAllP50Ms, g.HealthyAllP99Ms, g.HealthyAllMaxMs = percentileMs(healthy, 50), percentileMs(healthy, 99), slices.Max(healthy)
	}
	if len(pooled) > 0 {
		g.TableP50Ms, g.TableP99Ms, g.TableMaxMs = percentileMs(pooled, 50), percentileMs(pooled, 99), slices.Max(pooled)
	}
	g.Quiet, g.Changing = medianTraffic(quiet), medianTraffic(changing)
	g.MsgsPerChangePerNode = median(perChange)
	return g
}

// medianTraffic is each figure's median over runs; the health counts are
// summed and the smallest table is the least.
func medianTraffic(runs []traffic) traffic {
	t := medianOf(runs)
	t.MinTable = math.MaxInt
	for _, r := range runs {
		t.TableDrops += r.TableDrops
		t.Stuck += r.Stuck
		t.MinTable = min(t.MinTable, r.MinTable)
	}
	if len(runs) == 0 {
		t.MinTable = 0
	}
	return t
}

// gossipRun starts the members, waits for the join, measures the quiet
// spell and the changes, and makes every member leave.
func gossipRun(ctx context.Context, setup gossipSetup, log io.Writer) (*gossipResult, error) {
	s7Sink() // count the memberlists' traffic from their start
	n := setup.Nodes
	nodeName := func(i int) string { return fmt.Sprintf("m%03d", i) }
	tables := make([]*scdnames.Table, n)
	for i := range tables {
		tables[i] = scdnames.NewTable(nodeName(i))
	}
	var cur atomic.Pointer[s7Probe]
	health := &s7Health{last: make([]atomic.Int64, n)}
	members := make([]*s7Member, 0, n)
	res := &gossipResult{Setup: setup}
	defer func() {
		// A stuck member's Leave never returns: wait S7LeaveLimit, then
		// count and abandon those still leaving.
		var left atomic.Int64
		var wg sync.WaitGroup
		for _, m := range members {
			wg.Add(1)
			go func() { defer wg.Done(); m.c.Leave(500 * time.Millisecond); left.Add(1) }()
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(s7LeaveLimit):
			res.LeaveStuck = len(members) - int(left.Load())
			fmt.Fprintf(log, "  %d members had not left after %v; abandoned\n", res.LeaveStuck, s7LeaveLimit)
		}
	}()
	rnd := rand.New(rand.NewPCG(7, 128))
	addrs := make([]string, 0, n)
	cpu0, t0 := selfTicks(), time.Now()
	for i := range n {
		var seeds []string
		for _, k := range s7SeedsOf(i, setup.Seeds, rnd) {
			seeds = append(seeds, addrs[k])
		}
		j := i
		info := scdnames.NodeInfo{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(20000+i)), Announce: true,
			Groups: []scdnames.GroupInfo{{Group: s7Group}}}
		c, err := scdnames.Join(scdnames.GossipConfig{Self: nodeName(i), BindAddr: "127.0.0.1", Port: 0, Seeds: seeds, Fast: setup.Fast, Refresh: setup.Refresh,
			OnChange: func() {
				health.changed(j, tables[j])
				if p := cur.Load(); p != nil {
					p.mark(j, tables, nodeName)
				}
			}}, tables[i], info)
		if err != nil {
			return nil, fmt.Errorf("member %d: %w", i, err)
		}
		members = append(members, &s7Member{c: c, table: tables[i]})
		addrs = append(addrs, net.JoinHostPort("127.0.0.1", strconv.Itoa(c.Port())))
	}
	// Join: every table holds every node.
	res.JoinKnownMin = 0
	for {
		least := n
		for _, t := range tables {
			least = min(least, t.Len())
		}
		res.JoinKnownMin = least
		if least == n {
			res.Joined = true
			break
		}
		if time.Since(t0) > s7JoinLimit || ctx.Err() != nil {
			break
		}
		time.Sleep(s7JoinInterval)
	}
	res.JoinSeconds = time.Since(t0).Seconds()
	res.JoinCPUCores = float64(selfTicks()-cpu0) / clockTicks / res.JoinSeconds
	fmt.Fprintf(log, "  join: %d members, smallest table %d, after %.1f s (%.2f cores)\n", n, res.JoinKnownMin, res.JoinSeconds, res.JoinCPUCores)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if !res.Joined {
		// Reported as it is; the changes are still measured among those
		// that do know each other, which is what the report says.
		fmt.Fprintf(log, "  join did not converge within %v\n", s7JoinLimit)
	}

	traffic := func(run func()) traffic {
		st0, _ := s7Stats(members, s7StatsLimit)
		mlb0, mlp0 := s7Sink().sent()
		lb0, lp0 := loopback()
		mb0, ms0 := machineCPU()
		drops0 := health.drops.Load()
		health.least.Store(int64(n))
		c0, at := selfTicks(), time.Now()
		run()
		secs := time.Since(at).Seconds()
		c1 := selfTicks()
		mb1, ms1 := machineCPU()
		lb1, lp1 := loopback()
		mlb1, mlp1 := s7Sink().sent()
		st1, stuck := s7Stats(members, s7StatsLimit)
		var bytes, sent, msgs uint64
		for i, b := range st1 {
			if a, ok := st0[i]; ok {
				bytes, sent, msgs = bytes+b.BytesSent-a.BytesSent, sent+b.Sent-a.Sent, msgs+b.MessagesSent-a.MessagesSent
			}
		}
		per := float64(n) * secs
		return traffic{Seconds: secs, BytesPerNodeS: float64(bytes) / per, Announces: float64(sent), MessagesPerNodeS: float64(msgs) / per,
			LoopbackBytesPerNodeS: float64(lb1-lb0) / per, LoopbackPktsPerNodeS: float64(lp1-lp0) / per,
			MemberlistBytesPerNodeS: float64(mlb1-mlb0) / per, MemberlistPktsPerNodeS: float64(mlp1-mlp0) / per,
			CPUCores: float64(c1-c0) / clockTicks / secs, MachineCores: (mb1 - mb0) / secs, StealCores: (ms1 - ms0) / secs,
			TableDrops: int(health.drops.Load() - drops0), MinTable: int(health.least.Load()), Stuck: len(stuck)}
	}
	res.Quiet = traffic(func() { sleepCtx(ctx, setup.Quiet) })
	logTraffic(log, "quiet", res.Quiet)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	var pooled []float64
	res.Changes = traffic(func() {
		for k := range setup.Probes {
			if ctx.Err() != nil {
				return
			}
			i := rnd.IntN(n)
			m := members[i]
			m.level = (m.level + 1) % 3
			p := &s7Probe{node: i, level: m.level, seen: make([]atomic.Int64, n), done: make(chan struct{})}
			p.left.Store(int64(n - 1))
			p.start = time.Now()
			cur.Store(p)
			m.c.Announce(scdnames.NodeInfo{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(20000+i)), Announce: true,
				Groups: []scdnames.GroupInfo{{Group: s7Group, Level: m.level}}})
			// A table that changed before cur was set is caught here.
			for j := range tables {
				p.mark(j, tables, nodeName)
			}
			select {
			case <-p.done:
			case <-time.After(setup.ProbeLimit):
			case <-ctx.Done():
			}
			cur.Store(nil)
			pr := probeResult{Node: nodeName(i), Level: m.level.String()}
			var delays []float64
			for j := range p.seen {
				if j == i {
					continue
				}
				d := p.seen[j].Load()
				if d == 0 {
					pr.DelaysMs = append(pr.DelaysMs, -1)
					continue
				}
				v := float64(d) / float64(time.Millisecond)
				pr.DelaysMs = append(pr.DelaysMs, v)
				delays = append(delays, v)
			}
			pr.Seen = len(delays)
			pr.P50Ms = percentileMs(delays, 50)
			if pr.Seen == n-1 {
				pr.AllMs = slices.Max(delays)
			}
			pooled = append(pooled, delays...)
			res.Probes = append(res.Probes, pr)
			fmt.Fprintf(log, "  change %2d: %s -> %s seen by %d/%d, median %.0f ms, all %.0f ms\n", k+1, pr.Node, pr.Level, pr.Seen, n-1, pr.P50Ms, pr.AllMs)
			sleepCtx(ctx, setup.Gap)
		}
	})
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	var all []float64
	for _, p := range res.Probes {
		if p.Seen == n-1 {
			all = append(all, p.AllMs)
		} else {
			res.NotConverged++
		}
	}
	if len(all) > 0 {
		res.AllP50Ms, res.AllP99Ms, res.AllMaxMs = percentileMs(all, 50), percentileMs(all, 99), slices.Max(all)
	}
	if len(pooled) > 0 {
		res.TableP50Ms, res.TableP99Ms, res.TableMaxMs = percentileMs(pooled, 50), percentileMs(pooled, 99), slices.Max(pooled)
	}
	logTraffic(log, "changes", res.Changes)
	res.MembersMin = n
	stats, stuck := s7Stats(members, s7StatsLimit)
	for _, st := range stats {
		res.MembersMin, res.MembersMax = min(res.MembersMin, st.Members), max(res.MembersMax, st.Members)
		for _, v := range st.Dropped {
			res.DroppedTotal += v
		}
	}
	for _, i := range stuck {
		res.Stuck = append(res.Stuck, nodeName(i))
	}
	if len(stuck) > 0 {
		fmt.Fprintf(log, "  stuck (Stats did not return within %v): %v\n", s7StatsLimit, res.Stuck)
	}
	return res, nil
}

func logTraffic(log io.Writer, phase string, t traffic) {
	fmt.Fprintf(log, "  %s %.1f s: %.0f announce B/node/s, %.0f announces, memberlist %.0f B/node/s, loopback %.0f B/node/s; %.2f cores (machine %.2f, steal %.2f); "+
		"tables lost a member %d times, smallest %d; stuck %d\n", phase, t.Seconds, t.BytesPerNodeS, t.Announces, t.MemberlistBytesPerNodeS,
		t.LoopbackBytesPerNodeS, t.CPUCores, t.MachineCores, t.StealCores, t.TableDrops, t.MinTable, t.Stuck)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// gossipVerdict states the targets against what was measured: p99 of the
// time until every table holds a change at most limit at the largest size,
// and announce bytes per member that do not grow with the members.
func gossipVerdict(g *gossipGrid, limit time.Duration) string {
	if g == nil || len(g.Size) == 0 {
		return "Target: not checked (nothing measured)."
	}
	var b strings.Builder
	big := g.Size[len(g.Size)-1]
	fmt.Fprintf(&b, "**Target** (a changed level in every other table within %v, p99, at %d members): ", limit, big.Nodes)
	switch {
	case big.Changes == 0:
		b.WriteString("no change measured: **not checked**")
	case big.NotConverged > 0:
		fmt.Fprintf(&b, "%d of %d changes did not reach every table within %v: **NOT met**", big.NotConverged, big.Changes, g.Setup.ProbeLimit)
	case big.AllP99Ms <= ms(limit):
		fmt.Fprintf(&b, "p99 %.0f ms over %d changes (max %.0f ms): **met**", big.AllP99Ms, big.Changes, big.AllMaxMs)
	default:
		fmt.Fprintf(&b, "p99 %.0f ms over %d changes (max %.0f ms): **NOT met**", big.AllP99Ms, big.Changes, big.AllMaxMs)
	}
	if big.Changes > 0 && big.Changes < 100 {
		fmt.Fprintf(&b, " (with fewer than 100 changes the nearest-rank p99 is the maximum)")
	}
	if big.HealthyRuns < len(big.Runs) {
		fmt.Fprintf(&b, "; over the %d of %d runs in which memberlist kept every member alive (in the others, short of CPU, it declared "+
			"live members dead, and a change waits for membership, not for the announces): ", big.HealthyRuns, len(big.Runs))
		switch {
		case big.HealthyChanges == 0:
			b.WriteString("none")
		case big.HealthyNotConverged > 0:
			fmt.Fprintf(&b, "%d of %d changes did not reach every table: **NOT met**", big.HealthyNotConverged, big.HealthyChanges)
		case big.HealthyAllP99Ms <= ms(limit):
			fmt.Fprintf(&b, "p99 %.0f ms over %d changes (max %.0f ms): **met**", big.HealthyAllP99Ms, big.HealthyChanges, big.HealthyAllMaxMs)
		default:
			fmt.Fprintf(&b, "p99 %.0f ms over %d changes (max %.0f ms): **NOT met**", big.HealthyAllP99Ms, big.HealthyChanges, big.HealthyAllMaxMs)
		}
	}
	b.WriteString(". ")
	if len(g.Size) >= 2 {
		small := g.Size[0]
		fmt.Fprintf(&b, "**Traffic**: announce bytes per member per second, quiet (refresh only) %.0f at %d members and %.0f at %d (%s for x%.0f members); "+
			"a change cost each member %.1f messages at %d and %.1f at %d (ceil(log2 n) = %d and %d); ",
			small.Quiet.BytesPerNodeS, small.Nodes, big.Quiet.BytesPerNodeS, big.Nodes, ratio(big.Quiet.BytesPerNodeS, small.Quiet.BytesPerNodeS),
			float64(big.Nodes)/float64(small.Nodes), small.MsgsPerChangePerNode, small.Nodes, big.MsgsPerChangePerNode, big.Nodes,
			ceilLog2(small.Nodes), ceilLog2(big.Nodes))
		if big.Quiet.BytesPerNodeS <= 2*small.Quiet.BytesPerNodeS && big.MsgsPerChangePerNode <= 2*float64(ceilLog2(big.Nodes))+2 {
			b.WriteString("flat up to log n: **met**")
		} else {
			b.WriteString("growing with the members: **NOT met**")
		}
		b.WriteString(". ")
	}
	for _, z := range g.Size {
		var notes []string
		var drops, stuck, leaveStuck int
		for _, r := range z.Runs {
			drops += r.Quiet.TableDrops + r.Changes.TableDrops
			stuck += len(r.Stuck)
			leaveStuck += r.LeaveStuck
			if !r.Joined {
				notes = append(notes, fmt.Sprintf("a run's join did not converge (smallest table %d of %d after %.0f s)", r.JoinKnownMin, z.Nodes, r.JoinSeconds))
			}
		}
		if drops > 0 {
			notes = append(notes, fmt.Sprintf("tables lost a member %s (memberlist declared live members dead; nobody left)", times(drops)))
		}
		if stuck > 0 || leaveStuck > 0 {
			notes = append(notes, fmt.Sprintf("%d members were stuck after the changes (Stats did not return within %v), %d did not finish Leave within %v",
				stuck, s7StatsLimit, leaveStuck, s7LeaveLimit))
		}
		if c := g.Setup.Cores; c > 0 && max(z.Quiet.MachineCores, z.Changing.MachineCores) >= 0.85*float64(c) {
			notes = append(notes, fmt.Sprintf("the machine was busy (%.2f and %.2f of its %d cores in the quiet and changes phases, this process %.2f and %.2f): "+
				"members short of CPU delay gossip and probes", z.Quiet.MachineCores, z.Changing.MachineCores, c, z.Quiet.CPUCores, z.Changing.CPUCores))
		}
		if len(notes) > 0 {
			fmt.Fprintf(&b, "At %d members: %s. ", z.Nodes, strings.Join(notes, "; "))
		}
	}
	return strings.TrimSpace(b.String())
}

// ceilLog2 is the number of fingers a member of n has.
func ceilLog2(n int) int {
	k := 0
	for d := 1; d < n; d *= 2 {
		k++
	}
	return k
}

func s7Setup(g *gossipGrid, quick bool) []string {
	s := g.Setup
	out := []string{
		fmt.Sprintf("%s members of tpsched's name layer (scd/names: names.Join, one names.Table each, one service group \"%s\" each) in the "+
			"tpbench process, on 127.0.0.1, each with its own sockets and memberlist, memberlist choosing each port; member i is seeded with "+
			"member 0 and up to %d other earlier members drawn at random (names.Join retries seeds that are not members every 2 s). No cluster_key. "+
			"Each size is started afresh for each of %d runs; the sizes are interleaved, their order reversed every other run.",
			listOf(g.Sizes), s7Group, s.Seeds-1, g.Runs),
		"Timing: GossipConfig{Fast: false}, the production timing: memberlist's LAN defaults (probes every 1 s, timeout 500 ms) with gossip " +
			"every 100 ms to 4 members and push/pull every 15 s (memberlist scales it up above 32 members); every member re-announces every " +
			s.Refresh.String() + " without a change (GossipConfig.Refresh; 20 s in production). A change goes at once to the member's ceil(log2 n) fingers (the live members 1, 2, 4, " +
			"... places on along the members sorted by name), and each member whose table it changed passes it on to its own fingers; every own " +
			"announce, a refresh too, also goes into memberlist's broadcast queue (RetransmitMult 4 x ceil(log10(n+1)) sends, piggybacked on " +
			"gossip and probes). A refresh changes no table, so nobody relays it.",
		fmt.Sprintf("Join: from the first scdnames.Join until every table holds all members (Table.Len, read every %v).", s7JoinInterval),
		fmt.Sprintf("Quiet: %v with no change, one refresh period: each member re-announces once in it. Then %d changes, one at a time: a "+
			"member drawn at random announces its group one level up (LEVEL0 -> 1 -> 2 -> 0); the time is from Announce until each other "+
			"table holds the new level (GossipConfig.OnChange reads the table; a table that has not after %v counts as not reached); "+
			"%v between changes. The changes of all runs of a size are pooled for the percentiles.", s.Quiet, s.Probes, s.ProbeLimit, s.Gap),
		"Announce bytes and messages are names.GossipStats.BytesSent and MessagesSent (announce messages handed to memberlist: gossiped, " +
			"pushed to fingers, sent to newcomers; relays included, memberlist's own headers not), summed over the members, per member per " +
			"second. 'Messages per change per member' is the changes phase's messages less its refreshes' (the quiet phase's rate), per change " +
			"and member. Memberlist bytes are all the members' memberlists sent (probes, acks, gossip, push/pull and the announces; UDP and " +
			"TCP, memberlist's headers included), counted by memberlist itself (go-metrics memberlist.udp.sent and memberlist.tcp.sent, " +
			"this process only). Loopback is the machine's /proc/net/dev 'lo' transmit counters over the same time, per member: memberlist's " +
			"traffic and anything else that used loopback meanwhile (other tenants' tests and benchmarks), so only an upper bound. CPU is this " +
			"process's, all members together; 'machine busy' is the whole machine's (/proc/stat), other tenants included.",
		"Health: 'tables lost a member' counts each time a table dropped a member (memberlist declared it dead; nobody leaves in " +
			"these phases, so each is a false death, usually a probe that timed out for want of CPU); 'stuck' members are those whose " +
			"names.Gossip.Stats did not return within " + s7StatsLimit.String() + " at the phase's end (it waits for memberlist's node lock). " +
			"With all members on a few cores a run can tip into a state where probes time out for want of CPU, members are declared dead " +
			"and rejoin, and CPU and traffic rise; these columns show whether a run did.",
	}
	if g.Real != nil {
		out = append(out, g.Real.setupLine())
		// First, so that the reports of two networks show it side by side.
		if l := g.Real.Setup.NetLine; l != "" {
			out = append([]string{l + " This is the real scdd nodes' network; the in-process members run on 127.0.0.1 whatever -net says."}, out...)
		}
	}
	if g.Sim != nil {
		out = append(out, g.Sim.setupLine())
	}
	if quick {
		out = append(out, "Quick mode: smaller sizes, one run, a shorter quiet spell and refresh period, fewer changes; for development only.")
	}
	return out
}

func times(n int) string {
	if n == 1 {
		return "once"
	}
	return fmt.Sprintf("%d times", n)
}

func stuckList(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return fmt.Sprintf("%d: %s", len(s), strings.Join(s, ", "))
}

// writeGossip writes S7: each size's figures and traffic, each run, the
// real nodes and the simulation.
func (r *report) writeGossip(b *strings.Builder) {
	g := r.Gossip
	b.WriteString("## Figures\n\n")
	b.WriteString("| members | runs | join (median) | changes (not reaching every table) | until every other table holds a change: p50 / p99 / max | " +
		"the same, runs with every member alive | until one table holds it: p50 / p99 / max | messages per change per member | ceil(log2 n) | " +
		"announces dropped | stuck members |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, z := range g.Size {
		fmt.Fprintf(b, "| %d | %d | %.1f s | %d (%d) | %.0f / %.0f / %.0f ms | %d of %d runs: %.0f / %.0f / %.0f ms | %.0f / %.0f / %.0f ms | %.1f | %d | %d | %d |\n",
			z.Nodes, len(z.Runs), z.JoinSeconds, z.Changes, z.NotConverged, z.AllP50Ms, z.AllP99Ms, z.AllMaxMs,
			z.HealthyRuns, len(z.Runs), z.HealthyAllP50Ms, z.HealthyAllP99Ms, z.HealthyAllMaxMs,
			z.TableP50Ms, z.TableP99Ms, z.TableMaxMs, z.MsgsPerChangePerNode, ceilLog2(z.Nodes), z.DroppedTotal, z.Stuck)
	}
	b.WriteString("\n### Traffic (median of the runs)\n\n")
	b.WriteString("| members | phase | announce bytes / member / s | announce messages / member / s | memberlist bytes / member / s | " +
		"memberlist UDP packets / member / s | loopback bytes / member / s (the machine) | CPU (this process) | machine busy / steal | " +
		"tables lost a member | smallest table |\n")
	b.WriteString("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, z := range g.Size {
		for _, t := range []struct {
			name string
			t    traffic
		}{{"quiet (refresh only)", z.Quiet}, {"changes", z.Changing}} {
			fmt.Fprintf(b, "| %d | %s | %.0f | %.2f | %.0f | %.1f | %.0f | %.2f cores | %.2f / %.2f cores | %d | %d |\n", z.Nodes, t.name,
				t.t.BytesPerNodeS, t.t.MessagesPerNodeS, t.t.MemberlistBytesPerNodeS, t.t.MemberlistPktsPerNodeS, t.t.LoopbackBytesPerNodeS,
				t.t.CPUCores, t.t.MachineCores, t.t.StealCores, t.t.TableDrops, t.t.MinTable)
		}
	}
	b.WriteString("\n### Each run\n\n")
	b.WriteString("| members | run | join | every table: p50 / p99 / max | not reached | quiet: announce B / member / s | changes: announce B / member / s | " +
		"machine busy (quiet / changes) | this process (quiet / changes) | tables lost a member |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, z := range g.Size {
		for k, run := range z.Runs {
			join := fmt.Sprintf("%.1f s", run.JoinSeconds)
			if !run.Joined {
				join = fmt.Sprintf("not within %.0f s (smallest table %d)", run.JoinSeconds, run.JoinKnownMin)
			}
			fmt.Fprintf(b, "| %d | %d | %s | %.0f / %.0f / %.0f ms | %d | %.0f | %.0f | %.2f / %.2f cores | %.2f / %.2f cores | %d |\n",
				z.Nodes, k+1, join, run.AllP50Ms, run.AllP99Ms, run.AllMaxMs, run.NotConverged, run.Quiet.BytesPerNodeS, run.Changes.BytesPerNodeS,
				run.Quiet.MachineCores, run.Changes.MachineCores, run.Quiet.CPUCores, run.Changes.CPUCores, run.Quiet.TableDrops+run.Changes.TableDrops)
		}
	}
	b.WriteString("\n")
	if g.Real != nil {
		g.Real.write(b)
	}
	if g.Sim != nil {
		g.Sim.write(b)
	}
}
