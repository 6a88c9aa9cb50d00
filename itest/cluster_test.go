package itest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"tpsched/internal/freeport"
	"tpsched/internal/testenv"
	"tpsched/netio"
	"tpsched/scd"
	"tpsched/scd/client"
)

// Clusters of three scdd processes on 127.0.0.2, .3 and .4: the same ports
// on each address, as on three hosts.

var clusterIPs = []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}

// workServer is the group every node of a cluster runs: one process, load
// checked every second, LEVEL2 from 4 waiting requests (Table 3-14), back
// to LEVEL0 at 0.
const workServer = `set service_group = "work"
set service = "echo=echo", "sleep=sleep", "pid=pid"
set module = MODULE
set parallel_count = 1
set queue_size = 512
set loadcheck_interval = 1
set levelup_queue_count = 2,4
set leveldown_queue_count = 0,1
`

// clusterPorts finds an RPC port and a name port free on every address.
func clusterPorts(t *testing.T) (rpc, name int) {
	t.Helper()
	p, err := freeport.Common(clusterIPs, 2)
	if err != nil {
		t.Fatal(err)
	}
	return p[0], p[1]
}

// clusterSysconf is the sysconf of node i of a cluster of the nodes at
// ips, on ports rpc and name: every node in all_node, its metrics on its
// own address, its own control socket.
func clusterSysconf(i int, ips []string, rpc, name int) string {
	all := make([]string, len(ips))
	for j, ip := range ips {
		all[j] = strconv.Quote(ip)
	}
	return fmt.Sprintf("set node_id = \"n%d\"\nset rpc_address = %q\nset rpc_port = %d\nset name_port = %d\n"+
		"set metrics_address = \"%s:0\"\nset all_node = %s\n", i, ips[i], rpc, name, ips[i], strings.Join(all, ", ")) + ownControlSocket
}

type clusterOpts struct {
	sched string                        // scdsvcdef lines
	key   func(i int) string            // cluster_key of node i; nil: none
	extra func(i int) map[string]string // more usr files of node i (name -> body, as defDir's)
}

// startCluster starts three nodes that know each other and waits until
// each sees all three with the work group.
func startCluster(t *testing.T, o clusterOpts) []*node {
	t.Helper()
	return startOnFreePorts(t, func(rpc, name int) ([]*node, error) { return tryStartCluster(t, o, rpc, name) })
}

// startOnFreePorts runs start, which starts a cluster's nodes on an RPC and
// a name port clusterPorts found free, and runs it again on new ports when
// a node found its port taken: the ports are found free before the nodes
// bind them, and one may be taken in between (make chaos saw a name port
// in use by the time the third node bound it, make test a WLM cluster's).
// The nodes a failed start returns are stopped first.
func startOnFreePorts(t *testing.T, start func(rpc, name int) ([]*node, error)) []*node {
	t.Helper()
	for attempt := 1; ; attempt++ {
		nodes, err := start(clusterPorts(t))
		if err == nil {
			return nodes
		}
		if attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			t.Fatal(err)
		}
		t.Logf("starting the nodes again on other ports: %v", err)
		for _, n := range nodes {
			n.signal(syscall.SIGTERM)
			<-n.done
		}
	}
}

// tryStartCluster starts the three nodes of startCluster on ports rpc and
// name; on a node that does not start it returns the nodes started so far
// and why.
func tryStartCluster(t *testing.T, o clusterOpts, rpc, name int) ([]*node, error) {
	t.Helper()
	nodes := make([]*node, len(clusterIPs))
	for i := range clusterIPs {
		dir := t.TempDir()
		sys := clusterSysconf(i, clusterIPs, rpc, name)
		if o.key != nil {
			sys += fmt.Sprintf("set cluster_key = %q\n", o.key(i))
		}
		must(t, os.WriteFile(filepath.Join(dir, "sysconf"), []byte(sys), 0o644))
		must(t, os.WriteFile(filepath.Join(dir, "scdsvcdef"), []byte(o.sched), 0o644))
		must(t, os.MkdirAll(filepath.Join(dir, "usr"), 0o755))
		body := strings.ReplaceAll(workServer, "MODULE", strconv.Quote(bin("uap-echo")))
		must(t, os.WriteFile(filepath.Join(dir, "usr", "work"), []byte(body), 0o644))
		if o.extra != nil {
			for file, body := range o.extra(i) {
				body = strings.ReplaceAll(body, "MODULE", strconv.Quote(bin("uap-echo")))
				must(t, os.WriteFile(filepath.Join(dir, "usr", file), []byte(body), 0o644))
			}
		}
		n, err := tryStartCommand(t, nil, bin("scdd"), "-c", dir, "-fast-failure-detection")
		if err != nil {
			return append(nodes[:i], n), err
		}
		nodes[i] = n
	}
	if o.key == nil || o.key(0) == o.key(1) && o.key(1) == o.key(2) {
		for i, n := range nodes {
			waitFor(t, 15*time.Second, fmt.Sprintf("n%d to know all three nodes", i), func() bool {
				return len(knownNodes(t, n)) == 3
			}, n.stderr.String)
		}
	}
	return nodes, nil
}

// knownNodes is the nodes n's name table holds with the work group.
func knownNodes(t *testing.T, n *node) map[string]scd.NodeStatus {
	st, err := n.status()
	must(t, err)
	out := map[string]scd.NodeStatus{}
	if st.Cluster == nil {
		return out
	}
	for _, ns := range st.Cluster.Nodes {
		for _, g := range ns.Groups {
			if g.Group == "work" {
				out[ns.Node] = ns
			}
		}
	}
	return out
}

// knowsGroup reports whether n's name table says that node serves group.
func knowsGroup(t *testing.T, n *node, node, group string) bool {
	st, err := n.status()
	if err != nil || st.Cluster == nil {
		return false
	}
	for _, ns := range st.Cluster.Nodes {
		for _, g := range ns.Groups {
			if ns.Node == node && g.Group == group {
				return true
			}
		}
	}
	return false
}

// uapOwners maps each node's uap-echo pids to the node's index.
func uapOwners(t *testing.T, nodes []*node) map[string]int {
	owners := map[string]int{}
	for i, n := range nodes {
		for _, p := range groupStatus(t, n, "work").Processes {
			owners[strconv.Itoa(p.PID)] = i
		}
	}
	return owners
}

// spread makes calls of the pid service through every node and counts
// which node's process answered each.
func spread(t *testing.T, nodes []*node, calls int) [3]int {
	t.Helper()
	owners := uapOwners(t, nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	var count [3]int
	var wg sync.WaitGroup
	for i, n := range nodes {
		c := n.client()
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range calls / len(nodes) / 4 {
					out, err := c.Call(ctx, "work", "pid", nil)
					if err != nil {
						t.Errorf("call through n%d: %v", i, err)
						return
					}
					owner, ok := owners[string(out)]
					if !ok {
						t.Errorf("answered by pid %s, which no node runs", out)
						return
					}
					mu.Lock()
					count[owner]++
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	return count
}

// overload fills node's queue with sleeps it keeps (balanced calls stay
// where they are sent while the group is not LEVEL2) and waits until the
// other nodes see it at LEVEL2.
func overload(t *testing.T, nodes []*node, slow int) {
	t.Helper()
	c := nodes[slow].client(func(o *client.Options) { o.Balanced = true })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 40 {
		must(t, c.CallNoReply(ctx, "work", "sleep", []byte("200"))) // 8 s of work for one process
	}
	slowName := fmt.Sprintf("n%d", slow)
	for i, n := range nodes {
		if i == slow {
			continue
		}
		waitFor(t, 10*time.Second, fmt.Sprintf("n%d to see %s at LEVEL2", i, slowName), func() bool {
			ns := knownNodes(t, n)[slowName]
			return len(ns.Groups) > 0 && ns.Groups[0].Level == "LEVEL2"
		})
	}
}

// TestClusterAvoidsLevel2Node: once one node's group is LEVEL2 and the
// others know it, calls through any node go to the other two.
func TestClusterAvoidsLevel2Node(t *testing.T) {
	testenv.Slow(t, "nodes started and stopped; 9 s without -race on a busy 2-core machine")
	skipShort(t)
	nodes := startCluster(t, clusterOpts{})
	overload(t, nodes, 0)
	count := spread(t, nodes, 300)
	t.Logf("calls served per node with n0 at LEVEL2: %v", count)
	if count[0] != 0 || count[1] < 60 || count[2] < 60 {
		t.Errorf("served per node %v: want none on the LEVEL2 node n0 and the rest spread over n1 and n2", count)
	}
	// What went where is visible to operators.
	m := nodes[0].metrics()
	if !strings.Contains(m, `tpsched_forwarded_total{to="n1"}`) || !strings.Contains(m, `tpsched_forwarded_total{to="n2"}`) {
		t.Errorf("n0's /metrics does not count calls sent to n1 and n2:\n%s", grep(m, "forwarded"))
	}
	if m := nodes[1].metrics(); !strings.Contains(m, `tpsched_requests_received_total{from="n0"}`) {
		t.Errorf("n1's /metrics does not count calls received from n0:\n%s", grep(m, "received"))
	}
	out, err := nodes[1].scdctl("status")
	must(t, err)
	if !strings.Contains(out, "work:LEVEL2") || !strings.Contains(out, "n1 (this node)") {
		t.Errorf("scdctl status does not show the nodes and their levels:\n%s", out)
	}
}

// TestClusterAnnounceOffSpreadsAtRandom: with scd_announce_server_status=N
// nobody knows the others' levels, so calls spread over all three even
// while one is LEVEL2.
func TestClusterAnnounceOffSpreadsAtRandom(t *testing.T) {
	skipShort(t)
	nodes := startCluster(t, clusterOpts{sched: "set scd_announce_server_status = N\n"})
	for _, ns := range knownNodes(t, nodes[1]) {
		if ns.Announces || ns.Groups[0].Level != "LEVEL0" {
			t.Errorf("with announce N, n1 sees %+v", ns)
		}
	}
	count := spread(t, nodes, 300)
	t.Logf("calls served per node, announce N: %v", count)
	// Uniform over 3 nodes: each gets 100 ± 8 (one sigma); 45 is far out.
	for i, c := range count {
		if c < 45 {
			t.Errorf("node n%d served %d of 300: not a random spread %v", i, c, count)
		}
	}
}

// load runs calls through the given nodes until stop, recording each
// failure with the time it happened.
type failure struct {
	at   time.Time
	code netio.Code
	err  error
}

func load(ctx context.Context, nodes []*node, fails chan<- failure, ok *atomic.Int64) *sync.WaitGroup {
	var wg sync.WaitGroup
	for _, n := range nodes {
		c := n.client()
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					_, err := c.Call(cctx, "work", "echo", []byte("x"))
					cancel()
					if err == nil {
						ok.Add(1)
					} else if ctx.Err() == nil {
						fails <- failure{time.Now(), codeOf(err), err}
					}
				}
			}()
		}
	}
	return &wg
}

// killUnderLoad kills n2 while calls flow through n0 and n1 and returns
// the failures, the time both survivors had forgotten n2, and the calls
// that succeeded after that.
func killUnderLoad(t *testing.T, nodes []*node) ([]failure, time.Time, int64) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fails := make(chan failure, 100000)
	var ok atomic.Int64
	wg := load(ctx, nodes[:2], fails, &ok)
	time.Sleep(300 * time.Millisecond)
	must(t, syscall.Kill(-nodes[2].cmd.Process.Pid, syscall.SIGKILL))
	killed := time.Now()
	var forgotten time.Time
	waitFor(t, 10*time.Second, "n0 and n1 to forget the killed n2", func() bool {
		_, in0 := knownNodes(t, nodes[0])["n2"]
		_, in1 := knownNodes(t, nodes[1])["n2"]
		forgotten = time.Now()
		return !in0 && !in1
	})
	t.Logf("n2 detected dead after %v", forgotten.Sub(killed).Round(time.Millisecond))
	okBefore := ok.Load()
	time.Sleep(time.Second)
	cancel()
	wg.Wait()
	close(fails)
	var out []failure
	for f := range fails {
		out = append(out, f)
	}
	return out, forgotten, ok.Load() - okBefore
}

// TestChaosNodeKilledRetried: with scd_retry_of_comm_error=1 a call sent
// towards the dead node is tried on another, and once the node is known
// dead nothing fails.
func TestChaosNodeKilledRetried(t *testing.T) {
	skipShort(t)
	nodes := startCluster(t, clusterOpts{sched: "set scd_retry_of_comm_error = 1\n"})
	fails, forgotten, after := killUnderLoad(t, nodes)
	if after < 100 {
		t.Errorf("only %d calls succeeded in the second after n2 was forgotten", after)
	}
	for _, f := range fails {
		if f.at.After(forgotten) {
			t.Errorf("a call failed after n2 was known dead: %v", f.err)
		}
		if f.code != netio.CodeNetworkDown {
			t.Errorf("failure %v: want 'network down'", f.err)
		}
	}
	chaosFigures(t, "kill -9 of one node of three, retry 1: %d calls failed (in flight on n2 when it died), %d succeeded in the second after; %s", len(fails), after, whyFailed(fails))
}

// whyFailed counts failures by their message with the numbers taken out.
func whyFailed(fails []failure) string {
	counts := map[string]int{}
	for _, f := range fails {
		counts[regexp.MustCompile(`[0-9]+(\.[0-9]+){3}(:[0-9]+)?`).ReplaceAllString(f.err.Error(), "#")]++
	}
	return fmt.Sprint(counts)
}

// TestChaosNodeKilledNoRetry: with scd_retry_of_comm_error=0 a call
// routed to the dead node fails with a clear 'network down'; once the node
// is known dead nothing fails. A restarted node rejoins.
func TestChaosNodeKilledNoRetry(t *testing.T) {
	testenv.Slow(t, "a fault experiment; 5 s without -race on a busy 2-core machine")
	skipShort(t)
	nodes := startCluster(t, clusterOpts{})
	fails, forgotten, _ := killUnderLoad(t, nodes)
	chaosFigures(t, "kill -9 of one node of three, retry 0: %d calls failed, none after it was known dead: %s", len(fails), whyFailed(fails))
	if len(fails) == 0 {
		t.Errorf("no call failed although some were routed to the dead node with retries off")
	}
	for _, f := range fails {
		if f.code != netio.CodeNetworkDown || !strings.Contains(f.err.Error(), "n2") {
			t.Errorf("failure %v: want 'network down' naming n2", f.err)
		}
		if f.at.After(forgotten) {
			t.Errorf("a call failed after n2 was known dead: %v", f.err)
		}
	}
	// The node comes back and rejoins every table.
	restarted := startNode(t, nodes[2].cmd.Args[1:]...)
	for i, n := range []*node{nodes[0], nodes[1], restarted} {
		waitFor(t, 15*time.Second, fmt.Sprintf("node %d to know all three again", i), func() bool {
			return len(knownNodes(t, n)) == 3
		})
	}
}

// TestChaosNodeStoppedUnderLoad: SIGTERM of one node of three while
// calls flow through the other two, with scd_retry_of_comm_error=1. The
// node leaves the cluster before it refuses anything, and a refusal that
// still reaches a forwarder ('node shutting down': the call never ran) is
// sent to another node, so no call fails.
func TestChaosNodeStoppedUnderLoad(t *testing.T) {
	skipShort(t)
	nodes := startCluster(t, clusterOpts{sched: "set scd_retry_of_comm_error = 1\n"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fails := make(chan failure, 100000)
	var ok atomic.Int64
	wg := load(ctx, nodes[:2], fails, &ok)
	sentToN2 := func() float64 {
		return metricSum(nodes[0].metrics(), `tpsched_forwarded_total{to="n2"}`) +
			metricSum(nodes[1].metrics(), `tpsched_forwarded_total{to="n2"}`)
	}
	waitFor(t, 10*time.Second, "calls to reach n2 through the others", func() bool { return sentToN2() >= 200 })
	before := sentToN2()
	nodes[2].signal(syscall.SIGTERM)
	stopped := time.Now()
	if err := nodes[2].waitExit(30 * time.Second); err != nil {
		t.Errorf("n2 exit: %v", err)
	}
	stoppedIn := time.Since(stopped).Round(time.Millisecond)
	okAtExit := ok.Load()
	time.Sleep(time.Second) // the others go on without it
	cancel()
	wg.Wait()
	close(fails)
	var retried float64
	for _, n := range nodes[:2] {
		retried += metricSum(n.metrics(), `tpsched_transfer_retries_total{`)
	}
	n := 0
	for f := range fails {
		if n++; n <= 10 {
			t.Errorf("call failed %v after the SIGTERM: %v", f.at.Sub(stopped).Round(time.Millisecond), f.err)
		}
	}
	chaosFigures(t, "SIGTERM of one node of three, retry 1: %d calls failed; %d succeeded (%d after n2 exited in %v), %.0f sent to n2 before the SIGTERM and %.0f after, %.0f sent on to another node",
		n, ok.Load(), ok.Load()-okAtExit, stoppedIn, before, sentToN2()-before, retried)
	if n > 0 {
		t.Errorf("%d calls failed while one node of three stopped", n)
	}
	if ok.Load()-okAtExit < 100 {
		t.Errorf("only %d calls succeeded in the second after n2 exited", ok.Load()-okAtExit)
	}
}

// TestClusterForgedAnnouncesDropped: a node with another cluster_key is
// heard but not believed: its announces are dropped and counted, and no
// call is sent to it.
func TestClusterForgedAnnouncesDropped(t *testing.T) {
	skipShort(t)
	nodes := startCluster(t, clusterOpts{key: func(i int) string {
		if i == 2 {
			return "the-wrong-key-0123456789"
		}
		return "the-right-key-0123456789"
	}})
	for i, n := range nodes[:2] {
		waitFor(t, 15*time.Second, fmt.Sprintf("n%d to know n0 and n1 and drop n2's announces", i), func() bool {
			st, err := n.status()
			must(t, err)
			known := knownNodes(t, n)
			_, hasN2 := known["n2"]
			return len(known) == 2 && !hasN2 && st.Cluster.Gossip.Dropped["unauthenticated"] > 0
		})
	}
	if m := nodes[0].metrics(); !strings.Contains(m, `tpsched_announces_dropped_total{reason="unauthenticated"}`) {
		t.Errorf("/metrics lacks the dropped announce counter")
	}
	count := spread(t, nodes[:2], 200)
	if count[2] != 0 {
		t.Errorf("calls reached the node with the wrong key: %v", count)
	}
}

// TestClientLoadBalancing: a client with dccltloadbalance asks one node
// (here the overloaded one) which nodes run the group and sends its calls
// straight to the least loaded ones, marked balanced, so no node has to
// transfer them.
func TestClientLoadBalancing(t *testing.T) {
	testenv.Slow(t, "runs for seconds; 9 s without -race on a busy 2-core machine")
	skipShort(t)
	nodes := startCluster(t, clusterOpts{})
	overload(t, nodes, 0)
	owners := uapOwners(t, nodes)
	c := nodes[0].client(func(o *client.Options) { o.LoadBalance = true; o.CacheTime = time.Minute })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var count [3]int
	for range 100 {
		out, err := c.Call(ctx, "work", "pid", nil)
		must(t, err)
		owner, ok := owners[string(out)]
		if !ok {
			t.Fatalf("answered by pid %s, which no node runs", out)
		}
		count[owner]++
	}
	t.Logf("calls served per node, client balancing with n0 at LEVEL2: %v", count)
	if count[0] != 0 || count[1] < 30 || count[2] < 30 {
		t.Errorf("served per node %v: want none on n0 and round-robin over n1 and n2", count)
	}
	for i, n := range nodes {
		if sent := metricSum(n.metrics(), "tpsched_forwarded_total{"); sent != 0 {
			t.Errorf("n%d transferred %v calls a balancing client had placed", i, sent)
		}
	}
}

// metricSum adds up the values of every /metrics line starting with prefix.
func metricSum(m, prefix string) float64 {
	var sum float64
	for _, line := range strings.Split(m, "\n") {
		if strings.HasPrefix(line, prefix) {
			if i := strings.LastIndexByte(line, ' '); i > 0 {
				v, _ := strconv.ParseFloat(line[i+1:], 64)
				sum += v
			}
		}
	}
	return sum
}
