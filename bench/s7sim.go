package bench

import (
	"bytes"
	"fmt"
	"io"
	"runtime"
	"strings"
	"time"

	"tpsched/bench/sim"
)

// S7's simulation: bench/sim's routing rules (tpsim's) over more nodes
// than a cluster holds, with stale levels, against the oracle that sees
// every level as it is now, and what keeping every level fresh would
// cost. It says where the 128-node design, a full table of every node's
// level kept by announces, stops paying.

// s7SimSetup is the simulation's grid; no Nodes: not run.
type s7SimSetup struct {
	Nodes     []int     `json:"nodes"`
	Loads     []float64 `json:"loads"`
	Staleness []float64 `json:"staleness"`
	PerNode   int       `json:"requests_per_node"` // measured, and as many of warm-up
	Seed      uint64    `json:"seed"`
}

var (
	s7SimFull  = s7SimSetup{Nodes: []int{128, 1000}, Loads: []float64{0.7, 0.9}, Staleness: []float64{0, 1, 10, 100}, PerNode: 1000, Seed: 1}
	s7SimQuick = s7SimSetup{Nodes: []int{1000}, Loads: []float64{0.9}, Staleness: []float64{0, 10}, PerNode: 200, Seed: 1}
)

// s7SimSizing is the simulation's grid for the session.
func s7SimSizing(cfg Config) s7SimSetup {
	if cfg.S7SimOff {
		return s7SimSetup{}
	}
	ss := s7SimFull
	if cfg.Quick {
		ss = s7SimQuick
	}
	if len(cfg.S7SimNodes) > 0 {
		ss.Nodes = cfg.S7SimNodes
	}
	return ss
}

func (ss s7SimSetup) grid() sim.Grid {
	return sim.Grid{
		Base:      sim.Config{Thresholds: sim.DefaultThresholds, Seed: ss.Seed},
		Nodes:     ss.Nodes,
		Loads:     ss.Loads,
		Staleness: ss.Staleness,
		Balancers: sim.Balancers,
		PerNode:   ss.PerNode,
	}
}

// estimate is a first guess of the simulation's wall time: about 1 us per
// request and 4 ns per request and node (the rules that scan every node),
// on every core.
func (ss s7SimSetup) estimate() time.Duration {
	var ns float64
	for _, c := range ss.grid().Configs() {
		reqs := float64(c.Requests + c.Warmup)
		ns += reqs * (1000 + 4*float64(c.Nodes))
	}
	return time.Duration(ns / float64(max(runtime.NumCPU(), 1)))
}

// simBeyond128 is the simulation's results.
type simBeyond128 struct {
	Setup   s7SimSetup   `json:"setup"`
	Results []sim.Result `json:"results"`
	Seconds float64      `json:"seconds"`
}

func runS7Sim(ss s7SimSetup, log io.Writer) (*simBeyond128, error) {
	configs := ss.grid().Configs()
	fmt.Fprintf(log, "S7: simulating the routing rules over %v nodes: %d runs\n", ss.Nodes, len(configs))
	start := time.Now()
	results, err := sim.Sweep(configs, runtime.NumCPU())
	if err != nil {
		return nil, err
	}
	return &simBeyond128{Setup: ss, Results: results, Seconds: time.Since(start).Seconds()}, nil
}

func (s *simBeyond128) setupLine() string {
	return fmt.Sprintf("Simulation (bench/sim, tpsim's model): %s nodes at loads %s, levels %s service times old, %d requests per node measured "+
		"after as many of warm-up; the rules are scd/route.Choose's, the oracle sees every level as it is now. Times in mean service times. "+
		"It took %.0f s.", listOf(s.Setup.Nodes), listOf(s.Setup.Loads), listOf(s.Setup.Staleness), s.Setup.PerNode, s.Seconds)
}

// write adds the simulation to S7's report: sim's own Markdown without
// its title, one heading level down.
func (s *simBeyond128) write(b *strings.Builder) {
	b.WriteString("## Beyond 128 nodes: the routing rules simulated\n\n")
	var md bytes.Buffer
	rep := sim.Report{Results: s.Results, HeadlineLoad: s.Setup.Loads[len(s.Setup.Loads)-1], HeadlineStaleness: headlineStaleness(s.Setup.Staleness)}
	if err := rep.WriteMarkdown(&md); err != nil {
		fmt.Fprintf(b, "(not written: %v)\n\n", err)
		return
	}
	text := md.String()
	if strings.HasPrefix(text, "# ") { // the title and the blank line after it
		_, text, _ = strings.Cut(text, "\n\n")
	}
	for line := range strings.Lines(text) {
		switch {
		case strings.HasPrefix(line, "#"):
			b.WriteString("#" + line)
		default:
			b.WriteString(line)
		}
	}
}

// listOf writes "a, b and c".
func listOf[T int | float64](v []T) string {
	var s []string
	for _, x := range v {
		s = append(s, fmt.Sprint(x))
	}
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// headlineStaleness is 10 if the grid has it, else its largest.
func headlineStaleness(s []float64) float64 {
	for _, x := range s {
		if x == 10 {
			return x
		}
	}
	return s[len(s)-1]
}
