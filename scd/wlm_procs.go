package scd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"tpsched/bpf"
	"tpsched/procmgr"
)

// envProcs are a group's processes on a node with a service policy: its
// server (procmgr's processes of the user server) while it has one here,
// none otherwise. An application environment starts with none, gets one
// when the cluster chooses this node (start), and loses it on quiesce or
// when the policy drops it (stop); any other group has its server from the
// node's start, as without a policy. serving says the group takes calls
// here: it is announced and served.
type envProcs struct {
	g    *group
	pm   processManager
	spec procmgr.Spec

	inner   atomic.Pointer[procBox] // nil: no server here
	serving atomic.Bool

	mu      sync.Mutex // orders start, stop and the node's stop
	closed  bool       // the node stops: no server starts any more
	retired bpf.Usage  // what servers that stopped used, so usage never goes back
}

type procBox struct{ p processes }

var errNoServer = errors.New("no server here")

func (e *envProcs) cur() processes {
	if b := e.inner.Load(); b != nil {
		return b.p
	}
	return nil
}

// start starts the server: procmgr starts its resident processes (at least
// one). It fails if the node stops or the processes cannot start.
func (e *envProcs) start() error {
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
	p, err := e.pm.Start(spec, e.g)
	if err != nil {
		return err
	}
	e.inner.Store(&procBox{p})
	return nil
}

// stop asks every process of the server to leave after the calls it holds
// and waits for them (at ctx's end they are killed); the group keeps its
// queue and shared memory for a later start.
func (e *envProcs) stop(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	p := e.cur()
	if p == nil {
		return nil
	}
	p.Stopping() // none is replaced from now on
	for _, slot := range e.g.occupied() {
		e.g.Stop(slot)
	}
	err := p.Stop(ctx)
	e.retired.Add(p.Usage())
	e.inner.Store(nil)
	return err
}

// ready reports whether at least one process of the server attached.
func (e *envProcs) ready() bool {
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

// occupied lists the slots that have a process.
func (g *group) occupied() []int {
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

// The processes interface.

func (e *envProcs) Kick(waiting int) {
	if p := e.cur(); p != nil {
		p.Kick(waiting)
	}
}

func (e *envProcs) Attached(slot int) {
	if p := e.cur(); p != nil {
		p.Attached(slot)
	}
}

func (e *envProcs) Kill(slot int) {
	if p := e.cur(); p != nil {
		p.Kill(slot)
	}
}

// replace tells procmgr that the process in slot leaves at the operator's
// request (scdctl refresh), so that its end is not taken for a crash.
func (e *envProcs) replace(slot int) {
	if p, ok := e.cur().(interface{ Replace(slot int) }); ok {
		p.Replace(slot)
	}
}

func (e *envProcs) Running() (resident, nonResident int) {
	if p := e.cur(); p != nil {
		return p.Running()
	}
	return 0, 0
}

func (e *envProcs) Processes() []procmgr.ProcInfo {
	if p := e.cur(); p != nil {
		return p.Processes()
	}
	return nil
}

func (e *envProcs) Usage() bpf.Usage {
	e.mu.Lock()
	u := e.retired
	e.mu.Unlock()
	if p := e.cur(); p != nil {
		u.Add(p.Usage())
	}
	return u
}

func (e *envProcs) CPUSample() procmgr.CPUSample {
	if p := e.cur(); p != nil {
		return p.CPUSample()
	}
	return procmgr.CPUSample{Wait: -1}
}

func (e *envProcs) CPUGroupPath() string {
	if p := e.cur(); p != nil {
		return p.CPUGroupPath()
	}
	return ""
}

func (e *envProcs) Limits() procmgr.LimitStatus {
	if p := e.cur(); p != nil {
		return p.Limits()
	}
	return procmgr.LimitStatus{}
}

func (e *envProcs) Output() procmgr.OutputStats {
	if p := e.cur(); p != nil {
		return p.Output()
	}
	return procmgr.OutputStats{}
}

func (e *envProcs) Stopping() {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	if p := e.cur(); p != nil {
		p.Stopping()
	}
}

func (e *envProcs) Stop(ctx context.Context) error {
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
func (e *envProcs) ParallelCount() (resident, maxProcs int) {
	if p := e.cur(); p != nil {
		return p.ParallelCount()
	}
	r := max(e.spec.Resident, 1)
	return r, max(e.spec.Max, r)
}

func (e *envProcs) SetParallelCount(resident, maxProcs int) ([]bool, error) {
	if p := e.cur(); p != nil {
		return p.SetParallelCount(resident, maxProcs)
	}
	return nil, fmt.Errorf("%s: %w (an application environment: find it, or send it a call, to start one)", e.g.name, errNoServer)
}

// SetCPUWeight changes the server's CPU weight (goal management).
func (e *envProcs) SetCPUWeight(weight int) error {
	p := e.cur()
	if p == nil {
		return errNoServer
	}
	ws, ok := p.(interface{ SetCPUWeight(int) error })
	if !ok {
		return errors.New("the process manager cannot change CPU weights")
	}
	return ws.SetCPUWeight(weight)
}

// setCPUWeightOf changes the CPU weight of a group's processes.
func setCPUWeightOf(p processes, weight int) error {
	ws, ok := p.(interface{ SetCPUWeight(int) error })
	if !ok {
		return errors.New("the process manager cannot change CPU weights")
	}
	return ws.SetCPUWeight(weight)
}

// servable reports whether g takes calls here: always without a service
// policy; with one, while it has a server here that is not quiescing.
func (g *group) servable() bool {
	if !g.started.Load() {
		return !g.envAtStart // its calls wait for its processes
	}
	e, ok := g.procs.(*envProcs)
	return !ok || e.serving.Load()
}

// waitReady waits until the server has a process attached, its processes
// fail, or deadline.
func (e *envProcs) waitReady(deadline time.Time) error {
	for {
		if e.ready() {
			return nil
		}
		if err := e.g.failing.Load(); err != nil {
			return *err
		}
		if e.cur() == nil {
			return errNoServer
		}
		if time.Now().After(deadline) {
			return errors.New("no process of the server attached in time")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
