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
