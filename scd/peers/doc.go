// Package peers is a node's connections to the other nodes of its cluster:
// ONE pool of netio.MuxConns, each opened with the peer hello (hello.go)
// that proves both ends know the cluster key, carrying both the calls this
// node transfers (Send) and the routing manager's requests (Request), and
// the node's side of the hello for the connections other nodes open to it
// (Acceptor).
//
// The pool keeps one peer per node. A peer sends to a target, an address
// of the node: its RPC port, or the port of the receiver group that takes
// a call's service group there (learned from a 'wrong receiver' answer or,
// with multi_schedule, asked first). A target has a queue and lanes; a
// lane is a goroutine with one connection, dialled when the first call
// comes and again after a failure. A target has one lane, or with
// multi_schedule one per receiving socket of the group there, each on
// another socket: the only case in which the pool keeps two connections
// to one node's address.
//
// # Contracts
//
//   - Every Call handed to the pool (Send returned netio.CodeOK) gets
//     exactly one outcome: its caller is answered (the node's answer under
//     the caller's id, 'timed out', 'network down'), or, when the call
//     certainly did not run on the node, it goes to the Delegate's
//     Reroute, which owns it from then on. A Request gets one answer too.
//   - One dial per lane: a target's lanes are started under its peer's
//     lock and each dials its own connection, so calls and requests that
//     come at once for a node never dial it twice.
//   - No connection is closed while calls wait on it, but for a failed one
//     (its calls are answered 'network down') and at Close: a connection
//     the other node asks to leave (go-away), and those of a peer replaced
//     because its node moved, are retired (netio.MuxConn.Retire): they take
//     no new call and close after their last answer.
//   - A node that leaves the tables (NodeLeft, from membership) takes its
//     peer with it: its queued calls go to Reroute (never sent), and a
//     call for it later gets a new peer and new connections. Its
//     connections over a silent link close at once, their calls answered
//     'network down' (they may have run there: never resent); the others
//     retire. Every peer connection has TCP keepalive and a
//     TCP_USER_TIMEOUT (DefaultUserTimeout, 5 s), so a link that falls
//     silent while its node stays in the tables fails its calls 'network
//     down' within that bound, not at their watch time (leave.go).
//   - Send never blocks (it runs on event loops): a full queue is
//     'server busy'. The Delegate is called without the pool's locks.
//
// # Usage
//
//	pool := peers.New(peers.Options{Self: "n0", Key: key, Log: log, Metrics: set})
//	pool.SetDelegate(router) // before the first Send: reroutes and multi_schedule
//	code, msg := pool.Send("n1", "10.0.0.2:7000", &peers.Call{Caller: conn, ...})
//	out, err := pool.Request(ctx, "n1", "10.0.0.2:7000", "wlm-start", "orders", nil, deadline)
//	pool.NodeLeft("n1") // membership found n1 dead or gone
//	pool.Expire(now) // on the node's expiry tick
//	pool.Close()     // at the node's end: every call waiting is answered
package peers
