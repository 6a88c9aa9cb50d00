package bench

import (
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gometrics "github.com/hashicorp/go-metrics"

	"tpsched/netio"
	scdnames "tpsched/scd/names"
)

func TestParseNetDev(t *testing.T) {
	dev := `Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 5680 146    0    0    0     0          0         0 9999 321    0    0    0     0       0          0
  eth0:  100 2 0 0 0 0 0 0 200 4 0 0 0 0 0 0
`
	b, p, err := parseNetDev([]byte(dev), "lo")
	if err != nil || b != 9999 || p != 321 {
		t.Errorf("lo: %d bytes %d packets %v, want 9999 and 321", b, p, err)
	}
	if _, _, err := parseNetDev([]byte(dev), "wlan0"); err == nil {
		t.Error("a missing interface read without error")
	}
	if _, _, err := parseNetDev([]byte("    lo: 1 2 3\n"), "lo"); err == nil {
		t.Error("a short line read without error")
	}
}

func TestS7SeedsOf(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	if s := s7SeedsOf(0, 3, rnd); s != nil {
		t.Errorf("member 0 has seeds %v", s)
	}
	if s := s7SeedsOf(1, 3, rnd); !slices.Equal(s, []int{0}) {
		t.Errorf("member 1: %v, want [0]", s)
	}
	if s := s7SeedsOf(2, 3, rnd); !slices.Equal(s, []int{0, 1}) {
		t.Errorf("member 2: %v, want [0 1]", s)
	}
	for i := 3; i < 128; i++ {
		s := s7SeedsOf(i, 3, rnd)
		if len(s) != 3 || s[0] != 0 || s[1] == s[2] || s[1] == 0 || s[2] == 0 || s[1] >= i || s[2] >= i {
			t.Fatalf("member %d: seeds %v, want 0 and two distinct earlier members", i, s)
		}
	}
}

func TestPercentileMs(t *testing.T) {
	v := []float64{30, 10, 20, 40}
	if got := percentileMs(v, 50); got != 20 {
		t.Errorf("p50 %v, want 20", got)
	}
	if got := percentileMs(v, 99); got != 40 {
		t.Errorf("p99 %v, want 40", got)
	}
	if got := percentileMs(nil, 99); got != 0 {
		t.Errorf("empty: %v", got)
	}
}

// gridOf is a grid of one run per size, each with the given p99 (every
// change took it) and quiet announce bytes.
func gridOf(sizes []int, p99 []float64, quietBytes []float64) *gossipGrid {
	g := &gossipGrid{Sizes: sizes, Runs: 1, Setup: gossipSetup{Nodes: sizes[len(sizes)-1], ProbeLimit: 10 * time.Second, Cores: 2}}
	for k, n := range sizes {
		run := &gossipResult{Setup: gossipSetup{Nodes: n}, Joined: true, Quiet: traffic{BytesPerNodeS: quietBytes[k], MessagesPerNodeS: 1, Seconds: 20},
			Changes: traffic{MessagesPerNodeS: 1 + float64(ceilLog2(n))*30/20, Seconds: 20}}
		for range 30 {
			delays := make([]float64, n-1)
			for d := range delays {
				delays[d] = p99[k]
			}
			run.Probes = append(run.Probes, probeResult{Seen: n - 1, AllMs: p99[k], DelaysMs: delays})
		}
		g.Size = append(g.Size, summarizeGossip(n, []*gossipResult{run}))
	}
	return g
}

func TestGossipVerdict(t *testing.T) {
	g := gridOf([]int{32, 128}, []float64{100, 250}, []float64{30, 40})
	if got := gossipVerdict(g, 300*time.Millisecond); !strings.Contains(got, "at 128 members): p99 250 ms over 30 changes (max 250 ms): **met**") ||
		!strings.Contains(got, "nearest-rank p99 is the maximum") || !strings.Contains(got, "quiet (refresh only) 30 at 32 members and 40 at 128") ||
		!strings.Contains(got, "a change cost each member 5.0 messages at 32 and 7.0 at 128") || !strings.Contains(got, "flat up to log n: **met**") {
		t.Errorf("met: %q", got)
	}
	g = gridOf([]int{32, 128}, []float64{100, 400}, []float64{30, 120})
	if got := gossipVerdict(g, 300*time.Millisecond); !strings.Contains(got, "p99 400 ms over 30 changes (max 400 ms): **NOT met**") ||
		!strings.Contains(got, "growing with the members: **NOT met**") {
		t.Errorf("slow and growing: %q", got)
	}
	g = gridOf([]int{128}, []float64{100}, []float64{30})
	g.Size[0].NotConverged = 2
	if got := gossipVerdict(g, 300*time.Millisecond); !strings.Contains(got, "2 of 30 changes did not reach every table") || !strings.Contains(got, "NOT met") {
		t.Errorf("not converged: %q", got)
	}
	g = gridOf([]int{128}, []float64{100}, []float64{30})
	g.Size[0].Runs[0].Joined, g.Size[0].Runs[0].JoinKnownMin, g.Size[0].Runs[0].JoinSeconds = false, 120, 60
	if got := gossipVerdict(g, 300*time.Millisecond); !strings.Contains(got, "a run's join did not converge (smallest table 120 of 128") {
		t.Errorf("not joined: %q", got)
	}
	// One run collapsed (memberlist declared members dead, changes late),
	// the other healthy: both pooled, and the healthy one on its own.
	g = gridOf([]int{128}, []float64{200}, []float64{30})
	bad := *g.Size[0].Runs[0]
	bad.Changes.TableDrops = 500
	bad.Probes = nil
	for range 30 {
		bad.Probes = append(bad.Probes, probeResult{Seen: 127, AllMs: 9000})
	}
	g.Size[0] = summarizeGossip(128, []*gossipResult{&bad, g.Size[0].Runs[0]})
	if z := g.Size[0]; z.HealthyRuns != 1 || z.HealthyChanges != 30 || z.HealthyAllP99Ms != 200 || z.AllP99Ms != 9000 {
		t.Errorf("healthy pooling: %+v", z)
	}
	if got := gossipVerdict(g, 300*time.Millisecond); !strings.Contains(got, "p99 9000 ms over 60 changes") ||
		!strings.Contains(got, "over the 1 of 2 runs in which memberlist kept every member alive") ||
		!strings.Contains(got, "p99 200 ms over 30 changes (max 200 ms): **met**") {
		t.Errorf("a collapsed run: %q", got)
	}
	if got := gossipVerdict(nil, time.Second); !strings.Contains(got, "not checked") {
		t.Errorf("nothing: %q", got)
	}
}

// A size's changes are pooled over its runs; its traffic is each
// figure's median, its health counts summed; messages per change are the
// changes phase's less the quiet phase's rate.
func TestSummarizeGossip(t *testing.T) {
	run := func(all float64, quietB float64, drops int) *gossipResult {
		return &gossipResult{Joined: true, JoinSeconds: all / 100,
			Probes:  []probeResult{{Seen: 3, AllMs: all, DelaysMs: []float64{all / 2, all, -1}}},
			Quiet:   traffic{BytesPerNodeS: quietB, MessagesPerNodeS: 2, TableDrops: drops, MinTable: 4},
			Changes: traffic{MessagesPerNodeS: 4, Seconds: 10, MinTable: 4 - drops}}
	}
	z := summarizeGossip(4, []*gossipResult{run(100, 10, 0), run(300, 30, 1), run(200, 20, 2)})
	if z.Changes != 3 || z.NotConverged != 0 || z.AllP50Ms != 200 || z.AllMaxMs != 300 || z.TableMaxMs != 300 || z.TableP50Ms != 100 {
		t.Errorf("pooled changes: %+v", z)
	}
	if z.Quiet.BytesPerNodeS != 20 || z.Quiet.TableDrops != 3 || z.Changing.MinTable != 2 || z.JoinSeconds != 2 {
		t.Errorf("traffic: quiet %+v changes %+v join %v", z.Quiet, z.Changing, z.JoinSeconds)
	}
	if z.MsgsPerChangePerNode != 20 { // (4 - 2) messages/member/s x 10 s / 1 change
		t.Errorf("messages per change per member %v, want 20", z.MsgsPerChangePerNode)
	}
}

func TestGossipMarkdown(t *testing.T) {
	g := gridOf([]int{3, 4}, []float64{100, 200}, []float64{1234, 1300})
	g.Size[1].Runs[0].Probes[1].Seen = 1
	g.Size[1] = summarizeGossip(4, g.Size[1].Runs)
	r := &report{Scenario: "S7", Title: "t", Date: "2026-01-01", Gossip: g, Setup: s7Setup(g, true)}
	md := r.Markdown()
	for _, w := range []string{"# S7: t", "| 3 | 1 | 0.0 s | 30 (0) | 100 / 100 / 100 ms |", "| 4 | 1 | 0.0 s | 30 (1) | 200 / 200 / 200 ms |",
		"| 3 | quiet (refresh only) | 1234 |", "GossipConfig{Fast: false}", "Quick mode", "the live members 1, 2, 4"} {
		if !strings.Contains(md, w) {
			t.Errorf("markdown lacks %q:\n%s", w, md)
		}
	}
}

// A table that shrinks counts as a lost member; growing back does not;
// the smallest size since the reset is kept.
func TestS7Health(t *testing.T) {
	h := &s7Health{last: make([]atomic.Int64, 2)}
	h.least.Store(3)
	tables := []*scdnames.Table{scdnames.NewTable("a"), scdnames.NewTable("b")}
	info := func(node string) scdnames.NodeInfo {
		return scdnames.NodeInfo{Node: node, Boot: 1, Seq: 1, Groups: []scdnames.GroupInfo{{Group: "g"}}}
	}
	for _, n := range []string{"a", "b", "c"} {
		tables[0].Apply(info(n))
		h.changed(0, tables[0])
	}
	if h.drops.Load() != 0 || h.least.Load() != 1 {
		t.Errorf("growing: drops %d least %d, want 0 and 1", h.drops.Load(), h.least.Load())
	}
	h.least.Store(3)
	tables[0].Remove("c")
	h.changed(0, tables[0])
	tables[0].Apply(scdnames.NodeInfo{Node: "c", Boot: 2, Seq: 1, Groups: []scdnames.GroupInfo{{Group: "g"}}})
	h.changed(0, tables[0])
	if h.drops.Load() != 1 || h.least.Load() != 2 {
		t.Errorf("after losing c and getting it back: drops %d least %d, want 1 and 2", h.drops.Load(), h.least.Load())
	}
}

func TestGossipVerdictHealth(t *testing.T) {
	g := gridOf([]int{128}, []float64{4000}, []float64{30})
	r := g.Size[0].Runs[0]
	r.Stuck, r.LeaveStuck = []string{"m001", "m002"}, 2
	r.Quiet.TableDrops, r.Changes.TableDrops = 3, 5
	g.Size[0] = summarizeGossip(128, g.Size[0].Runs)
	g.Size[0].Quiet.MachineCores, g.Size[0].Changing.MachineCores = 1.95, 1.6
	got := gossipVerdict(g, 300*time.Millisecond)
	for _, w := range []string{"**NOT met**", "2 members were stuck", "2 did not finish Leave", "tables lost a member 8 times",
		"the machine was busy (1.95 and 1.60 of its 2 cores"} {
		if !strings.Contains(got, w) {
			t.Errorf("verdict lacks %q:\n%s", w, got)
		}
	}
}

// S7's sizes, runs and parts for the full and the quick grid, and what
// the flags change.
func TestS7Sizing(t *testing.T) {
	setup, sizes, runs := s7Sizing(Config{})
	if !slices.Equal(sizes, []int{32, 64, 128}) || runs != 3 || setup.Nodes != 128 || setup.Quiet != 20*time.Second || setup.Refresh != 20*time.Second {
		t.Errorf("full: %v x%d, %+v", sizes, runs, setup)
	}
	setup, sizes, runs = s7Sizing(Config{Quick: true})
	if !slices.Equal(sizes, []int{16, 32, 64}) || runs != 1 || setup.Quiet != 5*time.Second || setup.Refresh != 5*time.Second {
		t.Errorf("quick: %v x%d, %+v", sizes, runs, setup)
	}
	if _, sizes, runs = s7Sizing(Config{S7Sizes: []int{8, 4}, S7Runs: 2}); !slices.Equal(sizes, []int{8, 4}) || runs != 2 {
		t.Errorf("flags: %v x%d", sizes, runs)
	}
	if rs := s7RealSizing(Config{}); rs.Nodes != 32 || rs.Probes != 30 {
		t.Errorf("real nodes, full: %+v", rs)
	}
	if rs := s7RealSizing(Config{Quick: true}); rs.Nodes != 8 {
		t.Errorf("real nodes, quick: %+v", rs)
	}
	if rs := s7RealSizing(Config{S7Real: -1}); rs.Nodes != 0 {
		t.Errorf("real nodes off: %+v", rs)
	}
	if ss := s7SimSizing(Config{}); !slices.Equal(ss.Nodes, []int{128, 1000}) || ss.PerNode != 1000 {
		t.Errorf("simulation, full: %+v", ss)
	}
	if ss := s7SimSizing(Config{Quick: true}); !slices.Equal(ss.Nodes, []int{1000}) || ss.estimate() <= 0 {
		t.Errorf("simulation, quick: %+v", ss)
	}
	if ss := s7SimSizing(Config{S7SimOff: true}); len(ss.Nodes) != 0 {
		t.Errorf("simulation off: %+v", ss)
	}
	p := s7Plan(Config{Quick: true, S7Real: -1, S7SimOff: true})
	if p.steps != 3 {
		t.Errorf("quick plan without real nodes or simulation: %d steps, want 3", p.steps)
	}
}

func TestLists(t *testing.T) {
	nodes := []netio.NodeLevel{{Addr: "127.0.0.10:1"}, {Addr: "127.0.0.11:1", Level: 2}}
	if !lists(nodes, "127.0.0.11:1") || lists(nodes, "127.0.0.12:1") || lists(nil, "127.0.0.10:1") {
		t.Error("lists")
	}
}

// memberlist's own counters reach the sink through go-metrics' global, and
// only its sent bytes count.
func TestMemberlistSink(t *testing.T) {
	sink := s7Sink()
	b0, p0 := sink.sent()
	gometrics.IncrCounterWithLabels([]string{"memberlist", "udp", "sent"}, 100, nil)
	gometrics.IncrCounterWithLabels([]string{"memberlist", "udp", "sent"}, 50, nil)
	gometrics.IncrCounterWithLabels([]string{"memberlist", "tcp", "sent"}, 1000, nil)
	gometrics.IncrCounterWithLabels([]string{"memberlist", "udp", "received"}, 7, nil)
	gometrics.IncrCounter([]string{"memberlist", "msg", "alive"}, 1)
	if b, p := sink.sent(); b-b0 != 1150 || p-p0 != 2 {
		t.Errorf("counted %d bytes, %d packets; want 1150 and 2", b-b0, p-p0)
	}
}
