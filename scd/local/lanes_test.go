package local

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/VictoriaMetrics/metrics"
	"golang.org/x/sys/unix"

	"tpsched/netio"
	"tpsched/scd/call"
	"tpsched/shm"
)

// fakeTakesLanes makes fakeProcs' processes attach with their control
// line, as a Go UAP started by scdd does: they take lanes.
var fakeTakesLanes atomic.Bool

var attachMu sync.Mutex

// attachWithLine attaches to files (Proc.Files) as shm.Attach does in a
// process started with them as fds 3 to 6: the UAP owns copies of them at
// four free descriptors in a row.
func attachWithLine(files []*os.File) (*shm.UAP, error) {
	attachMu.Lock()
	defer attachMu.Unlock()
	base := 4000
	for free := 0; free < 4; base++ {
		free = 0
		for i := range 4 {
			if _, err := unix.FcntlInt(uintptr(base+i), unix.F_GETFD, 0); err == unix.EBADF {
				free++
			}
		}
		if free == 4 {
			break
		}
	}
	for i, f := range files[:4] {
		if err := unix.Dup3(int(f.Fd()), base+i, unix.O_CLOEXEC); err != nil {
			return nil, err
		}
	}
	old, had := os.LookupEnv("TPSCHED_SHM_FD")
	os.Setenv("TPSCHED_SHM_FD", strconv.Itoa(base))
	defer func() {
		if had {
			os.Setenv("TPSCHED_SHM_FD", old)
		} else {
			os.Unsetenv("TPSCHED_SHM_FD")
		}
	}()
	return shm.Attach()
}

// lanesScheduler is a scheduler of servers whose processes take lanes,
// routing the processes' own calls to itself (a node where lanes are
// granted).
func lanesScheduler(t *testing.T, servers map[string]string) *Scheduler {
	t.Helper()
	fakeTakesLanes.Store(true)
	t.Cleanup(func() { fakeTakesLanes.Store(false) })
	var s *Scheduler
	opts := Options{Logger: slog.New(slog.DiscardHandler), Metrics: metrics.NewSet(),
		Place: func(c call.Caller, f *netio.Frame) (netio.Code, string) { return s.Serve(c, f) },
		Lanes: func() bool { return true }}
	s, _ = testSchedulerOpts(t, servers, opts)
	return s
}

// capLanes caps s's lanes at max, with its groups' processes in cpu
// cgroups of their own (uap_cpu_groups = always): then the cap holds.
func capLanes(t *testing.T, s *Scheduler, max int64) {
	fakeCPUGroups.Store(true)
	t.Cleanup(func() { fakeCPUGroups.Store(false) })
	s.lanes.max = max
}

func lanesOpen(g *Group) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.lanes.open)
}

// laneCaller is a caller group of one process (%s its name): its service
// call makes the local call its request names ("<group>/<service>/<its
// request>").
const laneCaller = "set service_group = %s\nset service = call\nset module = MODULE\nset parallel_count = 1\nset max_message_size = 1024\n"

// serveCalls returns a function that makes a call to s and returns its
// answer, failing t if s refuses it.
func serveCalls(t *testing.T, s *Scheduler) func(group, service, payload string) netio.Frame {
	ans := newAnswers()
	id := uint64(0)
	return func(group, service, payload string) netio.Frame {
		t.Helper()
		id++
		if code, msg := s.Serve(ans, frame(id, group, service, payload)); code != netio.CodeOK {
			t.Fatalf("call %d: %v %s", id, code, msg)
		}
		return ans.one(t, id)
	}
}

// echoVia returns a function that has group's process call to/echo with
// x, failing t unless x comes back.
func echoVia(t *testing.T, s *Scheduler) func(group, to string) {
	call := serveCalls(t, s)
	return func(group, to string) {
		t.Helper()
		if f := call(group, "call", to+"/echo/x"); f.Kind != netio.KindReply || string(f.Payload) != "x" {
			t.Fatalf("%s's call through %s: %v %q", group, to, f.Kind, f.Payload)
		}
	}
}

// TestLaneCalleeRuledTimedOutStaysLent: a call on a lane answered 'timed
// out' (watch_time) while its callee still runs it leaves the callee busy
// until it finishes, as a queue's call past its deadline does: the lane,
// revoked when it idles, ends when the callee leaves it, not a second
// after the revoke (the claim says ruled, not taken, and the process went
// back to the queue running the call, first in line for the next one,
// which then waited behind it and timed out with another process free).
func TestLaneCalleeRuledTimedOutStaysLent(t *testing.T) {
	s := lanesScheduler(t, map[string]string{"a": fmt.Sprintf(laneCaller, "a"), "b": fmt.Sprintf(hangCallee, 2), "c": hangGroup})
	b := s.groups["b"]
	callOK := serveCalls(t, s)
	// a's calls to b/callhour take a lane; on it, b's process runs a call
	// that hangs: ruled 'timed out'.
	hangOnLane(t, b, callOK)
	// Once the lane idled out and would have closed: b's next call goes to
	// its free process.
	time.Sleep(laneIdle + laneLeaveWithin + 300*time.Millisecond)
	if f := callOK("b", "echo", "z"); f.Kind != netio.KindReply || string(f.Payload) != "z" {
		t.Fatalf("b's next call, a process free: %v %q", f.Kind, f.Payload)
	}
}

// TestLaneRanOverCalleeLeavesTheCapFree: a lane whose callee runs on a
// call ruled 'timed out' stays open until the callee leaves it, which it
// may never do; revoked, it no longer counts against the node's
// maxLanes, so another caller is granted a lane meanwhile (on two CPUs
// the cap is one lane: a callee stuck in a call kept every caller of
// the node off lanes until it died).
func TestLaneRanOverCalleeLeavesTheCapFree(t *testing.T) {
	s := lanesScheduler(t, map[string]string{"a": fmt.Sprintf(laneCaller, "a"), "a2": fmt.Sprintf(laneCaller, "a2"), "b": fmt.Sprintf(hangCallee, 3), "c": hangGroup})
	capLanes(t, s, 1) // as on two CPUs, whatever this machine has
	b := s.groups["b"]
	call := serveCalls(t, s)
	hangOnLane(t, b, call)
	// a2's calls to b: two of its processes are free (one for the call
	// that prompts a grant, one to lend), and so is the one lane the node
	// grants, the first one revoked.
	grants := b.lanes.grants.Get()
	deadline := time.Now().Add(testWait)
	for b.lanes.grants.Get() == grants {
		if time.Now().After(deadline) {
			b.mu.Lock()
			open := len(b.lanes.open)
			b.mu.Unlock()
			t.Fatalf("no lane granted to a2 while a's callee runs on a call ruled 'timed out' (%d lanes open, %d granted)",
				open, s.lanes.granted.Load())
		}
		if f := call("a2", "call", "b/echo/z"); f.Kind != netio.KindReply || string(f.Payload) != "z" {
			t.Fatalf("a2's call through b: %v %q", f.Kind, f.Payload)
		}
	}
	if n := lanesOpen(b); n != 2 {
		t.Errorf("%d lanes open, want 2: a's, revoked, whose callee still runs its call, and a2's", n)
	}
}

// TestLanesTakeTurns: two callers that call without pause, and the node
// grants one lane (as on two CPUs): the first one's lane is revoked a
// laneTurn after the second was kept from one, and the second is granted
// its turn. Without turns the first kept the lane for as long as it
// called.
func TestLanesTakeTurns(t *testing.T) {
	const callee = "set service_group = b\nset service = echo\nset module = MODULE\nset parallel_count = 3\nset max_message_size = 1024\n"
	s := lanesScheduler(t, map[string]string{"a": fmt.Sprintf(laneCaller, "a"), "a2": fmt.Sprintf(laneCaller, "a2"), "b": callee})
	capLanes(t, s, 1)
	b := s.groups["b"]
	echo := echoVia(t, s)
	call := func(group string) { t.Helper(); echo(group, "b") }
	untilLane(t, b, "a", func() { call("a") })
	turns := b.lanes.revokes[revokeTurn]
	deadline := time.Now().Add(laneTurn + testWait)
	for turns.Get() == 0 || b.lanes.grants.Get() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("a kept its lane %v while a2 called too: %d grants, %d revoked for a turn",
				laneTurn+testWait, b.lanes.grants.Get(), turns.Get())
		}
		call("a2")
		call("a")
	}
}

// TestLaneTurnNotForACallerNoLaneServes: a caller the cap keeps from a
// lane to a group that has no process to lend it (c's one process runs
// the call itself) could not be granted one anyway, so it takes no turn
// from the lane's holder: a, calling b on the node's one lane, keeps it
// while a2 calls c in alternation. Without the check the lane was
// revoked for a turn a second after a2's first call, and every two
// seconds after, for nobody.
func TestLaneTurnNotForACallerNoLaneServes(t *testing.T) {
	const callee = "set service_group = %s\nset service = echo\nset module = MODULE\nset parallel_count = %d\nset max_message_size = 1024\n"
	s := lanesScheduler(t, map[string]string{"a": fmt.Sprintf(laneCaller, "a"), "a2": fmt.Sprintf(laneCaller, "a2"),
		"b": fmt.Sprintf(callee, "b", 3), "c": fmt.Sprintf(callee, "c", 1)})
	capLanes(t, s, 1)
	b, c := s.groups["b"], s.groups["c"]
	call := echoVia(t, s)
	untilLane(t, b, "a", func() { call("a", "b") })
	grants := b.lanes.grants.Get()
	for end := time.Now().Add(laneTurn + 2*time.Second); time.Now().Before(end); {
		call("a2", "c")
		call("a", "b")
	}
	if n := b.lanes.revokes[revokeTurn].Get(); n != 0 || c.lanes.grants.Get() != 0 {
		t.Errorf("a's lane revoked %d times for a turn (%d more grants to a) while a2, kept from one, could not be granted one to c (%d grants)",
			n, b.lanes.grants.Get()-grants, c.lanes.grants.Get())
	}
	if w := s.lanes.wanted.Load(); w != 0 {
		t.Errorf("the cap recorded a caller kept from a lane at %v: none could have had one", time.Unix(0, w))
	}
}

// TestLaneTurnEndsOneLane: with two lanes granted a second ago, one
// caller kept from a third by the cap ends one of them, not both.
func TestLaneTurnEndsOneLane(t *testing.T) {
	const callee = "set service_group = b\nset service = echo\nset module = MODULE\nset parallel_count = 5\nset max_message_size = 1024\n"
	s := lanesScheduler(t, map[string]string{"a": fmt.Sprintf(laneCaller, "a"), "a2": fmt.Sprintf(laneCaller, "a2"),
		"a3": fmt.Sprintf(laneCaller, "a3"), "b": callee})
	capLanes(t, s, 2)
	b := s.groups["b"]
	echo := echoVia(t, s)
	call := func(group string) { t.Helper(); echo(group, "b") }
	deadline := time.Now().Add(testWait)
	for want, group := range []string{"a", "a2"} {
		for lanesOpen(b) <= want {
			if time.Now().After(deadline) {
				t.Fatalf("no lane granted to %s", group)
			}
			call(group)
		}
	}
	// Both keep their lanes busy past a turn, then a3 is kept from one.
	for end := time.Now().Add(laneTurn + 200*time.Millisecond); time.Now().Before(end); {
		call("a")
		call("a2")
	}
	turns := b.lanes.revokes[revokeTurn]
	if n := turns.Get(); n != 0 {
		t.Fatalf("%d lanes revoked for a turn before anyone was kept from one", n)
	}
	call("a3")
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
		call("a")
		call("a2")
	}
	if n := turns.Get(); n != 1 {
		t.Errorf("one caller kept from a lane ended %d lanes, want 1", n)
	}
}

// hangCallee is group b of %d processes whose callhour calls another
// service (watch_time 1 s), and hangGroup the group c whose hang never
// answers: a's calls through b/callhour/c/hang hang b's process.
const (
	hangCallee = "set service_group = b\nset service = echo, callhour\nset module = MODULE\nset parallel_count = %d\nset max_message_size = 1024\nset watch_time = 1\n"
	hangGroup  = "set service_group = c\nset service = echo, hang\nset module = MODULE\nset parallel_count = 1\nset max_message_size = 1024\n"
)

// hangOnLane has a's calls through b/callhour take a lane, then makes
// one on it whose callee hangs in c/hang: answered, but not a reply
// ('timed out' at b's watch_time), with b's process still running it.
func hangOnLane(t *testing.T, b *Group, call func(group, service, payload string) netio.Frame) {
	t.Helper()
	untilLane(t, b, "a", func() {
		if f := call("a", "call", "b/callhour/c/echo/x"); f.Kind != netio.KindReply || string(f.Payload) != "x" {
			t.Fatalf("a call through b: %+v", f)
		}
	})
	if f := call("a", "call", "b/callhour/c/hang/y"); f.Kind == netio.KindReply {
		t.Fatalf("a call whose callee hangs: %+v", f)
	}
}

// untilLane makes calls until g has a lane with calls on it, failing t
// after testWait (who names the caller for the failure).
func untilLane(t *testing.T, g *Group, who string, call func()) {
	t.Helper()
	deadline := time.Now().Add(testWait)
	for lanesOpen(g) == 0 || g.lanes.calls.Get() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no lane granted to %s", who)
		}
		call()
	}
}

// TestLanesOutsideCPUGroupsAreNotCapped: groups whose processes share
// scdd's cpu cgroup (procmgr's shared CPU groups, the default) take no
// part in the cap. With a cap of one, two callers hold a lane each to b at
// once, and neither is revoked for a turn. Once b's processes get a cpu
// cgroup of their own (a weight set), both lanes end (reason cpu_group)
// and the cap holds the lanes granted after: one at a time.
func TestLanesOutsideCPUGroupsAreNotCapped(t *testing.T) {
	const callee = "set service_group = b\nset service = echo\nset module = MODULE\nset parallel_count = 5\nset max_message_size = 1024\n"
	s := lanesScheduler(t, map[string]string{"a": fmt.Sprintf(laneCaller, "a"), "a2": fmt.Sprintf(laneCaller, "a2"), "b": callee})
	s.lanes.max = 1
	b := s.groups["b"]
	echo := echoVia(t, s)
	both := func() { t.Helper(); echo("a", "b"); echo("a2", "b") }
	deadline := time.Now().Add(testWait)
	for lanesOpen(b) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d lanes to b with a cap of one: want one for each caller, every group in scdd's cpu cgroup", lanesOpen(b))
		}
		both()
	}
	for end := time.Now().Add(laneTurn + 200*time.Millisecond); time.Now().Before(end); {
		both()
	}
	if n := s.lanes.granted.Load(); n != 0 {
		t.Errorf("%d lanes counted against the cap, want none", n)
	}
	if n, open := b.lanes.revokes[revokeTurn].Get(), lanesOpen(b); n != 0 || open != 2 {
		t.Errorf("past a turn: %d lanes revoked for a turn, %d open; want none revoked and both open", n, open)
	}

	if err := b.SetCPUWeight(150); err != nil {
		t.Fatal(err)
	}
	regrouped := b.lanes.revokes[revokeCPUGroup]
	for deadline = time.Now().Add(testWait); regrouped.Get() < 2; both() {
		if time.Now().After(deadline) {
			t.Fatalf("b's processes got a cpu cgroup of their own, and %d of its 2 lanes ended", regrouped.Get())
		}
	}
	grants := b.lanes.grants.Get()
	for end := time.Now().Add(laneTurn / 2); time.Now().Before(end) || b.lanes.grants.Get() == grants; both() {
		if n := s.lanes.granted.Load(); n > 1 {
			t.Fatalf("%d lanes counted against a cap of one", n)
		}
		if time.Now().After(end.Add(testWait)) {
			t.Fatal("no lane granted again to b's callers")
		}
	}
	if n := s.lanes.granted.Load(); n != 1 {
		t.Errorf("%d capped lanes after the grant again, want 1", n)
	}
}

// TestLaneForEveryCallerAsManyAsProcesses: two callers of a group of two
// processes hold a lane each. The second caller's call runs on the one
// process the first's lane left, so when it prompts the offer there is no
// process to lend; the offer waits for the call's end and lends that
// process then. Before, the second caller went the dispatcher's way for
// as long as it called.
func TestLaneForEveryCallerAsManyAsProcesses(t *testing.T) {
	const callee = "set service_group = b\nset service = echo\nset module = MODULE\nset parallel_count = 2\nset max_message_size = 1024\n"
	s := lanesScheduler(t, map[string]string{"a": fmt.Sprintf(laneCaller, "a"), "a2": fmt.Sprintf(laneCaller, "a2"), "b": callee})
	b := s.groups["b"]
	made := 0 // calls to b/echo
	via := echoVia(t, s)
	echo := func(group, to string) { t.Helper(); via(group, to); made++ }
	untilLane(t, b, "a", func() { echo("a", "b") })
	deadline := time.Now().Add(testWait)
	for lanesOpen(b) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d lanes to b's 2 processes with 2 callers: want one for each", lanesOpen(b))
		}
		echo("a", "b")
		echo("a2", "b")
	}
	for range 20 {
		echo("a", "b")
		echo("a2", "b")
	}
	// The looks count each lane's calls; one more call each and a look
	// later, both lanes show theirs.
	deadline = time.Now().Add(testWait)
	for {
		echo("a", "b")
		echo("a2", "b")
		b.mu.Lock()
		var onLane []uint64
		callers := map[*uapCaller]bool{}
		for _, ls := range b.lanes.open {
			onLane = append(onLane, ls.made)
			callers[ls.from] = true
		}
		b.mu.Unlock()
		if len(onLane) == 2 && len(callers) == 2 && min(onLane[0], onLane[1]) >= 20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b's lanes: calls made on each %v, by %d callers; want 2 lanes of 20 calls or more, one per caller", onLane, len(callers))
		}
	}
	// Every call b served counts as queued and processed once, on a lane
	// or not (its metrics and status), once the looks saw the lanes'.
	for deadline = time.Now().Add(testWait); ; {
		st := b.stats()
		if st.Processed == uint64(made) && st.Queued == uint64(made) {
			return
		}
		if st.Processed > uint64(made) || time.Now().After(deadline) {
			t.Fatalf("b: %d calls queued, %d processed; want the %d made", st.Queued, st.Processed, made)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// laneMemory maps the lane of generation gen as a process holding it
// could: its memfd, found among the test process's descriptors (the
// node's own end of it).
func laneMemory(t *testing.T, gen uint32) []byte {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	want := "/memfd:tpsched-lane-" + strconv.FormatUint(uint64(gen), 10) + " (deleted)"
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && target == want {
			fd, err := strconv.Atoi(e.Name())
			if err != nil {
				t.Fatal(err)
			}
			mem, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unix.Munmap(mem) })
			return mem
		}
	}
	t.Fatalf("no descriptor of lane %d", gen)
	return nil
}

// TestLaneForgedTakenCallIsRevoked: a caller that forges its lane's claim
// as 'taken' again after every ruling keeps the lane open (never idle,
// its call never over) and has the node rule it 'timed out' at every
// look of the expiry loop, counting each in the callee group's
// tpsched_requests_timed_out_total, for as long as nobody waits for the
// group. A lane whose call the node ruled is revoked: its (honest)
// callee leaves it and goes back to its queue, and the count stops.
func TestLaneForgedTakenCallIsRevoked(t *testing.T) {
	const callee = "set service_group = b\nset service = echo\nset module = MODULE\nset parallel_count = 2\nset max_message_size = 1024\nset watch_time = 1\n"
	s := lanesScheduler(t, map[string]string{"a": fmt.Sprintf(laneCaller, "a"), "b": callee})
	b := s.groups["b"]
	call := serveCalls(t, s)
	untilLane(t, b, "a", func() {
		if f := call("a", "call", "b/echo/x"); f.Kind != netio.KindReply {
			t.Fatalf("a call through b: %+v", f)
		}
	})
	b.mu.Lock()
	gen := b.lanes.open[0].l.Gen()
	b.mu.Unlock()
	mem := laneMemory(t, gen)
	seq := (*atomic.Uint64)(unsafe.Pointer(&mem[0x00]))
	claim := (*atomic.Uint64)(unsafe.Pointer(&mem[0x80]))
	n := claim.Load()>>8 + 1
	seq.Store(n)
	claim.Store(n<<8 | 1) // taken
	before := b.timedOut.Get()
	stop := time.Now().Add(3 * time.Second)
	for time.Now().Before(stop) && lanesOpen(b) > 0 {
		if c := claim.Load(); c&3 != 1 {
			claim.Store(c>>8<<8 | 1) // ruled: taken again
		}
		time.Sleep(time.Millisecond)
	}
	if lanesOpen(b) > 0 {
		t.Errorf("the lane whose claim the caller forges is open 3 s on, %d calls on it ruled 'timed out'", b.timedOut.Get()-before)
	}
}
