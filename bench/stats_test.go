package bench

import (
	"testing"
	"time"
)

func TestPercentileNearestRank(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 1000; i++ {
		d = append(d, time.Duration(i)*time.Microsecond)
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{
		{50, 500 * time.Microsecond},
		{90, 900 * time.Microsecond},
		{99, 990 * time.Microsecond},
		{99.9, 999 * time.Microsecond},
		{100, 1000 * time.Microsecond},
		{0.01, 1 * time.Microsecond},
	} {
		if got := percentile(d, tc.p); got != tc.want {
			t.Errorf("p%v = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := percentile(nil, 50); got != 0 {
		t.Errorf("empty: %v", got)
	}
	if got := percentile([]time.Duration{7}, 99.9); got != 7 {
		t.Errorf("one value: %v", got)
	}
	// Three values: p50 is the second, p99 the third.
	three := []time.Duration{1, 2, 3}
	if percentile(three, 50) != 2 || percentile(three, 99) != 3 {
		t.Errorf("three values: p50 %v p99 %v", percentile(three, 50), percentile(three, 99))
	}
}

func TestSummarizeSortsAndAverages(t *testing.T) {
	l := summarize([]time.Duration{30, 10, 20, 40})
	if l.N != 4 || l.Mean != 25 || l.P50 != 20 || l.Max != 40 || l.P99 != 40 {
		t.Errorf("got %+v", l)
	}
	if (summarize(nil) != latency{}) {
		t.Error("empty summary not zero")
	}
}

func TestCDFIsMonotonicAndEndsAtMax(t *testing.T) {
	var d []time.Duration
	for i := range 100000 {
		d = append(d, time.Duration(i%997)*time.Microsecond)
	}
	l := summarize(d)
	c := cdfOf(d, 50)
	if len(c) < 10 {
		t.Fatalf("%d points", len(c))
	}
	for i := 1; i < len(c); i++ {
		if c[i].Q <= c[i-1].Q || c[i].Us < c[i-1].Us {
			t.Fatalf("not monotonic at %d: %+v then %+v", i, c[i-1], c[i])
		}
	}
	if last := c[len(c)-1]; last.Q != 1 || last.Us != us(l.Max) {
		t.Errorf("last point %+v, want q=1 at %v", last, l.Max)
	}
	// The tail is drawn finely: there are points beyond p99.9.
	n := 0
	for _, p := range c {
		if p.Q > 0.999 {
			n++
		}
	}
	if n < 5 {
		t.Errorf("only %d points beyond p99.9", n)
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		v    []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		orig := append([]float64(nil), tc.v...)
		if got := median(tc.v); got != tc.want {
			t.Errorf("Median(%v) = %v, want %v", tc.v, got, tc.want)
		}
		for i := range orig {
			if orig[i] != tc.v[i] {
				t.Errorf("Median changed its input")
			}
		}
	}
}
