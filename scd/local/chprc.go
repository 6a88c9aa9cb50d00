package local

// This file is the operator's view and change of a group's processes:
// `scdctl prc` (OpenTP1's prcls: the processes, what each does and has
// used) and `scdctl chprc GROUP RESIDENT[,MAX]` (OpenTP1's scdchprc: the
// resident and maximum process counts changed while the server runs), both
// control actions of the node's control socket (scd/control.go).

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"tpsched/netio"
	"tpsched/scd/def"
)

// GroupProcesses is one group's processes, as `scdctl prc` shows them.
type GroupProcesses struct {
	Group  string        `json:"group"`
	Server string        `json:"server"`
	Count  ParallelCount `json:"parallel_count"`         // now
	Def    ParallelCount `json:"defined_parallel_count"` // in the definition
	// Processes are the resident slots (with or without a process) and
	// the non-resident processes running.
	Processes []ProcessStatus `json:"processes"`
}

// ParallelCount is parallel_count = resident,max.
type ParallelCount struct {
	Resident int `json:"resident"`
	Max      int `json:"max"`
}

func (p ParallelCount) String() string { return fmt.Sprintf("%d,%d", p.Resident, p.Max) }

// ChprcResult answers a chprc: the counts before and after, and the
// processes now (new residents may still be starting, surplus ones still
// finishing their call).
type ChprcResult struct {
	GroupProcesses
	Before ParallelCount `json:"before"`
}

func parallelCount(g *Group) ParallelCount {
	r, m := g.procs.ParallelCount()
	return ParallelCount{Resident: r, Max: m}
}

func processList(g *Group) GroupProcesses {
	return GroupProcesses{Group: g.name, Server: g.def.Name, Count: parallelCount(g),
		Def: ParallelCount{Resident: g.def.Resident, Max: g.def.MaxProcesses}, Processes: processStatuses(g)}
}

// NotKeptByRestart lists what a restart, whose new process reads the
// definitions afresh, does not keep: the groups held now (scdctl hold)
// and those whose parallel_count is not their definition's (scdctl
// chprc), in the order of the definitions.
func (s *Scheduler) NotKeptByRestart() (held, changed []string) {
	for _, g := range s.order {
		if g.held.Load() {
			held = append(held, g.name)
		}
		if c := parallelCount(g); c.Resident != g.def.Resident || c.Max != g.def.MaxProcesses {
			changed = append(changed, g.name)
		}
	}
	return held, changed
}

// Processes lists the processes of group, or of every group when group is
// empty; a group that is not here is a 'no such service group' error.
func (s *Scheduler) Processes(group string) ([]GroupProcesses, error) {
	if group == "" {
		out := make([]GroupProcesses, 0, len(s.order))
		for _, g := range s.order {
			out = append(out, processList(g))
		}
		return out, nil
	}
	g := s.groups[group]
	if g == nil {
		return nil, &netio.Error{Code: netio.CodeNoSuchGroup, Message: s.UnknownGroup(group)}
	}
	return []GroupProcesses{processList(g)}, nil
}

// chprcMu lets one chprc at a time change counts and then tell the
// schedule queue which slots are resident, so the queue ends with the
// kinds of the last change. chprc is rare; one lock for the process is
// enough.
var chprcMu sync.Mutex

// ErrChprc marks a chprc the node refuses: a limit, or a kind of server
// whose processes cannot change.
var ErrChprc = errors.New("chprc refused")

// ChangeProcesses changes group's parallel_count while it runs (OpenTP1's
// scdchprc): resident processes now, and the most processes (maxProcs < 0
// keeps the maximum as it is, raised to resident if that is more). Extra residents start at once; surplus
// ones stop after their current call; calls are never failed by it. The
// change lasts until the node stops: the definition is not written. Refused,
// with nothing changed: a group that is not here, a socket-receiving server
// (exactly one process), a count above the definition's maximum, more
// residents than the maximum, residents with scd_refresh_process, or
// residents over the node's max_processes.
func (s *Scheduler) ChangeProcesses(group string, resident, maxProcs int) (ChprcResult, error) {
	g := s.groups[group]
	if g == nil {
		return ChprcResult{}, &netio.Error{Code: netio.CodeNoSuchGroup, Message: s.UnknownGroup(group)}
	}
	if g.def.ReceiveFrom == def.ReceiveSocket {
		return ChprcResult{}, fmt.Errorf("%w: %s: a socket-receiving server runs exactly one process (receive_from = socket)", ErrChprc, group)
	}
	res, startErr, err := s.changeProcesses(g, resident, maxProcs)
	if err != nil {
		return ChprcResult{}, err
	}
	// Logged after chprcMu is let go, as everywhere a lock is held: a log
	// write waits for stderr.
	if res.Count != res.Before {
		s.log.Info("chprc: parallel_count changed", "group", group, "server", g.def.Name,
			"from", res.Before.String(), "to", res.Count.String())
	}
	if startErr != nil {
		// The change is made; a process did not start and is retried.
		s.log.Warn("chprc: a new resident process did not start; retrying with back-off", "group", group, "err", startErr)
	}
	return res, nil
}

// changeProcesses is ChangeProcesses' change under chprcMu; startErr is
// a new resident that did not start, the change made.
func (s *Scheduler) changeProcesses(g *Group, resident, maxProcs int) (res ChprcResult, startErr, err error) {
	chprcMu.Lock()
	defer chprcMu.Unlock()
	before := parallelCount(g)
	if maxProcs < 0 {
		maxProcs = max(before.Max, resident) // "chprc g 4" asks for 4 residents: room for them
	}
	// Without g.mu: procmgr calls back into the group (Stop).
	kinds, err := g.procs.SetParallelCount(resident, maxProcs)
	if kinds == nil {
		if err == nil {
			err = errors.New("no change made")
		}
		return ChprcResult{}, nil, fmt.Errorf("%w: %s", ErrChprc, strings.TrimPrefix(err.Error(), "procmgr: "))
	}
	g.mu.Lock()
	for slot, r := range kinds {
		g.q.SetResident(slot, r)
	}
	g.mu.Unlock()
	return ChprcResult{GroupProcesses: processList(g), Before: before}, err, nil
}
