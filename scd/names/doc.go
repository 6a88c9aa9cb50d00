// Package names owns tpsched's name information: which node of the cluster
// runs which service group, at what load level, whether the group is held,
// whether it receives from a socket, and the address to send it requests.
// It owns three things: the Table a node keeps of every node's announce,
// the announce message (Codec) that carries one node's NodeInfo to the
// others, and the Gossip that carries it (gossip.go): membership through
// memberlist, the finger relay that takes a change to every member in
// log2 n hops at ceil(log2 n) messages per member, the periodic refresh.
//
// The Table and the Codec do no I/O and keep no clock and no goroutines:
// they only order, store, encode and check. The node decides when to
// announce. Nothing here chooses a node for a request: that is scd/route,
// which reads Lookup.
//
// # Ordering
//
// Every announce carries the sender's incarnation (Boot, its start time in
// nanoseconds) and a sequence number within it. The Table keeps, per node,
// the announce with the highest (Boot, Seq); anything older or equal is
// ignored, so gossip may deliver duplicates and reorder freely. A restarted
// node has a higher Boot and wins even though its Seq starts again from 0.
// One whose clock was set back between its starts has a lower Boot than
// the incarnation the others remember: it learns that one's announce (from
// a push/pull, or from a node that ignored its own as older and sends it
// the newer one it holds, at most once a second) and moves its Boot past
// it, as memberlist's incarnation numbers refute a suspicion.
//
// Remove forgets a node entirely, its (Boot, Seq) included: an old announce
// that arrives after Remove adds the node back. Apply announces only from
// nodes membership lists as alive, and never one that claims this node's own
// id (two nodes configured with one node_id would overwrite each other).
//
// # Limits
//
// A cluster has at most MaxNodes (128) nodes, this one included, as in
// OpenTP1; Apply refuses a node beyond that with ErrFull and leaves the table
// as it was. A node id is 1 to 255 bytes, an address at most 255, a service
// group name 1 to 255; a node announces at most 4096 groups, sorted by name,
// each once. Apply and Decode enforce the same rules, so every NodeInfo that
// Decode returns is one Apply accepts.
//
// # The announce message
//
// Big-endian, uvarints as in encoding/binary, strings as a uvarint length
// then the bytes:
//
//	size    field
//	1       version   1
//	1       flags     bit 0: tagged; bit 1: the routing manager's part
//	                  (wlm.go) follows the groups; other bits 0
//	32      tag       only when tagged: HMAC-SHA256 over the version, the
//	                  flags and the body, that is every byte but the tag
//	body:
//	string  node      node_id
//	string  addr      host:port of the node's RPC port
//	8       boot      incarnation, start time in ns
//	uvarint seq       announce sequence within the incarnation
//	1       node bits bit 0: announce (scd_announce_server_status=Y)
//	uvarint count     number of groups
//	count times:
//	string  group     service group name, strictly increasing
//	1       state     bits 0-1: load level (0..2), bit 2: held,
//	                  bit 3: socket (receive_from=socket); other bits 0
//	then, with flags bit 1, what a node with a service policy adds: each
//	group's performance index, its spare CPU by importance, and the
//	application environments it can serve with their high-water marks
//	(wlm.go draws it).
//
// Decode accepts exactly what Encode writes: a second encoding of one
// NodeInfo (an overlong uvarint, a level sent by a node that does not
// announce, a set reserved bit, trailing bytes) is ErrMalformed. A node
// "node017" at "10.0.0.17:7000" with 4 groups of 8-byte names costs 77 bytes
// untagged and 109 tagged; each further group adds its name length plus 2.
// Memberlist's packets hold about 1400 bytes, so the announce of a node
// with more than about 100 groups travels only over its reliable (TCP)
// path: pushed to the fingers over TCP, never gossiped, and in push/pull.
//
// A Codec with a key tags every message and rejects, with
// ErrUnauthenticated, every message without the right tag; one without a
// key sends untagged messages and accepts both kinds, since it cannot check.
//
// # Usage
//
//	table := names.NewTable(self)
//	codec := names.NewCodec(key) // the same key on every node, or nil
//
//	// On a level change, and at least every 30 s:
//	seq++
//	info := names.NodeInfo{Node: self, Addr: rpcAddr, Announce: announce, Boot: boot, Seq: seq, Groups: groups}
//	table.Apply(info)
//	broadcast(codec.Encode(nil, info))
//
//	// On a message from a live peer (memberlist NotifyMsg: never block):
//	info, err := codec.Decode(msg)
//	if err == nil && info.Node != self {
//		changed, err := table.Apply(info)
//		...
//	}
//
//	// On NotifyLeave:
//	table.Remove(node)
//
//	// Per request:
//	for _, e := range table.Lookup(group) { ... } // read-only
package names
