// Package loadlevel owns the load level of a service group (LEVEL0, LEVEL1,
// LEVEL2) and the load-check tick that decides when each group is checked,
// as the schedule service documents them (Tables 3-12 and 3-14).
//
// It is pure logic: no clock, no goroutines, no I/O, no metrics and no
// logging. The node reads the schedule queue's counters, runs the tick, and
// reports or acts on the levels this package returns; it must not import
// any other tpsched package, so it can be tested by tables alone.
//
// # The rules
//
// At each load check of a group, Q is the number of requests queued into the
// schedule queue during the load-check interval, q the number remaining in
// the queue when the load is checked, and X = processed / (Q + q) x 100 the
// server processing rate.
//
// Table 3-12 (the default) moves on Q, q and X:
//
//	previous  condition                   next
//	LEVEL0    Q >= 1 and X < 50           LEVEL1
//	LEVEL0    otherwise                   LEVEL0   (our choice: Q = 0, or X >= 50)
//	LEVEL1    Q >= 1 and 75 <= X          LEVEL0
//	LEVEL1    Q >= 1 and 50 <= X < 75     LEVEL1
//	LEVEL1    Q >= 1 and X < 50           LEVEL2
//	LEVEL1    Q = 0 and q = 0             LEVEL0   (our choice)
//	LEVEL1    Q = 0 and q >= 1            LEVEL1   (our choice)
//	LEVEL2    q = 0                       LEVEL0
//	LEVEL2    q >= 1                      LEVEL2
//
// X is compared exactly, in integers, so a rate of exactly 50 or 75 falls on
// the side the table says however large the counts are.
//
// Table 3-14 replaces it when the group defines levelup_queue_count = U1,U2
// and leveldown_queue_count = D0,D1; only q and the previous level count:
//
//	previous  next LEVEL0 when  next LEVEL1 when    next LEVEL2 when
//	LEVEL0    q < U1            U1 <= q < U2        U2 <= q
//	LEVEL1    q <= D0           D0 < q < U2         U2 <= q
//	LEVEL2    q <= D0           D0 < q <= D1        D1 < q
//
// # Usage
//
// At group start the node builds one Sampler per group from the queue's
// counters then, and one Schedule from every group's loadcheck_interval:
//
//	sched, err := loadlevel.NewSchedule(intervals) // one per group, same order
//	samplers[i] = loadlevel.NewSampler(loadlevel.Counters{Queued: st.Queued, Processed: st.Done, Depth: st.Depth}, th)
//
// If sched.Tick() is 0 no group is ever checked and no timer is needed.
// Otherwise, on the n-th tick after start (n = 1, 2, ...):
//
//	for i := range samplers {
//		if sched.Due(i, n) {
//			r := samplers[i].Check(countersNow(i))
//			if r.Changed() { /* loadlevel_message, metrics, ... */ }
//		}
//	}
package loadlevel

import (
	"fmt"
	"math/bits"
)

// Level is the load level of a service group.
type Level uint8

const (
	Level0 Level = iota // not loaded
	Level1              // loaded
	Level2              // overloaded
)

func (l Level) String() string {
	switch l {
	case Level0:
		return "LEVEL0"
	case Level1:
		return "LEVEL1"
	case Level2:
		return "LEVEL2"
	}
	return fmt.Sprintf("Level(%d)", uint8(l))
}

// Thresholds are a group's levelup_queue_count = U1,U2 and
// leveldown_queue_count = D0,D1, compared with the requests remaining in the
// queue (Table 3-14). The definition parser guarantees 0 <= D0 < U1 <= U2
// and D0 <= D1 < U2; other values give a level, never a panic, but not one
// the documents describe.
type Thresholds struct {
	U1, U2 int // remaining requests that raise the level to LEVEL1, LEVEL2
	D0, D1 int // remaining requests at or below which the level falls to LEVEL0, LEVEL1
}

// Sample is what one load check saw of a group.
type Sample struct {
	Queued    uint64 // Q: requests queued during the load-check interval
	Processed uint64 // requests processed during the interval
	Remaining int    // q: requests in the queue at the check; below 0 counts as 0
}

// ProcessingRate is X = Processed / (Queued + Remaining) x 100, for display.
// ok is false when Queued + Remaining is 0 and X is undefined. Next does not
// use it: a float64 can put a rate of exactly 50 or 75 on the wrong side.
func (s Sample) ProcessingRate() (x float64, ok bool) {
	q := s.remaining()
	if s.Queued == 0 && q == 0 {
		return 0, false
	}
	return float64(s.Processed) * 100 / (float64(s.Queued) + float64(q)), true
}

// remaining is q as an unsigned count, a negative depth counting as 0.
func (s Sample) remaining() uint64 {
	return uint64(max(s.Remaining, 0))
}

// rateAtLeast reports X >= pct, that is Processed*100 >= pct*(Queued+q),
// in 128-bit integers so that neither side can overflow.
func (s Sample) rateAtLeast(pct uint64) bool {
	lhsHi, lhsLo := bits.Mul64(s.Processed, 100)
	totalLo, totalHi := bits.Add64(s.Queued, s.remaining(), 0) // totalHi is 0 or 1
	rhsHi, rhsLo := bits.Mul64(pct, totalLo)
	rhsHi += pct * totalHi // cannot overflow: Mul64's high word is below pct
	if lhsHi != rhsHi {
		return lhsHi > rhsHi
	}
	return lhsLo >= rhsLo
}

// Next is the level a group moves to from prev after a check that saw s:
// by Table 3-14 when th is not nil, by Table 3-12 otherwise. A prev above
// Level2 is taken as Level2.
func Next(prev Level, s Sample, th *Thresholds) Level {
	prev = min(prev, Level2)
	if th != nil {
		return nextByThresholds(prev, s.Remaining, *th)
	}
	return nextByRate(prev, s)
}

// nextByRate is Table 3-12.
func nextByRate(prev Level, s Sample) Level {
	waiting := s.remaining() > 0
	switch prev {
	case Level0:
		if s.Queued >= 1 && !s.rateAtLeast(50) {
			return Level1
		}
		return Level0
	case Level1:
		switch {
		case s.Queued == 0 && waiting:
			return Level1
		case s.Queued == 0:
			return Level0
		case s.rateAtLeast(75):
			return Level0
		case s.rateAtLeast(50):
			return Level1
		default:
			return Level2
		}
	default: // Level2 waits for the queue to empty, whatever the rate.
		if waiting {
			return Level2
		}
		return Level0
	}
}

// nextByThresholds is Table 3-14.
func nextByThresholds(prev Level, q int, th Thresholds) Level {
	switch prev {
	case Level0:
		switch {
		case q >= th.U2:
			return Level2
		case q >= th.U1:
			return Level1
		default:
			return Level0
		}
	case Level1:
		switch {
		case q >= th.U2:
			return Level2
		case q > th.D0:
			return Level1
		default:
			return Level0
		}
	default:
		switch {
		case q > th.D1:
			return Level2
		case q > th.D0:
			return Level1
		default:
			return Level0
		}
	}
}

// Counters is one reading of a schedule queue's counters: the two
// ever-increasing totals and the depth now (shm.Stats Queued, Done and
// Depth, or the socket queue's equivalents).
type Counters struct {
	Queued    uint64 // requests ever queued
	Processed uint64 // requests ever processed
	Depth     int    // requests in the queue now
}

// Sampler keeps one group's load level between checks: it turns the queue's
// cumulative counters into the per-interval Sample of the tables. It is not
// safe for concurrent use; the node checks a group from one goroutine.
type Sampler struct {
	level         Level
	last          Counters
	th            Thresholds
	hasThresholds bool
}

// Result is what one check decided.
type Result struct {
	From, To Level  // the level before the check and after it
	Sample   Sample // what the check saw, which moved From to To
}

// Changed reports whether the check moved the level.
func (r Result) Changed() bool { return r.From != r.To }

// NewSampler starts a group at Level0 with start, the queue's counters when
// the group started, as the baseline of the first interval. th is nil for
// Table 3-12, or the group's thresholds for Table 3-14; it is copied.
func NewSampler(start Counters, th *Thresholds) *Sampler {
	m := &Sampler{last: start}
	if th != nil {
		m.th, m.hasThresholds = *th, true
	}
	return m
}

// Level is the group's load level after the last check.
func (m *Sampler) Level() Level { return m.level }

// Check takes the queue's counters now, measures the interval since the
// previous check (or since NewSampler) and moves the level. A total lower than
// at the previous check (a queue recreated, a counter reset) counts as
// nothing done in the interval, and the new value is the next baseline.
func (m *Sampler) Check(now Counters) Result {
	s := Sample{
		Queued:    since(m.last.Queued, now.Queued),
		Processed: since(m.last.Processed, now.Processed),
		Remaining: max(now.Depth, 0),
	}
	m.last = now
	var th *Thresholds
	if m.hasThresholds {
		th = &m.th
	}
	r := Result{From: m.level, To: Next(m.level, s, th), Sample: s}
	m.level = r.To
	return r
}

// since is the growth of a cumulative counter from prev to now, 0 if it
// went backwards.
func since(prev, now uint64) uint64 {
	if now < prev {
		return 0
	}
	return now - prev
}
