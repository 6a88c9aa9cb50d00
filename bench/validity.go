package bench

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// This file is the report's check on itself: how far one system's runs in
// one cell spread (the machine's noise), which systems spread much more
// than their neighbours in the same cell, and which moved, beyond that
// noise, between this grid and the other one (quick against full).

// unsteadyFactor and unsteadyFloor: a system whose runs spread more than
// twice the cell's noise, and more than 10%, is flagged. On the 2-core
// VM, quiet runs of one system at 64 connections spread 4-10% and at one
// connection 15-30% (wake-up latency of idle CPUs), for every system
// alike, so twice the cell's median is beyond what the machine does.
const (
	unsteadyFactor = 2
	unsteadyFloor  = 0.10
	// moveFloor is the least tolerance for a move between grids.
	moveFloor = 0.05
)

// validity is what the report says about its own figures.
type validity struct {
	QuietCores   float64     `json:"quiet_cores"`                  // the bound on other tenants' CPU in a run's window (0: not watched)
	Retried      int         `json:"runs_retried"`                 // runs run again because other tenants disturbed them
	Runs         int         `json:"runs"`                         // runs kept in the report
	Disturbed    []string    `json:"disturbed,omitempty"`          // runs kept although still disturbed, by cell
	BudgetSpent  bool        `json:"quiet_budget_spent,omitempty"` // the session's time for waiting and running again ran out
	PeersStopped bool        `json:"peers_stopped"`                // the systems not measured were stopped during each run (holdOthers)
	Noise        []cellNoise `json:"noise"`
	Compared     string      `json:"compared_with,omitempty"` // the other grid's report
	NotCompared  string      `json:"not_compared,omitempty"`  // why no comparison was made
	Moves        []gridMove  `json:"moves,omitempty"`
}

// cellNoise is the run-to-run spread in one cell.
type cellNoise struct {
	Cell     string             `json:"cell"`
	Noise    float64            `json:"noise"`  // median of the systems' spreads
	Spread   map[string]float64 `json:"spread"` // per system: (max-min)/median of its runs' throughput
	Unsteady []string           `json:"unsteady,omitempty"`
}

// gridMove is one system's median throughput in a cell of this report
// against the same cell of the other grid.
type gridMove struct {
	Cell      string  `json:"cell"`
	System    string  `json:"system"`
	Ratio     float64 `json:"ratio"`     // this / other
	Shift     float64 `json:"shift"`     // the cell's common ratio: median over its systems
	Tolerance float64 `json:"tolerance"` // the larger noise of the two cells
	Flagged   bool    `json:"flagged"`
}

func cellName(c gridCell) string {
	return fmt.Sprintf("%s %s x %d", c.Service, payloadName(c), c.Conns)
}

// runSpread is (max-min)/median of the runs' throughput; false with fewer
// than two runs or a zero median.
func runSpread(runs []Figures) (float64, bool) {
	if len(runs) < 2 {
		return 0, false
	}
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = r.Throughput
	}
	med := median(v)
	if med <= 0 {
		return 0, false
	}
	return (slices.Max(v) - slices.Min(v)) / med, true
}

// noiseOf measures the cell's noise and flags the unsteady systems.
func noiseOf(c gridCell) cellNoise {
	n := cellNoise{Cell: cellName(c), Spread: map[string]float64{}}
	var all []float64
	for _, m := range c.Results {
		if s, ok := runSpread(m.Runs); ok {
			n.Spread[m.System] = s
			all = append(all, s)
		}
	}
	n.Noise = median(all)
	for _, m := range c.Results {
		if s, ok := n.Spread[m.System]; ok && s > unsteadyFactor*n.Noise && s > unsteadyFloor {
			n.Unsteady = append(n.Unsteady, m.System)
		}
	}
	return n
}

// compareGrids sets each system's move between the shared cells of r and
// other: its throughput ratio against the cell's common shift (the median
// ratio of its systems, which the VM's speed moves for every system
// alike), flagged beyond the larger noise of the two cells.
func compareGrids(r, other *report) []gridMove {
	var out []gridMove
	for _, c := range r.Cells {
		var oc *gridCell
		for i := range other.Cells {
			o := &other.Cells[i]
			if o.Service == c.Service && o.Payload == c.Payload && o.Conns == c.Conns && o.Open == c.Open {
				oc = o
			}
		}
		if oc == nil {
			continue
		}
		tol := max(noiseOf(c).Noise, noiseOf(*oc).Noise, moveFloor)
		var cell []gridMove
		var ratios []float64
		for _, m := range c.Results {
			om := oc.Result(m.System)
			if len(m.Runs) == 0 || om == nil || len(om.Runs) == 0 || om.Median.Throughput <= 0 {
				continue
			}
			q := m.Median.Throughput / om.Median.Throughput
			ratios = append(ratios, q)
			cell = append(cell, gridMove{Cell: cellName(c), System: m.System, Ratio: q, Tolerance: tol})
		}
		shift := median(ratios)
		for i := range cell {
			cell[i].Shift = shift
			cell[i].Flagged = shift > 0 && math.Abs(cell[i].Ratio/shift-1) > tol
		}
		out = append(out, cell...)
	}
	return out
}

// checkValidity fills r.Validity from its cells and, if ref names a report
// of the same scenario (and title: the same setup) measured on the same
// machine, from the comparison with it.
func checkValidity(r *report, q Quiet, peersRunning bool, ref string) {
	v := &validity{QuietCores: q.Cores, BudgetSpent: q.Cores > 0 && q.left() <= 0, PeersStopped: !peersRunning}
	for _, c := range r.Cells {
		var in []string
		for _, m := range c.Results {
			v.Retried += m.Retried
			v.Runs += len(m.Runs)
			for i, f := range m.Runs {
				if f.Disturbed {
					in = append(in, fmt.Sprintf("%s run %d (%.2f)", m.System, i+1, f.OtherCPU))
				}
			}
		}
		if len(in) > 0 {
			v.Disturbed = append(v.Disturbed, cellName(c)+": "+strings.Join(in, ", "))
		}
		if len(c.Results) > 0 {
			v.Noise = append(v.Noise, noiseOf(c))
		}
	}
	r.Validity = v
	if ref == "" {
		return
	}
	other, err := readReport(ref)
	switch {
	case err != nil:
		v.NotCompared = fmt.Sprintf("%s: %v", ref, err)
	case other.Scenario != r.Scenario:
		v.NotCompared = fmt.Sprintf("%s is %s, not %s", ref, other.Scenario, r.Scenario)
	case other.Title != r.Title:
		// The scenario was redefined in between (S10's systems were).
		v.NotCompared = fmt.Sprintf("%s measured another setup (%q)", ref, other.Title)
	case other.Machine.CPU != r.Machine.CPU || other.Machine.Cores != r.Machine.Cores:
		v.NotCompared = fmt.Sprintf("%s was measured on another machine (%d cores, %s)", ref, other.Machine.Cores, other.Machine.CPU)
	default:
		v.Compared = ref
		v.Moves = compareGrids(r, other)
	}
}

func readReport(path string) (*report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("not a report: %w", err)
	}
	return &r, nil
}

// newestReport is the newest <date>-<scenario>.json in dir, or "".
func newestReport(dir, scenario string) string {
	m, _ := filepath.Glob(filepath.Join(dir, "*-"+scenario+".json"))
	if len(m) == 0 {
		return ""
	}
	slices.Sort(m) // the names start with the date
	return m[len(m)-1]
}

// markdown is the report's section on its own figures.
func (v *validity) markdown() string {
	if v == nil {
		return ""
	}
	var b strings.Builder
	b.WriteString("## Validity\n\n")
	if v.QuietCores > 0 {
		fmt.Fprintf(&b, "- Other tenants: before each run the harness waited until the processes that are not the benchmark's used under %.2f cores "+
			"(and the hypervisor stole under that); a run whose window still had more was run again (%d times in this report) and the least "+
			"disturbed attempt kept.", v.QuietCores, v.Retried)
		if v.BudgetSpent {
			b.WriteString(" The session's time for waiting and running again was spent by the end of this report, so later runs went ahead on a busy machine.")
		}
		n := 0
		for _, d := range v.Disturbed {
			n += strings.Count(d, " run ")
		}
		if n > 0 {
			fmt.Fprintf(&b, " **Kept although disturbed: %d of %d runs** (other tenants' cores in brackets): %s.", n, v.Runs, strings.Join(v.Disturbed, "; "))
		} else {
			b.WriteString(" No run kept was disturbed.")
		}
		b.WriteString("\n")
	} else {
		b.WriteString("- Other tenants were not watched (-quiet-cores 0).\n")
	}
	if v.PeersStopped {
		b.WriteString("- The systems not measured in a run were stopped (SIGSTOP) for its length, so each run had the machine to itself: idle, they still wake " +
			"and disturb the one measured (docs/TESTING.md; -peers-running keeps them running, as reports before 2026-12-07 did).\n")
	} else {
		b.WriteString("- The systems not measured in a run kept running, idle (-peers-running); the logs' idle peers column is their CPU in the run's window.\n")
	}
	b.WriteString("- Noise: the spread of one system's runs in one cell, (max - min) / median of their calls/s; a cell's noise is the median over its systems. " +
		fmt.Sprintf("A system whose runs spread more than %dx the cell's noise and more than %.0f%% is unsteady: a fault of the harness until shown otherwise.\n\n",
			unsteadyFactor, 100*unsteadyFloor))
	b.WriteString("| cell | noise | spread per system |\n|---|---:|---|\n")
	var unsteady []string
	for _, n := range v.Noise {
		var per []string
		for _, s := range slices.Sorted(maps.Keys(n.Spread)) {
			mark := ""
			if slices.Contains(n.Unsteady, s) {
				mark = " **unsteady**"
				unsteady = append(unsteady, fmt.Sprintf("%s in %s (%.0f%% against %.0f%%)", s, n.Cell, 100*n.Spread[s], 100*n.Noise))
			}
			per = append(per, fmt.Sprintf("%s %.0f%%%s", s, 100*n.Spread[s], mark))
		}
		fmt.Fprintf(&b, "| %s | %.0f%% | %s |\n", n.Cell, 100*n.Noise, strings.Join(per, ", "))
	}
	b.WriteString("\n")
	if len(unsteady) > 0 {
		fmt.Fprintf(&b, "**Unsteady**: %s.\n\n", strings.Join(unsteady, "; "))
	}
	switch {
	case v.Compared != "":
		fmt.Fprintf(&b, "Against the other grid (%s), in the cells both measured: a system's calls/s here over there, against the cell's common shift "+
			"(the median over its systems: the VM's speed moves every system alike). A system that moved beyond the larger noise of the two cells "+
			"(at least %.0f%%) is flagged.\n\n", filepath.Base(v.Compared), 100*moveFloor)
		b.WriteString("| cell | system | here / there | cell's shift | tolerance | |\n|---|---|---:|---:|---:|---|\n")
		var moved []string
		for _, m := range v.Moves {
			flag := ""
			if m.Flagged {
				flag = "**moved**"
				moved = append(moved, fmt.Sprintf("%s in %s (%.2fx against %.2fx)", m.System, m.Cell, m.Ratio, m.Shift))
			}
			fmt.Fprintf(&b, "| %s | %s | %.2fx | %.2fx | %.0f%% | %s |\n", m.Cell, m.System, m.Ratio, m.Shift, 100*m.Tolerance, flag)
		}
		b.WriteString("\n")
		if len(moved) > 0 {
			fmt.Fprintf(&b, "**Moved between the grids beyond the noise**: %s.\n\n", strings.Join(moved, "; "))
		} else {
			b.WriteString("No system moved between the grids beyond the noise.\n\n")
		}
	case v.NotCompared != "":
		fmt.Fprintf(&b, "Not compared with the other grid: %s.\n\n", v.NotCompared)
	}
	return b.String()
}
