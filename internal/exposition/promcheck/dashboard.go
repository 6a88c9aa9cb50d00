package promcheck

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// Query is one PromQL query of a Grafana dashboard panel.
type Query struct {
	Panel string // the panel's title
	Expr  string
}

// DashboardQueries reads a Grafana dashboard (JSON model) and returns the
// queries of its panels, rows' nested panels included. It fails on a panel
// with no query, a query without refId or expression, a repeated panel id,
// or a datasource other than the dashboard's ${datasource} variable (so the
// dashboard imports into any Grafana without mapping).
func DashboardQueries(path string) ([]Query, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	type target struct {
		RefID      string          `json:"refId"`
		Expr       string          `json:"expr"`
		Datasource json.RawMessage `json:"datasource"`
	}
	type panel struct {
		ID         int             `json:"id"`
		Type       string          `json:"type"`
		Title      string          `json:"title"`
		Datasource json.RawMessage `json:"datasource"`
		Targets    []target        `json:"targets"`
		Panels     []panel         `json:"panels"`
	}
	var dash struct {
		Title  string  `json:"title"`
		UID    string  `json:"uid"`
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if dash.Title == "" || dash.UID == "" || len(dash.Panels) == 0 {
		return nil, fmt.Errorf("%s: a dashboard needs a title, a uid and panels", path)
	}
	const ds = `{"type": "prometheus", "uid": "${datasource}"}`
	dsOK := func(raw json.RawMessage) bool {
		var d struct{ Type, UID string }
		return json.Unmarshal(raw, &d) == nil && d.Type == "prometheus" && d.UID == "${datasource}"
	}
	ids := map[int]bool{}
	var out []Query
	var walk func([]panel) error
	walk = func(ps []panel) error {
		for _, p := range ps {
			if ids[p.ID] {
				return fmt.Errorf("%s: panel id %d twice", path, p.ID)
			}
			ids[p.ID] = true
			if p.Type == "row" {
				if err := walk(p.Panels); err != nil {
					return err
				}
				continue
			}
			if len(p.Targets) == 0 || !dsOK(p.Datasource) {
				return fmt.Errorf("%s: panel %q: no query, or a datasource other than %s", path, p.Title, ds)
			}
			for _, t := range p.Targets {
				if t.RefID == "" || strings.TrimSpace(t.Expr) == "" || !dsOK(t.Datasource) {
					return fmt.Errorf("%s: panel %q: a query without refId, expression or the dashboard's datasource", path, p.Title)
				}
				out = append(out, Query{Panel: p.Title, Expr: t.Expr})
			}
		}
		return nil
	}
	return out, walk(dash.Panels)
}

// Selector is a metric a query selects and the labels its matchers name.
type Selector struct {
	Metric string
	Labels []string
}

var (
	metricName = regexp.MustCompile(`\b(?:tpsched|process|go)_[a-zA-Z0-9_]*`)
	matcher    = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
)

// Selectors are the metrics expr selects, with the label names of their
// matchers. It knows the metric names of tpsched and of the library it
// uses (tpsched_, process_, go_); a query that names none of them selects
// nothing it can check.
func Selectors(expr string) []Selector {
	var out []Selector
	for _, loc := range metricName.FindAllStringIndex(expr, -1) {
		s := Selector{Metric: expr[loc[0]:loc[1]]}
		if rest := expr[loc[1]:]; strings.HasPrefix(rest, "{") {
			if end := strings.IndexByte(rest, '}'); end > 0 {
				for _, m := range matcher.FindAllStringSubmatch(rest[1:end], -1) {
					s.Labels = append(s.Labels, m[1])
				}
			}
		}
		out = append(out, s)
	}
	return out
}

// Family is the family of a metric name as fs has it: the name itself, or
// a histogram's or summary's name less _bucket, _sum or _count. ok is false
// when fs has neither.
func (fs Families) Family(metric string) (family string, ok bool) {
	if _, ok := fs[metric]; ok {
		return metric, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, cut := strings.CutSuffix(metric, suffix); cut {
			if _, ok := fs[base]; ok {
				return base, true
			}
		}
	}
	return "", false
}

// HasLabel tells whether some series of family carries label.
func (fs Families) HasLabel(family, label string) bool {
	for _, m := range fs[family].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				return true
			}
		}
	}
	return false
}

// HistogramBase is metric less _bucket, _sum or _count: the family a
// histogram's series belong to (metric itself if it has none of them).
func HistogramBase(metric string) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(metric, suffix); ok {
			return base
		}
	}
	return metric
}
