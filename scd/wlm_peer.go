package scd

// This file carries the routing manager's requests between nodes: "decide
// a start" to the deciding node, "start a server" to the node it chose,
// "quiesce", "resume", "refresh" and "read the policy again" to every
// node. Each is a name lookup (KindNameLookup) whose service names the
// request, sent with the hop mark on a connection opened with the peer
// hello (scd/peers), so a node takes them only from nodes that proved the
// cluster key; the answer is a reply, or an error frame with a code. They
// go on the node's one pool of connections to the other nodes
// (peers.Pool.Request).

// The requests, as the lookup's service.
const (
	wlmDecide  = "wlm-decide"  // group: the environment; payload: the purpose; answer: a lookup answer
	wlmStart   = "wlm-start"   // group: the environment; answer when its server is ready
	wlmQuiesce = "wlm-quiesce" // group: the environment; payload: the epoch; answer when its server stopped
	wlmResume  = "wlm-resume"  // group: the environment; payload: the epoch
	wlmRefresh = "wlm-refresh" // group: the environment; answer when its processes were replaced
	wlmPolicy  = "wlm-policy"  // no group; answer when the node read svcpolicy again
)

// wlmRequests are the above, each a lookup's service.
var wlmRequests = []string{wlmDecide, wlmStart, wlmQuiesce, wlmResume, wlmRefresh, wlmPolicy}
