package bench

import (
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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

func TestGossipVerdict(t *testing.T) {
	base := func() *gossipResult {
		return &gossipResult{Setup: gossipSetup{Nodes: 128, ProbeLimit: 10 * time.Second}, Joined: true,
			Probes: make([]probeResult, 30), AllP99Ms: 700, AllMaxMs: 700}
	}
	r := base()
	if got := gossipVerdict(r, time.Second); !strings.Contains(got, "p99 700 ms over 30 changes (max 700 ms): **met**") ||
		!strings.Contains(got, "nearest-rank p99 is the maximum") {
		t.Errorf("met: %q", got)
	}
	r.AllP99Ms, r.AllMaxMs = 1200, 1200
	if got := gossipVerdict(r, time.Second); !strings.Contains(got, "**NOT met**") {
		t.Errorf("slow: %q", got)
	}
	r = base()
	r.NotConverged = 2
	if got := gossipVerdict(r, time.Second); !strings.Contains(got, "2 of 30 changes did not reach every table") || !strings.Contains(got, "NOT met") {
		t.Errorf("not converged: %q", got)
	}
	r = base()
	r.Joined, r.JoinKnownMin, r.JoinSeconds = false, 120, 60
	if got := gossipVerdict(r, time.Second); !strings.Contains(got, "join did not converge (smallest table 120 of 128") {
		t.Errorf("not joined: %q", got)
	}
	if got := gossipVerdict(nil, time.Second); !strings.Contains(got, "not checked") {
		t.Errorf("nothing: %q", got)
	}
}

func TestGossipMarkdown(t *testing.T) {
	g := &gossipResult{Setup: gossipSetup{Nodes: 3, Probes: 2, Quiet: time.Second, ProbeLimit: time.Second}, Joined: true, JoinSeconds: 2.5,
		MembersMin: 3, MembersMax: 3, AllP50Ms: 100, AllP99Ms: 200, AllMaxMs: 200,
		Quiet:  traffic{Seconds: 1, BytesPerNodeS: 1234, Announces: 3},
		Probes: []probeResult{{Node: "m001", Level: "LEVEL1", Seen: 2, AllMs: 100, P50Ms: 80}, {Node: "m002", Level: "LEVEL1", Seen: 1, P50Ms: 90}}}
	r := &report{Scenario: "S7", Title: "t", Date: "2026-01-01", Gossip: g, Setup: s7Setup(g.Setup, true)}
	md := r.Markdown()
	for _, w := range []string{"# S7: t", "| join: every table holds every member | 2.5 s |", "| quiet (refresh only) | 1.0 | 3 | 1234 |",
		"| 1 | m001 | LEVEL1 | 2 / 2 | 80 ms | 100 ms |", "| 2 | m002 | LEVEL1 | 1 / 2 | 90 ms | - |", "GossipConfig{Fast: false}", "Quick mode"} {
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
	r := &gossipResult{Setup: gossipSetup{Nodes: 128, ProbeLimit: 10 * time.Second, Cores: 2}, Joined: true,
		Probes: make([]probeResult, 30), AllP99Ms: 4000, AllMaxMs: 7700, Stuck: []string{"m001", "m002"}, LeaveStuck: 2,
		Quiet:   traffic{TableDrops: 3, MinTable: 127, CPUCores: 1.95},
		Changes: traffic{TableDrops: 5, MinTable: 126, CPUCores: 1.6}}
	got := gossipVerdict(r, time.Second)
	for _, w := range []string{"**NOT met**", "**2 members were stuck**", "2 did not finish Leave", "Tables lost a member 8 times (quiet 3, changes 5; smallest table 126)",
		"used 1.95 (quiet) and 1.60 (changes) of the machine's 2 cores"} {
		if !strings.Contains(got, w) {
			t.Errorf("verdict lacks %q:\n%s", w, got)
		}
	}
}
