package itest

// Subsystem instances (004, issue 22 item 3) on three real nodes: "for
// each instance, you can have up to one server per system per application
// environment".

import (
	"slices"
	"strconv"
	"strings"
	"syscall"
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

	if _, err := wc.find(1, "orders"); err == nil || !strings.Contains(err.Error(), "orders@east, orders@west") {
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

// TestWLMInstancesDecideApart: each instance has a decider of its own (the
// seed applies the rules to each instance apart): with instances east and
// west on n0, n1, n2, n0 decides east's starts and n1 west's. With n0
// stopped (SIGSTOP: it answers nothing, and with the default failure
// detection the others take seconds to see it gone), a find of
// orders@west through n2 is answered by n1 at once, while n2 still
// counts n0 a member; before, n0 decided every instance's starts and
// this find waited for n0 to leave the tables (5.4 s in the outside
// check). A find of orders@east through n2 waits for that, and n1, east's
// decider then, starts one server of it. When n0 is back, the deciders
// are as before and each instance has its one server.
func TestWLMInstancesDecideApart(t *testing.T) {
	testenv.Slow(t, "waits out policy intervals and a failure detection")
	skipShort(t)
	wc := startWLMCluster(t, wlmOpts{
		policy:    ordersPolicy + "instance -n east\ninstance -n west\n",
		envs:      []string{"orders@east", "orders@west"},
		detection: "lan",
		busy: func(i int) float64 { // nothing is placed on n0
			if i == 0 {
				return 0.95
			}
			return 0
		},
	})
	spare := func(i int) float64 { return wc.nodes[i].report(t).SpareCPUs[0] }
	waitFor(t, 15*time.Second, "n0 to measure its CPUs busy and the others theirs spare", func() bool {
		return min(spare(1), spare(2)) > spare(0)+0.5
	}, func() string { return "" })
	time.Sleep(1500 * time.Millisecond) // the next announce reaches the deciders

	n0 := wc.nodes[0]
	must(t, syscall.Kill(n0.cmd.Process.Pid, syscall.SIGSTOP))
	t.Cleanup(func() { _ = syscall.Kill(n0.cmd.Process.Pid, syscall.SIGCONT) })
	// findAlive finds env through n2 and waits for its process on the
	// node named (findRunning would also call through the stopped n0).
	findAlive := func(env string) int {
		got, err := wc.find(2, env)
		if err != nil || len(got) != 1 || got[0] == 0 {
			t.Fatalf("find %s through n2 with n0 stopped: %v, %v; want one server on n1 or n2", env, got, err)
		}
		waitFor(t, 10*time.Second, env+"'s process to run on n"+strconv.Itoa(got[0]), func() bool {
			return len(uapPIDs(t, wc.nodes[got[0]], env)) == 1
		})
		return got[0]
	}
	began := time.Now()
	west := findAlive("orders@west")
	members := func() []string {
		st, err := wc.nodes[2].status()
		must(t, err)
		var ids []string
		for _, ns := range st.Cluster.Nodes {
			ids = append(ids, ns.Node)
		}
		return ids
	}
	if !slices.Contains(members(), "n0") {
		t.Errorf("n2 no longer counts n0 a member: the find of orders@west (%v) may have waited for that", time.Since(began))
	}
	t.Logf("orders@west on n%d, found in %v with n0 stopped", west, time.Since(began).Round(time.Millisecond))
	started := func() float64 {
		return metricSum(wc.nodes[1].metrics(), "tpsched_wlm_servers_started_total") +
			metricSum(wc.nodes[2].metrics(), "tpsched_wlm_servers_started_total")
	}
	if s := started(); s != 1 {
		t.Errorf("%v servers started on n1 and n2, want 1", s)
	}

	began = time.Now()
	east := findAlive("orders@east")
	t.Logf("orders@east on n%d, found in %v (after n0 left n2's table)", east, time.Since(began).Round(time.Millisecond))
	if slices.Contains(members(), "n0") {
		t.Errorf("orders@east was found while n2 still counts n0, its decider, a member: who decided it?")
	}
	if s := started(); s != 2 {
		t.Errorf("n1 and n2 started %v servers, want 2 (one per instance)", s)
	}

	// n0 back: every node names east's decider n0 and west's n1 again,
	// and sees the one server of each.
	must(t, syscall.Kill(n0.cmd.Process.Pid, syscall.SIGCONT))
	want := map[string]string{"orders@east": "n0", "orders@west": "n1"}
	waitFor(t, 30*time.Second, "every node to name n0 east's decider and n1 west's", func() bool {
		for _, n := range wc.nodes {
			for g, d := range want {
				if e, _ := envOf(t, n, g); e.Decider != d {
					return false
				}
			}
		}
		return true
	})
	for g := range want {
		wc.agree(t, 10*time.Second, g, one, "one server of "+g)
	}
}
