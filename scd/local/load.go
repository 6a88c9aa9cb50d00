package local

import (
	"math"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/scd/def"
	"tpsched/scd/loadlevel"
)

// groupLoad is a group's load level and the check that set it. The load
// loop writes it; status, metrics, routing and announces read it.
type groupLoad struct {
	sampler *loadlevel.Sampler // the load loop's alone
	changes *metrics.Counter

	mu   sync.Mutex
	last loadlevel.Result
	at   time.Time // of the last check; zero before the first
}

// LoadStatus is a group's load level and the figures of the check that
// set it (Table 3-12: Q, q, X; Table 3-14: q alone decides).
type LoadStatus struct {
	Level      string    `json:"level"`
	Rule       string    `json:"rule"`               // "rate" (Table 3-12) or "thresholds" (Table 3-14)
	Interval   float64   `json:"interval_seconds"`   // loadcheck_interval; 0 = never checked
	Checked    time.Time `json:"checked,omitzero"`   // the last check
	Queued     uint64    `json:"queued_in_interval"` // Q
	Remaining  int       `json:"remaining"`          // q
	Processed  uint64    `json:"processed_in_interval"`
	Rate       *float64  `json:"processing_rate,omitempty"` // X; absent when Q + q = 0
	Changes    uint64    `json:"changes"`
	Thresholds []int     `json:"thresholds,omitempty"` // U1, U2, D0, D1
}

// groupLoad's methods: the group's figures for the sampler, its
// Table 3-14 thresholds when it has them, its level and its status.

// counters are the group's figures for the sampler. A call served on a
// lane counts as queued and processed (Group.stats): the queue alone,
// which sees a lane's first call and few others, would see a rate of 0 in
// an interval that queued one call and completed it in the next, and
// raise the level for nothing.
func (l *groupLoad) counters(g *Group) loadlevel.Counters {
	st := g.stats()
	return loadlevel.Counters{Queued: st.Queued, Processed: st.Processed, Depth: st.Waiting}
}

func thresholdsOf(s *def.Server) *loadlevel.Thresholds {
	if !s.LevelThresholds {
		return nil
	}
	return &loadlevel.Thresholds{U1: s.LevelUp[0], U2: s.LevelUp[1], D0: s.LevelDown[0], D1: s.LevelDown[1]}
}

func (l *groupLoad) lastCheck() loadlevel.Result {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last
}

// level is the group's load level after the last check.
func (l *groupLoad) level() loadlevel.Level { return l.lastCheck().To }

func (l *groupLoad) status(s *def.Server) LoadStatus {
	l.mu.Lock()
	r, at := l.last, l.at
	l.mu.Unlock()
	ls := LoadStatus{
		Level:     r.To.String(),
		Rule:      "rate",
		Interval:  s.LoadCheckInterval.Seconds(),
		Checked:   at,
		Queued:    r.Sample.Queued,
		Remaining: r.Sample.Remaining,
		Processed: r.Sample.Processed,
		Changes:   l.changes.Get(),
	}
	if th := thresholdsOf(s); th != nil {
		ls.Rule, ls.Thresholds = "thresholds", []int{th.U1, th.U2, th.D0, th.D1}
	}
	if x, ok := r.Sample.ProcessingRate(); ok {
		ls.Rate = &x
	}
	return ls
}

// check is one load check of g: it returns whether the level changed.
func (l *groupLoad) check(g *Group, now time.Time) (loadlevel.Result, bool) {
	r := l.sampler.Check(l.counters(g))
	l.mu.Lock()
	l.last, l.at = r, now
	l.mu.Unlock()
	if r.Changed() {
		l.changes.Inc()
	}
	return r, r.Changed()
}

// startLoad gives g its load meter, based on the queue's counters now, and
// its metrics.
func (s *Scheduler) startLoad(g *Group) {
	l := &g.load
	l.sampler = loadlevel.NewSampler(l.counters(g), thresholdsOf(&g.def))
	lbl := `{group="` + g.name + `"}`
	set := s.opts.Metrics
	l.changes = set.NewCounter(`tpsched_load_level_changes_total` + lbl)
	set.NewGauge(`tpsched_load_level`+lbl, func() float64 { return float64(l.level()) })
	set.NewGauge(`tpsched_load_queued_in_interval`+lbl, func() float64 {
		return float64(l.lastCheck().Sample.Queued)
	})
	set.NewGauge(`tpsched_load_remaining`+lbl, func() float64 {
		return float64(l.lastCheck().Sample.Remaining)
	})
	set.NewGauge(`tpsched_load_processing_ratio`+lbl, func() float64 {
		if x, ok := l.lastCheck().Sample.ProcessingRate(); ok {
			return x / 100
		}
		return math.NaN() // Q + q = 0: nothing was asked of the group
	})
}

// loadLoop checks each group's load level on the load-check tick: the gcd
// of 10 s and every group's loadcheck_interval (see loadlevel.Schedule).
func (s *Scheduler) loadLoop(sched *loadlevel.Schedule) {
	defer s.wg.Done()
	t := time.NewTicker(sched.Tick())
	defer t.Stop()
	for tick := uint64(1); ; tick++ {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			for i, g := range s.order {
				if sched.Due(i, tick) {
					s.checkLoad(g, now)
				}
			}
		}
	}
}

func (s *Scheduler) checkLoad(g *Group, now time.Time) {
	r, changed := g.load.check(g, now)
	if !changed {
		return
	}
	s.opts.LevelChanged(g)
	if g.def.LoadLevelMessage {
		x, _ := r.Sample.ProcessingRate()
		s.log.Info("load level changed", "group", g.name, "from", r.From.String(), "to", r.To.String(),
			"Q", r.Sample.Queued, "q", r.Sample.Remaining, "processed", r.Sample.Processed, "X", math.Round(x*10)/10)
	}
}

// startLoadChecks starts the load loop if any group is checked at all.
func (s *Scheduler) startLoadChecks() error {
	intervals := make([]time.Duration, len(s.order))
	for i, g := range s.order {
		intervals[i] = g.def.LoadCheckInterval
	}
	sched, err := loadlevel.NewSchedule(intervals)
	if err != nil {
		return err
	}
	if sched.Tick() == 0 {
		return nil
	}
	s.log.Debug("load checks", "tick", sched.Tick())
	s.wg.Add(1)
	go s.loadLoop(sched)
	return nil
}
