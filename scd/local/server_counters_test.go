package local

import (
	"context"
	"testing"

	"tpsched/procmgr"
)

// countingProcesses is a server's processes whose counters are set by
// the test: one per procmgr.Start, as a real server's are its own.
type countingProcesses struct {
	fakeProcesses
	limits procmgr.LimitStatus
	output procmgr.OutputStats
}

func (c *countingProcesses) Limits() procmgr.LimitStatus { return c.limits }
func (c *countingProcesses) Output() procmgr.OutputStats { return c.output }

// countingPM starts countingProcesses, each with the counts next gives.
type countingPM struct {
	started []*countingProcesses
	next    countingProcesses
}

func (m *countingPM) Start(procmgr.Spec, procmgr.Delegate) (Processes, error) {
	p := &countingProcesses{limits: m.next.limits, output: m.next.output}
	m.started = append(m.started, p)
	return p, nil
}
func (m *countingPM) CPUStatus() procmgr.CPUStatus       { return procmgr.CPUStatus{} }
func (m *countingPM) Containment() procmgr.ContainStatus { return procmgr.ContainStatus{} }
func (m *countingPM) Stats() procmgr.Stats               { return procmgr.Stats{} }
func (m *countingPM) Close()                             {}

// TestServerCountersSurviveItsStop: a group whose server the routing
// manager stops and starts again serves tpsched_uap_pids_limit_hits_total,
// tpsched_uap_oom_kills_total and tpsched_uap_output_{,dropped_}lines_total
// from the server's counters. They read 0 while no server ran and started
// from 0 with the next one: counters that went down. What stopped servers
// counted is kept now, as their CPU time was; the gauges (tasks, memory)
// are the running server's alone.
func TestServerCountersSurviveItsStop(t *testing.T) {
	pm := &countingPM{}
	e := &server{g: &Group{}, pm: pm}
	pm.next.limits = procmgr.LimitStatus{PidsHits: 3, OOMKills: 1, Pids: 7, Memory: 4096}
	pm.next.output = procmgr.OutputStats{Lines: 10, Dropped: 2}
	if err := e.start(); err != nil {
		t.Fatal(err)
	}
	if err := e.stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	l, o := e.Limits(), e.Output()
	if l.PidsHits != 3 || l.OOMKills != 1 || o.Lines != 10 || o.Dropped != 2 {
		t.Errorf("stopped: limits %+v, output %+v; want the stopped server's counts", l, o)
	}
	if l.Pids != 0 || l.Memory != 0 {
		t.Errorf("stopped: %d tasks, %d bytes; want none", l.Pids, l.Memory)
	}
	pm.next.limits = procmgr.LimitStatus{PidsHits: 1, OOMKills: 0, Pids: 2, Memory: 100}
	pm.next.output = procmgr.OutputStats{Lines: 5, Dropped: 0}
	if err := e.start(); err != nil {
		t.Fatal(err)
	}
	l, o = e.Limits(), e.Output()
	if l.PidsHits != 4 || l.OOMKills != 1 || o.Lines != 15 || o.Dropped != 2 {
		t.Errorf("started again: limits %+v, output %+v; want both servers' counts", l, o)
	}
	if l.Pids != 2 || l.Memory != 100 {
		t.Errorf("started again: %d tasks, %d bytes; want the running server's 2, 100", l.Pids, l.Memory)
	}
}
