package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"tpsched/netio/rpcport"
	"tpsched/scd/def"
)

// S5: the CPU guard. A CPU-bound service on a group that may grow to many
// more processes than there are cores, offered more than the cores can
// serve: tpsched with cpu_wait_limit at its default (the guard holds
// non-resident starts back while the group's processes already wait for a
// CPU) against the same definition with the guard off.

// S5 sizing.
const (
	s5Resident  = 1
	s5Max       = 16
	s5Balance   = 1
	S5WaitLimit = def.DefaultCPUWaitLimit
	S5Load      = 1.4
	S5Queue     = 32 // as S4: a full queue refuses ('server busy'), so latency stays bounded
	s5Poll      = 50 * time.Millisecond
	s5Runs      = 5 // at least, in the full run
	// Each run: warm-up (the group grows) and measured time.
	s5Warmup        = time.Second
	s5Duration      = 4 * time.Second
	s5QuickDuration = 2 * time.Second
)

// guardSetup is how S5 was run.
type guardSetup struct {
	Capacity     float64       `json:"capacity_per_s"`    // closed-loop throughput of tpsched with as many resident processes as cores
	CapacityFrom string        `json:"capacity_measured"` // where Capacity was measured
	Factor       float64       `json:"load_factor"`       // Rate / Capacity
	Rate         float64       `json:"offered_per_s"`     // the open-loop rate offered to both systems
	Carriers     int           `json:"carriers"`
	Queue        int           `json:"queue_size"`
	Poll         time.Duration `json:"poll_ns"` // how often /status was read
	WaitLimit    int           `json:"cpu_wait_limit"`
	Cores        int           `json:"cores"`
}

// statusSample is one reading of tpsched's /status during an S5 run: the
// group's processes and CPU figures and the node's scaling counters.
type statusSample struct {
	At          time.Duration `json:"at_ns"` // from the run's start
	Procs       int           `json:"processes"`
	QueueDepth  int           `json:"queue_depth"`
	WaitPct     int           `json:"runqueue_wait_percent"` // over the guard's last window; -1 unknown
	CPUSeconds  float64       `json:"cpu_seconds"`           // cumulative, ended processes included
	WaitSeconds float64       `json:"runqueue_wait_seconds"` // cumulative, ended processes included
	GuardHolds  uint64        `json:"cpu_guard_holds"`       // node-wide, cumulative
	Starts      uint64        `json:"nonresident_starts"`    // node-wide, cumulative
	// The whole machine's busy and stolen CPU seconds (/proc/stat),
	// cumulative: with the server's and the generator's own CPU, they
	// show what else ran on the cores.
	MachineBusy  float64 `json:"machine_busy_seconds"`
	MachineSteal float64 `json:"machine_steal_seconds"`
}

// nodeStatus is the part of tpsched's /status that S5 and S8 read.
type nodeStatus struct {
	Probes struct {
		Name      string `json:"name"`
		Histogram bool   `json:"histogram"`
		Reason    string `json:"reason"`
	} `json:"cpu_measurement"`
	Scaling struct {
		NonResidentStarts uint64 `json:"nonresident_starts"`
		NonResidentStops  uint64 `json:"nonresident_stops"`
		CPUGuardHolds     uint64 `json:"cpu_guard_holds"`
	} `json:"scaling"`
	// Steering: how each receiver group's new connections are placed (S8).
	Steering []rpcport.SteeringStatus `json:"steering"`
	Groups   []struct {
		statusGroup
		QueueDepth int `json:"queue_depth"`
		Usage      struct {
			Seconds     float64 `json:"cpu_seconds"`
			WaitSeconds float64 `json:"runqueue_wait_seconds"`
			WaitPercent int     `json:"runqueue_wait_percent"`
			WaitLimit   int     `json:"cpu_wait_limit"`
		} `json:"cpu"`
	} `json:"groups"`
}

// Sample takes group's figures out of a status (At is left 0). A group
// that is not there reads as no processes and an unknown wait.
func (st *nodeStatus) Sample(group string) statusSample {
	s := statusSample{WaitPct: -1, GuardHolds: st.Scaling.CPUGuardHolds, Starts: st.Scaling.NonResidentStarts}
	for _, g := range st.Groups {
		if g.Group != group {
			continue
		}
		s.Procs = countWorkers([]statusGroup{g.statusGroup}, group)
		s.QueueDepth = g.QueueDepth
		s.WaitPct = g.Usage.WaitPercent
		s.CPUSeconds = g.Usage.Seconds
		s.WaitSeconds = g.Usage.WaitSeconds
	}
	return s
}

func readStatus(url string) (*nodeStatus, error) {
	var st nodeStatus
	if err := getJSON(url, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// ProcFigures summarise the status samples of one run over its measured
// window.
type ProcFigures struct {
	MeanProcs float64 `json:"processes_mean"` // time-weighted over the window
	MaxProcs  float64 `json:"processes_max"`  // the most counted in the window
	PeakProcs float64 `json:"processes_peak"` // the most counted in the whole run, warm-up included
	// The guard's own runqueue_wait_percent as /status showed it: mean and
	// most of the readings in the window (-1: never known).
	MeanWaitPct float64 `json:"runqueue_wait_percent_mean"`
	MaxWaitPct  float64 `json:"runqueue_wait_percent_max"`
	// From the cumulative counters over the window: run-queue wait seconds
	// per second (how many of the group's processes were, on average,
	// runnable but waiting for a CPU), and the share of the processes'
	// runnable time (on a CPU or waiting for one) spent waiting.
	Waiting   float64 `json:"processes_waiting_mean"`
	WaitShare float64 `json:"runqueue_wait_share"`
	CPUCores  float64 `json:"cpu_seconds_per_s"` // the group's CPU seconds per second
	// Node-wide counter increases over the window, and their values at
	// the last reading (each run starts a node of its own, so that is the
	// whole run, warm-up included: the group grows then). cpu_guard_holds counts
	// the scaler's checks that wanted a start the guard held back; the
	// scaler checks on every enqueue, so it is a count of checks, not of
	// processes.
	GuardHolds    float64 `json:"cpu_guard_holds"`
	Starts        float64 `json:"nonresident_starts"`
	RunGuardHolds float64 `json:"run_cpu_guard_holds"`
	RunStarts     float64 `json:"run_nonresident_starts"`
	// The machine's busy and stolen CPU over the window, in cores.
	MachineCores float64 `json:"machine_busy_cores"`
	StealCores   float64 `json:"machine_steal_cores"`
}

// summarizeSamples derives ProcFigures from a run's samples for the window
// [from, to). A count holds from its sample to the next; the one in force
// at from is the last sample at or before it (or, if none, the first one).
// Counter increases are from the value in force at from to the last value
// at or before to; the Run counters are the last sample's values.
func summarizeSamples(samples []statusSample, from, to time.Duration) ProcFigures {
	f := ProcFigures{MeanWaitPct: -1, MaxWaitPct: -1}
	s := slices.Clone(samples)
	slices.SortStableFunc(s, func(a, b statusSample) int { return cmpFloat(float64(a.At), float64(b.At)) })
	if len(s) == 0 || to <= from {
		return f
	}
	for _, x := range s {
		f.PeakProcs = max(f.PeakProcs, float64(x.Procs))
	}
	// Each run has a node of its own, so its counters count from zero.
	f.RunGuardHolds, f.RunStarts = float64(s[len(s)-1].GuardHolds), float64(s[len(s)-1].Starts)
	// first is the sample in force at from; last the last one before to.
	first, last := 0, -1
	for i, x := range s {
		if x.At <= from {
			first = i
		}
		if x.At < to {
			last = i
		}
	}
	if last < first {
		return f
	}
	var area float64
	var span time.Duration
	for i := first; i <= last; i++ {
		lo, hi := max(s[i].At, from), to
		if i+1 < len(s) {
			hi = min(s[i+1].At, to)
		}
		if hi > lo {
			area += float64(s[i].Procs) * float64(hi-lo)
			span += hi - lo
		}
		if s[i].At >= from || i == first {
			f.MaxProcs = max(f.MaxProcs, float64(s[i].Procs))
		}
	}
	if span > 0 {
		f.MeanProcs = area / float64(span)
	}
	var pcts []float64
	for _, x := range s[first : last+1] {
		if x.At >= from && x.WaitPct >= 0 {
			pcts = append(pcts, float64(x.WaitPct))
		}
	}
	if len(pcts) > 0 {
		var sum float64
		for _, p := range pcts {
			sum += p
		}
		f.MeanWaitPct, f.MaxWaitPct = sum/float64(len(pcts)), slices.Max(pcts)
	}
	a, b := s[first], s[last]
	if el := (b.At - a.At).Seconds(); el > 0 {
		wait, cpu := b.WaitSeconds-a.WaitSeconds, b.CPUSeconds-a.CPUSeconds
		f.Waiting, f.CPUCores = wait/el, cpu/el
		if wait+cpu > 0 {
			f.WaitShare = wait / (wait + cpu)
		}
		f.MachineCores, f.StealCores = (b.MachineBusy-a.MachineBusy)/el, (b.MachineSteal-a.MachineSteal)/el
	}
	f.GuardHolds = float64(b.GuardHolds - min(a.GuardHolds, b.GuardHolds))
	f.Starts = float64(b.Starts - min(a.Starts, b.Starts))

	return f
}

// guardFigures are one S5 run's figures, or the median of the runs (each
// figure its own median).
type guardFigures struct {
	Figures
	ProcFigures
	// UAPCPUus is the group's CPU seconds over the window per call
	// answered OK: the cpu service spins for BurnMicros of its thread's CPU
	// time, so this is that plus the UAP's own overhead per call.
	UAPCPUus float64 `json:"uap_cpu_us_per_completed_call"`
	Due      float64 `json:"due"` // calls due in the window
	Refused  float64 `json:"refused"`
	Failed   float64 `json:"failed"`
	TimedOut float64 `json:"timed_out"`
}

// guardResult is one system's S5 runs.
type guardResult struct {
	System    string `json:"system"`
	Config    string `json:"config"`
	WaitLimit int    `json:"cpu_wait_limit"`
	Probes    string `json:"cpu_measurement"` // how scdd measured run-queue wait
	runSet[guardFigures]
	CDF     []cdfPoint       `json:"cdf,omitempty"`            // of the drawn run (median throughput)
	Samples [][]statusSample `json:"status_samples,omitempty"` // every run's, in the order of Runs
}

type s5System struct {
	name, config string
	limit        int
	start        func() (*system, error)
}

func s5Systems(env Env, sp Spec, limit int) []s5System {
	mk := func(name string, limit int) s5System {
		return s5System{name, fmt.Sprintf("parallel_count = %d,%d, balance_count = %d, cpu_wait_limit = %d, queue_size = %d",
			s5Resident, s5Max, s5Balance, limit, sp.Queue), limit,
			func() (*system, error) {
				return startTpschedGuard(env, sp, name, s5Resident, s5Max, s5Balance, limit)
			}}
	}
	on := nameTpschedGuard
	if limit != S5WaitLimit {
		on = fmt.Sprintf("%s %d", nameTpschedGuard, limit)
	}
	return []s5System{mk(on, limit), mk(nameTpschedGuardOff, 0)}
}

// s5Capacity is the closed-loop throughput of tpsched's cpu service with
// as many resident processes as cores, measured now (S2 and S4 measure the
// wall-clock burn, a different service).
func s5Capacity(ctx context.Context, cfg Config, opts runOptions, capacity map[string]float64, cores, queue int) (float64, string, error) {
	sp := Spec{Workers: cores, Front: cfg.Spec.Front, Queue: queue}
	// As S4: closed loop with fewer connections than the queue holds, so
	// nothing is refused.
	conns := max(queue/2, 1)
	fmt.Fprintf(cfg.Log, "S5: measuring capacity (tpsched, %d resident, cpu service, %d conns)\n", cores, conns)
	s, err := startTpsched(cfg.Env, sp)
	if err != nil {
		return 0, "", err
	}
	defer s.Stop()
	cells := []gridCell{{Service: "cpu", Conns: conns}}
	measure(ctx, opts, []*system{s}, cells, nil)
	m := cells[0].Results[0]
	if len(m.Runs) == 0 {
		return 0, "", fmt.Errorf("capacity run: %s", m.Error)
	}
	return m.Median.Throughput, fmt.Sprintf("tpsched's closed-loop cpu-service throughput with parallel_count = %d (resident, one per core), queue_size %d, %d connections, median of %d runs",
		cores, queue, conns, len(m.Runs)), nil
}

// s5Timing is each S5 run's warm-up and measured time, and the runs per
// system.
func s5Timing(cfg Config, opts runOptions) (runOptions, int) {
	o := opts
	o.Warmup = given(cfg.S5Warmup, s5Warmup, s5Warmup, cfg.Quick)
	o.Duration = given(cfg.S5Duration, s5Duration, s5QuickDuration, cfg.Quick)
	// The group's runs vary more from one to the next than a fixed pool's
	// (16 processes time-sharing 2 cores), so the full run takes at least
	// S5Runs of them.
	runs := cfg.Runs
	if !cfg.Quick {
		runs = max(runs, s5Runs)
	}
	return o, runs
}

// s5Plan is S5 on n systems: the capacity runs (capOpts), then runs of o
// per system, each on a node started afresh.
func s5Plan(n int, capOpts, o runOptions, runs int) scenarioPlan {
	return plan("S5", capOpts.Runs, capOpts.stepTime()).and(n*runs, o.stepTime()+startSlack)
}

// runS5 offers the same open-loop rate, above capacity, to tpsched with the
// CPU guard and without, cfg.Runs times each (at least S5Runs in the full
// run), alternating which goes first, each run on a freshly started node
// (one resident process, as after a quiet spell).
func runS5(ctx context.Context, cfg Config, opts runOptions, capacity map[string]float64,
	newReport newReportFunc, loadgen string) error {
	cores := thisMachine().Cores
	limit, factor, queue := cfg.S5WaitLimit, cfg.S5Load, cfg.S5Queue
	if limit <= 0 {
		limit = S5WaitLimit
	}
	if factor <= 0 {
		factor = S5Load
	}
	if queue <= 0 {
		queue = S5Queue
	}
	o, runs := s5Timing(cfg, opts)
	sp := Spec{Workers: s5Max, Front: cfg.Spec.Front, Queue: queue}
	systems := selected(cfg, "S5", s5Systems(cfg.Env, sp, limit), func(s s5System) string { return s.name })
	if len(systems) == 0 {
		return nil
	}
	capOpts := opts
	capOpts.Runs = cfg.Runs
	cfg.progress.begin(s5Plan(len(systems), capOpts, o, runs))
	capRate, capFrom, err := s5Capacity(ctx, cfg, capOpts, capacity, cores, queue)
	if err != nil {
		return fmt.Errorf("S5: %w", err)
	}
	setup := guardSetup{Capacity: capRate, CapacityFrom: capFrom, Factor: factor, Rate: factor * capRate,
		Carriers: s4Carriers, Queue: queue, Poll: s5Poll, WaitLimit: limit, Cores: cores}
	fmt.Fprintf(cfg.Log, "S5: cpu %d us, open loop %.0f/s (%.2fx capacity %.0f/s), %v + %v per run, %d systems x %d runs\n",
		burnMicros, setup.Rate, factor, capRate, o.Warmup, o.Duration, len(systems), runs)
	type drawn struct {
		cdf     []cdfPoint
		samples []statusSample
		probes  string
	}
	sr := systemsRun[guardFigures, drawn]{id: "S5", runs: runs, per: o.stepTime() + startSlack, drawn: throughputRun,
		once: func(r, si int) (guardFigures, drawn, error, error) {
			s, err := systems[si].start()
			if err != nil {
				return guardFigures{}, drawn{}, err, nil
			}
			f, d, probes, err := guardRun(ctx, s, o, setup)
			s.Stop()
			if err != nil {
				return guardFigures{}, drawn{}, nil, err
			}
			fmt.Fprintf(cfg.Log, "  run %d %-20s %6.0f/s p50 %s p99 %s refused %.0f timed out %.0f; processes mean %.1f max %.0f peak %.0f; wait%% mean %.0f max %.0f, waiting %.2f; holds %.0f (run %.0f), starts %.0f (run %.0f); UAP cpu %.0fus/completed call; machine busy %.2f cores, other %.2f, steal %.2f\n",
				r+1, systems[si].name, f.Throughput, dur(f.P50us), dur(f.P99us), f.Refused, f.TimedOut, f.MeanProcs, f.MaxProcs, f.PeakProcs,
				f.MeanWaitPct, f.MaxWaitPct, f.Waiting, f.GuardHolds, f.RunGuardHolds, f.Starts, f.RunStarts, f.UAPCPUus,
				f.MachineCores, f.OtherCPU, f.StealCores)
			return f, drawn{d.CDF, d.samples, probes}, nil, nil
		}}
	for _, sys := range systems {
		sr.names = append(sr.names, sys.name)
	}
	ms, skipped, err := sr.measure(ctx, cfg)
	if err != nil {
		return err
	}
	var done []guardResult
	for _, m := range ms {
		sys := systems[m.Index]
		res := guardResult{runSet: m.Set, System: m.System, Config: sys.config, WaitLimit: sys.limit}
		res.CDF = m.drawnTrace().cdf
		res.Probes = m.Traces[len(m.Traces)-1].probes
		for _, t := range m.Traces {
			res.Samples = append(res.Samples, t.samples)
		}
		done = append(done, res)
	}
	o.Runs = runs
	title := fmt.Sprintf("the CPU guard: a CPU-bound service offered %.1fx capacity on a group of %d to %d processes", factor, s5Resident, s5Max)
	return sr.reportOf(cfg, newReport, title, o, ms, skipped, func(rep *report) {
		rep.Guard = &setup
		rep.GuardResults = done
		rep.Setup = s5Setup(setup, o, cfg.Quick, systems, loadgen)
		if v := guardVerdict(done, cores, s5Max); v != "" {
			rep.Notes = append(rep.Notes, v)
		}
		rep.addPlot(plotGuardSeries(rep, cfg.Out, "processes"))
		rep.addPlot(plotGuardSeries(rep, cfg.Out, "wait"))
		rep.addPlot(plotGuardCDF(rep, cfg.Out))
	})
}

type guardTrace struct {
	CDF     []cdfPoint
	samples []statusSample
}

// guardRun runs the open loop on s, reading its /status every setup.Poll.
func guardRun(ctx context.Context, s *system, o runOptions, setup guardSetup) (guardFigures, guardTrace, string, error) {
	if s.status == "" {
		return guardFigures{}, guardTrace{}, "", fmt.Errorf("%s: no /status", s.Name)
	}
	st, err := readStatus(s.status)
	if err != nil {
		return guardFigures{}, guardTrace{}, "", err
	}
	probes := st.Probes.Name
	if st.Probes.Reason != "" {
		probes += " (" + st.Probes.Reason + ")"
	}
	stop := poll(ctx, setup.Poll, func() (statusSample, bool) {
		st, err := readStatus(s.status)
		if err != nil {
			return statusSample{}, false
		}
		x := st.Sample("bench")
		x.MachineBusy, x.MachineSteal = machineCPU()
		return x, true
	})
	cell := gridCell{Service: "cpu", Conns: setup.Carriers, Open: true}
	fig, res, err := measureOne(ctx, o, s, &cell, setup.Rate)
	seen := stop()
	if err != nil {
		return guardFigures{}, guardTrace{}, probes, err
	}
	var samples []statusSample
	for _, x := range seen {
		x.V.At = x.At.Sub(res.Begin)
		samples = append(samples, x.V)
	}
	f := guardFigures{Figures: fig, ProcFigures: summarizeSamples(samples, o.Warmup, o.Warmup+o.Duration),
		Due: float64(res.Offered), Refused: float64(res.Refused), Failed: float64(res.Failed), TimedOut: float64(res.TimedOut)}
	if f.Throughput > 0 {
		f.UAPCPUus = f.CPUCores * 1e6 / f.Throughput
	}
	return f, guardTrace{res.CDF, samples}, probes, nil
}

func s5Setup(g guardSetup, o runOptions, quick bool, systems []s5System, loadgen string) []string {
	out := []string{
		fmt.Sprintf("Service: uap-echo's cpu, %d us of its thread's CPU time per call. Open loop: both systems are offered the same %.0f calls/s, %.2fx the capacity (%.0f/s: %s), "+
			"evenly spaced from the first moment of the run (a step from nothing), carried by up to %d connections; latency counts from the time a "+
			"call was due, a call not answered %v after it was due times out.", burnMicros, g.Rate, g.Factor, g.Capacity, g.CapacityFrom, g.Carriers, o.Timeout),
		fmt.Sprintf("Each figure is the median of %d runs per system, alternating which system goes first; every run starts its node afresh "+
			"(one resident process, as after a quiet spell) and lasts %v of warm-up, in which the group grows, and %v measured.", o.Runs, o.Warmup, o.Duration),
	}
	if quick {
		out = append(out, "Quick mode: shorter runs; for development only.")
	}
	for _, s := range systems {
		out = append(out, fmt.Sprintf("%s: %s.", s.name, s.config))
	}
	out = append(out,
		fmt.Sprintf("balance_count %d: a non-resident process starts while the waiting calls exceed balance_count x running processes, so an "+
			"overloaded queue asks for all %d processes. cpu_wait_limit (default %d): procmgr starts none while the group's processes, on "+
			"average, spent that percent or more of the guard's last window (20 ms or more) runnable but waiting for a CPU (eBPF sched_switch/"+
			"sched_wakeup); 0 turns the guard off. Non-resident processes idle 500 ms (the default) before they stop, which under this load they never do.",
			s5Balance, s5Max, S5WaitLimit),
		fmt.Sprintf("Bounded queue: queue_size %d, as in S4: a call that finds it full is refused ('server busy'), so latency stays bounded and "+
			"the excess shows as refusals. Completed/s counts calls answered OK within the window; refused, failed and timed out are counts "+
			"(and shares) of the calls due in the window.", g.Queue),
		fmt.Sprintf("/status is read every %v. Processes are the group's processes with a pid (resident and non-resident, any state): "+
			"mean is time-weighted over the measured window, max the most read in it, peak the most in the whole run. "+
			"runqueue_wait_percent is the guard's own figure as /status showed it (mean and most of the readings in the window). "+
			"'Waiting' is the increase of the group's runqueue_wait_seconds over the window per second; 'wait share' is that wait over wait + "+
			"cpu_seconds; 'group CPU' is the group's cpu_seconds per second. cpu_guard_holds (node-wide: checks of the scaler in which the "+
			"guard held a wanted start back) and non-resident starts are increases over the window / over the whole run.", g.Poll),
		fmt.Sprintf("The cpu service spins until its thread has used %d us of CPU time, so a call preempted mid-way still costs what it says "+
			"(uap-echo's burn, used by S2 and S4, spins for wall time instead and lets more processes than cores finish calls having done "+
			"less work). 'UAP CPU/completed call' is the group's cpu_seconds over the window per call answered OK: %d us plus the UAP's "+
			"own overhead. CPU/call is the server's whole process tree (scdd too) per call answered, refused ones included.", burnMicros, burnMicros),
		"Machine busy / other / steal (each run, in cores): the whole machine's busy CPU over the window from /proc/stat (tick-sampled, "+
			"so under short wake-ups it reads below the processes' own CPU); 'other' is the CPU of every process that is not the benchmark's "+
			"(other tenants), from /proc/<pid>/stat; steal is time the hypervisor gave elsewhere. A run with 'other' above 0.1 cores was disturbed.",
		loadgen,
	)
	return out
}

// guardVerdict states the expectation against what was measured:
// with the guard the processes stay near the core count (mean at most 2x
// cores), completed calls/s no lower and p99 lower than with it off; with
// the run-to-run ranges, how many runs the guard held the group near the
// cores, and, when only some runs stayed below maxProcs, the figures of
// each kind of run.
func guardVerdict(results []guardResult, cores, maxProcs int) string {
	var on, off *guardResult
	for i := range results {
		r := &results[i]
		if r.WaitLimit > 0 && on == nil {
			on = r
		}
		if r.WaitLimit == 0 {
			off = r
		}
	}
	if on == nil || off == nil || len(on.Runs) == 0 || len(off.Runs) == 0 {
		return "Expectation: not checked (both systems are needed)."
	}
	a, b := on.Median, off.Median
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	near := float64(2 * cores)
	held := 0
	for _, f := range on.Runs {
		if f.MeanProcs <= near {
			held++
		}
	}
	span := func(runs []guardFigures, f func(guardFigures) float64) (float64, float64) {
		lo, hi := f(runs[0]), f(runs[0])
		for _, r := range runs[1:] {
			lo, hi = min(lo, f(r)), max(hi, f(r))
		}
		return lo, hi
	}
	thr := func(f guardFigures) float64 { return f.Throughput }
	p99 := func(f guardFigures) float64 { return f.P99us }
	aLo, aHi := span(on.Runs, thr)
	bLo, bHi := span(off.Runs, thr)
	pLo, pHi := span(on.Runs, p99)
	qLo, qHi := span(off.Runs, p99)
	var b2 strings.Builder
	fmt.Fprintf(&b2, "**Expectation** (%s against %s, medians): processes with the guard %.1f on average, %.0f at most "+
		"(near the %d cores, mean at most %.0f: %s; without: %.1f, %.0f at most); completed calls/s %.0f vs %.0f (%s; no lower: %s); "+
		"p99 %s vs %s (%s; lower: %s).",
		on.System, off.System, a.MeanProcs, a.MaxProcs, cores, near, verdict(a.MeanProcs <= near), b.MeanProcs, b.MaxProcs,
		a.Throughput, b.Throughput, ratio(a.Throughput, b.Throughput), verdict(a.Throughput >= b.Throughput),
		dur(a.P99us), dur(b.P99us), ratio(a.P99us, b.P99us), verdict(a.P99us < b.P99us))
	fmt.Fprintf(&b2, " The guard kept the group near the cores in %d of %d runs; it held starts back (cpu_guard_holds above 0 over the run) in %d.",
		held, len(on.Runs), countIf(on.Runs, func(f guardFigures) bool { return f.RunGuardHolds > 0 }))
	fmt.Fprintf(&b2, " Run to run, completed/s ranged %.0f-%.0f with the guard and %.0f-%.0f without; p99 %s-%s and %s-%s",
		aLo, aHi, bLo, bHi, dur(pLo), dur(pHi), dur(qLo), dur(qHi))
	if aLo <= bHi && bLo <= aHi || pLo <= qHi && qLo <= pHi {
		b2.WriteString(": the ranges overlap, so a difference of the medians is not established by these runs")
	}
	b2.WriteString(".")
	// The guard's runs fall in two kinds: held below the maximum, or grown
	// to it as without the guard. Each kind's medians, and each held run
	// against the run without the guard of the same round.
	below := countIf(on.Runs, func(f guardFigures) bool { return f.PeakProcs < float64(maxProcs) })
	if below == 0 {
		fmt.Fprintf(&b2, " In every run the guard's group grew to the %d processes it grows to without the guard, so the differences above are "+
			"not the guard's doing.", maxProcs)
		return b2.String()
	}
	if below == len(on.Runs) {
		return b2.String()
	}
	var in, out []guardFigures
	var pairs []string
	for i, f := range on.Runs {
		if f.PeakProcs >= float64(maxProcs) {
			out = append(out, f)
			continue
		}
		in = append(in, f)
		if len(on.Runs) == len(off.Runs) {
			g := off.Runs[i]
			pairs = append(pairs, fmt.Sprintf("run %d: %.0f vs %.0f/s (%s), p99 %s vs %s (%s)", i+1, f.Throughput, g.Throughput,
				ratio(f.Throughput, g.Throughput), dur(f.P99us), dur(g.P99us), ratio(f.P99us, g.P99us)))
		}
	}
	mi, mo := medianOf(in), medianOf(out)
	fmt.Fprintf(&b2, " **By outcome**: in the %d runs where the guard held the group below the maximum (%.1f processes), completed/s %.0f and p99 %s "+
		"(medians); in the %d where it grew to the maximum (%.1f processes), %.0f/s and p99 %s; without the guard %.0f/s and p99 %s.",
		len(in), mi.MeanProcs, mi.Throughput, dur(mi.P99us), len(out), mo.MeanProcs, mo.Throughput, dur(mo.P99us), b.Throughput, dur(b.P99us))
	if len(pairs) > 0 {
		fmt.Fprintf(&b2, " Held runs against the same round without the guard: %s.", strings.Join(pairs, "; "))
	}
	return b2.String()
}

func countIf(runs []guardFigures, ok func(guardFigures) bool) int {
	n := 0
	for _, r := range runs {
		if ok(r) {
			n++
		}
	}
	return n
}

// writeGuard writes S5: the figures of each system and each run.
func (r *report) writeGuard(b *strings.Builder) {
	b.WriteString("## Figures\n\n")
	b.WriteString("| system | cpu_wait_limit | offered/s | completed/s | refused | failed | timed out | p50 | p90 | p99 | p99.9 | " +
		"processes mean / max / peak | runqueue_wait_percent mean / max | waiting | wait share | group CPU | UAP CPU/completed call | CPU/call | " +
		"cpu_guard_holds window / run | non-resident starts window / run | measured by |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	waitsOver := false
	for _, res := range r.GuardResults {
		f := res.Median
		fmt.Fprintf(b, "| %s | %d | %.0f | %.0f | %.0f (%s) | %.0f | %.0f (%s) | %s | %s | %s | %s | %.1f / %.0f / %.0f | %s / %s | %.2f | %s | %.2f cores | %.0f us | %.0f us | %.0f / %.0f | %.0f / %.0f | %s |\n",
			res.System, res.WaitLimit, f.Offered, f.Throughput, f.Refused, pct(f.RefusedShare), f.Failed, f.TimedOut, pct(f.TimeoutShare),
			dur(f.P50us), dur(f.P90us), dur(f.P99us), dur(f.P999us), f.MeanProcs, f.MaxProcs, f.PeakProcs,
			waitPct(f.MeanWaitPct), waitPct(f.MaxWaitPct), f.Waiting, pct(f.WaitShare), f.CPUCores, f.UAPCPUus, f.CPUus,
			f.GuardHolds, f.RunGuardHolds, f.Starts, f.RunStarts, oneLine(res.Probes))
		for _, x := range res.Runs {
			if x.Waiting > x.MaxProcs && x.MaxProcs > 0 {
				waitsOver = true
			}
		}
	}
	b.WriteString("\n")
	if len(r.GuardResults) > 0 && r.Runs > 1 {
		b.WriteString("### Each run\n\n")
		b.WriteString("| system | run | completed/s | p50 | p99 | refused / timed out | processes mean / max | runqueue_wait_percent mean / max | waiting | " +
			"UAP CPU/completed call | cpu_guard_holds window / run | starts window / run | machine busy / other / steal |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, res := range r.GuardResults {
			for i, f := range res.Runs {
				drawn := ""
				if i == res.Drawn {
					drawn = " (plotted)"
				}
				fmt.Fprintf(b, "| %s | %d%s | %.0f | %s | %s | %.0f / %.0f | %.1f / %.0f | %s / %s | %.2f | %.0f us | %.0f / %.0f | %.0f / %.0f | %.2f / %.2f / %.2f |\n",
					res.System, i+1, drawn, f.Throughput, dur(f.P50us), dur(f.P99us), f.Refused, f.TimedOut, f.MeanProcs, f.MaxProcs,
					waitPct(f.MeanWaitPct), waitPct(f.MaxWaitPct), f.Waiting, f.UAPCPUus, f.GuardHolds, f.RunGuardHolds, f.Starts, f.RunStarts,
					f.MachineCores, f.OtherCPU, f.StealCores)
			}
		}
		b.WriteString("\n")
	}
	if waitsOver {
		b.WriteString("'Waiting' above the number of processes: the probes count run-queue wait per thread and add it to the thread's process, " +
			"so a process with several runnable threads (uap-echo is a Go program: its runtime has threads of its own) waits more than once at a time.\n\n")
	}
}

func waitPct(v float64) string {
	if v < 0 {
		return "unknown"
	}
	return fmt.Sprintf("%.0f%%", v)
}

// parseProcStatCPU reads the first line of /proc/stat (all CPUs) and
// returns the busy seconds (user, nice, system, irq, softirq) and the
// stolen ones.
func parseProcStatCPU(b []byte) (busy, steal float64, err error) {
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("bench: /proc/stat: want a cpu line with 8 times, got %q", line)
	}
	var v [8]float64
	for i := range v {
		n, err := strconv.ParseUint(f[i+1], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("bench: /proc/stat: %w", err)
		}
		v[i] = float64(n) / clockTicks
	}
	// user nice system idle iowait irq softirq steal
	return v[0] + v[1] + v[2] + v[5] + v[6], v[7], nil
}

func machineCPU() (busy, steal float64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	busy, steal, _ = parseProcStatCPU(b)
	return busy, steal
}

// throughputRun is the run with the median throughput: its latency
// distribution is drawn.
func throughputRun(runs []guardFigures) int {
	return medianRun(runs, func(f guardFigures) float64 { return f.Throughput })
}
