package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Config is one benchmark session: which scenarios, how long, where to.
type Config struct {
	Env       Env
	Out       string   // directory for the reports
	Quick     bool     // the development grid
	Scenarios []string // of S1 to S10
	Runs      int
	Warmup    time.Duration
	Duration  time.Duration
	Spec      Spec // S1 and S2 sizing; S4 uses Spec with a small Queue
	S4Queue   int
	// S5: the guarded system's cpu_wait_limit, the offered rate as a
	// multiple of capacity, and each run's warm-up and measured time.
	S5WaitLimit int
	S5Load      float64
	S5Warmup    time.Duration
	S5Duration  time.Duration
	S5Queue     int // queue_size of S5's systems
	// S6: the offered rate as a share of the three nodes' capacity, and
	// each run's warm-up and measured time (0: the defaults).
	S6Load     float64
	S6Warmup   time.Duration
	S6Duration time.Duration
	S6Queue    int // queue_size on every node (0: the default, 256)
	// S7: the member counts, runs of each, changes measured and the quiet
	// spell (empty or 0: the defaults); the real scdd nodes (0: the
	// default, -1: none); the simulation's node counts (empty: the
	// default) or none.
	S7Sizes    []int
	S7Runs     int
	S7Probes   int
	S7Quiet    time.Duration
	S7Real     int
	S7SimNodes []int
	S7SimOff   bool
	// Net is where S6's nodes and S7's real scdd nodes run: NetLoopback
	// ("" too) or NetLab, with NetLoss percent of the packets between
	// two nodes dropped on the lab (net.go).
	Net     string
	NetLoss float64
	// S8: receiving sockets and heavy connections (0: the defaults).
	S8Receivers int
	S8Heavy     int
	Systems     []string // only these systems (by report name); empty: all
	Quiet       Quiet    // keeping other tenants out of the figures
	// PeersRunning keeps the systems not measured running during a run
	// (runOptions.PeersRunning).
	PeersRunning bool
	// CountSyscalls counts every process's system calls in the kernel (an
	// eBPF program; root), for the reports' system calls per call.
	CountSyscalls bool
	// Compare is the other grid's reports (a directory) or one report:
	// S1, S2 and S4 flag the systems that moved between the two grids
	// beyond the noise. Empty: the quick grid compares with the full one
	// in the parent of Out, the full grid with Out/quick.
	Compare string
	Log     io.Writer
	// progress is the session's, made by Run.
	progress *progress
}

// selected is those of list the session measures (Systems, or all).
func (cfg Config) selected(list []string) []string {
	if len(cfg.Systems) == 0 {
		return list
	}
	var out []string
	for _, n := range list {
		if slices.Contains(cfg.Systems, n) {
			out = append(out, n)
		}
	}
	return out
}

// A grid is a closed-loop scenario measured over cells on systems that
// are started once for all the grids of a session (S1 and S2). Each pair
// is [full, quick].
type grid struct {
	id       string
	service  string
	payloads [2][]int
	conns    [2][]int
	systems  [2][]string
	title    func(sp Spec) string
	about    func(sp Spec) string // the service, first line of the setup
	finish   func(r *report, dir string)
}

var grids = []grid{{
	id:       "S1",
	service:  "echo",
	payloads: [2][]int{{128, 4 << 10, 64 << 10}, {128, 4 << 10}},
	conns:    [2][]int{{1, 16, 64, 256}, {1, 64}},
	systems: [2][]string{{nameGnetEcho, nameGRPC, namePHPStatic, namePHPDyn, nameTpsched, nameTpschedC},
		{nameGnetEcho, nameGRPC, namePHPStatic, nameTpsched, nameTpschedC}},
	title: func(Spec) string { return "echo, closed loop" },
	about: func(Spec) string {
		return "Service: echo (the reply is the request). Closed loop: N connections, one call outstanding on each."
	},
	finish: func(r *report, dir string) {
		r.Notes = append(r.Notes, s1Targets(r))
		for _, p := range r.payloads() {
			r.addPlot(plotThroughput(r, dir, "echo", p))
		}
		r.addPlot(plotCDF(r, dir, "echo", 128, 64))
	},
}, {
	id:       "S2",
	service:  "burn",
	payloads: [2][]int{{0}, {0}},
	conns:    [2][]int{{1, 16, 64}, {64}},
	systems:  [2][]string{{namePHPStatic, nameTpsched, nameHAProxy}, {namePHPStatic, nameTpsched, nameHAProxy}},
	title: func(sp Spec) string {
		return fmt.Sprintf("a CPU-bound service (%d us) on a pool of %d worker processes", burnMicros, sp.Workers)
	},
	about: func(sp Spec) string {
		return fmt.Sprintf("Service: burn; the request is the decimal number %d and each system spins the CPU for that many "+
			"microseconds of wall time in the worker (uap-echo burn, a PHP loop on hrtime, the Go worker's loop) and answers the request. "+
			"The ceiling is %d workers / %d us = %.0f calls/s if the workers had the cores to themselves.",
			burnMicros, sp.Workers, burnMicros, float64(sp.Workers)*1e6/burnMicros)
	},
	finish: func(r *report, dir string) {
		r.addPlot(plotThroughput(r, dir, "burn", 0))
		r.addPlot(plotCDF(r, dir, "burn", 0, r.Cells[len(r.Cells)-1].Conns))
	},
}, {
	id:       "S10",
	service:  "echo",
	payloads: [2][]int{{128, 4 << 10}, {128}},
	conns:    [2][]int{{1, 5, 64, 128}, {1, 5, 64, 128}},
	systems: [2][]string{{nameTpsched, nameTpschedLocal, nameTpschedLocalC, nameTpschedNested, nameEnduroX},
		{nameTpsched, nameTpschedLocal, nameTpschedLocalC, nameTpschedNested, nameEnduroX}},
	title: func(Spec) string { return "local calls: a service calling a service on the same node" },
	about: func(Spec) string {
		return "Service: echo. tpsched local call: N caller UAPs on the node, each calling bench/echo in a loop through its shared memory " +
			"(shm.UAP.Call -> scdd -> bench UAP), as Enduro/X's exbenchcl calls exbenchsv over POSIX queues: local calls alone, no network hop; " +
			"tpsched C local call: the same with both sides in C (uap-caller-c calling uap-echo-c), as Enduro/X's are. " +
			"Beside them, the same echo over TCP (closed loop, N connections, one call outstanding on each): directly (tpsched: client -> scdd -> UAP) " +
			"and through a front UAP's local call (tpsched nested call: client -> scdd -> front UAP -> local call -> bench UAP, and back)."
	},
	finish: func(r *report, dir string) {
		r.Notes = append(r.Notes, s10Notes(r))
		for _, p := range r.payloads() {
			r.addPlot(plotThroughput(r, dir, "echo", p))
		}
	},
}}

// cells is the grid's cells, every payload with every connection count.
func (g grid) cells(quick bool) []gridCell {
	q := 0
	if quick {
		q = 1
	}
	var out []gridCell
	for _, p := range g.payloads[q] {
		for _, c := range g.conns[q] {
			out = append(out, gridCell{Service: g.service, Payload: p, Conns: c})
		}
	}
	return out
}

// payloads is the payload sizes of the report's cells, in order.
func (r *report) payloads() []int {
	var out []int
	for _, c := range r.Cells {
		if !slices.Contains(out, c.Payload) {
			out = append(out, c.Payload)
		}
	}
	return out
}

// s4Carriers is how many connections carry the open-loop calls: enough
// that the generator never runs out while the server answers within the
// timeout at the admitted rate.
const s4Carriers = 256

// starters start each system of the grids by its report name.
var starters = map[string]func(Env, Spec) (*system, error){
	nameTpsched:       startTpsched,
	nameTpschedC:      startTpschedC,
	nameTpschedLocal:  startTpschedLocal,
	nameTpschedLocalC: startTpschedLocalC,
	nameTpschedNested: startTpschedNested,
	nameEnduroX:       startEnduroX,
	nameGnetEcho:      startGnetEcho,
	nameGRPC:          startGRPC,
	namePHPStatic:     func(e Env, s Spec) (*system, error) { return startNginxPHP(e, s, false) },
	namePHPDyn:        func(e Env, s Spec) (*system, error) { return startNginxPHP(e, s, true) },
	nameHAProxy:       startHAProxy,
}

// startAll starts the systems it can; the others are returned as skipped
// with the reason.
func startAll(cfg Config, sp Spec, list []string) ([]*system, map[string]string) {
	var systems []*system
	skipped := map[string]string{}
	for _, name := range cfg.selected(list) {
		fmt.Fprintf(cfg.Log, "starting %s\n", name)
		s, err := starters[name](cfg.Env, sp)
		if err != nil {
			fmt.Fprintf(cfg.Log, "  %s not started: %v\n", name, err)
			skipped[name] = oneLine(err.Error())
			continue
		}
		systems = append(systems, s)
	}
	return systems, skipped
}

func stopAll(systems []*system) {
	for _, s := range systems {
		s.Stop()
	}
}

func names(systems []*system) []string {
	var n []string
	for _, s := range systems {
		n = append(n, s.Name)
	}
	return n
}

// Run runs the configured scenarios and writes their reports.
func Run(ctx context.Context, cfg Config) error {
	date := time.Now().UTC().Format("2006-01-02")
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return err
	}
	cfg.Quiet = cfg.Quiet.withBudget() // one budget for the session, seen by the reports too
	machine := thisMachine()
	machine.Peers = peerVersions()
	opts := runOptions{Runs: cfg.Runs, Warmup: cfg.Warmup, Duration: cfg.Duration, Timeout: 2 * time.Second, Quiet: cfg.Quiet,
		PeersRunning: cfg.PeersRunning, Log: cfg.Log}
	opts.syscallsOff = "off (-count-syscalls=false)"
	if cfg.CountSyscalls {
		if c, err := newSyscallCounter(); err != nil {
			opts.syscallsOff = oneLine(err.Error())
			fmt.Fprintf(cfg.Log, "system calls not counted: %v\n", err)
		} else {
			opts.syscalls, opts.syscallsOff = c, ""
			defer c.Close()
		}
	}
	want := func(s string) bool { return slices.Contains(cfg.Scenarios, s) }
	cfg.progress = newProgress(cfg.Log, nil, sessionPlan(cfg, opts))
	cfg.progress.quiet = cfg.Quiet
	defer cfg.progress.finish()
	opts.progress = cfg.progress
	cfg.progress.announce()
	newReport := func(id, title string, systems []string, skipped map[string]string, o runOptions) *report {
		return &report{Scenario: id, Title: title, Date: date, Machine: machine, Runs: o.Runs,
			Warmup: o.Warmup.Seconds(), Duration: o.Duration.Seconds(), Systems: systems, Skipped: skipped}
	}
	sizing := func(sp Spec, names []string) []string {
		return append([]string{fmt.Sprintf("Every system gets %d worker processes and %d receiving threads or processes.", sp.Workers, sp.Front)},
			peerChoices(sp, names)...)
	}
	loadgen := "The load generator (Go, one goroutine and one connection per simulated client; hand-written tpsched-frame, HTTP/1.1 keep-alive and " +
		"gRPC-over-HTTP/2 clients, so it spends about the same CPU per call for every peer) runs on the same cores as the servers; its own CPU per call is in the wake-ups table (with, in S10, the caller UAPs' and exbenchcl's, which make the load there). " +
		"CPU/call is utime+stime of the server's whole process tree (children included) over the measured window, divided by the calls answered; " +
		"peak RSS is VmHWM summed over those processes, reset (clear_refs) before each run. " +
		"The window's samples are read by a thread of the harness of its own at nice -10, with raw system calls, so that they are not queued behind the processes measured; " +
		"where the calls are counted by other processes on their own clocks (S10's callers), the figures per call count the calls of the share of the window the samples covered, " +
		"and a run whose samples covered less than 90% of it counts as disturbed. " + wakeupsMethod(opts.syscallsOff)

	capacity := map[string]float64{} // S2 closed-loop throughput at 64 conns, for S4
	var run []grid
	var list []string
	for _, g := range grids {
		if want(g.id) {
			run = append(run, g)
			for _, n := range g.systems[boolIndex(cfg.Quick)] {
				if !slices.Contains(list, n) {
					list = append(list, n)
				}
			}
		}
	}
	if len(run) > 0 {
		spec := cfg.Spec
		for _, g := range run {
			if g.id == "S10" {
				for _, c := range g.cells(cfg.Quick) {
					spec.Callers = max(spec.Callers, c.Conns) // a caller UAP for each caller of the largest cell
				}
			}
		}
		systems, skipped := startAll(cfg, spec, list)
		defer func() { stopAll(systems) }()
		for _, g := range run {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			in := g.systems[boolIndex(cfg.Quick)]
			on := slices.DeleteFunc(slices.Clone(systems), func(s *system) bool { return !slices.Contains(in, s.Name) })
			cells := g.cells(cfg.Quick)
			fmt.Fprintf(cfg.Log, "%s: %s, %d cells x %d systems x %d runs\n", g.id, g.title(cfg.Spec), len(cells), len(on), opts.Runs)
			cfg.progress.begin(plan(g.id, len(cells)*len(on)*opts.Runs, opts.stepTime()))
			measure(ctx, opts, on, cells, nil)
			r := newReport(g.id, g.title(cfg.Spec), names(on), pick(skipped, in...), opts)
			r.Cells = cells
			r.Setup = append(append([]string{g.about(spec)}, sizing(spec, r.Systems)...), loadgen)
			g.finish(r, cfg.Out)
			if g.id == "S2" {
				for _, c := range cells {
					for _, m := range c.Results {
						if c.Conns == 64 && len(m.Runs) > 0 {
							capacity[m.System] = m.Median.Throughput
						}
					}
				}
			}
			if err := writeReport(cfg, r); err != nil {
				return err
			}
		}
		stopAll(systems)
		systems = nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if want("S3") {
		if err := runS3(ctx, cfg, newReport); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if want("S4") {
		if err := runS4(ctx, cfg, opts, capacity, newReport, loadgen); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if want("S5") {
		if err := runS5(ctx, cfg, opts, capacity, newReport, loadgen); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if want("S6") {
		if err := runS6(ctx, cfg, opts, newReport, loadgen); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if want("S7") {
		if err := runS7(ctx, cfg, newReport); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if want("S8") {
		if err := runS8(ctx, cfg, opts, newReport); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if want("S9") {
		return runS9(ctx, cfg, newReport)
	}
	return nil
}

// S4's systems, and its options: warm-up and measured time twice the
// grids'.
var s4Systems = []string{nameTpsched, namePHPStatic, nameHAProxy}

func s4Options(opts runOptions) runOptions {
	o := opts
	o.Warmup = 2 * opts.Warmup
	o.Duration = 2 * opts.Duration
	return o
}

// s4Plan is S4 on n systems, measuring their capacity first unless S2 did.
func s4Plan(n int, opts runOptions, needCapacity bool) scenarioPlan {
	p := plan("S4", n*opts.Runs, s4Options(opts).stepTime())
	if needCapacity {
		p = p.and(n*opts.Runs, opts.stepTime())
	}
	return p
}

func runS4(ctx context.Context, cfg Config, opts runOptions, capacity map[string]float64,
	newReport newReportFunc, loadgen string) error {
	sp := cfg.Spec
	sp.Queue = cfg.S4Queue
	systems, skipped := startAll(cfg, sp, s4Systems)
	defer stopAll(systems)
	cfg.progress.begin(s4Plan(len(systems), opts, len(capacity) == 0))
	if len(capacity) == 0 {
		// S2 was not run: measure capacity now, closed loop with fewer
		// connections than the queue holds, so nothing is refused.
		cells := []gridCell{{Service: "burn", Conns: max(sp.Queue/2, 1)}}
		fmt.Fprintf(cfg.Log, "S4: measuring capacity (burn, %d conns)\n", cells[0].Conns)
		measure(ctx, opts, systems, cells, nil)
		for _, m := range cells[0].Results {
			if len(m.Runs) > 0 {
				capacity[m.System] = m.Median.Throughput
			}
		}
	}
	systems = slices.DeleteFunc(systems, func(s *system) bool {
		if capacity[s.Name] == 0 {
			skipped[s.Name] = "no capacity measured in S2"
			s.Stop()
			return true
		}
		return false
	})
	o := s4Options(opts)
	cells := []gridCell{{Service: "burn", Conns: s4Carriers, Open: true}}
	fmt.Fprintf(cfg.Log, "S4: burn %d us, open loop at 2x capacity %v\n", burnMicros, capacity)
	measure(ctx, o, systems, cells, func(system string, _ *gridCell) float64 { return 2 * capacity[system] })
	r := newReport("S4", "open-loop overload at 2x measured capacity", names(systems), skipped, o)
	r.Cells = cells
	r.Setup = []string{
		fmt.Sprintf("Service: burn %d us on %d worker processes. Each system is offered twice its own S2 closed-loop throughput at 64 connections, "+
			"as a fixed arrival rate carried by up to %d connections; a call's latency counts from the time it was due, so waiting for a "+
			"connection is queueing and is measured. A call not answered %v after it was due times out.", burnMicros, sp.Workers, s4Carriers, opts.Timeout),
		fmt.Sprintf("Bounded queues: tpsched queue_size=%d (it answers 'server busy' when full); PHP-FPM listen.backlog=%d (nginx answers 502 when the "+
			"backlog is full); HAProxy answers 503 when %d requests are queued (http-request deny if queue(be) ge %d). Refused = tpsched 'server busy' or HTTP 5xx.",
			sp.Queue, sp.Queue, sp.Queue, sp.Queue),
		"Admitted latency is of the calls answered OK; refused, failed and timed out are shares of the calls due in the window.",
	}
	r.Setup = append(append(r.Setup, peerChoices(sp, r.Systems)...), loadgen)
	var caps []string
	for _, n := range names(systems) {
		caps = append(caps, fmt.Sprintf("%s %.0f/s", n, capacity[n]))
	}
	r.Notes = append(r.Notes, "Capacity used (closed loop, burn): "+strings.Join(caps, ", ")+".")
	r.addPlot(plotCDF(r, cfg.Out, "burn", 0, s4Carriers))
	return writeReport(cfg, r)
}

func (r *report) addPlot(name string, err error) {
	if err != nil {
		r.Notes = append(r.Notes, "Plot failed: "+err.Error())
		return
	}
	if name != "" {
		r.Plots = append(r.Plots, name)
	}
}

func pick(m map[string]string, keep ...string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		if slices.Contains(keep, k) {
			out[k] = v
		}
	}
	return out
}

func writeReport(cfg Config, r *report) error {
	if len(r.Cells) > 0 {
		checkValidity(r, cfg.Quiet, cfg.PeersRunning, compareWith(cfg, r.Scenario))
	}
	base, err := r.Write(cfg.Out)
	if err != nil {
		return err
	}
	fmt.Fprintf(cfg.Log, "wrote %s.md and %s.json\n", base, filepath.Base(base))
	return nil
}

// compareWith is the report of the other grid to compare scenario with.
func compareWith(cfg Config, scenario string) string {
	dir := cfg.Compare
	if dir == "" {
		dir = filepath.Join(cfg.Out, "quick")
		if cfg.Quick {
			dir = filepath.Dir(filepath.Clean(cfg.Out))
		}
	}
	if st, err := os.Stat(dir); err == nil && !st.IsDir() {
		return dir
	}
	return newestReport(dir, scenario)
}

// s1Targets states the targets at 64 connections, 128 B against
// what was measured: tpsched >= 2x gRPC-go and >= 3x nginx+PHP-FPM (static)
// in throughput, with p99 no worse than either.
func s1Targets(r *report) string {
	var cell *gridCell
	for i := range r.Cells {
		if c := &r.Cells[i]; c.Service == "echo" && c.Payload == 128 && c.Conns == 64 {
			cell = c
		}
	}
	if cell == nil {
		return "Targets (64 conns, 128 B): not measured in this grid."
	}
	tp := cell.Result(nameTpsched)
	if tp == nil || len(tp.Runs) == 0 {
		return "Targets (64 conns, 128 B): tpsched not measured."
	}
	var b strings.Builder
	b.WriteString("**Targets at 64 connections, 128 B** (tpsched throughput >= 2x gRPC-go and >= 3x nginx+PHP-FPM static, p99 no worse than either):")
	for _, t := range []struct {
		peer string
		want float64
	}{{nameGRPC, 2}, {namePHPStatic, 3}} {
		m := cell.Result(t.peer)
		if m == nil || len(m.Runs) == 0 {
			fmt.Fprintf(&b, " %s not measured;", t.peer)
			continue
		}
		thr := tp.Median.Throughput / m.Median.Throughput
		verdict := func(ok bool) string {
			if ok {
				return "met"
			}
			return "NOT met"
		}
		fmt.Fprintf(&b, " vs %s: throughput %.2fx (target %.0fx: %s), p99 %s vs %s (%s);", t.peer, thr, t.want,
			verdict(thr >= t.want), dur(tp.Median.P99us), dur(m.Median.P99us), verdict(tp.Median.P99us <= m.Median.P99us))
	}
	return strings.TrimSuffix(b.String(), ";") + "."
}

// peerVersions asks each installed peer binary its version.
func peerVersions() map[string]string {
	out := map[string]string{}
	re := regexp.MustCompile(`\d+\.\d+(\.\d+)?`)
	ask := func(name string, find func() (string, error), args ...string) {
		bin, err := find()
		if err != nil {
			return
		}
		b, _ := exec.Command(bin, args...).CombinedOutput()
		if v := re.Find(b); v != nil {
			out[name] = string(v)
		}
	}
	ask("nginx", func() (string, error) { return findBinary("nginx") }, "-v")
	ask("php-fpm", phpFPMBinary, "-v")
	ask("haproxy", func() (string, error) { return findBinary("haproxy") }, "-v")
	if v, err := enduroxVersion(); err == nil {
		out["Enduro/X"] = strings.TrimPrefix(v, "Enduro/X ")
	}
	return out
}

// given is a scenario's duration as the operator gave it (-sN-duration and
// the like), else its default for the full or the quick run.
func given(flag, full, quick time.Duration, isQuick bool) time.Duration {
	switch {
	case flag > 0:
		return flag
	case isQuick:
		return quick
	}
	return full
}

// boolIndex is 1 for true: the quick half of a [full, quick] pair.
func boolIndex(b bool) int {
	if b {
		return 1
	}
	return 0
}
