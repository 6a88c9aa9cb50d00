package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// S9: a node restarted under load. One tpsched node serves an open loop of
// echo calls; s9Before into the run it is restarted, either by hand-off
// (POST /restart on its control socket, what scdctl restart, SIGUSR2 and
// systemctl reload do: a new scdd takes the listening sockets over and the
// old one lets its callers go and drains) or by stopping it (SIGTERM: it
// drains and exits) and starting it again, what restarting a node comes
// to without the hand-off. Every call due is traced, so the windows around
// the restart show what a caller saw.

// S9 sizing.
const (
	s9Rate      = 2000
	s9Carriers  = 64
	s9Payload   = 128
	s9Workers   = 2
	s9Window    = 100 * time.Millisecond
	s9Timeout   = 2 * time.Second
	s9Around    = time.Second // "around the restart": the first second from it
	s9BackLimit = 30 * time.Second
)

var (
	s9Full  = restartLoad{Before: 2 * time.Second, After: 5 * time.Second}
	s9Quick = restartLoad{Before: time.Second, After: 3 * time.Second}
)

// S9's systems: one node, two ways of restarting it.
const (
	nameRestartHandOff   = "restart (hand-off)"
	nameRestartStopStart = "stop and start"
)

// restartLoad is when S9's restart comes in its run.
type restartLoad struct {
	Before time.Duration `json:"before_ns"` // from the run's start to the restart
	After  time.Duration `json:"after_ns"`  // from the restart to the run's end
}

// restartSetup is how S9 was run.
type restartSetup struct {
	restartLoad
	Rate     float64       `json:"offered_per_s"`
	Carriers int           `json:"carriers"`
	Payload  int           `json:"payload_bytes"`
	Workers  int           `json:"parallel_count"`
	Window   time.Duration `json:"window_ns"`
	Timeout  time.Duration `json:"timeout_ns"`
}

// restartFigures are one S9 run's figures, or the median of the runs.
type restartFigures struct {
	Due      float64 `json:"due"` // calls due in the run
	OK       float64 `json:"ok"`
	Refused  float64 `json:"refused"`
	Failed   float64 `json:"failed"`
	TimedOut float64 `json:"timed_out"`
	// p99 of the calls answered OK that were due before the restart, in
	// the first second from it, and after that.
	P99BeforeUs float64 `json:"p99_before_us"`
	P99AroundUs float64 `json:"p99_around_us"`
	P99AfterUs  float64 `json:"p99_after_us"`
	// BackMs is from the restart's start until the new process served:
	// the node's own figure for the hand-off; for stop and start, until a
	// call to the new scdd was answered.
	BackMs float64 `json:"back_ms"`
	// DisruptedMs is from the restart to the end of the last window with a
	// call refused, failed or timed out (0: none was).
	DisruptedMs float64 `json:"disrupted_ms"`
}

// restartResult is one system's S9 runs.
type restartResult struct {
	System string `json:"system"`
	Config string `json:"config"`
	runSet[restartFigures]
	Windows []stepWindow `json:"windows,omitempty"` // of the drawn run (the median count of calls not answered OK)
}

type s9System struct {
	name, config string
	restart      func(env Env, s *system) (back time.Duration, stop func(), err error)
}

func s9Systems() []s9System {
	return []s9System{
		{nameRestartHandOff, "POST /restart on the control socket (scdctl restart)", restartByHandOff},
		{nameRestartStopStart, "SIGTERM (drain), wait for the exit, start scdd again on the same definitions", restartByStopStart},
	}
}

// s9Sizing is the run's shape and the runs per system.
func s9Sizing(cfg Config) (restartSetup, int) {
	rl := s9Full
	if cfg.Quick {
		rl = s9Quick
	}
	return restartSetup{restartLoad: rl, Rate: s9Rate, Carriers: s9Carriers, Payload: s9Payload, Workers: s9Workers,
		Window: s9Window, Timeout: s9Timeout}, cfg.Runs
}

// s9RunTime is one S9 run's plan: a node started, the run, the old or new
// process stopped.
func s9RunTime(setup restartSetup) time.Duration {
	return setup.Before + setup.After + setup.Timeout + 2*startSlack
}

// runS9 restarts a node under load both ways, cfg.Runs times each,
// alternating which goes first, each run on a node started afresh.
func runS9(ctx context.Context, cfg Config, newReport newReportFunc) error {
	setup, runs := s9Sizing(cfg)
	systems := selected(cfg, "S9", s9Systems(), func(s s9System) string { return s.name })
	if len(systems) == 0 {
		return nil
	}
	cfg.progress.begin(plan("S9", len(systems)*runs, s9RunTime(setup)))
	fmt.Fprintf(cfg.Log, "S9: echo %d B, open loop %d/s on %d carriers, restart %v into the run, %v after; %d systems x %d runs\n",
		setup.Payload, s9Rate, setup.Carriers, setup.Before, setup.After, len(systems), runs)
	sp := Spec{Workers: setup.Workers, Front: cfg.Spec.Front, Queue: 1024}
	notOK := func(runs []restartFigures) int {
		return medianRun(runs, func(f restartFigures) float64 { return f.Refused + f.Failed + f.TimedOut })
	}
	sr := systemsRun[restartFigures, []callTrace]{id: "S9", runs: runs, per: s9RunTime(setup), alternate: true, drawn: notOK,
		once: func(r, si int) (restartFigures, []callTrace, error, error) {
			sys := systems[si]
			s, err := startTpschedWith(cfg.Env, sp, tpschedConf{name: sys.name, module: "uap-echo", parallel: fmt.Sprint(setup.Workers)})
			if err != nil {
				return restartFigures{}, nil, err, nil
			}
			defer s.Stop()
			f, trace, err := restartRun(ctx, cfg.Env, s, setup, sys.restart)
			if err != nil {
				return restartFigures{}, nil, nil, err
			}
			fmt.Fprintf(cfg.Log, "  run %d %-20s %.0f due: %.0f ok, %.0f refused, %.0f failed, %.0f timed out; p99 %s / %s / %s; back after %.0f ms, disrupted %.0f ms\n",
				r+1, sys.name, f.Due, f.OK, f.Refused, f.Failed, f.TimedOut, dur(f.P99BeforeUs), dur(f.P99AroundUs), dur(f.P99AfterUs), f.BackMs, f.DisruptedMs)
			return f, trace, nil, nil
		}}
	for _, sys := range systems {
		sr.names = append(sr.names, sys.name)
	}
	ms, skipped, err := sr.measure(ctx, cfg)
	if err != nil {
		return err
	}
	var done []restartResult
	for _, m := range ms {
		done = append(done, restartResult{runSet: m.Set, System: m.System, Config: systems[m.Index].config,
			Windows: restartWindows(m.drawnTrace(), setup)})
	}
	title := fmt.Sprintf("a node restarted under an open loop of %d calls/s: hand-off against stop and start", s9Rate)
	return sr.reportOf(cfg, newReport, title, runOptions{Runs: runs, Duration: setup.Before + setup.After}, ms, skipped, func(rep *report) {
		rep.Restart = &setup
		rep.RestartResults = done
		rep.Setup = s9Setup(setup, runs, cfg.Quick, systems)
		rep.Notes = append(rep.Notes, restartVerdict(done))
		rep.addPlot(plotRestart(rep, cfg.Out, "p99"))
		rep.addPlot(plotRestart(rep, cfg.Out, "ok"))
	})
}

// restartRun runs the open loop on s and restarts it setup.Before into
// the run.
func restartRun(ctx context.Context, env Env, s *system, setup restartSetup,
	restart func(Env, *system) (time.Duration, func(), error)) (restartFigures, []callTrace, error) {
	type restarted struct {
		back time.Duration
		stop func()
		err  error
	}
	done := make(chan restarted, 1)
	l := load{
		Dial:    s.Dialer("echo"),
		Payload: cellPayload(&gridCell{Service: "echo", Payload: setup.Payload}, 0),
		Conns:   setup.Carriers,
		Timeout: setup.Timeout,
		Profile: []phase{{Rate: setup.Rate, For: setup.Before + setup.After}},
		Trace:   true,
		Window: func(begin bool) {
			if begin {
				go func() {
					if !sleepUntil(ctx, time.Now().Add(setup.Before)) {
						done <- restarted{err: ctx.Err()}
						return
					}
					back, stop, err := restart(env, s)
					done <- restarted{back, stop, err}
				}()
			}
		},
	}
	res, err := openLoop(ctx, l)
	var rs restarted
	select {
	case rs = <-done:
	case <-time.After(s9BackLimit):
		rs.err = fmt.Errorf("the restart did not end within %v", s9BackLimit)
	}
	if rs.stop != nil {
		defer rs.stop()
	}
	if err != nil {
		return restartFigures{}, nil, err
	}
	if rs.err != nil {
		return restartFigures{}, nil, fmt.Errorf("restart: %w", rs.err)
	}
	f := restartFiguresOf(res.Trace, setup)
	f.BackMs = ms(rs.back)
	return f, res.Trace, nil
}

// restartFiguresOf counts a traced run's calls and their latencies before,
// around and after the restart at setup.Before.
func restartFiguresOf(trace []callTrace, setup restartSetup) restartFigures {
	var f restartFigures
	var before, around, after []time.Duration
	for _, c := range trace {
		f.Due++
		switch c.Outcome {
		case callOK:
			f.OK++
			switch {
			case c.Due < setup.Before:
				before = append(before, c.Latency)
			case c.Due < setup.Before+s9Around:
				around = append(around, c.Latency)
			default:
				after = append(after, c.Latency)
			}
		case callRefused:
			f.Refused++
		case callTimedOut:
			f.TimedOut++
		default:
			f.Failed++
		}
	}
	f.P99BeforeUs, f.P99AroundUs, f.P99AfterUs = us(summarize(before).P99), us(summarize(around).P99), us(summarize(after).P99)
	for _, w := range restartWindows(trace, setup) {
		if w.FromStepMs >= 0 && w.Refused+w.Failed+w.TimedOut > 0 {
			f.DisruptedMs = w.FromStepMs + ms(setup.Window)
		}
	}
	return f
}

// restartWindows cuts a traced run into windows timed from the restart.
func restartWindows(trace []callTrace, setup restartSetup) []stepWindow {
	return stepWindows(trace, nil, setup.Before, setup.Before+setup.After, setup.Window, setup.Timeout)
}

// plotRestart draws S9's drawn runs over time from the restart: "p99",
// the p99 per window (log scale), or "ok", the calls answered OK per
// second in each window.
func plotRestart(r *report, dir, what string) (string, error) {
	if r.Restart == nil || len(r.RestartResults) == 0 {
		return "", nil
	}
	var series []windowSeries
	for _, res := range r.RestartResults {
		series = append(series, windowSeries{res.System, res.Windows})
	}
	g := r.Restart
	name := fmt.Sprintf("%s-%s-%s-over-time.png", r.Date, r.Scenario, what)
	x := "time from the restart (s)"
	if what == "p99" {
		return plotWindows(dir, name, fmt.Sprintf("%s: p99 per %v window of the calls due in it and answered OK (%.0f calls/s; restart at 0)",
			r.Scenario, g.Window, g.Rate), x, "p99 latency", true, g.Window, series, windowP99)
	}
	return plotWindows(dir, name, fmt.Sprintf("%s: calls due in each %v window and answered OK, per second (%.0f/s offered; restart at 0)",
		r.Scenario, g.Window, g.Rate), x, "calls answered OK per second", false, g.Window, series,
		func(w stepWindow) (float64, bool) { return float64(w.OK) / g.Window.Seconds(), true })
}

// restartByHandOff asks the node for a hand-off, as scdctl restart does,
// and returns how long the node says it took; stop ends the new process.
func restartByHandOff(_ Env, s *system) (time.Duration, func(), error) {
	sock := filepath.Join(s.dir, "conf", tpschedControlSock)
	hc := &http.Client{Timeout: s9BackLimit, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	resp, err := hc.Post("http://scdd/restart", "", nil)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return 0, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, nil, fmt.Errorf("restart refused (%s): %s", resp.Status, strings.TrimSpace(string(body)))
	}
	var res struct {
		NewPID int    `json:"new_pid"`
		Took   string `json:"took"`
	}
	if err := json.Unmarshal(body, &res); err != nil {
		return 0, nil, fmt.Errorf("restart's answer %q: %w", body, err)
	}
	took, err := time.ParseDuration(res.Took)
	if err != nil {
		return 0, nil, fmt.Errorf("restart took %q: %w", res.Took, err)
	}
	// The new scdd is the old one's child, in its process group: system's
	// Stop would SIGKILL it; stop lets it drain first.
	stop := func() { stopPID(res.NewPID, 15*time.Second) }
	return took, stop, nil
}

// restartByStopStart stops the node with SIGTERM, waits for it to exit
// and starts scdd again on the same definitions; it returns the time from
// the SIGTERM until the new scdd answered a call.
func restartByStopStart(env Env, s *system) (time.Duration, func(), error) {
	if len(s.procs) == 0 || s.procs[0].Process == nil {
		return 0, nil, fmt.Errorf("%s: no scdd to stop", s.Name)
	}
	old := s.procs[0]
	t0 := time.Now()
	if err := old.Process.Signal(syscall.SIGTERM); err != nil {
		return 0, nil, err
	}
	exited := make(chan struct{})
	go func() { _ = old.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(s9BackLimit):
		return 0, nil, fmt.Errorf("scdd did not exit within %v of SIGTERM", s9BackLimit)
	}
	scdd, err := filepath.Abs(filepath.Join(env.Bin, "scdd"))
	if err != nil {
		return 0, nil, err
	}
	if err := s.start("scdd-again.log", nil, scdd, "-c", filepath.Join(s.dir, "conf"), "-log-level", "warn"); err != nil {
		return 0, nil, err
	}
	c := s.dial("echo")()
	defer c.Close()
	for {
		if o, err := c.Call([]byte("1"), time.Now().Add(time.Second)); err == nil && o == callOK {
			return time.Since(t0), nil, nil
		}
		if time.Since(t0) > s9BackLimit {
			return 0, nil, fmt.Errorf("the new scdd did not answer within %v\n%s", s9BackLimit, s.Log())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stopPID sends pid SIGTERM and waits up to limit for it to be gone (or a
// zombie nobody of ours reaps).
func stopPID(pid int, limit time.Duration) {
	if pid <= 0 || syscall.Kill(pid, syscall.SIGTERM) != nil {
		return
	}
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		// The state is the first field after the command name.
		if i := bytes.LastIndexByte(b, ')'); i > 0 && i+2 < len(b) && b[i+2] == 'Z' {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// restartVerdict says what each way of restarting cost the callers.
func restartVerdict(results []restartResult) string {
	var parts []string
	for _, res := range results {
		f := res.Median
		parts = append(parts, fmt.Sprintf("%s: %.0f of %.0f calls not answered OK (%.0f refused, %.0f failed, %.0f timed out), "+
			"p99 %s in the second from the restart against %s before, served again after %.0f ms",
			res.System, f.Refused+f.Failed+f.TimedOut, f.Due, f.Refused, f.Failed, f.TimedOut, dur(f.P99AroundUs), dur(f.P99BeforeUs), f.BackMs))
	}
	if len(parts) == 0 {
		return ""
	}
	return "**What a restart cost the callers** (medians): " + strings.Join(parts, "; ") + "."
}

func s9Setup(g restartSetup, runs int, quick bool, systems []s9System) []string {
	out := []string{
		fmt.Sprintf("One scdd (scdmulti as the grids), the group \"bench\" served by %d resident uap-echo processes. An open loop of echo "+
			"calls of %d B at %.0f/s, evenly spaced, carried by up to %d connections of the bench's tpsched caller, which follows a node's "+
			"go-away to a new connection as tpsched's Go client does; a call not answered %v after it was due times out.",
			g.Workers, g.Payload, g.Rate, g.Carriers, g.Timeout),
		fmt.Sprintf("The node is restarted %v into the run; the run goes on %v after that. Every call due is traced; windows of %v "+
			"are timed from the restart.", g.Before, g.After, g.Window),
	}
	for _, s := range systems {
		out = append(out, fmt.Sprintf("%s: %s.", s.name, s.config))
	}
	out = append(out,
		fmt.Sprintf("Each figure is the median of %d runs per system, alternating which goes first, each on a node started afresh. "+
			"p99 around is of the calls due in the first %v from the restart and answered OK; disrupted is from the restart to the end "+
			"of the last window with a call refused, failed or timed out.", runs, s9Around),
		"Back after: for the hand-off, the node's own figure (from the request to the new process serving, what scdctl restart prints); "+
			"for stop and start, from the SIGTERM until the new scdd answered a call (the old one drains its queued calls first).")
	if quick {
		out = append(out, "Quick mode: shorter runs; for development only.")
	}
	return out
}

// writeRestart writes S9: each way's figures and each run.
func (r *report) writeRestart(b *strings.Builder) {
	b.WriteString("## Figures\n\n")
	b.WriteString("| system | calls due | answered OK | refused | failed | timed out | p99 before | p99 around the restart | p99 after | back after | disrupted |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, res := range r.RestartResults {
		f := res.Median
		fmt.Fprintf(b, "| %s | %.0f | %.0f | %.0f | %.0f | %.0f | %s | %s | %s | %.0f ms | %.0f ms |\n",
			res.System, f.Due, f.OK, f.Refused, f.Failed, f.TimedOut, dur(f.P99BeforeUs), dur(f.P99AroundUs), dur(f.P99AfterUs), f.BackMs, f.DisruptedMs)
	}
	b.WriteString("\n")
	if len(r.RestartResults) > 0 && r.Runs > 1 {
		b.WriteString("### Each run\n\n")
		b.WriteString("| system | run | due | OK | refused / failed / timed out | p99 before / around / after | back after | disrupted |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, res := range r.RestartResults {
			for i, f := range res.Runs {
				drawn := ""
				if i == res.Drawn {
					drawn = " (plotted)"
				}
				fmt.Fprintf(b, "| %s | %d%s | %.0f | %.0f | %.0f / %.0f / %.0f | %s / %s / %s | %.0f ms | %.0f ms |\n",
					res.System, i+1, drawn, f.Due, f.OK, f.Refused, f.Failed, f.TimedOut,
					dur(f.P99BeforeUs), dur(f.P99AroundUs), dur(f.P99AfterUs), f.BackMs, f.DisruptedMs)
			}
		}
		b.WriteString("\n")
	}
}
