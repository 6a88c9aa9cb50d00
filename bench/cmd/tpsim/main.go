// Command tpsim runs the inter-node balancing simulation of bench/sim: the
// balancers (random, OpenTP1's rules for a server's call and for a
// scheduler-direct one, P2C, P2C on in-flight alone, and the oracle that
// sees every level as it is now) at every node count, load and level
// staleness asked for, then at the headline point (load 0.9, levels 10 old)
// under the -sensitivity thresholds, and writes the results as Markdown to
// stdout or to -out.
//
//	tpsim [-nodes 128,1000] [-loads 0.7,0.9] [-staleness 0,1,10,100] [-per-node 1000]
//	      [-requests 2000000 -warmup 200000 (with -per-node 0)] [-thresholds 4,8,2,6]
//	      [-sensitivity '1,2,0,1;2,4,1,3;8,16,4,12'] [-seed 1] [-parallel N] [-out FILE]
//
// With -per-node N each run measures N requests per node after N of
// warm-up: a node must see enough requests to reach its steady state. The
// default run is 138 simulations, about 6 CPU-minutes (3 on two idle
// CPUs). Runs are deterministic: the same flags give the same table,
// whatever -parallel is.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
	"tpsched/internal/version"

	"tpsched/bench/sim"
	"tpsched/scd/loadlevel"
)

func main() {
	nodes := flag.String("nodes", "128,1000", fmt.Sprintf("node counts, comma-separated (each 1..%d)", sim.MaxNodes))
	perNode := flag.Int("per-node", 1000, "requests measured per node, and as many of warm-up (0: -requests and -warmup)")
	loads := flag.String("loads", "0.7,0.9", "offered loads per node, comma-separated (each 0 < load < 1)")
	stale := flag.String("staleness", "0,1,10,100", "ages of the levels senders see, in mean service times, comma-separated")
	requests := flag.Int("requests", 2_000_000, "measured requests per run (with -per-node 0)")
	warmup := flag.Int("warmup", 200_000, "unmeasured requests before them (with -per-node 0)")
	thresholds := flag.String("thresholds", "4,8,2,6", "Table 3-14 thresholds U1,U2,D0,D1 (levelup_queue_count, leveldown_queue_count)")
	sensitivity := flag.String("sensitivity", "1,2,0,1;2,4,1,3;8,16,4,12", "other thresholds run at the headline point, ';'-separated (empty: none)")
	seed := flag.Uint64("seed", 1, "random seed")
	parallel := flag.Int("parallel", runtime.GOMAXPROCS(0), "runs at once")
	headLoad := flag.Float64("headline-load", 0.9, "load of the headline table")
	headStale := flag.Float64("headline-staleness", 10, "staleness of the headline table")
	out := flag.String("out", "", "write the Markdown here instead of stdout")
	showVersion := flag.Bool("version", false, "print tpsim's version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Line("tpsim"))
		return
	}

	if err := run(*nodes, *perNode, *loads, *stale, *requests, *warmup, *thresholds, *sensitivity, *seed, *parallel, *headLoad, *headStale, *out); err != nil {
		fmt.Fprintln(os.Stderr, "tpsim:", err)
		os.Exit(1)
	}
}

func run(nodes string, perNode int, loads, stale string, requests, warmup int, thresholds, sensitivity string, seed uint64,
	parallel int, headLoad, headStale float64, out string) error {
	th, err := parseThresholds(thresholds)
	if err != nil {
		return err
	}
	grid := sim.Grid{
		Base:      sim.Config{Thresholds: th, Requests: requests, Warmup: warmup, Seed: seed},
		Balancers: sim.Balancers,
		PerNode:   perNode,
	}
	ns, err := parseFloats("-nodes", nodes)
	if err != nil {
		return err
	}
	for _, n := range ns {
		if n != float64(int(n)) {
			return fmt.Errorf("-nodes: %v is not a whole number", n)
		}
		grid.Nodes = append(grid.Nodes, int(n))
	}
	if grid.Loads, err = parseFloats("-loads", loads); err != nil {
		return err
	}
	if grid.Staleness, err = parseFloats("-staleness", stale); err != nil {
		return err
	}
	other := sim.Grid{
		Base:      grid.Base,
		Nodes:     grid.Nodes,
		Loads:     []float64{headLoad},
		Staleness: []float64{headStale},
		Balancers: sim.Balancers,
		PerNode:   perNode,
	}
	for f := range strings.SplitSeq(sensitivity, ";") {
		if strings.TrimSpace(f) == "" {
			continue
		}
		th, err := parseThresholds(f)
		if err != nil {
			return fmt.Errorf("-sensitivity: %w", err)
		}
		other.Thresholds = append(other.Thresholds, th)
	}

	start := time.Now()
	configs := grid.Configs()
	if len(other.Thresholds) > 0 {
		configs = append(configs, other.Configs()...)
	}
	results, err := sim.Sweep(configs, parallel)
	if err != nil {
		return err
	}
	rep := sim.Report{
		Results:           results[:len(grid.Configs())],
		Sensitivity:       results[len(grid.Configs()):],
		HeadlineLoad:      headLoad,
		HeadlineStaleness: headStale,
	}
	var buf bytes.Buffer
	if err := rep.WriteMarkdown(&buf); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "tpsim: %d runs in %v\n", len(results), time.Since(start).Round(time.Millisecond))
	if out == "" {
		_, err = os.Stdout.Write(buf.Bytes())
		return err
	}
	return os.WriteFile(out, buf.Bytes(), 0o644)
}

// parseFloats reads a comma-separated list of numbers.
func parseFloats(flagName, s string) ([]float64, error) {
	var xs []float64
	for f := range strings.SplitSeq(s, ",") {
		x, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not a number", flagName, f)
		}
		xs = append(xs, x)
	}
	return xs, nil
}

// parseThresholds reads "U1,U2,D0,D1".
func parseThresholds(s string) (loadlevel.Thresholds, error) {
	var v [4]int
	fields := strings.Split(s, ",")
	if len(fields) != len(v) {
		return loadlevel.Thresholds{}, fmt.Errorf("thresholds: want U1,U2,D0,D1, got %q", s)
	}
	for i, f := range fields {
		x, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return loadlevel.Thresholds{}, fmt.Errorf("thresholds: %q is not an integer", f)
		}
		v[i] = x
	}
	return loadlevel.Thresholds{U1: v[0], U2: v[1], D0: v[2], D1: v[3]}, nil
}
