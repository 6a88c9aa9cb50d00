package netio

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// A name lookup (KindNameLookup, the group in the frame's group field) asks
// a node which nodes run a group and how loaded they are; a balancing
// client (dccltloadbalance) sends its calls where the answer says. The
// answer is a KindReply whose payload is:
//
//	uvarint count, then per node: level (1 byte, 0..2), uvarint length and
//	the RPC address (host:port)
//
// A group no node runs is answered 'no such service group'.

// NodeLevel is one node of a lookup answer.
type NodeLevel struct {
	Addr  string
	Level uint8 // LEVEL0..LEVEL2
}

// maxLookupNodes bounds an answer: the cluster limit is 128 nodes.
const maxLookupNodes = 1024

// AppendLookupAnswer appends the payload of a lookup answer.
func AppendLookupAnswer(dst []byte, nodes []NodeLevel) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(nodes)))
	for _, n := range nodes {
		dst = append(dst, n.Level)
		dst = binary.AppendUvarint(dst, uint64(len(n.Addr)))
		dst = append(dst, n.Addr...)
	}
	return dst
}

// ErrBadLookupAnswer is a lookup answer that does not parse.
var ErrBadLookupAnswer = errors.New("netio: bad name lookup answer")

// ParseLookupAnswer reads a lookup answer's payload.
func ParseLookupAnswer(b []byte) ([]NodeLevel, error) {
	count, k := binary.Uvarint(b)
	if k <= 0 || count > maxLookupNodes {
		return nil, fmt.Errorf("%w: count", ErrBadLookupAnswer)
	}
	b = b[k:]
	out := make([]NodeLevel, 0, count)
	for i := range count {
		if len(b) < 1 || b[0] > 2 {
			return nil, fmt.Errorf("%w: node %d: level", ErrBadLookupAnswer, i)
		}
		level := b[0]
		n, k := binary.Uvarint(b[1:])
		if k <= 0 || n == 0 || n > MaxNameLen || uint64(len(b)-1-k) < n {
			return nil, fmt.Errorf("%w: node %d: address", ErrBadLookupAnswer, i)
		}
		out = append(out, NodeLevel{Addr: string(b[1+k : 1+k+int(n)]), Level: level})
		b = b[1+k+int(n):]
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the last node", ErrBadLookupAnswer, len(b))
	}
	return out, nil
}

// LookupFind, as the service of a KindNameLookup, is the routing
// manager's "find server" (source document 004): its answer is a lookup
// answer listing the nodes that serve the group (an application
// environment), those where its calls meet their goals first. When no
// node serves it, the cluster starts one server and the answer comes when
// that server is ready, within the frame's timeout.
const LookupFind = "find"

// LookupReceivers, as the service of a KindNameLookup, asks the node
// itself (not its cluster) where a service group's calls are received:
// which receiver group takes them, at which address, with how many
// receiving sockets, and on which of them the asking connection is. A
// sender that spreads its calls over the receivers (multi_schedule) keeps
// one connection per socket. The answer's payload is:
//
//	uvarint length and the receiver group's name ("" the default group),
//	uvarint length and its address (host:port), uvarint its sockets,
//	uvarint 1 + the socket the asking connection is on (0: not on it)
//
// A group the node does not define is answered 'no such service group'.
const LookupReceivers = "receivers"

// Receivers is the answer to a receivers lookup.
type Receivers struct {
	Group string // the receiver group; "" the default
	Addr  string // host:port of its sockets
	Count int    // its receiving sockets
	Here  int    // the socket the asking connection is on; -1: not on this group
}

// maxReceiverCount bounds an answer: netio's limit on sockets.
const maxReceiverCount = 256 // gnet's limit on event loops, the most receivers a port has

// AppendReceivers appends the payload of a receivers lookup answer.
func AppendReceivers(dst []byte, r Receivers) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(r.Group)))
	dst = append(dst, r.Group...)
	dst = binary.AppendUvarint(dst, uint64(len(r.Addr)))
	dst = append(dst, r.Addr...)
	dst = binary.AppendUvarint(dst, uint64(r.Count))
	return binary.AppendUvarint(dst, uint64(r.Here+1))
}

// ParseReceivers reads a receivers lookup answer's payload.
func ParseReceivers(b []byte) (Receivers, error) {
	var r Receivers
	str := func(what string) (string, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > MaxNameLen || uint64(len(b)-k) < n {
			return "", false
		}
		s := string(b[k : k+int(n)])
		b = b[k+int(n):]
		return s, true
	}
	var ok bool
	if r.Group, ok = str("group"); !ok {
		return r, fmt.Errorf("%w: receiver group", ErrBadLookupAnswer)
	}
	if r.Addr, ok = str("addr"); !ok || r.Addr == "" {
		return r, fmt.Errorf("%w: address", ErrBadLookupAnswer)
	}
	count, k := binary.Uvarint(b)
	if k <= 0 || count == 0 || count > maxReceiverCount {
		return r, fmt.Errorf("%w: receiver count", ErrBadLookupAnswer)
	}
	b = b[k:]
	here, k := binary.Uvarint(b)
	if k <= 0 || here > count {
		return r, fmt.Errorf("%w: receiver of the connection", ErrBadLookupAnswer)
	}
	if len(b) != k {
		return r, fmt.Errorf("%w: %d bytes after the answer", ErrBadLookupAnswer, len(b)-k)
	}
	r.Count, r.Here = int(count), int(here)-1
	return r, nil
}
