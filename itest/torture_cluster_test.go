package itest

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"tpsched/internal/testenv"
	"tpsched/netio"
)

// clusterTortureAttacks are TestTortureCluster's classes: the single
// node's (the UAPs' on the serving nodes, the machine's on the entry
// node), five on the serving nodes' scdd, and "envs".
var clusterTortureAttacks = append(append([]string(nil), tortureAttacks...), "peerkill", "peerstop", "peerrestart", "peercut", "peerloss", "envs")

// TestTortureCluster is TestTorture across three nodes: the callers and
// the probes call n0 (127.0.0.2), which serves only probe; front and back
// run on n1 and n2 (127.0.0.3 and .4) alone, so every front or back call
// crosses to one of them, and front/call's local call stays there. Each
// class of TestTorture is on (UAPs killed, stopped, exiting on the
// serving nodes; n0's descriptor table filled, n0 restarted), and on
// n1's and n2's scdd, at random moments: "peerkill" SIGKILL, and the node
// started again (its UAPs, left over, are killed by the new scdd) after
// up to 1.5 s; "peerstop" SIGSTOP for up to 2.5 s (longer than the fast
// failure detection's verdict); "peerrestart" a hand-over (SIGUSR2);
// "peercut" the node cut from the cluster (nftables drops every packet to
// or from its address on the cluster's ports, both ways, as a failed link
// does: nothing is reset) for up to 4 s; "peerloss" 5 to 30% of those
// packets dropped at random for up to 5 s; "envs": every node has a
// service policy that makes env, which n1 and n2 define (uap-torture), an
// application environment, a fifth of the calls: its server starts on n1
// or n2, where the deciding node (n0, the lowest id with the policy)
// places it at the first call, is passed over by each hand-over, dies
// with its node or its processes, and is quiesced (then resumed) or
// refreshed across the cluster at random (scdctl on n0).
//
// The checks are TestTorture's: every call n0 read is answered once
// ('network down' for a call whose node died or was taken for dead with
// it: executed at most once), executed at most once, ok only if executed
// once with its own reply; n0 answers its probe throughout; a serving
// node that dies when no attack asked is a break. After the run, with
// "envs", env must serve a call once resumed.
func TestTortureCluster(t *testing.T) {
	testenv.Slow(t, "three nodes under attack for TPSCHED_TORTURE_DURATION (20 s by default)")
	skipShort(t)
	if err := buildTortureUAP(); err != nil {
		t.Fatal(err)
	}
	tt := newTorture(t, clusterTortureAttacks)
	rpc, name := clusterPorts(t)
	// Node i's definitions: defDir's, with a sysconf of the cluster's.
	tt.env = tt.attacks["envs"]
	defs := func(i int, servers map[string]string) string {
		dir := defDir(t, "", servers)
		sys := clusterSysconf(i, clusterIPs, rpc, name)
		must(t, os.WriteFile(filepath.Join(dir, "sysconf"), []byte(sys), 0o644))
		if tt.env {
			must(t, os.WriteFile(filepath.Join(dir, "svcpolicy"), []byte(tortureEnvPolicy), 0o644))
		}
		return dir
	}
	t.Setenv("GOTRACEBACK", "all") // SIGQUIT from the watchdog: every goroutine
	var peers []*tpeer
	for i := 1; i < len(clusterIPs); i++ {
		p := &tpeer{tt: tt, name: fmt.Sprintf("n%d", i), addr: clusterIPs[i], log: filepath.Join(t.TempDir(), "scdd.log"), exits: map[int]string{}}
		servers := map[string]string{
			"front": fmt.Sprintf(tortureServer, "front", bin("uap-torture"), tt.dir, tt.execLog),
			"back":  fmt.Sprintf(tortureServer, "back", bin("uap-torture"), tt.dir, tt.execLog),
		}
		if tt.env {
			servers["env"] = fmt.Sprintf(tortureServer, "env", bin("uap-torture"), tt.dir, tt.execLog)
		}
		p.dir = defs(i, servers)
		t.Cleanup(p.stop)
		if err := p.start(); err != nil {
			t.Fatal(err)
		}
		peers = append(peers, p)
	}
	var lo *loFaults
	if tt.attacks["peercut"] || tt.attacks["peerloss"] {
		lo = newLoFaults(tt, rpc, name)
		if lo == nil {
			tt.attacks["peercut"], tt.attacks["peerloss"] = false, false
		}
	}
	entry := defs(0, map[string]string{"probe": tortureProbe})
	tt.n = startRestartingNode(t, entry, "-drain-timeout", "5s", "-fast-failure-detection")
	tt.logs = []string{tt.n.log}
	for _, p := range peers {
		tt.logs = append(tt.logs, p.log)
	}
	tt.pid.Store(int64(tt.n.cmd.Process.Pid))
	tt.uapNodes = func() []string {
		var addrs []string
		for _, p := range peers {
			if addr, up := p.state(); up {
				addrs = append(addrs, addr)
			}
		}
		return addrs
	}
	waitFor(t, 20*time.Second, "the serving nodes' processes to start", func() bool { return len(tt.uapPIDsOf()) >= 8 }, tt.n.logText)
	waitFor(t, 20*time.Second, "n0 to know front and back on n1 and n2", func() bool {
		st, err := statusOf(tt.n.http)
		if err != nil {
			return false
		}
		served := 0
		for _, ns := range st.Cluster.Nodes {
			for _, g := range ns.Groups {
				if g.Group == "front" || g.Group == "back" {
					served++
				}
			}
		}
		return served == 4
	}, tt.n.logText)
	// A call n0 found no node for, or whose node could not be reached, is
	// counted apart by whether both serving nodes were out (an attack took
	// them out and they were not yet back in n0's table) at some moment
	// while it ran, and env's apart from front's and back's (env's
	// server runs on one node, where the decider started it, and its
	// calls meet more). With both out there is nowhere to go,
	// and callers answered at once call again at once: a few hundred ms
	// both out give thousands of such answers. 'no such service group'
	// for front or back while a node was in says n0's table lost a node
	// nothing took out; 'network down' while a node was in is most often a
	// call n0 sent to the node that was out before it knew ("connection
	// to node n1 lost", "connection refused"). The first few of each are
	// logged with their messages and the attacks' windows, to be read.
	var examplesMu sync.Mutex
	examples := map[string][]string{}
	nsgWhileIn := fmt.Sprintf("%q", netio.CodeNoSuchGroup.String())
	defer func() {
		for what, ex := range examples {
			t.Logf("%s while a serving node was in, the first %d:\n%s", what, len(ex), strings.Join(ex, "\n"))
		}
		if len(examples[nsgWhileIn]) > 0 {
			// Seen in three runs, two explained and fixed, one not
			// (docs/RELIABILITY.md): what n0's processes said of the
			// cluster's members. 80 lines reached back 12 s from the end,
			// not to the answers of the third run.
			t.Logf("n0's log on the cluster's members:\n%s", linesMatching(tt.n.logText(), membersLine, 400))
		}
	}()
	tt.explain = func(c *tcall) string {
		if c.kind != netio.KindError || (c.code != netio.CodeNoSuchGroup && c.code != netio.CodeNetworkDown) || c.group == "probe" {
			return ""
		}
		what := fmt.Sprintf("%q", c.code.String())
		if c.group == "env" {
			what += " for env"
		}
		both := true
		for _, p := range peers {
			both = both && p.outDuring(c.sentAt, c.answeredAt)
		}
		if both {
			return "of which " + what + " with both serving nodes out"
		}
		examplesMu.Lock()
		if len(examples[what]) < 5 {
			var out strings.Builder
			for _, p := range peers {
				fmt.Fprintf(&out, " %s out %s;", p.name, p.outsNear(c.sentAt, c.answeredAt))
			}
			examples[what] = append(examples[what], fmt.Sprintf("  %s/%s sent %v (%s, as in the nodes' logs) answered %v:%s %q",
				c.group, c.service, c.sentAt.Round(time.Millisecond), tt.start.Add(c.sentAt).UTC().Format("15:04:05.000"),
				c.answeredAt.Round(time.Millisecond), out.String(), c.msg))
		}
		examplesMu.Unlock()
		return "of which " + what + " while a serving node was in"
	}
	defer func() { t.Logf("both serving nodes out at once: %v in all", bothOut(peers).Round(time.Millisecond)) }()
	tt.run(func(spawn func(func()), rng func(uint64) *rand.Rand) {
		var acts []func(*tpeer, *rand.Rand)
		for _, a := range []struct {
			name string
			f    func(*tpeer, *rand.Rand)
		}{{"peerkill", (*tpeer).kill}, {"peerstop", (*tpeer).pause}, {"peerrestart", (*tpeer).restart},
			{"peercut", func(p *tpeer, r *rand.Rand) { lo.fault(p, 100, time.Duration(200+r.IntN(3800))*time.Millisecond) }},
			{"peerloss", func(p *tpeer, r *rand.Rand) {
				lo.fault(p, 5+r.IntN(26), time.Duration(500+r.IntN(4500))*time.Millisecond)
			}}} {
			if tt.attacks[a.name] {
				acts = append(acts, a.f)
			}
		}
		if tt.env {
			spawn(func() { tt.envActions(rng(20)) })
		}
		for i, p := range peers {
			spawn(func() { p.watch() })
			if len(acts) == 0 {
				continue
			}
			spawn(func() {
				r := rng(10 + uint64(i))
				for tt.sleep(time.Duration(1500+r.IntN(3500)) * time.Millisecond) {
					acts[r.IntN(len(acts))](p, r)
				}
			})
		}
	})
	if tt.env && !tt.aborted() {
		tt.envServesAfter()
	}
	for _, p := range peers {
		b, _ := os.ReadFile(p.log)
		checkRace(t, p.name+"'s scdd (any incarnation) or one of its UAPs", string(b))
		if t.Failed() {
			t.Logf("%s's scdd log:\n%s", p.name, b)
		}
	}
}

// tpeer is a serving node of TestTortureCluster: an scdd the attacks kill,
// stop and restart, and start again. Its log (every incarnation's, one
// after another) is a file.
type tpeer struct {
	tt   *torture
	name string
	addr string // its RPC and name address
	dir  string
	log  string

	mu    sync.Mutex
	outs  [][2]time.Duration // since the run's start: from an attack that takes it out until it is back in n0's table
	pid   int                // the scdd serving now
	http  string             // its metrics address (a new one at each start)
	down  bool               // killed, or stopped, or handing over: on purpose
	pgids []int              // every incarnation's process group, for the cleanup
	exits map[int]string     // how each scdd the test started ended, by pid
}

// tpeerStarted is a fresh scdd's "scdd started" line (a hand-over's new
// process adds scdd_pid=).
var tpeerStarted = regexp.MustCompile(`msg="scdd started" [^\n]*http=(\S+) [^\n]*groups=\d+\n`)

// start starts an scdd on the node's definitions and waits for it to
// serve.
func (p *tpeer) start() error {
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.Command(bin("scdd"), "-c", p.dir, "-drain-timeout", "5s", "-fast-failure-detection")
	cmd.Env = append(os.Environ(), "DCCONFPATH=")
	cmd.Stderr = f // a file: a new process of a hand-over inherits it
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// Only what this process writes counts: the log before it holds the
	// "scdd started" lines of earlier incarnations, hand-overs' too.
	st, err := f.Stat()
	if err != nil {
		return err
	}
	from := st.Size()
	if err := cmd.Start(); err != nil {
		return err
	}
	pid := cmd.Process.Pid
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.exits[pid] = fmt.Sprint(err)
		p.mu.Unlock()
	}()
	p.mu.Lock()
	p.pgids = append(p.pgids, pid)
	p.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(p.log)
		if m := tpeerStarted.FindSubmatch(b[min(from, int64(len(b))):]); m != nil {
			p.mu.Lock()
			p.pid, p.http, p.down = pid, string(m[1]), false
			p.mu.Unlock()
			return nil
		}
		if !pidAliveInt(cmd.Process.Pid) {
			return fmt.Errorf("%s: scdd exited at its start; its log:\n%s", p.name, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s: scdd did not start within 30 s", p.name)
}

// state is the node's metrics address and whether it serves (not down on
// purpose).
func (p *tpeer) state() (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.http, !p.down
}

func (p *tpeer) setDown(down bool) (pid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	return p.pid
}

// goOut marks the node out of the cluster from now until the call of
// the function it returns (made once the node is back in n0's table, or
// the attack ended without it).
func (p *tpeer) goOut() (back func()) {
	from := time.Since(p.tt.start)
	return func() {
		p.mu.Lock()
		p.outs = append(p.outs, [2]time.Duration{from, time.Since(p.tt.start)})
		p.mu.Unlock()
	}
}

// outDuring reports whether the node was out at any moment of [from, to].
func (p *tpeer) outDuring(from, to time.Duration) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, o := range p.outs {
		if o[0] <= to && from <= o[1] {
			return true
		}
	}
	return false
}

// outsNear lists the windows the node was out within 5 s of [from, to].
func (p *tpeer) outsNear(from, to time.Duration) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var near []string
	for _, o := range p.outs {
		if o[0] <= to+5*time.Second && from-5*time.Second <= o[1] {
			near = append(near, fmt.Sprintf("%v-%v", o[0].Round(time.Millisecond), o[1].Round(time.Millisecond)))
		}
	}
	if len(near) == 0 {
		return "never"
	}
	return strings.Join(near, ", ")
}

// bothOut is how long every one of peers was out at once.
func bothOut(peers []*tpeer) time.Duration {
	type edge struct {
		at    time.Duration
		delta int
	}
	var edges []edge
	for _, p := range peers {
		p.mu.Lock()
		for _, o := range p.outs {
			edges = append(edges, edge{o[0], 1}, edge{o[1], -1})
		}
		p.mu.Unlock()
	}
	sort.Slice(edges, func(i, j int) bool {
		return edges[i].at < edges[j].at || (edges[i].at == edges[j].at && edges[i].delta > edges[j].delta)
	})
	var total, since time.Duration
	out := 0
	for _, e := range edges {
		if out == len(peers) {
			total += e.at - since
		}
		out += e.delta
		since = e.at
	}
	return total
}

// kill is "peerkill": SIGKILL of scdd, then a new one after up to 1.5 s.
func (p *tpeer) kill(r *rand.Rand) {
	defer p.goOut()()
	pid := p.setDown(true)
	if syscall.Kill(pid, syscall.SIGKILL) != nil {
		return
	}
	p.tt.count("serving nodes killed", 1)
	for pidAliveInt(pid) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(time.Duration(r.IntN(1500)) * time.Millisecond)
	if err := p.start(); err != nil {
		p.tt.fail("%s killed and started again: %v", p.name, err)
		return
	}
	p.back("killed and started again")
}

// back waits until n0's name table holds the node's groups again after an
// attack that took it out (a node that never comes back is a break), and
// counts how long that took.
func (p *tpeer) back(after string) {
	tt := p.tt
	began := time.Now()
	for time.Since(began) < 15*time.Second {
		if st, err := statusOf(tt.n.http); err == nil {
			for _, ns := range st.Cluster.Nodes {
				if ns.Node == p.name && len(ns.Groups) > 0 {
					ms := int(time.Since(began).Milliseconds())
					tt.count("serving nodes back in n0's table after an attack", 1)
					tt.mu.Lock()
					tt.figures["ms until back in n0's table, the longest"] = max(tt.figures["ms until back in n0's table, the longest"], ms)
					tt.mu.Unlock()
					return
				}
			}
		}
		if !tt.sleep(20 * time.Millisecond) {
			return
		}
	}
	tt.fail("%s %s: not back in n0's name table 15 s later", p.name, after)
}

// pause is "peerstop": SIGSTOP of scdd for up to 2.5 s.
func (p *tpeer) pause(r *rand.Rand) {
	defer p.goOut()()
	pid := p.setDown(true)
	defer p.setDown(false)
	if syscall.Kill(pid, syscall.SIGSTOP) != nil {
		return
	}
	p.tt.count("serving nodes stopped", 1)
	time.Sleep(time.Duration(100+r.IntN(2400)) * time.Millisecond)
	_ = syscall.Kill(pid, syscall.SIGCONT)
	p.back("stopped and continued")
}

// restart is "peerrestart": a hand-over (SIGUSR2), waited for.
func (p *tpeer) restart(*rand.Rand) {
	b, _ := os.ReadFile(p.log)
	before := len(newPIDLine.FindAllStringSubmatch(string(b), -1))
	old := p.setDown(true)
	if syscall.Kill(old, syscall.SIGUSR2) != nil {
		return
	}
	p.tt.count("serving nodes' hand-overs", 1)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(p.log)
		if m := newPIDLine.FindAllStringSubmatch(string(b), -1); len(m) > before {
			pid, _ := strconv.Atoi(m[len(m)-1][1])
			p.mu.Lock()
			p.pid, p.down = pid, false
			p.mu.Unlock()
			return
		}
		if !pidAliveInt(old) {
			p.tt.fail("%s: scdd pid %d died during a hand-over with no new process serving", p.name, old)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.tt.fail("%s: no new process took over within 30 s of SIGUSR2 to pid %d", p.name, old)
}

// watch fails the run when the node's scdd dies and no attack killed it.
// An attack marks the node down before it signals, so the state is read
// again after a death is seen: read only before, a kill that came between
// the read and the look at the process passed for a death of its own.
func (p *tpeer) watch() {
	state := func() (int, bool) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.pid, p.down
	}
	for p.tt.sleep(50 * time.Millisecond) {
		pid, down := state()
		if down || pidAliveInt(pid) {
			continue
		}
		if pid2, down2 := state(); pid2 == pid && !down2 && !p.tt.aborted() {
			p.tt.fail("%s: scdd pid %d died when no attack asked it to (%s): its log is below", p.name, pid, p.exitOf(pid))
			return
		}
	}
}

// exitOf says how process pid ended, when the test started it: its
// status is read by a goroutine of its own, so it waits a little for it.
func (p *tpeer) exitOf(pid int) string {
	for range 50 {
		p.mu.Lock()
		e, ok := p.exits[pid]
		p.mu.Unlock()
		if ok {
			return e
		}
		time.Sleep(10 * time.Millisecond)
	}
	return "a hand-over's process, or its status not read"
}

// stop ends every incarnation of the node: SIGTERM, then SIGKILL of what
// is left after 15 s.
func (p *tpeer) stop() {
	p.mu.Lock()
	pgids := p.pgids
	pid := p.pid
	p.mu.Unlock()
	_ = syscall.Kill(pid, syscall.SIGCONT)
	for _, g := range pgids {
		_ = syscall.Kill(-g, syscall.SIGTERM)
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		alive := 0
		for _, g := range pgids {
			if syscall.Kill(-g, 0) == nil {
				alive++
			}
		}
		if alive == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, g := range pgids {
		_ = syscall.Kill(-g, syscall.SIGKILL)
	}
}

// loFaults cuts and thins out a serving node's links on the loopback
// interface, where the cluster's nodes talk: an nftables table of the
// test's own drops every packet (or pct percent, at random) to or from the
// node's address whose either port is the cluster's RPC or name port. The
// callers' and the probes' packets (to n0) and the status look-ups (the
// metrics ports) pass. The table is removed when the test ends.
type loFaults struct {
	tt    *torture
	table string
	ports string // "{ rpc, name }"

	mu  sync.Mutex // one change at a time, the whole table in one transaction
	pct map[string]int
}

// newLoFaults makes the table, or returns nil (the attacks left out, with
// the reason logged) where nft or root is missing; where the run must be
// complete that fails the test.
func newLoFaults(tt *torture, rpc, name int) *loFaults {
	t := tt.t
	why := ""
	if _, err := exec.LookPath("nft"); err != nil {
		why = "needs nft (Debian's nftables)"
	} else if os.Geteuid() != 0 {
		why = "needs root (nftables)"
	}
	if why != "" {
		if req := testenv.Required(); req != "" {
			t.Fatalf("peercut and peerloss %s, and %s asks for every test", why, req)
		}
		t.Logf("peercut and peerloss left out: %s", why)
		return nil
	}
	lo := &loFaults{tt: tt, table: fmt.Sprintf("tpsched_torture_%d", os.Getpid()), ports: fmt.Sprintf("{ %d, %d }", rpc, name),
		pct: map[string]int{}}
	lo.apply()
	t.Cleanup(func() { _ = exec.Command("nft", "delete", "table", "inet", lo.table).Run() })
	return lo
}

// fault drops pct percent of p's cluster packets for d, then heals.
func (lo *loFaults) fault(p *tpeer, pct int, d time.Duration) {
	defer p.goOut()()
	lo.set(p.addr, pct)
	defer lo.set(p.addr, 0) // also when the run ends meanwhile
	what := "serving nodes cut off"
	if pct < 100 {
		what = "serving nodes' links made lossy"
	}
	p.tt.count(what, 1)
	p.tt.sleep(d)
	lo.set(p.addr, 0)
	p.back("cut off or lossy")
}

func (lo *loFaults) set(addr string, pct int) {
	lo.mu.Lock()
	defer lo.mu.Unlock()
	if pct <= 0 {
		delete(lo.pct, addr)
	} else {
		lo.pct[addr] = pct
	}
	lo.apply()
}

// apply replaces the table with the faults now, in one transaction. Under
// mu (or before the table is shared).
func (lo *loFaults) apply() {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s\ndelete table inet %s\ntable inet %s {\n\tchain in {\n"+
		"\t\ttype filter hook input priority filter; policy accept;\n", lo.table, lo.table, lo.table)
	addrs := make([]string, 0, len(lo.pct))
	for a := range lo.pct {
		addrs = append(addrs, a)
	}
	sort.Strings(addrs)
	for _, a := range addrs {
		drop := "counter drop"
		if pct := lo.pct[a]; pct < 100 {
			drop = fmt.Sprintf("numgen random mod 100 < %d counter drop", pct)
		}
		for _, dir := range []string{"saddr", "daddr"} {
			for _, port := range []string{"sport", "dport"} {
				fmt.Fprintf(&b, "\t\tip %s %s th %s %s %s\n", dir, a, port, lo.ports, drop)
			}
		}
	}
	b.WriteString("\t}\n}\n")
	lo.tt.count("packets dropped by cuts and losses", lo.counted()) // by the table replaced
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		lo.tt.t.Errorf("nft: %v\n%s\n%s", err, out, b.String())
	}
}

var nftPackets = regexp.MustCompile(`counter packets (\d+)`)

// counted is the packets the table's rules have dropped since it was
// made. Under mu.
func (lo *loFaults) counted() int {
	out, _ := exec.Command("nft", "list", "table", "inet", lo.table).Output()
	n := 0
	for _, m := range nftPackets.FindAllStringSubmatch(string(out), -1) {
		k, _ := strconv.Atoi(m[1])
		n += k
	}
	return n
}

// membersLine is a log line of a node on the cluster's members: a member
// left or died, the name table settled, memberlist's own warnings, a
// hand-over.
var membersLine = regexp.MustCompile(`node left or died|name table settled|cluster joined|msg=memberlist|restart`)
