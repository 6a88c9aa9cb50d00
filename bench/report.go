package bench

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Markdown formats the report: the head every scenario shares (title,
// machine, setup, systems not measured), the scenario's figures, and the
// foot (notes, the validity check, plots).
func (r *report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s: %s\n\n", r.Scenario, r.Title)
	fmt.Fprintf(&b, "%s. Machine: %s.", r.Date, r.Machine)
	// The peers' versions matter where peers run: the grids and S3.
	if len(r.Machine.Peers) > 0 && (len(r.Cells) > 0 || r.Step != nil) {
		var v []string
		for _, k := range sortedKeys(r.Machine.Peers) {
			v = append(v, k+" "+r.Machine.Peers[k])
		}
		fmt.Fprintf(&b, " Peers: %s.", strings.Join(v, ", "))
	}
	b.WriteString("\n\n")
	if len(r.Cells) > 0 {
		fmt.Fprintf(&b, "Each figure is the median of %d interleaved runs (in each cell the order of systems rotates, and reverses, between runs) "+
			"of %.1f s measured after %.1f s of warm-up.\n\n", r.Runs, r.Duration, r.Warmup)
	}
	for _, s := range r.Setup {
		fmt.Fprintf(&b, "- %s\n", s)
	}
	if len(r.Setup) > 0 {
		b.WriteString("\n")
	}
	for _, name := range sortedKeys(r.Skipped) {
		fmt.Fprintf(&b, "**Not measured: %s**: %s\n\n", name, r.Skipped[name])
	}
	switch {
	case r.Step != nil:
		r.writeStep(&b)
	case r.Guard != nil:
		r.writeGuard(&b)
	case r.Cluster != nil:
		r.writeCluster(&b)
	case r.Gossip != nil:
		r.writeGossip(&b)
	case r.Skew != nil:
		r.writeSkew(&b)
	case r.Restart != nil:
		r.writeRestart(&b)
	default:
		r.writeGrid(&b)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "%s\n\n", n)
	}
	b.WriteString(r.Validity.markdown())
	for _, p := range r.Plots {
		fmt.Fprintf(&b, "![%s](%s)\n\n", strings.TrimSuffix(p, ".png"), p)
	}
	return b.String()
}

// writeGrid writes S1, S2 and S4: one table of every cell and system,
// and the ratio of tpsched to each peer.
func (r *report) writeGrid(b *strings.Builder) {
	open := len(r.Cells) > 0 && r.Cells[0].Open
	b.WriteString("## Figures\n\n")
	if open {
		b.WriteString("| service | carriers | system | offered/s | admitted/s | refused | failed | timed out | p50 | p90 | p99 | p99.9 | CPU/call | peak RSS |\n")
		b.WriteString("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	} else {
		b.WriteString("| service | payload | conns | system | calls/s | p50 | p90 | p99 | p99.9 | mean | CPU/call | peak RSS | errors |\n")
		b.WriteString("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	}
	var skipped []string
	for _, c := range r.Cells {
		for _, m := range c.Results {
			if m.Skipped != "" {
				skipped = append(skipped, fmt.Sprintf("%s in %s (%s)", m.System, cellName(c), m.Skipped))
				continue
			}
			if m.Error != "" && len(m.Runs) == 0 {
				fmt.Fprintf(b, "| %s | %s | %d | %s | failed: %s |\n", c.Service, payloadName(c), c.Conns, m.System, oneLine(m.Error))
				continue
			}
			f := m.Median
			if open {
				fmt.Fprintf(b, "| %s | %d | %s | %.0f | %.0f | %s | %s | %s | %s | %s | %s | %s | %.1f us | %s |\n",
					c.Service, c.Conns, m.System, f.Offered, f.Throughput, pct(f.RefusedShare), pct(f.FailedShare), pct(f.TimeoutShare),
					dur(f.P50us), dur(f.P90us), dur(f.P99us), dur(f.P999us), f.CPUus, mib(f.PeakRSSKiB))
			} else {
				errs := f.RefusedShare + f.FailedShare + f.TimeoutShare
				fmt.Fprintf(b, "| %s | %s | %d | %s | %.0f | %s | %s | %s | %s | %s | %.1f us | %s | %s |\n",
					c.Service, payloadName(c), c.Conns, m.System, f.Throughput,
					durOrNone(f.P50us), durOrNone(f.P90us), durOrNone(f.P99us), durOrNone(f.P999us), durOrNone(f.MeanUs),
					f.CPUus, mib(f.PeakRSSKiB), pct(errs))
			}
		}
	}
	b.WriteString("\n")
	if len(skipped) > 0 {
		fmt.Fprintf(b, "Not measured: %s.\n\n", strings.Join(skipped, "; "))
	}
	r.writeWakeups(b)
	if ratios := r.ratioTable(); ratios != "" {
		base := r.ratioBase()
		fmt.Fprintf(b, "## %s against each peer\n\n", base)
		fmt.Fprintf(b, "Throughput ratio is %[1]s / peer (above 1: %[1]s serves more); p99 ratio is %[1]s / peer (below 1: %[1]s answers faster; "+
			"the ratio of the means where the peer measures no percentile); CPU ratio is %[1]s / peer server CPU per call (below 1: %[1]s spends less).\n\n", base)
		b.WriteString(ratios)
		b.WriteString("\n")
	}
}

// ratioBase is the tpsched system the ratio table sets against each peer:
// in S10 the local calls, which Enduro/X's calls are like.
func (r *report) ratioBase() string {
	if r.Scenario == "S10" {
		return nameTpschedLocal
	}
	return nameTpsched
}

func (r *report) ratioTable() string {
	var peers []string
	for _, s := range r.Systems {
		if !isTpsched(s) {
			peers = append(peers, s)
		}
	}
	base := r.ratioBase()
	if len(peers) == 0 || !slices.Contains(r.Systems, base) {
		return ""
	}
	var b strings.Builder
	b.WriteString("| service | payload | conns |")
	for _, p := range peers {
		fmt.Fprintf(&b, " vs %s: thr / p99 / CPU |", p)
	}
	b.WriteString("\n|---|---:|---:|")
	for range peers {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	for _, c := range r.Cells {
		tp := c.Result(base)
		fmt.Fprintf(&b, "| %s | %s | %d |", c.Service, payloadName(c), c.Conns)
		for _, p := range peers {
			m := c.Result(p)
			if tp == nil || m == nil || len(tp.Runs) == 0 || len(m.Runs) == 0 {
				b.WriteString(" - |")
				continue
			}
			// Enduro/X's tool measures no percentile: its mean stands in.
			lat, peerLat := tp.Median.P99us, m.Median.P99us
			if peerLat == 0 {
				lat, peerLat = tp.Median.MeanUs, m.Median.MeanUs
			}
			fmt.Fprintf(&b, " %s / %s / %s |", ratio(tp.Median.Throughput, m.Median.Throughput),
				ratio(lat, peerLat), ratio(tp.Median.CPUus, m.Median.CPUus))
		}
		b.WriteString("\n")
	}
	return b.String()
}

func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

func payloadName(c gridCell) string {
	if c.Service == "burn" {
		return fmt.Sprintf("%d us CPU", burnMicros)
	}
	if c.Service == "cpu" {
		return fmt.Sprintf("%d us thread CPU", burnMicros)
	}
	if c.Service == "sleep" {
		return fmt.Sprintf("sleep %d ms", s6SleepMs)
	}
	switch {
	case c.Payload >= 1<<10 && c.Payload%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", c.Payload>>10)
	}
	return fmt.Sprintf("%d B", c.Payload)
}

// isTpsched says whether a system is tpsched itself rather than a peer.
func isTpsched(s string) bool {
	switch s {
	case nameTpsched, nameTpschedC, nameTpschedLocal, nameTpschedLocalC, nameTpschedNested:
		return true
	}
	return false
}

// writeWakeups writes the grid's wake-ups: CPU, context switches and
// system calls per call of the server and of the load generator.
func (r *report) writeWakeups(b *strings.Builder) {
	b.WriteString("## Wake-ups per call\n\n")
	b.WriteString("Per call answered in the window, server and load generator apart: CPU, context switches (voluntary + involuntary) and system calls.\n\n")
	b.WriteString("| service | payload | conns | system | calls/s | server CPU | server ctx sw | server syscalls | load gen CPU | load gen ctx sw | load gen syscalls |\n")
	b.WriteString("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
	sys := func(v float64) string {
		if v < 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f", v)
	}
	for _, c := range r.Cells {
		for _, m := range c.Results {
			if len(m.Runs) == 0 {
				continue
			}
			f := m.Median
			fmt.Fprintf(b, "| %s | %s | %d | %s | %.0f | %.1f us | %.2f + %.2f | %s | %.1f us | %.2f + %.2f | %s |\n",
				c.Service, payloadName(c), c.Conns, m.System, f.Throughput, f.CPUus, f.ServerVolCS, f.ServerInvolCS, sys(f.ServerSyscalls),
				f.LoadgenCPUus, f.LoadgenVolCS, f.LoadgenInvolCS, sys(f.LoadgenSyscalls))
		}
	}
	b.WriteString("\n")
}

// dur formats microseconds with a unit that keeps three figures.
func dur(us float64) string {
	switch {
	case us >= 1e6:
		return fmt.Sprintf("%.2f s", us/1e6)
	case us >= 1e4:
		return fmt.Sprintf("%.1f ms", us/1e3)
	case us >= 1e3:
		return fmt.Sprintf("%.2f ms", us/1e3)
	}
	return fmt.Sprintf("%.0f us", us)
}

func pct(share float64) string {
	if share == 0 {
		return "0"
	}
	if share < 0.001 {
		return fmt.Sprintf("%.3f%%", 100*share)
	}
	return fmt.Sprintf("%.1f%%", 100*share)
}

func mib(kib float64) string { return fmt.Sprintf("%.1f MiB", kib/1024) }

func oneLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return strings.ReplaceAll(s, "|", "/")
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }

// Write writes dir/<date>-<scenario>.md and .json and returns the base path.
func (r *report) Write(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	base := filepath.Join(dir, r.Date+"-"+r.Scenario)
	if err := os.WriteFile(base+".md", []byte(r.Markdown()), 0o644); err != nil {
		return "", err
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", err
	}
	return base, os.WriteFile(base+".json", append(js, '\n'), 0o644)
}

// writeStep writes S3: one table per system and each run.
func (r *report) writeStep(b *strings.Builder) {
	b.WriteString("## Figures\n\n")
	steps := 0
	if r.Step.Window > 0 {
		steps = int((r.Step.During + r.Step.Window - 1) / r.Step.Window)
	}
	b.WriteString("| system | recovery | step windows over the limit | first extra worker | workers before | peak workers (at) | back to before, after the drop | " +
		"p99 before | p99 during | p99 after | limit (2x before) | generator's send lateness p99 before | refused | failed | timed out | calls |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, res := range r.StepResults {
		f := res.Median
		fmt.Fprintf(b, "| %s | %s | %.0f of %d | %s | %.0f | %.0f (%s) | %s | %s | %s | %s | %s | %s | %.0f | %.0f | %.0f | %.0f |\n",
			res.System, msOrNever(f.RecoveryMs), f.OverLimit, steps, msOrNever(f.FirstExtraMs), f.BaselineWorkers, f.PeakWorkers, msOrNever(f.ToPeakMs),
			msOrNever(f.BackMs), dur(f.PreP99us), dur(f.StepP99us), dur(f.PostP99us), dur(f.LimitUs), dur(f.PreLateP99us),
			f.Refused, f.Failed, f.TimedOut, f.Offered)
	}
	b.WriteString("\n")
	if len(r.StepResults) > 0 && r.Runs > 1 {
		b.WriteString("### Each run\n\n")
		b.WriteString("| system | run | recovery | windows over | first extra worker | workers before -> peak (at) | back | p99 before / during / after | refused / failed / timed out |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, res := range r.StepResults {
			for i, f := range res.Runs {
				drawn := ""
				if i == res.Drawn {
					drawn = " (plotted)"
				}
				fmt.Fprintf(b, "| %s | %d%s | %s | %.0f | %s | %.0f -> %.0f (%s) | %s | %s / %s / %s | %.0f / %.0f / %.0f |\n",
					res.System, i+1, drawn, msOrNever(f.RecoveryMs), f.OverLimit, msOrNever(f.FirstExtraMs), f.BaselineWorkers, f.PeakWorkers,
					msOrNever(f.ToPeakMs), msOrNever(f.BackMs), dur(f.PreP99us), dur(f.StepP99us), dur(f.PostP99us), f.Refused, f.Failed, f.TimedOut)
			}
		}
		b.WriteString("\n")
	}
}
