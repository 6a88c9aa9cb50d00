// Package promcheck reads Prometheus text as Prometheus does (the text
// parser of prometheus/common's expfmt) and checks what Prometheus and
// Grafana rely on, for the tests of whatever serves /metrics.
//
// It must not be imported by a daemon: it is for tests.
package promcheck

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families are the parsed metric families by name.
type Families map[string]*dto.MetricFamily

// Check parses text and returns its families and every problem found:
// a line that does not parse; a family without HELP text or TYPE line; a
// series written twice; a family whose lines are not together; a family
// that is a counter without _total or has _total without being a counter,
// or that ends in _count, _sum or _bucket without being a histogram or
// summary (promtool's naming rules, for every family: the library's go_*
// and process_* too); a histogram without le buckets rising to +Inf, or
// (tpsched_ only: the library writes the Go runtime's without on purpose)
// whose +Inf bucket is not its _count.
func Check(text string) (Families, []error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return nil, []error{fmt.Errorf("does not parse: %w", err)}
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	types := map[string]string{}
	seen := map[string]bool{}   // series (name and labels) written
	closed := map[string]bool{} // families whose lines have ended
	last := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(rest, " ")
			types[name] = typ
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		series := seriesOf(line)
		if seen[series] {
			bad("%s written twice", series)
		}
		seen[series] = true
		fam := familyOf(series, types)
		if fam != last {
			if closed[fam] {
				bad("the lines of %s are not together", fam)
			}
			closed[last] = true
			last = fam
		}
	}
	for name, f := range fams {
		if f.GetHelp() == "" {
			bad("%s has no HELP text", name)
		}
		if types[name] == "" {
			bad("%s has no TYPE line", name)
		}
		if (f.GetType() == dto.MetricType_COUNTER) != strings.HasSuffix(name, "_total") {
			bad("%s is a %v: a counter's name ends in _total, and only a counter's", name, f.GetType())
		}
		if t := f.GetType(); t != dto.MetricType_HISTOGRAM && t != dto.MetricType_SUMMARY {
			for _, suffix := range []string{"_count", "_sum", "_bucket"} {
				if strings.HasSuffix(name, suffix) {
					bad("%s is a %v: only a histogram's or summary's series end in %s", name, t, suffix)
				}
			}
		}
		if f.GetType() != dto.MetricType_HISTOGRAM {
			continue
		}
		for _, m := range f.GetMetric() {
			b := m.GetHistogram().GetBucket()
			if len(b) < 2 || !math.IsInf(b[len(b)-1].GetUpperBound(), 1) {
				bad("%s%v: buckets %v, want le buckets ending at +Inf", name, m.GetLabel(), b)
				continue
			}
			for i := 1; i < len(b); i++ {
				if b[i].GetUpperBound() <= b[i-1].GetUpperBound() || b[i].GetCumulativeCount() < b[i-1].GetCumulativeCount() {
					bad("%s%v: bucket %d (%v) after %v", name, m.GetLabel(), i, b[i], b[i-1])
				}
			}
			if strings.HasPrefix(name, "tpsched_") && b[len(b)-1].GetCumulativeCount() != m.GetHistogram().GetSampleCount() {
				bad("%s%v: +Inf bucket %d, _count %d", name, m.GetLabel(), b[len(b)-1].GetCumulativeCount(), m.GetHistogram().GetSampleCount())
			}
		}
	}
	if strings.Contains(text, "vmrange") {
		bad("vmrange buckets: Prometheus' histogram_quantile cannot use them")
	}
	return fams, errs
}

// Err joins the problems Check found, nil if none.
func Err(errs []error) error { return errors.Join(errs...) }

// seriesOf is the name and labels of a sample line (label values may hold
// spaces).
func seriesOf(line string) string {
	if i := strings.LastIndexByte(line, '}'); i >= 0 && strings.IndexByte(line, '{') >= 0 {
		return line[:i+1]
	}
	name, _, _ := strings.Cut(line, " ")
	return name
}

// familyOf is the family a series line belongs to: its name less a
// histogram's or summary's _bucket, _sum or _count.
func familyOf(series string, types map[string]string) string {
	name, _, _ := strings.Cut(series, "{")
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && (types[base] == "histogram" || types[base] == "summary") {
			return base
		}
	}
	return name
}

// Value is the value of the family's first series whose label has value
// (any series when label is ""), NaN if there is none.
func (fs Families) Value(family, label, value string) float64 {
	for _, m := range fs[family].GetMetric() {
		if label != "" && LabelValue(m, label) != value {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		}
	}
	return math.NaN()
}

// Histogram is the family's histogram whose label has value, nil if none.
func (fs Families) Histogram(family, label, value string) *dto.Histogram {
	for _, m := range fs[family].GetMetric() {
		if LabelValue(m, label) == value {
			return m.GetHistogram()
		}
	}
	return nil
}

// LabelValue is m's value of label name, "" if it has none.
func LabelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
