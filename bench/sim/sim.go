// Package sim owns a discrete-event simulation of inter-node balancing with
// stale load levels: it tests the claim that "send to the least loaded"
// herds when the levels it sees are old, how OpenTP1's rules (the least
// loaded for a server's call, Table 3-7; LEVEL2 avoided for a
// scheduler-direct one) and tpsched's power of two choices fare, and how
// far each is from an oracle that sees every node's level as it is now.
// Routing is the real scd/route.Choose; levels are the real
// scd/loadlevel.Next over Table 3-14 thresholds. It runs up to 4,096
// nodes, beyond the 128 a tpsched cluster holds, to say where a full
// table of every node's level stops paying.
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
//     The oracle sees every level as it is now.
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
// It also counts each node's level changes: each is an announce every
// other node must receive, so a full table costs each node Nodes times
// that rate.
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
	"container/heap"
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

// MaxNodes is the most nodes a run simulates.
const MaxNodes = 4096

// Balancer is a named routing policy.
type Balancer struct {
	Name   string
	Policy route.Policy
	Direct bool // the requests are scheduler-direct (route.Request.Direct)
	Fresh  bool // the sender sees every node's level as it is now: Staleness does not apply
}

// Balancers are the policies compared: OpenTP1 with levels not announced
// (uniform random); OpenTP1 with levels for a server's call (the least
// loaded: random among the nodes at the lowest level seen, Table 3-7); P2C
// on (level, in-flight); P2C with levels not announced (in-flight only);
// OpenTP1 for a scheduler-direct call (schedule_rate 50: random among the
// nodes not at LEVEL2); and the oracle, OpenTP1's least-loaded rule over
// every node's level as it is now.
var Balancers = []Balancer{
	{Name: "random", Policy: route.Policy{Rule: route.OpenTP1, Announce: false, ScheduleRate: 50}},
	{Name: "opentp1", Policy: route.Policy{Rule: route.OpenTP1, Announce: true, ScheduleRate: 50}},
	{Name: "p2c", Policy: route.Policy{Rule: route.P2C, Announce: true, ScheduleRate: 50}},
	{Name: "p2c-inflight", Policy: route.Policy{Rule: route.P2C, Announce: false, ScheduleRate: 50}},
	{Name: "opentp1-direct", Policy: route.Policy{Rule: route.OpenTP1, Announce: true, ScheduleRate: 50}, Direct: true},
	{Name: "oracle", Policy: route.Policy{Rule: route.OpenTP1, Announce: true, ScheduleRate: 50}, Fresh: true},
}

// Config is one simulation run.
type Config struct {
	Nodes      int                  // 1..MaxNodes
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
	// LevelChanges is the level changes per node per time unit after
	// warm-up: the announces each node sends, and each other node must
	// receive, per time unit.
	LevelChanges float64
}

// job is a request in the system.
type job struct {
	arrived  float64
	service  float64
	sender   int32
	measured bool
}

// node is one FIFO server.
type node struct {
	queue []job // queue[head] is in service when busy
	head  int
	level loadlevel.Level
	since float64 // when the level last changed, for Level2Share
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

// change is node's level from time at on.
type change struct {
	at    float64
	node  int32
	level loadlevel.Level
}

// staleView is the levels senders see: every change, Staleness late. The
// changes are made in time order and each is seen the same time later, so
// a FIFO holds the ones not seen yet.
type staleView struct {
	staleness float64
	pending   []change // oldest first, from head
	head      int
	cands     []route.Candidate // Level is what senders see now
}

// made records a change made now.
func (v *staleView) made(c change) {
	if v.staleness == 0 {
		v.cands[c.node].Level = c.level
		return
	}
	v.pending = append(v.pending, c)
}

// advance makes every change made at or before now - staleness seen.
func (v *staleView) advance(now float64) {
	for v.head < len(v.pending) && v.pending[v.head].at+v.staleness <= now {
		c := v.pending[v.head]
		v.cands[c.node].Level = c.level
		v.head++
	}
	if v.head >= 1024 && v.head*2 >= len(v.pending) {
		v.pending = v.pending[:copy(v.pending, v.pending[v.head:])]
		v.head = 0
	}
}

// departure is when a node answers the request in service.
type departure struct {
	at   float64
	node int32
}

// departures is a min-heap by time; a node is in it while it is busy.
type departures []departure

func (d departures) Len() int           { return len(d) }
func (d departures) Less(i, j int) bool { return d[i].at < d[j].at }
func (d departures) Swap(i, j int)      { d[i], d[j] = d[j], d[i] }
func (d *departures) Push(x any)        { *d = append(*d, x.(departure)) }
func (d *departures) Pop() any {
	old := *d
	x := old[len(old)-1]
	*d = old[:len(old)-1]
	return x
}

// Validate reports the first thing wrong with c.
func (c Config) Validate() error {
	switch {
	case c.Nodes < 1 || c.Nodes > MaxNodes:
		return fmt.Errorf("sim: %d nodes (want 1..%d)", c.Nodes, MaxNodes)
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

		n        = c.Nodes
		nodes    = make([]node, n)
		busy     = make(departures, 0, n)
		inFlight = make([]int32, n*n) // inFlight[s*n+d]: sender s's requests at node d
		th       = c.Thresholds
		rate     = c.Load * float64(n)
		req      = route.Request{Direct: c.Balancer.Direct}
		// P2C's second key is the sender's in-flight count; the other
		// rules do not read it, so it is copied in only for P2C.
		withInFlight = c.Balancer.Policy.Rule == route.P2C
		staleness    = c.Staleness

		now         float64
		nextArrival = arrivals.ExpFloat64() / rate
		queued      int // requests routed so far
		answered    int // measured requests answered
		measuring   bool
		measureFrom float64
		levelTime   [3]float64
		changes     int // level changes after warm-up
		maxQueue    int
		responses   = make([]float64, 0, c.Requests)
	)
	if c.Balancer.Fresh {
		staleness = 0
	}
	view := &staleView{staleness: staleness, cands: make([]route.Candidate, n)}
	for i := range view.cands {
		view.cands[i].Node = strconv.Itoa(i)
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
			changes++
		}
		nd.level, nd.since = next, now
		view.made(change{at: now, node: int32(d), level: next})
	}
	// start puts node d's next request in service.
	start := func(d int) {
		nd := &nodes[d]
		heap.Push(&busy, departure{at: now + nd.queue[nd.head].service, node: int32(d)})
	}

	for answered < c.Requests {
		// The next event: the earliest departure, or the next arrival.
		if len(busy) > 0 && busy[0].at < nextArrival {
			dep := heap.Pop(&busy).(departure)
			now = dep.at
			view.advance(now)
			d := int(dep.node)
			nd := &nodes[d]
			j := nd.pop()
			inFlight[int(j.sender)*n+d]--
			if j.measured {
				responses = append(responses, now-j.arrived)
				answered++
			}
			if nd.len() > 0 {
				start(d)
			}
			relevel(d)
			continue
		}
		if math.IsInf(nextArrival, 1) {
			return Result{}, errUnanswered
		}
		now = nextArrival
		view.advance(now)

		// A request arrives at a sender, which routes it.
		if queued == c.Warmup && !measuring {
			measuring, measureFrom = true, now
		}
		sender := senders.IntN(n)
		cands := view.cands
		own := &cands[sender]
		seen := own.Level
		own.Local, own.Level = true, nodes[sender].level // a node knows its own level
		if withInFlight {
			row := inFlight[sender*n : sender*n+n]
			for i := range cands {
				cands[i].InFlight = int(row[i])
			}
		}
		dest := route.Choose(cands, c.Balancer.Policy, req, routing)
		own.Local, own.Level = false, seen
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
			start(dest)
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
		r.LevelChanges = float64(changes) / total // total is node-time
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
