package bench

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// This file compares two builds of tpsched from grid reports (S1, S2, S4,
// S10) that alternated between them in one session (tools/bench-ab.sh):
// every run of a cell pooled per build, and the ratios that matter taken
// within each report first, since the machine's speed moves between
// reports more than between the systems of one.

// Ratio is a throughput ratio of two systems of one cell, taken in each
// report: Name's throughput over Of's.
type Ratio struct {
	Name, Of string
}

// CompareRatios are the ratios tpbench's comparison prints: the direct
// path against the bare echo, local calls against Enduro/X and against
// the direct call.
var CompareRatios = []Ratio{
	{"tpsched", "gnet-echo"},
	{"tpsched local call", "Enduro/X"},
	{"tpsched local call", "tpsched"},
}

// Compare reads the grid reports (*.json) under each of the before and
// after directories and writes a Markdown comparison: per cell and
// system, the median of every run of each build; then each of ratios per
// cell, its median over the reports of each build.
func Compare(before, after []string, ratios []Ratio) (string, error) {
	var builds [2]*pooled
	for i, dirs := range [][]string{before, after} {
		p, err := pool(dirs, ratios)
		if err != nil {
			return "", err
		}
		builds[i] = p
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Reports: %d before, %d after. Each figure is the median of every run of the cell in the build's reports.\n\n",
		builds[0].reports, builds[1].reports)
	b.WriteString("| scenario | cell | system | calls/s before | after | after/before | p50 us, before / after | mean us | server CPU us/call | server ctx sw/call | server syscalls/call | load gen ctx sw/call | runs |\n")
	b.WriteString("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, k := range unionKeys(builds[0].runs, builds[1].runs) {
		bf, af := builds[0].runs[k], builds[1].runs[k]
		med := func(runs []Figures, f func(Figures) float64) float64 {
			v := make([]float64, len(runs))
			for i, r := range runs {
				v[i] = f(r)
			}
			return median(v)
		}
		two := func(f func(Figures) float64, format string) string {
			x, y := med(bf, f), med(af, f)
			if x == 0 && y == 0 {
				return "-" // not measured (Enduro/X reports no percentiles)
			}
			return fmt.Sprintf(format+" / "+format, x, y)
		}
		tb, ta := med(bf, throughput), med(af, throughput)
		fmt.Fprintf(&b, "| %s | %s | %s | %.0f | %.0f | %.2fx | %s | %s | %s | %s | %s | %s | %d / %d |\n",
			k.scenario, k.cell, k.system, tb, ta, ta/tb,
			two(func(f Figures) float64 { return f.P50us }, "%.0f"),
			two(func(f Figures) float64 { return f.MeanUs }, "%.0f"),
			two(func(f Figures) float64 { return f.CPUus }, "%.1f"),
			two(func(f Figures) float64 { return f.ServerVolCS + f.ServerInvolCS }, "%.2f"),
			two(func(f Figures) float64 { return f.ServerSyscalls }, "%.1f"),
			two(func(f Figures) float64 { return f.LoadgenVolCS + f.LoadgenInvolCS }, "%.2f"),
			len(bf), len(af))
	}
	b.WriteString("\n| ratio of calls/s in one report (median over reports) | cell | before | after |\n|---|---|---:|---:|\n")
	for _, r := range ratios {
		cells := map[string]struct{}{}
		for _, p := range builds {
			for c := range p.ratios[r] {
				cells[c] = struct{}{}
			}
		}
		for _, c := range slices.Sorted(maps.Keys(cells)) {
			bv, av := builds[0].ratios[r][c], builds[1].ratios[r][c]
			fmt.Fprintf(&b, "| %s / %s | %s | %s | %s |\n", r.Name, r.Of, c, ratioText(bv), ratioText(av))
		}
	}
	return b.String(), nil
}

func throughput(f Figures) float64 { return f.Throughput }

func ratioText(v []float64) string {
	if len(v) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f (%d)", median(v), len(v))
}

// cellKey names one system in one cell of one scenario.
type cellKey struct{ scenario, cell, system string }

// pooled is one build's reports: every run per cell and system, and
// each ratio per cell, one value per report.
type pooled struct {
	reports int
	runs    map[cellKey][]Figures
	ratios  map[Ratio]map[string][]float64
}

func pool(dirs []string, ratios []Ratio) (*pooled, error) {
	p := &pooled{runs: map[cellKey][]Figures{}, ratios: map[Ratio]map[string][]float64{}}
	for _, dir := range dirs {
		files, err := filepath.Glob(filepath.Join(dir, "*.json"))
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				return nil, err
			}
			var r report
			if err := json.Unmarshal(data, &r); err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if len(r.Cells) == 0 {
				continue // not a grid report
			}
			p.reports++
			for _, c := range r.Cells {
				cell := fmt.Sprintf("%s %d B x %d", c.Service, c.Payload, c.Conns)
				for _, m := range c.Results {
					k := cellKey{r.Scenario, cell, m.System}
					p.runs[k] = append(p.runs[k], m.Runs...)
				}
				for _, ratio := range ratios {
					n, of := c.Result(ratio.Name), c.Result(ratio.Of)
					if n == nil || of == nil || len(n.Runs) == 0 || len(of.Runs) == 0 {
						continue
					}
					if p.ratios[ratio] == nil {
						p.ratios[ratio] = map[string][]float64{}
					}
					key := r.Scenario + " " + cell
					v := medianOfRuns(n.Runs) / medianOfRuns(of.Runs)
					p.ratios[ratio][key] = append(p.ratios[ratio][key], v)
				}
			}
		}
	}
	return p, nil
}

func medianOfRuns(runs []Figures) float64 {
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = r.Throughput
	}
	return median(v)
}

func unionKeys(a, b map[cellKey][]Figures) []cellKey {
	seen := map[cellKey]bool{}
	for k := range a {
		seen[k] = true
	}
	for k := range b {
		seen[k] = true
	}
	keys := make([]cellKey, 0, len(seen))
	for k := range seen {
		if len(a[k]) > 0 && len(b[k]) > 0 {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		x, y := keys[i], keys[j]
		if x.scenario != y.scenario {
			return x.scenario < y.scenario
		}
		if x.cell != y.cell {
			return x.cell < y.cell
		}
		return x.system < y.system
	})
	return keys
}
