package wlm

import "time"

// NumBuckets is the number of buckets of a response-time distribution.
const NumBuckets = len(bucketLimits) + 1

// bucketLimits are the upper bounds of the distribution's buckets in
// percent of the goal's response time, as the workload activity reports
// show them; the last bucket holds what is beyond 400%.
var bucketLimits = [...]int{50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150, 200, 400}

// BucketLimit is the upper bound of bucket i in percent of the goal; 0 for
// the last bucket, which has none.
func BucketLimit(i int) int {
	if i < 0 || i >= len(bucketLimits) {
		return 0
	}
	return bucketLimits[i]
}

// BucketOf is the bucket of a response time rt against target: the first
// whose bound (a share of target) rt does not exceed, compared exactly.
func BucketOf(rt, target time.Duration) int {
	if target <= 0 {
		return NumBuckets - 1
	}
	for i, pct := range bucketLimits {
		// rt <= pct% of target, in integers: rt*100 <= pct*target. Both
		// products fit in 64 bits for times below 10^15 ns (11 days).
		if rt <= 0 || (rt < 1<<50 && int64(rt)*100 <= int64(pct)*int64(target)) {
			return i
		}
	}
	return NumBuckets - 1
}

// PIBeyond is the performance index of a percentile goal whose percentile
// is reached only in the last bucket, beyond 400% of the goal.
const PIBeyond = 5.0

// Sample is what the calls of one class did over some time: on one node,
// in one group or all, over one interval or more.
type Sample struct {
	Calls    uint64
	Response time.Duration // sum: arrival to answer
	Queue    time.Duration // sum: arrival to the start of service
	Service  time.Duration // sum: start of service to answer
	CPU      time.Duration // UAP CPU time charged to the calls
	Buckets  [NumBuckets]uint64
}

// Record adds one call that took resp from arrival to answer, queue of it
// before a process started on it, to the sample, bucketed against goal.
func (s *Sample) Record(resp, queue time.Duration, goal Goal) {
	queue = min(max(queue, 0), max(resp, 0))
	s.Calls++
	s.Response += resp
	s.Queue += queue
	s.Service += resp - queue
	s.Buckets[BucketOf(resp, goal.Target)]++
}

// Add adds o to s.
func (s *Sample) Add(o Sample) {
	s.Calls += o.Calls
	s.Response += o.Response
	s.Queue += o.Queue
	s.Service += o.Service
	s.CPU += o.CPU
	for i := range s.Buckets {
		s.Buckets[i] += o.Buckets[i]
	}
}

// Average is the average of a sum over the sample's calls; 0 without calls.
func (s *Sample) Average(sum time.Duration) time.Duration {
	if s.Calls == 0 {
		return 0
	}
	return sum / time.Duration(s.Calls)
}

// PI is the performance index of the calls of s against goal; false when
// there are none.
func PI(goal Goal, s Sample) (float64, bool) {
	if s.Calls == 0 || goal.Target <= 0 {
		return 0, false
	}
	if goal.Kind != GoalPercentile {
		return float64(s.Response) / float64(s.Calls) / float64(goal.Target), true
	}
	var cum uint64
	for i, c := range s.Buckets {
		cum += c
		// cum/Calls >= Percent/100, exactly.
		if cum*100 >= uint64(goal.Percent)*s.Calls {
			if i == NumBuckets-1 {
				return PIBeyond, true
			}
			return float64(bucketLimits[i]) / 100, true
		}
	}
	return PIBeyond, true // not reached: a sample whose buckets do not add up to Calls
}

// WithinGoal is the share (0..1) of the calls of s that answered within the
// goal's response time; false without calls.
func WithinGoal(s Sample) (float64, bool) {
	if s.Calls == 0 {
		return 0, false
	}
	var in uint64
	for i, c := range s.Buckets {
		if i < len(bucketLimits) && bucketLimits[i] <= 100 {
			in += c
		}
	}
	return float64(in) / float64(s.Calls), true
}

// Window holds the samples of the last intervals; its sum is what a
// performance index is judged on, so that one quiet or noisy interval
// does not decide alone.
type Window struct {
	samples []Sample
	next    int
}

// NewWindow returns a window of n intervals (at least 1).
func NewWindow(n int) *Window { return &Window{samples: make([]Sample, max(n, 1))} }

// Push adds the sample of the interval that ended, dropping the oldest.
func (w *Window) Push(s Sample) {
	w.samples[w.next] = s
	w.next++
	if w.next == len(w.samples) {
		w.next = 0
	}
}

// Sum is the samples of the window added up.
func (w *Window) Sum() Sample {
	var s Sample
	for _, x := range w.samples {
		s.Add(x)
	}
	return s
}

// Last is the sample of the interval pushed last.
func (w *Window) Last() Sample {
	return w.samples[(w.next+len(w.samples)-1)%len(w.samples)]
}
