package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Figures are what one system did in one cell: of one run, or the median
// of the runs (each figure its own median).
type Figures struct {
	Offered      float64 `json:"offered_per_s,omitempty"` // open loop: calls due per second
	Throughput   float64 `json:"throughput_per_s"`        // calls answered OK per second
	P50us        float64 `json:"p50_us"`
	P90us        float64 `json:"p90_us"`
	P99us        float64 `json:"p99_us"`
	P999us       float64 `json:"p999_us"`
	MeanUs       float64 `json:"mean_us"`                 // Enduro/X: from calls/s and callers (Little's law), its tool reports no latency
	CPUus        float64 `json:"cpu_us_per_call"`         // server CPU (its whole process tree) per answered call
	LoadgenCPUus float64 `json:"loadgen_cpu_us_per_call"` // the load generator's own CPU per answered call
	PeakRSSKiB   float64 `json:"peak_rss_kib"`            // VmHWM summed over the server's processes during the run
	RefusedShare float64 `json:"refused_share"`           // of the calls made (or due, open loop)
	FailedShare  float64 `json:"failed_share"`
	TimeoutShare float64 `json:"timeout_share"`
	IdlePeersCPU float64 `json:"idle_peers_cores"`    // CPU of the other running systems (not measured now) over the window, in cores
	OtherCPU     float64 `json:"other_cores"`         // CPU of every other process on the machine (other tenants) over the window, in cores
	StealCPU     float64 `json:"steal_cores"`         // CPU stolen by the hypervisor over the window, in cores
	Disturbed    bool    `json:"disturbed,omitempty"` // other tenants and steal over the quiet bound in the window, or a window sampled short
	// Sampled is the share of the calls' window that the CPU and wake-up
	// samples covered, when other processes count the calls on their own
	// clocks (S10's callers); 0 when the harness counts them between its
	// samples. The per-call figures count the calls of that share.
	Sampled float64 `json:"sampled_share,omitempty"`
	// Wake-ups per answered call over the window: the context switches of
	// the server's processes and of the load generator's, voluntary (a
	// thread slept: a wait for a call, a reply, a lock) and involuntary (it
	// was preempted), and their system calls (-1: not counted).
	ServerVolCS     float64 `json:"server_voluntary_cs_per_call"`
	ServerInvolCS   float64 `json:"server_involuntary_cs_per_call"`
	ServerSyscalls  float64 `json:"server_syscalls_per_call"`
	LoadgenVolCS    float64 `json:"loadgen_voluntary_cs_per_call"`
	LoadgenInvolCS  float64 `json:"loadgen_involuntary_cs_per_call"`
	LoadgenSyscalls float64 `json:"loadgen_syscalls_per_call"`
}

// measurement is one system in one cell.
type measurement struct {
	System string     `json:"system"`
	Runs   []Figures  `json:"runs"`
	Median Figures    `json:"median"`
	CDF    []cdfPoint `json:"cdf,omitempty"` // latency distribution of the run with the median throughput
	Error  string     `json:"error,omitempty"`
	// Skipped says why the system is not measured in this cell (Enduro/X
	// past five callers).
	Skipped string `json:"not_measured,omitempty"`
	// Retried counts the runs made again because other tenants disturbed them.
	Retried int `json:"retried,omitempty"`
}

// gridCell is one point of a scenario's grid.
type gridCell struct {
	Service string        `json:"service"` // echo or burn
	Payload int           `json:"payload_bytes"`
	Conns   int           `json:"connections"`
	Open    bool          `json:"open_loop,omitempty"`
	Results []measurement `json:"results"`
}

// Result returns the measurement of system in the cell, or nil.
func (c *gridCell) Result(system string) *measurement {
	for i := range c.Results {
		if c.Results[i].System == system {
			return &c.Results[i]
		}
	}
	return nil
}

// report is one scenario's results, written as Markdown and JSON.
type report struct {
	Scenario string            `json:"scenario"`
	Title    string            `json:"title"`
	Date     string            `json:"date"`
	Machine  machineInfo       `json:"machine"`
	Setup    []string          `json:"setup"`
	Runs     int               `json:"runs"`
	Warmup   float64           `json:"warmup_s"`
	Duration float64           `json:"duration_s"`
	Systems  []string          `json:"systems"`
	Skipped  map[string]string `json:"skipped,omitempty"` // system -> why it is missing
	Cells    []gridCell        `json:"cells"`
	Notes    []string          `json:"notes,omitempty"`
	Plots    []string          `json:"plots,omitempty"`
	// S3: the load step and each system's figures (Cells is empty).
	Step        *stepLoad    `json:"step,omitempty"`
	StepResults []stepResult `json:"step_results,omitempty"`
	// S5: how it was run and each system's figures (Cells is empty).
	Guard        *guardSetup   `json:"guard,omitempty"`
	GuardResults []guardResult `json:"guard_results,omitempty"`
	// S6: the cluster and each balancing rule's figures (Cells is empty).
	Cluster        *clusterSetup   `json:"cluster,omitempty"`
	ClusterResults []clusterResult `json:"cluster_results,omitempty"`
	// S7: announce propagation over many nodes (Cells is empty).
	Gossip *gossipGrid `json:"gossip,omitempty"`
	// S8: skewed connections, hash against steering (Cells is empty).
	Skew        *skewSetup   `json:"skew,omitempty"`
	SkewResults []skewResult `json:"skew_results,omitempty"`
	// S9: a node restarted under load (Cells is empty).
	Restart        *restartSetup   `json:"restart,omitempty"`
	RestartResults []restartResult `json:"restart_results,omitempty"`
	// The grids' check on their own figures (S1, S2, S4).
	Validity *validity `json:"validity,omitempty"`
}

// machineInfo describes where the run happened.
type machineInfo struct {
	Cores  int               `json:"cores"`
	CPU    string            `json:"cpu"`
	Kernel string            `json:"kernel"`
	Go     string            `json:"go"`
	Peers  map[string]string `json:"peer_versions,omitempty"`
}

func (m machineInfo) String() string {
	return fmt.Sprintf("%d cores (%s), Linux %s, %s", m.Cores, m.CPU, m.Kernel, m.Go)
}

// thisMachine reads the machine's description.
func thisMachine() machineInfo {
	m := machineInfo{Cores: runtime.NumCPU(), Go: runtime.Version(), CPU: "unknown CPU"}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

// runOptions are the knobs of a measuring session.
type runOptions struct {
	Runs     int
	Warmup   time.Duration
	Duration time.Duration
	Timeout  time.Duration // open loop: per call
	Quiet    Quiet
	// PeersRunning keeps the systems not measured running during a run,
	// as every report before 2026-12-07 did; by default they are
	// stopped (holdOthers).
	PeersRunning bool
	Log          io.Writer
	progress     *progress // the session's, for its progress lines
	// syscalls counts every process's system calls (nil: not counted,
	// for the reason in syscallsOff).
	syscalls    *syscallCounter
	syscallsOff string
}

// stepTime is one run's plan: its warm-up, measured time and slack.
func (o runOptions) stepTime() time.Duration { return o.Warmup + o.Duration + stepSlack }

// measure runs every cell on every system, opts.Runs times, interleaved:
// in each cell, run r goes through the systems rotated by r (and reversed
// on odd runs), so no system always goes first or last. The cells go in
// order, all runs of one before the next, so a figure such as peak RSS is
// not raised by a larger cell measured in between. rate, if
// not nil, gives the open-loop rate of a system in a cell (0 = closed loop).
func measure(ctx context.Context, opts runOptions, systems []*system, cells []gridCell,
	rate func(system string, c *gridCell) float64) {
	for ci := range cells {
		c := &cells[ci]
		c.Results = make([]measurement, len(systems))
		for i, s := range systems {
			c.Results[i].System = s.Name
		}
	}
	type sample struct {
		fig Figures
		cdf []cdfPoint
	}
	samples := make([][][]sample, len(cells))
	for ci := range samples {
		samples[ci] = make([][]sample, len(systems))
	}
	for ci := range cells {
		c := &cells[ci]
		for r := range opts.Runs {
			for k := range systems {
				si := (k + r) % len(systems)
				if r%2 == 1 {
					si = len(systems) - 1 - si
				}
				s := systems[si]
				if ctx.Err() != nil {
					return
				}
				m := &c.Results[si]
				if m.Error != "" || m.Skipped != "" {
					continue
				}
				if s.skip != nil {
					if m.Skipped = s.skip(*c); m.Skipped != "" {
						continue
					}
				}
				var rt float64
				if rate != nil {
					rt = rate(s.Name, c)
				}
				fig, res, err := measureOne(ctx, opts, s, c, rt)
				last := fig
				kept, attempts := 1, 1 // which attempt's figures are fig, of how many
				for try := 0; err == nil && opts.Quiet.retry(last, try); try++ {
					fmt.Fprintf(opts.Log, "  run %d %-22s %-5s %6d B x %3d: attempt %d: %9.0f/s disturbed (other tenants %.2f cores, steal %.2f%s): again\n",
						r+1, s.Name, c.Service, c.Payload, c.Conns, attempts, last.Throughput, last.OtherCPU, last.StealCPU, sampledNote(last.Sampled))
					m.Retried++
					t0, usedBefore := time.Now(), opts.Quiet.used()
					f2, res2, err2 := measureOne(ctx, opts, s, c, rt)
					opts.Quiet.spendRetry(time.Since(t0), usedBefore)
					if err2 != nil {
						break
					}
					attempts++
					if last = f2; badness(f2) < badness(fig) {
						fig, res, kept = f2, res2, attempts
					}
				}
				if err == nil {
					fig.Disturbed = opts.Quiet.disturbed(fig)
				}
				if err != nil {
					m.Error = err.Error()
					fmt.Fprintf(opts.Log, "  run %d %-22s %-5s %6d B x %3d: error: %v\n", r+1, s.Name, c.Service, c.Payload, c.Conns, err)
					continue
				}
				samples[ci][si] = append(samples[ci][si], sample{fig, res.CDF})
				fmt.Fprintf(opts.Log, "  run %d %-22s %-5s %6d B x %3d: %9.0f/s p50 %8.1fus p99 %8.1fus mean %8.1fus cpu %6.1fus/call lg %5.1fus cs/call %.2f+%.2f lg %.2f+%.2f sys/call %.1f lg %.1f rss %6.0f MiB refused %4.1f%% idle peers %.2f other %.2f steal %.2f%s\n",
					r+1, s.Name, c.Service, c.Payload, c.Conns, fig.Throughput, fig.P50us, fig.P99us, fig.MeanUs, fig.CPUus, fig.LoadgenCPUus,
					fig.ServerVolCS, fig.ServerInvolCS, fig.LoadgenVolCS, fig.LoadgenInvolCS, fig.ServerSyscalls, fig.LoadgenSyscalls,
					fig.PeakRSSKiB/1024, 100*fig.RefusedShare, fig.IdlePeersCPU, fig.OtherCPU, fig.StealCPU,
					keptNote(kept, attempts, fig.Disturbed)+sampledNote(fig.Sampled))
			}
		}
		// Each system's runs of the cell are steps of the plan, also those
		// that failed (their time is spent either way).
		for range opts.Runs * len(systems) {
			opts.progress.step(opts.stepTime())
		}
		opts.progress.report(fmt.Sprintf("cell %d/%d (%s %s x %d) done", ci+1, len(cells), c.Service, payloadName(*c), c.Conns))
	}
	for ci := range cells {
		for si := range systems {
			m := &cells[ci].Results[si]
			ss := samples[ci][si]
			if len(ss) == 0 {
				continue
			}
			figs := make([]Figures, len(ss))
			for i, s := range ss {
				figs[i] = s.fig
			}
			m.Runs = figs
			m.Median = medianOf(figs)
			// The distribution drawn is that of the run whose throughput is the median.
			m.CDF = ss[medianRun(figs, func(f Figures) float64 { return f.Throughput })].cdf
		}
	}
}

// keptNote says, after a run's figures, which of its attempts they are
// when it was run again: the least disturbed, and whether that one still
// was. Nothing for a run made once.
func keptNote(kept, attempts int, disturbed bool) string {
	if attempts <= 1 {
		return ""
	}
	still := ""
	if disturbed {
		still = ", still disturbed"
	}
	return fmt.Sprintf(" (attempt %d of %d kept: the least disturbed%s)", kept, attempts, still)
}

// sampledNote says in the run's line how much of the callers' window the
// samples covered, when not all of it.
func sampledNote(share float64) string {
	if share <= 0 || share >= 0.995 {
		return ""
	}
	return fmt.Sprintf(" (the samples covered %.0f%% of the window)", 100*share)
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// cellPayload is the request a cell sends: for echo, Payload bytes; for
// burn, the decimal microseconds to burn.
func cellPayload(c *gridCell, burnMicros int) []byte {
	if c.Service == "burn" || c.Service == "cpu" {
		return []byte(fmt.Sprint(burnMicros))
	}
	p := make([]byte, c.Payload)
	for i := range p {
		p[i] = byte(i*7 + 1)
	}
	return p
}

// burnMicros is the CPU time of the S2 and S4 service.
const burnMicros = 200

func measureOne(ctx context.Context, opts runOptions, s *system, c *gridCell, rate float64) (Figures, result, error) {
	if !opts.PeersRunning {
		if err := holdOthers(s); err != nil {
			return Figures{}, result{}, err
		}
	}
	roots, peers := s.Roots(), othersRoots(s)
	if waited, other := waitQuiet(ctx, opts.Quiet, append(slices.Clone(roots), peers...)); waited > time.Second {
		fmt.Fprintf(opts.Log, "  waited %v for other tenants to go quiet (%.2f cores now)\n", waited.Round(100*time.Millisecond), other)
	}
	w := &window{server: roots, peers: peers, sys: opts.syscalls}
	var res result
	var err error
	switch {
	case s.drive != nil:
		// The load comes from processes of the system's own (S10's caller
		// UAPs, Enduro/X's exbenchcl): the driver runs them and samples
		// the window.
		res, err = s.drive(ctx, opts, c, w)
	default:
		l := load{
			Dial:     s.Dialer(c.Service),
			Payload:  cellPayload(c, burnMicros),
			Conns:    c.Conns,
			Warmup:   opts.Warmup,
			Duration: opts.Duration,
			Rate:     rate,
			Timeout:  opts.Timeout,
			Window: func(begin bool) {
				if begin {
					w.begin()
				} else {
					w.end()
				}
			},
		}
		if rate > 0 {
			res, err = openLoop(ctx, l)
		} else {
			res, err = closedLoop(ctx, l)
		}
	}
	if err != nil {
		return Figures{}, res, err
	}
	acc, err := w.attribute(res.Loadgen, res.Idle)
	if err != nil {
		return Figures{}, res, err
	}
	f := figuresOf(res, opts.Duration, rate > 0, acc.server.ticks, acc.loadgen.ticks, acc.rssKiB)
	f.perCall(acc, res.Calls+res.Refused+res.Failed, res.Sampled)
	f.Sampled = res.Sampled
	secs := acc.elapsed.Seconds()
	f.IdlePeersCPU, f.OtherCPU = float64(acc.peersTicks)/clockTicks/secs, float64(acc.otherTicks)/clockTicks/secs
	f.StealCPU = acc.stealSeconds / secs
	return f, res, nil
}

// figuresOf turns a run's result and accounting into figures.
func figuresOf(res result, window time.Duration, open bool, serverTicks, loadgenTicks uint64, rssKiB int64) Figures {
	answered := sampledCalls(res.Calls+res.Refused+res.Failed, res.Sampled)
	made := max(res.Offered, 1)
	perCall := func(ticks uint64) float64 {
		if answered <= 0 {
			return 0
		}
		return float64(ticks) / clockTicks * 1e6 / answered
	}
	f := Figures{
		Throughput:   res.Throughput,
		P50us:        us(res.Latency.P50),
		P90us:        us(res.Latency.P90),
		P99us:        us(res.Latency.P99),
		P999us:       us(res.Latency.P999),
		MeanUs:       us(res.Latency.Mean),
		CPUus:        perCall(serverTicks),
		LoadgenCPUus: perCall(loadgenTicks),
		PeakRSSKiB:   float64(rssKiB),
		RefusedShare: float64(res.Refused) / float64(made),
		FailedShare:  float64(res.Failed) / float64(made),
		TimeoutShare: float64(res.TimedOut) / float64(made),
	}
	if open {
		f.Offered = float64(res.Offered) / window.Seconds()
	}
	return f
}

func selfTicks() uint64 {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0
	}
	s, err := parseStat(b)
	if err != nil {
		return 0
	}
	return s.Utime + s.Stime
}
