// Package wlmnode is the routing manager (source document 004) on one
// node: the service policy in force, the classes and their figures, CPU
// weights, steering, the application environments (calls parked until a
// server is ready, find server, the deciding node, this node's server of
// each), the requests between nodes, the cluster-wide actions (quiesce,
// resume, refresh, policy), the report, and subsystem instances (a server
// of each environment per instance, instances.go). The decisions
// themselves are scd/wlm's pure logic; this package measures, asks and
// acts.
//
// It reaches its node only through Options (Local, Peers, the name table,
// Announce); its stage never blocks, and every goroutine it starts ends
// when Close cancels its context.
package wlmnode
