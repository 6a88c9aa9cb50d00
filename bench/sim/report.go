package sim

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"

	"tpsched/scd/loadlevel"
	"tpsched/scd/route"
)

// Grid is a sweep: every balancer at every thresholds, node count, load
// and staleness, the rest of Base the same (Base.Thresholds when
// Thresholds is empty, Base.Nodes when Nodes is). A balancer that sees
// fresh levels (the oracle) runs at the first staleness only: the others
// would repeat it. Runs of a grid share the seed, so that the balancers
// meet the same arrivals and service times.
type Grid struct {
	Base       Config // Nodes, Thresholds, Requests, Warmup, Seed
	Thresholds []loadlevel.Thresholds
	Nodes      []int
	Loads      []float64
	Staleness  []float64
	Balancers  []Balancer
	// PerNode, when above 0, sets Requests and Warmup to this many per
	// node each (a node must see enough requests to reach its steady
	// state, so more nodes need more requests).
	PerNode int
}

// Configs lists the grid's runs: by thresholds, then nodes, then load,
// then staleness, then balancer.
func (g Grid) Configs() []Config {
	ths := g.Thresholds
	if len(ths) == 0 {
		ths = []loadlevel.Thresholds{g.Base.Thresholds}
	}
	ns := g.Nodes
	if len(ns) == 0 {
		ns = []int{g.Base.Nodes}
	}
	var cs []Config
	for _, th := range ths {
		for _, n := range ns {
			for _, load := range g.Loads {
				for k, s := range g.Staleness {
					for _, b := range g.Balancers {
						if b.Fresh && k > 0 {
							continue
						}
						c := g.Base
						c.Thresholds, c.Nodes, c.Load, c.Staleness, c.Balancer = th, n, load, s, b
						if g.PerNode > 0 {
							c.Requests, c.Warmup = g.PerNode*n, g.PerNode*n
						}
						cs = append(cs, c)
					}
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
	ns := nodeCounts(rep.Results)
	if len(rep.Results) > 0 {
		c := rep.Results[0].Config
		fmt.Fprintf(&b, "%s nodes, each a FIFO server with exponential service (mean 1); Poisson arrivals at a uniformly random sender; "+
			"%s requests measured per run after %s of warm-up; seed %d. Levels by Table 3-14 on the requests waiting (%s), "+
			"re-evaluated at every arrival and departure; senders see the other nodes' levels `staleness` time units old, "+
			"their own level and their own in-flight counts fresh. "+
			"Times are in mean service times; max queue is the most requests at one node; L2 share is the fraction of node-time at LEVEL2; "+
			"level changes are per node per time unit: each is an announce every other node must receive.\n\n",
			joinInts(ns), perNodes(rep.Results, func(c Config) int { return c.Requests }), perNodes(rep.Results, func(c Config) int { return c.Warmup }),
			c.Seed, thresholdsText(c.Thresholds))
	}
	b.WriteString("Balancers (all scd/route.Choose): `random` = OpenTP1 rule, scd_announce_server_status=N; " +
		"`opentp1` = OpenTP1 rule for a server's call, announce Y (Table 3-7: random among the nodes at the lowest level seen); " +
		"`p2c` = P2C on (level, in-flight); `p2c-inflight` = P2C, announce N (in-flight only); " +
		"`opentp1-direct` = OpenTP1 rule for a scheduler-direct call, schedule_rate 50 (random among the nodes not at LEVEL2); " +
		"`oracle` = OpenTP1's least-loaded rule over every node's level as it is now (no staleness: a table that costs nothing to keep).\n\n")

	var headline []Result
	for _, r := range rep.Results {
		if r.Load == rep.HeadlineLoad && (r.Staleness == rep.HeadlineStaleness || r.Balancer.Fresh) {
			headline = append(headline, r)
		}
	}
	if len(headline) > 0 {
		fmt.Fprintf(&b, "## Load %.2f, levels %g time units old\n\n", rep.HeadlineLoad, rep.HeadlineStaleness)
		if len(ns) > 1 {
			b.WriteString("| nodes | balancer | p50 | p99 | p99.9 | mean | max queue | L2 share | level changes |\n")
			b.WriteString("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
			for _, r := range headline {
				fmt.Fprintf(&b, "| %d | %s | %s | %.3f |\n", r.Nodes, r.Balancer.Name, figures(r), r.LevelChanges)
			}
		} else {
			b.WriteString("| balancer | p50 | p99 | p99.9 | mean | max queue | L2 share |\n")
			b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
			for _, r := range headline {
				fmt.Fprintf(&b, "| %s | %s |\n", r.Balancer.Name, figures(r))
			}
		}
		b.WriteString("\n")
	}

	if oracle := rep.againstOracle(); oracle != "" {
		b.WriteString(oracle)
	}
	if cost := rep.tableCost(); cost != "" {
		b.WriteString(cost)
	}

	if len(rep.Results) > 0 {
		b.WriteString("## Load and staleness\n\n")
		b.WriteString("| nodes | load | staleness | balancer | p50 | p99 | p99.9 | mean | max queue | L2 share | level changes |\n")
		b.WriteString("| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, r := range rep.Results {
			stale := fmt.Sprintf("%g", r.Staleness)
			if r.Balancer.Fresh {
				stale = "fresh"
			}
			fmt.Fprintf(&b, "| %d | %.2f | %s | %s | %s | %.3f |\n", r.Nodes, r.Load, stale, r.Balancer.Name, figures(r), r.LevelChanges)
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

// againstOracle is, per node count and load, each balancer's p99 at each
// staleness and its ratio to the oracle's; "" without an oracle.
func (rep Report) againstOracle() string {
	type key struct {
		nodes int
		load  float64
	}
	oracle := map[key]Result{}
	var keys []key
	var stale []float64
	var names []string
	for _, r := range rep.Results {
		k := key{r.Nodes, r.Load}
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
		if r.Balancer.Fresh {
			oracle[k] = r
			continue
		}
		if !slices.Contains(stale, r.Staleness) {
			stale = append(stale, r.Staleness)
		}
		if !slices.Contains(names, r.Balancer.Name) {
			names = append(names, r.Balancer.Name)
		}
	}
	if len(oracle) == 0 || len(stale) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("## Against the oracle\n\n")
	b.WriteString("p99 by the age of the levels senders see, and its ratio to the oracle's (which sees every level as it is now). " +
		"A full table of levels is worth keeping where a rule that reads it beats the ones that do not (`random`, `p2c-inflight`) " +
		"at the staleness the announces achieve.\n\n")
	b.WriteString("| nodes | load | balancer |")
	for _, s := range stale {
		fmt.Fprintf(&b, " %g old |", s)
	}
	b.WriteString("\n| ---: | ---: | --- |" + strings.Repeat(" ---: |", len(stale)) + "\n")
	for _, k := range keys {
		o, ok := oracle[k]
		if !ok {
			continue
		}
		fmt.Fprintf(&b, "| %d | %.2f | oracle |", k.nodes, k.load)
		for range stale {
			fmt.Fprintf(&b, " %.1f |", o.P99)
		}
		b.WriteString("\n")
		for _, name := range names {
			fmt.Fprintf(&b, "| %d | %.2f | %s |", k.nodes, k.load, name)
			for _, s := range stale {
				cell := " - |"
				for _, r := range rep.Results {
					if r.Nodes == k.nodes && r.Load == k.load && r.Staleness == s && r.Balancer.Name == name {
						cell = fmt.Sprintf(" %.1f (x%.1f) |", r.P99, r.P99/o.P99)
					}
				}
				b.WriteString(cell)
			}
			b.WriteString("\n")
		}
	}
	b.WriteString("\n")
	return b.String()
}

// tableCost is what keeping every node's level costs, per node count and
// load: the oracle's level changes (levels as they are now) are announces
// every other node must receive, each ceil(log2 n) times with the finger
// relay (scd/names); P2C with fresh levels needs only the two nodes it
// draws, asked at send time. "" without an oracle.
func (rep Report) tableCost() string {
	var rows []string
	for _, o := range rep.Results {
		if !o.Balancer.Fresh {
			continue
		}
		var p2c *Result
		for i, r := range rep.Results {
			if r.Nodes == o.Nodes && r.Load == o.Load && r.Staleness == 0 && r.Balancer.Policy.Rule == route.P2C && r.Balancer.Policy.Announce && !r.Balancer.Fresh {
				p2c = &rep.Results[i]
			}
		}
		announces := float64(o.Nodes-1) * o.LevelChanges
		fingers := 0
		for d := 1; d < o.Nodes; d *= 2 {
			fingers++
		}
		row := fmt.Sprintf("| %d | %.2f | %.3f | %.0f | %.0f | %.1f |", o.Nodes, o.Load, o.LevelChanges, announces, announces*float64(fingers), 4*o.Load)
		if p2c != nil {
			row += fmt.Sprintf(" %.1f (x%.2f) |", p2c.P99, p2c.P99/o.P99)
		} else {
			row += " - |"
		}
		rows = append(rows, row)
	}
	if len(rows) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("## What fresh levels cost\n\n")
	b.WriteString("Per node and time unit (a mean service time): the oracle's level changes; the announces each node must receive to hold " +
		"every other node's level as it is (n-1 times that); the messages that makes with the finger relay, each change reaching each member " +
		"ceil(log2 n) times; and what P2C needs instead when it asks the two nodes it draws for their level at send time (a request and an " +
		"answer to each, for the load arriving at the node: 4 x load), with P2C's p99 on fresh levels against the oracle's.\n\n")
	b.WriteString("| nodes | load | level changes | announces received | messages received (finger relay) | P2C asking two nodes: messages | P2C on fresh levels: p99 (x oracle) |\n")
	b.WriteString("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rows {
		b.WriteString(r + "\n")
	}
	b.WriteString("\n")
	return b.String()
}

// nodeCounts are the node counts of results, in order of appearance.
func nodeCounts(results []Result) []int {
	var ns []int
	for _, r := range results {
		if !slices.Contains(ns, r.Nodes) {
			ns = append(ns, r.Nodes)
		}
	}
	return ns
}

func joinInts(v []int) string {
	var s []string
	for _, x := range v {
		s = append(s, strconv.Itoa(x))
	}
	return strings.Join(s, " and ")
}

// perNodes writes what of (Requests or Warmup) the results used: one
// number, or that number per node when it grows with the nodes.
func perNodes(results []Result, of func(Config) int) string {
	var vals []string
	perNode := len(results) > 0
	for _, r := range results {
		v := strconv.Itoa(of(r.Config))
		if !slices.Contains(vals, v) {
			vals = append(vals, v)
		}
		perNode = perNode && of(r.Config)%r.Nodes == 0 && of(r.Config)/r.Nodes == of(results[0].Config)/results[0].Nodes
	}
	if len(vals) > 1 && perNode {
		return fmt.Sprintf("%d per node (%s)", of(results[0].Config)/results[0].Nodes, strings.Join(vals, ", "))
	}
	return strings.Join(vals, ", ")
}

// figures are a result's p50 .. L2 share columns.
func figures(r Result) string {
	return fmt.Sprintf("%.2f | %.1f | %.1f | %.2f | %d | %.1f%%", r.P50, r.P99, r.P999, r.Mean, r.MaxQueue, 100*r.Level2Share)
}

// thresholdsText writes th as the definition operands.
func thresholdsText(th loadlevel.Thresholds) string {
	return fmt.Sprintf("levelup_queue_count = %d,%d and leveldown_queue_count = %d,%d", th.U1, th.U2, th.D0, th.D1)
}
