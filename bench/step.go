package bench

import (
	"math"
	"slices"
	"time"
)

// This file is S3's arithmetic, apart from any server: the load step, the
// windows of a traced run, and the figures derived from them.

// stepLoad is S3's open-loop profile and how it is observed.
type stepLoad struct {
	Base     float64       `json:"base_per_s"`   // calls/s before and after the step
	Peak     float64       `json:"peak_per_s"`   // calls/s during the step
	Before   time.Duration `json:"before_ns"`    // at Base, then
	During   time.Duration `json:"during_ns"`    // at Peak, then
	After    time.Duration `json:"after_ns"`     // at Base again
	Settle   time.Duration `json:"settle_ns"`    // the first part of Before, left out of the pre-step p99
	Window   time.Duration `json:"window_ns"`    // width of a window (100 ms)
	Poll     time.Duration `json:"poll_ns"`      // how often the workers are counted (50 ms)
	Carriers int           `json:"carriers"`     // connections carrying the calls
	Timeout  time.Duration `json:"timeout_ns"`   // a call due at t times out at t+Timeout
	Limit    float64       `json:"limit_factor"` // recovered: p99 below Limit x the pre-step p99
}

// Profile is the open loop's rate over time.
func (s stepLoad) Profile() []phase {
	return []phase{{s.Base, s.Before}, {s.Peak, s.During}, {s.Base, s.After}}
}

// Step and Drop are when the rate goes up and back down, from the run's start.
func (s stepLoad) Step() time.Duration { return s.Before }
func (s stepLoad) Drop() time.Duration { return s.Before + s.During }
func (s stepLoad) End() time.Duration  { return s.Before + s.During + s.After }

// workerSample is a count of worker processes, At from the run's start.
type workerSample struct {
	At time.Duration `json:"at_ns"`
	N  int           `json:"n"`
}

// stepWindow is what happened to the calls due in one window of a run.
type stepWindow struct {
	FromStepMs float64 `json:"t_ms"` // the window's start, from the step (negative before it)
	Calls      int     `json:"calls"`
	OK         int     `json:"ok"`
	Refused    int     `json:"refused,omitempty"`
	Failed     int     `json:"failed,omitempty"`
	TimedOut   int     `json:"timed_out,omitempty"`
	// P99us is the p99 latency of the calls due in the window that were
	// answered OK or timed out (counted at the timeout, a lower bound); 0
	// if there are none.
	P99us float64 `json:"p99_us"`
	// Workers is the most worker processes seen in the window, or the last
	// count before it if no sample fell in it (-1: none yet).
	Workers int `json:"workers"`
}

// good reports whether the window counts as recovered at limit.
func (w stepWindow) good(limitUs float64) bool {
	return w.OK+w.TimedOut > 0 && w.Refused+w.Failed == 0 && w.P99us < limitUs
}

// stepWindows cuts a traced run into windows of width from its start to end:
// window k holds the calls due in [k x width, (k+1) x width). step is
// where the windows' times start from.
func stepWindows(calls []callTrace, samples []workerSample, step, end, width, timeout time.Duration) []stepWindow {
	if width <= 0 || end <= 0 {
		return nil
	}
	n := int((end + width - 1) / width)
	ws := make([]stepWindow, n)
	lat := make([][]time.Duration, n)
	for k := range ws {
		ws[k].FromStepMs = float64(time.Duration(k)*width-step) / float64(time.Millisecond)
		ws[k].Workers = -1
	}
	for _, c := range calls {
		if c.Due < 0 || c.Due >= end {
			continue
		}
		k := int(c.Due / width)
		w := &ws[k]
		w.Calls++
		switch c.Outcome {
		case callOK:
			w.OK++
			lat[k] = append(lat[k], c.Latency)
		case callTimedOut:
			w.TimedOut++
			lat[k] = append(lat[k], max(c.Latency, timeout))
		case callRefused:
			w.Refused++
		default:
			w.Failed++
		}
	}
	for k := range ws {
		if len(lat[k]) > 0 {
			slices.Sort(lat[k])
			ws[k].P99us = us(percentile(lat[k], 99))
		}
	}
	s := slices.Clone(samples)
	slices.SortFunc(s, func(a, b workerSample) int { return cmpFloat(float64(a.At), float64(b.At)) })
	last, i := -1, 0
	for k := range ws {
		hi := time.Duration(k+1) * width
		most := -1
		for ; i < len(s) && s[i].At < hi; i++ {
			most = max(most, s[i].N)
			last = s[i].N
		}
		if most < 0 {
			most = last
		}
		ws[k].Workers = most
	}
	return ws
}

// recoveryTime is how long after the step the p99 recovered: the start
// (from the step) of the earliest window of the step phase, ws[from:to],
// such that it and every later window of the phase are good (p99 below
// limitUs, some call answered, none refused or failed). It is 0 if the
// step never hurt, and false if the last window of the phase is not good.
func recoveryTime(ws []stepWindow, from, to int, limitUs float64, width time.Duration) (time.Duration, bool) {
	if from < 0 || to > len(ws) || from >= to {
		return 0, false
	}
	k := to
	for k > from && ws[k-1].good(limitUs) {
		k--
	}
	if k == to {
		return 0, false
	}
	return time.Duration(k-from) * width, true
}

// workerFigures are the worker-count figures of one run.
type workerFigures struct {
	Baseline   int           // the last count before the step
	FirstExtra time.Duration // from the step to the first count above Baseline
	HasExtra   bool
	Peak       int           // the most counted from the step to the end
	ToPeak     time.Duration // from the step to the first count of Peak
	Back       time.Duration // from the drop to the first count at or below Baseline
	IsBack     bool
}

// workerTimes derives the worker figures from the samples of a run whose
// load stepped up at step and back down at drop.
func workerTimes(samples []workerSample, step, drop time.Duration) workerFigures {
	s := slices.Clone(samples)
	slices.SortFunc(s, func(a, b workerSample) int { return cmpFloat(float64(a.At), float64(b.At)) })
	var f workerFigures
	for _, x := range s {
		if x.At < step {
			f.Baseline = x.N
		}
	}
	f.Peak = -1
	for _, x := range s {
		if x.At < step {
			continue
		}
		if !f.HasExtra && x.N > f.Baseline {
			f.FirstExtra, f.HasExtra = x.At-step, true
		}
		if x.N > f.Peak {
			f.Peak, f.ToPeak = x.N, x.At-step
		}
		if !f.IsBack && x.At >= drop && x.N <= f.Baseline {
			f.Back, f.IsBack = x.At-drop, true
		}
	}
	if f.Peak < 0 {
		f.Peak = f.Baseline
	}
	return f
}

// stepFigures are one run's figures, or the median of the runs (each
// figure its own median). A time that did not happen is -1.
type stepFigures struct {
	PreP99us        float64 `json:"pre_step_p99_us"`           // calls due from Settle to the step
	PreLateP99us    float64 `json:"pre_step_send_late_p99_us"` // of those calls, the p99 of the generator's lateness in sending
	StepP99us       float64 `json:"step_p99_us"`               // calls due in the step
	PostP99us       float64 `json:"post_step_p99_us"`          // calls due after the drop
	LimitUs         float64 `json:"recovered_below_us"`
	RecoveryMs      float64 `json:"recovery_ms" median:"never"`
	OverLimit       float64 `json:"windows_over_limit"` // windows of the step phase that were not good
	FirstExtraMs    float64 `json:"first_extra_worker_ms" median:"never"`
	BaselineWorkers float64 `json:"baseline_workers"`
	PeakWorkers     float64 `json:"peak_workers"`
	ToPeakMs        float64 `json:"to_peak_ms"`
	BackMs          float64 `json:"back_to_baseline_ms" median:"never"` // from the drop
	Offered         float64 `json:"offered"`
	Refused         float64 `json:"refused"`
	Failed          float64 `json:"failed"`
	TimedOut        float64 `json:"timed_out"`
}

// stepFiguresOf derives a run's figures from its trace and worker samples.
func stepFiguresOf(sl stepLoad, calls []callTrace, samples []workerSample) (stepFigures, []stepWindow) {
	var pre, during, post, late []time.Duration
	var f stepFigures
	for _, c := range calls {
		f.Offered++
		switch c.Outcome {
		case callRefused:
			f.Refused++
			continue
		case callFailed:
			f.Failed++
			continue
		case callTimedOut:
			f.TimedOut++
		}
		l := c.Latency
		if c.Outcome == callTimedOut {
			l = max(l, sl.Timeout)
		}
		switch {
		case c.Due < sl.Settle:
		case c.Due < sl.Step():
			pre = append(pre, l)
			if c.Outcome != callTimedOut {
				late = append(late, c.Late)
			}
		case c.Due < sl.Drop():
			during = append(during, l)
		default:
			post = append(post, l)
		}
	}
	p99 := func(v []time.Duration) float64 {
		slices.Sort(v)
		return us(percentile(v, 99))
	}
	f.PreP99us, f.StepP99us, f.PostP99us, f.PreLateP99us = p99(pre), p99(during), p99(post), p99(late)
	f.LimitUs = sl.Limit * f.PreP99us
	ws := stepWindows(calls, samples, sl.Step(), sl.End(), sl.Window, sl.Timeout)
	from := int(sl.Step() / sl.Window)
	to := int((sl.Drop() + sl.Window - 1) / sl.Window)
	f.RecoveryMs = -1
	if r, ok := recoveryTime(ws, from, to, f.LimitUs, sl.Window); ok && f.PreP99us > 0 {
		f.RecoveryMs = ms(r)
	}
	for k := from; k < min(to, len(ws)); k++ {
		if !ws[k].good(f.LimitUs) {
			f.OverLimit++
		}
	}
	wf := workerTimes(samples, sl.Step(), sl.Drop())
	f.BaselineWorkers, f.PeakWorkers, f.ToPeakMs = float64(wf.Baseline), float64(wf.Peak), ms(wf.ToPeak)
	f.FirstExtraMs, f.BackMs = -1, -1
	if wf.HasExtra {
		f.FirstExtraMs = ms(wf.FirstExtra)
	}
	if wf.IsBack {
		f.BackMs = ms(wf.Back)
	}
	return f, ws
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// recoveryRun is the run whose recovery time is the median ("never" above
// every time): the one drawn.
func recoveryRun(runs []stepFigures) int {
	return medianRun(runs, func(f stepFigures) float64 {
		if f.RecoveryMs < 0 {
			return math.Inf(1)
		}
		return f.RecoveryMs
	})
}
