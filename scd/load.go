package scd

import (
	"math"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"

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

func (g *group) counters() loadlevel.Counters {
	st := g.stats()
	return loadlevel.Counters{Queued: st.Queued, Processed: st.Processed, Depth: st.Waiting}
}

func (g *group) thresholds() *loadlevel.Thresholds {
	if !g.def.LevelThresholds {
		return nil
	}
	return &loadlevel.Thresholds{U1: g.def.LevelUp[0], U2: g.def.LevelUp[1], D0: g.def.LevelDown[0], D1: g.def.LevelDown[1]}
}

// startLoad gives g its load meter, based on the queue's counters now, and
// its metrics.
func (n *Node) startLoad(g *group) {
	g.load.sampler = loadlevel.NewSampler(g.counters(), g.thresholds())
	lbl := `{group="` + g.name + `"}`
	g.load.changes = n.metrics.NewCounter(`tpsched_load_level_changes_total` + lbl)
	n.metrics.NewGauge(`tpsched_load_level`+lbl, func() float64 { return float64(g.level()) })
	n.metrics.NewGauge(`tpsched_load_queued_in_interval`+lbl, func() float64 {
		return float64(g.lastCheck().Sample.Queued)
	})
	n.metrics.NewGauge(`tpsched_load_remaining`+lbl, func() float64 {
		return float64(g.lastCheck().Sample.Remaining)
	})
	n.metrics.NewGauge(`tpsched_load_processing_ratio`+lbl, func() float64 {
		if x, ok := g.lastCheck().Sample.ProcessingRate(); ok {
			return x / 100
		}
		return math.NaN() // Q + q = 0: nothing was asked of the group
	})
}

func (g *group) lastCheck() loadlevel.Result {
	g.load.mu.Lock()
	defer g.load.mu.Unlock()
	return g.load.last
}

// level is the group's load level after the last check.
func (g *group) level() loadlevel.Level { return g.lastCheck().To }

func (g *group) loadStatus() LoadStatus {
	g.load.mu.Lock()
	r, at := g.load.last, g.load.at
	g.load.mu.Unlock()
	ls := LoadStatus{
		Level:     r.To.String(),
		Rule:      "rate",
		Interval:  g.def.LoadCheckInterval.Seconds(),
		Checked:   at,
		Queued:    r.Sample.Queued,
		Remaining: r.Sample.Remaining,
		Processed: r.Sample.Processed,
		Changes:   g.load.changes.Get(),
	}
	if th := g.thresholds(); th != nil {
		ls.Rule, ls.Thresholds = "thresholds", []int{th.U1, th.U2, th.D0, th.D1}
	}
	if x, ok := r.Sample.ProcessingRate(); ok {
		ls.Rate = &x
	}
	return ls
}

// loadLoop checks each group's load level on the load-check tick: the gcd
// of 10 s and every group's loadcheck_interval (see loadlevel.Schedule).
func (n *Node) loadLoop(sched *loadlevel.Schedule) {
	defer n.wg.Done()
	t := time.NewTicker(sched.Tick())
	defer t.Stop()
	for tick := uint64(1); ; tick++ {
		select {
		case <-n.stop:
			return
		case now := <-t.C:
			for i, g := range n.order {
				if sched.Due(i, tick) {
					n.checkLoad(g, now)
				}
			}
		}
	}
}

func (n *Node) checkLoad(g *group, now time.Time) {
	r := g.load.sampler.Check(g.counters())
	g.load.mu.Lock()
	g.load.last, g.load.at = r, now
	g.load.mu.Unlock()
	if !r.Changed() {
		return
	}
	g.load.changes.Inc()
	if n.cfg.Sched.AnnounceServerStatus {
		n.announce()
	}
	if g.def.LoadLevelMessage {
		x, _ := r.Sample.ProcessingRate()
		n.log.Info("load level changed", "group", g.name, "from", r.From.String(), "to", r.To.String(),
			"Q", r.Sample.Queued, "q", r.Sample.Remaining, "processed", r.Sample.Processed, "X", math.Round(x*10)/10)
	}
}

// startLoadChecks starts the load loop if any group is checked at all.
func (n *Node) startLoadChecks() error {
	intervals := make([]time.Duration, len(n.order))
	for i, g := range n.order {
		intervals[i] = g.def.LoadCheckInterval
	}
	sched, err := loadlevel.NewSchedule(intervals)
	if err != nil {
		return err
	}
	if sched.Tick() == 0 {
		return nil
	}
	n.log.Debug("load checks", "tick", sched.Tick())
	n.wg.Add(1)
	go n.loadLoop(sched)
	return nil
}
