// Package route owns the choice of the node a request is sent to: the
// scd_announce_server_status x scd_this_node_first matrix of Table 3-7,
// schedule_rate weighting for scheduler-direct requests, LEVEL1 avoidance on
// a re-schedule, the transfer of a request that arrived already balanced,
// the number of retries after a communication error, and tpsched's own
// power-of-two-choices rule (scd_balance_rule = p2c).
//
// It is pure logic: no I/O, no clock, no goroutines, no logging, and no
// randomness of its own (the caller passes a Rand). It does not know where
// the candidates come from: the caller reads the name-information table,
// removes the nodes whose group is held and the nodes already tried, and
// hands the rest over as Candidates. Choose allocates nothing.
//
// # The OpenTP1 rule (scd_balance_rule = opentp1, the default)
//
// Levels are those each node announces; a node that announces nothing is
// LEVEL0. With scd_announce_server_status = Y the levels are used:
//
//	request      eligible candidates                  draw
//	normal       this_node_first N: the lowest level present (Table 3-7:
//	             "the node of the least-loaded schedulable server")
//	             this_node_first Y: LEVEL0, LEVEL1    uniform
//	             (all if all LEVEL2)
//	re-schedule  the lowest level present             uniform
//	direct       LEVEL0, LEVEL1 (all if all LEVEL2)   LEVEL0 weighs schedule_rate, LEVEL1 100 - schedule_rate
//
// A direct request is a scheduler-direct one: a call of a client with
// dcscddirect = Y, the only kind the documents give schedule_rate for
// (000). Every other request is normal: a call a UAP makes (a server's
// request), a call of a client without dcscddirect = Y, a call that came
// balanced and must move on (Transfer). schedule_rate 80 with three LEVEL0
// and two LEVEL1 nodes weighs the sets 240:40, about 85.7:14.3. With
// scd_announce_server_status = N every candidate is eligible and the draw
// is uniform. A socket-receiving group is never status-checked: uniform
// among all.
//
// scd_this_node_first = Y sends to this node when it is a candidate and
// eligible and not LEVEL2 (a node knows its own level even when levels are
// not announced; a socket-receiving group takes this node whatever its
// level). Otherwise the choice is made, by the rows above, among the other
// candidates only.
//
// # The P2C rule (scd_balance_rule = p2c, tpsched's own)
//
// "Send to the least loaded" herds when levels are stale: every sender sees
// the same node as the lowest and sends there until the next announce. P2C
// keeps random sampling as the first step so that no node can attract every
// sender at once:
//
//  1. Draw two distinct candidates, each with probability proportional to
//     its weight (without replacement). The weight is 1; a direct request
//     with levels announced weighs LEVEL0 schedule_rate, LEVEL1
//     100 - schedule_rate and LEVEL2 1 (never below 1, so every candidate
//     can be drawn); with scd_this_node_first = Y this node's weight is
//     multiplied by the number of candidates.
//  2. Send to the one with the lower (level, in-flight) pair, compared
//     lexicographically; in-flight is what this sender has outstanding at
//     the node now, which is never stale. With levels not announced, and
//     for socket-receiving groups, only in-flight counts.
//  3. A tie goes to this node if it is one of the two, else to the first
//     drawn.
//
// A single candidate is chosen without a draw. A re-schedule is the same
// rule over the candidates left.
//
// bench/sim measures the rules with stale levels (16 nodes, load 0.9, p99
// in service times): with levels 10 service times old, random 44, OpenTP1
// 27, P2C 20; with levels 100 old OpenTP1 herds (788) and so does P2C's
// level key, less (68), while P2C without levels (Announce false, in-flight
// only, 16) does not notice: the sender's own counts are never stale.
//
// # Transfer and retry
//
// A request that arrived from a balancing client or another node is not
// balanced again: Transfer says it leaves this node only when the local
// group is held, or (levels announced) is LEVEL2 while some other node is
// lower. Retries bounds scd_retry_of_comm_error by the other nodes that run
// the group.
//
// # Usage
//
//	p := route.Policy{Rule: rule, Announce: sc.AnnounceServerStatus,
//		ThisNodeFirst: sc.ThisNodeFirst, ScheduleRate: sc.ScheduleRate}
//	cands = cands[:0] // reused: one Candidate per node running the group, held and tried ones left out
//	...
//	i := route.Choose(cands, p, route.Request{Direct: direct, Retry: tries > 0}, rnd)
//	if i < 0 { /* no node: service closed */ }
//	send(cands[i].Node)
package route

import (
	"fmt"

	"tpsched/scd/loadlevel"
)

// MaxNodes is the most nodes OpenTP1 balances over (all_node holds at most
// 128). Choose works with more; the name table enforces the limit.
const MaxNodes = 128

// Candidate is a node that runs the requested group and may be sent to.
type Candidate struct {
	Node     string          // node id
	Local    bool            // this node
	Level    loadlevel.Level // as announced (LEVEL0 when the node announces nothing)
	InFlight int             // requests this sender has in flight to the node now (P2C's second key)
}

// Rule is the balancing rule, scd_balance_rule.
type Rule uint8

const (
	OpenTP1 Rule = iota // random, LEVEL2 avoided (Table 3-7)
	P2C                 // power of two choices on (level, in-flight)
)

func (r Rule) String() string {
	switch r {
	case OpenTP1:
		return "opentp1"
	case P2C:
		return "p2c"
	}
	return fmt.Sprintf("Rule(%d)", uint8(r))
}

// ParseRule reads a scd_balance_rule value: "opentp1" or "p2c".
func ParseRule(s string) (Rule, error) {
	switch s {
	case "opentp1":
		return OpenTP1, nil
	case "p2c":
		return P2C, nil
	}
	return 0, fmt.Errorf("route: unknown balance rule %q (want opentp1 or p2c)", s)
}

// Policy is the schedule service definition as far as routing goes.
type Policy struct {
	Rule          Rule
	Announce      bool // scd_announce_server_status=Y: levels are known and used; N: levels ignored, random
	ThisNodeFirst bool // scd_this_node_first
	ScheduleRate  int  // schedule_rate 50..100 (used for Direct requests); values outside are clamped
}

// Request is what the caller knows about the request being routed.
type Request struct {
	Direct bool // scheduler-direct request (dcscddirect client): schedule_rate weighting applies
	Retry  bool // re-schedule after an error: LEVEL1 avoided too unless only LEVEL1/2 remain
	Socket bool // socket-receiving group: random, no status check
}

// Rand is the randomness Choose draws from. *math/rand/v2.Rand satisfies
// it; IntN is only ever called with n >= 1.
type Rand interface{ IntN(n int) int }

// Choose returns the index in cands of the node to send to, or -1 if cands
// is empty. The caller has already removed held nodes and nodes already
// tried. Choose does not modify cands and allocates nothing.
func Choose(cands []Candidate, p Policy, r Request, rnd Rand) int {
	switch len(cands) {
	case 0:
		return -1
	case 1:
		return 0
	}
	if p.Rule == P2C {
		return chooseP2C(cands, p, r, rnd)
	}
	return chooseOpenTP1(cands, p, r, rnd)
}

// noSkip is the skip argument that leaves every candidate in.
const noSkip = -1

// chooseOpenTP1 is Table 3-7 with schedule_rate and re-schedule avoidance.
func chooseOpenTP1(cands []Candidate, p Policy, r Request, rnd Rand) int {
	local := localIndex(cands)
	if r.Socket {
		if p.ThisNodeFirst && local >= 0 {
			return local
		}
		return pickUniform(cands, noSkip, rnd)
	}
	if p.ThisNodeFirst && local >= 0 {
		own := level(cands[local])
		if own != loadlevel.Level2 && (!p.Announce || own <= tally(cands, noSkip).ceiling(r.Retry)) {
			return local
		}
		// This node is LEVEL2 or not eligible: choose among the others only.
		return pickOpenTP1(cands, local, p, r, r.Retry, rnd)
	}
	// Table 3-7, announce Y and this_node_first N: the least-loaded node,
	// unless schedule_rate weighs LEVEL0 against LEVEL1 (direct). The
	// this_node_first Y cell keeps LEVEL0 and LEVEL1 alike.
	return pickOpenTP1(cands, noSkip, p, r, r.Retry || (!p.ThisNodeFirst && !r.Direct), rnd)
}

// pickOpenTP1 draws among cands except skip: uniform without levels, else
// among the eligible ones (with lowest, only those at the lowest level
// present), weighted by schedule_rate for a direct request.
func pickOpenTP1(cands []Candidate, skip int, p Policy, r Request, lowest bool, rnd Rand) int {
	if !p.Announce {
		return pickUniform(cands, skip, rnd)
	}
	n := tally(cands, skip)
	top := n.ceiling(lowest)
	// weight[l] is what a candidate at level l weighs in the draw.
	weight := [3]int{1, 1, 1}
	if r.Direct && top != loadlevel.Level2 {
		rate := p.rate()
		weight = [3]int{rate, 100 - rate, 0}
		if n[0] == 0 {
			weight[1] = 1 // only LEVEL1 is eligible (and weighs 0 at rate 100): uniform over it
		}
	}
	total := 0
	for l := range top + 1 {
		total += n[l] * weight[l]
	}
	x := rnd.IntN(total)
	for i := range cands {
		if l := level(cands[i]); i != skip && l <= top {
			if x -= weight[l]; x < 0 {
				return i
			}
		}
	}
	return -1 // unreachable: x < total
}

// levels counts candidates by level.
type levels [3]int

// tally counts cands except skip by level.
func tally(cands []Candidate, skip int) levels {
	var n levels
	for i := range cands {
		if i != skip {
			n[level(cands[i])]++
		}
	}
	return n
}

// ceiling is the highest eligible level: LEVEL1 unless every candidate is
// LEVEL2; with lowest (a re-schedule, or the least-loaded rule) the lowest
// level present.
func (n levels) ceiling(lowest bool) loadlevel.Level {
	switch {
	case lowest && n[0] > 0:
		return loadlevel.Level0
	case n[0]+n[1] > 0:
		return loadlevel.Level1
	}
	return loadlevel.Level2
}

// pickUniform draws uniformly among cands except skip, levels ignored.
func pickUniform(cands []Candidate, skip int, rnd Rand) int {
	if skip < 0 {
		return rnd.IntN(len(cands))
	}
	i := rnd.IntN(len(cands) - 1)
	if i >= skip {
		i++
	}
	return i
}

// chooseP2C is the power-of-two-choices rule; len(cands) >= 2.
func chooseP2C(cands []Candidate, p Policy, r Request, rnd Rand) int {
	useLevels := p.Announce && !r.Socket
	w := p2cWeights{cands: cands, byRate: r.Direct && useLevels, rate: p.rate()}
	if p.ThisNodeFirst {
		w.local = localIndex(cands)
	} else {
		w.local = noSkip
	}
	var first, second int
	if !w.byRate && w.local < 0 {
		// Every weight is 1: two distinct uniform draws, no scan.
		first = rnd.IntN(len(cands))
		if second = rnd.IntN(len(cands) - 1); second >= first {
			second++
		}
	} else {
		total := 0
		for i := range cands {
			total += w.of(i)
		}
		first = w.draw(noSkip, rnd.IntN(total))
		second = w.draw(first, rnd.IntN(total-w.of(first)))
	}

	a, b := cands[first], cands[second]
	if useLevels && level(a) != level(b) {
		if level(b) < level(a) {
			return second
		}
		return first
	}
	switch {
	case b.InFlight < a.InFlight:
		return second
	case b.InFlight == a.InFlight && b.Local && !a.Local:
		return second
	}
	return first
}

// p2cWeights are the weights P2C draws candidates by.
type p2cWeights struct {
	cands  []Candidate
	byRate bool // a direct request with levels: LEVEL0 rate, LEVEL1 100-rate, LEVEL2 1
	rate   int
	local  int // the index weighted x len(cands) (this_node_first), or noSkip
}

// of is candidate i's weight, at least 1.
func (w p2cWeights) of(i int) int {
	x := 1
	if w.byRate {
		switch level(w.cands[i]) {
		case loadlevel.Level0:
			x = w.rate
		case loadlevel.Level1:
			x = max(100-w.rate, 1)
		}
	}
	if i == w.local {
		x *= len(w.cands)
	}
	return x
}

// draw is the candidate, skip left out, where the running sum of weights
// passes x; x must be below the total weight of the candidates drawn over.
func (w p2cWeights) draw(skip, x int) int {
	last := -1
	for i := range w.cands {
		if i == skip {
			continue
		}
		if x -= w.of(i); x < 0 {
			return i
		}
		last = i
	}
	return last // unreachable
}

// Transfer reports whether a request that arrived from a balancing client
// or another node (so it is not re-balanced) must leave this node: the
// local group is held, or it is LEVEL2 while some other node (in others) is
// lower. Levels count only with p.Announce. A held group must be left even
// when others is empty; the caller then answers that the service is closed.
func Transfer(localHeld bool, localLevel loadlevel.Level, others []Candidate, p Policy) bool {
	if localHeld {
		return true
	}
	if !p.Announce || min(localLevel, loadlevel.Level2) != loadlevel.Level2 {
		return false
	}
	for _, c := range others {
		if !c.Local && level(c) < loadlevel.Level2 {
			return true
		}
	}
	return false
}

// Retries is how many other nodes to retry on after a communication error:
// scd_retry_of_comm_error, never more than the other nodes that run the
// group; 0 = return the error.
func Retries(setting, nodesRunningGroup int) int {
	return max(0, min(setting, nodesRunningGroup-1))
}

// rate is schedule_rate clamped to 50..100.
func (p Policy) rate() int { return min(max(p.ScheduleRate, 50), 100) }

// level is c's level, a value above LEVEL2 taken as LEVEL2.
func level(c Candidate) loadlevel.Level { return min(c.Level, loadlevel.Level2) }

// localIndex is the index of the first candidate that is this node, or -1.
func localIndex(cands []Candidate) int {
	for i := range cands {
		if cands[i].Local {
			return i
		}
	}
	return -1
}
