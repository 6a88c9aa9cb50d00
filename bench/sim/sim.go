// Package sim owns a discrete-event simulation of inter-node balancing with
// stale load levels: it tests the claim that "send to the least loaded"
// herds when the levels it sees are old, that OpenTP1's rule (random, LEVEL2
// avoided) survives it, and that tpsched's power of two choices does better.
// Routing is the real scd/route.Choose; levels are the real
// scd/loadlevel.Next over Table 3-14 thresholds.
//
// It must not touch the network, the clock or the node: it is a model, run
// in virtual time from a seed, and every run is reproducible.
//
// # The model
//
//   - Nodes identical FIFO servers, one request at a time, service times
//     exponential with mean 1 (the unit of time and of every figure).
//   - Requests arrive as a Poisson stream at Load x Nodes per unit of time,
//     each at a sender node drawn uniformly.
//   - The sender routes with route.Choose over every node (itself Local).
//     Each candidate's Level is that node's level as it was Staleness time
//     units ago; the sender's own level is current (a node knows itself).
//     InFlight is the sender's own requests outstanding at the node now,
//     which needs no announce and is never stale. The chosen node queues
//     the request; there is no network delay and no transfer on arrival.
//   - A node's level moves by loadlevel.Next with Table 3-14 thresholds on
//     q, the requests waiting behind the one in service, re-evaluated at
//     every arrival and departure: the announce is instantaneous but seen
//     Staleness late.
//   - Service times, arrival times and senders come from streams of their
//     own, so every balancer sees the same work (common random numbers) and
//     only the routing draws differ.
//
// A run queues Warmup requests unmeasured, then measures the response time
// (queueing + service) of the next Requests requests; arrivals go on until
// every measured request is answered, so the last ones see the same load.
//
// # Usage
//
//	r, err := sim.Run(sim.Config{Nodes: 16, Load: 0.9, Staleness: 10,
//		Thresholds: sim.DefaultThresholds, Balancer: sim.Balancers[2],
//		Requests: 2_000_000, Warmup: 200_000, Seed: 1})
//	fmt.Println(r.P99)
//
// Sweep runs a grid of configurations on several goroutines, and
// WriteMarkdown prints the results; cmd/tpsim is the command around them.
package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"

	"tpsched/scd/loadlevel"
	"tpsched/scd/route"
)

// DefaultThresholds are levelup_queue_count = 4,8 and leveldown_queue_count
// = 2,6: LEVEL1 from 4 waiting requests (about 4 service times of wait),
// LEVEL2 from 8, down to LEVEL1 at 6 and LEVEL0 at 2, so a level does not
// flap on every arrival. At load 0.9 an M/M/1 node has q >= 8 about 39% of
// the time: LEVEL2 is common, which is where avoiding it matters.
var DefaultThresholds = loadlevel.Thresholds{U1: 4, U2: 8, D0: 2, D1: 6}

// Balancer is a named routing policy.
type Balancer struct {
	Name   string
	Policy route.Policy
}

// Balancers are the policies compared: OpenTP1 with levels not announced
// (uniform random), OpenTP1 with levels (random, LEVEL2 avoided), P2C on
// (level, in-flight), and P2C with levels not announced (in-flight only).
var Balancers = []Balancer{
	{"random", route.Policy{Rule: route.OpenTP1, Announce: false, ScheduleRate: 50}},
	{"opentp1", route.Policy{Rule: route.OpenTP1, Announce: true, ScheduleRate: 50}},
	{"p2c", route.Policy{Rule: route.P2C, Announce: true, ScheduleRate: 50}},
	{"p2c-inflight", route.Policy{Rule: route.P2C, Announce: false, ScheduleRate: 50}},
}

// Config is one simulation run.
type Config struct {
	Nodes      int                  // 1..route.MaxNodes
	Load       float64              // offered load per node, 0 < Load < 1
	Staleness  float64              // age in time units of the levels a sender sees, >= 0
	Thresholds loadlevel.Thresholds // Table 3-14's U1,U2,D0,D1
	Balancer   Balancer
	Requests   int    // measured requests, >= 1
	Warmup     int    // unmeasured requests before them, >= 0
	Seed       uint64 // the same seed gives the same run
}

// Result is what a run measured; times are in mean service times.
type Result struct {
	Config
	Mean, P50, P99, P999 float64 // response time (queueing + service)
	MaxQueue             int     // most requests at one node (waiting and in service) after warm-up
	Level2Share          float64 // fraction of node-time spent at LEVEL2 after warm-up
}

// job is a request in the system.
type job struct {
	arrived  float64
	service  float64
	sender   int32
	measured bool
}

// change is a node's level from time at on.
type change struct {
	at    float64
	level loadlevel.Level
}

// node is one FIFO server and the history of its level.
type node struct {
	queue   []job // queue[head] is in service when busy
	head    int
	level   loadlevel.Level
	history []change // the level's changes, oldest first; history[seen] is the one a sender sees now
	seen    int
	since   float64 // when the level last changed, for Level2Share
}

// len is the requests at the node, the one in service included.
func (n *node) len() int { return len(n.queue) - n.head }

// push queues j.
func (n *node) push(j job) { n.queue = append(n.queue, j) }

// pop takes the request in service off the queue, reusing the slice's
// front when it has grown long.
func (n *node) pop() job {
	j := n.queue[n.head]
	n.head++
	if n.head == len(n.queue) {
		n.queue, n.head = n.queue[:0], 0
	} else if n.head >= 1024 && n.head*2 >= len(n.queue) {
		n.queue = n.queue[:copy(n.queue, n.queue[n.head:])]
		n.head = 0
	}
	return j
}

// levelAt is the level the node had at time t. Calls must come with t not
// decreasing: the history before t is dropped.
func (n *node) levelAt(t float64) loadlevel.Level {
	for n.seen+1 < len(n.history) && n.history[n.seen+1].at <= t {
		n.seen++
	}
	if n.seen >= 1024 && n.seen*2 >= len(n.history) {
		n.history = n.history[:copy(n.history, n.history[n.seen:])]
		n.seen = 0
	}
	return n.history[n.seen].level
}

// Validate reports the first thing wrong with c.
func (c Config) Validate() error {
	switch {
	case c.Nodes < 1 || c.Nodes > route.MaxNodes:
		return fmt.Errorf("sim: %d nodes (want 1..%d)", c.Nodes, route.MaxNodes)
	case !(c.Load > 0 && c.Load < 1):
		return fmt.Errorf("sim: load %v (want 0 < load < 1: at 1 or more the queues grow without end)", c.Load)
	case !(c.Staleness >= 0) || math.IsInf(c.Staleness, 1):
		return fmt.Errorf("sim: staleness %v (want a finite value >= 0)", c.Staleness)
	case c.Requests < 1 || c.Warmup < 0:
		return fmt.Errorf("sim: %d requests after %d warm-up (want >= 1 and >= 0)", c.Requests, c.Warmup)
	case c.Thresholds.U1 < 1 || c.Thresholds.D0 >= c.Thresholds.U1 || c.Thresholds.U1 > c.Thresholds.U2 ||
		c.Thresholds.D0 > c.Thresholds.D1 || c.Thresholds.D1 >= c.Thresholds.U2 || c.Thresholds.D0 < 0:
		return fmt.Errorf("sim: thresholds %+v (want 0 <= D0 < U1 <= U2, D0 <= D1 < U2, U1 >= 1)", c.Thresholds)
	}
	return nil
}

// errUnanswered would mean a bug: the event loop ran dry with measured
// requests outstanding.
var errUnanswered = errors.New("sim: measured requests left unanswered")

// Run simulates c.
func Run(c Config) (Result, error) {
	if err := c.Validate(); err != nil {
		return Result{}, err
	}
	var (
		arrivals = rand.New(rand.NewPCG(c.Seed, 1))
		services = rand.New(rand.NewPCG(c.Seed, 2))
		senders  = rand.New(rand.NewPCG(c.Seed, 3))
		routing  = rand.New(rand.NewPCG(c.Seed, 4))

		n         = c.Nodes
		nodes     = make([]node, n)
		departure = make([]float64, n) // when the request in service leaves; +Inf when idle
		inFlight  = make([]int, n*n)   // inFlight[s*n+d]: sender s's requests at node d
		cands     = make([]route.Candidate, n)
		th        = c.Thresholds
		rate      = c.Load * float64(n)

		now         float64
		nextArrival = arrivals.ExpFloat64() / rate
		queued      int // requests routed so far
		answered    int // measured requests answered
		measuring   bool
		measureFrom float64
		levelTime   [3]float64
		maxQueue    int
		responses   = make([]float64, 0, c.Requests)
	)
	for i := range nodes {
		nodes[i].history = []change{{at: math.Inf(-1), level: loadlevel.Level0}}
		departure[i] = math.Inf(1)
		cands[i].Node = strconv.Itoa(i)
	}

	// relevel moves node d's level after its queue changed.
	relevel := func(d int) {
		nd := &nodes[d]
		next := loadlevel.Next(nd.level, loadlevel.Sample{Remaining: max(nd.len()-1, 0)}, &th)
		if next == nd.level {
			return
		}
		if measuring {
			levelTime[nd.level] += now - max(nd.since, measureFrom)
		}
		nd.level, nd.since = next, now
		nd.history = append(nd.history, change{at: now, level: next})
	}

	for answered < c.Requests {
		// The next event: the earliest departure, or the next arrival.
		d := -1
		at := nextArrival
		for i, t := range departure {
			if t < at {
				d, at = i, t
			}
		}
		if math.IsInf(at, 1) {
			return Result{}, errUnanswered
		}
		now = at

		if d >= 0 { // node d answers the request in service
			nd := &nodes[d]
			j := nd.pop()
			inFlight[int(j.sender)*n+d]--
			if j.measured {
				responses = append(responses, now-j.arrived)
				answered++
			}
			if nd.len() > 0 {
				departure[d] = now + nd.queue[nd.head].service
			} else {
				departure[d] = math.Inf(1)
			}
			relevel(d)
			continue
		}

		// A request arrives at a sender, which routes it.
		if queued == c.Warmup && !measuring {
			measuring, measureFrom = true, now
		}
		sender := senders.IntN(n)
		seenAt := now - c.Staleness
		for i := range cands {
			if i == sender {
				cands[i].Local, cands[i].Level = true, nodes[i].level
			} else {
				cands[i].Local, cands[i].Level = false, nodes[i].levelAt(seenAt)
			}
			cands[i].InFlight = inFlight[sender*n+i]
		}
		dest := route.Choose(cands, c.Balancer.Policy, route.Request{}, routing)
		nd := &nodes[dest]
		nd.push(job{
			arrived:  now,
			service:  services.ExpFloat64(),
			sender:   int32(sender),
			measured: queued >= c.Warmup && queued < c.Warmup+c.Requests,
		})
		queued++
		inFlight[sender*n+dest]++
		if nd.len() == 1 {
			departure[dest] = now + nd.queue[nd.head].service
		}
		if measuring {
			maxQueue = max(maxQueue, nd.len())
		}
		relevel(dest)
		nextArrival = now + arrivals.ExpFloat64()/rate
	}

	for i := range nodes {
		levelTime[nodes[i].level] += now - max(nodes[i].since, measureFrom)
	}
	total := levelTime[0] + levelTime[1] + levelTime[2]
	slices.Sort(responses)
	r := Result{
		Config:   c,
		Mean:     mean(responses),
		P50:      quantile(responses, 0.50),
		P99:      quantile(responses, 0.99),
		P999:     quantile(responses, 0.999),
		MaxQueue: maxQueue,
	}
	if total > 0 {
		r.Level2Share = levelTime[2] / total
	}
	return r, nil
}

// quantile is the nearest-rank q-quantile of sorted, which is not empty.
func quantile(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func mean(xs []float64) float64 {
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}
