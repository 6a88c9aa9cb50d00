package wlmnode

import (
	"errors"
	"io"
	"reflect"
	"strconv"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/netio"
	"tpsched/scd/names"
	"tpsched/scd/wlm"
)

// Report is what `scdctl report` shows.
type Report struct {
	Node     string    `json:"node"`
	At       time.Time `json:"at"`
	Policy   string    `json:"policy"` // where it was read
	Since    time.Time `json:"since"`  // when it came into force: the totals count from then
	Interval float64   `json:"interval_seconds"`
	// Intervals counts the policy intervals ended since the node started.
	Intervals uint64 `json:"intervals"`
	// Managed is goal_management: false when the node only measures and
	// reports (Action is then what it would have done).
	Managed bool `json:"goal_management"`
	// SpareCPUs is the CPU available to work of importance 1..5 (index
	// 0..4) over the last interval, in CPUs.
	SpareCPUs []float64 `json:"spare_cpus"`
	// OtherCPUs is the CPU programs other than this node's UAPs used over
	// the last interval, on the CPUs the node may run on: what goal
	// management cannot take from.
	OtherCPUs float64 `json:"other_cpus"`
	// LoadError says why other programs' CPU use is not measured, if it is not.
	LoadError string `json:"load_error,omitempty"`
	// Missing is the class that misses its goal most (the most important
	// first) and what the node did about it, if any.
	Missing string `json:"missing,omitempty"`
	Action  string `json:"action,omitempty"`
	// Grow is what became of this node's last ask for one more server of
	// an environment elsewhere (a missed goal): started or not, and why
	// not.
	Grow         *GrowReport   `json:"grow,omitempty"`
	Classes      []ClassReport `json:"classes"`
	Groups       []GroupReport `json:"groups"`
	Environments []EnvReport   `json:"environments"`
}

// GrowReport is the outcome of one ask for one more server.
type GrowReport struct {
	Env     string    `json:"env"`
	At      time.Time `json:"at"`
	Decider string    `json:"decider"`
	// Result is "asked" when the decider answered (a server started, or
	// one was started for another node's ask within the cooldown), else
	// why none started.
	Result string `json:"result"`
}

// ClassReport is one service class: its goal against what its calls did on
// this node.
type ClassReport struct {
	Class      string  `json:"class"`
	Importance int     `json:"importance"`
	Goal       string  `json:"goal"` // "90% within 200ms", "average 1.5s"
	GoalMs     float64 `json:"goal_ms"`
	Percent    int     `json:"percent,omitempty"` // percentile goals
	// PI is the performance index over the last intervals (window); absent
	// without calls. ActualMs is what it stands for: the response time at
	// the goal's percentile (a bucket bound), or the average.
	PI       *float64 `json:"pi,omitempty"`
	ActualMs *float64 `json:"actual_ms,omitempty"`
	// WindowCalls are the calls of the window; Calls those since the
	// policy came into force, which the rest counts.
	WindowCalls uint64   `json:"window_calls"`
	Calls       uint64   `json:"calls"`
	WithinGoal  float64  `json:"within_goal"` // share of the calls answered within the goal's time
	TotalPI     *float64 `json:"total_pi,omitempty"`
	ResponseMs  float64  `json:"avg_response_ms"`
	QueueMs     float64  `json:"avg_queue_ms"`
	ServiceMs   float64  `json:"avg_service_ms"`
	CPUPerCall  float64  `json:"cpu_ms_per_call"`
	// Distribution counts the calls by response time against the goal:
	// each bucket up to UpTo percent of the goal's time (0: beyond 400%).
	Distribution []GoalBucket `json:"distribution"`
}

// GoalBucket is one bucket of a class's response-time distribution.
type GoalBucket struct {
	UpToPercent int    `json:"up_to_percent"`
	Calls       uint64 `json:"calls"`
}

// GroupReport is one service group as goal management sees it.
type GroupReport struct {
	Group    string   `json:"group"`
	Env      bool     `json:"environment,omitempty"`
	State    string   `json:"state"` // serving, dormant, starting, quiescing
	Weight   int      `json:"cpu_weight"`
	Base     int      `json:"base_cpu_weight"` // from schedule_priority
	CPUDelay *float64 `json:"cpu_delay,omitempty"`
	PI       *float64 `json:"pi,omitempty"` // the worst of its classes over the window
}

// EnvReport is one application environment across the cluster; with
// subsystem instances, one instance's servers of one (Env is then the
// instance's group, ENV@INSTANCE).
type EnvReport struct {
	Env           string      `json:"env"`
	Environment   string      `json:"environment"`        // the environment as svcpolicy names it
	Instance      string      `json:"instance,omitempty"` // the subsystem instance; "" without instances
	HighWaterMark int         `json:"high_water_mark"`
	Quiesced      bool        `json:"quiesced,omitempty"`
	Here          string      `json:"here"` // this node's server: serving, dormant...; "" when it does not define it
	Servers       []EnvServer `json:"servers"`
	CanServe      []string    `json:"can_serve"` // the nodes that define it
	Decider       string      `json:"decider"`   // the node that decides its starts, as this node's table has it
}

// EnvServer is one node that serves an environment.
type EnvServer struct {
	Node string   `json:"node"`
	Addr string   `json:"addr"`
	PI   *float64 `json:"pi,omitempty"`
}

func fptr(v float64) *float64 { return &v }

// Report is the routing manager's report now.
func (w *Manager) Report() Report {
	ap := w.policy.Load()
	p := ap.p
	r := Report{Node: w.opts.Self, At: time.Now(), Policy: ap.def.File, Since: ap.since, Interval: p.Interval.Seconds(),
		Managed: ap.def.Manage}
	w.mu.Lock()
	r.Intervals = w.intervals
	for i := wlm.MostImportant; i <= wlm.LeastImportant; i++ {
		r.SpareCPUs = append(r.SpareCPUs, w.spare[i])
	}
	r.LoadError = w.loadErr
	r.OtherCPUs = w.other
	if d := w.decision; d.Receiver >= 0 && d.Receiver < len(p.Classes) {
		r.Missing, r.Action = p.Classes[d.Receiver].Name, d.Why
	}
	if w.lastGrow.Env != "" {
		g := w.lastGrow
		r.Grow = &g
	}
	for i, c := range p.Classes {
		f := &w.classes[i]
		cr := ClassReport{Class: c.Name, Importance: c.Importance, Goal: c.Goal.String(),
			GoalMs: float64(c.Goal.Target) / 1e6, WindowCalls: f.window.Sum().Calls, Calls: f.total.Calls}
		if c.Goal.Kind == wlm.GoalPercentile {
			cr.Percent = c.Goal.Percent
		}
		if f.piKnown {
			cr.PI, cr.ActualMs = fptr(f.pi), fptr(f.pi*cr.GoalMs)
		}
		t := f.total
		if pi, ok := wlm.PI(c.Goal, t); ok {
			cr.TotalPI = fptr(pi)
		}
		cr.WithinGoal, _ = wlm.WithinGoal(t)
		cr.ResponseMs = float64(t.Average(t.Response)) / 1e6
		cr.QueueMs = float64(t.Average(t.Queue)) / 1e6
		cr.ServiceMs = float64(t.Average(t.Service)) / 1e6
		cr.CPUPerCall = float64(t.Average(t.CPU)) / 1e6
		for b, calls := range t.Buckets {
			cr.Distribution = append(cr.Distribution, GoalBucket{UpToPercent: wlm.BucketLimit(b), Calls: calls})
		}
		r.Classes = append(r.Classes, cr)
	}
	for _, g := range w.local.Groups() {
		gf := w.groups[g.Name()]
		if gf == nil {
			continue
		}
		gr := GroupReport{Group: g.Name(), Env: p.IsEnvironment(g.Name()), Weight: gf.weight, Base: gf.base}
		if gf.delay >= 0 {
			gr.CPUDelay = fptr(gf.delay)
		}
		if gf.pi > 0 {
			gr.PI = fptr(float64(gf.pi) / 100)
		}
		r.Groups = append(r.Groups, gr)
	}
	w.mu.Unlock()
	m := w.envs
	for i := range r.Groups {
		r.Groups[i].State = m.localState(r.Groups[i].Group)
	}
	for _, env := range p.Environments {
		st := m.state(env)
		named, instance := wlm.SplitInstance(env)
		er := EnvReport{Env: env, Environment: named, Instance: instance, HighWaterMark: st.HWM, Quiesced: st.Quiesced, Here: m.localState(env)}
		for _, s := range m.servers(env, false) {
			es := EnvServer{Node: s.node, Addr: s.addr}
			if s.pi > 0 {
				es.PI = fptr(float64(s.pi) / 100)
			}
			er.Servers = append(er.Servers, es)
		}
		er.CanServe = m.definers(env)
		er.Decider, _ = m.dec.node(env)
		r.Environments = append(r.Environments, er)
	}
	return r
}

// GroupPI is the performance index x 100 announced for group; 0 unknown.
func (w *Manager) GroupPI(group string) uint16 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if gf := w.groups[group]; gf != nil {
		return gf.pi
	}
	return 0
}

// Announced is the routing manager's part of this node's announce.
func (w *Manager) Announced() *names.WLMInfo {
	info := &names.WLMInfo{Envs: w.envs.announcedEnvs()}
	w.mu.Lock()
	for i := range info.Spare {
		info.Spare[i] = wlm.Quantize(w.spare[i+1])
	}
	w.mu.Unlock()
	return info
}

// lastAnnounced is what announceIfChanged compares with.
type wlmAnnounced struct {
	info *names.WLMInfo
	pis  map[string]uint16
}

// announceIfChanged announces the node again when its part changed.
func (w *Manager) announceIfChanged() {
	now := wlmAnnounced{info: w.Announced(), pis: map[string]uint16{}}
	for _, g := range w.local.Groups() {
		now.pis[g.Name()] = w.GroupPI(g.Name())
	}
	w.mu.Lock()
	same := reflect.DeepEqual(now, w.last)
	w.last = now
	w.mu.Unlock()
	if !same {
		w.opts.Announce()
	}
}

// MetricHelp is the HELP text of the routing manager's families.
var MetricHelp = map[string]string{
	"tpsched_wlm_calls_total":                 "Calls answered here, by service class (svcpolicy), since the policy came into force.",
	"tpsched_wlm_response_seconds_total":      "Response time (arrival here to answer) of the class's calls, summed.",
	"tpsched_wlm_queue_seconds_total":         "Time the class's calls waited for a process, summed.",
	"tpsched_wlm_service_seconds_total":       "Time processes served the class's calls, summed.",
	"tpsched_wlm_cpu_seconds_total":           "UAP CPU time charged to the class (each group's CPU split by its classes' service time).",
	"tpsched_wlm_performance_index":           "The class's performance index over the last intervals: actual over goal, above 1 when the goal is missed (absent without calls).",
	"tpsched_wlm_goal_seconds":                "The class's goal response time.",
	"tpsched_wlm_importance":                  "The class's importance, 1 (most) to 5.",
	"tpsched_wlm_response_goal_ratio":         "Response times of the class's calls as a fraction of the goal's time (the workload activity report's buckets).",
	"tpsched_wlm_spare_cpus":                  "CPUs available to work of the importance over the last interval: what other programs and work at least as important leave.",
	"tpsched_wlm_cpu_weight":                  "The group's CPU weight now (cgroup v2 scale; goal management moves it from its schedule_priority's).",
	"tpsched_wlm_environment_servers":         "Nodes that serve the application environment now, as this node's name table says.",
	"tpsched_wlm_environment_high_water_mark": "Most servers the environment had since its last quiesce or policy change; a server that dies is replaced up to it.",
	"tpsched_wlm_environment_serving":         "1 while this node serves the application environment, else 0.",
	"tpsched_wlm_servers_started_total":       "Servers of application environments started on this node.",
	"tpsched_wlm_servers_stopped_total":       "Servers of application environments stopped on this node, by reason (quiesce, policy, failing).",
	"tpsched_wlm_finds_total":                 "Find-server requests of this node, by result (served: a server was there; started: one was started; failed).",
	"tpsched_wlm_calls_waiting_for_server":    "Calls waiting here for a server of an application environment to start.",
}

// WriteMetrics writes the routing manager's series read at scrape time
// (the node registers it as a metrics writer of its /metrics).
func (w *Manager) WriteMetrics(out io.Writer) {
	r := w.Report()
	s := metrics.NewSet()
	type hist struct {
		lbl string
		t   wlm.Sample
		g   wlm.Goal
	}
	var hists []hist
	p := w.policy.Load().p
	w.mu.Lock()
	for i, c := range p.Classes {
		hists = append(hists, hist{`class="` + c.Name + `"`, w.classes[i].total, c.Goal})
	}
	w.mu.Unlock()
	for i, c := range r.Classes {
		lbl := `{class="` + c.Class + `"}`
		t := hists[i].t
		s.NewCounter(`tpsched_wlm_calls_total` + lbl).Set(t.Calls)
		s.NewFloatCounter(`tpsched_wlm_response_seconds_total` + lbl).Set(t.Response.Seconds())
		s.NewFloatCounter(`tpsched_wlm_queue_seconds_total` + lbl).Set(t.Queue.Seconds())
		s.NewFloatCounter(`tpsched_wlm_service_seconds_total` + lbl).Set(t.Service.Seconds())
		s.NewFloatCounter(`tpsched_wlm_cpu_seconds_total` + lbl).Set(t.CPU.Seconds())
		if c.PI != nil {
			s.NewGauge(`tpsched_wlm_performance_index`+lbl, nil).Set(*c.PI)
		}
		s.NewGauge(`tpsched_wlm_goal_seconds`+lbl, nil).Set(c.GoalMs / 1000)
		s.NewGauge(`tpsched_wlm_importance`+lbl, nil).Set(float64(c.Importance))
	}
	for i, v := range r.SpareCPUs {
		s.NewGauge(`tpsched_wlm_spare_cpus{importance="`+strconv.Itoa(i+1)+`"}`, nil).Set(v)
	}
	for _, g := range r.Groups {
		s.NewGauge(`tpsched_wlm_cpu_weight{group="`+g.Group+`"}`, nil).Set(float64(g.Weight))
	}
	for _, e := range r.Environments {
		lbl := `{environment="` + e.Env + `"}`
		s.NewGauge(`tpsched_wlm_environment_servers`+lbl, nil).Set(float64(len(e.Servers)))
		s.NewGauge(`tpsched_wlm_environment_high_water_mark`+lbl, nil).Set(float64(e.HighWaterMark))
		s.NewGauge(`tpsched_wlm_environment_serving`+lbl, nil).Set(boolFloat(e.Here == envServing))
	}
	s.WritePrometheus(out)
	const family = "tpsched_wlm_response_goal_ratio"
	metrics.WriteMetadataIfNeeded(out, family, "histogram")
	for _, h := range hists {
		writeGoalHistogram(out, family, h.lbl, h.t, h.g)
	}
}

// writeGoalHistogram writes a class's distribution as a Prometheus
// histogram of response time over goal time: le 0.5, 0.6 ... 4, +Inf.
func writeGoalHistogram(w io.Writer, family, lbl string, t wlm.Sample, g wlm.Goal) {
	var b []byte
	var cum uint64
	for i, c := range t.Buckets[:wlm.NumBuckets-1] {
		cum += c
		b = append(b, family+"_bucket{"+lbl+`,le="`...)
		b = strconv.AppendFloat(b, float64(wlm.BucketLimit(i))/100, 'g', -1, 64)
		b = append(b, `"} `...)
		b = strconv.AppendUint(b, cum, 10)
		b = append(b, '\n')
	}
	b = append(b, family+"_bucket{"+lbl+`,le="+Inf"} `...)
	b = strconv.AppendUint(b, t.Calls, 10)
	b = append(b, "\n"+family+"_sum{"+lbl+"} "...)
	sum := 0.0
	if g.Target > 0 {
		sum = float64(t.Response) / float64(g.Target)
	}
	b = strconv.AppendFloat(b, sum, 'g', -1, 64)
	b = append(b, "\n"+family+"_count{"+lbl+"} "...)
	b = strconv.AppendUint(b, t.Calls, 10)
	b = append(b, '\n')
	_, _ = w.Write(b)
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// grew records what became of an ask for one more server of env.
func (w *Manager) grew(env, decider string, at time.Time, err error) {
	g := GrowReport{Env: env, At: at, Decider: decider, Result: "asked"}
	if err != nil {
		g.Result = err.Error()
		var ne *netio.Error
		if errors.As(err, &ne) {
			g.Result = ne.Message
		}
	}
	w.mu.Lock()
	w.lastGrow = g
	w.mu.Unlock()
}
