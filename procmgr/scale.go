package procmgr

import (
	"sort"
	"time"
)

// This file is the Multiserver rule as pure logic: it is handed what the
// node sees (queue depths, processes, memory, limits) and returns which
// non-resident processes to start and stop. It keeps no time and does no
// I/O, so the rule can be tested by tables; Manager does the I/O.
//
// The rule of the documents: a server runs Resident processes always and up
// to Max-Resident non-resident ones. A non-resident process starts while
// the requests remaining in the queue exceed BalanceCount x running
// processes (starting ones count as running); with BalanceCount 0, one
// starts for every waiting request no idle process can take. It stops when
// the remaining requests fall to BalanceCount x running or below.
//
// Where the documents leave room, we choose so as not to flap:
//   - a non-resident process stops only after it has been idle for
//     IdleStop, and at most one per server per check;
//   - it stops only if the rule would not start it again at once, that is
//     while queue <= BalanceCount x (running-1);
//   - the process that has been idle longest goes first.
// The CPU guard (tpsched's, not the documents'), when CPUWaitLimit is set
// and the meter sees run-queue waits: no non-resident process starts while
// the server's processes are busy (runnable at least CPUBusyFloor percent of
// the time) and spend CPUWaitLimit percent or more of that waiting for a
// CPU. Then the CPUs are the bottleneck and another process would only add
// to the wait. Because the guard can only judge starts it has seen the
// effect of, it lets one start through at a time: the next waits for a
// window that began after it.
//
// When a node-wide cap (max_processes) or the memory gate holds starts
// back, servers of higher priority (schedule_priority 1 is highest) are
// served first; equal priorities go by the larger backlog.

// ServerLoad is one server as a check sees it.
type ServerLoad struct {
	Priority     int // schedule_priority, 1 highest
	Resident     int
	Max          int
	BalanceCount int
	Queue        int           // requests waiting in the schedule queue
	Running      int           // processes running or starting, resident ones included
	Free         int           // of Running, processes starting or idle: ones that will take the next requests
	IdleStop     time.Duration // how long a non-resident process idles before it may stop
	NonResident  []NonResidentProc
	CPUWait      int  // percent of its processes' runnable time lately spent waiting for a CPU; -1 unknown
	CPUBusy      int  // their runnable time per process, percent of wall-clock time
	CPUSeen      bool // a guard window began after the last non-resident start and has ended
	CPUWaitLimit int  // cpu_wait_limit: the guard holds starts back from this CPUWait; 0 = no guard
}

// CPUBusyFloor is how busy (runnable percent of the time, per process) a
// server's processes must be before the CPU guard can hold its starts. A
// service that sleeps on I/O is runnable a few percent of the time; 50 let
// CPU-bound processes through when a starved scdd fed them in bursts (an
// integration test beside two CPU hogs grew to 11 of 16).
const CPUBusyFloor = 20

// NonResidentProc is one running non-resident process.
type NonResidentProc struct {
	Slot    int
	IdleFor time.Duration // 0 while it serves or starts
}

// Limits are the node-wide bounds of a check.
type Limits struct {
	NodeCap      int  // max_processes; 0 = none
	NodeRunning  int  // processes running on the node now
	MemoryLow    bool // MemAvailable under the reserve: the memory gate is closed
	MemoryPermit int  // while closed: non-resident exits not yet answered by a start
}

// Decision is what a check decides for one server.
type Decision struct {
	Start int // non-resident processes to start now
	Stop  int // slot of the non-resident process to stop, or -1
}

// Wanted is how many non-resident processes the rule asks to start for s,
// before node-wide limits.
func Wanted(s ServerLoad) int {
	room := s.Max - s.Running
	if room <= 0 || s.Queue == 0 {
		return 0
	}
	if guarded(s) {
		if CPUBound(s) || !s.CPUSeen {
			return 0
		}
		room = 1
	}
	if s.BalanceCount == 0 {
		return min(room, s.Queue-min(s.Queue, s.Free))
	}
	n := 0
	for run := s.Running; s.Queue > s.BalanceCount*run && n < room; run++ {
		n++
	}
	return n
}

// guarded reports whether the CPU guard rules s's starts. A server with no
// process running is never held: someone must serve the queue.
func guarded(s ServerLoad) bool {
	return s.CPUWaitLimit > 0 && s.CPUWait >= 0 && s.Running > 0
}

// CPUBound reports whether the CPU guard holds s's starts back because its
// processes already wait for a CPU.
func CPUBound(s ServerLoad) bool {
	return guarded(s) && s.CPUBusy >= CPUBusyFloor && s.CPUWait >= s.CPUWaitLimit
}

// StopCandidate is the slot of the non-resident process to stop now, or -1.
func StopCandidate(s ServerLoad) int {
	if len(s.NonResident) == 0 || s.Queue > s.BalanceCount*(s.Running-1) {
		return -1
	}
	best, bestIdle := -1, time.Duration(-1)
	for _, p := range s.NonResident {
		if p.IdleFor >= s.IdleStop && p.IdleFor > bestIdle && p.IdleFor > 0 {
			best, bestIdle = p.Slot, p.IdleFor
		}
	}
	return best
}

// Plan decides every server's starts and stops for one check. The result
// has one Decision per server, in the order given.
func Plan(servers []ServerLoad, lim Limits) []Decision {
	out := make([]Decision, len(servers))
	order := make([]int, 0, len(servers))
	for i, s := range servers {
		out[i] = Decision{Start: Wanted(s), Stop: StopCandidate(s)}
		if out[i].Start > 0 {
			out[i].Stop = -1
			order = append(order, i)
		}
	}
	sort.SliceStable(order, func(a, b int) bool {
		sa, sb := servers[order[a]], servers[order[b]]
		if sa.Priority != sb.Priority {
			return sa.Priority < sb.Priority
		}
		return sa.Queue > sb.Queue
	})
	capLeft := -1
	if lim.NodeCap > 0 {
		capLeft = max(0, lim.NodeCap-lim.NodeRunning)
	}
	permits := lim.MemoryPermit
	for _, i := range order {
		n := out[i].Start
		if capLeft >= 0 {
			n = min(n, capLeft)
			capLeft -= n
		}
		if lim.MemoryLow {
			n = min(n, permits)
			permits -= n
		}
		out[i].Start = n
	}
	return out
}
