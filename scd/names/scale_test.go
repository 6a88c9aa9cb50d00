package names

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"tpsched/scd/loadlevel"
	"tpsched/scd/route"
)

// Test128Nodes runs the whole path of a cluster at its limit in one
// process: 128 nodes' announces, signed, decoded and applied to one node's
// table; a 129th refused by name; route choosing among the 128 from the
// table, never a LEVEL2 node while others are lower.
func Test128Nodes(t *testing.T) {
	codec := NewCodec([]byte("a-key-of-sixteen-bytes"))
	table := NewTable("n000")
	for i := range MaxNodes {
		level := loadlevel.Level0
		switch {
		case i%4 == 1:
			level = loadlevel.Level1
		case i%4 == 2:
			level = loadlevel.Level2
		}
		info := NodeInfo{Node: fmt.Sprintf("n%03d", i), Addr: fmt.Sprintf("10.0.%d.%d:12000", i/250, i%250+1),
			Announce: true, Boot: 1, Seq: 1,
			Groups: []GroupInfo{{Group: "pay", Level: level, Held: i%16 == 3}, {Group: "zz", Level: level}}}
		got, err := codec.Decode(codec.Encode(nil, info))
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
		if _, err := table.Apply(got); err != nil {
			t.Fatalf("node %d of %d refused: %v", i, MaxNodes, err)
		}
	}
	_, err := table.Apply(NodeInfo{Node: "n128", Boot: 1, Seq: 1, Groups: []GroupInfo{{Group: "pay"}}})
	if !errors.Is(err, ErrFull) || !strings.Contains(err.Error(), `"n128"`) || !strings.Contains(err.Error(), "128") {
		t.Fatalf("129th node: %v; want ErrFull naming n128 and the limit", err)
	}

	entries := table.Lookup("pay")
	if len(entries) != MaxNodes {
		t.Fatalf("Lookup(pay) has %d nodes, want %d", len(entries), MaxNodes)
	}
	var cands []route.Candidate
	for _, e := range entries {
		if !e.Held {
			cands = append(cands, route.Candidate{Node: e.Node, Local: e.Local, Level: e.Level})
		}
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	pol := route.Policy{Announce: true, ScheduleRate: 80}
	hits := map[string]int{}
	for range 20000 {
		i := route.Choose(cands, pol, route.Request{Direct: true}, rnd)
		if cands[i].Level == loadlevel.Level2 {
			t.Fatalf("chose %s at LEVEL2 while LEVEL0/1 nodes exist", cands[i].Node)
		}
		hits[cands[i].Node]++
	}
	// 56 LEVEL0 nodes (i%4 is 0 or 3, less the 8 held) weigh 80 each, 32
	// LEVEL1 weigh 20: every eligible node is reached and LEVEL0 takes
	// 4480:640 of the weight.
	var l0 int
	for _, c := range cands {
		if c.Level == loadlevel.Level2 {
			continue
		}
		if hits[c.Node] == 0 {
			t.Errorf("%s (%v) never chosen", c.Node, c.Level)
		}
		if c.Level == loadlevel.Level0 {
			l0 += hits[c.Node]
		}
	}
	if share := float64(l0) / 20000; share < 0.86 || share > 0.89 {
		t.Errorf("LEVEL0 share %.3f; want about 4480/5120 = 0.875", share)
	}
	if held := hits["n003"]; held != 0 {
		t.Errorf("a held node was chosen %d times", held)
	}
}
