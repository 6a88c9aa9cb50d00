package main

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// dashboard is what tpdashboard reads of a Grafana dashboard model.
type dashboard struct {
	Title  string  `json:"title"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"` // row, timeseries, state-timeline
	Title   string `json:"title"`
	GridPos struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
	FieldConfig struct {
		Defaults struct {
			Unit   string `json:"unit"`
			Custom struct {
				Stacking struct {
					Mode string `json:"mode"`
				} `json:"stacking"`
			} `json:"custom"`
			Mappings []struct {
				Options map[string]struct {
					Text  string `json:"text"`
					Color string `json:"color"`
				} `json:"options"`
			} `json:"mappings"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Panels []panel `json:"panels"` // a collapsed row's
}

func readDashboard(path string) (*dashboard, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &d, nil
}

// panels are the dashboard's panels, rows included, in grid order.
func (d *dashboard) panels() []panel {
	var out []panel
	for _, p := range d.Panels {
		out = append(out, p)
		out = append(out, p.Panels...)
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i].GridPos, out[j].GridPos
		return a.Y < b.Y || a.Y == b.Y && a.X < b.X
	})
	return out
}

// series is one line of a panel: its legend and its samples.
type series struct {
	legend string
	t      []float64 // unix seconds
	v      []float64
}

// promClient evaluates PromQL on a Prometheus' HTTP API.
type promClient struct {
	base string
	vars map[string]string // dashboard variables and their values
}

// evaluate runs every query of every panel over [start, end] at a step of
// one second, and returns the series by panel id.
func (c *promClient) evaluate(d *dashboard, start, end time.Time) (map[int][]series, error) {
	out := map[int][]series{}
	for _, p := range d.panels() {
		for _, t := range p.Targets {
			expr := t.Expr
			for k, v := range c.vars {
				expr = strings.ReplaceAll(expr, k, v)
			}
			got, err := c.queryRange(expr, start, end, time.Second)
			if err != nil {
				return nil, fmt.Errorf("panel %q: %s: %w", p.Title, t.Expr, err)
			}
			for _, r := range got {
				s := series{legend: legend(t.LegendFormat, r.Metric)}
				for _, pt := range r.Values {
					ts, _ := pt[0].(float64)
					str, _ := pt[1].(string)
					v, err := strconv.ParseFloat(str, 64)
					if err != nil {
						v = math.NaN()
					}
					s.t, s.v = append(s.t, ts), append(s.v, v)
				}
				out[p.ID] = append(out[p.ID], s)
			}
		}
		sort.SliceStable(out[p.ID], func(i, j int) bool { return out[p.ID][i].legend < out[p.ID][j].legend })
	}
	return out, nil
}

type matrix []struct {
	Metric map[string]string `json:"metric"`
	Values [][2]any          `json:"values"`
}

func (c *promClient) queryRange(expr string, start, end time.Time, step time.Duration) (matrix, error) {
	q := url.Values{}
	q.Set("query", expr)
	q.Set("start", strconv.FormatInt(start.Unix(), 10))
	q.Set("end", strconv.FormatInt(end.Unix(), 10))
	q.Set("step", strconv.FormatFloat(step.Seconds(), 'f', -1, 64))
	resp, err := http.Get(c.base + "/api/v1/query_range?" + q.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     matrix `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("prometheus: %s: %w", resp.Status, err)
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("prometheus: %s", body.Error)
	}
	return body.Data.Result, nil
}

// legend fills Grafana's {{label}} placeholders from a series' labels.
func legend(format string, labels map[string]string) string {
	if format == "" {
		var parts []string
		for k, v := range labels {
			parts = append(parts, k+"="+v)
		}
		sort.Strings(parts)
		return "{" + strings.Join(parts, ", ") + "}"
	}
	out := format
	for {
		i := strings.Index(out, "{{")
		j := strings.Index(out, "}}")
		if i < 0 || j < i {
			return strings.TrimSpace(out)
		}
		name := strings.TrimSpace(out[i+2 : j])
		out = out[:i] + labels[name] + out[j+2:]
	}
}
