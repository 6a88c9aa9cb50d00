// Package netlab is a test network of Linux network namespaces: each node
// of a test gets a namespace of its own with its own address on a bridge,
// and the test can cut, heal, thin out (loss) and slow down (rate) the
// links between nodes while calls run. It exists so that the multi-node
// tests (itest) meet a network that fails, not one loopback that never
// does (issue 30 item 1), and so that the benchmark (tpbench -net lab)
// runs its nodes on it too (issue 30 item 5).
//
// It needs root (creating namespaces, links and nftables tables) and the
// tools ip (iproute2), nft (nftables), tc (iproute2) and nsenter
// (util-linux): New skips the test, or fails it where the run must be
// complete (internal/testenv), when one is missing; Open returns the
// reason as its error. The kernel needs veth, bridge, nf_tables with
// numgen, and the tbf qdisc; netem is not needed (the development kernel
// has none).
//
// # Usage
//
//	lab := netlab.New(t, 3)              // namespaces, bridge, addresses
//	cmd := lab.Command(0, "scdd", "-c", dir) // runs in node 0's namespace
//	lab.Isolate(2)                       // node 2 cut from the others, both ways
//	lab.Cut(2, 0)                        // one way: node 0 no longer hears node 2
//	lab.Loss(0, 1, 1)                    // 1% of node 0's packets to node 1 dropped
//	lab.Rate(1, "1mbit")                 // node 1's uplink at 1 Mbit/s
//	lab.HealAll()
//
//	lab, err := netlab.Open(3, log.Printf, func(l *netlab.Lab) { l.LossAll(1) }) // outside a test
//	defer lab.Close()
//
// Everything New creates is removed by t.Cleanup, whether the test passed
// or failed, and again by the next New in another process when a test
// binary died without its cleanups (a timeout's panic): names carry the
// creating process's pid, and a namespace, bridge or address claim whose
// process is gone is removed.
//
// Outside a test (a benchmark), Open makes the lab and Close removes it;
// the caller defers Close, and catches SIGINT and SIGTERM so that the
// deferred call runs (tpbench does). A process killed without running
// it (SIGKILL) leaves the lab to the sweep of a later New or Open, ten
// minutes on (staleAfter).
//
// # What a fault is
//
// A cut or a loss drops IP packets in the receiving node's nftables input
// chain by source address: links stay up, ARP still answers, and a TCP
// connection on a cut link is not reset but hears nothing, as across a
// firewall that starts dropping or a switch path that fails. The test
// process itself (the host, on the bridge's own address) is never cut:
// it is the clients' and the observer's path to every node, so a test can
// watch a node it has cut off from the others.
//
// Latency is not offered: without netem the kernel cannot hold a packet
// back (tbf delays only what exceeds the rate), and a delaying relay
// would make the nodes talk to the relay's addresses instead of each
// other's, which memberlist's advertised addresses and the announced RPC
// addresses do not allow without changing the node.
package netlab

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tpsched/internal/testenv"
)

// A Lab is one test's network: a bridge in the test's own namespace and
// one namespace per node, each with a veth to the bridge.
type Lab struct {
	t      owner
	id     string // unique on the machine: the pid and a counter, base 36
	bridge string
	prefix string // the /24's first three octets, "10.213.7"
	claim  string // the file that holds the /24 for this lab
	Nodes  []*Node

	mu    sync.Mutex
	cut   map[[2]int]bool    // from, to: every packet from -> to dropped
	loss  map[[2]int]float64 // from, to: percent of packets dropped
	rates map[int]string     // node: its uplink's rate
}

// A Node is one namespace of a Lab.
type Node struct {
	Index int
	NS    string // the namespace's name (ip netns list)
	IP    string // its address on the bridge
	veth  string // the host end of its veth
}

// claimDir holds one file per /24 in use by a lab of any process on this
// machine, so that parallel tests (and other engineers' runs) never put
// two bridges on one subnet.
const claimDir = "/run/tpsched-netlab"

var labs atomic.Int64

// owner is what a lab needs of whoever made it: a test (testing.TB), or
// Open's stand-in for one.
type owner interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// tools are the programs a lab runs, and where they come from.
var tools = []struct{ name, pkg string }{
	{"ip", "Debian's iproute2"}, {"tc", "Debian's iproute2"}, {"nft", "Debian's nftables"}, {"nsenter", "Debian's util-linux"},
}

// New makes a lab of n nodes (n <= 200) and removes it when t ends.
func New(t testing.TB, n int) *Lab {
	t.Helper()
	testenv.RequireRoot(t, "network namespaces, links and nftables tables")
	for _, tool := range tools {
		testenv.RequireTool(t, tool.name, tool.pkg)
	}
	return newLab(t, n)
}

// Open makes a lab of n nodes outside a test and runs setup on it (the
// faults to set; nil for none). What New would skip or fail is the
// error, and the lab is then already removed; else the caller removes it
// with Close. After Open, a fault method that fails panics (no test to
// fail): set faults in setup.
func Open(n int, logf func(format string, args ...any), setup func(*Lab)) (l *Lab, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("netlab: needs root (network namespaces, links and nftables tables)")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool.name); err != nil {
			return nil, fmt.Errorf("netlab: needs %s (%s): %w", tool.name, tool.pkg, err)
		}
	}
	o := &runner{logf: logf}
	defer func() {
		switch p := recover().(type) {
		case nil:
		case failed:
			o.close()
			l, err = nil, p.err
		default:
			o.close()
			panic(p)
		}
	}()
	l = newLab(o, n)
	if setup != nil {
		setup(l)
	}
	return l, nil
}

// Close removes a lab made by Open: its namespaces (once the processes
// in them have ended: stop them first), bridge and subnet claim.
func (l *Lab) Close() error {
	o, ok := l.t.(*runner)
	if !ok {
		return errors.New("netlab: Close of a test's lab (its test's cleanup removes it)")
	}
	return o.close()
}

// runner is Open's owner: Fatalf panics with failed (Open recovers it),
// Errorf keeps the error for Close, Cleanup's functions run at Close.
type runner struct {
	logf     func(format string, args ...any)
	cleanups []func()
	errs     []error
	closed   bool
}

type failed struct{ err error }

func (r *runner) Helper() {}
func (r *runner) Logf(format string, args ...any) {
	if r.logf != nil {
		r.logf(format, args...)
	}
}
func (r *runner) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Errorf(format, args...))
}
func (r *runner) Fatalf(format string, args ...any) { panic(failed{fmt.Errorf(format, args...)}) }
func (r *runner) Cleanup(f func())                  { r.cleanups = append(r.cleanups, f) }

func (r *runner) close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	return errors.Join(r.errs...)
}

func newLab(t owner, n int) *Lab {
	t.Helper()
	if n < 1 || n > 200 {
		t.Fatalf("netlab: %d nodes: want 1 to 200", n)
	}
	sweep(t)
	l := &Lab{
		t:     t,
		id:    strconv.FormatInt(int64(os.Getpid()), 36) + "-" + strconv.FormatInt(labs.Add(1), 36),
		cut:   map[[2]int]bool{},
		loss:  map[[2]int]float64{},
		rates: map[int]string{},
	}
	l.bridge = "nl" + l.id + "b"
	// The cleanup is registered before anything exists, so a failure half
	// way through still removes what was made.
	t.Cleanup(l.remove)
	if err := l.claimSubnet(); err != nil {
		t.Fatalf("netlab: %v", err)
	}
	l.must("ip", "link", "add", l.bridge, "type", "bridge")
	l.must("ip", "addr", "add", l.HostIP()+"/24", "dev", l.bridge)
	l.must("ip", "link", "set", l.bridge, "up")
	for i := range n {
		nd := &Node{Index: i, NS: fmt.Sprintf("netlab-%s-n%d", l.id, i), IP: fmt.Sprintf("%s.%d", l.prefix, i+1),
			veth: fmt.Sprintf("nl%sv%d", l.id, i)}
		l.Nodes = append(l.Nodes, nd)
		l.must("ip", "netns", "add", nd.NS)
		// The namespace's end is created in the namespace and named eth0
		// there: no second name in the test's namespace to collide.
		l.must("ip", "link", "add", nd.veth, "type", "veth", "peer", "name", "eth0", "netns", nd.NS)
		l.must("ip", "link", "set", nd.veth, "master", l.bridge, "up")
		l.must("ip", "-n", nd.NS, "addr", "add", nd.IP+"/24", "dev", "eth0")
		l.must("ip", "-n", nd.NS, "link", "set", "eth0", "up")
		l.must("ip", "-n", nd.NS, "link", "set", "lo", "up")
		l.apply(i)
	}
	return l
}

// HostIP is the test process's address on the bridge: clients and
// observers reach every node from it, and no fault applies to it.
func (l *Lab) HostIP() string { return l.prefix + ".254" }

// Command is prog with args to be run in node i's namespace. It enters
// only the network namespace (nsenter --net), not a mount namespace as
// `ip netns exec` does: that one remounts /sys, which hides
// /sys/fs/cgroup, and scdd needs the cgroups to contain its UAPs.
func (l *Lab) Command(i int, prog string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", l.CommandArgs(i, prog, args...)...)
}

// CommandArgs is nsenter's arguments of Command, for a harness that
// starts the program itself.
func (l *Lab) CommandArgs(i int, prog string, args ...string) []string {
	return append([]string{"--net=/run/netns/" + l.Nodes[i].NS, "--", prog}, args...)
}

// Do runs f on a thread in node i's network namespace: the sockets f
// opens are node i's (they keep their namespace after f returns).
func (l *Lab) Do(i int, f func() error) error {
	ns, err := os.Open("/run/netns/" + l.Nodes[i].NS)
	if err != nil {
		return err
	}
	defer ns.Close()
	errc := make(chan error, 1)
	go func() {
		// A thread of its own, locked: if it cannot go back to its
		// namespace it ends with the goroutine (still locked), so no other
		// goroutine runs in node i's namespace by accident.
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer home.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("netlab: setns %s: %w", l.Nodes[i].NS, err)
			return
		}
		ferr := f()
		if err := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err == nil {
			runtime.UnlockOSThread()
		}
		errc <- ferr
	}()
	return <-errc
}

// Cut drops every packet node from sends to node to (one way: to no
// longer hears from; from still hears to).
func (l *Lab) Cut(from, to int) { l.set(to, func() { l.cut[[2]int{from, to}] = true }) }

// Heal undoes Cut(from, to).
func (l *Lab) Heal(from, to int) { l.set(to, func() { delete(l.cut, [2]int{from, to}) }) }

// CutBoth cuts the link between a and b both ways.
func (l *Lab) CutBoth(a, b int) { l.Cut(a, b); l.Cut(b, a) }

// HealBoth heals the link between a and b both ways.
func (l *Lab) HealBoth(a, b int) { l.Heal(a, b); l.Heal(b, a) }

// Isolate cuts node i from every other node, both ways (not from the
// host: see the package comment).
func (l *Lab) Isolate(i int) {
	for j := range l.Nodes {
		if j != i {
			l.CutBoth(i, j)
		}
	}
}

// Rejoin heals every link of node i, both ways.
func (l *Lab) Rejoin(i int) {
	for j := range l.Nodes {
		if j != i {
			l.HealBoth(i, j)
		}
	}
}

// Loss drops pct percent (0 to 100, in steps of 0.01) of the packets node
// from sends to node to, at random (nftables' numgen); 0 removes it.
func (l *Lab) Loss(from, to int, pct float64) {
	l.set(to, func() {
		if pct <= 0 {
			delete(l.loss, [2]int{from, to})
		} else {
			l.loss[[2]int{from, to}] = pct
		}
	})
}

// LossAll sets Loss between every two nodes, both ways.
func (l *Lab) LossAll(pct float64) {
	for i := range l.Nodes {
		for j := range l.Nodes {
			if i != j {
				l.Loss(i, j, pct)
			}
		}
	}
}

// HealAll removes every cut and loss.
func (l *Lab) HealAll() {
	l.mu.Lock()
	l.cut = map[[2]int]bool{}
	l.loss = map[[2]int]float64{}
	l.mu.Unlock()
	for i := range l.Nodes {
		l.apply(i)
	}
}

// Rate limits what node i sends (to the others and to the host) to rate
// (tc's units: "1mbit", "500kbit") with a token bucket on its uplink; ""
// removes it. Packets beyond what the bucket and its 100 ms queue hold
// are dropped, as at a slow link's router.
func (l *Lab) Rate(i int, rate string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ns := l.Nodes[i].NS
	if rate == "" {
		if _, ok := l.rates[i]; ok {
			l.must("tc", "-n", ns, "qdisc", "del", "dev", "eth0", "root")
			delete(l.rates, i)
		}
		return
	}
	l.must("tc", "-n", ns, "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate, "burst", "16kb", "latency", "100ms")
	l.rates[i] = rate
}

// Dropped is how many packets node i's rules have dropped so far, by
// rule ("cut from 10.x.y.1", "loss from 10.x.y.2").
func (l *Lab) Dropped(i int) map[string]int {
	out := map[string]int{}
	cmd := exec.Command("ip", "netns", "exec", l.Nodes[i].NS, "nft", "list", "chain", "inet", "netlab", "in")
	b, err := cmd.Output()
	if err != nil {
		return out
	}
	for _, line := range strings.Split(string(b), "\n") {
		// ip saddr 10.x.y.1 counter packets 12 bytes 720 drop comment "cut from 10.x.y.1"
		f := strings.Fields(line)
		for k := 0; k+1 < len(f); k++ {
			if f[k] == "packets" {
				if c := strings.Index(line, `comment "`); c >= 0 {
					name := strings.TrimSuffix(line[c+len(`comment "`):], `"`)
					out[name], _ = strconv.Atoi(f[k+1])
				}
			}
		}
	}
	return out
}

// Sent is what node i has sent on its link so far (to the other nodes and
// the host), counted where it enters the bridge: the received counters
// of its veth's host end. A packet a cut or loss drops counts: it is
// dropped at the receiving node.
func (l *Lab) Sent(i int) (bytes, packets uint64) {
	read := func(what string) uint64 {
		b, err := os.ReadFile("/sys/class/net/" + l.Nodes[i].veth + "/statistics/" + what)
		if err != nil {
			return 0
		}
		n, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		return n
	}
	return read("rx_bytes"), read("rx_packets")
}

// set changes the lab's rules under its lock and applies node to's.
func (l *Lab) set(to int, change func()) {
	l.mu.Lock()
	change()
	l.mu.Unlock()
	l.apply(to)
}

// apply replaces node to's nftables table with one made from the lab's
// cuts and losses towards it, in one transaction (nft -f): no packet sees
// half of a change.
func (l *Lab) apply(to int) {
	l.mu.Lock()
	var rules []string
	var froms []int
	for k := range l.cut {
		if k[1] == to {
			froms = append(froms, k[0])
		}
	}
	sort.Ints(froms)
	for _, from := range froms {
		ip := l.Nodes[from].IP
		rules = append(rules, fmt.Sprintf("ip saddr %s counter drop comment \"cut from %s\"", ip, ip))
	}
	froms = froms[:0]
	for k := range l.loss {
		if k[1] == to && !l.cut[k] {
			froms = append(froms, k[0])
		}
	}
	sort.Ints(froms)
	for _, from := range froms {
		ip := l.Nodes[from].IP
		per10k := int(l.loss[[2]int{from, to}]*100 + 0.5)
		rules = append(rules, fmt.Sprintf("ip saddr %s numgen random mod 10000 < %d counter drop comment \"loss from %s\"", ip, per10k, ip))
	}
	l.mu.Unlock()
	// Declaring the table first makes the delete valid when it does not
	// exist yet; the three lines are one transaction.
	script := "table inet netlab\ndelete table inet netlab\ntable inet netlab {\n\tchain in {\n\t\ttype filter hook input priority filter; policy accept;\n"
	for _, r := range rules {
		script += "\t\t" + r + "\n"
	}
	script += "\t}\n}\n"
	cmd := exec.Command("ip", "netns", "exec", l.Nodes[to].NS, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		l.t.Fatalf("netlab: nft in %s: %v\n%s\n%s", l.Nodes[to].NS, err, out, script)
	}
}

// must runs a command and fails the test with its output if it fails.
func (l *Lab) must(prog string, args ...string) {
	l.t.Helper()
	if out, err := exec.Command(prog, args...).CombinedOutput(); err != nil {
		l.t.Fatalf("netlab: %s %s: %v\n%s", prog, strings.Join(args, " "), err, out)
	}
}

// remove deletes the namespaces (their veth ends go with them, and the
// host ends with those), the bridge and the subnet's claim. A namespace
// outlives its deletion while a process still runs in it; the harness
// stops the nodes first (its cleanups run before this one).
func (l *Lab) remove() {
	var errs []error
	for _, nd := range l.Nodes {
		if out, err := exec.Command("ip", "netns", "del", nd.NS).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip netns del %s: %v: %s", nd.NS, err, bytes.TrimSpace(out)))
		}
	}
	for _, nd := range l.Nodes {
		// Gone with its namespace, unless a process still holds that.
		if linkExists(nd.veth) {
			_ = exec.Command("ip", "link", "del", nd.veth).Run()
		}
	}
	if linkExists(l.bridge) {
		if out, err := exec.Command("ip", "link", "del", l.bridge).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip link del %s: %v: %s", l.bridge, err, bytes.TrimSpace(out)))
		}
	}
	if l.claim != "" {
		_ = os.Remove(l.claim)
	}
	if err := errors.Join(errs...); err != nil {
		l.t.Errorf("netlab: removing the lab: %v", err)
	}
}

func linkExists(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

// claimSubnet picks a free /24 in 10.200.0.0 to 10.249.255.0 and claims
// it with a file created O_EXCL in claimDir, holding this process's pid.
// A subnet already on an interface of this namespace is skipped.
func (l *Lab) claimSubnet() error {
	if err := os.MkdirAll(claimDir, 0o755); err != nil {
		return err
	}
	used := map[string]bool{}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				ip := ipn.IP.To4()
				used[fmt.Sprintf("10.%d.%d", ip[1], ip[2])] = ip[0] == 10
			}
		}
	}
	seed := os.Getpid()*131 + int(labs.Load())*7
	for k := range 50 * 256 {
		x := (seed + k*97) % (50 * 256)
		prefix := fmt.Sprintf("10.%d.%d", 200+x/256, x%256)
		if used[prefix] {
			continue
		}
		path := filepath.Join(claimDir, prefix)
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			continue
		}
		fmt.Fprintf(f, "%d %s\n", os.Getpid(), l.id)
		f.Close()
		l.prefix, l.claim = prefix, path
		return nil
	}
	return fmt.Errorf("no free /24 in 10.200-249.x.0 (claims in %s)", claimDir)
}

// sweep removes what labs of dead processes left: their namespaces,
// bridges and subnet claims (a test binary killed by its timeout runs no
// cleanups). A lab is found by its claim: a process that is gone (in this
// pid namespace) and a claim older than staleAfter, so that a lab of a
// live process in a pid namespace of its own, which looks gone from here,
// is left alone while it can still be running.
func sweep(t owner) {
	claims, _ := os.ReadDir(claimDir)
	var netns []string
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 0 {
				netns = append(netns, f[0])
			}
		}
	}
	for _, c := range claims {
		path := filepath.Join(claimDir, c.Name())
		b, err := os.ReadFile(path)
		info, ierr := os.Stat(path)
		f := strings.Fields(string(b))
		if err != nil || ierr != nil || len(f) < 2 || time.Since(info.ModTime()) < staleAfter {
			continue
		}
		pid, err := strconv.Atoi(f[0])
		if err != nil || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		id := f[1]
		for _, ns := range netns {
			if strings.HasPrefix(ns, "netlab-"+id+"-") {
				_ = exec.Command("ip", "netns", "del", ns).Run()
			}
		}
		if linkExists("nl" + id + "b") {
			_ = exec.Command("ip", "link", "del", "nl"+id+"b").Run()
		}
		_ = os.Remove(path)
		t.Logf("netlab: removed lab %s (subnet %s.0/24) of process %d, which is gone", id, c.Name(), pid)
	}
}

// staleAfter is how old a dead process's claim must be before sweep
// removes its lab: longer than any test using a lab runs.
const staleAfter = 10 * time.Minute
