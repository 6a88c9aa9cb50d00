package loadlevel

import (
	"fmt"
	"time"
)

// baseTick is the coarsest the tick can be: the documents take the greatest
// common divisor of 10 s and the intervals, so with only the default 30 s
// interval the node wakes every 10 s, not every 30 s.
const baseTick = 10 * time.Second

// Schedule says on which load-check ticks each group is checked. The tick is
// the greatest common divisor of 10 s and every loadcheck_interval that is
// not 0; a group with interval I is checked on every I/tick-th tick, and a
// group with interval 0 never.
type Schedule struct {
	tick  time.Duration
	every []uint64 // per group, in ticks; 0 = never checked
}

// NewSchedule builds the schedule of groups whose loadcheck_interval values
// are intervals, one per group; group i in Due is intervals[i]. An interval
// must be a whole number of seconds and not negative, as the definition
// parser guarantees.
func NewSchedule(intervals []time.Duration) (*Schedule, error) {
	secs := make([]uint64, len(intervals))
	tick, checked := uint64(baseTick/time.Second), false
	for i, d := range intervals {
		if d < 0 {
			return nil, fmt.Errorf("loadlevel: group %d: loadcheck_interval %v is negative (want 0..65535 s, 0 = no load check)", i, d)
		}
		if d%time.Second != 0 {
			return nil, fmt.Errorf("loadlevel: group %d: loadcheck_interval %v is not a whole number of seconds", i, d)
		}
		secs[i] = uint64(d / time.Second)
		if secs[i] != 0 {
			tick, checked = gcd(tick, secs[i]), true
		}
	}
	s := &Schedule{every: make([]uint64, len(intervals))}
	if !checked {
		return s, nil // no group is ever checked: no tick at all
	}
	s.tick = time.Duration(tick) * time.Second
	for i, n := range secs {
		s.every[i] = n / tick
	}
	return s, nil
}

func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// Tick is the load-check tick, or 0 when every group has interval 0 (or
// there is no group) and so nothing is ever checked.
func (s *Schedule) Tick() time.Duration { return s.tick }

// Every is how many ticks apart group is checked, 0 if never (interval 0,
// or no such group).
func (s *Schedule) Every(group int) uint64 {
	if group < 0 || group >= len(s.every) {
		return 0
	}
	return s.every[group]
}

// Due reports whether group is checked on tick, the ticks after start
// numbered from 1. Tick 0 is the start itself, when no group is checked:
// the first interval has not passed.
func (s *Schedule) Due(group int, tick uint64) bool {
	every := s.Every(group)
	return every != 0 && tick != 0 && tick%every == 0
}
