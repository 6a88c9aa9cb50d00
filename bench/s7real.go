package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"tpsched/netio"
)

// S7 over real nodes: n scdd processes, one address each (127.0.0.10 and
// on, as on n hosts), every one with the others in all_node and the group
// "bench" (no resident process: nothing runs until a call comes). A
// change is a hold or a release of the group on a node drawn at random
// (POST /hold on its control socket): it goes out as an announce like a
// level change. Each other node is asked for a name lookup of "bench" over
// its RPC port every s7RealPoll until its answer says what the change
// said (the held node missing, or back): that is when its table holds it.
// With -net lab each node is in a network namespace of its own instead
// (net.go); the lookups and holds still come from the host.

// S7 real-node sizing.
const (
	s7RealNodes      = 32
	s7RealQuickNodes = 8
	s7RealFirstIP    = 10 // 127.0.0.10 and on
	s7RealPoll       = 5 * time.Millisecond
	s7RealJoinLimit  = 90 * time.Second
)

// s7RealSetup is how the real nodes were run; Nodes 0: not run.
type s7RealSetup struct {
	Nodes      int           `json:"nodes"`
	Network    string        `json:"network"`      // "loopback", "lab", "lab, 1% loss"
	Addrs      string        `json:"addrs"`        // the nodes' addresses, first to last
	NetLine    string        `json:"network_line"` // the network's setup line, taken at the end (its drops)
	Probes     int           `json:"probes"`
	Quiet      time.Duration `json:"quiet_ns"`
	Poll       time.Duration `json:"poll_ns"`
	ProbeLimit time.Duration `json:"probe_limit_ns"`
	Gap        time.Duration `json:"gap_ns"`
}

// realGossip is S7's measurement over real scdd processes.
type realGossip struct {
	Setup        s7RealSetup   `json:"setup"`
	Error        string        `json:"error,omitempty"` // why it was not measured, or stopped
	JoinSeconds  float64       `json:"join_s"`          // from the first start until every node's lookup lists all
	Probes       []probeResult `json:"probes"`
	NotConverged int           `json:"not_converged"`
	AllP50Ms     float64       `json:"all_p50_ms"`
	AllP99Ms     float64       `json:"all_p99_ms"`
	AllMaxMs     float64       `json:"all_max_ms"`
	TableP50Ms   float64       `json:"table_p50_ms"`
	TableP99Ms   float64       `json:"table_p99_ms"`
	TableMaxMs   float64       `json:"table_max_ms"`
	Quiet        traffic       `json:"quiet"`
	Changes      traffic       `json:"changes"`
}

// s7RealSizing is the real nodes' setup for the session.
func s7RealSizing(cfg Config) s7RealSetup {
	n := cfg.S7Real
	switch {
	case n < 0:
		return s7RealSetup{}
	case n == 0 && cfg.Quick:
		n = s7RealQuickNodes
	case n == 0:
		n = s7RealNodes
	}
	setup, _, _ := s7Sizing(cfg)
	return s7RealSetup{Nodes: n, Probes: setup.Probes, Quiet: setup.Quiet, Poll: s7RealPoll, ProbeLimit: s7ProbeLimit, Gap: s7Gap}
}

// s7RealTime is the real nodes' step: starting them, the quiet spell and
// the changes.
func s7RealTime(rs s7RealSetup) time.Duration {
	return time.Duration(rs.Nodes)*200*time.Millisecond + rs.Quiet + time.Duration(rs.Probes)*(rs.Gap+time.Second) + 5*time.Second
}

// realNodes are the running scdd processes.
type realNodes struct {
	*system
	net   *nodeNet
	ids   []string
	rpc   []string // RPC addresses, as the lookup answers name them
	ctl   []string // metrics addresses (/status)
	socks []string // control sockets
	conns []*netio.MuxConn
}

func (rn *realNodes) close() {
	for _, c := range rn.conns {
		if c != nil {
			c.Close(errors.New("bench: done"))
		}
	}
	rn.Stop()
}

// s7RealIPs are the real nodes' loopback addresses: 127.0.0.10 and on.
func s7RealIPs(n int) []string {
	var ips []string
	for i := range n {
		ips = append(ips, fmt.Sprintf("127.0.0.%d", s7RealFirstIP+i))
	}
	return ips
}

// startRealNodes starts an scdd process on every node of nn.
func startRealNodes(env Env, nn *nodeNet) (*realNodes, error) {
	ips := nn.ips
	s, err := newSystem(fmt.Sprintf("scdd x%d", len(ips)))
	if err != nil {
		return nil, err
	}
	rn := &realNodes{system: s, net: nn}
	ports, err := nn.ports(3)
	if err != nil {
		s.Stop()
		return nil, err
	}
	rpcPort, namePort, ctlPort := ports[0], ports[1], ports[2]
	scdd, err := filepath.Abs(filepath.Join(env.Bin, "scdd"))
	if err != nil {
		s.Stop()
		return nil, err
	}
	uap, err := filepath.Abs(filepath.Join(env.Bin, "uap-echo"))
	if err != nil {
		s.Stop()
		return nil, err
	}
	var all []string
	for _, ip := range ips {
		all = append(all, strconv.Quote(ip))
	}
	for i, ip := range ips {
		id := fmt.Sprintf("s7n%03d", i)
		dir := filepath.Join(s.dir, id)
		rn.ids = append(rn.ids, id)
		rn.rpc = append(rn.rpc, net.JoinHostPort(ip, strconv.Itoa(rpcPort)))
		rn.ctl = append(rn.ctl, net.JoinHostPort(ip, strconv.Itoa(ctlPort)))
		rn.socks = append(rn.socks, filepath.Join(dir, "control.sock"))
		files := map[string]string{
			id + "/sysconf": fmt.Sprintf("set node_id = %q\nset rpc_address = %q\nset rpc_port = %d\nset name_port = %d\n"+
				"set metrics_address = %q\nset control_socket = %q\nset all_node = %s\n",
				id, ip, rpcPort, namePort, rn.ctl[i], rn.socks[i], strings.Join(all, ", ")),
			id + "/scdsvcdef": "",
			id + "/usr/bench": fmt.Sprintf("set service_group = %q\nset service = \"echo=echo\"\nset module = %q\nset parallel_count = 0,1\n"+
				"set loadcheck_interval = 0\n", s7Group, uap),
		}
		if err := writeFiles(s.dir, files); err != nil {
			s.Stop()
			return nil, err
		}
		prog, args := nn.command(i, scdd, "-c", dir, "-log-level", "warn")
		if err := s.start(id+".log", nil, prog, args...); err != nil {
			s.Stop()
			return nil, err
		}
	}
	return rn, nil
}

// lookup asks node j which nodes run "bench" and are not held.
func (rn *realNodes) lookup(j int, buf []byte) ([]netio.NodeLevel, []byte, error) {
	if rn.conns[j] == nil {
		nc, err := net.DialTimeout("tcp", rn.rpc[j], time.Second)
		if err != nil {
			return nil, buf, err
		}
		rn.conns[j] = netio.NewMuxConn(nc, netio.MuxOptions{CallerReads: true})
	}
	f, buf, err := rn.conns[j].RoundTrip(netio.Header{Kind: netio.KindNameLookup}, s7Group, "", nil, time.Now().Add(2*time.Second), buf)
	if err != nil {
		rn.conns[j] = nil
		return nil, buf, err
	}
	if f.Kind != netio.KindReply {
		return nil, buf, fmt.Errorf("%s: lookup answered %v: %s", rn.ids[j], f.Kind, f.Payload)
	}
	nodes, err := netio.ParseLookupAnswer(f.Payload)
	return nodes, buf, err
}

// lists reports whether a lookup answer names addr.
func lists(nodes []netio.NodeLevel, addr string) bool {
	return slices.ContainsFunc(nodes, func(n netio.NodeLevel) bool { return n.Addr == addr })
}

// hold holds or releases "bench" on node i over its control socket.
func (rn *realNodes) hold(i int, hold bool) error {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", rn.socks[i])
		}}}
	verb := "release"
	if hold {
		verb = "hold"
	}
	resp, err := c.Post("http://scdd/"+verb+"?group="+s7Group, "", nil)
	if err != nil {
		return fmt.Errorf("%s %s: %w", verb, rn.ids[i], err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s", verb, rn.ids[i], resp.Status)
	}
	return nil
}

// gossipStats reads every node's announce counters from /status.
func (rn *realNodes) gossipStats() (bytes, msgs, sent uint64) {
	for _, ctl := range rn.ctl {
		var st struct {
			Cluster *struct {
				Gossip struct {
					Sent         uint64 `json:"announces_sent"`
					MessagesSent uint64 `json:"announce_messages_sent"`
					BytesSent    uint64 `json:"announce_bytes_sent"`
				} `json:"gossip"`
			} `json:"cluster"`
		}
		if err := getJSON("http://"+ctl+"/status", &st); err != nil || st.Cluster == nil {
			continue
		}
		bytes += st.Cluster.Gossip.BytesSent
		msgs += st.Cluster.Gossip.MessagesSent
		sent += st.Cluster.Gossip.Sent
	}
	return bytes, msgs, sent
}

// ticks is the scdd processes' own CPU ticks.
func (rn *realNodes) ticks() uint64 {
	var sum uint64
	for _, pid := range rn.Roots() {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		if s, err := parseStat(b); err == nil {
			sum += s.Utime + s.Stime
		}
	}
	return sum
}

// runS7Real starts the real nodes, waits for the join, measures the quiet
// spell and the changes, and stops them. A failure is reported in Error,
// not as the session's.
func runS7Real(ctx context.Context, cfg Config, rs s7RealSetup) *realGossip {
	res := &realGossip{Setup: rs}
	nn, err := openNet(cfg, s7RealIPs(rs.Nodes))
	if err != nil {
		res.Error = err.Error()
		fmt.Fprintf(cfg.Log, "S7: %d scdd nodes not measured: %v\n", rs.Nodes, err)
		return res
	}
	res.Setup.Network, res.Setup.Addrs = nn.short(), ipRange(nn.ips)
	fmt.Fprintf(cfg.Log, "S7: %d scdd nodes on %s (%s)\n", rs.Nodes, ipRange(nn.ips), res.Setup.Network)
	// The nodes stop before the lab goes (deferred last, run first), and
	// the network's line is taken with the lab still there (its drops).
	defer func() {
		if err := nn.close(); err != nil {
			fmt.Fprintf(cfg.Log, "S7: removing the network: %v\n", err)
		}
	}()
	defer func() { res.Setup.NetLine = nn.describe() }()
	t0 := time.Now()
	rn, err := startRealNodes(cfg.Env, nn)
	if err != nil {
		res.Error = err.Error()
		fmt.Fprintf(cfg.Log, "  not measured: %v\n", err)
		return res
	}
	defer rn.close()
	rn.conns = make([]*netio.MuxConn, rs.Nodes)
	// Join: every node's lookup lists every node.
	var buf []byte
	for j := range rs.Nodes {
		for {
			nodes, b, err := rn.lookup(j, buf)
			buf = b
			if err == nil && len(nodes) == rs.Nodes {
				break
			}
			if time.Since(t0) > s7RealJoinLimit || ctx.Err() != nil {
				res.Error = fmt.Sprintf("%s lists %d of %d nodes after %v (%v)\n%s", rn.ids[j], len(nodes), rs.Nodes, s7RealJoinLimit, err, rn.Log())
				fmt.Fprintf(cfg.Log, "  join did not converge: %s lists %d of %d nodes (%v)\n", rn.ids[j], len(nodes), rs.Nodes, err)
				return res
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	res.JoinSeconds = time.Since(t0).Seconds()
	fmt.Fprintf(cfg.Log, "  join: every lookup lists all %d nodes after %.1f s\n", rs.Nodes, res.JoinSeconds)

	phase := func(run func()) traffic {
		b0, m0, s0 := rn.gossipStats()
		lb0, lp0 := rn.net.sent()
		mb0, ms0 := machineCPU()
		c0, at := rn.ticks(), time.Now()
		run()
		secs := time.Since(at).Seconds()
		c1 := rn.ticks()
		mb1, ms1 := machineCPU()
		lb1, lp1 := rn.net.sent()
		b1, m1, s1 := rn.gossipStats()
		per := float64(rs.Nodes) * secs
		return traffic{Seconds: secs, BytesPerNodeS: float64(b1-b0) / per, MessagesPerNodeS: float64(m1-m0) / per, Announces: float64(s1 - s0),
			LoopbackBytesPerNodeS: float64(lb1-lb0) / per, LoopbackPktsPerNodeS: float64(lp1-lp0) / per,
			CPUCores: float64(c1-c0) / clockTicks / secs, MachineCores: (mb1 - mb0) / secs, StealCores: (ms1 - ms0) / secs, MinTable: rs.Nodes}
	}
	res.Quiet = phase(func() { sleepCtx(ctx, rs.Quiet) })
	logTraffic(cfg.Log, "quiet", res.Quiet)

	rnd := rand.New(rand.NewPCG(7, 32))
	held := make([]bool, rs.Nodes)
	var pooled []float64
	res.Changes = phase(func() {
		for k := range rs.Probes {
			if ctx.Err() != nil {
				return
			}
			i := rnd.IntN(rs.Nodes)
			held[i] = !held[i]
			pr, err := rn.probe(ctx, i, held[i], rs)
			if err != nil {
				res.Error = err.Error()
				fmt.Fprintf(cfg.Log, "  change %d: %v\n", k+1, err)
				return
			}
			for _, d := range pr.DelaysMs {
				if d >= 0 {
					pooled = append(pooled, d)
				}
			}
			res.Probes = append(res.Probes, pr)
			fmt.Fprintf(cfg.Log, "  change %2d: %s %s seen by %d/%d, median %.0f ms, all %.0f ms\n", k+1, pr.Node, pr.Level, pr.Seen, rs.Nodes-1, pr.P50Ms, pr.AllMs)
			sleepCtx(ctx, rs.Gap)
		}
	})
	logTraffic(cfg.Log, "changes", res.Changes)
	var all []float64
	for _, p := range res.Probes {
		if p.Seen == rs.Nodes-1 {
			all = append(all, p.AllMs)
		} else {
			res.NotConverged++
		}
	}
	if len(all) > 0 {
		res.AllP50Ms, res.AllP99Ms, res.AllMaxMs = percentileMs(all, 50), percentileMs(all, 99), slices.Max(all)
	}
	if len(pooled) > 0 {
		res.TableP50Ms, res.TableP99Ms, res.TableMaxMs = percentileMs(pooled, 50), percentileMs(pooled, 99), slices.Max(pooled)
	}
	return res
}

// probe holds (or releases) the group on node i and times, on every other
// node, the first lookup that shows it.
func (rn *realNodes) probe(ctx context.Context, i int, hold bool, rs s7RealSetup) (probeResult, error) {
	n := rs.Nodes
	what := "release"
	if hold {
		what = "hold"
	}
	pr := probeResult{Node: rn.ids[i], Level: what}
	seen := make([]atomic.Int64, n) // ns after start; 0 not yet
	start := time.Now()
	if err := rn.hold(i, hold); err != nil {
		return pr, err
	}
	var wg sync.WaitGroup
	for j := range n {
		if j == i {
			continue
		}
		wg.Go(func() {
			var buf []byte
			for time.Since(start) < rs.ProbeLimit && ctx.Err() == nil {
				nodes, b, err := rn.lookup(j, buf)
				buf = b
				if err == nil && lists(nodes, rn.rpc[i]) != hold {
					seen[j].Store(max(int64(time.Since(start)), 1))
					return
				}
				time.Sleep(rs.Poll)
			}
		})
	}
	wg.Wait()
	var delays []float64
	for j := range n {
		if j == i {
			continue
		}
		d := seen[j].Load()
		if d == 0 {
			pr.DelaysMs = append(pr.DelaysMs, -1)
			continue
		}
		v := float64(d) / float64(time.Millisecond)
		pr.DelaysMs = append(pr.DelaysMs, v)
		delays = append(delays, v)
	}
	pr.Seen = len(delays)
	pr.P50Ms = percentileMs(delays, 50)
	if pr.Seen == n-1 {
		pr.AllMs = slices.Max(delays)
	}
	return pr, nil
}

func (g *realGossip) setupLine() string {
	s := g.Setup
	line := fmt.Sprintf("Real nodes: %d scdd processes on %s (network: %s; one address each, all of them in every all_node, no cluster_key, "+
		"the production timing), the group \"%s\" on each with no resident process. Quiet: %v. Then %d changes, one at a time: the group "+
		"held or released on a node drawn at random (POST /hold or /release on its control socket: an announce, as a level change is); "+
		"each other node is asked for a name lookup of the group over its RPC port every %v until its answer shows the change (a change "+
		"not seen after %v counts as not reached), so a time is late by up to the poll interval and a lookup's round trip. Announce "+
		"counters from each node's /status; CPU is the scdd processes'. Network bytes are lo's transmit counters on loopback (the "+
		"machine's, other tenants' included), the nodes' links into the bridge on the lab.", s.Nodes, s.Addrs, s.Network, s7Group, s.Quiet,
		s.Probes, s.Poll, s.ProbeLimit)
	return line
}

// write adds the real nodes' figures to S7's report.
func (g *realGossip) write(b *strings.Builder) {
	fmt.Fprintf(b, "## %d real scdd nodes (network: %s)\n\n", g.Setup.Nodes, g.Setup.Network)
	if g.Error != "" {
		fmt.Fprintf(b, "**Not measured or stopped early**: %s\n\n", oneLine(g.Error))
		if len(g.Probes) == 0 {
			return
		}
	}
	b.WriteString("| figure | value |\n|---|---:|\n")
	fmt.Fprintf(b, "| join: every node's lookup lists every node | %.1f s |\n", g.JoinSeconds)
	fmt.Fprintf(b, "| changes measured (not reaching every node) | %d (%d) |\n", len(g.Probes), g.NotConverged)
	fmt.Fprintf(b, "| until every other node holds a change: p50 / p99 / max | %.0f / %.0f / %.0f ms |\n", g.AllP50Ms, g.AllP99Ms, g.AllMaxMs)
	fmt.Fprintf(b, "| until one node holds it (pooled): p50 / p99 / max | %.0f / %.0f / %.0f ms |\n\n", g.TableP50Ms, g.TableP99Ms, g.TableMaxMs)
	b.WriteString("| phase | seconds | announces sent | announce bytes / node / s | announce messages / node / s | network bytes / node / s | " +
		"CPU (the scdd processes) | machine busy / steal |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, t := range []struct {
		name string
		t    traffic
	}{{"quiet (refresh only)", g.Quiet}, {"changes", g.Changes}} {
		fmt.Fprintf(b, "| %s | %.1f | %.0f | %.0f | %.2f | %.0f | %.2f cores | %.2f / %.2f cores |\n", t.name, t.t.Seconds, t.t.Announces,
			t.t.BytesPerNodeS, t.t.MessagesPerNodeS, t.t.LoopbackBytesPerNodeS, t.t.CPUCores, t.t.MachineCores, t.t.StealCores)
	}
	b.WriteString("\n")
}
