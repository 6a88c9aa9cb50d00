package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"tpsched/scd/def"
)

// S6: inter-node balancing with one slow node. Three scdd nodes on
// 127.0.0.2, .3 and .4 serve the group "bench" with one resident uap-echo
// each; the third node's uap-echo runs with TPSCHED_ECHO_SLOWDOWN=3, so the
// same sleep call takes three times as long there. An open loop enters
// every node in turn at 70% of the three nodes' capacity; each node routes
// what it receives by its rule: at random (levels not announced), by
// OpenTP1's rule (random among the nodes not at LEVEL2) or by power of two
// choices on (level, in-flight). Each run starts the three nodes afresh.
// With -net lab the three nodes are in network namespaces of their own
// instead (net.go), the same lab for every run.

// S6 sizing.
const (
	s6SleepMs  = 2 // the sleep service's request: milliseconds (I/O-like, so the 2 cores do not blur the 3x)
	s6Slowdown = 3 // TPSCHED_ECHO_SLOWDOWN of the slow node's uap-echo
	s6Slow     = 2 // index of the slow node in S6IPs
	S6Load     = 0.7
	S6Queue    = def.DefaultQueueSize
	s6Carriers = 1024 // the random rule holds ~400 calls at the slow node's full queue
	s6Runs     = 5    // at least, in the full run: OpenTP1's rule varies from run to run
	s6Poll     = 100 * time.Millisecond
	// Each run: warm-up (the random rule fills the slow node's queue:
	// 256 calls at ~100/s more than it serves) and measured time (several
	// of OpenTP1's level cycles, one load check a second).
	s6Warmup        = 3 * time.Second
	s6Duration      = 10 * time.Second
	s6QuickWarmup   = 2 * time.Second
	s6QuickDuration = 4 * time.Second
	s6LoadCheck     = 1 // loadcheck_interval, seconds
)

var (
	// s6IPs are the nodes' addresses: one host each, as on three machines.
	s6IPs = []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}
	// Table 3-14 thresholds on the queue length q of one process: a fast
	// node at 80% (when the slow one is avoided: 400/s of 500/s) rarely
	// holds 8 and almost never 16; the slow node, offered 100/s more than
	// it serves, passes 16 within 0.2 s.
	S6LevelUp   = [2]int{8, 16}
	s6LevelDown = [2]int{2, 8}
)

// S6's systems: the same three nodes, three routing rules.
const (
	nameClusterRandom  = "random (announce N)"
	nameClusterOpenTP1 = "OpenTP1 rule"
	nameClusterP2C     = "P2C"
)

// clusterSetup is how S6 was run.
type clusterSetup struct {
	Network      string        `json:"network"` // "loopback", "lab", "lab, 1% loss"
	IPs          []string      `json:"ips"`
	Slow         int           `json:"slow_node"` // index into IPs
	Slowdown     int           `json:"slowdown"`
	SleepMs      int           `json:"sleep_ms"`
	NodeCapacity []float64     `json:"node_capacity_per_s"` // nominal: 1000 / (sleep ms x slowdown), one process each
	Capacity     float64       `json:"capacity_per_s"`
	Factor       float64       `json:"load_factor"`
	Rate         float64       `json:"offered_per_s"`
	Carriers     int           `json:"carriers"`
	Queue        int           `json:"queue_size"`
	LevelUp      [2]int        `json:"levelup_queue_count"`
	LevelDown    [2]int        `json:"leveldown_queue_count"`
	LoadCheck    int           `json:"loadcheck_interval_s"`
	Poll         time.Duration `json:"poll_ns"`
}

// clusterFigures are one S6 run's figures, or the median of the runs (each
// figure, and each node's, its own median).
type clusterFigures struct {
	Figures
	// Completed is the calls due in the window that were answered OK,
	// whenever they were, per second of the window. (Figures.Throughput
	// counts only answers within the window, so it also loses the calls
	// still queued at its end: with the slow node's full queue, 1.6 s of
	// them.)
	Completed float64 `json:"completed_per_s"`
	Due       float64 `json:"due"` // calls due in the window
	Refused   float64 `json:"refused"`
	Failed    float64 `json:"failed"`
	TimedOut  float64 `json:"timed_out"`
	// Per node, in the order of the setup's IPs, over the window: calls
	// the node's group processed per second (tpsched_requests_processed_total)
	// and their share of all three; calls it refused as busy.
	Served      []float64 `json:"served_per_s"`
	Share       []float64 `json:"served_share"`
	NodeRefused []float64 `json:"refused_by_node"`
	// Calls transferred from one node to another, all nodes, per second
	// (tpsched_forwarded_total).
	Transferred float64 `json:"transferred_per_s"`
	// Per node: the share of the window its group spent at LEVEL0, 1 and 2
	// by its own load check (tpsched_load_level, read every Poll), and its
	// level changes in the window.
	LevelTime    [][3]float64 `json:"level_time_share"`
	LevelChanges []float64    `json:"level_changes"`
	MachineCores float64      `json:"machine_busy_cores"` // the whole machine's busy CPU over the window
}

// clusterResult is one system's S6 runs.
type clusterResult struct {
	System string `json:"system"`
	Config string `json:"config"` // the scdsvcdef lines that differ
	runSet[clusterFigures]
	CDF []cdfPoint `json:"cdf,omitempty"` // of the drawn run (median p99)
}

type s6System struct{ name, sched string }

func s6Systems() []s6System {
	return []s6System{
		{nameClusterRandom, "scd_announce_server_status = N"},
		{nameClusterOpenTP1, "scd_announce_server_status = Y, scd_balance_rule = opentp1"},
		{nameClusterP2C, "scd_announce_server_status = Y, scd_balance_rule = p2c"},
	}
}

// schedLines turns "a = x, b = y" into set statements.
func (s s6System) schedLines() string {
	var b strings.Builder
	for _, kv := range strings.Split(s.sched, ", ") {
		fmt.Fprintf(&b, "set %s\n", kv)
	}
	return b.String()
}

// nominalCapacity is what one resident process serves per second when each
// call sleeps sleepMs x slowdown.
func nominalCapacity(sleepMs, slowdown int) float64 {
	return 1000 / float64(sleepMs*slowdown)
}

// cluster is three (or more) scdd nodes started as one system: the load
// enters each node in turn.
type cluster struct {
	*system
	RPC []string // each node's RPC address
	Ctl []string // each node's control address (/status, /metrics)
}

// startCluster starts one scdd per node of nn with the group "bench"
// (one resident uap-echo, the S6 load-check thresholds), the nodes'
// scdsvcdef lines sched, and TPSCHED_ECHO_SLOWDOWN=slowdown on node slow;
// it returns once every node knows all of them and a call goes through.
func startCluster(env Env, nn *nodeNet, name string, sched string, slow, slowdown, queue int) (*cluster, error) {
	s, err := newSystem(name)
	if err != nil {
		return nil, err
	}
	c := &cluster{system: s}
	ips := nn.ips
	ports, err := nn.ports(3)
	if err != nil {
		s.Stop()
		return nil, err
	}
	rpcPort, namePort, ctlPort := ports[0], ports[1], ports[2]
	uap, err := filepath.Abs(filepath.Join(env.Bin, "uap-echo"))
	if err != nil {
		s.Stop()
		return nil, err
	}
	scdd, err := filepath.Abs(filepath.Join(env.Bin, "scdd"))
	if err != nil {
		s.Stop()
		return nil, err
	}
	var all []string
	for _, ip := range ips {
		all = append(all, strconv.Quote(ip))
		c.RPC = append(c.RPC, net.JoinHostPort(ip, strconv.Itoa(rpcPort)))
		c.Ctl = append(c.Ctl, net.JoinHostPort(ip, strconv.Itoa(ctlPort)))
	}
	s.Addr = strings.Join(c.RPC, ",")
	s.dial = func(svc string) dialer { return roundRobinDialer(c.RPC, "bench", svc) }
	s.status = "http://" + c.Ctl[0] + "/status"
	_, err = launch(s, "echo", func() error {
		for i, ip := range ips {
			putenv := ""
			if i == slow && slowdown > 1 {
				putenv = fmt.Sprintf("putenv TPSCHED_ECHO_SLOWDOWN %d\n", slowdown)
			}
			dir := fmt.Sprintf("n%d", i)
			files := map[string]string{
				dir + "/sysconf": fmt.Sprintf("set node_id = \"n%d\"\nset rpc_address = %q\nset rpc_port = %d\nset name_port = %d\n"+
					"set metrics_address = %q\nset all_node = %s\n", i, ip, rpcPort, namePort, c.Ctl[i], strings.Join(all, ", ")),
				dir + "/scdsvcdef": sched,
				dir + "/usr/bench": fmt.Sprintf("set service_group = \"bench\"\nset service = \"echo=echo\", \"sleep=sleep\", \"pid=pid\"\n"+
					"set module = %q\nset parallel_count = 1\nset queue_size = %d\nset loadcheck_interval = %d\n"+
					"set levelup_queue_count = %d,%d\nset leveldown_queue_count = %d,%d\n%s",
					uap, queue, s6LoadCheck, S6LevelUp[0], S6LevelUp[1], s6LevelDown[0], s6LevelDown[1], putenv),
			}
			if err := writeFiles(s.dir, files); err != nil {
				return err
			}
			prog, args := nn.command(i, scdd, "-c", filepath.Join(s.dir, dir), "-log-level", "warn")
			if err := s.start(dir+".log", nil, prog, args...); err != nil {
				return err
			}
		}
		return c.waitJoined(len(ips), 30*time.Second)
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// waitJoined waits until every node's name table holds n nodes with the
// group "bench".
func (c *cluster) waitJoined(n int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for i, ctl := range c.Ctl {
		for {
			k, err := clusterNodesKnown("http://"+ctl+"/status", "bench")
			if err == nil && k == n {
				break
			}
			for _, p := range c.procs {
				if p.ProcessState != nil {
					return fmt.Errorf("%s: n%d exited: %v\n%s", c.Name, i, p.ProcessState, c.Log())
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: n%d knows %d of %d nodes after %v (%v)\n%s", c.Name, i, k, n, limit, err, c.Log())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// clusterNodesKnown counts the nodes a node's /status lists with group.
func clusterNodesKnown(url, group string) (int, error) {
	var st struct {
		Cluster *struct {
			Nodes []struct {
				Groups []struct {
					Group string `json:"group"`
				} `json:"groups"`
			} `json:"nodes"`
		} `json:"cluster"`
	}
	if err := getJSON(url, &st); err != nil {
		return 0, err
	}
	if st.Cluster == nil {
		return 0, errors.New("no cluster in /status (all_node not read?)")
	}
	n := 0
	for _, ns := range st.Cluster.Nodes {
		for _, g := range ns.Groups {
			if g.Group == group {
				n++
			}
		}
	}
	return n, nil
}

// rrCaller sends each call to the next node in turn.
type rrCaller struct {
	callers []caller
	next    int
}

// roundRobinDialer makes callers that hold one connection to each of addrs
// and send call i to addrs[(k+i) mod n], k counting the callers made, so
// the calls enter every node equally whichever connections are busy.
func roundRobinDialer(addrs []string, group, service string) dialer {
	var made atomic.Int64
	return func() caller {
		var cs []caller
		for _, a := range addrs {
			cs = append(cs, tpschedDialer(a, group, service)())
		}
		return roundRobin(cs, int(made.Add(1)-1))
	}
}

// roundRobin is a Caller that sends call i to callers[(start+i) mod n].
func roundRobin(callers []caller, start int) caller {
	return &rrCaller{callers: callers, next: start % len(callers)}
}

func (c *rrCaller) Call(payload []byte, deadline time.Time) (outcome, error) {
	i := c.next
	c.next = (c.next + 1) % len(c.callers)
	return c.callers[i].Call(payload, deadline)
}

func (c *rrCaller) Close() error {
	var errs []error
	for _, x := range c.callers {
		errs = append(errs, x.Close())
	}
	return errors.Join(errs...)
}

// levelSample is every node's own load level at one time (-1: not read).
type levelSample struct {
	At     time.Duration `json:"at_ns"`
	Levels []int         `json:"levels"`
}

// levelShares is the share of [from, to) each of n nodes spent at LEVEL0,
// 1 and 2. A reading holds from its time to the next; the one in force at
// from is the last at or before it (or, if none, the first). Time with the
// level not read counts toward no level.
func levelShares(samples []levelSample, n int, from, to time.Duration) [][3]float64 {
	out := make([][3]float64, n)
	s := slices.Clone(samples)
	slices.SortStableFunc(s, func(a, b levelSample) int { return cmpFloat(float64(a.At), float64(b.At)) })
	if len(s) == 0 || to <= from {
		return out
	}
	first := 0
	for i, x := range s {
		if x.At <= from {
			first = i
		}
	}
	span := float64(to - from)
	for i := first; i < len(s) && s[i].At < to; i++ {
		lo, hi := max(s[i].At, from), to
		if i+1 < len(s) {
			hi = min(s[i+1].At, to)
		}
		if i == first {
			lo = from
		}
		if hi <= lo {
			continue
		}
		for k := 0; k < n && k < len(s[i].Levels); k++ {
			if l := s[i].Levels[k]; l >= 0 && l <= 2 {
				out[k][l] += float64(hi-lo) / span
			}
		}
	}
	return out
}

// clusterRun runs the open loop on c, reading every node's /metrics at the
// window's edges and its load level every setup.Poll.
func clusterRun(ctx context.Context, c *cluster, o runOptions, setup clusterSetup) (clusterFigures, []cdfPoint, error) {
	n := len(c.Ctl)
	snap := func() ([]nodeMetrics, error) {
		out := make([]nodeMetrics, n)
		for i, ctl := range c.Ctl {
			m, err := readMetrics(ctl)
			// One try more: on this shared 2-core machine, loaded, a
			// node's answer now and then takes longer than
			// statusClient's second (on the lab, in a session's second
			// run: bench/results/2026-12-02-issue30-net; twice in a row
			// too, which this does not save), and a failed run costs
			// its rule every later run. The window's edge then moves by
			// up to that second, which its figures (per Duration) do
			// not see: a quarter of a quick run's 4 s at most, in the
			// rare run that tries again.
			if err != nil {
				m, err = readMetrics(ctl)
			}
			if err != nil {
				return nil, err
			}
			out[i] = m
		}
		return out, nil
	}
	// Every node's own level, as its /metrics says (-1: not read).
	stop := poll(ctx, setup.Poll, func() ([]int, bool) {
		levels := make([]int, n)
		for i, ctl := range c.Ctl {
			levels[i] = -1
			if m, err := readMetrics(ctl); err == nil {
				levels[i] = m.level
			}
		}
		return levels, true
	})
	roots, peers := c.Roots(), othersRoots(c.system)
	var (
		before, after           []nodeMetrics
		snapErr                 error
		cpuBefore, cpuAfter     cpuSample
		busyBefore, busyAfter   float64
		windowBegin, windowEnds time.Time
	)
	l := load{
		Dial:     c.Dialer("sleep"),
		Payload:  []byte(strconv.Itoa(setup.SleepMs)),
		Conns:    setup.Carriers,
		Warmup:   o.Warmup,
		Duration: o.Duration,
		Rate:     setup.Rate,
		Timeout:  o.Timeout,
		Window: func(begin bool) {
			m, err := snap()
			if err != nil {
				snapErr = err
			}
			if begin {
				windowBegin = time.Now()
				before = m
				cpuBefore = sampleCPU(roots, peers)
				busyBefore, _ = machineCPU()
				return
			}
			windowEnds = time.Now()
			after = m
			cpuAfter = sampleCPU(roots, peers)
			busyAfter, _ = machineCPU()
		},
	}
	res, err := openLoop(ctx, l)
	seen := stop()
	if err != nil {
		return clusterFigures{}, nil, err
	}
	if snapErr != nil {
		return clusterFigures{}, nil, fmt.Errorf("reading /metrics: %w", snapErr)
	}
	if before == nil || after == nil {
		return clusterFigures{}, nil, errors.New("the window's /metrics were not read")
	}
	secs := o.Duration.Seconds()
	cpu := splitCPU(cpuBefore, cpuAfter)
	f := clusterFigures{
		Figures:   figuresOf(res, o.Duration, true, cpu.server, cpu.self, 0),
		Completed: float64(res.Calls) / o.Duration.Seconds(),
		Due:       float64(res.Offered), Refused: float64(res.Refused), Failed: float64(res.Failed), TimedOut: float64(res.TimedOut),
	}
	if el := windowEnds.Sub(windowBegin).Seconds(); el > 0 {
		f.MachineCores = (busyAfter - busyBefore) / el
	}
	f.IdlePeersCPU, f.OtherCPU = cpu.cores(cpu.peers), cpu.cores(cpu.foreign)
	var total float64
	for i := range n {
		a, b := before[i], after[i]
		d := b.processed - a.processed
		f.Served = append(f.Served, d/secs)
		f.NodeRefused = append(f.NodeRefused, b.refusedBusy-a.refusedBusy)
		f.LevelChanges = append(f.LevelChanges, b.levelChanges-a.levelChanges)
		f.Transferred += (b.forwarded - a.forwarded) / secs
		total += d
	}
	for i := range n {
		share := 0.0
		if total > 0 {
			share = f.Served[i] * secs / total
		}
		f.Share = append(f.Share, share)
	}
	var samples []levelSample
	for _, x := range seen {
		samples = append(samples, levelSample{At: x.At.Sub(res.Begin), Levels: x.V})
	}
	f.LevelTime = levelShares(samples, n, o.Warmup, o.Warmup+o.Duration)
	return f, res.CDF, nil
}

// s6Target is the target: OpenTP1's rule or P2C with p99 at most
// this times random's.
const s6Target = 0.5

// clusterVerdict states the target against what was measured: each
// balancing rule's median p99 over random's, met if at most target; with
// the runs' ranges, and a warning when a rule refused or timed out more
// calls than random (p99 is of the calls answered).
func clusterVerdict(results []clusterResult, target float64) string {
	var random *clusterResult
	for i := range results {
		if results[i].System == nameClusterRandom && len(results[i].Runs) > 0 {
			random = &results[i]
		}
	}
	if random == nil {
		return "Target: not checked (the random system was not measured)."
	}
	span := func(runs []clusterFigures) (float64, float64) {
		lo, hi := runs[0].P99us, runs[0].P99us
		for _, r := range runs[1:] {
			lo, hi = min(lo, r.P99us), max(hi, r.P99us)
		}
		return lo, hi
	}
	rLo, rHi := span(random.Runs)
	var b strings.Builder
	fmt.Fprintf(&b, "**Target** (OpenTP1's rule or P2C: p99 at most %.1fx random's; medians): random p99 %s (runs %s-%s)", target,
		dur(random.Median.P99us), dur(rLo), dur(rHi))
	anyMet, checked := false, 0
	for _, r := range results {
		if r.System == nameClusterRandom || len(r.Runs) == 0 || random.Median.P99us == 0 {
			continue
		}
		checked++
		q := r.Median.P99us / random.Median.P99us
		ok := q <= target
		anyMet = anyMet || ok
		lo, hi := span(r.Runs)
		verdict := "NOT met"
		if ok {
			verdict = "met"
		}
		fmt.Fprintf(&b, "; %s p99 %s (runs %s-%s), %.2fx: %s", r.System, dur(r.Median.P99us), dur(lo), dur(hi), q, verdict)
		if hi/rLo > target && q <= target {
			fmt.Fprintf(&b, " (but its worst run is %.2fx random's best)", hi/rLo)
		}
		lost := func(f clusterFigures) float64 { return f.Refused + f.TimedOut + f.Failed }
		if lost(r.Median) > lost(random.Median) {
			fmt.Fprintf(&b, " (it lost more calls than random: %.0f refused, failed or timed out against %.0f, outside its p99)",
				lost(r.Median), lost(random.Median))
		}
	}
	switch {
	case checked == 0:
		b.WriteString("; no balancing rule measured.")
	case anyMet:
		b.WriteString(". **Target met.**")
	default:
		b.WriteString(". **Target NOT met.**")
	}
	return b.String()
}

// s6Timing is each S6 run's warm-up and measured time, and the runs per
// system.
func s6Timing(cfg Config, opts runOptions) runOptions {
	o := opts
	o.Warmup = given(cfg.S6Warmup, s6Warmup, s6QuickWarmup, cfg.Quick)
	o.Duration = given(cfg.S6Duration, s6Duration, s6QuickDuration, cfg.Quick)
	// OpenTP1's rule varies more from one run to the next (a fast node's
	// level flips now and then), so the full run takes at least S6Runs.
	o.Runs = cfg.Runs
	if !cfg.Quick {
		o.Runs = max(o.Runs, s6Runs)
	}
	return o
}

// s6RunTime is one S6 run's plan: three nodes started and joined, then
// the run.
func s6RunTime(o runOptions) time.Duration { return o.stepTime() + 3*startSlack }

// runS6 offers the same open-loop rate to the three rules, cfg.Runs times
// each, rotating which goes first, each run on three freshly started nodes.
func runS6(ctx context.Context, cfg Config, opts runOptions, newReport newReportFunc, loadgen string) error {
	factor := cfg.S6Load
	if factor <= 0 {
		factor = S6Load
	}
	o := s6Timing(cfg, opts)
	queue := cfg.S6Queue
	if queue <= 0 {
		queue = S6Queue
	}
	systems := selected(cfg, "S6", s6Systems(), func(s s6System) string { return s.name })
	if len(systems) == 0 {
		return nil
	}
	nn, err := openNet(cfg, s6IPs)
	if err != nil {
		return fmt.Errorf("S6: %w", err)
	}
	defer func() {
		if err := nn.close(); err != nil {
			fmt.Fprintf(cfg.Log, "S6: removing the network: %v\n", err)
		}
	}()
	setup := clusterSetup{Network: nn.short(), IPs: nn.ips, Slow: s6Slow, Slowdown: s6Slowdown, SleepMs: s6SleepMs, Carriers: s6Carriers,
		Queue: queue, LevelUp: S6LevelUp, LevelDown: s6LevelDown, LoadCheck: s6LoadCheck, Poll: s6Poll, Factor: factor}
	for i := range s6IPs {
		k := 1
		if i == s6Slow {
			k = s6Slowdown
		}
		c := nominalCapacity(s6SleepMs, k)
		setup.NodeCapacity = append(setup.NodeCapacity, c)
		setup.Capacity += c
	}
	setup.Rate = factor * setup.Capacity
	cfg.progress.begin(plan("S6", len(systems)*o.Runs, s6RunTime(o)))
	fmt.Fprintf(cfg.Log, "S6: sleep %d ms (x%d on n%d), open loop %.0f/s (%.2fx capacity %.0f/s), %v + %v per run, %d systems x %d runs, network %s\n",
		s6SleepMs, s6Slowdown, s6Slow, setup.Rate, factor, setup.Capacity, o.Warmup, o.Duration, len(systems), o.Runs, setup.Network)
	sr := systemsRun[clusterFigures, []cdfPoint]{id: "S6", runs: o.Runs, per: s6RunTime(o), drawn: p99Run,
		once: func(r, si int) (clusterFigures, []cdfPoint, error, error) {
			sys := systems[si]
			c, err := startCluster(cfg.Env, nn, sys.name, sys.schedLines(), s6Slow, s6Slowdown, queue)
			if err != nil {
				return clusterFigures{}, nil, err, nil
			}
			f, cdf, err := clusterRun(ctx, c, o, setup)
			c.Stop()
			if err != nil {
				return clusterFigures{}, nil, nil, err
			}
			fmt.Fprintf(cfg.Log, "  run %d %-20s %5.0f/s p50 %s p99 %s p99.9 %s refused %.0f timed out %.0f; served/s %s; slow node at LEVEL0/1/2 %s; transferred %.0f/s; machine %.2f cores\n",
				r+1, sys.name, f.Completed, dur(f.P50us), dur(f.P99us), dur(f.P999us), f.Refused, f.TimedOut,
				joinFloats(f.Served, "%.0f"), levelTimes(f.LevelTime, s6Slow), f.Transferred, f.MachineCores)
			return f, cdf, nil, nil
		}}
	for _, sys := range systems {
		sr.names = append(sr.names, sys.name)
	}
	ms, skipped, err := sr.measure(ctx, cfg)
	if err != nil {
		return err
	}
	var done []clusterResult
	for _, m := range ms {
		done = append(done, clusterResult{runSet: m.Set, System: m.System, Config: systems[m.Index].sched, CDF: m.drawnTrace()})
	}
	title := fmt.Sprintf("three nodes, one %d times slower: random, OpenTP1's rule and P2C at %.0f%% of capacity (%s)", s6Slowdown, 100*factor, setup.Network)
	return sr.reportOf(cfg, newReport, title, o, ms, skipped, func(rep *report) {
		rep.Cluster = &setup
		rep.ClusterResults = done
		rep.Setup = append([]string{nn.describe()}, s6Setup(setup, o, cfg.Quick, systems, loadgen)...)
		rep.Notes = append(rep.Notes, clusterVerdict(done, s6Target))
		if n := slowNotSlow(done, setup); n != "" {
			rep.Notes = append(rep.Notes, n)
		}
		rep.addPlot(plotClusterCDF(rep, cfg.Out))
	})
}

// slowNotSlow warns when, under the random rule (which offers the slow
// node a third of the load, more than it can serve), the slow node served
// well above its nominal capacity: the slowdown did not take.
func slowNotSlow(results []clusterResult, setup clusterSetup) string {
	for _, r := range results {
		if r.System != nameClusterRandom || setup.Slow >= len(r.Median.Served) {
			continue
		}
		got, want := r.Median.Served[setup.Slow], setup.NodeCapacity[setup.Slow]
		if got > 1.2*want {
			return fmt.Sprintf("**Warning**: under the random rule the slow node served %.0f/s, above its nominal %.0f/s: it was not %d times slower "+
				"(is bin/uap-echo built with TPSCHED_ECHO_SLOWDOWN?), so these figures do not measure S6.", got, want, setup.Slowdown)
		}
		msg := fmt.Sprintf("The slowdown took: under the random rule the slow node, offered a third of the load, served %.0f/s (nominal %.0f/s); "+
			"the fast nodes %s/s (nominal %.0f/s each).", got, want, joinFloats(slices.Delete(slices.Clone(r.Median.Served), setup.Slow, setup.Slow+1), "%.0f"),
			setup.NodeCapacity[(setup.Slow+1)%len(setup.NodeCapacity)])
		if got > 0 {
			msg += fmt.Sprintf(" Random's p99 is the wait in the slow node's full queue, queue_size / its rate = %d / %.0f/s = %s (measured %s): "+
				"it grows with queue_size, and so do the ratios' denominators; a shorter queue lowers random's p99 and raises its refusals.",
				setup.Queue, got, dur(float64(setup.Queue)/got*1e6), dur(r.Median.P99us))
		}
		return msg
	}
	return ""
}

func joinFloats(v []float64, format string) string {
	var s []string
	for _, x := range v {
		s = append(s, fmt.Sprintf(format, x))
	}
	return strings.Join(s, " / ")
}

func levelTimes(lt [][3]float64, node int) string {
	if node >= len(lt) {
		return "-"
	}
	return fmt.Sprintf("%.0f/%.0f/%.0f%%", 100*lt[node][0], 100*lt[node][1], 100*lt[node][2])
}

func s6Setup(g clusterSetup, o runOptions, quick bool, systems []s6System, loadgen string) []string {
	var nodes []string
	for i, ip := range g.IPs {
		what := "fast"
		if i == g.Slow {
			what = fmt.Sprintf("slow: putenv TPSCHED_ECHO_SLOWDOWN %d in its usr file, so uap-echo sleeps %d ms", g.Slowdown, g.SleepMs*g.Slowdown)
		}
		nodes = append(nodes, fmt.Sprintf("n%d %s (%s, %.0f/s)", i, ip, what, g.NodeCapacity[i]))
	}
	out := []string{
		fmt.Sprintf("Three scdd nodes (network: %s), %s, each a cluster member (all_node lists the three; memberlist with its production timing, no "+
			"-fast-failure-detection; no cluster_key), each serving the group \"bench\" with one resident uap-echo (parallel_count = 1), "+
			"queue_size = %d (256 is the default; a full queue answers 'server busy'), loadcheck_interval = %d, Table 3-14 thresholds "+
			"levelup_queue_count = %d,%d and leveldown_queue_count = %d,%d (LEVEL1 from 8 waiting calls, LEVEL2 from 16; back to LEVEL0 at 2 or fewer). "+
			"scd_this_node_first = N, schedule_rate = 50 (the defaults).",
			g.Network, strings.Join(nodes, ", "), g.Queue, g.LoadCheck, g.LevelUp[0], g.LevelUp[1], g.LevelDown[0], g.LevelDown[1]),
		fmt.Sprintf("Service: uap-echo's sleep, request \"%d\" (ms): I/O-like, so the three nodes sharing the machine's cores do not blur the slowdown. "+
			"Nominal capacity %.0f/s (one process each, 1000/%d + 1000/%d + 1000/%d; Go's sleep overshoots a little, so a bit less). "+
			"Open loop at %.0f/s (%.2fx), evenly spaced, carried by up to %d connections; each carrier holds a connection to every node "+
			"and sends its calls to them in turn, so every node is the entry point of a third of the calls and routes it by its rule. "+
			"Latency counts from the time a call was due; a call not answered %v after it was due times out.",
			g.SleepMs, g.Capacity, g.SleepMs, g.SleepMs, g.SleepMs*g.Slowdown, g.Rate, g.Factor, g.Carriers, o.Timeout),
		fmt.Sprintf("Each figure is the median of %d runs per system, rotating which system goes first; every run starts the three nodes afresh "+
			"(and waits until each knows all three) and lasts %v of warm-up and %v measured.", o.Runs, o.Warmup, o.Duration),
	}
	if quick {
		out = append(out, "Quick mode: shorter runs; for development only.")
	}
	for _, s := range systems {
		out = append(out, fmt.Sprintf("%s: %s.", s.name, s.sched))
	}
	out = append(out,
		"What a node does with a call that enters it (scd/route): random: uniform over the three nodes, itself included; OpenTP1's rule: "+
			"uniform over the nodes at the lowest level present by their last announce (Table 3-7's least-loaded rule: the carriers' calls are not "+
			"scheduler-direct, so schedule_rate does not weigh them; until issue 22 it did, and at 50 it weighed LEVEL0 and LEVEL1 alike); "+
			"P2C: draws two nodes and takes the lower (level, in flight), in flight being what this node has outstanding there (for itself, "+
			"its group's calls not yet answered). A transferred call is served where it lands. A node announces its level when its load "+
			"check (every second) changes it.",
		"Served/s and share per node are the increase of each node's tpsched_requests_processed_total{group=\"bench\"} over the window "+
			"(calls its uap-echo took from the queue, those skipped as already timed out included); refused by node is "+
			"tpsched_requests_refused_total{reason=\"busy\"}; transferred/s is tpsched_forwarded_total summed over the nodes. "+
			"Level time is each node's own tpsched_load_level, read every "+g.Poll.String()+", time-weighted over the window.",
		"p50/p99/p99.9 are of the calls answered OK; refused (a full queue answers 'server busy') and timed-out calls are counted apart, "+
			"as counts and shares of the calls due in the window. Completed/s is the calls due in the window answered OK (also after its end) "+
			"per second of the window. CPU/call is the three nodes' process trees (scdd and uap-echo) per call answered. Machine busy is "+
			"/proc/stat's busy time over the window, to spot a disturbed run by comparing runs; under this load of short wake-ups it reads "+
			"below the processes' own CPU (server and generator together), so it is not comparable with CPU/call.",
		loadgen,
	)
	return out
}

// plotClusterCDF draws S6's latency distributions.
func plotClusterCDF(r *report, dir string) (string, error) {
	if r.Cluster == nil {
		return "", nil
	}
	return plotRunCDFs(r, dir, gridCell{Service: "sleep", Conns: r.Cluster.Carriers, Open: true}, r.ClusterResults)
}

// writeCluster writes S6: the figures of each rule, each node's share
// and each run.
func (r *report) writeCluster(b *strings.Builder) {
	g := r.Cluster
	nodeHdr := func(what string) string {
		var h []string
		for i := range g.IPs {
			tag := ""
			if i == g.Slow {
				tag = " (slow)"
			}
			h = append(h, fmt.Sprintf("n%d%s", i, tag))
		}
		return what + " " + strings.Join(h, " / ")
	}
	b.WriteString("## Figures\n\n")
	fmt.Fprintf(b, "| system | offered/s | completed/s | refused | timed out | failed | p50 | p90 | p99 | p99.9 | p99 / random | %s | %s | %s | slow node at LEVEL0 / 1 / 2 | level changes (all nodes) | transferred/s | CPU/call |\n",
		nodeHdr("served/s"), nodeHdr("share"), nodeHdr("refused"))
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var randomP99 float64
	for _, res := range r.ClusterResults {
		if res.System == nameClusterRandom {
			randomP99 = res.Median.P99us
		}
	}
	for _, res := range r.ClusterResults {
		f := res.Median
		var shares []float64
		for _, s := range f.Share {
			shares = append(shares, 100*s)
		}
		var changes float64
		for _, c := range f.LevelChanges {
			changes += c
		}
		fmt.Fprintf(b, "| %s | %.0f | %.0f | %.0f (%s) | %.0f (%s) | %.0f | %s | %s | %s | %s | %s | %s | %s%% | %s | %s | %.0f | %.0f | %.0f us |\n",
			res.System, f.Offered, f.Completed, f.Refused, pct(f.RefusedShare), f.TimedOut, pct(f.TimeoutShare), f.Failed,
			dur(f.P50us), dur(f.P90us), dur(f.P99us), dur(f.P999us), ratio(f.P99us, randomP99),
			joinFloats(f.Served, "%.0f"), joinFloats(shares, "%.1f"), joinFloats(f.NodeRefused, "%.0f"),
			levelTimes(f.LevelTime, g.Slow), changes, f.Transferred, f.CPUus)
	}
	b.WriteString("\n")
	if len(r.ClusterResults) > 0 && r.Runs > 1 {
		b.WriteString("### Each run\n\n")
		fmt.Fprintf(b, "| system | run | completed/s | p50 | p99 | p99.9 | refused / timed out | %s | slow node at LEVEL0 / 1 / 2 | transferred/s | machine busy |\n", nodeHdr("served/s"))
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, res := range r.ClusterResults {
			for i, f := range res.Runs {
				drawn := ""
				if i == res.Drawn {
					drawn = " (plotted)"
				}
				fmt.Fprintf(b, "| %s | %d%s | %.0f | %s | %s | %s | %.0f / %.0f | %s | %s | %.0f | %.2f cores |\n",
					res.System, i+1, drawn, f.Completed, dur(f.P50us), dur(f.P99us), dur(f.P999us), f.Refused, f.TimedOut,
					joinFloats(f.Served, "%.0f"), levelTimes(f.LevelTime, g.Slow), f.Transferred, f.MachineCores)
			}
		}
		b.WriteString("\n")
	}
}

// p99Run is the run with the median p99: its latency distribution is drawn.
func p99Run(runs []clusterFigures) int {
	return medianRun(runs, func(f clusterFigures) float64 { return f.P99us })
}
