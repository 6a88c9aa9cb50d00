package local

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"tpsched/bpf"
	"tpsched/netio"
	"tpsched/procmgr"
)

// This file is a group's server on a node with a service policy (the
// routing manager, scd/wlmnode): procmgr's processes of the user server
// while it has one here, none otherwise. An application environment starts
// with none (Options.OnDemand), gets one when the cluster chooses this
// node (StartServer), and loses it on quiesce or when the policy drops it
// (StopServer); any other group has its server from the node's start, as
// without a policy. The group's serving flag says it takes calls here: it
// is announced and served.

// server is a group's processes that can come and go.
type server struct {
	g    *Group
	pm   ProcessManager
	spec procmgr.Spec

	inner atomic.Pointer[procBox] // nil: no server here

	// mu orders start, stop and the node's stop, and is held while stop
	// waits for the processes to leave: nothing those processes' ends run
	// takes it. Readers (Usage, from the metrics) take usageMu instead, so
	// a stop in progress never holds them up.
	mu     sync.Mutex
	closed bool // the node stops: no server starts any more

	usageMu sync.Mutex
	retired bpf.Usage // what servers that stopped used, so usage never goes back
	// What stopped servers' limits caught and their output counted, for
	// the same reason (tpsched_uap_pids_limit_hits_total and the like).
	retiredLimits procmgr.LimitStatus
	retiredOutput procmgr.OutputStats
}

type procBox struct{ p processes }

// errNoServer is what a group without a server here cannot do.
var errNoServer = errors.New("no server here")

func (e *server) cur() processes {
	if b := e.inner.Load(); b != nil {
		return b.p
	}
	return nil
}

// start starts the server: procmgr starts its resident processes (at least
// one). It fails if the node stops or the processes cannot start.
func (e *server) start() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errors.New("the node is stopping")
	}
	if e.cur() != nil {
		return nil
	}
	spec := e.spec
	spec.Resident = max(spec.Resident, 1)
	spec.Max = max(spec.Max, spec.Resident)
	p, err := e.pm.Start(spec, (*delegate)(e.g))
	if err != nil {
		return err
	}
	e.inner.Store(&procBox{p})
	return nil
}

// stop asks every process of the server to leave after the calls it holds
// and waits for them (at ctx's end they are killed); the group keeps its
// queue and shared memory for a later start.
func (e *server) stop(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	p := e.cur()
	if p == nil {
		return nil
	}
	p.Stopping() // none is replaced from now on
	for _, slot := range e.g.occupied() {
		e.g.stopSlot(slot)
	}
	err := p.Stop(ctx)
	l, o := p.Limits(), p.Output()
	e.usageMu.Lock() // one step: a reader never counts p twice
	e.retired.Add(p.Usage())
	e.retiredLimits.PidsHits += l.PidsHits
	e.retiredLimits.OOMKills += l.OOMKills
	e.retiredOutput.Lines += o.Lines
	e.retiredOutput.Dropped += o.Dropped
	e.inner.Store(nil)
	e.usageMu.Unlock()
	return err
}

// ready reports whether at least one process of the server attached.
func (e *server) ready() bool {
	if e.cur() == nil {
		return false
	}
	g := e.g
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, si := range g.slots {
		if si.p != nil && si.attached && !si.p.Left() {
			return true
		}
	}
	return false
}

// The processes interface: the server's processes while it has them.

func (e *server) Kick(waiting int) {
	if p := e.cur(); p != nil {
		p.Kick(waiting)
	}
}

func (e *server) Attached(slot, pid int) {
	if p := e.cur(); p != nil {
		p.Attached(slot, pid)
	}
}

func (e *server) Kill(slot, pid int) {
	if p := e.cur(); p != nil {
		p.Kill(slot, pid)
	}
}

func (e *server) Replace(slot int) {
	if p := e.cur(); p != nil {
		p.Replace(slot)
	}
}

// Limits are the running server's limits and gauges, with the counts of
// what its limits caught since the group's first server.
func (e *server) Limits() procmgr.LimitStatus {
	e.usageMu.Lock()
	defer e.usageMu.Unlock()
	var l procmgr.LimitStatus
	if p := e.cur(); p != nil {
		l = p.Limits()
	}
	l.PidsHits += e.retiredLimits.PidsHits
	l.OOMKills += e.retiredLimits.OOMKills
	return l
}

// Output counts the lines of every server the group had.
func (e *server) Output() procmgr.OutputStats {
	e.usageMu.Lock()
	defer e.usageMu.Unlock()
	var o procmgr.OutputStats
	if p := e.cur(); p != nil {
		o = p.Output()
	}
	o.Lines += e.retiredOutput.Lines
	o.Dropped += e.retiredOutput.Dropped
	return o
}

func (e *server) Running() (resident, nonResident int) {
	if p := e.cur(); p != nil {
		return p.Running()
	}
	return 0, 0
}

func (e *server) Processes() []procmgr.ProcInfo {
	if p := e.cur(); p != nil {
		return p.Processes()
	}
	return nil
}

func (e *server) Usage() bpf.Usage {
	e.usageMu.Lock()
	defer e.usageMu.Unlock()
	u := e.retired
	if p := e.cur(); p != nil {
		u.Add(p.Usage())
	}
	return u
}

func (e *server) CPUSample() procmgr.CPUSample {
	if p := e.cur(); p != nil {
		return p.CPUSample()
	}
	return procmgr.CPUSample{Wait: -1}
}

func (e *server) CPUGroupPath() string {
	if p := e.cur(); p != nil {
		return p.CPUGroupPath()
	}
	return ""
}

func (e *server) Stopping() {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	if p := e.cur(); p != nil {
		p.Stopping()
	}
}

func (e *server) Stop(ctx context.Context) error {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	if p := e.cur(); p != nil {
		return p.Stop(ctx)
	}
	return nil
}

// ParallelCount without a server here is what the next one starts with:
// the definition's counts, at least one resident.
func (e *server) ParallelCount() (resident, maxProcs int) {
	if p := e.cur(); p != nil {
		return p.ParallelCount()
	}
	r := max(e.spec.Resident, 1)
	return r, max(e.spec.Max, r)
}

func (e *server) SetParallelCount(resident, maxProcs int) ([]bool, error) {
	if p := e.cur(); p != nil {
		return p.SetParallelCount(resident, maxProcs)
	}
	return nil, fmt.Errorf("%s: %w (an application environment: find it, or send it a call, to start one)", e.g.name, errNoServer)
}

// SetCPUWeight changes the server's CPU weight (goal management).
func (e *server) SetCPUWeight(weight int) error {
	p := e.cur()
	if p == nil {
		return errNoServer
	}
	return setCPUWeightOf(p, weight)
}

// setCPUWeightOf changes the CPU weight of a group's processes.
func setCPUWeightOf(p processes, weight int) error {
	ws, ok := p.(interface{ SetCPUWeight(int) error })
	if !ok {
		return errors.New("the process manager cannot change CPU weights")
	}
	return ws.SetCPUWeight(weight)
}

// The group's side, for the routing manager.

// StartServer starts the group's server here and waits until a process of
// it attached, its processes fail, ctx ends or deadline passes; on failure
// the processes started are stopped again. An earlier server's failure is
// forgotten first. It does not make the group serving (SetServing).
func (g *Group) StartServer(ctx context.Context, deadline time.Time) error {
	e := g.server
	if e == nil {
		return errNoServer // a group whose server runs from the node's start: there is nothing to start
	}
	(*delegate)(g).Failing(nil) // an earlier server's failure is not this one's
	err := e.start()
	if err == nil {
		err = e.waitReady(ctx, deadline)
	}
	if err != nil {
		stopCtx, cancel := context.WithTimeout(context.Background(), UAPStopTime)
		_ = e.stop(stopCtx)
		cancel()
	}
	return err
}

// waitReady waits until the server has a process attached, its processes
// fail, ctx ends or deadline passes.
func (e *server) waitReady(ctx context.Context, deadline time.Time) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		if e.ready() {
			return nil
		}
		if err := e.g.Failure(); err != nil {
			return err
		}
		if e.cur() == nil {
			return errNoServer
		}
		if time.Now().After(deadline) {
			return errors.New("no process of the server attached in time")
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no process of the server attached: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// StopServer stops the group's server here: it waits until the group
// holds no call (at most until quiesce, or ctx ends), stops the processes
// (killed after UAPStopTime) and answers the calls still waiting with
// flushMsg ('service closed'). The group must not be serving any more
// (SetServing(false) first).
func (g *Group) StopServer(ctx context.Context, quiesce time.Duration, flushMsg string) error {
	e := g.server
	if e == nil {
		return errNoServer
	}
	deadline := time.Now().Add(quiesce)
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for g.InFlight() > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), UAPStopTime)
	err := e.stop(stopCtx)
	cancel()
	g.flush(netio.CodeServiceClosed, flushMsg)
	return err
}

// SetServing makes the group take calls here, or stop taking them, with
// its server (StartServer, StopServer).
func (g *Group) SetServing(on bool) {
	g.serving.Store(on)
	if !on {
		g.mu.Lock()
		g.revokeLanes(time.Now(), revokeClosed)
		g.mu.Unlock()
	}
}

// SetCPUWeight gives the group's processes CPU weight weight (cgroup v2
// scale; goal management). Processes that shared scdd's cpu cgroup get
// one of their own for it: the lanes granted outside the cap end.
func (g *Group) SetCPUWeight(weight int) error {
	shared := !g.inCPUGroup()
	err := setCPUWeightOf(g.procs, weight)
	if shared && g.inCPUGroup() && g.lanes.rules != nil {
		g.lanes.rules.regroups.Add(1)
	}
	return err
}

// ReplaceProcesses replaces the processes of the group's server one at a
// time: each finishes the calls it holds, leaves, and is started again (a
// new module on disk takes effect); the others serve meanwhile. A
// non-resident process is not replaced: the Multiserver rule starts
// another when calls wait. It returns how many were replaced or left.
func (g *Group) ReplaceProcesses(ctx context.Context, deadline time.Time) (int, error) {
	resident := map[int]bool{}
	for _, pi := range g.procs.Processes() {
		resident[pi.Slot] = pi.Kind == "resident"
	}
	replaced := 0
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for _, slot := range g.occupied() {
		old, _ := g.slotProc(slot)
		g.procs.Replace(slot) // an operator's action: logged and counted apart from crashes
		g.stopSlot(slot)
		if !resident[slot] {
			replaced++
			continue
		}
		for {
			p, attached := g.slotProc(slot)
			if p != nil && p != old && attached {
				replaced++
				break
			}
			if time.Now().After(deadline) {
				return replaced, fmt.Errorf("%s: slot %d has no new process attached in time", g.name, slot)
			}
			select {
			case <-ctx.Done():
				return replaced, fmt.Errorf("%s: slot %d: %w", g.name, slot, ctx.Err())
			case <-t.C:
			}
		}
	}
	return replaced, nil
}

// occupied lists the slots that have a process.
func (g *Group) occupied() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []int
	for slot, si := range g.slots {
		if si.p != nil {
			out = append(out, slot)
		}
	}
	return out
}

// slotProc is the process in slot and whether it attached.
func (g *Group) slotProc(slot int) (proc, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	si := &g.slots[slot]
	return si.p, si.attached
}
