package bench

import (
	"math"
	"slices"
	"time"
)

// latency summarises a set of latencies.
type latency struct {
	N    int
	Mean time.Duration
	P50  time.Duration
	P90  time.Duration
	P99  time.Duration
	P999 time.Duration
	Max  time.Duration
}

// summarize sorts lat in place and returns its percentiles.
func summarize(lat []time.Duration) latency {
	if len(lat) == 0 {
		return latency{}
	}
	slices.Sort(lat)
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	return latency{
		N:    len(lat),
		Mean: sum / time.Duration(len(lat)),
		P50:  percentile(lat, 50),
		P90:  percentile(lat, 90),
		P99:  percentile(lat, 99),
		P999: percentile(lat, 99.9),
		Max:  lat[len(lat)-1],
	}
}

// percentile returns the p-th percentile (0 < p <= 100) of sorted by the
// nearest-rank method: the smallest value with at least p% of the values at
// or below it. It returns 0 for an empty slice.
func percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	// The epsilon keeps 99.9% of 1000 at rank 999 despite rounding.
	rank := int(math.Ceil(p/100*float64(n) - 1e-9))
	rank = min(max(rank, 1), n)
	return sorted[rank-1]
}

// cdfPoint is one point of a latency distribution: the fraction of calls
// (Q) answered within Us microseconds.
type cdfPoint struct {
	Q  float64 `json:"q"`
	Us float64 `json:"us"`
}

// cdfOf returns up to about points quantiles of sorted, spaced evenly in
// log(1/(1-q)) so the tail (p99, p99.9, p99.99) is drawn as finely as the body.
func cdfOf(sorted []time.Duration, points int) []cdfPoint {
	n := len(sorted)
	if n == 0 || points < 2 {
		return nil
	}
	// q runs from 0.01 to 1 - 1/n; beyond that there is one sample per step.
	maxNines := math.Log10(float64(n))
	out := make([]cdfPoint, 0, points+1)
	for i := range points {
		nines := maxNines * float64(i) / float64(points-1)
		q := 1 - math.Pow(10, -nines)
		q = max(q, 0.01)
		d := percentile(sorted, q*100)
		if len(out) > 0 && out[len(out)-1].Q == q {
			continue
		}
		out = append(out, cdfPoint{Q: q, Us: us(d)})
	}
	out = append(out, cdfPoint{Q: 1, Us: us(sorted[n-1])})
	return out
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// median returns the median of v (the mean of the middle two for an even
// count) without changing v. It returns 0 for an empty slice.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
