package itest

// The routing manager (source document 004) on three real nodes
// (127.0.0.2-4): find server, where the first server starts, one start for
// concurrent first calls, quiesce, a dead server, a policy that drops an
// environment, a missed goal and the high-water mark.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"tpsched/internal/exposition/promcheck"
	"tpsched/internal/testenv"
	"tpsched/netio"
	"tpsched/scd"
	"tpsched/scd/client"
)

// ordersServer is the application environment's user server: one process,
// so that calls queue and a goal can be missed.
const ordersServer = `set service_group = "orders"
set service = "echo=echo", "sleep=sleep", "pid=pid", "burn=burn"
set module = MODULE
set parallel_count = 1
set queue_size = 512
`

// ordersPolicy: the orders calls are ONLINE, 90% within 100 ms, judged
// every second; orders is an application environment.
const ordersPolicy = `set policy_interval = 1
set default_class = BATCH
class -n ONLINE -i 1 -t 100 -p 90
class -n BATCH -i 3 -t 5000
classify -g orders -c ONLINE
environment -g orders
`

type wlmOpts struct {
	policy string
	goal   string // replaces "-t 100" of ONLINE, e.g. "-t 30"
	// busy is how busy the CPUs of node i are, 0..1, as its routing
	// manager measures them (a load of its own: fakeCPULoad); nil: idle.
	busy   func(i int) float64
	extra  func(i int) string // more sysconf lines
	module func(i int) string // node i's orders module; nil: uap-echo
	server func(i int) string // more lines for node i's usr/orders
	// detection is the nodes' -failure-detection; "": fast (tests on one
	// host want dead nodes gone within seconds).
	detection string
	// envs are the environments the start waits for every node to know
	// three nodes can serve; nil: orders (with subsystem instances, the
	// instances' groups: orders@east...).
	envs []string
}

// wlmCluster is three nodes with the orders environment and a policy.
type wlmCluster struct {
	nodes []*node
	dirs  []string
	loads []*cpuLoad // each node's CPU load, as its routing manager measures it
}

// startWLMCluster starts the three nodes and waits until each knows that
// all three can serve orders.
func startWLMCluster(t *testing.T, o wlmOpts) *wlmCluster {
	t.Helper()
	if o.policy == "" {
		o.policy = ordersPolicy
	}
	if o.goal != "" {
		o.policy = strings.Replace(o.policy, "-t 100", o.goal, 1)
	}
	var wc *wlmCluster
	startOnFreePorts(t, func(rpc, name int) ([]*node, error) {
		wc = &wlmCluster{}
		for i := range clusterIPs {
			dir := t.TempDir()
			sys := clusterSysconf(i, clusterIPs, rpc, name)
			if o.extra != nil {
				sys += o.extra(i)
			}
			must(t, os.WriteFile(filepath.Join(dir, "sysconf"), []byte(sys), 0o644))
			must(t, os.WriteFile(filepath.Join(dir, "svcpolicy"), []byte(o.policy), 0o644))
			must(t, os.MkdirAll(filepath.Join(dir, "usr"), 0o755))
			module := bin("uap-echo")
			if o.module != nil {
				module = o.module(i)
			}
			body := strings.ReplaceAll(ordersServer, "MODULE", strconv.Quote(module))
			if o.server != nil {
				body += o.server(i)
			}
			must(t, os.WriteFile(filepath.Join(dir, "usr", "orders"), []byte(body), 0o644))
			args := []string{"-c", dir, "-fast-failure-detection"}
			if o.detection != "" {
				args = []string{"-c", dir, "-failure-detection", o.detection}
			}
			busy := 0.0
			if o.busy != nil {
				busy = o.busy(i)
			}
			load := fakeCPULoad(t, busy)
			n, err := tryStartCommand(t, func(c *exec.Cmd) { c.Env = append(c.Env, load.env()...) }, bin("scdd"), args...)
			if err != nil {
				return append(wc.nodes, n), err
			}
			wc.nodes = append(wc.nodes, n)
			wc.loads = append(wc.loads, load)
			wc.dirs = append(wc.dirs, dir)
		}
		return wc.nodes, nil
	})
	isEnv := strings.Contains(o.policy, "environment -g orders")
	if o.envs == nil {
		o.envs = []string{"orders"}
	}
	for i, n := range wc.nodes {
		for _, env := range o.envs {
			waitFor(t, 15*time.Second, fmt.Sprintf("n%d to know that three nodes can serve %s", i, env), func() bool {
				if !isEnv { // orders runs everywhere from the start
					return len(knownWith(t, n, env)) == 3
				}
				e, ok := envOf(t, n, env)
				return ok && len(e.CanServe) == 3
			}, n.stderr.String)
		}
	}
	return wc
}

// knownWith is the nodes n's name table holds with group.
func knownWith(t *testing.T, n *node, group string) []string {
	st, err := n.status()
	must(t, err)
	var out []string
	if st.Cluster != nil {
		for _, ns := range st.Cluster.Nodes {
			for _, g := range ns.Groups {
				if g.Group == group {
					out = append(out, ns.Node)
				}
			}
		}
	}
	return out
}

// report is n's GET /report.
func (n *node) report(t *testing.T) scd.Report {
	t.Helper()
	resp, err := http.Get("http://" + n.ctl + "/report")
	must(t, err)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("report: %s", resp.Status)
	}
	var r scd.Report
	must(t, json.NewDecoder(resp.Body).Decode(&r))
	return r
}

func envOf(t *testing.T, n *node, env string) (scd.EnvReport, bool) {
	for _, e := range n.report(t).Environments {
		if e.Env == env {
			return e, true
		}
	}
	return scd.EnvReport{}, false
}

// serversSeen is the nodes n's table says serve env, sorted.
func serversSeen(t *testing.T, n *node, env string) []string {
	e, _ := envOf(t, n, env)
	var out []string
	for _, s := range e.Servers {
		out = append(out, s.Node)
	}
	slices.Sort(out)
	return out
}

// serving is the nodes that say they serve env themselves.
func (wc *wlmCluster) serving(t *testing.T, env string) []string {
	var out []string
	for i, n := range wc.nodes {
		if n.done != nil && isDone(n) {
			continue
		}
		if e, _ := envOf(t, n, env); e.Here == "serving" {
			out = append(out, fmt.Sprintf("n%d", i))
		}
	}
	return out
}

func isDone(n *node) bool {
	select {
	case <-n.done:
		return true
	default:
		return false
	}
}

// started sums tpsched_wlm_servers_started_total over the live nodes.
func (wc *wlmCluster) started(t *testing.T) float64 {
	var sum float64
	for _, n := range wc.nodes {
		if !isDone(n) {
			sum += metricSum(n.metrics(), "tpsched_wlm_servers_started_total")
		}
	}
	return sum
}

// agree waits until every live node's table says env is served by want
// (node ids) and the nodes of want say so themselves.
func (wc *wlmCluster) agree(t *testing.T, d time.Duration, env string, want func([]string) bool, what string) []string {
	t.Helper()
	var last []string
	waitFor(t, d, what, func() bool {
		var first []string
		for i, n := range wc.nodes {
			if isDone(n) {
				continue
			}
			seen := serversSeen(t, n, env)
			if first == nil && i >= 0 {
				first = seen
				if first == nil {
					first = []string{}
				}
			}
			if !slices.Equal(seen, first) {
				last = nil
				return false
			}
		}
		last = first
		return want(first) && slices.Equal(wc.serving(t, env), first)
	}, func() string {
		var b strings.Builder
		for i, n := range wc.nodes {
			if !isDone(n) {
				fmt.Fprintf(&b, "n%d sees %v; ", i, serversSeen(t, n, env))
			}
		}
		fmt.Fprintf(&b, "serving themselves: %v", wc.serving(t, env))
		return b.String()
	})
	return last
}

func one(s []string) bool { return len(s) == 1 }

// find runs scdctl find through node i and returns the nodes it names.
func (wc *wlmCluster) find(i int, env string) ([]int, error) { return findVia(wc.nodes, i, env, "20s") }

// findVia runs scdctl find env through nodes[i], waiting at most
// timeout, and returns the indexes in nodes of the nodes it names. An
// error, not a t.Fatal, so that goroutines of a test may call it.
func findVia(nodes []*node, i int, env, timeout string) ([]int, error) {
	out, err := nodes[i].scdctl("-t", timeout, "find", env)
	if err != nil {
		return nil, fmt.Errorf("%v: %s", err, strings.TrimSpace(out))
	}
	var idx []int
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		addr, _, _ := strings.Cut(line, "\t")
		j := slices.IndexFunc(nodes, func(n *node) bool { return n.rpc == addr })
		if j < 0 {
			return nil, fmt.Errorf("find named %q, no node's RPC address", line)
		}
		idx = append(idx, j)
	}
	return idx, nil
}

// cpuLoad is a file in /proc/stat's format whose CPUs are busy as much as
// the test says, advancing every 50 ms, for one node's routing manager
// (TPSCHED_PROC_STAT): so the nodes of one machine have loads of their
// own, and what the tests place by does not depend on the machine's
// other work. The UAPs' own CPU use is still measured for real.
type cpuLoad struct {
	path string
	busy atomic.Uint64 // math.Float64bits of the busy share, 0..1
}

func (l *cpuLoad) env() []string { return []string{"TPSCHED_PROC_STAT=" + l.path} }

// set makes the CPUs busy share busy of the time from now on.
func (l *cpuLoad) set(busy float64) { l.busy.Store(math.Float64bits(busy)) }

// fakeCPULoad starts a cpuLoad of busy share busy for the CPUs this test
// may use (its affinity mask, which the node inherits), until the test
// ends.
func fakeCPULoad(t *testing.T, busy float64) *cpuLoad {
	l := &cpuLoad{path: filepath.Join(t.TempDir(), "stat")}
	l.set(busy)
	cpus := cpuList(t)
	var used, idle float64 // clock ticks, per CPU
	write := func() {
		var b strings.Builder
		b.WriteString("cpu  0 0 0 0 0 0 0 0\n")
		for _, c := range cpus {
			fmt.Fprintf(&b, "cpu%s %d 0 0 %d 0 0 0 0\n", c, int64(used), int64(idle))
		}
		tmp := l.path + ".new"
		must(t, os.WriteFile(tmp, []byte(b.String()), 0o644))
		must(t, os.Rename(tmp, l.path)) // a reader sees a whole file
	}
	write()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				f := math.Float64frombits(l.busy.Load())
				used += 5 * f // 50 ms is 5 ticks
				idle += 5 * (1 - f)
				write()
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return l
}

// TestWLMFindStartsOneWhereCapacityIs: find on an environment no node
// serves starts exactly one server, on the node with the most spare CPU:
// n0's CPUs are busy (as its routing manager measures them: a load of its
// own), so the server starts on n1 or n2 although n0 decides and would win
// a tie (lowest node id).
func TestWLMFindStartsOneWhereCapacityIs(t *testing.T) {
	testenv.Slow(t, "waits out policy intervals; 5 s without -race on a busy 2-core machine")
	skipShort(t)
	wc := startWLMCluster(t, wlmOpts{busy: func(i int) float64 {
		if i == 0 {
			return 1
		}
		return 0
	}})
	spare := func(i int) float64 { return wc.nodes[i].report(t).SpareCPUs[0] }
	figures := func() string {
		return fmt.Sprintf("spare CPUs at importance 1: n0 %.2f, n1 %.2f, n2 %.2f", spare(0), spare(1), spare(2))
	}
	waitFor(t, 15*time.Second, "n0 to measure its CPUs busy and the others theirs spare", func() bool {
		return spare(0) < 0.3 && min(spare(1), spare(2)) > spare(0)+0.5
	}, figures)
	time.Sleep(1500 * time.Millisecond) // the next announce reaches the decider
	t.Logf("spare CPUs at importance 1 before the find: n0 %.2f, n1 %.2f, n2 %.2f", spare(0), spare(1), spare(2))
	if s := wc.serving(t, "orders"); len(s) != 0 {
		t.Fatalf("orders served before any find: %v", s)
	}
	got, err := wc.find(2, "orders")
	if err != nil {
		t.Fatalf("find orders through n2: %v", err)
	}
	placed, seen := firstPlacement(t, wc.nodes[0])
	t.Logf("placed on %s; spare CPUs as the decider saw them: %v", placed, seen)
	if len(got) != 1 || got[0] == 0 || fmt.Sprintf("n%d", got[0]) != placed {
		t.Fatalf("find answered nodes %v: want one, not the busy n0, the one the decider placed (%s)", got, placed)
	}
	for name, v := range seen {
		if v > seen[placed] {
			t.Errorf("placed on %s with %.2f spare CPUs, but %s had %.2f", placed, seen[placed], name, v)
		}
	}
	where := fmt.Sprintf("n%d", got[0])
	wc.agree(t, 10*time.Second, "orders", func(s []string) bool { return slices.Equal(s, []string{where}) },
		"every node to see orders served on "+where+" only")
	if s := wc.started(t); s != 1 {
		t.Errorf("%v servers started in the cluster, want 1", s)
	}
	// A second find starts nothing more.
	if again, err := wc.find(1, "orders"); err != nil || !slices.Equal(again, got) {
		t.Errorf("second find through n1: %v, %v; want %v", again, err, got)
	}
	if s := wc.started(t); s != 1 {
		t.Errorf("%v servers started after a second find, want 1", s)
	}
	// Calls through the busy node are served there.
	out, err := wc.nodes[0].client().Call(ctxT(t, 10*time.Second), "orders", "echo", []byte("x"))
	if err != nil || string(out) != "x" {
		t.Errorf("call through n0: %q, %v", out, err)
	}
}

// placedLine is the deciding node's log line of a first start.
var placedLine = regexp.MustCompile(`msg="routing manager: server started" env=orders node=(\S+) why=first .*hosts="([^"]*)"`)

// firstPlacement reads, from the deciding node's log, where the first
// server of orders went and the spare CPU each host had as the decider saw
// it; the decider must have seen a host with clearly more spare CPU than
// n0 (the tests make n0's CPUs busy).
func firstPlacement(t *testing.T, decider *node) (string, map[string]float64) {
	t.Helper()
	var m []string
	// The find's answer may reach the test before the decider's log line.
	waitFor(t, 5*time.Second, "the deciding node to log the first start of orders", func() bool {
		m = placedLine.FindStringSubmatch(decider.stderr.String())
		return m != nil
	}, decider.stderr.String)
	spare := map[string]float64{}
	for _, h := range strings.Fields(m[2]) {
		name, v, _ := strings.Cut(h, "=")
		f, _ := strconv.ParseFloat(strings.TrimSuffix(v, "(excluded)"), 64)
		spare[name] = f
	}
	best := 0.0
	for name, v := range spare {
		if name != "n0" {
			best = max(best, v)
		}
	}
	if best <= spare["n0"]+0.1 {
		t.Fatalf("as the decider saw it, no node had more spare CPU than n0 (%s), whose CPUs the test made busy", m[2])
	}
	return m[1], spare
}

// cpuList is the CPUs this test may use (its affinity mask), as taskset
// names them.
func cpuList(t *testing.T) []string {
	out, err := exec.Command("taskset", "-pc", strconv.Itoa(os.Getpid())).Output()
	must(t, err)
	_, list, _ := strings.Cut(strings.TrimSpace(string(out)), ": ")
	var cpus []string
	for part := range strings.SplitSeq(list, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, _ := strconv.Atoi(lo)
		b := a
		if isRange {
			b, _ = strconv.Atoi(hi)
		}
		for c := a; c <= b; c++ {
			cpus = append(cpus, strconv.Itoa(c))
		}
	}
	return cpus
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestWLMConcurrentFirstCallsStartOne: calls and finds for an environment
// no node serves, sent at once through all three nodes, wait for one server
// and are all served by it (the finds name it): one start in the cluster,
// not three.
func TestWLMConcurrentFirstCallsStartOne(t *testing.T) {
	skipShort(t)
	wc := startWLMCluster(t, wlmOpts{})
	const perNode = 5
	var wg sync.WaitGroup
	pids := make(chan string, 3*perNode)
	start := make(chan struct{})
	found := make(chan string, 3)
	for i, n := range wc.nodes {
		c := n.client()
		for range perNode {
			wg.Go(func() {
				<-start
				out, err := c.Call(ctxT(t, 25*time.Second), "orders", "pid", nil)
				if err != nil {
					t.Errorf("first call through n%d: %v", i, err)
					return
				}
				pids <- string(out)
			})
		}
		wg.Go(func() {
			<-start
			nodes, err := c.FindServer(ctxT(t, 25*time.Second), "orders")
			if err != nil || len(nodes) != 1 {
				t.Errorf("find through n%d: %v, %v; want one server", i, nodes, err)
				return
			}
			found <- nodes[0].Addr
		})
	}
	close(start)
	wg.Wait()
	close(pids)
	close(found)
	addrs := map[string]bool{}
	for a := range found {
		addrs[a] = true
	}
	if len(addrs) != 1 {
		t.Errorf("the finds named servers %v, want one", addrs)
	}
	distinct := map[string]bool{}
	for p := range pids {
		distinct[p] = true
	}
	if len(distinct) != 1 {
		t.Errorf("calls answered by %d processes %v, want 1 (one server of one process)", len(distinct), distinct)
	}
	wc.agree(t, 10*time.Second, "orders", one, "every node to see one server of orders")
	if s := wc.started(t); s != 1 {
		t.Errorf("%v servers started in the cluster, want 1", s)
	}
}

// TestWLMQuiesceDrainsAndStops: quiesce lets the server finish the calls
// it holds, then stops it on every node; finds are refused until resume,
// after which a find starts one again.
func TestWLMQuiesceDrainsAndStops(t *testing.T) {
	testenv.Slow(t, "waits out policy intervals; 4 s without -race on a busy 2-core machine")
	skipShort(t)
	wc := startWLMCluster(t, wlmOpts{})
	got := []int{wc.findRunning(t, 1, "orders", "first find")}
	srv := wc.nodes[got[0]]
	pids := uapPIDs(t, srv, "orders")
	if len(pids) != 1 {
		t.Fatalf("server n%d has processes %v, want 1", got[0], pids)
	}
	// Six calls of 300 ms queue on the server's one process: 1.8 s of work.
	c := wc.nodes[1].client()
	errs := make(chan error, 6)
	for range 6 {
		go func() {
			_, err := c.Call(ctxT(t, 20*time.Second), "orders", "sleep", []byte("300"))
			errs <- err
		}()
	}
	waitFor(t, 5*time.Second, "the calls to reach the server", func() bool {
		return groupStatus(t, srv, "orders").InFlight >= 4
	})
	began := time.Now()
	out, err := wc.nodes[2].scdctl("quiesce", "orders")
	if err != nil {
		t.Fatalf("scdctl quiesce: %v\n%s", err, out)
	}
	t.Logf("scdctl quiesce orders (%v):\n%s", time.Since(began).Round(time.Millisecond), out)
	for range 6 {
		if err := <-errs; err != nil {
			t.Errorf("a call held by the server when it was quiesced: %v (want it served)", err)
		}
	}
	waitFor(t, 5*time.Second, "the server's process to leave", func() bool { return !pidAlive(pids[0]) })
	wc.agree(t, 10*time.Second, "orders", func(s []string) bool { return len(s) == 0 }, "no node to serve orders")
	for i, n := range wc.nodes {
		if e, _ := envOf(t, n, "orders"); !e.Quiesced || e.HighWaterMark != 0 {
			t.Errorf("n%d: orders %+v, want quiesced with high-water mark 0", i, e)
		}
	}
	_, err = wc.nodes[0].client().Call(ctxT(t, 5*time.Second), "orders", "echo", nil)
	if codeOf(err) != netio.CodeServiceClosed {
		t.Errorf("call after quiesce: %v, want 'service closed'", err)
	}
	if _, err := wc.find(0, "orders"); err == nil || !strings.Contains(err.Error(), "quiesced") {
		t.Errorf("find after quiesce: %v, want refused as quiesced", err)
	}
	if out, err := wc.nodes[0].scdctl("resume", "orders"); err != nil {
		t.Fatalf("scdctl resume: %v\n%s", err, out)
	}
	wc.findRunning(t, 2, "orders", "find after resume")
}

// TestWLMKilledServerRemovedEverywhere: the node of the server is killed
// (scdd and its UAPs, SIGKILL: nothing disconnects); every other node
// drops it from its table, and, the high-water mark being 1, a new server
// starts on another node.
func TestWLMKilledServerRemovedEverywhere(t *testing.T) {
	skipShort(t)
	wc := startWLMCluster(t, wlmOpts{})
	got, err := wc.find(0, "orders")
	if err != nil || len(got) != 1 {
		t.Fatalf("find: %v, %v", got, err)
	}
	dead := fmt.Sprintf("n%d", got[0])
	wc.agree(t, 10*time.Second, "orders", func(s []string) bool { return slices.Equal(s, []string{dead}) }, "every node to see orders on "+dead)
	killed := time.Now()
	victim := wc.nodes[got[0]]
	_ = syscall.Kill(-victim.cmd.Process.Pid, syscall.SIGKILL)
	<-victim.done
	for i, n := range wc.nodes {
		if i == got[0] {
			continue
		}
		waitFor(t, 20*time.Second, fmt.Sprintf("n%d to drop %s's server", i, dead), func() bool {
			return !slices.Contains(serversSeen(t, n, "orders"), dead)
		}, n.stderr.String)
	}
	t.Logf("%s's server gone from every table after %v", dead, time.Since(killed).Round(time.Millisecond))
	now := wc.agree(t, 20*time.Second, "orders", func(s []string) bool { return len(s) == 1 && s[0] != dead },
		"a new server of orders on a live node (high-water mark 1)")
	t.Logf("replaced on %v %v after the kill", now, time.Since(killed).Round(time.Millisecond))
	for i, n := range wc.nodes {
		if i == got[0] {
			continue
		}
		if _, err := n.client().Call(ctxT(t, 10*time.Second), "orders", "echo", []byte("y")); err != nil {
			t.Errorf("call through n%d after the replacement: %v", i, err)
		}
	}
}

// TestWLMPolicyDropQuiesces: svcpolicy read again without the environment
// quiesces its server; its calls are refused, not lost.
func TestWLMPolicyDropQuiesces(t *testing.T) {
	testenv.Slow(t, "waits out policy intervals; 5 s without -race on a busy 2-core machine")
	skipShort(t)
	wc := startWLMCluster(t, wlmOpts{})
	got, err := wc.find(2, "orders")
	if err != nil || len(got) != 1 {
		t.Fatalf("find: %v, %v", got, err)
	}
	pids := uapPIDs(t, wc.nodes[got[0]], "orders")
	dropped := strings.Replace(ordersPolicy, "environment -g orders\n", "", 1)
	for _, dir := range wc.dirs {
		must(t, os.WriteFile(filepath.Join(dir, "svcpolicy"), []byte(dropped), 0o644))
	}
	out, err := wc.nodes[0].scdctl("policy")
	if err != nil {
		t.Fatalf("scdctl policy: %v\n%s", err, out)
	}
	t.Logf("scdctl policy:\n%s", out)
	if !strings.Contains(out, "quiesced orders") {
		t.Errorf("scdctl policy does not say orders was quiesced:\n%s", out)
	}
	waitFor(t, 10*time.Second, "the server's process to leave", func() bool { return !pidAlive(pids[0]) })
	for i, n := range wc.nodes {
		waitFor(t, 10*time.Second, fmt.Sprintf("n%d to see no server of orders", i), func() bool {
			st, err := n.status()
			must(t, err)
			for _, ns := range st.Cluster.Nodes {
				for _, g := range ns.Groups {
					if g.Group == "orders" {
						return false
					}
				}
			}
			return true
		})
		if r := n.report(t); len(r.Environments) != 0 {
			t.Errorf("n%d still reports environments %+v", i, r.Environments)
		}
	}
	_, err = wc.nodes[1].client().Call(ctxT(t, 5*time.Second), "orders", "echo", nil)
	if codeOf(err) != netio.CodeServiceClosed {
		t.Errorf("call after the policy dropped orders: %v, want 'service closed'", err)
	}
	// A policy that names orders again starts it from none: the dropped
	// policy's high-water mark does not bring a server back by itself.
	for _, dir := range wc.dirs {
		must(t, os.WriteFile(filepath.Join(dir, "svcpolicy"), []byte(ordersPolicy), 0o644))
	}
	if out, err := wc.nodes[1].scdctl("policy"); err != nil {
		t.Fatalf("scdctl policy (orders again): %v\n%s", err, out)
	}
	time.Sleep(3 * time.Second) // three intervals: the decider would have replenished by now
	for i, n := range wc.nodes {
		if e, ok := envOf(t, n, "orders"); !ok || e.HighWaterMark != 0 || len(e.Servers) != 0 || e.Quiesced {
			t.Errorf("n%d: orders named again: %+v, want no server, high-water mark 0, not quiesced", i, e)
		}
	}
	wc.findRunning(t, 0, "orders", "find after orders was named again")
}

// TestWLMMissedGoalGrowsAndKeepsHighWater: calls that queue on the one
// server miss their goal (90% within 30 ms); within a few intervals a
// second server starts on another node (more may follow while the goal is
// still missed, at most one per node). When the load stops, the count
// stays at its high-water mark.
func TestWLMMissedGoalGrowsAndKeepsHighWater(t *testing.T) {
	testenv.Slow(t, "waits out policy intervals; 17 s without -race on a busy 2-core machine")
	skipShort(t)
	wc := startWLMCluster(t, wlmOpts{goal: "-t 30"})
	got, err := wc.find(1, "orders")
	if err != nil || len(got) != 1 {
		t.Fatalf("find: %v, %v", got, err)
	}
	first := fmt.Sprintf("n%d", got[0])
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }() // also when the test fails
	var failures sync.Map
	for i, n := range wc.nodes {
		c := n.client()
		for range 3 {
			wg.Go(func() {
				for ctx.Err() == nil {
					cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					_, err := c.Call(cctx, "orders", "sleep", []byte("20"))
					cancel()
					if err != nil && ctx.Err() == nil {
						failures.Store(fmt.Sprintf("n%d: %v", i, err), true)
					}
				}
			})
		}
	}
	began := time.Now()
	now := wc.agree(t, 20*time.Second, "orders", func(s []string) bool { return len(s) >= 2 },
		"a second server of orders (the goal is missed)")
	t.Logf("servers %v %v after the load began (first on %s)", now, time.Since(began).Round(time.Millisecond), first)
	if !slices.Contains(now, first) {
		t.Errorf("servers %v: the first, on %s, is gone", now, first)
	}
	r := wc.nodes[got[0]].report(t)
	t.Logf("on %s: class %s misses its goal: %s", first, r.Missing, r.Action)
	stop()
	wg.Wait()
	failures.Range(func(k, _ any) bool { t.Errorf("call failed under load: %v", k); return true })
	// The class's index is judged over the last three intervals, so it
	// misses its goal for up to three more after the load stopped, and a
	// server may still be asked for and started then (processes start
	// slower under the race detector): the peak is what stands after
	// those.
	if raceBuild {
		time.Sleep(6 * time.Second)
	} else {
		time.Sleep(4500 * time.Millisecond)
	}
	peak := wc.agree(t, 5*time.Second, "orders", func(s []string) bool { return len(s) >= 2 }, "the servers when the load stopped")
	time.Sleep(4 * time.Second) // four intervals without load
	after := wc.agree(t, 5*time.Second, "orders", func(s []string) bool { return len(s) >= 2 }, "the servers after four idle intervals")
	t.Logf("servers when the load stopped %v, four idle intervals later %v", peak, after)
	if !slices.Equal(peak, after) {
		t.Errorf("servers %v after the load stopped, want %v (the high-water mark)", after, peak)
	}
	for i, n := range wc.nodes {
		if e, _ := envOf(t, n, "orders"); e.HighWaterMark != len(peak) {
			t.Errorf("n%d: high-water mark %d, want %d", i, e.HighWaterMark, len(peak))
		}
	}
}

// TestWLMReportMetricsRefresh: one node (no cluster) with a policy. A call
// starts the environment's server; scdctl report shows the calls against
// the class's goal, as text and as JSON; /metrics has the class's series
// and its distribution against the goal; scdctl refresh replaces the
// server's process and calls go on.
func TestWLMReportMetricsRefresh(t *testing.T) {
	skipShort(t)
	dir := defDir(t, "", map[string]string{"orders": ordersServer})
	must(t, os.WriteFile(filepath.Join(dir, "svcpolicy"), []byte(ordersPolicy), 0o644))
	n := startNode(t, "-c", dir)
	if out, err := n.scdctl("prc", "orders"); err != nil || strings.Contains(out, "resident") || strings.Contains(out, "changed by chprc") {
		t.Errorf("before any call, orders has processes, prc failed or says its counts changed: %v\n%s", err, out)
	}
	c := n.client()
	// A 1 ms call the caller saw answered within the goal was within it
	// for the node too (the node times less of it); one a busy machine
	// held past 100 ms may be beyond it, so it makes the exact figures
	// below unknowable: late counts those.
	late := 0
	for i := range 20 {
		arg := "1"
		if i%10 == 9 {
			arg = "250" // 2.5 times the goal's 100 ms
		}
		began := time.Now()
		if _, err := c.Call(ctxT(t, 20*time.Second), "orders", "sleep", []byte(arg)); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if arg == "1" && time.Since(began) >= 100*time.Millisecond {
			late++
		}
	}
	if late > 0 {
		t.Logf("%d of the 18 fast calls took 100 ms or more as the caller saw them (a busy machine): the within-goal figures are bounds", late)
	}
	var r scd.Report
	waitFor(t, 5*time.Second, "an interval to count the calls", func() bool {
		out, err := n.scdctl("report", "--json")
		must(t, err)
		must(t, json.Unmarshal([]byte(out), &r))
		return len(r.Classes) > 0 && r.Classes[0].Calls == 20 && r.Classes[0].PI != nil
	})
	online := r.Classes[0]
	if online.Class != "ONLINE" || online.Importance != 1 || online.Goal != "90% within 100ms" {
		t.Errorf("class %+v, want ONLINE, importance 1, 90%% within 100ms", online)
	}
	if lo := float64(18-late) / 20; online.WithinGoal > 0.9 || online.WithinGoal < lo-1e-9 {
		t.Errorf("within goal %v, want 0.9 (2 of 20 calls took 250 ms; at least %v with %d fast calls late)", online.WithinGoal, lo, late)
	}
	var beyond uint64
	for _, b := range online.Distribution {
		if b.UpToPercent == 400 { // 250 ms is 250% of the goal
			beyond = b.Calls
		}
	}
	if beyond < 2 || (late == 0 && beyond != 2) {
		t.Errorf("distribution %+v: want the 2 slow calls in the bucket up to 400%%", online.Distribution)
	}
	if len(r.Environments) != 1 || r.Environments[0].Here != "serving" || r.Environments[0].HighWaterMark != 1 {
		t.Errorf("environments %+v, want orders serving here, high-water mark 1", r.Environments)
	}
	out, err := n.scdctl("report")
	must(t, err)
	t.Logf("scdctl report:\n%s", out)
	wantText := []string{"CLASS", "ONLINE", "90% within 100ms", "orders", "serving", "spare CPUs by importance"}
	if late == 0 {
		wantText = append(wantText, "90.0%")
	}
	for _, want := range wantText {
		if !strings.Contains(out, want) {
			t.Errorf("scdctl report lacks %q", want)
		}
	}
	m := n.metrics()
	if _, errs := promcheck.Check(m); len(errs) > 0 {
		t.Errorf("/metrics with a service policy does not pass Prometheus' parser and promcheck: %v", errs)
	}
	promtoolCheck(t, "/metrics with a service policy", m)
	within := fmt.Sprintf(`tpsched_wlm_response_goal_ratio_bucket{class="ONLINE",le="1"} %d`, int(online.WithinGoal*20+0.5))
	for _, want := range []string{
		`tpsched_wlm_calls_total{class="ONLINE"} 20`,
		within, // 18 unless late calls were beyond the goal, as the report says
		`tpsched_wlm_response_goal_ratio_bucket{class="ONLINE",le="+Inf"} 20`,
		`tpsched_wlm_goal_seconds{class="ONLINE"} 0.1`,
		`tpsched_wlm_environment_high_water_mark{environment="orders"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, grep(m, "tpsched_wlm"))
		}
	}
	// The performance index is over the last three intervals (3 s here)
	// and absent without calls in them: by this scrape, seconds after the
	// report above on a busy machine, the window may hold none of the 20
	// calls. A call before each scrape keeps it fed.
	var withPI string
	waitFor(t, 10*time.Second, "the performance index in /metrics while calls are in its window", func() bool {
		if _, err := c.Call(ctxT(t, 20*time.Second), "orders", "sleep", []byte("1")); err != nil {
			t.Fatalf("a call to keep the window fed: %v", err)
		}
		withPI = n.metrics()
		return strings.Contains(withPI, `tpsched_wlm_performance_index{class="ONLINE"} `)
	})
	if !strings.Contains(withPI, "# HELP tpsched_wlm_performance_index ") {
		t.Errorf("/metrics has the performance index but lacks its HELP text:\n%s", grep(withPI, "tpsched_wlm_performance_index"))
	}
	before := uapPIDs(t, n, "orders")
	out, err = n.scdctl("refresh", "orders")
	if err != nil {
		t.Fatalf("scdctl refresh: %v\n%s", err, out)
	}
	t.Logf("scdctl refresh orders:\n%s", out)
	after := uapPIDs(t, n, "orders")
	if len(before) != 1 || len(after) != 1 || before[0] == after[0] {
		t.Errorf("processes %v before refresh, %v after: want one, replaced", before, after)
	}
	// A refresh is the operator's action, not a crash (issue 23, item 4):
	// logged as a replacement and counted apart from RESTARTS.
	if g := groupStatus(t, n, "orders"); len(g.Processes) != 1 || g.Processes[0].Restarts != 0 || g.Processes[0].Replaced != 1 {
		t.Errorf("orders' processes after refresh: %+v, want restarts 0, replaced 1", g.Processes)
	}
	if log := n.stderr.String(); strings.Contains(log, "uap terminated") || !strings.Contains(log, "uap replaced at the operator's request") {
		t.Errorf("the refresh is logged as a crash, or not as a replacement:\n%s", grep(log, "uap "))
	}
	if out, err := n.scdctl("status"); err != nil {
		t.Errorf("scdctl status: %v", err)
	} else if row := statusRow(t, out, "orders"); row["RESTARTS"] != "0" || row["REPLACED"] != "1" {
		t.Errorf("scdctl status after refresh: RESTARTS %s, REPLACED %s; want 0 and 1\n%s", row["RESTARTS"], row["REPLACED"], out)
	}
	if _, err := c.Call(ctxT(t, 10*time.Second), "orders", "echo", nil); err != nil {
		t.Errorf("call after refresh: %v", err)
	}
	if out, err := n.scdctl("quiesce", "nosuch"); err == nil || !strings.Contains(out, "not an application environment") {
		t.Errorf("quiesce of an unknown environment: %v\n%s", err, out)
	}
}

// TestWLMWeightsForMissedGoal: one node on one CPU; batch work of
// importance 3 (three processes) burns it; an importance-1 class with a
// tight goal (90% of 4 ms CPU calls within 6 ms) misses while the CPU is
// shared at equal weights. With goal management the online group's cgroup
// gets more CPU shares and the batch group's fewer (read back from cgroup
// v1's cpu.shares of their processes), and the online class's performance
// index falls to about 1 (0.9 here). With goal_management = N (OpenTP1's rules alone)
// the weights stay and the class keeps missing: the same load, measured
// the same way.
func TestWLMWeightsForMissedGoal(t *testing.T) {
	testenv.Slow(t, "waits out policy intervals; 14 s without -race on a busy 2-core machine")
	skipShort(t)
	// Reads cpu.shares back: skips where cpu is on cgroup v2 (and says
	// so), fails in CI where it is on neither.
	testenv.RequireCgroup(t, 1, "cpu")
	if _, err := os.Stat("/sys/fs/cgroup/cpu/cpu.shares"); err != nil {
		testenv.SkipOrFail(t, "the cgroup v1 cpu controller is not at /sys/fs/cgroup/cpu (this test reads cpu.shares there)")
	}
	for _, manage := range []bool{true, false} {
		t.Run(map[bool]string{true: "managed", false: "goal_management=N"}[manage], func(t *testing.T) {
			weightsForMissedGoal(t, manage)
		})
	}
}

func weightsForMissedGoal(t *testing.T, manage bool) {
	cpus := cpuList(t)
	online := strings.ReplaceAll(`set service_group = "online"
set service = "cpu=cpu"
set module = MODULE
set parallel_count = 1
`, "MODULE", strconv.Quote(bin("uap-echo")))
	batch := strings.ReplaceAll(`set service_group = "batch"
set service = "cpu=cpu"
set module = MODULE
set parallel_count = 3
set queue_size = 64
`, "MODULE", strconv.Quote(bin("uap-echo")))
	dir := defDir(t, "", map[string]string{"online": online, "batch": batch})
	policy := `set policy_interval = 1
set default_class = BATCH
class -n ONLINE -i 1 -t 6 -p 90
class -n BATCH -i 3 -t 60000
classify -g online -c ONLINE
`
	if !manage {
		policy += "set goal_management = N\n"
	}
	must(t, os.WriteFile(filepath.Join(dir, "svcpolicy"), []byte(policy), 0o644))
	n := startCommand(t, "taskset", "-c", cpus[len(cpus)-1], bin("scdd"), "-c", dir)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }() // also when the test fails
	c := n.client()
	callWithoutPause(ctx, &wg, c, 6, "batch", "cpu", "50000", 20*time.Second)
	wg.Go(func() {
		for ctx.Err() == nil {
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			_, _ = c.Call(cctx, "online", "cpu", []byte("4000"))
			cancel()
			time.Sleep(10 * time.Millisecond)
		}
	})
	weights := func(r scd.Report) (on, ba int) {
		for _, g := range r.Groups {
			switch g.Group {
			case "online":
				on = g.Weight
			case "batch":
				ba = g.Weight
			}
		}
		return on, ba
	}
	var missed scd.Report
	waitFor(t, 15*time.Second, "ONLINE to miss its goal at equal weights", func() bool {
		missed = n.report(t)
		return missed.Missing == "ONLINE" && missed.Classes[0].PI != nil
	}, func() string { b, _ := json.Marshal(n.report(t)); return string(b) })
	before := *missed.Classes[0].PI
	t.Logf("ONLINE misses: PI %.2f; %s (goal management %v)", before, missed.Action, missed.Managed)
	if missed.Managed != manage {
		t.Errorf("report says goal management %v, want %v", missed.Managed, manage)
	}
	if manage {
		waitFor(t, 30*time.Second, "online's weight to rise and batch's to fall", func() bool {
			on, ba := weights(n.report(t))
			return on > 100 && ba < 100
		})
	} else {
		time.Sleep(3 * time.Second) // three intervals in which nothing may change
	}
	on, ba := weights(n.report(t))
	if !manage && (on != 100 || ba != 100) {
		t.Errorf("goal_management = N: weights online %d, batch %d; want both left at 100", on, ba)
	}
	for group, want := range map[string]int{"online": on, "batch": ba} {
		pid := uapPIDs(t, n, group)[0]
		cg := cpuCgroupOf(t, pid)
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpu", cg, "cpu.shares"))
		must(t, err)
		shares, err := strconv.Atoi(strings.TrimSpace(string(b)))
		must(t, err)
		if wantShares := min(max(want*1024/100, 2), 262144); shares != wantShares {
			t.Errorf("%s: cpu.shares %d, want %d (weight %d)", group, shares, wantShares, want)
		}
	}
	// Three intervals more make the whole window.
	time.Sleep(3500 * time.Millisecond)
	after := n.report(t)
	if after.Classes[0].PI == nil {
		t.Fatal("ONLINE has no performance index at the end")
	}
	on, ba = weights(after)
	t.Logf("ONLINE PI %.2f at weights 100/100, %.2f at the end, online %d, batch %d; other programs %.2f CPUs", before, *after.Classes[0].PI, on, ba, after.OtherCPUs)
	if after.OtherCPUs > 0.2 {
		// Goal management moves CPU between this node's UAPs only: on a
		// machine other work shares, the index cannot be judged. CI runs
		// on a machine of its own, as root (TPSCHED_REQUIRE_BPF), where
		// this cgroup test must judge.
		why := fmt.Sprintf("other programs used %.2f of the node's CPU at the end (the machine is shared): the index cannot be judged", after.OtherCPUs)
		testenv.SkipOrFail(t, "%s", why)
	}
	switch pi := *after.Classes[0].PI; {
	case manage && (pi >= before || pi > 1.1):
		// Managed to the goal, not beyond it: the weights stop rising once
		// the index is 1 or less, so it may stand a step above 1 for an
		// interval before they rise again.
		t.Errorf("goal management on: ONLINE's PI %.2f at the end, want it below %.2f and at most 1.1", pi, before)
	case !manage && pi <= 1:
		t.Errorf("goal_management = N: ONLINE's PI %.2f at the end: the load did not make it miss without management", pi)
	}
}

// cpuCgroupOf is pid's cgroup on the v1 cpu hierarchy.
func cpuCgroupOf(t *testing.T, pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	must(t, err)
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 && slices.Contains(strings.Split(f[1], ","), "cpu") {
			return f[2]
		}
	}
	t.Fatalf("pid %d has no cpu cgroup: %s", pid, b)
	return ""
}

// TestWLMUAPCallStartsEnvironment: a UAP's own call (shm.UAP.Call) for an
// application environment with no server waits for one to start, as a
// client's call does, and gets its reply.
func TestWLMUAPCallStartsEnvironment(t *testing.T) {
	skipShort(t)
	front := strings.ReplaceAll(`set service_group = "front"
set service = "call=call"
set module = MODULE
set parallel_count = 1
`, "MODULE", strconv.Quote(bin("uap-echo")))
	dir := defDir(t, "", map[string]string{"orders": ordersServer, "front": front})
	must(t, os.WriteFile(filepath.Join(dir, "svcpolicy"), []byte(ordersPolicy), 0o644))
	n := startNode(t, "-c", dir)
	if pids := uapPIDs(t, n, "orders"); len(pids) != 0 {
		t.Fatalf("orders has processes %v before any call", pids)
	}
	out, err := n.client().Call(ctxT(t, 20*time.Second), "front", "call", []byte("orders/echo/from a UAP"))
	if err != nil || string(out) != "from a UAP" {
		t.Fatalf("front's call of orders: %q, %v; want the echo", out, err)
	}
	if pids := uapPIDs(t, n, "orders"); len(pids) != 1 {
		t.Errorf("orders has processes %v after the call, want 1", pids)
	}
}

// TestWLMStartFailsElsewhere: n0 is placed first (n1's and n2's CPUs are
// busy, as their routing managers measure them; n0 has the most spare CPU)
// but has a module that exits at once, so its server never gets a process
// attached. The find still answers with a server, started
// on another node after n0's start failed, and n0 does not serve.
func TestWLMStartFailsElsewhere(t *testing.T) {
	testenv.Slow(t, "waits out policy intervals; 4 s without -race on a busy 2-core machine")
	skipShort(t)
	wc := startWLMCluster(t, wlmOpts{
		module: func(i int) string {
			if i == 0 {
				return "/bin/false"
			}
			return bin("uap-echo")
		},
		busy: func(i int) float64 {
			if i == 0 {
				return 0
			}
			return 1
		},
	})
	spare := func(i int) float64 { return wc.nodes[i].report(t).SpareCPUs[0] }
	// n1 and n2 with no spare CPU (as announced, in steps of 0.05) leave
	// n0 the most.
	waitFor(t, 15*time.Second, "n1 and n2 to have no spare CPU", func() bool {
		return max(spare(1), spare(2)) < 0.05
	}, func() string {
		return fmt.Sprintf("spare CPUs: n0 %.2f, n1 %.2f, n2 %.2f", spare(0), spare(1), spare(2))
	})
	time.Sleep(1500 * time.Millisecond) // the next announce reaches the decider
	began := time.Now()
	got, err := wc.find(1, "orders")
	if err != nil || len(got) != 1 || got[0] == 0 {
		t.Fatalf("find: nodes %v, %v; want one server, not on n0 whose module fails", got, err)
	}
	t.Logf("server on n%d after %v", got[0], time.Since(began).Round(time.Millisecond))
	if log := wc.nodes[0].stderr.String(); !strings.Contains(log, "a server did not start; trying another node") {
		t.Errorf("the decider (n0) did not try n0 first and fall back:\n%s", log)
	}
	where := fmt.Sprintf("n%d", got[0])
	wc.agree(t, 10*time.Second, "orders", func(s []string) bool { return slices.Equal(s, []string{where}) },
		"every node to see orders on "+where+" only")
	if out, err := wc.nodes[2].client().Call(ctxT(t, 10*time.Second), "orders", "echo", []byte("z")); err != nil || string(out) != "z" {
		t.Errorf("call: %q, %v", out, err)
	}
}

// TestWLMSteersToNodesMeetingTheGoal: orders runs on every node (no
// environment); n2's process is ten times slower, so orders' calls miss
// their goal there (20 ms sleeps take 200 ms; 90% within 80 ms) and meet it
// on n0 and n1. Once the nodes have announced their performance indexes,
// calls through n0 go to n0 and n1 (OpenTP1's rule alone would send a third
// of them to n2).
func TestWLMSteersToNodesMeetingTheGoal(t *testing.T) {
	testenv.Slow(t, "waits out policy intervals; 7 s without -race on a busy 2-core machine")
	skipShort(t)
	policy := strings.Replace(ordersPolicy, "environment -g orders\n", "", 1)
	wc := startWLMCluster(t, wlmOpts{policy: policy, goal: "-t 80", server: func(i int) string {
		if i == 2 {
			return "putenv TPSCHED_ECHO_SLOWDOWN 10\n"
		}
		return ""
	}})
	calls := func(through *node, n int) {
		cl := through.client()
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				for range n / 3 {
					if _, err := cl.Call(ctxT(t, 10*time.Second), "orders", "sleep", []byte("20")); err != nil {
						t.Errorf("call: %v", err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	servedHere := func() [3]uint64 {
		var out [3]uint64
		for i, n := range wc.nodes {
			out[i] = n.report(t).Classes[0].Calls
		}
		return out
	}
	pi := func(i int) float64 {
		for _, g := range wc.nodes[i].report(t).Groups {
			if g.Group == "orders" && g.PI != nil {
				return *g.PI
			}
		}
		return 0
	}
	// Calls through every node, each at random, until every node has
	// figures: n2 misses, n0 and n1 meet.
	waitFor(t, 20*time.Second, "n2 to miss the goal and n0 and n1 to meet it", func() bool {
		for _, n := range wc.nodes {
			calls(n, 12)
		}
		return pi(2) > 1 && pi(0) > 0 && pi(0) <= 1 && pi(1) > 0 && pi(1) <= 1
	}, func() string { return fmt.Sprintf("PI n0 %.2f, n1 %.2f, n2 %.2f", pi(0), pi(1), pi(2)) })
	time.Sleep(300 * time.Millisecond) // the announces of that interval reach n0
	before := servedHere()
	calls(wc.nodes[0], 90)
	time.Sleep(1200 * time.Millisecond) // the figures count at the end of an interval
	after := servedHere()
	var got [3]uint64
	var total uint64
	for i := range got {
		got[i] = after[i] - before[i]
		total += got[i]
	}
	t.Logf("90 calls through n0 with PI n0 %.2f, n1 %.2f, n2 %.2f: served on n0, n1, n2: %v", pi(0), pi(1), pi(2), got)
	if total < 90 {
		t.Fatalf("the nodes count %d calls, want at least 90", total)
	}
	if got[2] > total/10 {
		t.Errorf("n2, which misses the goal, served %d of %d calls through n0; want at most a tenth", got[2], total)
	}
	if got[0] == 0 || got[1] == 0 {
		t.Errorf("served %v: want calls on both n0 and n1, which meet the goal", got)
	}
}

// TestWLMRestartKeepsTheEnvironmentServing: a node restarted by hand-off
// (scdctl restart) with an application environment serving: the new scdd
// has the environment's server running by the time it serves (the old one
// passed it the environment), and calls made during the restart are all
// answered. Before, the new scdd started it dormant, and in a cluster the
// calls the other nodes sent by the old process's announce met no server.
func TestWLMRestartKeepsTheEnvironmentServing(t *testing.T) {
	skipShort(t)
	dir := defDir(t, "", map[string]string{"orders": ordersServer})
	must(t, os.WriteFile(filepath.Join(dir, "svcpolicy"), []byte(ordersPolicy), 0o644))
	n := startRestartingNode(t, dir)
	c, err := client.New(client.Options{Hosts: []string{n.rpc}, MaxMessageSize: 8 << 20})
	must(t, err)
	defer c.Close()
	if _, err := c.Call(ctxT(t, 20*time.Second), "orders", "echo", []byte("a")); err != nil {
		t.Fatalf("first call: %v", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	var answered, failed atomic.Int64
	for range 3 {
		wg.Go(func() {
			for ctx.Err() == nil {
				_, err := c.Call(ctxT(t, 20*time.Second), "orders", "sleep", []byte("5"))
				if err != nil {
					failed.Add(1)
					t.Logf("call during the restart: %v", err)
				} else {
					answered.Add(1)
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	out, err := n.scdctl("restart")
	if err != nil {
		t.Fatalf("scdctl restart: %v\n%s", err, out)
	}
	t.Logf("%s", strings.TrimSpace(out))
	st, err := statusOf(n.http)
	must(t, err)
	here := "not a group"
	for _, g := range st.Groups {
		if g.Group == "orders" {
			here = g.Environment
		}
	}
	if st.PID == n.cmd.Process.Pid || here != "serving" {
		t.Errorf("as the restart returned: pid %d (the old one was %d), orders %q here; want the new pid, serving",
			st.PID, n.cmd.Process.Pid, here)
	}
	time.Sleep(time.Second)
	stop()
	wg.Wait()
	t.Logf("calls during the restart: %d answered, %d failed", answered.Load(), failed.Load())
	if failed.Load() > 0 {
		t.Errorf("%d calls failed during the restart", failed.Load())
	}
	if out, err := c.Call(ctxT(t, 20*time.Second), "orders", "echo", []byte("b")); err != nil || string(out) != "b" {
		t.Errorf("call after the restart: %q, %v", out, err)
	}
}

// TestWLMRestartKeepsAQuiesce: a node alone, its environment quiesced,
// restarted by hand-off: the new scdd keeps the quiesce (it hears of it
// from no other node; the old one passes it) and answers the next call
// 'service closed'; a resume serves again. Before, the new scdd started
// the server at the next call.
func TestWLMRestartKeepsAQuiesce(t *testing.T) {
	skipShort(t)
	dir := defDir(t, "", map[string]string{"orders": ordersServer})
	must(t, os.WriteFile(filepath.Join(dir, "svcpolicy"), []byte(ordersPolicy), 0o644))
	n := startRestartingNode(t, dir)
	c, err := client.New(client.Options{Hosts: []string{n.rpc}})
	must(t, err)
	defer c.Close()
	if _, err := c.Call(ctxT(t, 20*time.Second), "orders", "echo", []byte("a")); err != nil {
		t.Fatalf("first call: %v", err)
	}
	if out, err := n.scdctl("quiesce", "orders"); err != nil {
		t.Fatalf("scdctl quiesce: %v\n%s", err, out)
	}
	if out, err := n.scdctl("restart"); err != nil || !restartedLine.MatchString(out) {
		t.Fatalf("scdctl restart: %v\n%s", err, out)
	}
	n.waitExit(t, "the old scdd to exit")
	_, err = c.Call(ctxT(t, 20*time.Second), "orders", "echo", []byte("b"))
	var ne *netio.Error
	if !errors.As(err, &ne) || ne.Code != netio.CodeServiceClosed {
		t.Fatalf("a call after the restart: %v, want 'service closed' (orders is quiesced)", err)
	}
	if out, err := n.scdctl("resume", "orders"); err != nil {
		t.Fatalf("scdctl resume: %v\n%s", err, out)
	}
	if out, err := c.Call(ctxT(t, 20*time.Second), "orders", "echo", []byte("c")); err != nil || string(out) != "c" {
		t.Errorf("a call after the resume: %q, %v", out, err)
	}
}

// answerCh is a netio.Answerer that hands the answer to a channel.
type answerCh chan netio.Frame

func (a answerCh) Answer(f netio.Frame, err error) {
	if err != nil {
		f = netio.Frame{Header: netio.Header{Kind: netio.KindError, Code: netio.CodeNetworkDown}, Payload: []byte(err.Error())}
	}
	a <- f
}

// TestWLMPeerRequestsNeedThePeerHello: the routing manager's requests
// between nodes (start a server, quiesce, read the policy) are taken only
// on a connection that proved the cluster key; a client that sends one,
// even marked as transferred, is refused, counted, and starts nothing.
func TestWLMPeerRequestsNeedThePeerHello(t *testing.T) {
	skipShort(t)
	dir := defDir(t, "", map[string]string{"orders": ordersServer})
	must(t, os.WriteFile(filepath.Join(dir, "svcpolicy"), []byte(ordersPolicy), 0o644))
	n := startNode(t, "-c", dir)
	nc, err := net.DialTimeout("tcp", n.rpc, 5*time.Second)
	must(t, err)
	mc := netio.NewMuxConn(nc, netio.MuxOptions{})
	defer mc.Close(nil)
	for _, service := range []string{"wlm-start", "wlm-decide", "wlm-quiesce", "wlm-policy"} {
		a := make(answerCh, 1)
		_, sent, err := mc.Call(netio.Header{Kind: netio.KindNameLookup, Flags: netio.FlagForwarded, TimeoutMs: 5000},
			"orders", service, []byte{1}, time.Now().Add(5*time.Second), a)
		if !sent || err != nil {
			t.Fatalf("%s: not sent: %v", service, err)
		}
		select {
		case f := <-a:
			if f.Kind != netio.KindError || f.Code != netio.CodeProtocol || !strings.Contains(string(f.Payload), "proved the cluster key") {
				t.Errorf("%s from a client: %v %v %q; want a protocol error naming the peer hello", service, f.Kind, f.Code, f.Payload)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no answer", service)
		}
	}
	if pids := uapPIDs(t, n, "orders"); len(pids) != 0 {
		t.Errorf("orders has processes %v after a client's wlm-start", pids)
	}
	if got := metricSum(n.metrics(), `tpsched_requests_refused_total{reason="protocol"}`); got != 4 {
		t.Errorf("tpsched_requests_refused_total{reason=\"protocol\"} = %v, want 4", got)
	}
	if e, _ := envOf(t, n, "orders"); e.Quiesced {
		t.Error("a client's wlm-quiesce quiesced orders")
	}
}

// TestWLMWithClusterKey: with cluster_key the routing manager's requests
// between nodes go over connections that proved it: a find through a node
// that does not decide, and a quiesce that reaches every node.
func TestWLMWithClusterKey(t *testing.T) {
	skipShort(t)
	wc := startWLMCluster(t, wlmOpts{extra: func(int) string { return "set cluster_key = \"a shared secret of some length\"\n" }})
	got, err := wc.find(2, "orders")
	if err != nil || len(got) != 1 {
		t.Fatalf("find through n2: %v, %v", got, err)
	}
	where := fmt.Sprintf("n%d", got[0])
	wc.agree(t, 10*time.Second, "orders", func(s []string) bool { return slices.Equal(s, []string{where}) }, "every node to see orders on "+where)
	out, err := wc.nodes[1].scdctl("quiesce", "orders")
	if err != nil || strings.Contains(out, "error") {
		t.Fatalf("scdctl quiesce: %v\n%s", err, out)
	}
	wc.agree(t, 10*time.Second, "orders", func(s []string) bool { return len(s) == 0 }, "no node to serve orders")
}

// TestWLMRestartedDeciderStartsNoSecondServer: orders is served on n1 or
// n2 (n0's CPUs are busy, as its routing manager measures them); n0, the deciding node (lowest id), is killed and
// started again, and a find reaches it at once. It must not decide from
// its fresh name table, which does not show the server yet: the find
// names the server that runs, and no second one starts.
func TestWLMRestartedDeciderStartsNoSecondServer(t *testing.T) {
	testenv.Slow(t, "waits out policy intervals; 7 s without -race on a busy 2-core machine")
	skipShort(t)
	n0Busy := func(i int) float64 {
		if i == 0 {
			return 1
		}
		return 0
	}
	wc := startWLMCluster(t, wlmOpts{busy: n0Busy})
	spare := func(i int) float64 { return wc.nodes[i].report(t).SpareCPUs[0] }
	waitFor(t, 15*time.Second, "n0 to measure its CPUs busy and the others theirs spare", func() bool {
		return spare(0) < 0.3 && min(spare(1), spare(2)) > spare(0)+0.5
	})
	time.Sleep(1500 * time.Millisecond)
	got, err := wc.find(1, "orders")
	if err != nil || len(got) != 1 {
		t.Fatalf("find: %v, %v; want one server", got, err)
	}
	firstPlacement(t, wc.nodes[0])
	if got[0] == 0 {
		t.Fatalf("find placed orders on the busy n0")
	}
	where := fmt.Sprintf("n%d", got[0])
	wc.agree(t, 10*time.Second, "orders", func(s []string) bool { return slices.Equal(s, []string{where}) }, "every node to see orders on "+where)

	old := wc.nodes[0]
	_ = syscall.Kill(-old.cmd.Process.Pid, syscall.SIGKILL)
	<-old.done
	waitFor(t, 10*time.Second, "n1 to drop n0", func() bool { return !slices.Contains(knownWith(t, wc.nodes[1], "orders"), "n0") })
	n0 := startCommandEnv(t, wc.loads[0].env(), bin("scdd"), "-c", wc.dirs[0], "-fast-failure-detection")
	wc.nodes[0] = n0
	again, err := wc.find(0, "orders")
	if err != nil || len(again) != 1 || again[0] != got[0] {
		t.Fatalf("find through the restarted n0: %v, %v; want only %s", again, err, where)
	}
	time.Sleep(2 * time.Second)
	wc.agree(t, 10*time.Second, "orders", func(s []string) bool { return slices.Equal(s, []string{where}) }, "orders still on "+where+" only")
	if s := metricSum(n0.metrics(), "tpsched_wlm_servers_started_total"); s != 0 {
		t.Errorf("the restarted n0 started %v servers, want 0", s)
	}
}

// TestWLMClientFindServerOption: a client with FindServer, whose dchost is
// n2, finds orders (which starts its server) and sends its calls straight
// to the node the find named: that node serves them all and n2 transfers
// none. Without the option the first call would reach n2, wait there for
// the start and be transferred.
func TestWLMClientFindServerOption(t *testing.T) {
	skipShort(t)
	wc := startWLMCluster(t, wlmOpts{})
	c := wc.nodes[2].client(func(o *client.Options) { o.FindServer = true })
	for i := range 20 {
		if _, err := c.Call(ctxT(t, 20*time.Second), "orders", "echo", []byte(strconv.Itoa(i))); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	served := wc.agree(t, 10*time.Second, "orders", one, "one server of orders")
	t.Logf("orders served on %v; the client's dchost is n2", served)
	if sent := metricSum(wc.nodes[2].metrics(), "tpsched_forwarded_total"); sent != 0 {
		t.Errorf("n2 transferred %v calls: the client did not send them to the server it found", sent)
	}
	idx, _ := strconv.Atoi(strings.TrimPrefix(served[0], "n"))
	if got := metricSum(wc.nodes[idx].metrics(), "tpsched_requests_received_total"); got != 0 {
		t.Errorf("%s received %v transferred calls, want none (the client sent them there)", served[0], got)
	}
}
