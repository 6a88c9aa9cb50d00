package client

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"tpsched/netio"
)

// This file is the client's side of receiver groups (OpenTP1's grouped
// multi-scheduler daemons) and of multi_schedule. A node answers a call
// that came to a receiver group that does not take its service group
// 'wrong receiver'; the call did not run, so the client asks the node
// where the group is received (a receivers lookup), remembers it, and
// sends the call there. (A call without an answer is served where it
// comes: a refusal would not be heard.) With MultiSchedule the client asks before the first call of every group
// and keeps one connection per receiving socket of the group's receivers
// (each on a different socket, as far as reconnecting a few times can
// make it), sending each call on the next of them: the calls are spread
// over the receivers instead of all going through one event loop.

// routeKey is a service group on a node (by the node's host index).
type routeKey struct {
	host  int
	group string
}

// receiverRoute is where a group's calls are received on a node.
type receiverRoute struct {
	addr  string // host:port of the receiver group's sockets
	count int    // its receiving sockets
}

// spread is the connections to one receiver group's sockets, one per
// socket where the client could manage it.
type spread struct {
	c     *Client
	addr  string
	group string // a service group received there, for the receivers lookups
	count int

	mu      sync.Mutex
	conns   []*netio.MuxConn // live ones
	here    map[*netio.MuxConn]int
	next    int
	filling bool
	filled  time.Time // when the last fill ended: refills are at most once a second
	retired bool      // replaced: its connections end once answered, a fill keeps none
}

// routeFor is the route learned for group on host idx, if any.
func (c *Client) routeFor(idx int, group string) (receiverRoute, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.routes[routeKey{idx, group}]
	return r, ok
}

func (c *Client) setRoute(idx int, group string, r receiverRoute) {
	c.mu.Lock()
	c.routes[routeKey{idx, group}] = r
	c.mu.Unlock()
}

func (c *Client) forgetRoute(idx int, group string) {
	c.mu.Lock()
	delete(c.routes, routeKey{idx, group})
	c.mu.Unlock()
}

// learnRoute asks the node on mc (host idx) where group is received. A
// node that does not define the group is remembered as receiving it on
// its own port: it answers such calls itself. No answer (the connection
// broke, or the caller's time ran out first: 'timed out' is the client's
// own) teaches nothing, and the next call asks again.
func (c *Client) learnRoute(ctx context.Context, idx int, mc *netio.MuxConn, group string) (receiverRoute, error) {
	r, err := askReceivers(ctx, mc, group)
	var te *netio.Error
	switch {
	case err == nil:
		rr := receiverRoute{addr: r.Addr, count: r.Count}
		c.setRoute(idx, group, rr)
		return rr, nil
	case errors.As(err, &te) && te.Code != netio.CodeNetworkDown && te.Code != netio.CodeTimedOut:
		rr := receiverRoute{addr: c.hostAddr(idx), count: 1}
		c.setRoute(idx, group, rr)
		return rr, nil
	}
	return receiverRoute{}, err
}

// askReceivers sends a receivers lookup for group on mc.
func askReceivers(ctx context.Context, mc *netio.MuxConn, group string) (netio.Receivers, error) {
	w := waiterPool.Get().(*waiter)
	id, sent, err := mc.Call(netio.Header{Kind: netio.KindNameLookup}, group, netio.LookupReceivers, nil, sendBy(ctx, 5*time.Second), w)
	if !sent {
		waiterPool.Put(w)
		return netio.Receivers{}, &netio.Error{Code: netio.CodeNetworkDown, Message: err.Error()}
	}
	answer, err := wait(ctx, mc, id, w, 5*time.Second)
	if err != nil {
		return netio.Receivers{}, err
	}
	return netio.ParseReceivers(answer)
}

func (c *Client) hostAddr(idx int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hosts[idx]
}

// routed is the connection a call for group to host idx goes on, given
// the connection to the node's own port (mc): a receiver group's
// connection when one is known (or, with MultiSchedule, learned now), else
// mc. Errors reaching the receivers leave mc.
func (c *Client) routed(ctx context.Context, idx int, mc *netio.MuxConn, group string) (int, *netio.MuxConn) {
	r, known := c.routeFor(idx, group)
	if !known && c.opts.MultiSchedule {
		var err error
		if r, err = c.learnRoute(ctx, idx, mc, group); err != nil {
			return idx, mc
		}
		known = true
	}
	if !known {
		return idx, mc
	}
	if c.opts.MultiSchedule && r.count > 1 {
		if smc := c.spreadFor(r, group).pick(ctx); smc != nil {
			return -1, smc
		}
	}
	if r.addr == c.hostAddr(idx) {
		return idx, mc
	}
	ridx := c.hostIndex(r.addr)
	rmc, err := c.connFor(ctx, ridx)
	if err != nil {
		if ctx.Err() == nil { // else the receivers were not at fault
			c.forgetRoute(idx, group)
		}
		return idx, mc
	}
	return ridx, rmc
}

// spreadFor is the spread of the receiver group at r, which receives group.
// A spread the receiver group's new number of sockets replaces is
// retired, not closed: calls in flight on its connections may run, and
// get their answers.
func (c *Client) spreadFor(r receiverRoute, group string) *spread {
	c.mu.Lock()
	s := c.spreads[r.addr]
	if s != nil && s.count == r.count {
		c.mu.Unlock()
		return s
	}
	old := s
	s = &spread{c: c, addr: r.addr, group: group, count: r.count, here: map[*netio.MuxConn]int{}}
	c.spreads[r.addr] = s
	c.mu.Unlock()
	if old != nil {
		old.retire() // after c.mu: a fill holds s.mu and then takes c.mu
	}
	return s
}

// pick is the next connection of the spread, filling it first when it
// has fewer than one per socket (at most once a second after a fill). The
// fill is the caller's and ends with its ctx; other callers meanwhile
// take the connections there are.
func (s *spread) pick(ctx context.Context) *netio.MuxConn {
	s.mu.Lock()
	fill := len(s.conns) < s.count && !s.filling && time.Since(s.filled) > time.Second
	if fill {
		s.filling = true
	}
	s.mu.Unlock()
	if fill {
		s.fill(ctx)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.conns) == 0 {
		return nil
	}
	s.next++
	return s.conns[s.next%len(s.conns)]
}

// fill dials until the spread has a connection on every socket or has
// tried three times as often as there are sockets, or ctx ends (the
// caller's: its dials and lookups are made while it waits); a connection
// on a socket it has already is closed.
func (s *spread) fill(ctx context.Context) {
	defer func() {
		s.mu.Lock()
		s.filling, s.filled = false, time.Now()
		s.mu.Unlock()
	}()
	for attempt := 0; attempt < 3*s.count; attempt++ {
		s.mu.Lock()
		full := len(s.conns) >= s.count
		s.mu.Unlock()
		if full {
			return
		}
		mc, here, err := s.dial(ctx)
		if err != nil {
			return
		}
		s.mu.Lock()
		if mc.Err() != nil {
			// It closed already (the node closed it during the receivers
			// lookup): its OnClose ran drop before it was here to be
			// dropped, and Close runs once. Kept, it would count as a
			// socket's connection and fail every call picked onto it.
			// A close after this look finds it here: drop takes s.mu.
			s.mu.Unlock()
			continue
		}
		dup := false
		for _, h := range s.here {
			dup = dup || (h == here && here >= 0)
		}
		if !dup && !s.retired && s.c.isOpen() {
			s.conns = append(s.conns, mc)
			s.here[mc] = here
			s.mu.Unlock()
			continue
		}
		s.mu.Unlock()
		// Not kept, nothing else would close it: a spread retired or a
		// client closed meanwhile must not leak what its fill made.
		if !dup {
			// Nor would it keep any other: the fill is over.
			mc.Close(errors.New("the spread was replaced or the client closed"))
			return
		}
		mc.Close(errors.New("another connection of the client is on this receiving socket"))
	}
}

// dial opens one connection to the spread's address and asks which
// receiving socket it landed on, by ctx and Close (the dial, as the
// client's own; the lookup is on a connection Close closes); a
// connection whose lookup ctx cut is closed.
func (s *spread) dial(ctx context.Context) (*netio.MuxConn, int, error) {
	dialer := net.Dialer{Timeout: s.c.opts.DialTimeout}
	dctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.c.stop, cancel)
	nc, err := dialer.DialContext(dctx, "tcp", s.addr)
	stop()
	cancel()
	if err != nil {
		return nil, -1, err
	}
	// Made under c.mu, as Client.dial does: a client closed meanwhile
	// gets none, and Close finds every one made before.
	s.c.mu.Lock()
	if s.c.closed {
		s.c.mu.Unlock()
		nc.Close()
		return nil, -1, errClientClosed
	}
	mc := netio.NewMuxConn(nc, netio.MuxOptions{
		MaxPayload: s.c.maxPayload(),
		OnClose: func(mc *netio.MuxConn, _ error) {
			s.drop(mc)
			s.c.closedConn(mc)
		},
		OnGoAway: s.drop,
	})
	s.c.open[mc] = struct{}{} // an OnClose meanwhile waits for c.mu
	s.c.mu.Unlock()
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	here := -1
	r, err := askReceivers(lctx, mc, s.group)
	switch {
	case err == nil:
		here = r.Here
	case ctx.Err() != nil:
		mc.Close(err)
		return nil, -1, err
	}
	return mc, here, nil
}

// drop takes a connection that closed or goes away out of the spread.
func (s *spread) drop(mc *netio.MuxConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, x := range s.conns {
		if x == mc {
			s.conns = append(s.conns[:i], s.conns[i+1:]...)
			break
		}
	}
	delete(s.here, mc)
}

// retire makes the spread's connections end once their calls are answered
// (netio.MuxConn.Retire) and a fill still running close what it makes.
func (s *spread) retire() {
	s.mu.Lock()
	s.retired = true
	conns := append([]*netio.MuxConn(nil), s.conns...)
	s.mu.Unlock()
	for _, mc := range conns {
		mc.Retire()
	}
}

func (c *Client) isOpen() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.closed
}
