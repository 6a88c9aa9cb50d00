package procmgr

import (
	"fmt"
	"testing"
	"time"
)

func TestWanted(t *testing.T) {
	cases := []struct {
		name string
		s    ServerLoad
		want int
	}{
		// balance_count x running is the threshold: remaining must exceed it.
		{"at the threshold nothing starts", ServerLoad{Resident: 1, Max: 4, BalanceCount: 3, Running: 1, Queue: 3}, 0},
		{"one over starts one", ServerLoad{Resident: 1, Max: 4, BalanceCount: 3, Running: 1, Queue: 4}, 1},
		{"10 waiting, bc 3: 1->4 running (10 > 3,6,9; not > 12)", ServerLoad{Resident: 1, Max: 8, BalanceCount: 3, Running: 1, Queue: 10}, 3},
		{"capped by max", ServerLoad{Resident: 1, Max: 2, BalanceCount: 3, Running: 1, Queue: 100}, 1},
		{"at max", ServerLoad{Resident: 1, Max: 2, BalanceCount: 3, Running: 2, Queue: 100}, 0},
		{"starting processes count as running", ServerLoad{Resident: 1, Max: 8, BalanceCount: 3, Running: 4, Queue: 10}, 0},
		{"empty queue", ServerLoad{Resident: 0, Max: 8, BalanceCount: 0, Running: 0, Queue: 0}, 0},
		{"bc 0: one per waiting request", ServerLoad{Resident: 0, Max: 8, BalanceCount: 0, Running: 0, Queue: 3}, 3},
		{"bc 0: free processes take requests first", ServerLoad{Resident: 0, Max: 8, BalanceCount: 0, Running: 2, Free: 2, Queue: 3}, 1},
		{"bc 0: up to max", ServerLoad{Resident: 0, Max: 4, BalanceCount: 0, Running: 1, Queue: 10}, 3},
		{"resident only (max = resident)", ServerLoad{Resident: 2, Max: 2, BalanceCount: 3, Running: 2, Queue: 50}, 0},
		// The CPU guard.
		{"guard: busy and waiting at the limit holds starts", guardLoad(50, 80, true), 0},
		{"guard: waiting, but not busy (I/O): one start", guardLoad(90, 10, true), 1},
		{"guard: busy, waiting under the limit: one start", guardLoad(49, 100, true), 1},
		{"guard: the last start not yet seen: none", guardLoad(0, 0, false), 0},
		{"guard off (limit 0): the rule alone", func() ServerLoad { s := guardLoad(95, 100, false); s.CPUWaitLimit = 0; return s }(), 14},
		{"guard: wait unknown: the rule alone", guardLoad(-1, 0, false), 14},
		{"guard: nothing running, someone must start", ServerLoad{Resident: 0, Max: 4, BalanceCount: 0, Running: 0, Queue: 2, CPUWait: 90, CPUBusy: 100, CPUWaitLimit: 50}, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Wanted(tc.s); got != tc.want {
				t.Errorf("Wanted(%+v) = %d, want %d", tc.s, got, tc.want)
			}
		})
	}
}

// guardLoad is a server whose rule wants 14 more processes, with the CPU
// guard at 50 seeing wait and busy percent.
func guardLoad(wait, busy int, seen bool) ServerLoad {
	return ServerLoad{Resident: 1, Max: 16, BalanceCount: 1, Running: 2, Queue: 50,
		CPUWait: wait, CPUBusy: busy, CPUSeen: seen, CPUWaitLimit: 50}
}

func TestStopCandidate(t *testing.T) {
	const idle = 500 * time.Millisecond
	nr := func(idles ...time.Duration) []NonResidentProc {
		var out []NonResidentProc
		for i, d := range idles {
			out = append(out, NonResidentProc{Slot: 10 + i, IdleFor: d})
		}
		return out
	}
	cases := []struct {
		name string
		s    ServerLoad
		want int
	}{
		{"no non-resident process", ServerLoad{BalanceCount: 3, Running: 1, Queue: 0}, -1},
		{"idle long enough, queue empty", ServerLoad{BalanceCount: 3, Running: 2, NonResident: nr(time.Second)}, 10},
		{"idle too briefly", ServerLoad{BalanceCount: 3, Running: 2, NonResident: nr(100 * time.Millisecond)}, -1},
		{"busy (idle 0) never stops", ServerLoad{BalanceCount: 3, Running: 2, NonResident: nr(0)}, -1},
		{"longest idle goes first", ServerLoad{BalanceCount: 3, Running: 4, NonResident: nr(time.Second, 3*time.Second, 2*time.Second)}, 11},
		// remaining 4 > 3 x (2-1): stopping would make the rule start it again.
		{"would restart at once", ServerLoad{BalanceCount: 3, Running: 2, Queue: 4, NonResident: nr(time.Second)}, -1},
		{"remaining <= bc x (running-1)", ServerLoad{BalanceCount: 3, Running: 2, Queue: 3, NonResident: nr(time.Second)}, 10},
		{"bc 0: stops only when nothing waits", ServerLoad{BalanceCount: 0, Running: 2, Queue: 1, NonResident: nr(time.Second)}, -1},
		{"bc 0, queue empty", ServerLoad{BalanceCount: 0, Running: 2, Queue: 0, NonResident: nr(time.Second)}, 10},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.s.IdleStop = idle
			if got := StopCandidate(tc.s); got != tc.want {
				t.Errorf("StopCandidate = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestPlanLimits(t *testing.T) {
	// Three servers each wanting 2 more; priorities 8, 1, 16.
	servers := []ServerLoad{
		{Priority: 8, Resident: 1, Max: 3, BalanceCount: 1, Running: 1, Queue: 5},
		{Priority: 1, Resident: 1, Max: 3, BalanceCount: 1, Running: 1, Queue: 5},
		{Priority: 16, Resident: 1, Max: 3, BalanceCount: 1, Running: 1, Queue: 5},
	}
	cases := []struct {
		name string
		lim  Limits
		want []int // starts per server
	}{
		{"no limit", Limits{}, []int{2, 2, 2}},
		{"node cap leaves 3: highest priority first", Limits{NodeCap: 6, NodeRunning: 3}, []int{1, 2, 0}},
		{"node cap reached", Limits{NodeCap: 3, NodeRunning: 3}, []int{0, 0, 0}},
		{"memory gate closed, no permit", Limits{MemoryLow: true}, []int{0, 0, 0}},
		{"memory gate closed, one exit to answer", Limits{MemoryLow: true, MemoryPermit: 1}, []int{0, 1, 0}},
		{"memory gate and cap together", Limits{MemoryLow: true, MemoryPermit: 5, NodeCap: 7, NodeRunning: 3}, []int{2, 2, 0}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Plan(servers, tc.lim)
			for i, d := range got {
				if d.Start != tc.want[i] {
					t.Fatalf("starts %v, want %v", starts(got), tc.want)
				}
			}
		})
	}
	t.Run("equal priority: larger backlog first", func(t *testing.T) {
		s := []ServerLoad{
			{Priority: 8, Max: 2, BalanceCount: 0, Queue: 1},
			{Priority: 8, Max: 2, BalanceCount: 0, Queue: 2},
		}
		got := Plan(s, Limits{NodeCap: 2})
		if fmt.Sprint(starts(got)) != "[0 2]" {
			t.Fatalf("starts %v, want [0 2]", starts(got))
		}
	})
	t.Run("a server that starts does not stop", func(t *testing.T) {
		s := []ServerLoad{{Max: 4, BalanceCount: 0, Running: 2, Queue: 1, IdleStop: time.Second,
			NonResident: []NonResidentProc{{Slot: 3, IdleFor: time.Hour}}}}
		got := Plan(s, Limits{})
		if got[0].Stop != -1 {
			t.Fatalf("decision %+v", got[0])
		}
	})
}

func starts(ds []Decision) []int {
	out := make([]int, len(ds))
	for i, d := range ds {
		out[i] = d.Start
	}
	return out
}
