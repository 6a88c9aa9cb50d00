package names

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"tpsched/scd/loadlevel"
)

// MaxNodes is the most nodes a cluster may have, this node included
// (OpenTP1's limit).
const MaxNodes = 128

// Limits on what one node announces; Apply and Decode enforce both.
const (
	maxNameLen = 255  // bytes in a node id, an address or a group name
	maxGroups  = 4096 // groups one node announces
)

// ErrFull is returned, wrapped with the refused node's id, by Apply for a
// node that would be the table's 129th.
var ErrFull = errors.New("names: table full (at most 128 nodes)")

// GroupInfo is one service group as a node announces it.
type GroupInfo struct {
	Group  string
	Level  loadlevel.Level
	Held   bool
	Socket bool // receive_from=socket
	// PI is the performance index of the group's calls here x 100 (the
	// worst of their service classes lately), for routing towards nodes
	// that meet their goals; 0 unknown. Only a node with a service policy
	// sends it (see WLMInfo).
	PI uint16
}

// NodeInfo is one node's announce: everything the other nodes know of it.
type NodeInfo struct {
	Node     string      // node_id (1..255 bytes)
	Addr     string      // host:port of its RPC port, where requests are sent
	Announce bool        // scd_announce_server_status: false = it announces no load (levels sent as LEVEL0, peers choose at random)
	Boot     uint64      // incarnation: the node's start time in ns; a restarted node has a higher one
	Seq      uint64      // announce sequence within the incarnation; (Boot, Seq) orders announces
	Groups   []GroupInfo // sorted by Group
	// WLM is the routing manager's part of the announce (004); nil when the
	// node has no service policy. The table never modifies it: readers
	// share it.
	WLM *WLMInfo
}

// newer reports whether a's (Boot, Seq) is after b's.
func (a *NodeInfo) newer(b *NodeInfo) bool {
	if a.Boot != b.Boot {
		return a.Boot > b.Boot
	}
	return a.Seq > b.Seq
}

// sameButSeq reports whether a and b differ in nothing but Seq: a periodic
// re-announce, which changes nothing a reader of the table sees.
func (a *NodeInfo) sameButSeq(b *NodeInfo) bool {
	return a.Node == b.Node && a.Addr == b.Addr && a.Announce == b.Announce &&
		a.Boot == b.Boot && slices.Equal(a.Groups, b.Groups) && a.WLM.equal(b.WLM)
}

// validate checks the limits the package comment lists. Its errors carry no
// package prefix: Apply and Decode add their own.
func (a *NodeInfo) validate() error {
	if a.Node == "" {
		return errors.New("empty node id")
	}
	if len(a.Node) > maxNameLen {
		return fmt.Errorf("node id %.20q... is %d bytes (at most %d)", a.Node, len(a.Node), maxNameLen)
	}
	if len(a.Addr) > maxNameLen {
		return fmt.Errorf("node %q: address is %d bytes (at most %d)", a.Node, len(a.Addr), maxNameLen)
	}
	if len(a.Groups) > maxGroups {
		return fmt.Errorf("node %q: %d service groups (at most %d)", a.Node, len(a.Groups), maxGroups)
	}
	for i, g := range a.Groups {
		switch {
		case g.Group == "":
			return fmt.Errorf("node %q: service group %d has an empty name", a.Node, i)
		case len(g.Group) > maxNameLen:
			return fmt.Errorf("node %q: service group name %.20q... is %d bytes (at most %d)", a.Node, g.Group, len(g.Group), maxNameLen)
		case g.Level > loadlevel.Level2:
			return fmt.Errorf("node %q: service group %q: %v is no load level", a.Node, g.Group, g.Level)
		case i > 0 && g.Group <= a.Groups[i-1].Group:
			return fmt.Errorf("node %q: service group %q after %q (groups must be sorted by name, each once)", a.Node, g.Group, a.Groups[i-1].Group)
		case g.PI != 0 && a.WLM == nil:
			return fmt.Errorf("node %q: service group %q: a performance index from a node without a service policy", a.Node, g.Group)
		}
	}
	return a.WLM.validate(a.Node)
}

// Entry is one node that runs a service group, as Lookup returns it.
type Entry struct {
	Node, Addr string
	Level      loadlevel.Level
	Held       bool
	Socket     bool   // receive_from=socket
	Local      bool   // the node is this one
	Announce   bool   // the node announces its load; false: Level is LEVEL0 and means nothing
	PI         uint16 // performance index x 100 of the group's calls there; 0 unknown
}

// Table is a node's view of every node's announce, its own included. It is
// safe for concurrent use. Readers (Lookup, Len, Version) take no lock: they
// read an immutable index that every change replaces, so Lookup costs a map
// look-up and never waits for a writer.
type Table struct {
	self string

	mu    sync.Mutex          // serialises writers, guards nodes
	nodes map[string]NodeInfo // by node id; Groups owned by the table, never modified
	index atomic.Pointer[index]
}

// index is what readers see. It is replaced whole, never modified: every
// slice in groups is exactly as long as its capacity and shared with
// callers of Lookup.
type index struct {
	groups  map[string][]Entry // by service group, sorted by Node
	nodes   int
	version uint64
}

// NewTable returns an empty table for the node whose id is self; entries of
// that node have Local set.
func NewTable(self string) *Table {
	t := &Table{self: self, nodes: make(map[string]NodeInfo)}
	t.index.Store(&index{groups: map[string][]Entry{}})
	return t
}

// Apply takes info, an announce from a node or this node's own, if it is
// newer than what the table holds for that node: a higher Boot, or the same
// Boot and a higher Seq. An older or equal announce is ignored (false, nil).
// changed reports whether anything but Seq differs from what the table held,
// and only then does Version move. A node the table does not hold is refused
// with an error wrapping ErrFull when the table already holds MaxNodes
// nodes. An info that breaks a limit of the package comment is refused with
// an error. A refused info leaves the table as it was. Apply keeps its own
// copy of info.Groups.
func (t *Table) Apply(info NodeInfo) (changed bool, err error) {
	if err := info.validate(); err != nil {
		return false, fmt.Errorf("names: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old, known := t.nodes[info.Node]
	switch {
	case known && !info.newer(&old):
		return false, nil
	case known && info.sameButSeq(&old):
		old.Seq = info.Seq
		t.nodes[info.Node] = old
		return false, nil
	case !known && len(t.nodes) >= MaxNodes:
		return false, fmt.Errorf("%w: node %q not added", ErrFull, info.Node)
	}
	info.Groups = slices.Clone(info.Groups)
	info.WLM = info.WLM.clone()
	t.nodes[info.Node] = info
	t.publish(info.Node, old.Groups, &info) // old is the zero NodeInfo when !known
	return true, nil
}

// Remove forgets node, which left the cluster or died, and reports whether
// the table held it.
func (t *Table) Remove(node string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	old, known := t.nodes[node]
	if !known {
		return false
	}
	delete(t.nodes, node)
	t.publish(node, old.Groups, nil)
	return true
}

// publish replaces the index after node's groups went from was to now.Groups
// (now nil: the node is gone). Only the groups in either list are rebuilt,
// each into a new slice, so slices that Lookup handed out stay as they were.
// t.mu must be held.
func (t *Table) publish(node string, was []GroupInfo, now *NodeInfo) {
	cur := t.index.Load()
	next := &index{
		groups:  maps.Clone(cur.groups),
		nodes:   len(t.nodes),
		version: cur.version + 1,
	}
	var is []GroupInfo
	if now != nil {
		is = now.Groups
	}
	// Walk both sorted lists together, once per group in either.
	for i, j := 0, 0; i < len(was) || j < len(is); {
		var g string
		var entry *Entry
		switch {
		case j == len(is) || (i < len(was) && was[i].Group < is[j].Group):
			g = was[i].Group
			i++
		default:
			if i < len(was) && was[i].Group == is[j].Group {
				i++
			}
			gi := is[j]
			j++
			g = gi.Group
			entry = &Entry{
				Node: node, Addr: now.Addr, Level: gi.Level, Held: gi.Held, Socket: gi.Socket,
				Local: node == t.self, Announce: now.Announce, PI: gi.PI,
			}
		}
		if list := withEntry(next.groups[g], node, entry); len(list) > 0 {
			next.groups[g] = list
		} else {
			delete(next.groups, g)
		}
	}
	t.index.Store(next)
}

// withEntry returns a list, sorted by Node, that is list without node's
// entry and with e when e is not nil. list itself is not modified: the
// result is a new slice, or list when it already says what e says (a level
// change rebuilds only the group that changed).
func withEntry(list []Entry, node string, e *Entry) []Entry {
	at, found := slices.BinarySearchFunc(list, node, func(e Entry, node string) int {
		return strings.Compare(e.Node, node)
	})
	if found && e != nil && list[at] == *e {
		return list
	}
	rest := list[at:]
	if found {
		rest = list[at+1:]
	}
	n := len(list[:at]) + len(rest)
	if e != nil {
		n++
	}
	out := make([]Entry, 0, n)
	out = append(out, list[:at]...)
	if e != nil {
		out = append(out, *e)
	}
	return append(out, rest...)
}

// Lookup returns every node that runs group, this one included, sorted by
// Node; nil when none does. It takes no lock and does not allocate: the
// slice is shared with every other caller and must not be modified. It is a
// snapshot, which later changes to the table never modify.
func (t *Table) Lookup(group string) []Entry {
	return t.index.Load().groups[group]
}

// Get returns the newest announce the table holds for node. Its Groups is
// the caller's own copy.
func (t *Table) Get(node string) (NodeInfo, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	info, ok := t.nodes[node]
	info.Groups = slices.Clone(info.Groups)
	return info, ok
}

// Nodes returns every node's newest announce, sorted by Node, for status
// output. The slice and every Groups in it are the caller's own.
func (t *Table) Nodes() []NodeInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]NodeInfo, 0, len(t.nodes))
	for _, info := range t.nodes {
		info.Groups = slices.Clone(info.Groups)
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b NodeInfo) int { return strings.Compare(a.Node, b.Node) })
	return out
}

// Len returns the number of nodes the table holds, this one included once
// it has applied its own announce.
func (t *Table) Len() int { return t.index.Load().nodes }

// Version increases by one on every change to what Lookup, Get or Nodes
// return other than a Seq: a node added, removed, or announcing anything
// new. A cache built from the table is current while Version is unchanged.
func (t *Table) Version() uint64 { return t.index.Load().version }
