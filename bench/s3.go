package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// S3: a load step from a low rate to ten times that, on pools that grow
// with the load: tpsched's non-resident processes against PHP-FPM's
// pm=dynamic and pm=ondemand, all with at most S3MaxWorkers workers.

// S3 sizing.
const (
	s3MaxWorkers = 4
	s3Balance    = 1
	s3Idle       = 500 * time.Millisecond
	s3BaseRate   = 300
)

// s3Load is the full S3 profile; s3QuickLoad the development one.
var (
	s3Load = stepLoad{Base: s3BaseRate, Peak: 10 * s3BaseRate, Before: 4 * time.Second, During: 8 * time.Second,
		After: 5 * time.Second, Settle: time.Second, Window: 100 * time.Millisecond, Poll: 50 * time.Millisecond,
		Carriers: 256, Timeout: 2 * time.Second, Limit: 2}
	s3QuickLoad = stepLoad{Base: s3BaseRate, Peak: 10 * s3BaseRate, Before: 2 * time.Second, During: 3 * time.Second,
		After: 2 * time.Second, Settle: time.Second, Window: 100 * time.Millisecond, Poll: 50 * time.Millisecond,
		Carriers: 256, Timeout: 2 * time.Second, Limit: 2}
)

// stepResult is one system's S3 runs.
type stepResult struct {
	System string `json:"system"`
	Config string `json:"config"`
	runSet[stepFigures]
	Windows []stepWindow   `json:"windows,omitempty"` // of the drawn run (median recovery)
	Samples []workerSample `json:"worker_samples,omitempty"`
}

type s3System struct {
	name, config string
	start        func() (*system, error)
}

func s3Systems(env Env, sp Spec) []s3System {
	sp.Workers = s3MaxWorkers
	dyn := fmt.Sprintf("pm = dynamic\npm.max_children = %d\npm.start_servers = 1\npm.min_spare_servers = 1\npm.max_spare_servers = 2\n", s3MaxWorkers)
	ond := fmt.Sprintf("pm = ondemand\npm.max_children = %d\npm.process_idle_timeout = 1s\n", s3MaxWorkers)
	return []s3System{
		{nameTpschedNonRes, fmt.Sprintf("parallel_count = 1,%d, balance_count = %d, nonresident_idle_time = %d",
			s3MaxWorkers, s3Balance, s3Idle.Milliseconds()),
			func() (*system, error) { return startTpschedNonResident(env, sp, 1, s3MaxWorkers, s3Balance, s3Idle) }},
		{namePHPDyn, fmt.Sprintf("pm = dynamic, max_children %d, start_servers 1, min_spare_servers 1, max_spare_servers 2", s3MaxWorkers),
			func() (*system, error) { return startNginxPHPPool(env, sp, namePHPDyn, dyn) }},
		{namePHPOndemand, fmt.Sprintf("pm = ondemand, max_children %d, process_idle_timeout 1s", s3MaxWorkers),
			func() (*system, error) { return startNginxPHPPool(env, sp, namePHPOndemand, ond) }},
	}
}

// s3Sizing is the step profile and the runs per system of the session.
func s3Sizing(cfg Config) (stepLoad, int) {
	if cfg.Quick {
		return s3QuickLoad, 1
	}
	return s3Load, cfg.Runs
}

// s3RunTime is one S3 run's plan: the profile, and starting the system.
func s3RunTime(sl stepLoad) time.Duration { return sl.End() + startSlack }

// runS3 runs the step on each system, runs times interleaved (the order
// rotates, and reverses, between runs), each run on a freshly started
// system so every one begins from the same idle pool.
func runS3(ctx context.Context, cfg Config, newReport newReportFunc) error {
	sl, runs := s3Sizing(cfg)
	systems := selected(cfg, "S3", s3Systems(cfg.Env, cfg.Spec), func(s s3System) string { return s.name })
	if len(systems) == 0 {
		return nil
	}
	cfg.progress.begin(plan("S3", len(systems)*runs, s3RunTime(sl)))
	fmt.Fprintf(cfg.Log, "S3: burn %d us, open loop %.0f/s for %v, %.0f/s for %v, %.0f/s for %v; %d systems x %d runs\n",
		burnMicros, sl.Base, sl.Before, sl.Peak, sl.During, sl.Base, sl.After, len(systems), runs)
	sr := systemsRun[stepFigures, stepTrace]{id: "S3", runs: runs, per: s3RunTime(sl), alternate: true, drawn: recoveryRun,
		once: func(r, si int) (stepFigures, stepTrace, error, error) {
			s, err := systems[si].start()
			if err != nil {
				return stepFigures{}, stepTrace{}, err, nil
			}
			tr, err := stepRun(ctx, s, sl)
			s.Stop()
			if err != nil {
				return stepFigures{}, stepTrace{}, nil, err
			}
			f, _ := stepFiguresOf(sl, tr.calls, tr.samples)
			fmt.Fprintf(cfg.Log, "  run %d %-24s p99 %s / %s / %s, recovered %s, first extra worker %s, workers %.0f -> %.0f (at %s), back %s, refused %.0f failed %.0f timed out %.0f\n",
				r+1, systems[si].name, dur(f.PreP99us), dur(f.StepP99us), dur(f.PostP99us), msOrNever(f.RecoveryMs), msOrNever(f.FirstExtraMs),
				f.BaselineWorkers, f.PeakWorkers, msOrNever(f.ToPeakMs), msOrNever(f.BackMs), f.Refused, f.Failed, f.TimedOut)
			return f, tr, nil, nil
		}}
	for _, sys := range systems {
		sr.names = append(sr.names, sys.name)
	}
	ms, skipped, err := sr.measure(ctx, cfg)
	if err != nil {
		return err
	}
	var done []stepResult
	for _, m := range ms {
		res := stepResult{runSet: m.Set, System: m.System, Config: systems[m.Index].config}
		tr := m.drawnTrace()
		_, res.Windows = stepFiguresOf(sl, tr.calls, tr.samples)
		res.Samples = tr.samples
		done = append(done, res)
	}
	o := runOptions{Runs: runs, Duration: sl.End()}
	title := fmt.Sprintf("a load step from %.0f/s to %.0f/s on pools of 1 to %d workers that grow with the load", sl.Base, sl.Peak, s3MaxWorkers)
	return sr.reportOf(cfg, newReport, title, o, ms, skipped, func(r *report) {
		r.Step = &sl
		r.StepResults = done
		r.Setup = s3Setup(sl, runs, cfg.Quick, systems)
		r.addPlot(plotStepP99(r, cfg.Out))
		r.addPlot(plotStepWorkers(r, cfg.Out))
	})
}

func s3Setup(sl stepLoad, runs int, quick bool, systems []s3System) []string {
	runsNote := fmt.Sprintf("Figures are medians of %d interleaved runs (the order of systems rotates, and reverses, between runs); "+
		"each run starts its system afresh, so every run steps up from the same idle pool.", runs)
	if quick {
		runsNote = "Quick mode: ONE run per system and a shorter profile, so the figures are single samples, not medians."
	}
	out := []string{
		fmt.Sprintf("Service: burn %d us of CPU per call (uap-echo burn; the PHP hrtime loop S2 uses). Open loop, calls evenly spaced: "+
			"%.0f/s for %v, then %.0f/s (10x) for %v, then %.0f/s for %v; carried by up to %d connections, latency counted from the time a "+
			"call was due, a call not answered %v after it was due times out. The rate is the same for every system: 300/s is under 10%% of what "+
			"2 workers served in S2, and 3000/s is more than one PHP-FPM worker serves, so a pool that stays at one worker falls behind.",
			burnMicros, sl.Base, sl.Before, sl.Peak, sl.During, sl.Base, sl.After, sl.Carriers, sl.Timeout),
		runsNote,
	}
	for _, s := range systems {
		out = append(out, fmt.Sprintf("%s: %s.", s.name, s.config))
	}
	out = append(out,
		fmt.Sprintf("balance_count %d: tpsched starts a non-resident process while the waiting calls exceed balance_count x running processes. "+
			"1 is the smallest setting that still asks for a backlog (two calls waiting behind one busy process) before paying for a process, "+
			"so a single coincident arrival at the base rate does not start one (balance_count 0 would, as pm=ondemand forks whenever no child is idle); "+
			"the default 3 would let three calls per process wait before growing.", s3Balance),
		"Every pool has at most 4 workers on 2 cores. nginx has 2 workers and PHP-FPM listen.backlog 1024; tpsched scdmulti 2 and queue_size 1024.",
		fmt.Sprintf("Workers are counted every %v: tpsched's processes of the group from GET /status (resident and non-resident, any state), "+
			"PHP-FPM's children of its master from /proc/<pid>/task/*/children. A count is stamped when it was read, so worker times are "+
			"late by up to one poll (%v).", sl.Poll, sl.Poll),
		fmt.Sprintf("Windows are %v of intended send time. A window's p99 is of its calls answered OK and those that timed out (counted at "+
			"the timeout). Pre-step p99 is of the calls due from %v after the start to the step; during: due in the step; after: due after the drop.", sl.Window, sl.Settle),
		fmt.Sprintf("**Recovery time**: from the step to the start of the earliest %v window of the step phase from which on every window of "+
			"the phase has p99 below %.0fx the run's pre-step p99 and no call refused or failed. 0 means the step never pushed p99 over that limit; "+
			"'never' means the last window of the step was still over it. First extra worker: from the step to the first count above "+
			"the last count before the step. Peak: the most workers counted from the step to the end, and when it was first counted. Back: "+
			"from the drop to the first count at or below the pre-step count. Because one late window resets it, the recovery time is "+
			"sensitive to stalls of the shared machine; 'step windows over the limit' counts every window of the step that was not good, "+
			"so isolated stalls (a few windows late in the step) can be told from a pool that fell behind (a run of windows from the step on).", sl.Window, sl.Limit),
		"The generator's send lateness (from the time a call was due to the time it was written) is the floor of every latency here: "+
			"Go's timers sleep in epoll_wait with millisecond granularity, so at the base rate a call is sent up to about a millisecond late. "+
			"It is the same for every system and is reported beside the pre-step p99.",
		"The load generator (Go, one goroutine per connection, the hand-written tpsched-frame and HTTP/1.1 keep-alive clients of S1-S4) "+
			"and the worker counting run on the same 2 cores as the servers.",
	)
	return out
}

// stepTrace is one run's raw material.
type stepTrace struct {
	calls   []callTrace
	samples []workerSample
}

// stepRun runs the profile on s, counting its workers every sl.Poll.
func stepRun(ctx context.Context, s *system, sl stepLoad) (stepTrace, error) {
	if _, err := s.Workers(); err != nil {
		return stepTrace{}, err
	}
	stop := poll(ctx, sl.Poll, func() (int, bool) {
		n, err := s.Workers()
		return n, err == nil
	})
	res, err := openLoop(ctx, load{
		Dial:     s.Dialer("burn"),
		Payload:  []byte(fmt.Sprint(burnMicros)),
		Conns:    sl.Carriers,
		Profile:  sl.Profile(),
		Timeout:  sl.Timeout,
		Trace:    true,
		Duration: sl.End(),
	})
	seen := stop()
	if err != nil {
		return stepTrace{}, err
	}
	tr := stepTrace{calls: res.Trace}
	for _, x := range seen {
		tr.samples = append(tr.samples, workerSample{At: x.At.Sub(res.Begin), N: x.V})
	}
	return tr, nil
}

var statusClient = &http.Client{Timeout: time.Second}

// statusGroup is the part of a group in tpsched's /status that S3 reads.
type statusGroup struct {
	Group     string `json:"group"`
	Processes []struct {
		PID   int    `json:"pid"`
		Kind  string `json:"kind"`
		State string `json:"state"`
	} `json:"processes"`
}

// tpschedWorkers counts the processes of group in a node's /status.
func tpschedWorkers(url, group string) (int, error) {
	var st struct {
		Groups []statusGroup `json:"groups"`
	}
	if err := getJSON(url, &st); err != nil {
		return 0, err
	}
	return countWorkers(st.Groups, group), nil
}

// getJSON decodes the answer to a GET of url (a node's /status) into v.
func getJSON(url string, v any) error {
	resp, err := statusClient.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// countWorkers counts the processes (those with a pid: resident and
// non-resident, starting, running or stopping) of group.
func countWorkers(groups []statusGroup, group string) int {
	n := 0
	for _, g := range groups {
		if g.Group != group {
			continue
		}
		for _, p := range g.Processes {
			if p.PID != 0 {
				n++
			}
		}
	}
	return n
}

func msOrNever(v float64) string {
	if v < 0 {
		return "never"
	}
	return fmt.Sprintf("%.0f ms", v)
}
