package bench

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// The run/collect/report shape of the scenarios that measure a few
// systems one setup at a time (S3, S5, S6, S8, S9): pick the systems the
// session asked for; run each of them runs times in turn (runEach: the
// order rotates between runs), each run keeping its figures and a trace
// of what happened; draw for each system the run whose key figure is the
// median; and report the systems that ran, with those that could not.
// What differs is the scenario's: how one run goes, what its figures and
// trace are, and the report's own part.

// newReportFunc makes a scenario's report: id, title, the systems in it,
// those skipped (and why), the timing.
type newReportFunc func(id, title string, systems []string, skipped map[string]string, o runOptions) *report

// systemsRun is one scenario's runs: F its figures of a run, T the trace
// of a run that its report draws from.
type systemsRun[F any, T any] struct {
	id        string        // "S3"
	names     []string      // the systems, in order
	runs      int           // runs per system
	per       time.Duration // one run, for the progress's plan
	alternate bool          // runEach's: reverse the order on every other run
	drawn     func([]F) int // which run is drawn: the one whose key figure is the median
	// once runs run r of system i: its figures and trace, or why the
	// system could not start (the system is skipped) or the run failed.
	once func(r, i int) (f F, tr T, startErr, runErr error)
}

// systemRuns is what one system's runs gave: the runs and their medians,
// and each run's trace.
type systemRuns[F any, T any] struct {
	System string
	Index  int // in the scenario's systems
	Set    runSet[F]
	Traces []T
}

// drawnTrace is the trace of the run drawn.
func (m systemRuns[F, T]) drawnTrace() T { return m.Traces[m.Set.Drawn] }

// measure runs every system runs times with interleaved, each run a step
// of the session's progress planned to take per, and returns the systems
// that completed at least one run, in the scenario's order, with their
// runs' medians and the run drawn; and the systems skipped, with why.
func (sr systemsRun[F, T]) measure(ctx context.Context, cfg Config) ([]systemRuns[F, T], map[string]string, error) {
	ms := make([]systemRuns[F, T], len(sr.names))
	skipped := map[string]string{}
	errs, err := interleaved(ctx, cfg.Log, cfg.progress, sr.per, sr.names, sr.runs, sr.alternate, skipped, func(r, i int) (error, error) {
		f, tr, startErr, runErr := sr.once(r, i)
		if startErr == nil && runErr == nil {
			ms[i].Set.Runs = append(ms[i].Set.Runs, f)
			ms[i].Traces = append(ms[i].Traces, tr)
		}
		return startErr, runErr
	}, func(i int) bool { return len(ms[i].Set.Runs) > 0 })
	if err != nil {
		return nil, nil, err
	}
	var out []systemRuns[F, T]
	for i, m := range ms {
		m.Set.Error = errs[i]
		if len(m.Set.Runs) > 0 {
			m.System, m.Index = sr.names[i], i
			m.Set.Median = medianOf(m.Set.Runs)
			m.Set.Drawn = sr.drawn(m.Set.Runs)
			out = append(out, m)
		}
	}
	return out, skipped, nil
}

// reportOf writes the scenario's report: the systems measured, those
// skipped, and fill's own part (its results, setup, notes and plots).
func (sr systemsRun[F, T]) reportOf(cfg Config, newReport newReportFunc, title string, o runOptions,
	ms []systemRuns[F, T], skipped map[string]string, fill func(*report)) error {
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.System
	}
	r := newReport(sr.id, title, names, skipped, o)
	fill(r)
	return writeReport(cfg, r)
}

// selected are the systems of a scenario the session asked for (all when
// it named none); with none of them it says so.
func selected[S any](cfg Config, id string, systems []S, name func(S) string) []S {
	out := slices.DeleteFunc(systems, func(s S) bool {
		return len(cfg.Systems) > 0 && !slices.Contains(cfg.Systems, name(s))
	})
	if len(out) == 0 {
		fmt.Fprintf(cfg.Log, "%s: none of its systems selected\n", id)
	}
	return out
}
