package client

import (
	"container/list"
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"tpsched/netio"
)

// This file is client-side load balancing (dccltloadbalance): learn which
// nodes run a group from a name lookup, keep the least loaded ones, and
// send calls to them in turn, marked balanced so the node serves them
// itself unless it must not.

// levelCache is an LRU of groups and their least loaded nodes, each kept
// dccltcachetim. (hashicorp/golang-lru/v2's expirable LRU would do, but it
// starts a goroutine per cache that nothing can stop (v2.0.7: its Close is
// commented out), so every client made and closed would leak one.)
type levelCache struct {
	mu    sync.Mutex
	max   int
	order *list.List // front: most recently used
	byKey map[string]*list.Element
}

type cacheEntry struct {
	group   string
	hosts   []int // host indexes of the least loaded nodes; none left: the dchost way
	next    int   // round-robin position
	expires time.Time
}

func newLevelCache(max int) *levelCache {
	return &levelCache{max: max, order: list.New(), byKey: map[string]*list.Element{}}
}

// next is the host to send group's next call to, if a fresh entry has one
// (host < 0: the entry has none left, the call goes the dchost way).
func (lc *levelCache) next(group string, now time.Time) (host int, fresh bool) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	el := lc.byKey[group]
	if el == nil {
		return 0, false
	}
	e := el.Value.(*cacheEntry)
	if now.After(e.expires) {
		lc.order.Remove(el)
		delete(lc.byKey, group)
		return 0, false
	}
	lc.order.MoveToFront(el)
	if len(e.hosts) == 0 {
		return -1, true
	}
	h := e.hosts[e.next%len(e.hosts)]
	e.next++
	return h, true
}

// leave takes host out of group's entry, after it could not be reached:
// the entry's other nodes, or none (the dchost way), until it expires.
func (lc *levelCache) leave(group string, host int) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if el := lc.byKey[group]; el != nil {
		e := el.Value.(*cacheEntry)
		kept := make([]int, 0, len(e.hosts))
		for _, h := range e.hosts {
			if h != host {
				kept = append(kept, h)
			}
		}
		e.hosts = kept
	}
}

// put keeps hosts for group until expires; start is the first one's
// position (random, so that clients do not all begin at one node).
func (lc *levelCache) put(group string, hosts []int, start int, expires time.Time) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if el := lc.byKey[group]; el != nil {
		lc.order.Remove(el)
	}
	lc.byKey[group] = lc.order.PushFront(&cacheEntry{group: group, hosts: hosts, next: start, expires: expires})
	for lc.order.Len() > lc.max {
		oldest := lc.order.Back()
		lc.order.Remove(oldest)
		delete(lc.byKey, oldest.Value.(*cacheEntry).group)
	}
}

// forget drops group, after its node could not be reached.
func (lc *levelCache) forget(group string) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if el := lc.byKey[group]; el != nil {
		lc.order.Remove(el)
		delete(lc.byKey, group)
	}
}

// callBalanced sends a call to a node chosen from the group's levels. done
// is false when the call was not sent and should go the dchost way.
func (c *Client) callBalanced(ctx context.Context, h netio.Header, group, service string, payload []byte,
	timeout time.Duration) (reply []byte, err error, done bool) {
	idx, ok := c.balancedHost(ctx, group)
	if !ok {
		return nil, nil, false
	}
	mc, err := c.connFor(ctx, idx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, notSent(ctx), true // its time is up: not the dchost way either
		}
		// Left out while the group's nodes are kept: asked again now,
		// the dchost node would name it again, and every call would
		// wait for its dial.
		c.cache.leave(group, idx)
		return nil, nil, false
	}
	h.Flags = h.Flags&^netio.FlagSchedulerDirect | netio.FlagBalanced // the client chose: the node does not balance it again
	reply, err, sent := c.deliver(ctx, idx, mc, h, group, service, payload, timeout)
	if !sent && errors.Is(err, netio.ErrWriteTimeout) {
		return nil, timedOut(err), true // its time is up: not the dchost way either
	}
	if !sent && ctx.Err() != nil {
		return nil, notSent(ctx), true
	}
	var te *netio.Error
	if !sent || (errors.As(err, &te) && te.Code == netio.CodeNetworkDown) {
		c.cache.forget(group)
	}
	if !sent {
		return nil, nil, false
	}
	return reply, err, true
}

// balancedHost is the next host for group, asking a dchost node when the
// cache has nothing fresh.
func (c *Client) balancedHost(ctx context.Context, group string) (int, bool) {
	now := time.Now()
	if h, fresh := c.cache.next(group, now); fresh {
		return h, h >= 0
	}
	nodes, err := c.lookup(ctx, group)
	if err != nil || len(nodes) == 0 {
		return 0, false
	}
	var hosts []int
	if c.opts.FindServer {
		hosts = []int{c.hostIndex(nodes[0].Addr)} // the node ranked them
	} else {
		low := nodes[0].Level
		for _, n := range nodes {
			low = min(low, n.Level)
		}
		for _, n := range nodes {
			if n.Level == low {
				hosts = append(hosts, c.hostIndex(n.Addr))
			}
		}
	}
	start := rand.IntN(len(hosts))
	if c.opts.CacheTime < 0 {
		return hosts[start], true
	}
	c.cache.put(group, hosts, start, now.Add(c.opts.CacheTime))
	h, _ := c.cache.next(group, now)
	return h, h >= 0
}

// lookup asks a dchost node which nodes run group, with their levels;
// with FindServer it is a find, which may start a server and so waits as
// long as the caller does.
func (c *Client) lookup(ctx context.Context, group string) ([]netio.NodeLevel, error) {
	if c.opts.FindServer {
		return c.FindServer(ctx, group)
	}
	idx, mc, err := c.pick(ctx)
	if err != nil {
		return nil, err
	}
	id, w, sent, err := c.start(ctx, idx, mc, netio.Header{Kind: netio.KindNameLookup}, group, "", nil, 5*time.Second)
	if !sent {
		return nil, err
	}
	if err != nil {
		return nil, sentErr(err)
	}
	answer, err := wait(ctx, mc, id, w, 5*time.Second)
	if err != nil {
		return nil, err
	}
	return netio.ParseLookupAnswer(answer)
}

// hostIndex is the index of addr among the hosts, added if it is new.
func (c *Client) hostIndex(addr string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, h := range c.hosts {
		if h == addr {
			return i
		}
	}
	c.hosts = append(c.hosts, addr)
	return len(c.hosts) - 1
}
