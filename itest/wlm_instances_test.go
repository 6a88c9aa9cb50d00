package itest

// Subsystem instances (004, issue 22 item 3) on three real nodes: "for
// each instance, you can have up to one server per system per application
// environment".

import (
	"slices"
	"strings"
	"testing"
	"time"

	"tpsched/internal/testenv"
	"tpsched/netio"
)

// TestWLMInstancesServePerNode: with instances east and west of one
// policy, orders is served per instance (the groups orders@east and
// orders@west, both defined by usr/orders). n1's and n2's CPUs are busy,
// so each instance's first server goes to n0: one node runs two servers of
// orders, one per instance, each with a process of its own that serves
// its instance's calls. A find for orders itself is refused, naming the
// instances; the report counts servers and the high-water mark per
// instance; prc orders lists both; quiesce of one instance leaves the
// other serving. Before instances, svcpolicy's instance command was
// unknown (scdd refused to start) and a node ran at most one server of
// orders.
func TestWLMInstancesServePerNode(t *testing.T) {
	testenv.Slow(t, "waits out policy intervals; 5 s without -race on a busy 2-core machine")
	skipShort(t)
	instances := []string{"orders@east", "orders@west"}
	wc := startWLMCluster(t, wlmOpts{
		policy: ordersPolicy + "instance -n east\ninstance -n west\n",
		envs:   instances,
		busy: func(i int) float64 {
			if i == 0 {
				return 0
			}
			return 0.95
		},
	})
	spare := func(i int) float64 { return wc.nodes[i].report(t).SpareCPUs[0] }
	waitFor(t, 15*time.Second, "n0 to measure its CPUs spare and the others theirs busy", func() bool {
		return spare(0) > max(spare(1), spare(2))+0.5
	}, func() string { return "" })
	time.Sleep(1500 * time.Millisecond) // the next announce reaches the decider

	east := wc.findRunning(t, 1, "orders@east", "find orders@east")
	west := wc.findRunning(t, 2, "orders@west", "find orders@west")
	if east != 0 || west != 0 {
		t.Fatalf("orders@east on n%d, orders@west on n%d: want both on n0, the node with the spare CPU", east, west)
	}
	n0 := wc.nodes[0]
	eastPIDs, westPIDs := uapPIDs(t, n0, "orders@east"), uapPIDs(t, n0, "orders@west")
	if len(eastPIDs) != 1 || len(westPIDs) != 1 || eastPIDs[0] == westPIDs[0] {
		t.Fatalf("n0's processes: east %v, west %v; want one of each", eastPIDs, westPIDs)
	}
	t.Logf("n0 runs orders@east's process %v and orders@west's %v", eastPIDs, westPIDs)

	if _, err := wc.find(t, 1, "orders"); err == nil || !strings.Contains(err.Error(), "orders@east, orders@west") {
		t.Errorf("find orders itself: %v; want refused, naming the instances", err)
	}
	_, err := wc.nodes[2].client().Call(ctxT(t, 5*time.Second), "orders", "echo", nil)
	if codeOf(err) != netio.CodeNoSuchGroup {
		t.Errorf("call for orders itself: %v; want 'no such service group'", err)
	}

	for i, n := range wc.nodes {
		for _, g := range instances {
			e, ok := envOf(t, n, g)
			_, in, _ := strings.Cut(g, "@")
			if !ok || e.Environment != "orders" || e.Instance != in || e.HighWaterMark != 1 ||
				!slices.Equal(serversSeen(t, n, g), []string{"n0"}) {
				t.Errorf("n%d's report of %s: %+v; want orders, instance %s, high-water mark 1, served on n0", i, g, e, in)
			}
		}
	}
	out, err := wc.nodes[1].scdctl("report")
	if err != nil || !strings.Contains(out, "INSTANCE") {
		t.Errorf("scdctl report: %v, no INSTANCE column:\n%s", err, out)
	}
	t.Logf("scdctl report through n1:\n%s", out)
	out, err = n0.scdctl("prc", "orders")
	if err != nil || !strings.Contains(out, "orders@east") || !strings.Contains(out, "orders@west") {
		t.Errorf("scdctl prc orders on n0: %v; want both instances' processes:\n%s", err, out)
	}

	out, err = wc.nodes[1].scdctl("quiesce", "orders@east")
	if err != nil {
		t.Fatalf("scdctl quiesce orders@east: %v\n%s", err, out)
	}
	t.Logf("scdctl quiesce orders@east:\n%s", out)
	waitFor(t, 10*time.Second, "orders@east's process to leave", func() bool { return !pidAlive(eastPIDs[0]) })
	wc.agree(t, 10*time.Second, "orders@east", func(s []string) bool { return len(s) == 0 }, "no node to serve orders@east")
	if !pidAlive(westPIDs[0]) {
		t.Error("quiesce of orders@east ended orders@west's process")
	}
	_, err = wc.nodes[1].client().Call(ctxT(t, 5*time.Second), "orders@east", "echo", nil)
	if codeOf(err) != netio.CodeServiceClosed {
		t.Errorf("call for orders@east after its quiesce: %v, want 'service closed'", err)
	}
	wc.findRunning(t, 1, "orders@west", "find orders@west after east's quiesce")
	if s := wc.started(t); s != 2 {
		t.Errorf("%v servers started in the cluster, want 2 (one per instance)", s)
	}

	// quiesce orders acts on every instance, a result line per node and
	// instance.
	out, err = wc.nodes[2].scdctl("quiesce", "orders")
	if err != nil || !strings.Contains(out, "INSTANCE") || strings.Count(out, "orders@") < 6 {
		t.Errorf("scdctl quiesce orders: %v; want a line per node and instance:\n%s", err, out)
	}
	t.Logf("scdctl quiesce orders:\n%s", out)
	waitFor(t, 10*time.Second, "orders@west's process to leave", func() bool { return !pidAlive(westPIDs[0]) })
	for _, g := range instances {
		if e, _ := envOf(t, wc.nodes[1], g); !e.Quiesced {
			t.Errorf("%s after quiesce orders: %+v, want quiesced", g, e)
		}
	}
}
