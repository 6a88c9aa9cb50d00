package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/scd/names"
)

// This file is the node's membership: joining the other nodes (gossip),
// announcing its groups, and leaving; and what status shows of the
// cluster.

// Join joins the other nodes (cfg.Seeds) with state's as this node's first
// announce; the name table is the router's, and /metrics gets the
// gossip's series. state also builds the periodic refresh (cfg.State).
func (r *Router) Join(cfg names.GossipConfig, state func() names.NodeInfo) error {
	// A node out of the tables keeps no peer connection: calls queued for
	// it go elsewhere, and when it comes back it gets new connections,
	// not one from before a cut that waits on TCP's backoff.
	onLeave := cfg.OnLeave
	cfg.OnLeave = func(node string) {
		r.pool.NodeLeft(node)
		if onLeave != nil {
			onLeave(node)
		}
	}
	cfg.State = state
	g, err := names.Join(cfg, r.names, state())
	if err != nil {
		r.parking.settle() // the waiting calls meet the table as it is
		return err
	}
	r.gossip.Store(g)
	if r.parking != nil {
		go func() {
			start, by := time.Now(), "every seed asked"
			select {
			case <-g.Joined():
			case <-time.After(settleBound):
				by = "the bound: a seed has not answered yet"
			case <-r.parking.settled:
				return // the node left first
			}
			r.parking.settle()
			r.log.Info("name table settled", "by", by, "after", time.Since(start).Round(time.Millisecond),
				"nodes", r.names.Len(), "calls_waited", r.parking.waited())
		}()
	}
	// A change made while Join ran announced nothing (no gossip yet):
	// this one carries it.
	g.AnnounceFunc(state)
	r.registerMetrics(g)
	r.log.Info("cluster joined", "name_port", g.Port(), "seeds", cfg.Seeds, "rule", r.policy.Rule.String(),
		"announce", r.policy.Announce, "this_node_first", r.policy.ThisNodeFirst)
	return nil
}

func (r *Router) registerMetrics(g *names.Gossip) {
	set, counter := r.opts.Metrics, r.opts.CounterFunc
	set.NewGauge(`tpsched_cluster_members`, func() float64 { return float64(g.Stats().Members) })
	set.NewGauge(`tpsched_cluster_nodes_known`, func() float64 { return float64(r.names.Len()) })
	counter(`tpsched_announces_sent_total`, func() uint64 { return g.Stats().Sent })
	counter(`tpsched_announces_received_total`, func() uint64 { return g.Stats().Received })
	counter(`tpsched_announce_bytes_sent_total`, func() uint64 { return g.Stats().BytesSent })
	for _, reason := range []string{names.DropAuth, names.DropMalformed, names.DropFull, names.DropInvalid} {
		counter(fmt.Sprintf(`tpsched_announces_dropped_total{reason=%q}`, reason), func() uint64 {
			return g.Stats().Dropped[reason]
		})
	}
}

// Announce tells the other nodes this node's state now, as state builds
// it under the lock that numbers announces (names.Gossip.AnnounceFunc), so
// of two announces at once the newer state goes out last; nothing before
// Join.
func (r *Router) Announce(state func() names.NodeInfo) {
	if g := r.gossip.Load(); g != nil {
		g.AnnounceFunc(state)
	}
}

// Leave tells the other nodes this node is going, once; before Join it
// only places the calls still waiting for the table (settle.go).
func (r *Router) Leave() {
	r.parking.stop() // the calls still waiting are placed now, on what the table holds (settle.go: cutShort)
	g := r.gossip.Load()
	if g == nil {
		return
	}
	r.leave.Do(func() {
		if err := g.Leave(time.Second); err != nil {
			r.log.Warn("leaving the cluster", "err", err)
		}
	})
}

// StopWithoutLeaving ends this node's membership without telling the
// others it leaves: they keep sending to its address, where a new process
// (a restart) accepts and soon announces with a newer boot. Once; before
// Join it only places the calls still waiting for the table.
func (r *Router) StopWithoutLeaving() {
	r.parking.stop() // the calls still waiting are placed now, on what the table holds (settle.go: cutShort)
	g := r.gossip.Load()
	if g == nil {
		return
	}
	r.leave.Do(func() {
		if err := g.Stop(); err != nil {
			r.log.Warn("restart: stopping the cluster membership", "err", err)
		}
	})
}

// A stopping node leaves the cluster before it refuses anything: it leaves
// (memberlist tells the others, which drop it from their name tables) and
// serves on until no transferred call has come for leaveQuiet, at most
// leaveGrace, so calls the others sent before they knew are served, not
// refused. A call that still meets the refusal is sent on by the node that
// transferred it (peers.RefusedBeforeRunning).
const (
	leaveQuiet = 300 * time.Millisecond
	leaveGrace = 5 * time.Second
)

// LeaveGrace is the longest LeaveAndWait waits once it has left, so that
// scdd can tell the operator how long a drain may take.
const LeaveGrace = leaveGrace

// LeaveAndWait takes this node out of the cluster while it still serves,
// and returns once the others have stopped sending to it (or ctx ends);
// at once before Join.
func (r *Router) LeaveAndWait(ctx context.Context) {
	if r.gossip.Load() == nil {
		return
	}
	start := time.Now()
	r.log.Info("leaving the cluster; serving until the other nodes stop sending here")
	r.Leave()
	left := time.Now().UnixNano()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		now := time.Now()
		quietSince := time.Unix(0, max(left, r.lastReceived.Load()))
		if now.Sub(quietSince) >= leaveQuiet {
			r.log.Info("left the cluster", "took", now.Sub(start).Round(time.Millisecond))
			return
		}
		if now.Sub(start) >= leaveGrace {
			r.log.Warn("other nodes still send calls here after leaving; draining all the same",
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

// Status is the inter-node part of the node's status.
type Status struct {
	Rule          string            `json:"balance_rule"`
	Announce      bool              `json:"announce_server_status"`
	ThisNodeFirst bool              `json:"this_node_first"`
	Gossip        names.GossipStats `json:"gossip"`
	Nodes         []NodeStatus      `json:"nodes"`
}

// Status is what this node knows of the cluster now.
func (r *Router) Status() *Status {
	st := &Status{Rule: r.policy.Rule.String(), Announce: r.policy.Announce, ThisNodeFirst: r.policy.ThisNodeFirst}
	if g := r.gossip.Load(); g != nil {
		st.Gossip = g.Stats()
	}
	for _, info := range r.names.Nodes() {
		ns := NodeStatus{Node: info.Node, Addr: info.Addr, Local: info.Node == r.self, Announces: info.Announce}
		for _, gi := range info.Groups {
			ns.Groups = append(ns.Groups, NodeGroup{Group: gi.Group, Level: gi.Level.String(), Held: gi.Held})
		}
		if !ns.Local {
			ns.SentTo = r.opts.Metrics.GetOrCreateCounter(fmt.Sprintf(`tpsched_forwarded_total{to=%q}`, info.Node)).Get()
		}
		if c, ok := r.received.Load(info.Node); ok {
			ns.Received = c.(*metrics.Counter).Get()
		}
		ns.InFlight = r.pool.InFlight(info.Node)
		st.Nodes = append(st.Nodes, ns)
	}
	return st
}

// NamePort is the gossip's sockets, for a process that takes the node over
// (names.Transport.Files); nil before Join.
func (r *Router) NamePort() *names.Transport {
	if g := r.gossip.Load(); g != nil {
		return g.Transport()
	}
	return nil
}
