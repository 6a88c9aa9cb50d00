package local

import (
	"fmt"
	"sync/atomic"
)

// requestBudget counts the bytes of the requests the node holds for the
// calls it admitted: each call's own copy (group.go), from its admission
// until it ends, whether it waits in a queue, is prefetched or runs. It
// keeps them within rpc_buffer_budget, so that a caller that queues calls
// of max_message_size cannot make the node hold queue_size of them (issue
// 19 item 18: 200 calls of 8 MiB took scdd to 1.9 GiB). The RPC port keeps
// its own count of partial frames and unsent answers under the same
// operand (netio/rpcport): that one bounds what arrives, this one what
// waits.
//
// A call that would take the node's count past the budget is refused
// 'server busy' only if its group holds more than its share (the budget
// over the number of groups): the group that filled the budget is refused,
// the others are still served. Each group may also hold one call whatever
// its size, so that a budget below max_message_size lets calls through one
// at a time. So the count stays below the budget, plus the call that
// crossed it, plus for each other group its share or one call of its
// max_message_size, whichever is more (not twice the budget: ten groups of
// 8 MiB messages under a budget of 64 MiB may hold 136 MiB).
type requestBudget struct {
	held  atomic.Int64
	limit int64 // rpc_buffer_budget
	share int64 // limit / number of groups
}

// groupBytes is one group's part of the node's requestBudget.
type groupBytes struct {
	node *requestBudget
	held atomic.Int64
}

// take charges n bytes to the group and the node; false, nothing charged,
// when the node is over its budget and the group over its share.
func (g *groupBytes) take(n int) bool {
	if n <= 0 {
		return true
	}
	b, d := g.node, int64(n)
	total, own := b.held.Add(d), g.held.Add(d)
	if total > b.limit && own > b.share && own != d {
		b.held.Add(-d)
		g.held.Add(-d)
		return false
	}
	return true
}

// give returns n bytes taken before.
func (g *groupBytes) give(n int) {
	if n > 0 {
		g.node.held.Add(-int64(n))
		g.held.Add(-int64(n))
	}
}

// refusal says why a call of n bytes was refused.
func (g *groupBytes) refusal(group string, n int) string {
	return fmt.Sprintf("the node holds %d bytes of admitted calls' requests (rpc_buffer_budget %d), %s %d of them (its share %d); the call's %d do not fit",
		g.node.held.Load(), g.node.limit, group, g.held.Load(), g.node.share, n)
}
