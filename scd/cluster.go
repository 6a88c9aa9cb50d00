package scd

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/netio"
	"tpsched/netio/rpcport"
	"tpsched/scd/def"
	"tpsched/scd/names"
	"tpsched/scd/route"
)

// This file is the node's part in inter-node load balancing: it announces
// its groups through names.Cluster, keeps the name table, and decides for
// each call whether it is served here or transferred (route), then hands
// transfers to the forwarder. A node without all_node has none of it.

// cluster is the inter-node state of a node that has peers.
type cluster struct {
	self  string
	names *names.Table
	// gossip is set once the node has joined; the RPC port, the control
	// endpoint and the load checks already run by then.
	gossip atomic.Pointer[names.Cluster]
	fwd    *forwarder
	policy route.Policy

	candPool sync.Pool // *[]route.Candidate, one per call being routed
	leave    sync.Once

	// lastReceived is when (unix ns) the last transferred call came in: a
	// leaving node serves until the others have stopped sending.
	lastReceived atomic.Int64

	mu       sync.Mutex
	received map[string]*metrics.Counter // by member node a call was transferred from
	// receivedOther counts transferred calls from a node that is not a
	// member of the name table: no name becomes a label value unless the
	// node has proved it (hello) and is known (announced).
	receivedOther *metrics.Counter
	// retried counts calls sent on to another node, by why.
	retriedUnreachable, retriedRefused *metrics.Counter
}

// globalRand is math/rand/v2's goroutine-safe source as a route.Rand.
type globalRand struct{}

func (globalRand) IntN(n int) int { return rand.IntN(n) }

func (n *Node) clusterKey() []byte {
	if n.cfg.System.ClusterKey == "" {
		return nil
	}
	return []byte(n.cfg.System.ClusterKey)
}

// seeds are the name ports of the other nodes of all_node.
func (n *Node) seeds() ([]string, error) {
	sys := n.cfg.System
	var seeds []string
	for _, a := range sys.AllNodes {
		host, port, err := def.SplitHostPort(a, sys.RPCPort)
		if err != nil {
			return nil, err
		}
		if host == sys.RPCAddress && port == sys.RPCPort {
			continue // this node
		}
		seeds = append(seeds, net.JoinHostPort(host, strconv.Itoa(sys.NamePort)))
	}
	return seeds, nil
}

// prepareCluster sets up the inter-node state, if all_node names another
// node, before the RPC port opens: every frame read looks at n.cluster,
// which is then never written again.
func (n *Node) prepareCluster() error {
	seeds, err := n.seeds()
	if err != nil || len(seeds) == 0 {
		return err // all_node names no other node: nothing to balance over
	}
	rule, err := route.ParseRule(n.cfg.Sched.BalanceRule)
	if err != nil {
		return fmt.Errorf("scdsvcdef: scd_balance_rule: %w", err)
	}
	n.cluster = n.newCluster(rule)
	return nil
}

// joinCluster joins the other nodes of all_node, if it names any.
func (n *Node) joinCluster() error {
	cl := n.cluster
	seeds, _ := n.seeds()
	if cl == nil || len(seeds) == 0 {
		return nil // no other node to join (a test may make inter-node state without membership)
	}
	sys := n.cfg.System
	if n.clusterKey() == nil {
		n.log.Warn("no cluster_key in sysconf: announces and transferred calls from peers are trusted blindly")
	}
	// The name port bound before the UAPs started (bindPorts), else the
	// old process's on a restart; Join binds it only when neither is.
	t := n.namesBound
	n.namesBound = nil
	if inh := n.restart.inheritNames; inh != nil {
		n.restart.inheritNames = nil
		if t == nil {
			t = inh
		} else {
			inh.Close()
		}
	}
	g, err := names.Join(names.ClusterConfig{
		Self:      sys.NodeID,
		BindAddr:  sys.RPCAddress,
		Port:      sys.NamePort,
		Seeds:     seeds,
		Key:       n.clusterKey(),
		Fast:      n.opts.FastFailureDetection,
		Logger:    n.log,
		OnChange:  n.namesChanged,
		Transport: t,
	}, cl.names, n.localInfo())
	if err != nil {
		return err
	}
	cl.gossip.Store(g)
	n.registerClusterMetrics()
	n.log.Info("cluster joined", "name_port", g.Port(), "seeds", seeds, "rule", cl.policy.Rule.String(),
		"announce", cl.policy.Announce, "this_node_first", cl.policy.ThisNodeFirst)
	return nil
}

// newCluster is the inter-node state of this node before it joins.
func (n *Node) newCluster(rule route.Rule) *cluster {
	sys := n.cfg.System
	cl := &cluster{
		self:  sys.NodeID,
		names: names.NewTable(sys.NodeID),
		fwd:   newForwarder(sys.NodeID, n.clusterKey(), n.log, n.metrics),
		policy: route.Policy{
			Rule:          rule,
			Announce:      n.cfg.Sched.AnnounceServerStatus,
			ThisNodeFirst: n.cfg.Sched.ThisNodeFirst,
			ScheduleRate:  n.cfg.Sched.ScheduleRate,
		},
		received:           map[string]*metrics.Counter{},
		receivedOther:      n.metrics.NewCounter(`tpsched_requests_received_total{from="unknown"}`),
		retriedUnreachable: n.metrics.NewCounter(`tpsched_transfer_retries_total{reason="unreachable"}`),
		retriedRefused:     n.metrics.NewCounter(`tpsched_transfer_retries_total{reason="refused"}`),
	}
	cl.candPool.New = func() any { s := make([]route.Candidate, 0, 8); return &s }
	cl.fwd.reroute = n.reroute
	cl.fwd.multi = n.multiSchedule
	return cl
}

// localInfo is what this node announces: its groups, their levels (LEVEL0
// with scd_announce_server_status=N) and whether they are held.
func (n *Node) localInfo() names.NodeInfo {
	info := names.NodeInfo{Addr: n.advertisedRPC(), Announce: n.cfg.Sched.AnnounceServerStatus}
	for _, g := range n.order { // sorted by name, as names wants
		if !g.servable() {
			continue // no server here (an application environment, wlm_env.go)
		}
		gi := names.GroupInfo{Group: g.name, Held: g.held.Load(), Socket: g.def.ReceiveFrom == def.ReceiveSocket}
		if info.Announce {
			gi.Level = g.level()
		}
		if n.wlm != nil {
			gi.PI = n.wlm.groupPI(g.name)
		}
		info.Groups = append(info.Groups, gi)
	}
	if n.wlm != nil {
		info.WLM = n.wlm.announced()
	}
	return info
}

// advertisedRPC is the RPC address other nodes send to.
func (n *Node) advertisedRPC() string { return n.advertisedAddr(n.rpc) }

// advertisedAddr is advertisedRPC for port p: a frame's handler passes its
// connection's port, since frames are served before n.rpc is set.
func (n *Node) advertisedAddr(p *rpcport.Port) string {
	if p == nil {
		return ""
	}
	host, port, _ := net.SplitHostPort(p.Addr())
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = n.cfg.System.NodeID // listening everywhere: the node id is the best name we have
	}
	return net.JoinHostPort(host, port)
}

// leaveCluster tells the other nodes this node is going, once.
func (n *Node) leaveCluster() {
	if n.cluster == nil || n.cluster.gossip.Load() == nil {
		return
	}
	n.cluster.leave.Do(func() {
		if err := n.cluster.gossip.Load().Leave(time.Second); err != nil {
			n.log.Warn("leaving the cluster", "err", err)
		}
	})
}

// A stopping node leaves the cluster before it refuses anything: it leaves
// (memberlist tells the others, which drop it from their name tables) and
// serves on until no transferred call has come for leaveQuiet, at most
// leaveGrace, so calls the others sent before they knew are served, not
// refused. A call that still meets the refusal is sent on by the node that
// transferred it (refusedBeforeRunning).
const (
	leaveQuiet = 300 * time.Millisecond
	leaveGrace = 5 * time.Second
)

// leaveBeforeDrain takes this node out of the cluster while it still
// serves, and returns once the others have stopped sending to it.
func (n *Node) leaveBeforeDrain(ctx context.Context) {
	if n.cluster == nil || n.cluster.gossip.Load() == nil {
		return
	}
	start := time.Now()
	n.log.Info("leaving the cluster; serving until the other nodes stop sending here")
	n.leaveCluster()
	left := time.Now().UnixNano()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		now := time.Now()
		quietSince := time.Unix(0, max(left, n.cluster.lastReceived.Load()))
		if now.Sub(quietSince) >= leaveQuiet {
			n.log.Info("left the cluster", "took", now.Sub(start).Round(time.Millisecond))
			return
		}
		if now.Sub(start) >= leaveGrace {
			n.log.Warn("other nodes still send calls here after leaving; draining all the same",
				"waited", now.Sub(start).Round(time.Millisecond))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// transfersInFlight is the calls this node has handed to other nodes and
// not yet answered.
func (n *Node) transfersInFlight() int {
	if n.cluster == nil {
		return 0
	}
	return n.cluster.fwd.totalInFlight()
}

// announce tells the other nodes this node's state now.
func (n *Node) announce() {
	if n.cluster == nil {
		return
	}
	if g := n.cluster.gossip.Load(); g != nil {
		g.Announce(n.localInfo())
	}
}

// candidates appends the nodes that can take a call for group: the others
// that run it and are not held, and this node when local says so.
func (cl *cluster) candidates(dst []route.Candidate, group string, local *group, tried []string) []route.Candidate {
	for _, e := range cl.names.Lookup(group) {
		if e.Local || e.Held || contains(tried, e.Node) {
			continue
		}
		dst = append(dst, route.Candidate{Node: e.Node, Level: e.Level, InFlight: cl.fwd.inFlight(e.Node)})
	}
	if local != nil && !local.held.Load() && local.servable() && !contains(tried, cl.self) {
		dst = append(dst, route.Candidate{Node: cl.self, Local: true, Level: local.level(), InFlight: local.inFlight()})
	}
	return dst
}

// socketGroup reports whether group receives from a socket (routed at
// random, no status check): as defined here, or as its nodes announce.
func (cl *cluster) socketGroup(group string, local *group) bool {
	if local != nil {
		return local.def.ReceiveFrom == def.ReceiveSocket
	}
	entries := cl.names.Lookup(group)
	return len(entries) > 0 && entries[0].Socket
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// routeCall decides whether a call is served here; from is the node that
// transferred it (nil: a caller's own). It returns handled =
// true when the call was transferred (or refused on the way); otherwise
// the caller serves it locally, or refuses it as the local rules say.
func (n *Node) routeCall(c caller, from *peerHello, f *netio.Frame, g *group) (handled bool, code netio.Code, msg string) {
	cl := n.cluster
	if from != nil {
		cl.countReceived(from, n.metrics)
		return false, 0, "" // the hop mark: served here or refused, never transferred again
	}
	if f.Flags&netio.FlagDestination != 0 {
		return false, 0, "" // the caller named this node: served here or refused
	}
	group := string(f.Group)
	socket := cl.socketGroup(group, g)
	buf := cl.candPool.Get().(*[]route.Candidate)
	defer cl.candPool.Put(buf)
	var cands []route.Candidate
	balanced := g != nil && f.Flags&netio.FlagBalanced != 0
	if balanced {
		// The sender chose this node: stay unless held, or LEVEL2 while
		// another node is lower.
		cands = cl.candidates((*buf)[:0], group, nil, nil)
		if !route.Transfer(g.held.Load(), g.level(), cands, cl.policy) {
			return false, 0, ""
		}
	} else {
		cands = cl.candidates((*buf)[:0], group, g, nil)
	}
	if n.wlm != nil {
		cands = n.wlm.steer(group, cands)
	}
	*buf = cands
	// schedule_rate is for scheduler-direct calls, not for a balanced one
	// that must move on.
	i := route.Choose(cands, cl.policy, route.Request{Direct: !balanced, Socket: socket}, globalRand{})
	if i < 0 || cands[i].Local {
		return false, 0, ""
	}
	entries := cl.names.Lookup(group)
	fc := &fwdCall{
		caller: c, callerID: f.ID, kind: f.Kind,
		group: group, service: string(f.Service), payload: append([]byte(nil), f.Payload...),
		timeoutMs: f.TimeoutMs, start: time.Now(),
		retries: route.Retries(n.cfg.Sched.RetryOfCommError, len(entries)),
	}
	if f.TimeoutMs > 0 {
		fc.deadline = fc.start.Add(time.Duration(f.TimeoutMs) * time.Millisecond)
	} else if g != nil && g.watch > 0 {
		fc.deadline = fc.start.Add(g.watch)
	} else if w := n.cfg.System.WatchTime; w > 0 {
		fc.deadline = fc.start.Add(w)
	}
	return n.transfer(fc, cands[i].Node)
}

// answerLookup tells a balancing client which nodes run a group, with
// their levels: the cluster's table, or this node alone.
func (n *Node) answerLookup(c *rpcport.Conn, f *netio.Frame) {
	if string(f.Service) == netio.LookupReceivers {
		n.answerReceivers(c, f)
		return
	}
	if n.wlm != nil && string(f.Service) == netio.LookupFind {
		n.wlm.envs.answerFind(c, f)
		return
	}
	if n.wlm != nil && isWLMRequest(f.Service) {
		n.wlm.envs.serveRequest(c, f)
		return
	}
	group := string(f.Group)
	var nodes []netio.NodeLevel
	if n.cluster != nil {
		for _, e := range n.cluster.names.Lookup(group) {
			if !e.Held {
				nodes = append(nodes, netio.NodeLevel{Addr: e.Addr, Level: uint8(e.Level)})
			}
		}
	} else if g := n.groups[group]; g != nil && !g.held.Load() && g.servable() {
		nodes = append(nodes, netio.NodeLevel{Addr: n.advertisedAddr(c.Port()), Level: uint8(g.level())})
	}
	if len(nodes) == 0 {
		c.SendNow(netio.AppendError(nil, f.ID, netio.CodeNoSuchGroup, group+": no node serves it now"))
		return
	}
	out := netio.AppendFrame(nil, netio.Header{Kind: netio.KindReply, ID: f.ID}, "", "", netio.AppendLookupAnswer(nil, nodes))
	c.SendNow(out)
}

// transfer hands fc to node.
func (n *Node) transfer(fc *fwdCall, node string) (bool, netio.Code, string) {
	info, ok := n.cluster.names.Get(node)
	if !ok {
		// The node left between the choice and now; the call has not left
		// this node, so it is chosen for again, free of the retry budget.
		fc.tried = append(fc.tried, node)
		fc.retries++
		n.reroute(fc, fmt.Errorf("node %s left: %w", node, errCommunication))
		return true, netio.CodeOK, ""
	}
	fc.tried = append(fc.tried, node)
	code, msg := n.cluster.fwd.send(node, info.Addr, fc)
	return true, code, msg
}

// reroute is the forwarder's way back after a node could not be reached,
// or refused a call before running it: up to scd_retry_of_comm_error other
// nodes, this one included, are tried. When none is left the caller gets
// the refusal, or 'network down'.
func (n *Node) reroute(fc *fwdCall, err error) {
	if fc.retries <= 0 || n.draining.Load() {
		answerUnsent(fc, err, "")
		return
	}
	g := n.groups[fc.group]
	cands := n.cluster.candidates(nil, fc.group, g, fc.tried)
	i := route.Choose(cands, n.cluster.policy, route.Request{Direct: true, Retry: true,
		Socket: n.cluster.socketGroup(fc.group, g)}, globalRand{})
	if i < 0 {
		answerUnsent(fc, err, "; no other node runs "+fc.group)
		return
	}
	fc.retries--
	if errors.As(err, new(*refusal)) {
		n.cluster.retriedRefused.Inc()
	} else {
		n.cluster.retriedUnreachable.Inc()
	}
	if cands[i].Local {
		f := netio.Frame{
			Header:  netio.Header{Kind: fc.kind, ID: fc.callerID, TimeoutMs: fc.timeoutMs},
			Group:   []byte(fc.group),
			Service: []byte(fc.service),
			Payload: fc.payload,
		}
		if code, msg := n.serveLocal(fc.caller, &f, g); code != netio.CodeOK {
			answerErr(fc, code, msg)
		}
		return
	}
	if _, code, msg := n.transfer(fc, cands[i].Node); code != netio.CodeOK {
		answerErr(fc, code, msg)
	}
}

// countReceived counts a call transferred here by the node of hello h: under
// its name once it is a member of the name table, else under "unknown".
// The counter is kept on the connection, so the table is asked only until
// the node is known.
func (cl *cluster) countReceived(h *peerHello, set *metrics.Set) {
	cl.lastReceived.Store(time.Now().UnixNano())
	if h.received == nil {
		if _, member := cl.names.Get(h.dialer); !member || h.dialer == cl.self {
			cl.receivedOther.Inc()
			return
		}
		cl.mu.Lock()
		c := cl.received[h.dialer]
		if c == nil {
			c = set.GetOrCreateCounter(fmt.Sprintf(`tpsched_requests_received_total{from=%q}`, h.dialer))
			cl.received[h.dialer] = c
		}
		cl.mu.Unlock()
		h.received = c
	}
	h.received.Inc()
}

func (n *Node) registerClusterMetrics() {
	g := n.cluster.gossip.Load()
	n.metrics.NewGauge(`tpsched_cluster_members`, func() float64 { return float64(g.Stats().Members) })
	n.metrics.NewGauge(`tpsched_cluster_nodes_known`, func() float64 { return float64(n.cluster.names.Len()) })
	n.counterFunc(`tpsched_announces_sent_total`, func() uint64 { return g.Stats().Sent })
	n.counterFunc(`tpsched_announces_received_total`, func() uint64 { return g.Stats().Received })
	n.counterFunc(`tpsched_announce_bytes_sent_total`, func() uint64 { return g.Stats().BytesSent })
	for _, reason := range []string{names.DropAuth, names.DropMalformed, names.DropFull, names.DropInvalid} {
		n.counterFunc(fmt.Sprintf(`tpsched_announces_dropped_total{reason=%q}`, reason), func() uint64 {
			return g.Stats().Dropped[reason]
		})
	}
}

// NodeStatus is one node of the cluster as this node sees it.
type NodeStatus struct {
	Node      string      `json:"node"`
	Addr      string      `json:"addr"`
	Local     bool        `json:"local,omitempty"`
	Announces bool        `json:"announces_load"`
	Groups    []NodeGroup `json:"groups"`
	SentTo    uint64      `json:"calls_sent_to"`       // calls this node transferred there
	Received  uint64      `json:"calls_received_from"` // calls transferred here from there
	InFlight  int         `json:"in_flight_to"`
}

// NodeGroup is a group on a node, as announced.
type NodeGroup struct {
	Group string `json:"group"`
	Level string `json:"level"`
	Held  bool   `json:"held,omitempty"`
}

// ClusterStatus is the inter-node part of Status.
type ClusterStatus struct {
	Rule          string             `json:"balance_rule"`
	Announce      bool               `json:"announce_server_status"`
	ThisNodeFirst bool               `json:"this_node_first"`
	Gossip        names.ClusterStats `json:"gossip"`
	Nodes         []NodeStatus       `json:"nodes"`
}

func (n *Node) clusterStatus() *ClusterStatus {
	cl := n.cluster
	if cl == nil {
		return nil
	}
	st := &ClusterStatus{Rule: cl.policy.Rule.String(), Announce: cl.policy.Announce,
		ThisNodeFirst: cl.policy.ThisNodeFirst}
	if g := cl.gossip.Load(); g != nil {
		st.Gossip = g.Stats()
	}
	for _, info := range cl.names.Nodes() {
		ns := NodeStatus{Node: info.Node, Addr: info.Addr, Local: info.Node == n.cfg.System.NodeID, Announces: info.Announce}
		for _, gi := range info.Groups {
			ns.Groups = append(ns.Groups, NodeGroup{Group: gi.Group, Level: gi.Level.String(), Held: gi.Held})
		}
		if !ns.Local {
			ns.SentTo = n.metrics.GetOrCreateCounter(fmt.Sprintf(`tpsched_forwarded_total{to=%q}`, info.Node)).Get()
		}
		cl.mu.Lock()
		if c := cl.received[info.Node]; c != nil {
			ns.Received = c.Get()
		}
		cl.mu.Unlock()
		ns.InFlight = cl.fwd.inFlight(info.Node)
		st.Nodes = append(st.Nodes, ns)
	}
	return st
}
