package loadlevel

import (
	"reflect"
	"testing"
	"time"
)

// dueTicks lists the ticks 1..upTo on which group is due.
func dueTicks(s *Schedule, group int, upTo uint64) []uint64 {
	var out []uint64
	for n := uint64(1); n <= upTo; n++ {
		if s.Due(group, n) {
			out = append(out, n)
		}
	}
	return out
}

func TestSchedule(t *testing.T) {
	const s = time.Second
	cases := []struct {
		name      string
		intervals []time.Duration
		tick      time.Duration
		due       [][]uint64 // per group, the ticks 1..15 it is checked on
	}{
		{"documents' example: 3 s and 5 s -> 1 s tick", []time.Duration{3 * s, 5 * s}, s,
			[][]uint64{{3, 6, 9, 12, 15}, {5, 10, 15}}},
		{"default only: 30 s -> 10 s tick, every 3rd", []time.Duration{30 * s}, 10 * s,
			[][]uint64{{3, 6, 9, 12, 15}}},
		{"15 s -> 5 s tick, every 3rd", []time.Duration{15 * s}, 5 * s,
			[][]uint64{{3, 6, 9, 12, 15}}},
		{"10 s -> every tick", []time.Duration{10 * s}, 10 * s,
			[][]uint64{{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}}},
		{"4 s -> 2 s tick, every 2nd", []time.Duration{4 * s}, 2 * s,
			[][]uint64{{2, 4, 6, 8, 10, 12, 14}}},
		{"60 s -> 10 s tick, every 6th", []time.Duration{60 * s}, 10 * s,
			[][]uint64{{6, 12}}},
		{"default and 0: the 0 group is never due", []time.Duration{30 * s, 0}, 10 * s,
			[][]uint64{{3, 6, 9, 12, 15}, nil}},
		{"0 does not take part in the divisor", []time.Duration{0, 15 * s, 0}, 5 * s,
			[][]uint64{nil, {3, 6, 9, 12, 15}, nil}},
		{"25 s and 30 s -> 5 s tick", []time.Duration{25 * s, 30 * s}, 5 * s,
			[][]uint64{{5, 10, 15}, {6, 12}}},
		{"65535 s -> 5 s tick", []time.Duration{65535 * s}, 5 * s,
			[][]uint64{nil}},
		{"all 0: no tick, nothing due", []time.Duration{0, 0}, 0,
			[][]uint64{nil, nil}},
		{"no groups: no tick", nil, 0, [][]uint64{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sched, err := NewSchedule(tc.intervals)
			if err != nil {
				t.Fatalf("NewSchedule(%v): %v", tc.intervals, err)
			}
			if got := sched.Tick(); got != tc.tick {
				t.Errorf("Tick() = %v, want %v", got, tc.tick)
			}
			for g, want := range tc.due {
				if got := dueTicks(sched, g, 15); !reflect.DeepEqual(got, want) {
					t.Errorf("group %d (%v) due on ticks %v, want %v", g, tc.intervals[g], got, want)
				}
			}
		})
	}
}

func TestScheduleEvery(t *testing.T) {
	sched, err := NewSchedule([]time.Duration{3 * time.Second, 5 * time.Second, 0, 65535 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for g, want := range map[int]uint64{0: 3, 1: 5, 2: 0, 3: 65535, 4: 0, -1: 0} {
		if got := sched.Every(g); got != want {
			t.Errorf("Every(%d) = %d, want %d", g, got, want)
		}
	}
	if !sched.Due(3, 65535) || sched.Due(3, 65534) || !sched.Due(3, 2*65535) {
		t.Error("a 65535 s group at 1 s tick is not due exactly every 65535th tick")
	}
}

// Tick 0 is the start and a group that does not exist is never due.
func TestScheduleDueOutOfRange(t *testing.T) {
	sched, err := NewSchedule([]time.Duration{10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		group int
		tick  uint64
		want  bool
	}{
		{"first tick", 0, 1, true},
		{"tick 0 is the start, not a check", 0, 0, false},
		{"group past the end", 1, 1, false},
		{"negative group", -1, 1, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := sched.Due(tc.group, tc.tick); got != tc.want {
				t.Errorf("Due(%d, %d) = %v, want %v", tc.group, tc.tick, got, tc.want)
			}
		})
	}
}

func TestScheduleRejectsIntervals(t *testing.T) {
	cases := []struct {
		name      string
		intervals []time.Duration
		want      string
	}{
		{"fraction of a second", []time.Duration{30 * time.Second, 1500 * time.Millisecond},
			"loadlevel: group 1: loadcheck_interval 1.5s is not a whole number of seconds"},
		{"negative", []time.Duration{-time.Second},
			"loadlevel: group 0: loadcheck_interval -1s is negative (want 0..65535 s, 0 = no load check)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sched, err := NewSchedule(tc.intervals)
			if err == nil || err.Error() != tc.want {
				t.Fatalf("NewSchedule(%v) = %v, %v; want error %q", tc.intervals, sched, err, tc.want)
			}
		})
	}
}
