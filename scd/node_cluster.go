package scd

import (
	"fmt"
	"net"
	"strconv"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/netio"
	"tpsched/netio/rpcport"
	"tpsched/scd/cluster"
	"tpsched/scd/def"
	"tpsched/scd/local"
	"tpsched/scd/names"
	"tpsched/scd/route"
)

// This file wires the node's part in the cluster (scd/cluster): the
// router, always made (it is the peer pool's Delegate), and in the node's
// line only when all_node names another node (inCluster).

// clusterKey is sysconf's cluster_key; nil for none.
func clusterKey(cfg *def.Config) []byte {
	if cfg.System.ClusterKey == "" {
		return nil
	}
	return []byte(cfg.System.ClusterKey)
}

// seeds are the name ports of the other nodes of all_node.
func seeds(cfg *def.Config) ([]string, error) {
	sys := cfg.System
	var seeds []string
	for _, a := range sys.AllNodes {
		host, port, err := def.SplitHostPort(a, sys.RPCPort)
		if err != nil {
			return nil, err
		}
		if sys.IsThisNode(host, port) {
			continue
		}
		seeds = append(seeds, net.JoinHostPort(host, strconv.Itoa(sys.NamePort)))
	}
	return seeds, nil
}

// prepareCluster makes the router when the node is made (it needs no
// I/O), so the node's lines are complete before the RPC port opens. The
// node is in a cluster when all_node names another node (or a test says
// so: a node in a cluster without membership); alone, the router is only
// the peer pool's delegate and shows nothing on /metrics.
func (n *Node) prepareCluster(inCluster bool) error {
	rule := route.OpenTP1 // alone, the router only reroutes what comes back
	if inCluster {
		var err error
		if rule, err = route.ParseRule(n.cfg.Sched.BalanceRule); err != nil {
			return fmt.Errorf("scdsvcdef: scd_balance_rule: %w", err)
		}
	}
	others, _ := seeds(n.cfg) // checked when the node was made
	opts := cluster.Options{
		// A test's node in a cluster without membership fills its table
		// itself: it joins nobody, and waits for no one.
		AwaitJoin:   inCluster && len(others) > 0,
		Self:        n.cfg.System.NodeID,
		Log:         n.log,
		Metrics:     metrics.NewSet(), // not exposed
		CounterFunc: func(string, func() uint64) {},
		Local:       clusterLocal{n.local},
		Pool:        n.pool,
		Policy: route.Policy{
			Rule:          rule,
			Announce:      n.cfg.Sched.AnnounceServerStatus,
			ThisNodeFirst: n.cfg.Sched.ThisNodeFirst,
			ScheduleRate:  n.cfg.Sched.ScheduleRate,
		},
		Retries:       n.cfg.Sched.RetryOfCommError,
		WatchTime:     n.cfg.System.WatchTime,
		MultiSchedule: n.cfg.Usrrc.MultiSchedule,
		Draining:      n.draining.Load,
	}
	if inCluster {
		opts.Metrics, opts.CounterFunc = n.metrics, n.scraped.counter
	}
	if n.cfg.Policy != nil {
		// The routing manager is made after the router, with its name table.
		opts.Steer = func(group string, cands []route.Candidate) []route.Candidate { return n.wlm.Steer(group, cands) }
	}
	n.router = cluster.New(opts)
	n.receivers = cluster.NewReceivers(n.cfg.System.NodeID, clusterLocal{n.local}, n.metrics)
	n.inCluster = inCluster
	return nil
}

// clusterLocal is the local scheduler as the cluster sees it.
type clusterLocal struct{ *local.Scheduler }

func (l clusterLocal) Group(name string) (cluster.Group, bool) {
	g, ok := l.Scheduler.Group(name)
	if !ok {
		return nil, false
	}
	return g, true
}

// joinCluster joins the other nodes of all_node, if it names any.
func (n *Node) joinCluster() error {
	seeds, _ := seeds(n.cfg)
	if len(seeds) == 0 {
		return nil // no other node to join (a test may put a node in a cluster without membership)
	}
	sys := n.cfg.System
	if clusterKey(n.cfg) == nil {
		n.log.Warn("no cluster_key in sysconf: announces and transferred calls from peers are trusted blindly")
	}
	// The name port bound before the UAPs started, or the old process's
	// on a restart (ports.go); Join binds it only when neither is.
	t := n.ports.names
	n.ports.names = nil
	return n.router.Join(names.GossipConfig{
		Self:      sys.NodeID,
		BindAddr:  sys.RPCAddress,
		Port:      sys.NamePort,
		Seeds:     seeds,
		Key:       clusterKey(n.cfg),
		Fast:      n.opts.FastFailureDetection,
		Detector:  n.opts.Detector,
		Logger:    n.log,
		OnChange:  n.namesChanged,
		Transport: t,
	}, n.localInfo)
}

// localInfo is what this node announces: its groups, their levels (LEVEL0
// with scd_announce_server_status=N) and whether they are held.
func (n *Node) localInfo() names.NodeInfo {
	info := names.NodeInfo{Addr: n.advertisedRPC(), Announce: n.cfg.Sched.AnnounceServerStatus}
	for _, g := range n.local.Groups() { // sorted by name, as names wants
		if !g.Serving() {
			continue // no server here (an application environment, wlm_env.go)
		}
		gi := names.GroupInfo{Group: g.Name(), Held: g.Held(), Socket: g.Def().ReceiveFrom == def.ReceiveSocket}
		if info.Announce {
			gi.Level = g.Level()
		}
		if n.wlm != nil {
			gi.PI = n.wlm.GroupPI(g.Name())
		}
		info.Groups = append(info.Groups, gi)
	}
	if n.wlm != nil {
		info.WLM = n.wlm.Announced()
	}
	return info
}

// advertisedRPC is the RPC address other nodes send to.
func (n *Node) advertisedRPC() string { return cluster.AdvertisedAddr(n.rpc, n.cfg.System.NodeID) }

// announce tells the other nodes this node's state now. localInfo runs
// under the gossip's announce lock: built before it, a hold and a level
// change announced at once could go out newest first, and the older state,
// numbered last, overwrite the hold everywhere.
func (n *Node) announce() { n.router.Announce(n.localInfo) }

// answerLookup tells a balancing client which nodes run a group, with
// their levels: the cluster's name table, or this node alone.
func (n *Node) answerLookup(c *rpcport.Conn, f *netio.Frame) {
	if n.inCluster {
		n.router.AnswerLookup(c, f)
		return
	}
	cluster.AnswerLookupAlone(c, f, clusterLocal{n.local}, n.cfg.System.NodeID)
}

// ClusterStatus is the inter-node part of Status (scd/cluster).
type (
	ClusterStatus = cluster.Status
	NodeStatus    = cluster.NodeStatus
	NodeGroup     = cluster.NodeGroup
)
