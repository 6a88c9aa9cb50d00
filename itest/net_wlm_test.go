package itest

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"tpsched/internal/testenv"
)

// TestNetWLMPartition (issue 30 item 2d): the routing manager across a
// partition. Three nodes with the orders environment (nothing serves it
// yet); n0, the decider, is cut off from n1 and n2 both ways. Each side
// then has a decider of its own, as its tables say: finds on both sides,
// several at once, are each answered with a server or refused with a
// clear error within their time, and one side's finds start at most one
// server there, so at most two run in the cluster, never two on one node.
// After the heal every node names one decider, n0 again, and the same
// servers, and a find starts nothing more. The one-per-cluster rule does
// not hold across a partition: each side may start one, as the seed's
// "one server per system" still holds (docs/RELIABILITY.md, "The
// network").
func TestNetWLMPartition(t *testing.T) {
	testenv.Slow(t, "three nodes in network namespaces, a partition and a heal: about 40 s under -race")
	skipShort(t)
	orders := strings.ReplaceAll(ordersServer, "MODULE", strconv.Quote(bin("uap-echo")))
	nc := startNetClusterFiles(t, "", map[string]string{"svcpolicy": ordersPolicy, "usr/orders": orders}, "-fast-failure-detection")
	deciders := func() []string {
		var out []string
		for _, n := range nc.nodes {
			e, _ := envOf(t, n, "orders")
			out = append(out, e.Decider)
		}
		return out
	}
	waitFor(t, 15*time.Second, "every node to know that three can serve orders", func() bool {
		for _, n := range nc.nodes {
			if e, ok := envOf(t, n, "orders"); !ok || len(e.CanServe) != 3 {
				return false
			}
		}
		return true
	})
	if d := deciders(); !slices.Equal(d, []string{"n0", "n0", "n0"}) {
		t.Fatalf("deciders before the cut: %v, want n0 everywhere", d)
	}

	nc.lab.Isolate(0)
	waitFor(t, 30*time.Second, "both sides to see the partition", func() bool {
		k0, k1, k2 := nc.known(0), nc.known(1), nc.known(2)
		_, n1has0 := k1["n0"]
		_, n2has0 := k2["n0"]
		return len(k0) == 1 && !n1has0 && !n2has0
	})
	if d := deciders(); !slices.Equal(d, []string{"n0", "n1", "n1"}) {
		t.Errorf("deciders during the partition: %v, want n0 on its own side and n1 on the other", d)
	}

	// Finds on both sides at once: two through n0, two each through n1
	// and n2.
	type result struct {
		via   int
		nodes []int
		err   error
		took  time.Duration
	}
	var mu sync.Mutex
	var results []result
	var wg sync.WaitGroup
	for _, via := range []int{0, 0, 1, 1, 2, 2} {
		wg.Go(func() {
			began := time.Now()
			nodes, err := findVia(nc.nodes, via, "orders", "15s")
			mu.Lock()
			results = append(results, result{via, nodes, err, time.Since(began)})
			mu.Unlock()
		})
	}
	wg.Wait()
	sides := map[bool][]int{} // n0's side (true) and the other: the nodes their finds named
	for _, r := range results {
		t.Logf("find orders through n%d during the partition: %v, %v (%v)", r.via, r.nodes, r.err, r.took.Round(time.Millisecond))
		if r.err != nil {
			// Refused: it must say why, not hang until scdctl gives up.
			if strings.Contains(r.err.Error(), "signal: killed") || strings.TrimSpace(r.err.Error()) == "" {
				t.Errorf("find through n%d: %v: no clear answer", r.via, r.err)
			}
			continue
		}
		sides[r.via == 0] = append(sides[r.via == 0], r.nodes...)
	}
	for own, named := range sides {
		slices.Sort(named)
		if named = slices.Compact(named); len(named) != 1 {
			t.Errorf("finds on one side of the partition (n0's: %v) named %v: want one server there", own, named)
		}
	}
	started := func(i int) float64 {
		return metricSum(nc.nodes[i].metrics(), "tpsched_wlm_servers_started_total")
	}
	s0, s12 := started(0), started(1)+started(2)
	if s0 > 1 || s12 > 1 {
		t.Errorf("servers started during the partition: %v on n0's side, %v on the other; want at most one on each", s0, s12)
	}

	nc.lab.Rejoin(0)
	waitFor(t, 30*time.Second, "every node to know all three again", func() bool {
		return len(nc.known(0)) == 3 && len(nc.known(1)) == 3 && len(nc.known(2)) == 3
	})
	var servers []string
	waitFor(t, 15*time.Second, "every node to name n0 the decider and the same servers", func() bool {
		if !slices.Equal(deciders(), []string{"n0", "n0", "n0"}) {
			return false
		}
		var seen [][]string
		for _, n := range nc.nodes {
			seen = append(seen, serversSeen(t, n, "orders"))
		}
		servers = seen[0]
		return slices.Equal(seen[0], seen[1]) && slices.Equal(seen[1], seen[2])
	}, func() string { return fmt.Sprint(deciders()) })
	t.Logf("after the heal: orders served on %v, decided by n0", servers)
	for i := range nc.nodes {
		if s := started(i); s > 1 {
			t.Errorf("n%d started %v servers of orders, want at most one", i, s)
		}
	}
	before := started(0) + started(1) + started(2)
	if nodes, err := findVia(nc.nodes, 2, "orders", "15s"); err != nil || len(nodes) != len(servers) {
		t.Errorf("find after the heal: %v, %v; want the %d servers running", nodes, err, len(servers))
	}
	if after := started(0) + started(1) + started(2); after != before {
		t.Errorf("a find after the heal started %v more servers", after-before)
	}
}
