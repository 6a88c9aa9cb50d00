package bench

import (
	"fmt"
	"maps"
	"slices"
	"syscall"
	"time"
)

// A run measures one system while every other system of the session is
// stopped (SIGSTOP). Running idle, the others still wake (timers, idle
// polls: S10's 128 resident caller UAPs and their node), and beside them
// Enduro/X made measurably fewer calls/s (docs/TESTING.md has the
// figures). Each system is measured as it would run on the machine by
// itself, which is what a comparison of them asks.

// holdOthers makes s the only system that runs: it continues s's
// processes if a run of another system stopped them, and stops every
// other running system's.
func holdOthers(s *system) error {
	running.Lock()
	others := slices.Collect(maps.Keys(running.set))
	running.Unlock()
	s.resume()
	for _, o := range others {
		if o == s {
			continue
		}
		if err := o.pause(); err != nil {
			return err
		}
	}
	return nil
}

// pauseWait bounds how long pause waits for the processes to show
// stopped.
const pauseWait = 2 * time.Second

// pause stops every process of the system's trees (SIGSTOP) and returns
// once /proc shows each one stopped; a process forked meanwhile is found
// at the next look and stopped too. A stopped process cannot exit or
// fork, so the pids it signalled stay the system's until resume.
func (s *system) pause() error {
	roots := s.Roots()
	deadline := time.Now().Add(pauseWait)
	for {
		stats := readStats()
		settled := true
		for _, pid := range treeIn(stats, roots) {
			switch {
			case !s.signalled(pid):
				if syscall.Kill(pid, syscall.SIGSTOP) == nil {
					s.noteStopped(pid)
				}
				settled = false
			case !stoppedState(stats[pid].State):
				settled = false
			}
		}
		if settled {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: its processes were not all stopped %v after SIGSTOP, so the run would not have the machine to itself", s.Name, pauseWait)
		}
		time.Sleep(time.Millisecond)
	}
}

// stoppedState reports whether a /proc state is one in which the process
// does not run: stopped, traced, or ended.
func stoppedState(st byte) bool {
	switch st {
	case 'T', 't', 'Z', 'X':
		return true
	}
	return false
}

func (s *system) signalled(pid int) bool {
	running.Lock()
	defer running.Unlock()
	return s.stopped[pid]
}

func (s *system) noteStopped(pid int) {
	running.Lock()
	defer running.Unlock()
	if s.stopped == nil {
		s.stopped = make(map[int]bool)
	}
	s.stopped[pid] = true
}

// resume continues what pause stopped (SIGCONT).
func (s *system) resume() {
	running.Lock()
	pids := s.stopped
	s.stopped = nil
	running.Unlock()
	for pid := range pids {
		syscall.Kill(pid, syscall.SIGCONT)
	}
}
