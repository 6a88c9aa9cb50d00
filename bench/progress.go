package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// progress tells the operator of a session how far it has come and about
// how long the rest will take. Every scenario has a plan, the time its
// steps (one system's run in a cell, or one run of a scenario that starts
// its systems afresh) should take by their warm-up and measured time. What
// is left is two parts:
//
//   - the plan of the steps still to come, scaled by how long the steps
//     done so far took against theirs (starting systems, writing reports),
//     not counting the time spent waiting for other tenants and running
//     disturbed runs again, nor what came before the first scenario began
//     (the grids' systems all start once, before the first cell); early in
//     a session that ratio rests on little and is drawn towards 1 (as if
//     priorWork of planned steps had gone exactly to plan);
//   - the waiting for quiet and the runs made again: at the rate seen so
//     far per planned second, but never more than what is left of the
//     session's quiet budget, which bounds them (Quiet.Budget).
//
// The first version scaled everything, waits included, by the first
// cell's ratio: on a busy machine its first estimate of a 6-minute quick
// session was 1h3m.
type progress struct {
	log   io.Writer
	now   func() time.Time
	start time.Time
	// quiet is the session's quiet budget, whose spending the waits and
	// retries count; its zero value (no budget) spends nothing.
	quiet Quiet
	// plans of the scenarios not begun yet, in the order they run
	ahead []scenarioPlan
	// setup is the time before the first scenario began (the grids'
	// systems starting): spent once, not a rate of the steps.
	setup time.Duration
	begun bool
	// the scenario running now
	cur        string
	curPlanned time.Duration
	curDone    time.Duration
	curSteps   int
	curStep    int
	// plan of every step done in the session
	done time.Duration
	// announced is the session's plan as announce printed it, which
	// finish sets beside done: the two differ by the systems that did not
	// start or failed, and a reader saw only two numbers that disagreed
	// (issue 31 item 6: 8m5s at the start, 7m16s at the end).
	announced time.Duration
}

// scenarioPlan is what a scenario is expected to take: its steps, and
// their planned time together.
type scenarioPlan struct {
	id      string
	steps   int
	planned time.Duration
}

// plan is steps steps of per each.
func plan(id string, steps int, per time.Duration) scenarioPlan {
	return scenarioPlan{id, steps, time.Duration(steps) * per}
}

// and is p followed by steps more of per each.
func (p scenarioPlan) and(steps int, per time.Duration) scenarioPlan {
	p.steps += steps
	p.planned += time.Duration(steps) * per
	return p
}

// stepSlack is what a step costs beyond its warm-up and measured time when
// nothing goes wrong (reading /proc, closing connections): a first guess
// the measured ratio corrects.
const stepSlack = 300 * time.Millisecond

func newProgress(log io.Writer, now func() time.Time, plans []scenarioPlan) *progress {
	if now == nil {
		now = time.Now
	}
	return &progress{log: log, now: now, start: now(), ahead: plans}
}

// announce prints the session's plan before it starts.
func (p *progress) announce() {
	if p == nil || p.log == nil || len(p.ahead) == 0 {
		return
	}
	var ids []string
	var all time.Duration
	for _, a := range p.ahead {
		ids = append(ids, fmt.Sprintf("%s %d steps", a.id, a.steps))
		all += a.planned
	}
	p.announced = all
	fmt.Fprintf(p.log, "session: %s; planned about %s if every system starts (starting systems and waiting for a quiet machine add to that; each cell and run says what is left)\n",
		strings.Join(ids, ", "), roughly(all))
}

// begin starts a scenario with its plan, made now that it knows which of
// its systems run.
func (p *progress) begin(sp scenarioPlan) {
	if p == nil {
		return
	}
	if !p.begun {
		p.begun, p.setup = true, p.now().Sub(p.start)
	}
	for i, a := range p.ahead {
		if a.id == sp.id {
			p.ahead = append(p.ahead[:i:i], p.ahead[i+1:]...)
			break
		}
	}
	p.cur, p.curPlanned, p.curDone, p.curSteps, p.curStep = sp.id, sp.planned, 0, sp.steps, 0
}

// step counts one step done that was planned to take planned.
func (p *progress) step(planned time.Duration) {
	if p == nil {
		return
	}
	p.curStep++
	p.curDone += planned
	p.done += planned
}

// drop takes steps of per each out of the current scenario's plan: a
// system that did not start or failed has no more runs.
func (p *progress) drop(steps int, per time.Duration) {
	if p == nil || steps <= 0 {
		return
	}
	p.curSteps -= steps
	p.curPlanned -= time.Duration(steps) * per
}

// report prints where the session is after what (a cell or a run) and
// what is left of the scenario and of the session.
func (p *progress) report(what string) {
	if p == nil || p.log == nil {
		return
	}
	scen, session := p.left()
	waits := ""
	if q := p.quiet.used(); q >= time.Second {
		waits = fmt.Sprintf(" (%s of it waiting for quiet and running disturbed runs again)", roughly(q))
	}
	fmt.Fprintf(p.log, "  [%s %d/%d] %s; %s so far%s, about %s left in %s, %s in the session\n",
		p.cur, p.curStep, p.curSteps, what, roughly(p.now().Sub(p.start)), waits, roughly(scen), p.cur, roughly(session))
}

// priorWork is how much planned work the estimate's ratio counts as done
// exactly to plan before any is: the weight of the plan against what the
// first steps measured.
const priorWork = 30 * time.Second

// left is the estimate of what remains of the current scenario and of the
// whole session (see progress).
func (p *progress) left() (scenario, session time.Duration) {
	rest := max(p.curPlanned-p.curDone, 0)
	all := rest
	for _, a := range p.ahead {
		all += a.planned
	}
	elapsed := p.now().Sub(p.start) - p.setup
	waited := min(p.quiet.used(), max(elapsed, 0))
	work := max(elapsed-waited, 0)
	scale := float64(work+priorWork) / float64(p.done+priorWork)
	wait := func(planned time.Duration) time.Duration {
		if p.done <= 0 {
			return 0
		}
		return min(time.Duration(float64(waited)*float64(planned)/float64(p.done)), p.quiet.budgetLeft())
	}
	return time.Duration(float64(rest)*scale) + wait(rest), time.Duration(float64(all)*scale) + wait(all)
}

// finish prints how long the session took against its plan, and how much
// of it went to waiting for quiet and to runs made again.
func (p *progress) finish() {
	if p == nil || p.log == nil {
		return
	}
	planned := "planned " + roughly(p.done).String()
	if a := roughly(p.announced); p.announced > 0 && a != roughly(p.done) {
		planned = fmt.Sprintf("planned %s for the steps it made (%s at the start: the runs of systems that did not start or failed came out)", roughly(p.done), a)
	}
	fmt.Fprintf(p.log, "session: done in %s, %s; waiting for quiet and running disturbed runs again took %s of it (budget %s)\n",
		roughly(p.now().Sub(p.start)), planned, roughly(p.quiet.used()), p.quiet.Budget)
}

// roughly rounds d as people say it: to seconds under ten minutes, else
// to ten seconds.
func roughly(d time.Duration) time.Duration {
	if d >= 10*time.Minute {
		return d.Round(10 * time.Second)
	}
	return d.Round(time.Second)
}

// startSlack is what starting a system afresh for a run costs, a first
// guess.
const startSlack = time.Second

// sessionPlan is the plan of every scenario cfg selects, in the order Run
// runs them, from the same sizing the scenarios use. Systems that do not
// start are taken out of the plan when their scenario begins.
func sessionPlan(cfg Config, opts runOptions) []scenarioPlan {
	want := func(s string) bool { return slices.Contains(cfg.Scenarios, s) }
	var out []scenarioPlan
	for _, g := range grids {
		if want(g.id) {
			n := len(cfg.selected(g.systems[boolIndex(cfg.Quick)]))
			out = append(out, plan(g.id, len(g.cells(cfg.Quick))*n*opts.Runs, opts.stepTime()))
		}
	}
	if want("S3") {
		sl, runs := s3Sizing(cfg)
		var names []string
		for _, sys := range s3Systems(cfg.Env, cfg.Spec) {
			names = append(names, sys.name)
		}
		out = append(out, plan("S3", len(cfg.selected(names))*runs, s3RunTime(sl)))
	}
	if want("S4") {
		out = append(out, s4Plan(len(cfg.selected(s4Systems)), opts, !want("S2")))
	}
	if want("S5") {
		o, runs := s5Timing(cfg, opts)
		capOpts := opts
		capOpts.Runs = cfg.Runs
		limit := cfg.S5WaitLimit
		if limit <= 0 {
			limit = S5WaitLimit
		}
		var names []string
		for _, sys := range s5Systems(cfg.Env, cfg.Spec, limit) {
			names = append(names, sys.name)
		}
		out = append(out, s5Plan(len(cfg.selected(names)), capOpts, o, runs))
	}
	if want("S6") {
		o := s6Timing(cfg, opts)
		var names []string
		for _, sys := range s6Systems() {
			names = append(names, sys.name)
		}
		out = append(out, plan("S6", len(cfg.selected(names))*o.Runs, s6RunTime(o)))
	}
	if want("S7") {
		out = append(out, s7Plan(cfg))
	}
	if want("S8") {
		var names []string
		for _, sys := range s8Systems() {
			names = append(names, sys.name)
		}
		o := s8Timing(cfg, opts)
		out = append(out, plan("S8", len(cfg.selected(names))*o.Runs, s8RunTime(o)))
	}
	if want("S9") {
		var names []string
		for _, sys := range s9Systems() {
			names = append(names, sys.name)
		}
		setup, runs := s9Sizing(cfg)
		out = append(out, plan("S9", len(cfg.selected(names))*runs, s9RunTime(setup)))
	}
	return out
}
