package bench

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"
)

// stamped is one reading of a poller, with when it was taken.
type stamped[T any] struct {
	At time.Time
	V  T
}

// poll reads every interval, at once and then on each tick, until the
// returned stop is called; stop returns the readings that succeeded, in
// order. S3, S5 and S6 watch a system this way while the load runs.
func poll[T any](ctx context.Context, every time.Duration, read func() (T, bool)) (stop func() []stamped[T]) {
	var (
		mu   sync.Mutex
		seen []stamped[T]
		wg   sync.WaitGroup
	)
	pctx, cancel := context.WithCancel(ctx)
	wg.Add(1)
	go func() {
		defer wg.Done()
		tk := time.NewTicker(every)
		defer tk.Stop()
		for {
			at := time.Now()
			if v, ok := read(); ok {
				mu.Lock()
				seen = append(seen, stamped[T]{at, v})
				mu.Unlock()
			}
			select {
			case <-pctx.Done():
				return
			case <-tk.C:
			}
		}
	}()
	return func() []stamped[T] {
		cancel()
		wg.Wait()
		return seen
	}
}

// interleaved runs every system runs times, rotating which goes first in
// each round (and, with alternate, reversing the order of every other
// round) so that no system always runs on a machine its neighbour just
// warmed. once(r, i) starts system i, measures run r and stops it; it
// returns startErr if the system did not start (it is skipped from then
// on, the reason in skipped) and runErr if the run failed (no more runs of
// it; the error ends up in skipped too, unless some run succeeded, and is
// returned per system). ok(i) says whether system i has a run to report.
// Each run is a step of pr's plan, planned to take per.
func interleaved(ctx context.Context, log io.Writer, pr *progress, per time.Duration, names []string, runs int, alternate bool,
	skipped map[string]string, once func(r, i int) (startErr, runErr error), ok func(i int) bool) ([]string, error) {
	errs := make([]string, len(names))
	for r := range runs {
		for k := range names {
			si := (k + r) % len(names)
			if alternate && r%2 == 1 {
				si = len(names) - 1 - si
			}
			if ctx.Err() != nil {
				return errs, ctx.Err()
			}
			if _, gone := skipped[names[si]]; gone || errs[si] != "" {
				continue
			}
			startErr, runErr := once(r, si)
			pr.step(per)
			switch {
			case startErr != nil:
				fmt.Fprintf(log, "  %s not started: %v\n", names[si], startErr)
				skipped[names[si]] = oneLine(startErr.Error())
				pr.drop(runs-r-1, per)
			case runErr != nil:
				errs[si] = runErr.Error()
				fmt.Fprintf(log, "  run %d %-24s error: %v\n", r+1, names[si], runErr)
				pr.drop(runs-r-1, per)
			}
			pr.report(fmt.Sprintf("run %d/%d of %s done", r+1, runs, names[si]))
		}
	}
	for i, e := range errs {
		if e != "" && !ok(i) {
			skipped[names[i]] = oneLine(e)
		}
	}
	return errs, nil
}

// runSet is one system's runs in a scenario that starts its systems afresh
// for every run (S3, S5, S6, S8, S9): each run's figures, each figure's
// median, the run the plots draw, and the error that ended its runs.
type runSet[F any] struct {
	Runs   []F    `json:"runs"`
	Median F      `json:"median"`
	Drawn  int    `json:"drawn_run"` // the run whose key figure is the median (see the scenario): the one drawn
	Error  string `json:"error,omitempty"`
}
