package procmgr

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// stopRecorder is a Delegate's Stop that records the slots asked to stop
// and ends their processes, as a UAP leaves after its call.
type stopRecorder struct {
	srv   atomic.Pointer[Server]
	mu    sync.Mutex
	slots []int
}

func (r *stopRecorder) stop(slot int) {
	r.mu.Lock()
	r.slots = append(r.slots, slot)
	r.mu.Unlock()
	for _, p := range r.srv.Load().Processes() {
		if p.Slot == slot && p.PID > 0 {
			_ = syscall.Kill(p.PID, syscall.SIGTERM)
		}
	}
}

func (r *stopRecorder) asked() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.slots)
}

// chprcServer starts a server of "sleep" children: resident,maxProcs,
// balance_count 0, never idle-stopped, every process busy, depth waiting.
func chprcServer(t *testing.T, m *Manager, name string, resident, maxProcs int, depth *atomic.Int64) (*Server, *stopRecorder) {
	t.Helper()
	rec := &stopRecorder{}
	sp := uapSpec("sleep", t.TempDir(), resident)
	sp.Server, sp.Group = name, name
	sp.Max, sp.IdleStop = maxProcs, time.Hour
	srv := startServer(t, m, sp, &hooks{
		file:    devNull(t),
		waiting: func() int { return int(depth.Load()) },
		slot:    func(int) SlotView { return SlotView{Busy: true, Ready: true} },
		stop:    rec.stop,
	})
	rec.srv.Store(srv)
	return srv, rec
}

// byKind maps each running process's slot to its pid, by kind.
func byKind(srv *Server) (resident, nonResident map[int]int) {
	resident, nonResident = map[int]int{}, map[int]int{}
	for _, p := range srv.Processes() {
		if p.PID == 0 {
			continue
		}
		if p.Kind == "resident" {
			resident[p.Slot] = p.PID
		} else {
			nonResident[p.Slot] = p.PID
		}
	}
	return resident, nonResident
}

func wantRunning(t *testing.T, srv *Server, res, nonRes int) {
	t.Helper()
	waitUntil(t, "the processes to settle", func() bool {
		r, n := byKind(srv)
		a, b := srv.Running()
		return len(r) == res && len(n) == nonRes && a == res && b == nonRes
	})
}

// TestSetParallelCountStartsAndStopsResidents: more residents start at
// once in free slots; fewer ask the surplus to stop (the highest slots
// first), and they are not replaced.
func TestSetParallelCountStartsAndStopsResidents(t *testing.T) {
	t.Parallel()
	var depth atomic.Int64
	srv, rec := chprcServer(t, quietManager(t, Options{}), "grow", 1, 4, &depth)
	wantRunning(t, srv, 1, 0)
	first, _ := byKind(srv)

	kinds, err := srv.SetParallelCount(3, 4)
	if err != nil {
		t.Fatalf("SetParallelCount(3, 4): %v", err)
	}
	if !slices.Equal(kinds, []bool{true, true, true, false}) {
		t.Errorf("kinds %v, want slots 0-2 resident", kinds)
	}
	wantRunning(t, srv, 3, 0)
	if r, m := srv.ParallelCount(); r != 3 || m != 4 {
		t.Errorf("ParallelCount() = %d,%d, want 3,4", r, m)
	}
	grown, _ := byKind(srv)
	if grown[0] != first[0] {
		t.Errorf("slot 0's process changed (%d -> %d): a change must not touch running residents", first[0], grown[0])
	}

	kinds, err = srv.SetParallelCount(1, 4)
	if err != nil {
		t.Fatalf("SetParallelCount(1, 4): %v", err)
	}
	if !slices.Equal(kinds, []bool{true, false, false, false}) {
		t.Errorf("kinds %v, want slot 0 resident", kinds)
	}
	if got := rec.asked(); !slices.Equal(got, []int{2, 1}) {
		t.Errorf("Stop asked for slots %v, want [2 1]", got)
	}
	wantRunning(t, srv, 1, 0)
	time.Sleep(3 * minBackoff) // longer than a restart's back-off
	if r, n := srv.Running(); r != 1 || n != 0 {
		t.Errorf("after the stop: %d resident, %d non-resident running; the stopped residents were replaced", r, n)
	}
	if left, _ := byKind(srv); left[0] != first[0] {
		t.Errorf("slot 0's process changed: %d -> %d", first[0], left[0])
	}
	for _, p := range srv.Processes() {
		if p.Restarts != 0 {
			t.Errorf("slot %d counts %d restarts: a stop asked by chprc is no crash", p.Slot, p.Restarts)
		}
	}
}

// TestSetParallelCountPromotesRunningNonResident: a running non-resident
// process becomes resident without a new process, and from then on it is
// replaced when it dies; a lower maximum stops the non-resident processes
// above it after their calls.
func TestSetParallelCountPromotesRunningNonResident(t *testing.T) {
	t.Parallel()
	m := quietManager(t, Options{})
	var depth atomic.Int64
	srv, rec := chprcServer(t, m, "promote", 1, 3, &depth)
	wantRunning(t, srv, 1, 0)
	depth.Store(5)
	m.check(time.Now()) // balance_count 0: two non-resident processes
	wantRunning(t, srv, 1, 2)
	depth.Store(0)
	_, before := byKind(srv)

	if _, err := srv.SetParallelCount(2, 3); err != nil {
		t.Fatalf("SetParallelCount(2, 3): %v", err)
	}
	wantRunning(t, srv, 2, 1)
	res, non := byKind(srv)
	promoted := -1
	for slot, pid := range res {
		if slot != 0 {
			promoted = slot
			if before[slot] != pid {
				t.Errorf("slot %d became resident with a new process %d (was %d): the running one should stay", slot, pid, before[slot])
			}
		}
	}
	if len(non) != 1 || len(rec.asked()) != 0 {
		t.Errorf("non-resident %v, stops asked %v: want one left running and nothing stopped", non, rec.asked())
	}

	// The promoted process dies: as a resident, it is replaced.
	victim := res[promoted]
	must(t, syscall.Kill(victim, syscall.SIGKILL))
	waitUntil(t, "the promoted slot to be restarted", func() bool {
		r, _ := byKind(srv)
		return r[promoted] != 0 && r[promoted] != victim
	})

	// A maximum of 2: the non-resident process above it is asked to stop.
	if _, err := srv.SetParallelCount(2, 2); err != nil {
		t.Fatalf("SetParallelCount(2, 2): %v", err)
	}
	var nonSlot int
	for slot := range non {
		nonSlot = slot
	}
	if got := rec.asked(); !slices.Equal(got, []int{nonSlot}) {
		t.Errorf("Stop asked for %v, want the non-resident slot %d", got, nonSlot)
	}
	wantRunning(t, srv, 2, 0)
	// The scaler keeps to the new maximum.
	depth.Store(5)
	m.check(time.Now())
	if _, n := srv.Running(); n != 0 {
		t.Errorf("%d non-resident processes started above the maximum of 2", n)
	}
}

// TestSetParallelCountLimits: every refusal names its limit and changes
// nothing.
func TestSetParallelCountLimits(t *testing.T) {
	t.Parallel()
	m := quietManager(t, Options{NodeCap: 3})
	var depth atomic.Int64
	a, _ := chprcServer(t, m, "a", 2, 3, &depth)
	b, _ := chprcServer(t, m, "b", 1, 2, &depth)
	refresh := uapSpec("sleep", t.TempDir(), 0)
	refresh.Server, refresh.Max, refresh.Refresh = "fresh", 2, true
	fresh := startServer(t, m, refresh, &hooks{file: devNull(t)})
	wantRunning(t, a, 2, 0)
	wantRunning(t, b, 1, 0)
	cases := []struct {
		srv           *Server
		resident, max int
		want          string
	}{
		{a, 1, 4, "above 3, the maximum of parallel_count in its definition"},
		{a, 3, 2, "more resident processes than the maximum"},
		{a, -1, 2, "want at least 0 resident processes"},
		{a, 0, 0, "a maximum of at least 1"},
		{b, 2, 2, "the node's max_processes is 3 and its other servers keep 2 resident processes"},
		{a, 3, 3, "the node's max_processes is 3 and its other servers keep 1 resident processes"},
		{fresh, 1, 2, "scd_refresh_process = Y"},
	}
	for _, tc := range cases {
		_, err := tc.srv.SetParallelCount(tc.resident, tc.max)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: SetParallelCount(%d, %d) = %v, want an error saying %q", tc.srv.spec.Server, tc.resident, tc.max, err, tc.want)
		}
	}
	if r, mx := a.ParallelCount(); r != 2 || mx != 3 {
		t.Errorf("a: %d,%d after refusals, want 2,3", r, mx)
	}
	wantRunning(t, a, 2, 0)
	wantRunning(t, b, 1, 0)
	// Within the node's cap once a gives one up.
	if _, err := a.SetParallelCount(1, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := b.SetParallelCount(2, 2); err != nil {
		t.Errorf("b: SetParallelCount(2, 2) with 1+2 of 3 resident: %v", err)
	}
	wantRunning(t, b, 2, 0)
	if _, err := fresh.SetParallelCount(0, 1); err != nil {
		t.Errorf("refresh server: SetParallelCount(0, 1): %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// lockProbe is a Delegate's Prepare and Stop that check procmgr holds none
// of its locks while it calls them, as the Delegate's contract says: a
// Delegate may call back into the manager (a chprc of another server, a
// status read) without a deadlock.
type lockProbe struct {
	srv  atomic.Pointer[Server]
	m    *Manager
	mu   sync.Mutex
	held []string
}

func (p *lockProbe) check(where string) {
	locks := map[string]*sync.Mutex{"Manager.chprc": &p.m.chprc, "Manager.mu": &p.m.mu}
	if s := p.srv.Load(); s != nil {
		locks["Server.mu"] = &s.mu
	}
	// A TryLock here also fails while another goroutine of the manager
	// holds the lock a moment (a busy machine made that a failure): the
	// question is whether this goroutine's caller holds it, which a lock
	// taken elsewhere answers: held by the caller, it is not free until
	// the Delegate returns.
	for name, l := range locks {
		got := make(chan struct{})
		go func() { l.Lock(); l.Unlock(); close(got) }()
		select {
		case <-got:
		case <-time.After(5 * time.Second):
			p.mu.Lock()
			p.held = append(p.held, where+" with "+name+" held")
			p.mu.Unlock()
		}
	}
}

// TestSetParallelCountCallsDelegateWithoutLocks: a chprc that starts
// residents calls Prepare, and one that stops them calls Stop, with none of
// procmgr's locks held.
func TestSetParallelCountCallsDelegateWithoutLocks(t *testing.T) {
	t.Parallel()
	m := quietManager(t, Options{})
	probe := &lockProbe{m: m}
	sp := uapSpec("sleep", t.TempDir(), 1)
	sp.Server, sp.Group = "locks", "locks"
	sp.Max, sp.IdleStop = 3, time.Hour
	null := devNull(t)
	srv := startServer(t, m, sp, &hooks{
		prepare: func(int) error { probe.check("Prepare"); return nil },
		file:    null,
		slot:    func(int) SlotView { return SlotView{Busy: true, Ready: true} },
		stop:    func(int) { probe.check("Stop") },
	})
	probe.srv.Store(srv)
	wantRunning(t, srv, 1, 0)
	if _, err := srv.SetParallelCount(3, 3); err != nil {
		t.Fatalf("SetParallelCount(3, 3): %v", err)
	}
	wantRunning(t, srv, 3, 0)
	if _, err := srv.SetParallelCount(1, 3); err != nil {
		t.Fatalf("SetParallelCount(1, 3): %v", err)
	}
	probe.mu.Lock()
	defer probe.mu.Unlock()
	for _, h := range probe.held {
		t.Errorf("the Delegate was called in %s", h)
	}
}

// TestPromotedDuringAFailedStartIsStarted: chprc makes resident the slot
// of a non-resident process whose start is under way (it leaves the start
// to it), and that start fails: the slot, resident now, is started again
// with the restart back-off. It stayed without a process until the next
// change.
func TestPromotedDuringAFailedStartIsStarted(t *testing.T) {
	t.Parallel()
	m := quietManager(t, Options{})
	dir := t.TempDir()
	sp := uapSpec("sleep", dir, 1)
	sp.Max, sp.IdleStop = 2, time.Hour
	inPrepare, release := make(chan struct{}), make(chan struct{})
	var held atomic.Bool
	var depth atomic.Int64
	srv := startServer(t, m, sp, &hooks{
		file:    devNull(t),
		waiting: func() int { return int(depth.Load()) },
		slot:    func(int) SlotView { return SlotView{Busy: true, Ready: true} },
		prepare: func(slot int) error {
			if slot == 1 && held.CompareAndSwap(false, true) {
				close(inPrepare)
				<-release
				return syscall.EMFILE // the first start in slot 1 fails
			}
			return nil
		},
	})
	wantRunning(t, srv, 1, 0)
	depth.Store(5)
	started := make(chan bool, 1)
	go func() { started <- srv.startNonResident() }()
	<-inPrepare
	if _, err := srv.SetParallelCount(2, 2); err != nil {
		t.Fatalf("SetParallelCount(2, 2): %v", err)
	}
	close(release)
	if <-started {
		t.Fatal("the non-resident start reported success")
	}
	depth.Store(0)
	wantRunning(t, srv, 2, 0)
}
