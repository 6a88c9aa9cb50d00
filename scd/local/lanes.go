package local

import (
	"os"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/netio"
	"tpsched/scd/loadlevel"
	"tpsched/shm"
)

// This file grants, watches and ends the lanes of the group's processes
// (shm.Lane): a caller process's calls to one service of the group made
// straight to one of its processes, which the queue lends out for it
// (schedq.Lend), with no thread of the node on the call's path. The
// dispatcher and the scheduler made both wake-ups of every local call; on
// a lane the caller wakes the callee and the callee the caller, each on
// its own CPU (docs/ARCHITECTURE.md, "Lanes").
//
// A lane is granted only where the call would have been the queue's
// anyway: the group serves, is not held, is at LEVEL0 and no call waits
// for it, and the node routes a UAP's calls to itself (Options.Lanes). It
// ends, and the process goes back to the queue, when any of that stops
// being true (a call that waits ends every lane of the group at once), when
// it is idle, and when either process ends. The node keeps the rulings:
// a call the callee never took is given back to the caller, unrun, to make
// the usual way; one it took and did not finish by its deadline, or whose
// process died, is answered 'timed out' or 'server terminated' through the
// lane's claim word, which the callee and the node move with a
// compare-and-swap, so exactly one of them ends each call.
//
// Everything here runs under the group's mu, but for offerLane's first
// looks, and the caller's part of a lane is reached through shm's
// out-call lock: the caller may be another group's process.

// laneRules are a node's lanes: its generations, whether it grants them,
// and its counters.
type laneRules struct {
	on      bool           // the node grants lanes (Options.Lanes, TPSCHED_LANES)
	max     int64          // the most lanes granted at once on the node (maxLanes)
	gen     *atomic.Uint32 // the node's last lane generation
	open    *atomic.Int64  // the node's lanes not yet closed (the expiry loop's pace)
	granted *atomic.Int64  // the node's capped lanes granted and not revoked: what max bounds
	wanted  *atomic.Int64  // unix ns: when max last kept a caller from a lane it could have had
	// regroups counts the groups whose processes got a cpu cgroup of
	// their own (Group.SetCPUWeight): the lanes granted outside the cap
	// before end.
	regroups *atomic.Uint32
}

// maxLanes is how many capped lanes a node grants at once: one per two
// CPUs, at least one. A lane is two processes that each run and wake the
// other without pause, and with more lanes than that in a cpu cgroup of
// their own the kernel's group scheduling kept every process outside it,
// the node's own threads included, from the CPU for seconds (2026-12-06,
// docs/ARCHITECTURE.md "Lanes", tools/cgroup-stall). So the cap holds
// the lanes with a process in a cpu cgroup of its own; the others, whose
// processes are tasks in scdd's own cgroup (procmgr's shared CPU groups,
// or nice), take no part in it: a lane for every caller a group can lend
// a process to.
func maxLanes(cpus int) int64 { return int64(max(1, cpus/2)) }

// groupLanes are the lanes a group's processes serve, under mu.
type groupLanes struct {
	rules   *laneRules
	open    []*laneState
	quiet   time.Time // no grant before: a call waited for a process
	grants  *metrics.Counter
	calls   *metrics.Counter
	revokes [revokeReasons]*metrics.Counter
	served  uint64 // calls completed on its lanes, for the load level
}

// Why a lane ends (tpsched_lane_revokes_total's reason).
const (
	revokeWaiting    = iota // a call waited for a process of the group
	revokeClosed            // held, no longer serving here, the node closing
	revokeLevel             // the group left LEVEL0
	revokeCallerGone        // the caller died
	revokeUnmapped          // the callee did not map its grant
	revokeIdle              // no call for laneIdle
	revokeStopped           // the callee is to stop (its server, chprc, Multiserver)
	revokeDied              // the callee died
	revokeTimedOut          // the node ruled a call on it 'timed out'
	revokeTurn              // held laneTurn while the cap kept another caller from one
	revokeCPUGroup          // uncapped, and a group's processes got a cpu cgroup of their own
	revokeReasons
)

var revokeReasonNames = [revokeReasons]string{"waiting", "closed", "level", "caller_gone", "unmapped", "idle", "stopped", "died", "timed_out", "turn", "cpu_group"}

func newGroupLanes(rules *laneRules, set *metrics.Set, group string) groupLanes {
	gl := groupLanes{rules: rules,
		grants: set.NewCounter(`tpsched_lane_grants_total{group="` + group + `"}`),
		calls:  set.NewCounter(`tpsched_lane_calls_total{group="` + group + `"}`)}
	for i, r := range revokeReasonNames {
		gl.revokes[i] = set.NewCounter(`tpsched_lane_revokes_total{group="` + group + `",reason="` + r + `"}`)
	}
	return gl
}

// laneState is one lane as the node follows it.
type laneState struct {
	l       *shm.Lane
	slot    int        // the callee's
	from    *uapCaller // the caller's end of its calls
	granted time.Time
	made    uint64    // the caller's count of calls at the last look
	active  time.Time // when that count last moved (or the grant)
	over    uint64    // its calls over and not given back, counted in the caller's local calls
	open    uint64    // the open call, as first seen
	since   time.Time // when it was first seen
	revoked time.Time // zero while granted
	// capped: a process of the lane has a cpu cgroup of its own, so the
	// lane counts against maxLanes. An uncapped one notes the node's
	// regroups at its grant and ends when they move.
	capped   bool
	regroups uint32
	// ranOver: a call the callee had taken was ruled 'timed out'; it may
	// run it still, so only its leaving the lane ends the lane.
	ranOver bool
}

const (
	// laneIdle ends a lane no call was made on for so long: the process
	// goes back to the queue.
	laneIdle = 250 * time.Millisecond
	// laneMapWithin is how long a callee has to map a lane it was
	// granted; one that does not takes none again.
	laneMapWithin = time.Second
	// laneLeaveWithin is how long after its revoke a callee may go on
	// saying it serves a lane whose calls are over; then it is given back
	// to the queue anyway.
	laneLeaveWithin = time.Second
	// laneQuiet is how long a group grants no lane after a call had to
	// wait for one of its processes: long enough that callers who
	// outnumber the processes do not have lanes granted and revoked at
	// every call, short enough that as many callers as processes settle
	// on a lane each within a run of a second.
	laneQuiet = 200 * time.Millisecond
	// laneRetry is how long a caller that was not granted a lane waits
	// before it is considered again; laneRetryUnused after it left a
	// lane unmapped.
	laneRetry       = 50 * time.Millisecond
	laneRetryUnused = 5 * time.Second
	// laneTurn is how long a caller keeps its lane once maxLanes kept
	// another from one; then it takes no lane for as long, and the others
	// take turns. Without it the first caller kept the node's lanes (one,
	// on two CPUs) for as long as it called, or, forging its calls, for
	// good.
	laneTurn = time.Second
)

// lanesFromEnv is whether scdd grants lanes: TPSCHED_LANES=off turns them
// off (to measure the node without them, or if they misbehave).
func lanesFromEnv() bool { return os.Getenv("TPSCHED_LANES") != "off" }

// offerLane grants the calling process a lane to service if the group can
// spare a process for it now. The call that prompted it was admitted
// already and goes the usual way; the next ones take the lane. On the
// dispatcher, without mu.
//
// Where the process it would lend is the one running that call (as many
// callers as processes, the others lent), the offer stands until the call
// ends (laterLane): at its completion the process is free, and the caller
// is granted it then.
func (g *Group) offerLane(u *uapCaller, service string, now time.Time) {
	r := g.lanes.rules
	if r == nil || !r.on || now.UnixNano() < u.laneNext.Load() {
		return
	}
	cp, ok := u.laneProc()
	if !ok {
		return
	}
	u.laneNext.Store(now.Add(laneRetry).UnixNano())
	entry, ok := g.entries[service]
	if !ok || !g.lendsLanes() {
		return
	}
	g.mu.Lock()
	got := g.grantLane(u, cp, service, entry, now)
	un := g.takeUndelivered()
	g.mu.Unlock()
	un.settle(g)
	if got == laneNoProcess {
		u.laneLater.Store(&laterLane{g: g, service: service})
	}
}

// laterLane is an offer of a lane that waits for the end of the call that
// prompted it (offerLane): the group had no process to lend but the one
// that call runs on.
type laterLane struct {
	g       *Group
	service string
}

// offerLaneAtEnd grants u the lane its last offer found no process for,
// now that one of its calls to the group ended (collect, under mu, after
// the queue was told): once per such offer. The caller may have died
// since (laneProc).
func (g *Group) offerLaneAtEnd(u *uapCaller, now time.Time) {
	w := u.laneLater.Load()
	if w == nil || w.g != g || !u.laneLater.CompareAndSwap(w, nil) {
		return
	}
	cp, ok := u.laneProc()
	entry, known := g.entries[w.service]
	if !ok || !known || !g.lendsLanes() {
		return
	}
	g.grantLane(u, cp, w.service, entry, now)
}

// laneProc is the caller's process if it may be granted a lane: one in
// shared memory that holds no lane and takes lanes. Its area is read only
// under its lock (CallerLanesOK): the caller may be another group's, and
// may have died and had its area unmapped since the call that brought
// the offer.
func (u *uapCaller) laneProc() (*shm.Proc, bool) {
	cp, ok := u.p.(*shm.Proc)
	return cp, ok && !u.laneHeld.Load() && cp.CallerLanesOK()
}

// lendsLanes is what a grant needs of the group that its lock does not
// guard: it serves, is started, not held or closed, and at LEVEL0.
func (g *Group) lendsLanes() bool {
	return !g.held.Load() && g.serving.Load() && !g.closed.Load() && g.started.Load() && g.load.level() == loadlevel.Level0
}

// What grantLane did.
const (
	laneGranted   = iota
	laneRefused   // the group, the node's cap or the lane's memory said no
	laneNoProcess // no process of the group was free to lend
)

// grantLane is offerLane's work under mu; it counts the grants.
func (g *Group) grantLane(u *uapCaller, cp *shm.Proc, service, entry string, now time.Time) int {
	// Again under mu: a hold, a stop or the node's close revokes the
	// group's lanes under mu, and a grant after it would outlive it.
	if g.q.Waiting() > 0 || now.Before(g.lanes.quiet) || g.held.Load() || !g.serving.Load() || g.closed.Load() {
		return laneRefused
	}
	lendable := func(s int) bool {
		si := &g.slots[s]
		p, ok := si.p.(*shm.Proc)
		return ok && si.attached && !si.killed && p != cp && p.LanesOK()
	}
	// The regroups first: a group that gets its cgroup between them and
	// the looks at the groups moves them, and ends this lane if uncapped.
	regroups := g.lanes.rules.regroups.Load()
	capped := g.inCPUGroup() || u.inCPUGroup()
	if capped && g.lanes.rules.granted.Load() >= g.lanes.rules.max {
		// A turn only for a caller the cap alone keeps from a lane: one
		// the group has no process to lend (its one process runs the
		// call, a socket-mode group) would be granted none at its turn,
		// and the holder would lose its lane every other second for
		// nobody.
		if g.q.Lendable(lendable) {
			g.lanes.rules.wanted.Store(now.UnixNano())
		}
		return laneRefused
	}
	slot := g.q.Lend(lendable)
	if slot < 0 {
		return laneNoProcess
	}
	gen := g.lanes.rules.gen.Add(1)
	if gen == 0 {
		gen = g.lanes.rules.gen.Add(1)
	}
	callee := g.slots[slot].p.(*shm.Proc)
	l, err := shm.NewLane(cp, callee, gen, shm.LaneSpec{Group: g.name, Service: service, Entry: entry, Watch: g.watch})
	if err != nil {
		g.q.Return(slot)
		g.act()
		return laneRefused
	}
	g.lanes.open = append(g.lanes.open, &laneState{l: l, slot: slot, from: u, granted: now, active: now,
		capped: capped, regroups: regroups})
	u.laneHeld.Store(true)
	g.lanes.rules.open.Add(1)
	if capped {
		g.lanes.rules.granted.Add(1)
	}
	g.lanes.grants.Inc()
	return laneGranted
}

// lookLanes counts what the lanes served since the last look, ends those
// that should end, and closes those ended and over, giving their
// processes back to the queue. Under mu, on the dispatcher (collect).
func (g *Group) lookLanes(now time.Time) {
	for i := 0; i < len(g.lanes.open); {
		ls := g.lanes.open[i]
		if !ls.revoked.IsZero() {
			ls.l.Rule(0, "") // a call made on it after the revoke: back to its caller, unrun
		}
		lk := ls.l.Look(true)
		si := &g.slots[ls.slot]
		if lk.Completed > 0 {
			si.served += lk.Completed
			si.since = now
			g.lanes.calls.AddInt64(int64(lk.Completed))
			g.lanes.served += lk.Completed
		}
		if d := lk.Over - ls.over; d > 0 && d < 1<<32 {
			if ls.from.calls != nil {
				ls.from.calls.AddInt64(int64(d))
			}
			ls.over = lk.Over
		}
		if lk.Made != ls.made {
			ls.made, ls.active = lk.Made, now
		}
		if lk.Open && lk.Made != ls.open {
			ls.open, ls.since = lk.Made, now
		}
		if why := g.laneOver(ls, lk, now); why >= 0 {
			g.revokeLane(ls, now, why)
			continue // looked at again at once: it may be over already
		}
		// Over once the callee left it (an honest one leaves between
		// calls), or long after the revoke with no call taken: its own
		// word, not the claim, which the caller can write too. A call it
		// took and was ruled on it may still run (ranOver): as a queue's
		// call past its deadline, it keeps its process until it ends.
		if !ls.revoked.IsZero() && (!lk.CalleeOn || !lk.Taken && !ls.ranOver && now.Sub(ls.revoked) > laneLeaveWithin) {
			g.closeLane(i)
			si.laneLeft = true // its ring for leaving the lane has a cause
			continue
		}
		i++
	}
}

// laneOver says why a granted lane should end now (a revoke reason), or
// -1. A lane revoked already is not looked at.
func (g *Group) laneOver(ls *laneState, lk shm.LaneLook, now time.Time) int {
	switch {
	case !ls.revoked.IsZero():
		return -1
	case g.q.Waiting() > lanesRevoked(g.lanes.open):
		g.lanes.quiet = now.Add(laneQuiet)
		return revokeWaiting
	case g.held.Load() || !g.serving.Load() || g.closed.Load():
		return revokeClosed
	case g.load.level() != loadlevel.Level0:
		return revokeLevel
	case ls.l.CallerGone():
		return revokeCallerGone
	case !lk.CalleeOn && now.Sub(ls.granted) > laneMapWithin:
		ls.l.Callee().NoLanes() // it said it takes lanes and did not take this one
		return revokeUnmapped
	case !ls.capped && ls.regroups != g.lanes.rules.regroups.Load():
		return revokeCPUGroup // its caller, granted again, is capped if it must be
	case ls.capped && now.Sub(ls.granted) > laneTurn && g.lanes.rules.takeTurn(ls.granted):
		ls.from.laneNext.Store(now.Add(laneTurn).UnixNano())
		return revokeTurn
	case now.Sub(ls.active) > laneIdle && !lk.Open:
		if !ls.l.CallerOn() {
			ls.from.laneNext.Store(now.Add(laneRetryUnused).UnixNano())
		}
		return revokeIdle
	}
	return -1
}

// takeTurn says whether a caller was kept from a lane after one granted
// at granted was, and if so uses the refusal up: one refusal ends one
// lane, not every lane older than a turn.
func (r *laneRules) takeTurn(granted time.Time) bool {
	w := r.wanted.Load()
	return w > granted.UnixNano() && r.wanted.CompareAndSwap(w, 0)
}

// ungrant takes a revoked lane out of the cap's count.
func (r *laneRules) ungrant(ls *laneState) {
	if ls.capped {
		r.granted.Add(-1)
	}
}

// inCPUGroup says whether the group's processes have a cpu cgroup of
// their own (not scdd's: procmgr's shared CPU group, or nice).
func (g *Group) inCPUGroup() bool { return g.procs.CPUGroupPath() != "" }

// lanesRevoked counts the lanes revoked and not yet closed: processes on
// their way back to the queue.
func lanesRevoked(open []*laneState) int {
	n := 0
	for _, ls := range open {
		if !ls.revoked.IsZero() {
			n++
		}
	}
	return n
}

// revokeLane ends the grant of a lane: both processes are told, a call
// made and not taken goes back to its caller. The lane stays open until
// its callee left it (lookLanes), but no longer counts against the
// node's maxLanes (if it did): no call is made on it from here, and a
// callee that runs a call ruled 'timed out' on it for ever (ranOver), or
// never leaves, would otherwise keep every other caller off lanes. Under
// mu.
func (g *Group) revokeLane(ls *laneState, now time.Time, why int) {
	if ls.revoked.IsZero() {
		ls.revoked = now
		ls.l.Revoke()
		g.lanes.revokes[why].Inc()
		g.lanes.rules.ungrant(ls)
	}
}

// makeRoom ends the grant of a lane for each of the waiting calls (as
// many as are granted), those of callers that called least lately first:
// a call waits for a process while others serve lanes. No lane is granted
// in the group for laneQuiet. Under mu.
func (g *Group) makeRoom(waiting int, now time.Time) {
	g.lanes.quiet = now.Add(laneQuiet)
	// Lanes revoked already give their processes back soon: a waiting
	// call each of those does not need another revoke.
	for waiting -= lanesRevoked(g.lanes.open); waiting > 0; waiting-- {
		var pick *laneState
		for _, ls := range g.lanes.open {
			if ls.revoked.IsZero() && (pick == nil || ls.active.Before(pick.active)) {
				pick = ls
			}
		}
		if pick == nil {
			return
		}
		g.revokeLane(pick, now, revokeWaiting)
	}
}

// revokeLanes ends the grant of every lane of the group: the node closes,
// the group is held or stops serving, or a call waits for a process.
// Under mu.
func (g *Group) revokeLanes(now time.Time, why int) {
	for _, ls := range g.lanes.open {
		g.revokeLane(ls, now, why)
	}
}

// closeLane releases lane i: its process goes back to the queue (if it is
// still the slot's), its caller may be granted another.
func (g *Group) closeLane(i int) {
	ls := g.lanes.open[i]
	callee := ls.l.Callee()
	ls.l.Close()
	if p, ok := g.slots[ls.slot].p.(*shm.Proc); ok && p == callee {
		g.q.Return(ls.slot)
		g.act()
	}
	ls.from.laneHeld.Store(false)
	g.lanes.rules.open.Add(-1)
	g.lanes.open = append(g.lanes.open[:i], g.lanes.open[i+1:]...)
}

// endLaneOf ends the lane the process of slot serves, at its death: a call
// it never took goes back to its caller, one it took is answered 'server
// terminated' (true when the ruling answered one). Under mu, before the
// slot's transport end is removed.
func (g *Group) endLaneOf(slot int, why string) (terminated bool) {
	for i, ls := range g.lanes.open {
		if ls.slot != slot {
			continue
		}
		// Revoked first: a call the caller makes from here it takes back
		// itself (it sees lane_out moved), and one made before is given
		// back unrun unless the callee took it. Only a taken call is
		// answered 'server terminated'.
		if ls.revoked.IsZero() {
			g.lanes.revokes[revokeDied].Inc()
			g.lanes.rules.ungrant(ls)
		}
		ls.l.Revoke()
		ls.l.Rule(0, "")
		terminated = ls.l.RuleTaken(uint32(netio.CodeServerTerminated), "server terminated: "+why)
		ls.l.Close()
		ls.from.laneHeld.Store(false)
		g.lanes.rules.open.Add(-1)
		g.lanes.open = append(g.lanes.open[:i], g.lanes.open[i+1:]...)
		return terminated
	}
	return false
}

// expireLanes answers 'timed out' the calls on lanes whose deadline
// passed: the caller's, or the group's watch_time from when the node first
// saw the call, and revokes their lanes. Under mu, on the expiry loop.
func (g *Group) expireLanes(now time.Time) (expired int) {
	for _, ls := range g.lanes.open {
		lk := ls.l.Look(false)
		if !lk.Open {
			continue
		}
		if lk.Made != ls.open {
			ls.open, ls.since = lk.Made, now
		}
		deadline, limit := lk.Deadline, time.Duration(0)
		if g.watch > 0 {
			if bound := ls.since.Add(g.watch).UnixNano(); deadline == 0 || deadline > bound {
				deadline = bound
			}
		}
		if deadline == 0 || now.UnixNano() < deadline {
			continue
		}
		limit = time.Duration(deadline - ls.since.UnixNano())
		if ls.l.Rule(uint32(netio.CodeTimedOut), "timed out: "+timedOutMessage(limit, g.watch)) {
			expired++
			ls.ranOver = ls.ranOver || lk.Taken
			// Its caller lets it go at a ruling; one that does not (its
			// claim forged 'taken' again) would have it ruled at every
			// look, its callee lent for as long as nobody waits.
			g.revokeLane(ls, now, revokeTimedOut)
		}
	}
	return expired
}
