package main

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Grafana's dark theme and its classic palette, so the picture reads as
// the dashboard does.
var (
	bgColor     = rgb(0x111217)
	panelColor  = rgb(0x181b1f)
	borderColor = rgb(0x2c3235)
	textColor   = rgb(0xccccdc)
	mutedColor  = rgb(0x8e8e9e)
	gridColor   = rgb(0x25282d)
	palette     = []color.Color{rgb(0x7eb26d), rgb(0xeab839), rgb(0x6ed0e0), rgb(0xef843c), rgb(0xe24d42),
		rgb(0x1f78c1), rgb(0xba43a9), rgb(0x705da0), rgb(0x508642), rgb(0xcca300), rgb(0x447ebc), rgb(0xc15c17)}
	levelColors = map[string]color.Color{"green": rgb(0x73bf69), "orange": rgb(0xff9830), "red": rgb(0xf2495c)}
)

func rgb(v uint32) color.Color {
	return color.RGBA{R: uint8(v >> 16), G: uint8(v >> 8), B: uint8(v), A: 0xff}
}

func withAlpha(c color.Color, a uint8) color.Color {
	r, g, b, _ := c.RGBA()
	return color.NRGBA{R: uint8(r >> 8), G: uint8(g >> 8), B: uint8(b >> 8), A: a}
}

const (
	px      = vg.Length(0.75) // one pixel at 96 dpi
	rowPx   = 30              // height of one grid unit
	marginX = 12
	headPx  = 46
)

func style(size float64, c color.Color) text.Style {
	return text.Style{Color: c, Font: font.From(plot.DefaultFont, vg.Points(size)), Handler: plot.DefaultTextHandler}
}

// render draws every panel of d from data on the dashboard's grid.
func render(d *dashboard, data map[int][]series, start, end time.Time, widthPx int) ([]byte, error) {
	maxY := 0
	for _, p := range d.panels() {
		maxY = max(maxY, p.GridPos.Y+p.GridPos.H)
	}
	heightPx := headPx + maxY*rowPx + 2*marginX
	W, H := vg.Length(widthPx)*px, vg.Length(heightPx)*px
	img := vgimg.NewWith(vgimg.UseWH(W, H), vgimg.UseDPI(96))
	c := draw.New(img)
	fill(c, c.Rectangle, bgColor)
	col := (W - 2*marginX*px) / 24
	head := style(15, textColor)
	c.FillText(head, vg.Point{X: marginX * px, Y: H - 28*px}, d.Title+" (Grafana dashboard dist/grafana/tpsched.json)")
	sub := style(10, mutedColor)
	sub.XAlign = text.XRight
	c.FillText(sub, vg.Point{X: W - marginX*px, Y: H - 26*px},
		fmt.Sprintf("%s to %s UTC · panels drawn by tpdashboard from Prometheus query_range of a real run, not a Grafana screenshot",
			start.UTC().Format("2006-01-02 15:04:05"), end.UTC().Format("15:04:05")))
	for _, p := range d.panels() {
		g := p.GridPos
		x0 := marginX*px + vg.Length(g.X)*col
		top := H - vg.Length(headPx)*px - vg.Length(g.Y*rowPx)*px
		r := vg.Rectangle{Min: vg.Point{X: x0 + 3*px, Y: top - vg.Length(g.H*rowPx)*px + 3*px},
			Max: vg.Point{X: x0 + vg.Length(g.W)*col - 3*px, Y: top - 3*px}}
		if p.Type == "row" {
			c.FillText(style(13, textColor), vg.Point{X: r.Min.X + 2*px, Y: r.Min.Y + 6*px}, "▾ "+p.Title)
			continue
		}
		fill(c, r, panelColor)
		stroke(c, r, borderColor)
		c.FillText(style(11.5, textColor), vg.Point{X: r.Min.X + 8*px, Y: r.Max.Y - 18*px}, p.Title)
		body := vg.Rectangle{Min: vg.Point{X: r.Min.X + 4*px, Y: r.Min.Y + 4*px}, Max: vg.Point{X: r.Max.X - 6*px, Y: r.Max.Y - 26*px}}
		ss := data[p.ID]
		if len(ss) == 0 {
			t := style(12, mutedColor)
			t.XAlign, t.YAlign = text.XCenter, text.YCenter
			c.FillText(t, vg.Point{X: (body.Min.X + body.Max.X) / 2, Y: (body.Min.Y + body.Max.Y) / 2}, "No data")
			continue
		}
		var err error
		if p.Type == "state-timeline" {
			err = drawTimeline(c, body, &p, ss, start, end)
		} else {
			err = drawTimeSeries(c, body, &p, ss, start, end)
		}
		if err != nil {
			return nil, fmt.Errorf("panel %q: %w", p.Title, err)
		}
	}
	var b bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func fill(c draw.Canvas, r vg.Rectangle, clr color.Color) {
	c.FillPolygon(clr, []vg.Point{r.Min, {X: r.Max.X, Y: r.Min.Y}, r.Max, {X: r.Min.X, Y: r.Max.Y}})
}

func stroke(c draw.Canvas, r vg.Rectangle, clr color.Color) {
	c.StrokeLines(draw.LineStyle{Color: clr, Width: px},
		[]vg.Point{r.Min, {X: r.Max.X, Y: r.Min.Y}, r.Max, {X: r.Min.X, Y: r.Max.Y}, r.Min})
}

// drawLegend writes the entries at the bottom of r, as many lines as they
// need (three at most), and returns the height it took.
func drawLegend(c draw.Canvas, r vg.Rectangle, names []string) vg.Length {
	st := style(9.5, textColor)
	lineH := 14 * px
	x, y := r.Min.X+4*px, r.Min.Y+4*px
	type placed struct {
		pt   vg.Point
		name string
		i    int
	}
	var rows [][]placed
	var row []placed
	for i, n := range names {
		w := 16*px + st.Width(n) + 12*px
		if x+w > r.Max.X && len(row) > 0 {
			rows, row, x = append(rows, row), nil, r.Min.X+4*px
		}
		row = append(row, placed{vg.Point{X: x, Y: 0}, n, i})
		x += w
	}
	rows = append(rows, row)
	if len(rows) > 3 {
		more := 0
		for _, r := range rows[3:] {
			more += len(r)
		}
		rows = rows[:3]
		last := &rows[2][len(rows[2])-1]
		last.name += fmt.Sprintf("  (+%d more)", more)
	}
	for k := range rows {
		rowY := y + vg.Length(len(rows)-1-k)*lineH
		for _, e := range rows[k] {
			clr := palette[e.i%len(palette)]
			c.StrokeLine2(draw.LineStyle{Color: clr, Width: 3 * px}, e.pt.X, rowY+4*px, e.pt.X+12*px, rowY+4*px)
			c.FillText(st, vg.Point{X: e.pt.X + 16*px, Y: rowY}, e.name)
		}
	}
	return vg.Length(len(rows))*lineH + 6*px
}

// drawTimeSeries draws ss as lines (stacked if the panel stacks) with a
// y axis in the panel's unit.
func drawTimeSeries(c draw.Canvas, r vg.Rectangle, p *panel, ss []series, start, end time.Time) error {
	names := make([]string, len(ss))
	for i, s := range ss {
		names[i] = s.legend
	}
	legendH := drawLegend(c, r, names)
	pl := plot.New()
	pl.BackgroundColor = color.Transparent
	for _, a := range []*plot.Axis{&pl.X, &pl.Y} {
		a.Color = borderColor
		a.Tick.Color = borderColor
		a.Tick.Label.Color = mutedColor
		a.Tick.Label.Font.Size = vg.Points(9)
		a.Padding = 0
	}
	pl.X.Min, pl.X.Max = float64(start.Unix()), float64(end.Unix())
	pl.X.Tick.Marker = plot.TimeTicks{Format: "15:04:05"}
	unit := p.FieldConfig.Defaults.Unit
	pl.Y.Tick.Marker = unitTicks{unit: unit}
	grid := plotter.NewGrid()
	grid.Vertical.Color, grid.Horizontal.Color = gridColor, gridColor
	pl.Add(grid)
	stacked := p.FieldConfig.Defaults.Custom.Stacking.Mode == "normal"
	base := map[float64]float64{} // stacked: the sum of the series below, by time
	lo, hi := 0.0, 0.0
	for i, s := range ss {
		clr := palette[i%len(palette)]
		var seg plotter.XYs
		flush := func() {
			if len(seg) == 0 {
				return
			}
			l, err := plotter.NewLine(seg)
			if err == nil {
				l.Color, l.Width = clr, 1.5*px
				l.FillColor = withAlpha(clr, 0x1c)
				pl.Add(l)
			}
			seg = nil
		}
		for k, t := range s.t {
			v := s.v[k]
			if math.IsNaN(v) || math.IsInf(v, 0) || k > 0 && t-s.t[k-1] > 1.5 {
				flush()
				if math.IsNaN(v) || math.IsInf(v, 0) {
					continue
				}
			}
			if stacked {
				v += base[t]
				base[t] = v
			}
			lo, hi = math.Min(lo, v), math.Max(hi, v)
			seg = append(seg, plotter.XY{X: t, Y: v})
		}
		flush()
	}
	if hi == lo {
		hi = lo + 1
	}
	pl.Y.Min, pl.Y.Max = lo, hi*1.08
	area := vg.Rectangle{Min: vg.Point{X: r.Min.X, Y: r.Min.Y + legendH}, Max: r.Max}
	pl.Draw(draw.Canvas{Canvas: c.Canvas, Rectangle: area})
	return nil
}

// drawTimeline draws each series as a band coloured by its value's
// mapping (LEVEL0 green, LEVEL1 orange, LEVEL2 red), with the mapping's
// text as the legend.
func drawTimeline(c draw.Canvas, r vg.Rectangle, p *panel, ss []series, start, end time.Time) error {
	type mapping struct {
		text string
		clr  color.Color
	}
	maps := map[string]mapping{}
	var keys []string
	for _, m := range p.FieldConfig.Defaults.Mappings {
		for k, o := range m.Options {
			maps[k] = mapping{o.Text, levelColors[o.Color]}
			keys = append(keys, k)
		}
	}
	// Legend: the mapped values.
	st := style(9.5, textColor)
	x := r.Min.X + 4*px
	for _, k := range []string{"0", "1", "2"} {
		m, ok := maps[k]
		if !ok {
			continue
		}
		fill(c, vg.Rectangle{Min: vg.Point{X: x, Y: r.Min.Y + 5*px}, Max: vg.Point{X: x + 10*px, Y: r.Min.Y + 13*px}}, m.clr)
		c.FillText(st, vg.Point{X: x + 14*px, Y: r.Min.Y + 4*px}, m.text)
		x += 14*px + st.Width(m.text) + 14*px
	}
	labelW := vg.Length(0)
	for _, s := range ss {
		labelW = max(labelW, st.Width(s.legend))
	}
	labelW = min(labelW+10*px, (r.Max.X-r.Min.X)*0.4)
	axisH := 16 * px
	band := vg.Rectangle{Min: vg.Point{X: r.Min.X + labelW, Y: r.Min.Y + 20*px + axisH}, Max: vg.Point{X: r.Max.X - 4*px, Y: r.Max.Y}}
	t0, t1 := float64(start.Unix()), float64(end.Unix())
	xOf := func(t float64) vg.Length {
		return band.Min.X + vg.Length((t-t0)/(t1-t0))*(band.Max.X-band.Min.X)
	}
	rowH := min((band.Max.Y-band.Min.Y)/vg.Length(len(ss)), 26*px)
	for i, s := range ss {
		yTop := band.Max.Y - vg.Length(i)*rowH
		yBot := yTop - rowH + 2*px
		lbl := style(9.5, textColor)
		lbl.YAlign = text.YCenter
		c.FillText(lbl, vg.Point{X: r.Min.X + 4*px, Y: (yTop + yBot) / 2}, s.legend)
		for k, t := range s.t {
			if math.IsNaN(s.v[k]) {
				continue
			}
			next := t + 1
			if k+1 < len(s.t) {
				next = s.t[k+1]
			}
			clr := mutedColor
			if m, ok := maps[strconv.FormatFloat(s.v[k], 'f', -1, 64)]; ok {
				clr = m.clr
			}
			fill(c, vg.Rectangle{Min: vg.Point{X: xOf(t), Y: yBot}, Max: vg.Point{X: min(xOf(next)+px, band.Max.X), Y: yTop}}, clr) // + px: no seam between samples
		}
	}
	// Time axis.
	ticks := plot.TimeTicks{Format: "15:04:05"}.Ticks(t0, t1)
	tl := style(9, mutedColor)
	tl.XAlign = text.XCenter
	for _, tk := range ticks {
		if tk.Label == "" {
			continue
		}
		c.FillText(tl, vg.Point{X: xOf(tk.Value), Y: band.Min.Y - axisH + 2*px}, tk.Label)
	}
	return nil
}

// unitTicks labels the y axis in a Grafana unit.
type unitTicks struct{ unit string }

func (u unitTicks) Ticks(min, max float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(min, max)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = formatUnit(ts[i].Value, u.unit)
		}
	}
	return ts
}

// formatUnit writes v as Grafana would in unit.
func formatUnit(v float64, unit string) string {
	switch unit {
	case "s":
		switch a := math.Abs(v); {
		case a == 0:
			return "0"
		case a < 1e-3:
			return trim(v*1e6) + " µs"
		case a < 1:
			return trim(v*1e3) + " ms"
		}
		return trim(v) + " s"
	case "percentunit":
		return trim(v*100) + "%"
	case "reqps":
		return short(v) + " req/s"
	case "ops":
		return short(v) + " ops/s"
	case "bytes":
		return binary(v) + "B"
	case "Bps":
		return short(v) + "B/s"
	}
	return short(v)
}

func trim(v float64) string {
	s := strconv.FormatFloat(v, 'f', 2, 64)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	if s == "-0" {
		return "0"
	}
	return s
}

func short(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e9:
		return trim(v/1e9) + " G"
	case a >= 1e6:
		return trim(v/1e6) + " M"
	case a >= 1e3:
		return trim(v/1e3) + " K"
	}
	return trim(v)
}

func binary(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1<<30:
		return trim(v/(1<<30)) + " Gi"
	case a >= 1<<20:
		return trim(v/(1<<20)) + " Mi"
	case a >= 1<<10:
		return trim(v/(1<<10)) + " Ki"
	}
	return trim(v) + " "
}
