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
	return s.cpu.SetWeight(weight, func() []int {
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
		// On v1 these are moved into a cgroup made now (nice is set by
		// pid, on reaped processes only): the children the processes
		// forked go too, found in the server's other cgroups.
		if s.cpu.c.mech == MechanismCgroup1 {
			if members, err := s.box.members(); err == nil {
				pids = append(pids, members...)
			}
		}
		return pids
	})
}

// beforeRenice, when set by a test, runs in SetCPUWeight for each pid
// between taking the slots' processes and setting their weight.
var beforeRenice atomic.Pointer[func(pid int)]

// CPUWeight is the server's CPU weight now (cgroup v2 scale).
func (s *Server) CPUWeight() int { return s.cpu.Weight() }

// SetWeight changes the group's weight. pids lists the processes (nil:
// none): with nice, those whose threads get the new nice value (new
// processes get it at start); with a shared group (NewSharedGroup), those
// moved into the cgroup it makes now, whatever the weight (a weight was
// asked for). It is called after the cgroup exists, so that a process
// started meanwhile is either listed or started in it (joinOwn).
func (g *CPUGroup) SetWeight(weight int, pids func() []int) error {
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
		return g.moveIn(pids())
	case g.c.mech == MechanismCgroup1:
		return writeCgroupFile(filepath.Join(dir, "cpu.shares"), strconv.Itoa(Shares(weight)))
	case g.c.mech == MechanismCgroup2:
		if !g.c.weight {
			return nil
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

// moveIn moves pids into the group's cgroup, made just now; one that
// exited meanwhile is no error.
func (g *CPUGroup) moveIn(pids []int) error {
	var errs []error
	for _, pid := range pids {
		if err := g.writeProcs(pid); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Weight is the group's CPU weight now.
func (g *CPUGroup) Weight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.weight
}
