package procmgr

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// This file changes a server's CPU weight while it runs: the routing
// manager (scd/wlm.go) gives the servers of a class that misses its goal
// more weight, and those of less important classes less.

// WeightBounds are the CPU weights SetCPUWeight takes (cgroup v2's range).
const (
	MinWeight = 1
	MaxWeight = 10000
)

// NiceOf is the nice value that gives about weight's share under CFS,
// whose weight grows about 1.25x per nice step down (100 -> 0).
func NiceOf(weight int) int {
	weight = min(max(weight, MinWeight), MaxWeight)
	return min(max(int(math.Round(math.Log(100/float64(weight))/math.Log(1.25))), -20), 19)
}

// SetCPUWeight gives the server's processes, running and to come, the CPU
// weight weight (cgroup v2 scale, 1..10000; 100 is the default, what
// schedule_priority 8 gives): cpu.weight on cgroup v2, cpu.shares =
// Shares(weight) on v1, the nice value NiceOf(weight) of every thread
// without a cgroup.
func (s *Server) SetCPUWeight(weight int) error {
	if weight < MinWeight || weight > MaxWeight {
		return fmt.Errorf("procmgr: %s: cpu weight %d: want %d..%d", s.spec.Server, weight, MinWeight, MaxWeight)
	}
	// Without a cgroup the nice values are set by pid: none of these
	// processes may be reaped before, or its pid could be a stranger's
	// (see reapGate).
	s.reapGate.RLock()
	defer s.reapGate.RUnlock()
	return s.cpu.SetWeight(weight, func() []int { // lockcheck: the callbacks take s.mu and read cgroup files, no wait on a goroutine
		s.mu.Lock()
		var pids []int
		for _, sl := range s.slots {
			if sl.proc != nil {
				pids = append(pids, sl.proc.Pid)
			}
		}
		s.mu.Unlock()
		if f := beforeRenice.Load(); f != nil {
			for _, pid := range pids {
				(*f)(pid)
			}
		}
		return pids
	}, s.box.members)
}

// beforeRenice, when set by a test, runs in SetCPUWeight for each pid
// between taking the slots' processes and setting their weight.
var beforeRenice atomic.Pointer[func(pid int)]

// CPUWeight is the server's CPU weight now (cgroup v2 scale).
func (s *Server) CPUWeight() int { return s.cpu.Weight() }

// SetWeight changes the group's weight. pids lists the processes procmgr
// started and has not reaped (nil: none): with nice, those whose threads
// get the new nice value (new processes get it at start). A shared group
// (NewSharedGroup) makes its cgroup now, whatever the weight (a weight
// was asked for), and moves into it those and members' (every process in
// the server's other cgroups: what they forked), both listed after the
// cgroup exists, so that a process started meanwhile is either listed or
// moves itself (joinOwn).
func (g *CPUGroup) SetWeight(weight int, pids func() []int, members func() ([]int, error)) error {
	if pids == nil {
		pids = func() []int { return nil }
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return fmt.Errorf("procmgr: cpu group %s: removed", g.server)
	}
	g.weight, g.nice = weight, NiceOf(weight)
	made, err := g.own(weight)
	dir := g.dir
	g.mu.Unlock()
	switch {
	case err != nil:
		return err
	case made:
		moved := pids()
		return errors.Join(g.moveIn(moved), g.moveMembers(members, moved))
	case g.c.mech == MechanismCgroup1:
		return writeCgroupFile(filepath.Join(dir, "cpu.shares"), strconv.Itoa(Shares(weight)))
	case g.c.mech == MechanismCgroup2:
		if !g.c.weight {
			return nil
		}
		if err := g.c.enableCPU(); err != nil {
			return err
		}
		return writeCgroupFile(filepath.Join(dir, "cpu.weight"), strconv.Itoa(weight))
	}
	var errs []error
	for _, pid := range pids() {
		if err := g.applyNice(pid, NiceOf(weight)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// moveIn moves pids into the group's cgroup; one that exited meanwhile is
// no error.
func (g *CPUGroup) moveIn(pids []int) error {
	var errs []error
	for _, pid := range pids {
		if err := g.writeProcs(pid); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// movePasses bounds moveMembers: a server that forks faster than it is
// moved is left where it is, and the error says so.
const movePasses = 8

// moveMembers moves the server's members (nil: none) into the group's
// cgroup, but those in moved already, listing them again until a listing
// names no process the last did not: a process forked by one not yet
// moved is born outside, and the next listing finds it, one forked by one
// already moved is born inside.
// A member's pid is read live from its cgroup; one reused by a stranger
// between the read and the move would be moved too (procmgr reaps none of
// them, so reapGate cannot keep them; the window is the time of one write).
func (g *CPUGroup) moveMembers(members func() ([]int, error), moved []int) error {
	if members == nil {
		return nil
	}
	seen := map[int]bool{}
	for _, pid := range moved {
		seen[pid] = true
	}
	for range movePasses {
		pids, err := members()
		if err != nil {
			return err
		}
		var fresh []int
		for _, pid := range pids {
			if !seen[pid] {
				seen[pid] = true
				fresh = append(fresh, pid)
			}
		}
		if len(fresh) == 0 {
			return nil
		}
		if err := g.moveIn(fresh); err != nil {
			return err
		}
	}
	return fmt.Errorf("procmgr: cpu group %s: its processes still forked after %d moves", g.server, movePasses)
}

// Weight is the group's CPU weight now.
func (g *CPUGroup) Weight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.weight
}
