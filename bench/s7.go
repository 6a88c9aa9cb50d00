package bench

import (
	"context"
	"fmt"
	"io"
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

	"tpsched/scd/loadlevel"
	scdnames "tpsched/scd/names"
)

// S7: announce propagation at the cluster's limit. 128 names.Gossip
// members (memberlist with tpsched's production timing) run in this
// process on 127.0.0.1, each with its own name table and one service
// group. After every table knows all 128, a quiet spell measures the
// periodic re-announce alone; then, one at a time, a random member
// announces a new level for its group and the time until every other
// table holds it is measured.

// S7 sizing.
const (
	S7Nodes        = scdnames.MaxNodes
	s7Seeds        = 3 // each member is seeded with the first and up to two other earlier members
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
)

// gossipSetup is how S7 was run.
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
	LoopbackBytesPerNodeS float64 `json:"loopback_bytes_per_node_per_s"`
	LoopbackPktsPerNodeS  float64 `json:"loopback_packets_per_node_per_s"`
	CPUCores              float64 `json:"process_cpu_cores"` // this process (the 128 members)
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

// runS7 runs the 128 members, measures, and writes the report.
// s7Sizing is S7's setup for the session.
func s7Sizing(cfg Config) gossipSetup {
	setup := gossipSetup{Nodes: cfg.S7Nodes, Seeds: s7Seeds, Probes: cfg.S7Probes, Quiet: cfg.S7Quiet,
		Refresh: s7Refresh, ProbeLimit: s7ProbeLimit, Gap: s7Gap, Fast: false, Cores: runtime.NumCPU()}
	if setup.Nodes <= 0 {
		setup.Nodes = S7Nodes
	}
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
	return setup
}

// s7Plan is S7 as one step: the members join one by one, the quiet
// spell, each change and the gap after it (a change takes well under a
// second to reach every member), and the members leave.
func s7Plan(setup gossipSetup) scenarioPlan {
	return plan("S7", 1, time.Duration(setup.Nodes)*s7JoinInterval+setup.Quiet+
		time.Duration(setup.Probes)*(setup.Gap+time.Second)+s7LeaveLimit)
}

func runS7(ctx context.Context, cfg Config,
	newReport newReportFunc) error {
	setup := s7Sizing(cfg)
	cfg.progress.begin(s7Plan(setup))
	fmt.Fprintf(cfg.Log, "S7: %d members in this process, quiet %v, %d changes\n", setup.Nodes, setup.Quiet, setup.Probes)
	res, err := gossipRun(ctx, setup, cfg.Log)
	if err != nil {
		return fmt.Errorf("S7: %w", err)
	}
	cfg.progress.step(s7Plan(setup).planned)
	cfg.progress.report("the members' run done")
	rep := newReport("S7", fmt.Sprintf("%d nodes: announce propagation and traffic", setup.Nodes), []string{"tpsched names (memberlist)"},
		nil, runOptions{Runs: 1})
	rep.Gossip = res
	rep.Setup = s7Setup(setup, cfg.Quick)
	rep.Notes = append(rep.Notes, gossipVerdict(res, time.Second))
	return writeReport(cfg, rep)
}

// gossipRun starts the members, waits for the join, measures the quiet
// spell and the changes, and makes every member leave.
func gossipRun(ctx context.Context, setup gossipSetup, log io.Writer) (*gossipResult, error) {
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
		c, err := scdnames.Join(scdnames.GossipConfig{Self: nodeName(i), BindAddr: "127.0.0.1", Port: 0, Seeds: seeds, Fast: setup.Fast,
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
		st1, stuck := s7Stats(members, s7StatsLimit)
		var bytes, sent uint64
		for i, b := range st1 {
			if a, ok := st0[i]; ok {
				bytes, sent = bytes+b.BytesSent-a.BytesSent, sent+b.Sent-a.Sent
			}
		}
		per := float64(n) * secs
		return traffic{Seconds: secs, BytesPerNodeS: float64(bytes) / per, Announces: float64(sent),
			LoopbackBytesPerNodeS: float64(lb1-lb0) / per, LoopbackPktsPerNodeS: float64(lp1-lp0) / per,
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
	fmt.Fprintf(log, "  %s %.1f s: %.0f announce B/node/s, %.0f announces, loopback %.0f B/node/s; %.2f cores (machine %.2f, steal %.2f); "+
		"tables lost a member %d times, smallest %d; stuck %d\n", phase, t.Seconds, t.BytesPerNodeS, t.Announces, t.LoopbackBytesPerNodeS,
		t.CPUCores, t.MachineCores, t.StealCores, t.TableDrops, t.MinTable, t.Stuck)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// gossipVerdict states the target, p99 of the time until every table
// holds a change at most limit, against what was measured.
func gossipVerdict(r *gossipResult, limit time.Duration) string {
	if r == nil || len(r.Probes) == 0 {
		return "Target: not checked (no change measured)."
	}
	var b strings.Builder
	fmt.Fprintf(&b, "**Target** (a changed level in every other table within %v, p99): ", limit)
	switch {
	case r.NotConverged > 0:
		fmt.Fprintf(&b, "%d of %d changes did not reach every table within %v: **NOT met**", r.NotConverged, len(r.Probes), r.Setup.ProbeLimit)
	case r.AllP99Ms <= ms(limit):
		fmt.Fprintf(&b, "p99 %.0f ms over %d changes (max %.0f ms): **met**", r.AllP99Ms, len(r.Probes), r.AllMaxMs)
	default:
		fmt.Fprintf(&b, "p99 %.0f ms over %d changes (max %.0f ms): **NOT met**", r.AllP99Ms, len(r.Probes), r.AllMaxMs)
	}
	if len(r.Probes) < 100 {
		fmt.Fprintf(&b, ". With fewer than 100 changes (%d) the nearest-rank p99 is the maximum", len(r.Probes))
	}
	if !r.Joined {
		fmt.Fprintf(&b, ". The join did not converge (smallest table %d of %d after %.0f s), so the changes were measured on a partial cluster",
			r.JoinKnownMin, r.Setup.Nodes, r.JoinSeconds)
	}
	if len(r.Stuck) > 0 || r.LeaveStuck > 0 {
		fmt.Fprintf(&b, ". **%d members were stuck** after the changes (names.Gossip.Stats did not return within %v: it waits for memberlist's "+
			"node lock), %d did not finish Leave within %v; a stuck member neither relays nor applies announces",
			len(r.Stuck), s7StatsLimit, r.LeaveStuck, s7LeaveLimit)
	}
	if drops := r.Quiet.TableDrops + r.Changes.TableDrops; drops > 0 {
		fmt.Fprintf(&b, ". Tables lost a member %s (quiet %d, changes %d; smallest table %d): memberlist declared live members dead, "+
			"since nobody left", times(drops), r.Quiet.TableDrops, r.Changes.TableDrops, min(r.Quiet.MinTable, r.Changes.MinTable))
	}
	if c := r.Setup.Cores; c > 0 && max(r.Quiet.CPUCores, r.Changes.CPUCores) >= 0.85*float64(c) {
		fmt.Fprintf(&b, ". The members used %.2f (quiet) and %.2f (changes) of the machine's %d cores: they were short of CPU, which delays "+
			"gossip and probes (and makes probes time out); on %d hosts each member would have cores of its own",
			r.Quiet.CPUCores, r.Changes.CPUCores, c, r.Setup.Nodes)
	}
	return b.String() + "."
}

func s7Setup(g gossipSetup, quick bool) []string {
	out := []string{
		fmt.Sprintf("%d members of tpsched's name layer (scd/names: names.Join, one names.Table each, one service group \"%s\" each) in the "+
			"tpbench process, on 127.0.0.1, memberlist choosing each port; member i is seeded with member 0 and up to %d other earlier "+
			"members drawn at random (names.Join retries seeds that are not members every 2 s). No cluster_key.",
			g.Nodes, s7Group, g.Seeds-1),
		"Timing: GossipConfig{Fast: false}, the production timing: memberlist's LAN defaults with gossip every 100 ms to 4 members, " +
			"push/pull every 15 s, probes every 500 ms (timeout 250 ms); every member re-announces every 20 s without a change " +
			"(GossipConfig.Refresh default) and relays every announce it had not seen.",
		fmt.Sprintf("Join: from the first scdnames.Join until every table holds all %d members (Table.Len, read every %v).", g.Nodes, s7JoinInterval),
		fmt.Sprintf("Quiet: %v with no change (the refresh period is 20 s: a window of one period sees each member re-announce once). Then %d changes, one at a time: a "+
			"member drawn at random announces its group one level up (LEVEL0 -> 1 -> 2 -> 0); the time is from Announce until each other "+
			"table holds the new level (GossipConfig.OnChange reads the table; a table that has not after %v counts as not reached); "+
			"%v between changes.", g.Quiet, g.Probes, g.ProbeLimit, g.Gap),
		"Announce bytes are names.GossipStats.BytesSent (announce messages handed to memberlist's gossip, relays included, without " +
			"memberlist's own headers), summed over the members, per member per second. Loopback is the machine's /proc/net/dev 'lo' " +
			"transmit counters over the same time, per member: all of memberlist's traffic (probes, acks, gossip, push/pull) and anything " +
			"else that used loopback meanwhile, so an upper bound. CPU is this process's, all members together, on the machine's cores.",
		"Health: 'tables lost a member' counts each time a table dropped a member (memberlist declared it dead; nobody leaves in " +
			"these phases, so each is a false death, usually a probe that timed out for want of CPU); 'stuck' members are those whose " +
			"names.Gossip.Stats did not return within " + s7StatsLimit.String() + " at the phase's end (it waits for memberlist's node lock). " +
			"With all members on a few cores a run can tip into a state where probes time out for want of CPU, members are declared dead " +
			"and rejoin, and CPU and traffic rise; these columns show whether this run did.",
	}
	if quick {
		out = append(out, "Quick mode: a shorter quiet spell and fewer changes; for development only.")
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

// writeGossip writes S7: the figures, the traffic and each change.
func (r *report) writeGossip(b *strings.Builder) {
	g := r.Gossip
	b.WriteString("## Figures\n\n")
	join := fmt.Sprintf("%.1f s", g.JoinSeconds)
	if !g.Joined {
		join = fmt.Sprintf("not within %.0f s (smallest table %d)", g.JoinSeconds, g.JoinKnownMin)
	}
	b.WriteString("| figure | value |\n|---|---:|\n")
	rows := [][2]string{
		{"members", fmt.Sprint(g.Setup.Nodes)},
		{"join: every table holds every member", join},
		{"CPU while joining (this process)", fmt.Sprintf("%.2f cores", g.JoinCPUCores)},
		{"memberlist members per node after the changes (min / max)", fmt.Sprintf("%d / %d", g.MembersMin, g.MembersMax)},
		{"changes measured (not reaching every table)", fmt.Sprintf("%d (%d)", len(g.Probes), g.NotConverged)},
		{"until every other table holds a change: p50 / p99 / max", fmt.Sprintf("%.0f / %.0f / %.0f ms", g.AllP50Ms, g.AllP99Ms, g.AllMaxMs)},
		{"until one table holds it (pooled over tables and changes): p50 / p99 / max", fmt.Sprintf("%.0f / %.0f / %.0f ms", g.TableP50Ms, g.TableP99Ms, g.TableMaxMs)},
		{"announces dropped (all nodes, any reason)", fmt.Sprint(g.DroppedTotal)},
		{"members stuck after the changes (Stats not returning within " + s7StatsLimit.String() + ")", stuckList(g.Stuck)},
	}
	for _, row := range rows {
		fmt.Fprintf(b, "| %s | %s |\n", row[0], row[1])
	}
	b.WriteString("\n### Traffic\n\n")
	b.WriteString("| phase | seconds | announces sent | announce bytes / node / s | loopback bytes / node / s | loopback packets / node / s | " +
		"CPU (this process) | machine busy / steal | tables lost a member | smallest table | stuck members |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, t := range []struct {
		name string
		t    traffic
	}{{"quiet (refresh only)", g.Quiet}, {"changes", g.Changes}} {
		fmt.Fprintf(b, "| %s | %.1f | %.0f | %.0f | %.0f | %.1f | %.2f cores | %.2f / %.2f cores | %d | %d | %d |\n", t.name, t.t.Seconds,
			t.t.Announces, t.t.BytesPerNodeS, t.t.LoopbackBytesPerNodeS, t.t.LoopbackPktsPerNodeS, t.t.CPUCores, t.t.MachineCores, t.t.StealCores,
			t.t.TableDrops, t.t.MinTable, t.t.Stuck)
	}
	b.WriteString("\n### Each change\n\n| # | node | new level | tables reached | median | all |\n|---:|---|---|---:|---:|---:|\n")
	for i, p := range g.Probes {
		all := "-"
		if p.Seen == g.Setup.Nodes-1 {
			all = fmt.Sprintf("%.0f ms", p.AllMs)
		}
		fmt.Fprintf(b, "| %d | %s | %s | %d / %d | %.0f ms | %s |\n", i+1, p.Node, p.Level, p.Seen, g.Setup.Nodes-1, p.P50Ms, all)
	}
	b.WriteString("\n")
}
