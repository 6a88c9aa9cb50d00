package bench

import (
	"fmt"
	"math"
	"path/filepath"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// plotThroughput draws calls/s against connections (log2 scale), one line
// per system, for the cells of service and payload; it returns the file name
// written in dir.
func plotThroughput(r *report, dir, service string, payload int) (string, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s %s: throughput against connections", r.Scenario, payloadName(gridCell{Service: service, Payload: payload}))
	p.X.Label.Text = "connections (one call outstanding each)"
	p.Y.Label.Text = "calls/s"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = connTicks{}
	p.Legend.Top = true
	p.Legend.Left = true
	var lines []any
	for _, sys := range r.Systems {
		var xys plotter.XYs
		for _, c := range r.Cells {
			if c.Service != service || c.Payload != payload {
				continue
			}
			if m := c.Result(sys); m != nil && len(m.Runs) > 0 {
				xys = append(xys, plotter.XY{X: float64(c.Conns), Y: m.Median.Throughput})
			}
		}
		if len(xys) > 0 {
			lines = append(lines, sys, xys)
		}
	}
	if len(lines) == 0 {
		return "", nil
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return "", err
	}
	p.Y.Min = 0
	name := fmt.Sprintf("%s-%s-throughput-%s-%d.png", r.Date, r.Scenario, service, payload)
	return name, p.Save(16*vg.Centimeter, 10*vg.Centimeter, filepath.Join(dir, name))
}

// plotCDF draws the latency distribution of each system in the cell
// (service, payload, conns): latency on a log scale against the fraction
// answered, on a scale that spreads the tail (50%, 90%, 99%, 99.9% equally
// spaced).
func plotCDF(r *report, dir, service string, payload, conns int) (string, error) {
	var cell *gridCell
	for i := range r.Cells {
		c := &r.Cells[i]
		if c.Service == service && c.Payload == payload && c.Conns == conns {
			cell = c
		}
	}
	if cell == nil {
		return "", nil
	}
	p := plot.New()
	what := "latency"
	if cell.Open {
		what = "admitted latency (from the intended send time)"
	}
	p.Title.Text = fmt.Sprintf("%s %s, %d conns: %s", r.Scenario, payloadName(*cell), conns, what)
	p.X.Label.Text = "latency (us)"
	p.Y.Label.Text = "calls answered within"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = latencyTicks{}
	p.Y.Tick.Marker = ninesTicks{}
	p.Legend.Top = true
	p.Legend.Left = true
	var lines []any
	for _, m := range cell.Results {
		var xys plotter.XYs
		for _, pt := range m.CDF {
			if pt.Us <= 0 {
				continue
			}
			xys = append(xys, plotter.XY{X: pt.Us, Y: nines(pt.Q)})
		}
		if len(xys) > 0 {
			lines = append(lines, m.System, xys)
		}
	}
	if len(lines) == 0 {
		return "", nil
	}
	if err := plotutil.AddLines(p, lines...); err != nil {
		return "", err
	}
	p.Y.Min = 0
	name := fmt.Sprintf("%s-%s-cdf-%s-%d-%dc.png", r.Date, r.Scenario, service, payload, conns)
	return name, p.Save(16*vg.Centimeter, 11*vg.Centimeter, filepath.Join(dir, name))
}

// nines maps a fraction q to -log10(1-q): 0.9 -> 1, 0.99 -> 2, capped at 6.
func nines(q float64) float64 {
	if q >= 1-1e-6 {
		return 6
	}
	return -math.Log10(1 - q)
}

type ninesTicks struct{}

func (ninesTicks) Ticks(lo, hi float64) []plot.Tick {
	var t []plot.Tick
	for _, q := range []struct {
		v     float64
		label string
	}{{0, "0%"}, {nines(0.5), "50%"}, {1, "90%"}, {2, "99%"}, {3, "99.9%"}, {4, "99.99%"}, {5, "99.999%"}, {6, "100%"}} {
		if q.v >= lo-1e-9 && q.v <= hi+1e-9 {
			t = append(t, plot.Tick{Value: q.v, Label: q.label})
		}
	}
	return t
}

type connTicks struct{}

func (connTicks) Ticks(lo, hi float64) []plot.Tick {
	var t []plot.Tick
	for v := 1.0; v <= hi*1.01; v *= 2 {
		if v >= lo*0.99 {
			label := ""
			if math.Mod(math.Log2(v), 2) == 0 || v == lo || v == hi {
				label = fmt.Sprint(v)
			}
			t = append(t, plot.Tick{Value: v, Label: label})
		}
	}
	return t
}

// latencyTicks labels a log axis of microseconds at 1, 2 and 5 of each
// decade, in us, ms or s, so a range narrower than a decade still has labels.
type latencyTicks struct{}

func (latencyTicks) Ticks(lo, hi float64) []plot.Tick {
	var t []plot.Tick
	if lo <= 0 || hi <= lo {
		return t
	}
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v >= lo && v <= hi {
				t = append(t, plot.Tick{Value: v, Label: dur(v)})
			}
		}
	}
	return t
}

// plotStepP99 draws S3's p99 per window against the time from the step,
// one line per system (its run with the median recovery time), on a log
// scale, with the step and the drop marked by the x axis's range.
func plotStepP99(r *report, dir string) (string, error) {
	if r.Step == nil || len(r.StepResults) == 0 {
		return "", nil
	}
	var series []windowSeries
	for _, res := range r.StepResults {
		series = append(series, windowSeries{res.System, res.Windows})
	}
	return plotWindows(dir, fmt.Sprintf("%s-%s-p99-over-time.png", r.Date, r.Scenario),
		fmt.Sprintf("%s: p99 per %v window of calls due in it (%.0f/s -> %.0f/s at 0, back at %.0f s)",
			r.Scenario, r.Step.Window, r.Step.Base, r.Step.Peak, r.Step.During.Seconds()),
		"time from the step (s)", "p99 latency", true, r.Step.Window, series, windowP99)
}

// windowP99 is a window's p99, where it has one.
func windowP99(w stepWindow) (float64, bool) { return w.P99us, w.P99us > 0 }

// windowSeries is one line of a plot over a run's windows.
type windowSeries struct {
	name    string
	windows []stepWindow
}

// plotWindows draws y of every series' windows against the time of each
// window's middle from the event they are timed from (their FromStepMs),
// as dir/name; a window y has no value for is left out of the line.
func plotWindows(dir, name, title, xLabel, yLabel string, logY bool, width time.Duration, series []windowSeries,
	y func(stepWindow) (float64, bool)) (string, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xLabel
	p.Y.Label.Text = yLabel
	if logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = latencyTicks{}
	}
	p.Legend.Top = logY // a count's lines run along the top
	var lines []any
	for _, sr := range series {
		var xys plotter.XYs
		for _, w := range sr.windows {
			if v, ok := y(w); ok {
				xys = append(xys, plotter.XY{X: (w.FromStepMs + ms(width)/2) / 1e3, Y: v})
			}
		}
		if len(xys) > 0 {
			lines = append(lines, sr.name, xys)
		}
	}
	if len(lines) == 0 {
		return "", nil
	}
	if err := plotutil.AddLines(p, lines...); err != nil {
		return "", err
	}
	if !logY {
		p.Y.Min = 0
	}
	return name, p.Save(20*vg.Centimeter, 11*vg.Centimeter, filepath.Join(dir, name))
}

// plotStepWorkers draws S3's worker count against the time from the step,
// every sample of the plotted run, as steps.
func plotStepWorkers(r *report, dir string) (string, error) {
	if r.Step == nil || len(r.StepResults) == 0 {
		return "", nil
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s: worker processes, counted every %v (%.0f/s -> %.0f/s at 0, back at %.0f s)",
		r.Scenario, r.Step.Poll, r.Step.Base, r.Step.Peak, r.Step.During.Seconds())
	p.X.Label.Text = "time from the step (s)"
	p.Y.Label.Text = "workers"
	p.Legend.Top = true
	p.Legend.Left = true
	var lines []any
	for i, res := range r.StepResults {
		var xys plotter.XYs
		// A small offset per system keeps equal counts apart.
		off := 0.04 * float64(i)
		for j, s := range res.Samples {
			x := (s.At - r.Step.Step()).Seconds()
			if j > 0 {
				xys = append(xys, plotter.XY{X: x, Y: xys[len(xys)-1].Y})
			}
			xys = append(xys, plotter.XY{X: x, Y: float64(s.N) + off})
		}
		if len(xys) > 0 {
			lines = append(lines, res.System, xys)
		}
	}
	if len(lines) == 0 {
		return "", nil
	}
	if err := plotutil.AddLines(p, lines...); err != nil {
		return "", err
	}
	p.Y.Min = 0
	p.Y.Max = s3MaxWorkers + 1
	name := fmt.Sprintf("%s-%s-workers-over-time.png", r.Date, r.Scenario)
	return name, p.Save(20*vg.Centimeter, 11*vg.Centimeter, filepath.Join(dir, name))
}

// plotGuardSeries draws S5's status readings against the time from the
// run's start, every run of each system (one colour and dash per system),
// as steps: what is "processes" (the group's processes) or "wait" (the
// guard's runqueue_wait_percent, with the limit as a line). The measured
// window starts at the warm-up's end.
func plotGuardSeries(r *report, dir, what string) (string, error) {
	if r.Guard == nil || len(r.GuardResults) == 0 {
		return "", nil
	}
	p := plot.New()
	switch what {
	case "processes":
		p.Title.Text = fmt.Sprintf("%s: processes of the group in every run, read every %v (%.0f calls/s from 0; measured from %.1f s)",
			r.Scenario, r.Guard.Poll, r.Guard.Rate, r.Warmup)
		p.Y.Label.Text = "processes"
	case "wait":
		p.Title.Text = fmt.Sprintf("%s: runqueue_wait_percent in /status, every run, read every %v (measured from %.1f s)", r.Scenario, r.Guard.Poll, r.Warmup)
		p.Y.Label.Text = "percent of the guard's window waiting for a CPU"
	default:
		return "", fmt.Errorf("PlotGuardSeries: unknown series %q", what)
	}
	p.X.Label.Text = "time from the run's start (s)"
	p.Legend.Top = true
	p.Legend.Left = true
	drawn, end := false, 0.0
	for i, res := range r.GuardResults {
		// A small offset per system keeps equal counts apart.
		off := 0.12 * float64(i)
		for k, run := range res.Samples {
			var xys plotter.XYs
			for _, s := range run {
				y := float64(s.Procs) + off
				if what == "wait" {
					if s.WaitPct < 0 {
						continue
					}
					y = float64(s.WaitPct) + 10*off
				}
				x := s.At.Seconds()
				if len(xys) > 0 {
					xys = append(xys, plotter.XY{X: x, Y: xys[len(xys)-1].Y})
				}
				xys = append(xys, plotter.XY{X: x, Y: y})
				end = max(end, x)
			}
			if len(xys) == 0 {
				continue
			}
			l, err := plotter.NewLine(xys)
			if err != nil {
				return "", err
			}
			l.Color = plotutil.Color(i)
			l.Dashes = plotutil.Dashes(i)
			p.Add(l)
			if k == 0 {
				p.Legend.Add(fmt.Sprintf("%s (%d runs)", res.System, len(res.Samples)), l)
			}
			drawn = true
		}
	}
	if !drawn {
		return "", nil
	}
	if what == "wait" && r.Guard.WaitLimit > 0 {
		l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: float64(r.Guard.WaitLimit)}, {X: end, Y: float64(r.Guard.WaitLimit)}})
		if err != nil {
			return "", err
		}
		l.Color = plotutil.Color(len(r.GuardResults))
		l.Width = vg.Points(2)
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("cpu_wait_limit %d", r.Guard.WaitLimit), l)
	}
	// Headroom above the lines for the legend.
	p.Y.Min = 0
	if what == "processes" {
		p.Y.Max = s5Max + 4
	} else {
		p.Y.Max = 125
	}
	name := fmt.Sprintf("%s-%s-%s-over-time.png", r.Date, r.Scenario, what)
	return name, p.Save(20*vg.Centimeter, 11*vg.Centimeter, filepath.Join(dir, name))
}

// drawnCDF is what a scenario that keeps one latency distribution per
// system (its drawn run's) outside the grid gives plotRunCDFs.
type drawnCDF interface {
	cdf() (system string, points []cdfPoint)
}

func (r guardResult) cdf() (string, []cdfPoint)   { return r.System, r.CDF }
func (r clusterResult) cdf() (string, []cdfPoint) { return r.System, r.CDF }
func (r skewResult) cdf() (string, []cdfPoint)    { return r.System, r.CDF }

// plotRunCDFs draws, with plotCDF, the distributions of results, measured
// in cell.
func plotRunCDFs[R drawnCDF](r *report, dir string, cell gridCell, results []R) (string, error) {
	for _, res := range results {
		system, points := res.cdf()
		cell.Results = append(cell.Results, measurement{System: system, CDF: points})
	}
	if len(cell.Results) == 0 {
		return "", nil
	}
	tmp := *r
	tmp.Cells = []gridCell{cell}
	return plotCDF(&tmp, dir, cell.Service, cell.Payload, cell.Conns)
}

// plotGuardCDF draws S5's latency distributions.
func plotGuardCDF(r *report, dir string) (string, error) {
	if r.Guard == nil {
		return "", nil
	}
	return plotRunCDFs(r, dir, gridCell{Service: "cpu", Conns: r.Guard.Carriers, Open: true}, r.GuardResults)
}
