package sim

import (
	"fmt"
	"io"
	"strings"
	"sync"

	"tpsched/scd/loadlevel"
)

// Grid is a sweep: every balancer at every thresholds, load and staleness,
// the rest of Base the same (Base.Thresholds when Thresholds is empty).
// Runs of a grid share the seed, so that the balancers meet the same
// arrivals and service times.
type Grid struct {
	Base       Config // Nodes, Thresholds, Requests, Warmup, Seed
	Thresholds []loadlevel.Thresholds
	Loads      []float64
	Staleness  []float64
	Balancers  []Balancer
}

// Configs lists the grid's runs: by thresholds, then load, then staleness,
// then balancer.
func (g Grid) Configs() []Config {
	ths := g.Thresholds
	if len(ths) == 0 {
		ths = []loadlevel.Thresholds{g.Base.Thresholds}
	}
	var cs []Config
	for _, th := range ths {
		for _, load := range g.Loads {
			for _, s := range g.Staleness {
				for _, b := range g.Balancers {
					c := g.Base
					c.Thresholds, c.Load, c.Staleness, c.Balancer = th, load, s, b
					cs = append(cs, c)
				}
			}
		}
	}
	return cs
}

// Sweep runs every config on up to parallel goroutines and returns the
// results in the order of configs, or the first error. Each run is
// deterministic, so the results do not depend on parallel.
func Sweep(configs []Config, parallel int) ([]Result, error) {
	for _, c := range configs {
		if err := c.Validate(); err != nil {
			return nil, err
		}
	}
	results := make([]Result, len(configs))
	errs := make([]error, len(configs))
	next := make(chan int)
	var wg sync.WaitGroup
	for range max(parallel, 1) {
		wg.Go(func() {
			for i := range next {
				results[i], errs[i] = Run(configs[i])
			}
		})
	}
	for i := range configs {
		next <- i
	}
	close(next)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return results, nil
}

// Report is what tpsim prints: a grid of results, the headline point in
// it, and optionally the same balancers at the headline point under other
// thresholds.
type Report struct {
	Results           []Result // the grid, in Grid.Configs order
	HeadlineLoad      float64
	HeadlineStaleness float64
	Sensitivity       []Result // other thresholds at the headline point; may be empty
}

// WriteMarkdown writes the report: the setting, the headline table, the
// grid in one table, and the thresholds table when there is one.
func (rep Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	b.WriteString("# Inter-node balancing with stale load levels (simulation)\n\n")
	if len(rep.Results) > 0 {
		c := rep.Results[0].Config
		fmt.Fprintf(&b, "%d nodes, each a FIFO server with exponential service (mean 1); Poisson arrivals at a uniformly random sender; "+
			"%d requests measured per run after %d of warm-up; seed %d. Levels by Table 3-14 on the requests waiting (%s), "+
			"re-evaluated at every arrival and departure; senders see the other nodes' levels `staleness` time units old, "+
			"their own level and their own in-flight counts fresh. "+
			"Times are in mean service times; max queue is the most requests at one node; L2 share is the fraction of node-time at LEVEL2.\n\n",
			c.Nodes, c.Requests, c.Warmup, c.Seed, thresholdsText(c.Thresholds))
	}
	b.WriteString("Balancers (all scd/route.Choose): `random` = OpenTP1 rule, scd_announce_server_status=N; " +
		"`opentp1` = OpenTP1 rule, announce Y (random, LEVEL2 avoided); `p2c` = P2C on (level, in-flight); " +
		"`p2c-inflight` = P2C, announce N (in-flight only).\n\n")

	var headline []Result
	for _, r := range rep.Results {
		if r.Load == rep.HeadlineLoad && r.Staleness == rep.HeadlineStaleness {
			headline = append(headline, r)
		}
	}
	if len(headline) > 0 {
		fmt.Fprintf(&b, "## Load %.2f, levels %g time units old\n\n", rep.HeadlineLoad, rep.HeadlineStaleness)
		b.WriteString("| balancer | p50 | p99 | p99.9 | mean | max queue | L2 share |\n")
		b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, r := range headline {
			fmt.Fprintf(&b, "| %s | %s |\n", r.Balancer.Name, figures(r))
		}
		b.WriteString("\n")
	}

	if len(rep.Results) > 0 {
		b.WriteString("## Load and staleness\n\n")
		b.WriteString("| load | staleness | balancer | p50 | p99 | p99.9 | mean | max queue | L2 share |\n")
		b.WriteString("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, r := range rep.Results {
			fmt.Fprintf(&b, "| %.2f | %g | %s | %s |\n", r.Load, r.Staleness, r.Balancer.Name, figures(r))
		}
		b.WriteString("\n")
	}

	if len(rep.Sensitivity) > 0 {
		fmt.Fprintf(&b, "## Thresholds, at load %.2f and levels %g time units old\n\n", rep.HeadlineLoad, rep.HeadlineStaleness)
		b.WriteString("| U1,U2,D0,D1 | balancer | p50 | p99 | p99.9 | mean | max queue | L2 share |\n")
		b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, r := range append(headline, rep.Sensitivity...) {
			th := r.Thresholds
			fmt.Fprintf(&b, "| %d,%d,%d,%d | %s | %s |\n", th.U1, th.U2, th.D0, th.D1, r.Balancer.Name, figures(r))
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// figures are a result's p50 .. L2 share columns.
func figures(r Result) string {
	return fmt.Sprintf("%.2f | %.1f | %.1f | %.2f | %d | %.1f%%", r.P50, r.P99, r.P999, r.Mean, r.MaxQueue, 100*r.Level2Share)
}

// thresholdsText writes th as the definition operands.
func thresholdsText(th loadlevel.Thresholds) string {
	return fmt.Sprintf("levelup_queue_count = %d,%d and leveldown_queue_count = %d,%d", th.U1, th.U2, th.D0, th.D1)
}
