package itest

// Which calls schedule_rate weighs (issue 22 item 1), on three real nodes
// with one held at LEVEL1: only a scheduler-direct client's (dcscddirect =
// Y, document 000); a UAP's own call and a plain client's go to the
// least-loaded node (Table 3-7, announce Y and this_node_first N).

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"tpsched/internal/testenv"
	"tpsched/scd/client"
)

// spreadServer is the group whose calls are counted: four resident
// processes (so that the LEVEL0 nodes stay LEVEL0 under the test's calls),
// load checked every second, Table 3-14 thresholds that hold a node at
// LEVEL1 from 2 waiting calls up to 199.
const spreadServer = `set service_group = "spread"
set service = "pid=pid", "sleep=sleep"
set module = MODULE
set parallel_count = 4
set queue_size = 512
set loadcheck_interval = 1
set levelup_queue_count = 2,200
set leveldown_queue_count = 1,100
`

// levelOf is the level n's name table holds for group on node.
func levelOf(t *testing.T, n *node, node, group string) string {
	st, err := n.status()
	must(t, err)
	if st.Cluster == nil {
		return ""
	}
	for _, ns := range st.Cluster.Nodes {
		if ns.Node != node {
			continue
		}
		for _, g := range ns.Groups {
			if g.Group == group {
				return g.Level
			}
		}
	}
	return ""
}

// holdAtLevel1 keeps 16 balanced sleeps of 30 ms in flight on node slow's
// spread group (four processes: about 12 wait, so Table 3-14 puts it at
// LEVEL1 and keeps it there) until the test ends, and waits until every
// node sees slow at LEVEL1 and the others at LEVEL0.
func holdAtLevel1(t *testing.T, nodes []*node, slow int) {
	t.Helper()
	c := nodes[slow].client(func(o *client.Options) { o.Balanced = true })
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for range 16 {
		wg.Go(func() {
			for ctx.Err() == nil {
				_, _ = c.Call(ctx, "spread", "sleep", []byte("30"))
			}
		})
	}
	for i, n := range nodes {
		for j := range nodes {
			want := "LEVEL0"
			if j == slow {
				want = "LEVEL1"
			}
			waitFor(t, 15*time.Second, fmt.Sprintf("n%d to see n%d's spread at %s", i, j, want), func() bool {
				return levelOf(t, n, fmt.Sprintf("n%d", j), "spread") == want
			})
		}
	}
}

// checkLevels fails the test unless every node still sees slow at LEVEL1
// and the others at LEVEL0: counts taken while a level moved mean nothing.
func checkLevels(t *testing.T, nodes []*node, slow int, what string) {
	t.Helper()
	for i, n := range nodes {
		for j := range nodes {
			want := "LEVEL0"
			if j == slow {
				want = "LEVEL1"
			}
			if got := levelOf(t, n, fmt.Sprintf("n%d", j), "spread"); got != want {
				t.Fatalf("%s: n%d sees n%d's spread at %s, want %s: the levels moved under the test", what, i, j, got, want)
			}
		}
	}
}

// spreadCount makes calls calls through the three nodes in turn, two at a
// time per node, and counts which node's spread process answered each;
// call returns the pid it got.
func spreadCount(t *testing.T, nodes []*node, calls int, call func(c *client.Client) (string, error),
	opts ...func(*client.Options)) [3]int {
	t.Helper()
	owners := map[string]int{}
	for i, n := range nodes {
		for _, p := range groupStatus(t, n, "spread").Processes {
			owners[strconv.Itoa(p.PID)] = i
		}
	}
	var mu sync.Mutex
	var count [3]int
	var wg sync.WaitGroup
	for i, n := range nodes {
		c := n.client(opts...)
		for range 2 {
			wg.Go(func() {
				for range calls / len(nodes) / 2 {
					pid, err := call(c)
					if err != nil {
						t.Errorf("call through n%d: %v", i, err)
						return
					}
					owner, ok := owners[pid]
					if !ok {
						t.Errorf("answered by pid %q, which no node's spread runs", pid)
						return
					}
					mu.Lock()
					count[owner]++
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	return count
}

// TestScheduleRateOnlyForSchedulerDirect: n2's spread is held at LEVEL1,
// n0's and n1's are LEVEL0, schedule_rate = 80. A UAP's own calls (front's
// call service calling spread) and a plain client's calls are not
// scheduler-direct: they go to the least-loaded nodes, n0 and n1, and n2
// gets none. A client with dcscddirect = Y is scheduler-direct: LEVEL0
// nodes weigh 80 and LEVEL1 nodes 20, so n2 gets 20/(2x80+20), a ninth.
// Before the fix all three kinds were weighted alike (n2: about a third
// at the default rate 50, a ninth at 80).
func TestScheduleRateOnlyForSchedulerDirect(t *testing.T) {
	testenv.Slow(t, "runs for seconds; 6 s without -race on a busy 2-core machine")
	skipShort(t)
	nodes := startCluster(t, clusterOpts{
		sched: "set schedule_rate = 80\n",
		extra: func(int) map[string]string {
			return map[string]string{"spread": spreadServer, "front": fmt.Sprintf(callerServer, "front", 4)}
		},
	})
	holdAtLevel1(t, nodes, 2)
	const calls = 300
	ctx := ctxT(t, 60*time.Second)
	pid := func(c *client.Client) (string, error) {
		out, err := c.Call(ctx, "spread", "pid", nil)
		return string(out), err
	}
	uap := spreadCount(t, nodes, calls, func(c *client.Client) (string, error) {
		out, err := c.Call(ctx, "front", "call", []byte("spread/pid/"))
		return string(out), err
	})
	checkLevels(t, nodes, 2, "a UAP's calls")
	plain := spreadCount(t, nodes, calls, pid)
	checkLevels(t, nodes, 2, "a plain client's calls")
	direct := spreadCount(t, nodes, calls, pid, func(o *client.Options) { o.SchedulerDirect = true })
	checkLevels(t, nodes, 2, "a scheduler-direct client's calls")
	t.Logf("served per node (n2 at LEVEL1, schedule_rate 80): a UAP's calls %v, a plain client's %v, a scheduler-direct client's %v",
		uap, plain, direct)
	for _, c := range []struct {
		what  string
		count [3]int
	}{{"a UAP's calls (shm.UAP.Call)", uap}, {"a plain client's calls (dcscddirect = N)", plain}} {
		if c.count[2] != 0 || c.count[0] < 90 || c.count[1] < 90 {
			t.Errorf("%s served per node %v: want none on the LEVEL1 node n2 and the rest over n0 and n1", c.what, c.count)
		}
	}
	// n2 expects 300/9 = 33 (one sigma 5.4); uniform would give 100.
	if direct[2] < 10 || direct[2] > 65 || direct[0] < 80 || direct[1] < 80 {
		t.Errorf("a scheduler-direct client's calls served per node %v: want about a ninth on n2 (schedule_rate 80: 80x2:20x1)", direct)
	}
}
