package procmgr

import (
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// scaledServer starts a server of "sleep" children whose queue depth the
// test sets; every process looks busy, so each waiting request counts.
func scaledServer(t *testing.T, m *Manager, name string, prio, resident, maxProcs int, depth *atomic.Int64) *Server {
	t.Helper()
	sp := uapSpec("sleep", t.TempDir(), resident)
	sp.Server, sp.Group = name, name
	sp.Max, sp.BalanceCount, sp.Priority, sp.IdleStop = maxProcs, 0, prio, time.Hour
	return startServer(t, m, sp, &hooks{
		file:    devNull(t),
		waiting: func() int { return int(depth.Load()) },
		slot:    func(int) SlotView { return SlotView{Busy: true, Ready: true} },
	})
}

func devNull(t *testing.T) *os.File {
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func quietManager(t *testing.T, opts Options) *Manager {
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	opts.CPUParent = uniqueParent()
	opts.CheckInterval = time.Hour // checks only when the test says
	m := New(opts)
	t.Cleanup(m.Close)
	return m
}

// With room for one more process on the node, the server of higher
// priority gets it, whichever asked first.
func TestScalerNodeCapPriority(t *testing.T) {
	m := quietManager(t, Options{NodeCap: 3})
	var lowDepth, highDepth atomic.Int64
	low := scaledServer(t, m, "low", 16, 1, 3, &lowDepth)
	high := scaledServer(t, m, "high", 1, 1, 3, &highDepth)
	lowDepth.Store(5)
	highDepth.Store(5)
	m.check(time.Now())
	if _, n := high.Running(); n != 1 {
		t.Errorf("high priority server has %d non-resident processes, want 1", n)
	}
	if _, n := low.Running(); n != 0 {
		t.Errorf("low priority server has %d non-resident processes, want 0 (node cap 3)", n)
	}
}

// While the memory gate is closed, each non-resident exit lets exactly one
// waiting start go ahead.
func TestScalerMemoryGatePermits(t *testing.T) {
	var avail atomic.Int64
	avail.Store(1 << 40)
	m := quietManager(t, Options{MemoryReserve: 1 << 30, MemAvailable: func() (int64, error) { return avail.Load(), nil }})
	var depth atomic.Int64
	srv := scaledServer(t, m, "gated", 8, 1, 4, &depth)
	depth.Store(1)
	m.check(time.Now())
	if _, n := srv.Running(); n != 1 {
		t.Fatalf("gate open: %d non-resident processes, want 1", n)
	}
	avail.Store(1 << 20) // under the reserve: the gate closes
	depth.Store(5)
	m.check(time.Now())
	if _, n := srv.Running(); n != 1 || !m.Stats().MemoryGateClosed || m.Stats().MemoryGateHolds == 0 {
		t.Fatalf("gate closed: %d non-resident processes, stats %+v; want 1 and the gate holding", n, m.Stats())
	}
	var pid, slot int
	for _, p := range srv.Processes() {
		if p.Kind == "nonresident" {
			pid, slot = p.PID, p.Slot
		}
	}
	// The rule's stop, as the queue would carry it out. (A crash would
	// hold the next start back by the crash back-off instead.)
	srv.stopNonResident(slot)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The exit grants one permit and kicks the scaler.
	waitUntil(t, "a replacement after the exit", func() bool {
		ps := srv.Processes()
		for _, p := range ps {
			if p.Kind == "nonresident" && p.PID != 0 && p.PID != pid {
				return true
			}
		}
		return false
	})
	m.check(time.Now())
	if _, n := srv.Running(); n != 1 {
		t.Fatalf("after one exit under a closed gate: %d non-resident processes, want exactly 1", n)
	}
	if got := m.Stats().NonResidentStarts; got != 2 {
		t.Fatalf("%d non-resident starts, want 2", got)
	}
}

// A quiet node's scaler looks once every idleCheckInterval, not every
// CheckInterval: its check has nothing to decide, and twenty a second were
// the largest part of an idle scdd's CPU (issue 28). A waiting call makes
// the checks frequent again, and so does a non-resident process to track.
func TestScalerIdleChecksAreRare(t *testing.T) {
	opts := Options{
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		CPUParent: uniqueParent(),
	}
	m := New(opts) // the default CheckInterval
	t.Cleanup(m.Close)
	var depth, looks atomic.Int64
	sp := uapSpec("sleep", t.TempDir(), 1)
	sp.Max, sp.IdleStop = 1, time.Hour // resident only: no room to start
	startServer(t, m, sp, &hooks{
		file:    devNull(t),
		waiting: func() int { looks.Add(1); return int(depth.Load()) },
		slot:    func(int) SlotView { return SlotView{Busy: true, Ready: true} },
	})
	if m.check(time.Now()) {
		t.Fatal("check of a server with nothing waiting and no non-resident process asks to look again soon")
	}
	// Counted over a span of the loop's own making: a slow machine only
	// makes fewer checks.
	looks.Store(0)
	time.Sleep(2 * time.Second)
	if n := looks.Load(); n > 2*int64(2*time.Second/idleCheckInterval) {
		t.Errorf("idle: %d checks in 2 s, want at most %d (one per %v)", n, 2*int64(2*time.Second/idleCheckInterval), idleCheckInterval)
	}
	depth.Store(3)
	if !m.check(time.Now()) {
		t.Fatal("check of a server with calls waiting does not ask to look again soon")
	}
	// The next check is at most idleCheckInterval away; from then on they
	// come every CheckInterval.
	waitUntil(t, "checks every CheckInterval while calls wait", func() bool {
		looks.Store(0)
		time.Sleep(time.Second)
		return looks.Load() >= 5
	})
	depth.Store(0)
	sp2 := uapSpec("sleep", t.TempDir(), 0)
	sp2.Server, sp2.Group, sp2.Max, sp2.IdleStop = "nonres", "nonres", 1, time.Hour
	var depth2 atomic.Int64
	depth2.Store(1)
	nr := startServer(t, m, sp2, &hooks{
		file:    devNull(t),
		waiting: func() int { return int(depth2.Load()) },
		slot:    func(int) SlotView { return SlotView{Ready: true} },
	})
	m.check(time.Now()) // starts the non-resident process
	depth2.Store(0)
	if _, n := nr.Running(); n != 1 {
		t.Fatalf("%d non-resident processes, want 1", n)
	}
	if !m.check(time.Now()) {
		t.Error("check with a non-resident process to track for idling does not ask to look again soon")
	}
}
