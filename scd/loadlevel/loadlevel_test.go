package loadlevel

import (
	"math"
	"testing"
)

// smp is a Sample written in the documents' order: Q, processed, q.
func smp(queued, processed uint64, remaining int) Sample {
	return Sample{Queued: queued, Processed: processed, Remaining: remaining}
}

// Table 3-12, one row per cell; X = processed / (Q + q) x 100.
func TestNextTable312(t *testing.T) {
	cases := []struct {
		name string
		prev Level
		s    Sample
		want Level
	}{
		// LEVEL0
		{"L0 Q>=1 X<50 (X=49) -> L1", Level0, smp(90, 49, 10), Level1},
		{"L0 Q>=1 X<50 (X=0) -> L1", Level0, smp(1, 0, 0), Level1},
		{"L0 Q>=1 X<50 (X=33, processed=1 Q+q=3) -> L1", Level0, smp(2, 1, 1), Level1},
		{"L0 Q>=1 X=50 exactly (processed=1 Q+q=2) stays L0 (open cell)", Level0, smp(1, 1, 1), Level0},
		{"L0 Q>=1 X=50 exactly, q=0 stays L0 (open cell)", Level0, smp(2, 1, 0), Level0},
		{"L0 Q>=1 X=51 stays L0 (open cell)", Level0, smp(100, 51, 0), Level0},
		{"L0 Q>=1 X=100 stays L0 (open cell)", Level0, smp(5, 5, 0), Level0},
		{"L0 Q=0 q=0 stays L0 (open cell)", Level0, smp(0, 0, 0), Level0},
		{"L0 Q=0 q>=1 X=0 stays L0 (open cell)", Level0, smp(0, 0, 7), Level0},

		// LEVEL1
		{"L1 Q>=1 X=75 exactly (processed=3 Q+q=4) -> L0", Level1, smp(3, 3, 1), Level0},
		{"L1 Q>=1 X=100 -> L0", Level1, smp(4, 4, 0), Level0},
		{"L1 Q>=1 X>100 (backlog drained) -> L0", Level1, smp(1, 9, 0), Level0},
		{"L1 Q>=1 X=74 stays L1", Level1, smp(90, 74, 10), Level1},
		{"L1 Q>=1 X=50 exactly (processed=1 Q+q=2) stays L1", Level1, smp(1, 1, 1), Level1},
		{"L1 Q>=1 X=49 -> L2", Level1, smp(100, 49, 0), Level2},
		{"L1 Q>=1 X=0 -> L2", Level1, smp(3, 0, 3), Level2},
		{"L1 Q=0 q=0 -> L0 (open cell)", Level1, smp(0, 0, 0), Level0},
		{"L1 Q=0 q=0 processed>0 -> L0 (open cell)", Level1, smp(0, 4, 0), Level0},
		{"L1 Q=0 q>=1 stays L1 (open cell)", Level1, smp(0, 0, 1), Level1},
		{"L1 Q=0 q>=1 processed>0 stays L1 (open cell)", Level1, smp(0, 8, 5), Level1},

		// LEVEL2: only q counts.
		{"L2 q=0 -> L0", Level2, smp(0, 0, 0), Level0},
		{"L2 q=0, Q>=1 and X=0 ignored -> L0", Level2, smp(10, 0, 0), Level0},
		{"L2 q>=1 stays L2", Level2, smp(0, 0, 1), Level2},
		{"L2 q>=1, X=100 ignored, stays L2", Level2, smp(10, 11, 1), Level2},

		// Out of the table: a negative depth is an empty queue.
		{"L2 q<0 counts as q=0 -> L0", Level2, smp(0, 0, -3), Level0},
		{"L1 Q=0 q<0 counts as q=0 -> L0", Level1, smp(0, 0, -1), Level0},
		{"bad prev Level(7) is LEVEL2, q>=1 stays L2", Level(7), smp(1, 1, 1), Level2},
		{"bad prev Level(7) is LEVEL2, q=0 -> L0", Level(7), smp(1, 0, 0), Level0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Next(tc.prev, tc.s, nil); got != tc.want {
				t.Errorf("Next(%v, %+v, nil) = %v, want %v", tc.prev, tc.s, got, tc.want)
			}
		})
	}
}

// X is compared in integers: these counts are where a float64 rate, or a
// 64-bit product, would land on the wrong side of 50 or 75.
func TestNextRateIsExact(t *testing.T) {
	cases := []struct {
		name string
		prev Level
		s    Sample
		want Level
	}{
		// float64(2^61+1) == 2^61, so a float X would be exactly 50.
		{"X just under 50, float rounds to 50", Level0, smp(1<<61+1, 1<<60, 0), Level1},
		{"X just under 75, float rounds to 75", Level1, smp(1<<62+1, 3<<60, 0), Level1},
		// processed*100 overflows uint64.
		{"X=50 exactly, processed*100 > 2^64", Level1, smp(1<<63, 1<<62, 0), Level1},
		{"X=75 exactly, processed*100 > 2^64", Level1, smp(1<<62, 3<<60, 0), Level0},
		// Q+q overflows uint64: Q+q = 2^64, processed = 2^63.
		{"X=50 exactly, Q+q = 2^64", Level0, smp(math.MaxUint64, 1<<63, 1), Level0},
		{"X just under 50, Q+q = 2^64", Level0, smp(math.MaxUint64, 1<<63-1, 1), Level1},
		{"X=100, everything at the top", Level1, smp(math.MaxUint64, math.MaxUint64, 0), Level0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Next(tc.prev, tc.s, nil); got != tc.want {
				t.Errorf("Next(%v, %+v, nil) = %v, want %v", tc.prev, tc.s, got, tc.want)
			}
		})
	}
}

// Table 3-14, one row per cell and boundary, with U1,U2 = 5,10 and
// D0,D1 = 2,8. Q and processed are set so that Table 3-12 would say
// otherwise, to show they are ignored.
func TestNextTable314(t *testing.T) {
	th := &Thresholds{U1: 5, U2: 10, D0: 2, D1: 8}
	busy := func(q int) Sample { return smp(100, 0, q) }  // X = 0: 3-12 would raise
	quiet := func(q int) Sample { return smp(0, 100, q) } // Q = 0: 3-12 would hold
	cases := []struct {
		name string
		prev Level
		s    Sample
		want Level
	}{
		// from LEVEL0: q < U1 -> 0, U1 <= q < U2 -> 1, U2 <= q -> 2
		{"L0 q=0 stays L0", Level0, busy(0), Level0},
		{"L0 q=U1-1 stays L0", Level0, busy(4), Level0},
		{"L0 q=U1 -> L1", Level0, quiet(5), Level1},
		{"L0 q=U2-1 -> L1", Level0, quiet(9), Level1},
		{"L0 q=U2 -> L2", Level0, quiet(10), Level2},
		{"L0 q>U2 -> L2", Level0, quiet(1000), Level2},

		// from LEVEL1: q <= D0 -> 0, D0 < q < U2 -> 1, U2 <= q -> 2
		{"L1 q=0 -> L0", Level1, busy(0), Level0},
		{"L1 q=D0 -> L0", Level1, busy(2), Level0},
		{"L1 q=D0+1 stays L1", Level1, quiet(3), Level1},
		{"L1 q=U1-1 stays L1", Level1, quiet(4), Level1},
		{"L1 q=U2-1 stays L1", Level1, busy(9), Level1},
		{"L1 q=U2 -> L2", Level1, quiet(10), Level2},

		// from LEVEL2: q <= D0 -> 0, D0 < q <= D1 -> 1, D1 < q -> 2
		{"L2 q=0 -> L0", Level2, busy(0), Level0},
		{"L2 q=D0 -> L0", Level2, busy(2), Level0},
		{"L2 q=D0+1 -> L1", Level2, busy(3), Level1},
		{"L2 q=D1 -> L1", Level2, busy(8), Level1},
		{"L2 q=D1+1 stays L2", Level2, quiet(9), Level2},
		{"L2 q=U2 stays L2", Level2, quiet(10), Level2},

		{"L2 q<0 counts as q=0 -> L0", Level2, quiet(-1), Level0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Next(tc.prev, tc.s, th); got != tc.want {
				t.Errorf("Next(%v, %+v, %+v) = %v, want %v", tc.prev, tc.s, *th, got, tc.want)
			}
		})
	}
}

// The thresholds at the edges the parser allows: U1 = U2, D0 = D1, D0 = 0.
func TestNextTable314Degenerate(t *testing.T) {
	cases := []struct {
		name string
		th   Thresholds
		prev Level
		q    int
		want Level
	}{
		{"U1=U2: L0 q=U1-1 stays L0", Thresholds{U1: 4, U2: 4, D0: 1, D1: 3}, Level0, 3, Level0},
		{"U1=U2: L0 q=U1 jumps to L2", Thresholds{U1: 4, U2: 4, D0: 1, D1: 3}, Level0, 4, Level2},
		{"D0=D1: L2 q=D0 -> L0", Thresholds{U1: 4, U2: 6, D0: 2, D1: 2}, Level2, 2, Level0},
		{"D0=D1: L2 q=D0+1 stays L2", Thresholds{U1: 4, U2: 6, D0: 2, D1: 2}, Level2, 3, Level2},
		{"D0=0: L1 q=0 -> L0", Thresholds{U1: 1, U2: 2, D0: 0, D1: 1}, Level1, 0, Level0},
		{"D0=0: L1 q=1 stays L1", Thresholds{U1: 1, U2: 2, D0: 0, D1: 1}, Level1, 1, Level1},
		{"D0=0: L0 q=U1=1 -> L1", Thresholds{U1: 1, U2: 2, D0: 0, D1: 1}, Level0, 1, Level1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Next(tc.prev, smp(0, 0, tc.q), &tc.th); got != tc.want {
				t.Errorf("Next(%v, q=%d, %+v) = %v, want %v", tc.prev, tc.q, tc.th, got, tc.want)
			}
		})
	}
}

func TestProcessingRate(t *testing.T) {
	cases := []struct {
		name   string
		s      Sample
		want   float64
		wantOK bool
	}{
		{"Q+q=0 is undefined", smp(0, 5, 0), 0, false},
		{"negative q, Q=0 is undefined", smp(0, 0, -2), 0, false},
		{"processed=1 Q+q=2 is 50", smp(1, 1, 1), 50, true},
		{"processed=3 Q+q=4 is 75", smp(4, 3, 0), 75, true},
		{"only q", smp(0, 1, 4), 25, true},
		{"above 100 when a backlog drains", smp(2, 5, 0), 250, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			x, ok := tc.s.ProcessingRate()
			if x != tc.want || ok != tc.wantOK {
				t.Errorf("%+v.ProcessingRate() = %v, %v; want %v, %v", tc.s, x, ok, tc.want, tc.wantOK)
			}
		})
	}
}

func TestLevelString(t *testing.T) {
	for l, want := range map[Level]string{Level0: "LEVEL0", Level1: "LEVEL1", Level2: "LEVEL2", 3: "Level(3)"} {
		if got := l.String(); got != want {
			t.Errorf("Level(%d).String() = %q, want %q", uint8(l), got, want)
		}
	}
}

// step is one Sampler.Check and the Result it must give.
type step struct {
	name string
	now  Counters
	want Result
}

func runSampler(t *testing.T, m *Sampler, steps []step) {
	t.Helper()
	for _, st := range steps {
		got := m.Check(st.now)
		if got != st.want {
			t.Fatalf("%s: Check(%+v) = %+v, want %+v", st.name, st.now, got, st.want)
		}
		if m.Level() != st.want.To {
			t.Fatalf("%s: Level() = %v after Check, want %v", st.name, m.Level(), st.want.To)
		}
	}
}

func TestSamplerDeltas(t *testing.T) {
	// The group starts on a queue that has already seen traffic.
	m := NewSampler(Counters{Queued: 1000, Processed: 990, Depth: 10}, nil)
	if m.Level() != Level0 {
		t.Fatalf("new Sampler at %v, want LEVEL0", m.Level())
	}
	runSampler(t, m, []step{
		{"Q=10 processed=4 q=16: X=15 -> L1", Counters{1010, 994, 16},
			Result{Level0, Level1, smp(10, 4, 16)}},
		{"Q=20 processed=30 q=6: X=115 -> L0", Counters{1030, 1024, 6},
			Result{Level1, Level0, smp(20, 30, 6)}},
		{"Q=0 q=6: L0 holds", Counters{1030, 1024, 6},
			Result{Level0, Level0, smp(0, 0, 6)}},
		{"Q=5 processed=1 q=10: X=6 -> L1", Counters{1035, 1025, 10},
			Result{Level0, Level1, smp(5, 1, 10)}},
		{"Q=5 processed=2 q=13: X=11 -> L2", Counters{1040, 1027, 13},
			Result{Level1, Level2, smp(5, 2, 13)}},
		{"q=1 with X=100: L2 holds", Counters{1041, 1040, 1},
			Result{Level2, Level2, smp(1, 13, 1)}},
		{"q=0 -> L0", Counters{1041, 1041, 0},
			Result{Level2, Level0, smp(0, 1, 0)}},
	})
}

func TestSamplerCountersBackwards(t *testing.T) {
	m := NewSampler(Counters{Queued: 500, Processed: 500}, nil)
	runSampler(t, m, []step{
		{"Q=4 processed=1 q=3: X=14 -> L1", Counters{504, 501, 3},
			Result{Level0, Level1, smp(4, 1, 3)}},
		// The queue was recreated: both totals restart below the baseline.
		{"both totals went back: Q=0 processed=0, q=2 holds L1", Counters{3, 1, 2},
			Result{Level1, Level1, smp(0, 0, 2)}},
		// The lower values are the new baseline, not the old ones.
		{"after the reset deltas count from it: Q=4 processed=4 q=1 -> L0", Counters{7, 5, 1},
			Result{Level1, Level0, smp(4, 4, 1)}},
		{"only processed went back: Q=2 processed=0 -> L1", Counters{9, 0, 1},
			Result{Level0, Level1, smp(2, 0, 1)}},
		{"only queued went back: Q=0, q=0 -> L0", Counters{0, 2, 0},
			Result{Level1, Level0, smp(0, 2, 0)}},
		{"negative depth is q=0", Counters{0, 2, -4},
			Result{Level0, Level0, smp(0, 0, 0)}},
	})
}

func TestSamplerThresholds(t *testing.T) {
	th := Thresholds{U1: 5, U2: 10, D0: 2, D1: 8}
	m := NewSampler(Counters{}, &th)
	th.U1, th.U2 = 100, 200 // the Sampler keeps its own copy
	runSampler(t, m, []step{
		{"q=U1 -> L1 though X=100", Counters{5, 5, 5}, Result{Level0, Level1, smp(5, 5, 5)}},
		{"q=U2 -> L2", Counters{15, 10, 10}, Result{Level1, Level2, smp(10, 5, 10)}},
		{"q=D1 -> L1", Counters{15, 12, 8}, Result{Level2, Level1, smp(0, 2, 8)}},
		{"q=D0 -> L0", Counters{15, 18, 2}, Result{Level1, Level0, smp(0, 6, 2)}},
	})
}

func TestResultChanged(t *testing.T) {
	if (Result{From: Level1, To: Level1}).Changed() {
		t.Error("LEVEL1 -> LEVEL1 reported as a change")
	}
	if !(Result{From: Level1, To: Level2}).Changed() {
		t.Error("LEVEL1 -> LEVEL2 not reported as a change")
	}
}
