package procmgr

import (
	"errors"
	"fmt"
	"slices"
)

// This file is the online change of a server's process counts: OpenTP1's
// scdchprc, tpsched's `scdctl chprc GROUP RESIDENT[,MAX]`.

// ParallelCount is the server's parallel_count now: the definition's, or
// what SetParallelCount made it.
func (s *Server) ParallelCount() (resident, maxProcs int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resident, int(s.maxProcs.Load())
}

// Slots is the most processes the server can ever have: the maximum of
// parallel_count in its definition, which sized its schedule queue.
func (s *Server) Slots() int { return len(s.slots) }

// SetParallelCount changes the server's resident and maximum process
// counts while it runs, until the server stops (the definition is not
// written). The limits are checked first, and nothing changes when one
// fails: 0 <= resident <= maxProcs, 1 <= maxProcs <= Slots (the schedule
// queue and the shared memory have that many process slots), no resident
// process with scd_refresh_process, and the residents of all the node's
// servers within max_processes.
//
// More residents: running non-resident processes become resident first
// (they stay; none that was asked to stop), then new processes start in
// free slots. Fewer: the surplus resident processes (those waiting out a
// restart back-off first, then the highest slots) are asked to stop after
// the call in hand, through the Delegate's Stop, and are not replaced. A
// lower maximum asks the non-resident processes above it to stop the same
// way. The calls they hold are never failed.
//
// It returns, by slot, whether each serves a resident process now, for the
// schedule queue's residents-first order. An error after the change (a new
// process could not start) leaves the change made: that slot is retried
// with the restart back-off, as a resident that died.
func (s *Server) SetParallelCount(resident, maxProcs int) ([]bool, error) {
	start, stop, kinds, err := s.changeCounts(resident, maxProcs)
	if err != nil {
		return nil, err
	}
	// Without procmgr's locks, as the Delegate's contract says: its Stop
	// and Prepare may call back into the manager. A change that comes
	// meanwhile finds the counts already changed; a slot it takes back is
	// skipped below (errNotResident).
	// Debug: the scheduler logs the change an operator made (scd/local).
	s.m.log.Debug("parallel_count changed", "server", s.spec.Server, "resident", resident, "max", maxProcs,
		"starting", len(start), "stopping", len(stop))
	for _, slot := range stop {
		s.delegate.Stop(slot)
	}
	var errs []error
	for _, sl := range start {
		if err := s.spawn(sl, true); err != nil {
			if errors.Is(err, errStopping) || errors.Is(err, errNotResident) {
				continue // a stop or another change came first
			}
			errs = append(errs, err)
			s.startFailed(err)
			go func() {
				backoff := minBackoff
				if s.restart(sl, &backoff) {
					s.watch(sl)
				}
			}()
			continue
		}
		go s.watch(sl)
	}
	return kinds, errors.Join(errs...)
}

// changeCounts checks and makes the change of SetParallelCount under
// Manager.chprc (one change at a time node-wide, for the residents of
// every server against max_processes) and the server's lock, and returns
// the slots whose processes are to start and to stop, and every slot's
// kind.
func (s *Server) changeCounts(resident, maxProcs int) (start []*slot, stop []int, kinds []bool, err error) {
	s.m.chprc.Lock()
	defer s.m.chprc.Unlock()
	if err := s.checkParallelCount(resident, maxProcs); err != nil {
		return nil, nil, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return nil, nil, nil, fmt.Errorf("procmgr: %s: the server is stopping", s.spec.Server)
	}
	if resident > s.resident {
		start = s.promote(resident - s.resident)
	} else {
		stop = s.demote(s.resident - resident)
	}
	s.resident = resident
	s.residents.Store(int32(resident))
	s.maxProcs.Store(int32(maxProcs))
	stop = append(stop, s.trim(maxProcs, len(start))...)
	kinds = make([]bool, len(s.slots))
	for i, sl := range s.slots {
		kinds[i] = sl.resident
	}
	return start, stop, kinds, nil
}

// checkParallelCount checks a new parallel_count against the definition and
// the node.
func (s *Server) checkParallelCount(resident, maxProcs int) error {
	switch {
	case resident < 0 || maxProcs < 1:
		return fmt.Errorf("procmgr: %s: parallel_count %d,%d: want at least 0 resident processes and a maximum of at least 1",
			s.spec.Server, resident, maxProcs)
	case resident > maxProcs:
		return fmt.Errorf("procmgr: %s: parallel_count %d,%d: more resident processes than the maximum",
			s.spec.Server, resident, maxProcs)
	case maxProcs > len(s.slots):
		return fmt.Errorf("procmgr: %s: parallel_count %d,%d: above %d, the maximum of parallel_count in its definition "+
			"(the schedule queue was made with that many process slots; raise it in the definition and restart the node)",
			s.spec.Server, resident, maxProcs, len(s.slots))
	case s.spec.Refresh && resident > 0:
		return fmt.Errorf("procmgr: %s: parallel_count %d,%d: scd_refresh_process = Y replaces each process after one call, so it has no resident process",
			s.spec.Server, resident, maxProcs)
	}
	if limit := s.m.opts.NodeCap; limit > 0 {
		others := 0
		s.m.mu.Lock()
		for _, o := range s.m.servers {
			if o != s {
				others += int(o.residents.Load())
			}
		}
		s.m.mu.Unlock()
		if others+resident > limit {
			return fmt.Errorf("procmgr: %s: parallel_count %d,%d: the node's max_processes is %d and its other servers keep %d resident processes",
				s.spec.Server, resident, maxProcs, limit, others)
		}
	}
	return nil
}

// promote makes n more slots resident: running non-resident processes
// first, then free slots, then any other (one starting, or asked to stop:
// its watcher restarts it). It returns the slots that need a process
// started. Under mu.
func (s *Server) promote(n int) []*slot {
	rank := func(sl *slot) int {
		switch {
		case sl.proc != nil && !sl.stopAsked:
			return 0
		case !sl.watched:
			return 1
		}
		return 2
	}
	var cands []*slot
	for _, sl := range s.slots {
		if !sl.resident {
			cands = append(cands, sl)
		}
	}
	slices.SortStableFunc(cands, func(a, b *slot) int { return rank(a) - rank(b) })
	var start []*slot
	for _, sl := range cands[:min(n, len(cands))] {
		sl.resident = true
		if !sl.watched {
			sl.watched, sl.state = true, StateStarting
			start = append(start, sl)
		}
	}
	return start
}

// demote makes n resident slots non-resident: those with no process (in a
// restart back-off) first, then the highest. Their processes are asked to
// stop; the slots are returned for the Delegate's Stop. Under mu.
func (s *Server) demote(n int) []int {
	var cands []*slot
	for i := len(s.slots) - 1; i >= 0; i-- {
		if sl := s.slots[i]; sl.resident {
			cands = append(cands, sl)
		}
	}
	slices.SortStableFunc(cands, func(a, b *slot) int {
		return btoi(a.proc != nil) - btoi(b.proc != nil)
	})
	var stop []int
	for _, sl := range cands[:min(n, len(cands))] {
		sl.resident = false
		if sl.proc != nil && !sl.stopAsked {
			sl.stopAsked, sl.state = true, StateStopping
			stop = append(stop, sl.index)
		}
	}
	return stop
}

// trim asks non-resident processes to stop, the highest slots first, until
// no more than maxProcs stay (starting counts processes about to start).
// Under mu.
func (s *Server) trim(maxProcs, starting int) []int {
	staying := starting
	for _, sl := range s.slots {
		if sl.proc != nil && !sl.stopAsked {
			staying++
		}
	}
	var stop []int
	for i := len(s.slots) - 1; i >= 0 && staying > maxProcs; i-- {
		sl := s.slots[i]
		if sl.resident || sl.proc == nil || sl.stopAsked {
			continue
		}
		sl.stopAsked, sl.state = true, StateStopping
		stop = append(stop, sl.index)
		staying--
	}
	return stop
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
