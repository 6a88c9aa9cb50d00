// Package cluster is the node's part in its cluster: the name table of
// which node serves which group at which load level (kept by gossip,
// scd/names), the choice for each call between this node and the others
// (scd/route) and its transfer over the node's peer pool (scd/peers), and
// receiver groups (OpenTP1's grouped multi-scheduler daemons). It sees the
// node's own groups only through the Local interface.
//
// Two stages of the node's line (package call) are here: Receivers, which
// refuses a call that came on the wrong receiver group, and Router, which
// sends a call to another node when the node choice says so. Router is
// also the peer pool's Delegate (Reroute, MultiSchedule) and answers the
// name lookups of balancing clients (AnswerLookup).
//
// # Contracts
//
//   - Route, AnswerLookup and Receivers' methods run on gnet event loops:
//     they never block. A call Route transfers has been copied; it is
//     answered by the peer pool or, when no node takes it, by Reroute. A
//     node that joins others keeps, copied, a call or a lookup for a
//     group no known node runs until its table settles (settle.go).
//   - Local's methods are called on event loops and the pool's lanes:
//     they must not block.
//   - The name table is read without locks (scd/names); a node that is
//     not a member yet, or left, is simply not in it.
//   - Join, Announce and the leaving methods are for the node's start and
//     end; before Join (and for a node whose all_node names no other) they
//     do nothing.
//
// # Usage
//
//	r := cluster.New(cluster.Options{Self: "n0", Local: sched, Pool: pool, Policy: policy, ...})
//	line := call.Line{..., r, sched}          // r is a stage
//	err := r.Join(gossipConfig, localInfo)    // once the RPC port serves
//	r.Announce(localInfo)                     // when a level or a hold changes
//	r.LeaveAndWait(ctx)                       // drain: the others stop sending first
package cluster
