// Package client is the Go RPC client of tpsched, the counterpart of
// OpenTP1's TP1/Client: it calls services of a service group on a node,
// with many calls in flight on one connection (matched by request id) and a
// host list (dchost) it fails over along when a node cannot be reached.
//
// # Usage
//
//	c, err := client.New(client.Options{Hosts: []string{"127.0.0.1:12000"}})
//	defer c.Close()
//	reply, err := c.Call(ctx, "demo", "echo", []byte("hello"))
//	var te *netio.Error
//	if errors.As(err, &te) && te.Code == netio.CodeServerBusy { ... }
//
// A call that was sent is never sent again to another node: a broken
// connection fails it with 'network down', because the service may already
// have run. Only calls that could not be sent move to the next host. A
// reply over MaxMessageSize and 64 KiB fails its own call 'message too big'
// (the service may have run; the reply is dropped unread); the connection
// and the other calls on it go on.
//
// A call waits for nothing past its ctx: not for a dial (its own or one
// another call started, which goes on and serves the calls after it), nor
// for a receivers lookup. A call whose ctx ends before it is sent fails
// 'timed out' (ctx's error if cancelled) and goes to no other host.
package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"time"

	"tpsched/netio"
	"tpsched/scd/def"
)

// Options configure a Client. The zero value of every field but Hosts is a
// sane default.
type Options struct {
	Hosts          []string      // dchost: host:port of the nodes, tried in order
	HostSelect     bool          // dchostselect: begin at a random host
	HostChange     bool          // dcscdhostchange: move to the next host on every call
	WatchTime      time.Duration // how long a call waits when ctx has no deadline; default 180 s, <0 = forever
	MaxMessageSize int           // larger payloads are refused before sending; default 1 MiB
	DialTimeout    time.Duration // default 3 s
	// Balanced marks calls as already balanced (the client chose the node,
	// as with dccltloadbalance): the node serves them itself unless the
	// group is held there, or LEVEL2 while another node is lower.
	Balanced bool
	// SchedulerDirect (dcscddirect = Y) marks the calls sent to a dchost
	// node as scheduler-direct requests: that node balances them by
	// Table 3-7 with schedule_rate weighting LEVEL0 against LEVEL1 nodes.
	// Without it a node sends a call to the least-loaded node that runs
	// its group (Table 3-7 as written), as it does a UAP's call.
	SchedulerDirect bool
	// LoadBalance (dccltloadbalance) asks a dchost node which nodes run a
	// group and how loaded they are, keeps the least loaded ones for
	// CacheTime (dccltcachetim) in an LRU of CacheEntries groups (dccache),
	// and sends each call, marked balanced, to the next of them: the first
	// at random, then round-robin. Calls fall back to dchost when no node
	// can be learned or reached.
	LoadBalance bool
	// FindServer makes LoadBalance's name lookup the routing manager's
	// find server (source document 004, FindServer): for a group that is an
	// application environment with no server, the node has one started
	// before it answers, and the group's calls go to the node the find
	// names first (the node ranks first those where the calls meet their
	// goals, then by load). It implies LoadBalance.
	FindServer   bool
	CacheEntries int           // default 64
	CacheTime    time.Duration // default 30 s; below 0: ask before every call
	// MultiSchedule (OpenTP1's multi_schedule on the sending side) asks a
	// node where a group is received before its first call there, keeps
	// one connection per receiving socket of that receiver group, and
	// spreads the group's calls over them. Without it the client still
	// follows a 'wrong receiver' answer to the group's receivers, on one
	// connection.
	MultiSchedule bool
}

// FromDefinition turns a client environment definition into Options.
func FromDefinition(c *def.Client) Options {
	o := Options{
		Hosts:           c.Hosts,
		HostSelect:      c.HostSelect,
		HostChange:      c.HostChange,
		SchedulerDirect: c.SchedulerDirect,
		WatchTime:       c.WatchTime,
		MaxMessageSize:  c.MaxMessageSize,
		LoadBalance:     c.LoadBalance,
		CacheEntries:    c.CacheEntries,
		CacheTime:       c.CacheTime,
	}
	if o.CacheTime == 0 {
		o.CacheTime = -1 // dccltcachetim 0: no caching
	}
	if o.WatchTime == 0 {
		o.WatchTime = -1 // watch_time 0 means wait for ever
	}
	return o
}

// Client calls services on tpsched nodes. It is safe for concurrent use.
type Client struct {
	opts  Options
	nDC   int // hosts[:nDC] are dchost; later ones were learned by name lookup
	cache *levelCache

	mu      sync.Mutex
	hosts   []string               // grows only
	cur     int                    // index of the dchost host calls go to
	conns   map[int]*netio.MuxConn // live connection per host index
	dialing map[int]*dialing       // dial under way per host index
	routes  map[routeKey]receiverRoute
	spreads map[string]*spread // MultiSchedule: by receiver group address
	// open is every connection the client made that has not closed,
	// those above and those it left but whose calls still wait (a
	// node's go-away, a replaced spread): Close closes them all.
	open   map[*netio.MuxConn]struct{}
	closed bool

	// stop ends the dials under way at Close: they run on goroutines of
	// their own, which no caller's ctx bounds.
	stop      context.Context
	stopDials context.CancelFunc
}

// dialing lets calls that find a dial under way wait for it instead of
// opening connections of their own. The dial runs on a goroutine of its
// own, so each caller, the one that started it too, waits for it or its
// own ctx, whichever ends first; a connection made after its caller left
// serves the next calls.
type dialing struct {
	done chan struct{}
	err  error // valid after done
}

// New returns a Client; it connects lazily, on the first call.
func New(opts Options) (*Client, error) {
	if len(opts.Hosts) == 0 {
		return nil, errors.New("client: no hosts (set dchost or DCHOST)")
	}
	hosts := make([]string, len(opts.Hosts))
	for i, h := range opts.Hosts {
		host, port, err := def.SplitHostPort(h, def.DefaultRPCPort)
		if err != nil {
			return nil, fmt.Errorf("client: dchost %q: %w", h, err)
		}
		hosts[i] = net.JoinHostPort(host, strconv.Itoa(port))
	}
	if opts.WatchTime == 0 {
		opts.WatchTime = def.DefaultWatchTime
	}
	if opts.MaxMessageSize == 0 {
		opts.MaxMessageSize = def.DefaultMaxMessageSize
	}
	if opts.DialTimeout == 0 {
		opts.DialTimeout = 3 * time.Second
	}
	if opts.CacheEntries == 0 {
		opts.CacheEntries = def.DefaultCacheEntries
	}
	if opts.FindServer {
		opts.LoadBalance = true
	}
	if opts.CacheTime == 0 {
		opts.CacheTime = def.DefaultCacheTime
	}
	c := &Client{opts: opts, nDC: len(hosts), hosts: hosts, conns: make(map[int]*netio.MuxConn), dialing: make(map[int]*dialing),
		cache: newLevelCache(opts.CacheEntries), routes: map[routeKey]receiverRoute{}, spreads: map[string]*spread{},
		open: map[*netio.MuxConn]struct{}{}}
	c.stop, c.stopDials = context.WithCancel(context.Background())
	if opts.HostSelect {
		c.cur = rand.IntN(len(hosts))
	}
	return c, nil
}

// Call runs service of group with payload and returns the service's reply.
// Failures are *netio.Error values carrying the OpenTP1-style code.
func (c *Client) Call(ctx context.Context, group, service string, payload []byte) ([]byte, error) {
	return c.call(ctx, netio.KindCall, group, service, payload)
}

// CallNoReply sends a request whose answer nobody waits for. It returns
// once the request is written to a node, or queued behind another call's
// write on the same connection, which takes it along. It fails 'timed
// out' when ctx's deadline (or WatchTime) passes before that.
func (c *Client) CallNoReply(ctx context.Context, group, service string, payload []byte) error {
	_, err := c.call(ctx, netio.KindCallNoReply, group, service, payload)
	return err
}

// CallTo runs service of group on the node at host (host:port; the port
// defaults to 12000) and nowhere else: OpenTP1's RPC to an explicit
// destination. It is never balanced: the client asks no name lookup and
// tries no other host, and the node serves the call itself or refuses it
// ('no such service group' when the group is not defined there, 'service
// closed' when it is held there), never transferring it to another node.
// host need not be among Options.Hosts.
func (c *Client) CallTo(ctx context.Context, host, group, service string, payload []byte) ([]byte, error) {
	return c.callTo(ctx, netio.KindCall, host, group, service, payload)
}

// CallNoReplyTo is CallNoReply to an explicit destination, as CallTo.
func (c *Client) CallNoReplyTo(ctx context.Context, host, group, service string, payload []byte) error {
	_, err := c.callTo(ctx, netio.KindCallNoReply, host, group, service, payload)
	return err
}

func (c *Client) callTo(ctx context.Context, kind netio.Kind, host, group, service string, payload []byte) ([]byte, error) {
	h, timeout, err := c.header(ctx, kind, group, service, payload)
	if err != nil {
		return nil, err
	}
	ctx, cancel := watched(ctx, timeout)
	defer cancel()
	h.Flags = netio.FlagDestination
	hostName, port, err := def.SplitHostPort(host, def.DefaultRPCPort)
	if err != nil {
		return nil, &netio.Error{Code: netio.CodeNetworkDown, Message: fmt.Sprintf("destination %q: %v", host, err)}
	}
	addr := net.JoinHostPort(hostName, strconv.Itoa(port))
	idx := c.hostIndex(addr)
	for attempt := 0; ; attempt++ {
		mc, err := c.connFor(ctx, idx)
		if err != nil {
			if ctx.Err() != nil {
				return nil, notSent(ctx)
			}
			return nil, &netio.Error{Code: netio.CodeNetworkDown, Message: fmt.Sprintf("destination %s: %v", addr, err)}
		}
		id, w, sent, err := c.start(ctx, idx, mc, h, group, service, payload, timeout)
		if !sent {
			if errors.Is(err, netio.ErrGoingAway) && attempt < 3 {
				// It did not leave, and the node hands its port over:
				// a new connection reaches the process taking it, as
				// deliver does.
				continue
			}
			if errors.Is(err, netio.ErrWriteTimeout) {
				return nil, timedOut(err)
			}
			if ctx.Err() != nil {
				return nil, notSent(ctx)
			}
			return nil, &netio.Error{Code: netio.CodeNetworkDown, Message: fmt.Sprintf("destination %s: %v", addr, err)}
		}
		return finish(ctx, mc, id, w, err, timeout)
	}
}

// header checks a call and makes its frame header; timeout is how long the
// caller waits (0: for ever).
func (c *Client) header(ctx context.Context, kind netio.Kind, group, service string, payload []byte) (netio.Header, time.Duration, error) {
	if len(payload) > c.opts.MaxMessageSize {
		return netio.Header{}, 0, &netio.Error{Code: netio.CodeMessageTooBig,
			Message: fmt.Sprintf("%d bytes, limit %d", len(payload), c.opts.MaxMessageSize)}
	}
	if len(group) > netio.MaxNameLen || len(service) > netio.MaxNameLen {
		return netio.Header{}, 0, &netio.Error{Code: netio.CodeProtocol, Message: "group or service name longer than 255 bytes"}
	}
	timeout := c.opts.WatchTime
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
		if timeout <= 0 {
			return netio.Header{}, 0, &netio.Error{Code: netio.CodeTimedOut, Message: "the caller's deadline passed before the call was sent"}
		}
	}
	h := netio.Header{Kind: kind}
	if timeout > 0 {
		h.TimeoutMs = uint32(min(timeout.Milliseconds()+1, 1<<32-1))
	}
	return h, timeout, nil
}

// watchGrace is how much longer than WatchTime a call without a deadline
// of its own waits: the node answers 'timed out' itself at WatchTime, and
// its answer, not the client's, is what the caller should see.
const watchGrace = time.Second

// watchKey marks a ctx whose deadline is WatchTime's (watched).
type watchKey struct{}

// watched bounds a call whose ctx has no deadline by timeout (WatchTime)
// and watchGrace, from now: every step of it, the dials, lookups and a
// spread's fill before it is sent as well as the wait for its answer.
// Bounded at the wait alone, a call behind a receivers lookup that hung
// took 6 s with a WatchTime of 100 ms.
func watched(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok || timeout <= 0 {
		return ctx, func() {}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout+watchGrace)
	return context.WithValue(ctx, watchKey{}, true), cancel
}

// byWatch reports whether ctx's deadline is WatchTime's, not the caller's.
func byWatch(ctx context.Context) bool { return ctx.Value(watchKey{}) != nil }

func (c *Client) call(ctx context.Context, kind netio.Kind, group, service string, payload []byte) ([]byte, error) {
	h, timeout, err := c.header(ctx, kind, group, service, payload)
	if err != nil {
		return nil, err
	}
	ctx, cancel := watched(ctx, timeout)
	defer cancel()
	switch {
	case c.opts.Balanced:
		h.Flags = netio.FlagBalanced
	case c.opts.SchedulerDirect:
		h.Flags = netio.FlagSchedulerDirect
	}
	if c.opts.LoadBalance {
		if reply, err, done := c.callBalanced(ctx, h, group, service, payload, timeout); done {
			return reply, err
		}
	}
	var lastErr error
	for range c.nDC {
		idx, mc, err := c.pick(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil, notSent(ctx) // its time is up: no other host
			}
			lastErr = err
			continue
		}
		reply, err, sent := c.deliver(ctx, idx, mc, h, group, service, payload, timeout)
		if !sent {
			if errors.Is(err, netio.ErrWriteTimeout) {
				return nil, timedOut(err) // its time is up: no other host
			}
			if ctx.Err() != nil {
				return nil, notSent(ctx)
			}
			lastErr = err
			continue
		}
		return reply, err
	}
	return nil, &netio.Error{Code: netio.CodeNetworkDown, Message: lastErr.Error()}
}

// deliver sends a call to the node of host idx, whose own port's
// connection is mc, and waits for its answer: on the connection of the
// group's receivers when they are known (multi.go), following a 'wrong
// receiver' answer there, and on a new connection when the node asks the
// client to leave the one it used (it hands its port over). sent is false
// when the call certainly did not leave, as for start.
func (c *Client) deliver(ctx context.Context, idx int, mc *netio.MuxConn, h netio.Header, group, service string,
	payload []byte, timeout time.Duration) (reply []byte, err error, sent bool) {
	for attempt := 0; ; attempt++ {
		sidx, smc := c.routed(ctx, idx, mc, group)
		if ctx.Err() != nil {
			// Its ctx ended while the route was learned or dialled: it
			// was not sent, and goes nowhere else.
			return nil, notSent(ctx), false
		}
		id, w, sent, err := c.start(ctx, sidx, smc, h, group, service, payload, timeout)
		if !sent {
			if errors.Is(err, netio.ErrGoingAway) && attempt < 3 {
				if mc, err = c.connFor(ctx, idx); err == nil {
					continue
				}
			}
			return nil, err, false
		}
		reply, err := finish(ctx, smc, id, w, err, timeout)
		var te *netio.Error
		if errors.As(err, &te) && te.Code == netio.CodeWrongReceiver && attempt < 3 {
			// It did not run: ask where the group is received, send it there.
			if _, lerr := c.learnRoute(ctx, idx, mc, group); lerr == nil {
				continue
			}
		}
		return reply, err, true
	}
}

// start sends a call on mc, the connection to host idx; w waits for its
// answer (nil for a call without one). sent is false when the frame
// certainly did not leave: the connection is dropped and the call may go to
// another host, unless its deadline passed first (netio.ErrWriteTimeout:
// the connection goes on, or closed itself if a write failed) or its ctx
// ended before it was handed over (ctx's error: the connection goes on,
// and the call goes nowhere else). A call that
// may have been written is never sent again: it fails 'network down' if
// its connection breaks. sendBy(ctx, timeout) bounds the call's stay in mc.Call, which
// returns by then even when the node does not read (zero: none).
//
// A frame that carries a timeout (h.TimeoutMs, from header) is given what
// is left of ctx's deadline now, not what was left when the call began: a
// dial or a receivers lookup since must not let the node work for a
// caller that has gone. A call with less than 1 ms left is not sent
// (netio.ErrWriteTimeout).
func (c *Client) start(ctx context.Context, idx int, mc *netio.MuxConn, h netio.Header, group, service string, payload []byte,
	timeout time.Duration) (id uint64, w *waiter, sent bool, err error) {
	if err := ctx.Err(); err != nil {
		// Its caller has gone (cancelled, or out of time): it is not
		// sent, and its connection is not at fault.
		return 0, nil, false, err
	}
	by := sendBy(ctx, timeout)
	if dl, ok := ctx.Deadline(); ok && h.TimeoutMs != 0 {
		if byWatch(ctx) {
			dl = dl.Add(-watchGrace) // the node's limit is WatchTime's, less what the steps before took
		}
		left := time.Until(dl).Milliseconds() // rounded down: never more than the caller has
		if left < 1 {
			return 0, nil, false, errLate{}
		}
		h.TimeoutMs = uint32(min(left, 1<<32-1))
	}
	var a netio.Answerer
	if h.Kind != netio.KindCallNoReply {
		w = waiterPool.Get().(*waiter)
		a = w
	}
	id, sent, err = mc.Call(h, group, service, payload, by, a)
	if !sent {
		if w != nil {
			waiterPool.Put(w) // never answered: reusable
		}
		switch {
		case errors.Is(err, netio.ErrGoingAway):
			c.retire(idx, mc) // its calls still get their answers
		case errors.Is(err, netio.ErrWriteTimeout):
			// The caller's time ran out; the connection is not broken
			// by it (a write that failed closed it, and OnClose forgot it).
		default:
			c.drop(idx, mc, err)
		}
		return 0, nil, false, err
	}
	return id, w, true, err
}

// errLate is a call whose deadline left it too little to be sent: as
// netio.ErrWriteTimeout, it fails 'timed out' and tries no other host.
type errLate struct{}

func (errLate) Error() string { return "the caller's deadline passed before the call was sent" }
func (errLate) Unwrap() error { return netio.ErrWriteTimeout }

// sendBy is how long a call may take to be sent: the caller's deadline,
// or (without one) as long as wait waits; zero: for ever.
func sendBy(ctx context.Context, timeout time.Duration) time.Time {
	if dl, ok := ctx.Deadline(); ok {
		return dl
	}
	if timeout > 0 {
		return time.Now().Add(timeout + watchGrace)
	}
	return time.Time{}
}

// sentErr is the error of a call that may have been sent when its write
// met err: 'timed out' when its deadline passed while it was written (the
// rest goes on), else 'network down'. Either way it may run.
func sentErr(err error) error {
	if errors.Is(err, netio.ErrWriteTimeout) {
		return timedOut(err)
	}
	return &netio.Error{Code: netio.CodeNetworkDown, Message: err.Error()}
}

// notSent is the error of a call whose caller's ctx ended before the call
// was sent (while its connection was dialled, say): it did not run, and
// goes to no other host. A cancelled call gets ctx's error, as in wait.
func notSent(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return ctx.Err()
	}
	if byWatch(ctx) {
		return &netio.Error{Code: netio.CodeTimedOut, Message: "watch_time passed before the call was sent"}
	}
	return &netio.Error{Code: netio.CodeTimedOut, Message: "the caller's deadline passed before the call was sent"}
}

// timedOut is a call whose deadline passed before it was (all) written.
func timedOut(err error) error {
	return &netio.Error{Code: netio.CodeTimedOut, Message: err.Error()}
}

// finish waits for the answer of a call start sent; err is start's.
func finish(ctx context.Context, mc *netio.MuxConn, id uint64, w *waiter, err error, timeout time.Duration) ([]byte, error) {
	if w == nil {
		if err != nil {
			return nil, sentErr(err)
		}
		return nil, nil
	}
	return wait(ctx, mc, id, w, timeout)
}

// pick returns the connection of the current host, dialing it if needed
// (waiting at most until ctx ends). With HostChange every call advances to
// the next host.
func (c *Client) pick(ctx context.Context) (int, *netio.MuxConn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return 0, nil, errors.New("client closed")
	}
	idx := c.cur
	if c.opts.HostChange {
		c.cur = (c.cur + 1) % c.nDC
	}
	c.mu.Unlock()
	mc, err := c.connFor(ctx, idx)
	return idx, mc, err
}

// connFor returns the connection to host idx, dialing it if needed. It
// waits for the dial until ctx ends, and then fails with ctx's error (the
// dial goes on for the calls after it).
func (c *Client) connFor(ctx context.Context, idx int) (*netio.MuxConn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errors.New("client closed")
	}
	if mc := c.conns[idx]; mc != nil {
		c.mu.Unlock()
		return mc, nil
	}
	d := c.dialing[idx]
	if d == nil { // else another call is dialling: share its outcome
		d = &dialing{done: make(chan struct{})}
		c.dialing[idx] = d
		go c.dial(idx, c.hosts[idx], d)
	}
	c.mu.Unlock()
	select {
	case <-d.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if d.err != nil {
		return nil, d.err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("client closed")
	}
	if mc := c.conns[idx]; mc != nil {
		return mc, nil
	}
	return nil, errors.New("connection closed by the node")
}

// dial connects to host idx for the calls waiting on d, bounded by
// DialTimeout and Close, never by a caller's ctx: the connection is the
// client's, not one call's.
func (c *Client) dial(idx int, addr string, d *dialing) {
	dialer := net.Dialer{Timeout: c.opts.DialTimeout}
	nc, err := dialer.DialContext(c.stop, "tcp", addr)
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.dialing, idx)
	defer close(d.done)
	if err != nil {
		d.err = err
		if c.cur == idx {
			c.cur = (idx + 1) % c.nDC
		}
		return
	}
	if c.closed {
		nc.Close()
		d.err = errors.New("client closed")
		return
	}
	mc := netio.NewMuxConn(nc, netio.MuxOptions{
		MaxPayload: c.maxPayload(),
		OnClose: func(mc *netio.MuxConn, err error) {
			if errors.Is(err, netio.ErrGoingAway) {
				// The clean end of a go-away (its last answer came):
				// the node is fine and the next call dials it again.
				c.retire(idx, mc)
			} else {
				c.forget(idx, mc)
			}
			c.closedConn(mc)
		},
		OnGoAway: func(mc *netio.MuxConn) { c.retire(idx, mc) },
	})
	c.conns[idx] = mc
	c.open[mc] = struct{}{} // an OnClose meanwhile waits for c.mu
}

// closedConn forgets a connection that closed: Close has nothing to close.
func (c *Client) closedConn(mc *netio.MuxConn) {
	c.mu.Lock()
	delete(c.open, mc)
	c.mu.Unlock()
}

// maxPayload bounds the answers read on the client's connections: error
// messages ride in the payload too, so it allows a little slack over
// MaxMessageSize. A larger answer fails only its own call ('message too
// big').
func (c *Client) maxPayload() int { return c.opts.MaxMessageSize + 64<<10 }

// advance moves off a host that failed, unless another call already did.
func (c *Client) advance(failed int) {
	c.mu.Lock()
	if c.cur == failed {
		c.cur = (failed + 1) % c.nDC
	}
	c.mu.Unlock()
}

// forget drops a connection that closed from the host table and moves off
// its host.
func (c *Client) forget(idx int, mc *netio.MuxConn) {
	c.mu.Lock()
	if c.conns[idx] == mc {
		delete(c.conns, idx)
	}
	c.mu.Unlock()
	c.advance(idx)
}

// retire forgets a connection the node asked the client to leave (it
// hands its port to a new process), without moving off the host: the next
// call dials a new connection, which the new process accepts.
func (c *Client) retire(idx int, mc *netio.MuxConn) {
	c.mu.Lock()
	if c.conns[idx] == mc {
		delete(c.conns, idx)
	}
	c.mu.Unlock()
}

// drop forgets a broken connection and fails the calls waiting on it.
func (c *Client) drop(idx int, mc *netio.MuxConn, err error) {
	c.forget(idx, mc)
	mc.Close(err)
}

// Close closes every connection; calls in flight fail with 'network down'.
// That includes the connections the client left (a node's go-away, a
// replaced spread) whose calls still wait for their answers.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	c.stopDials()
	c.conns = map[int]*netio.MuxConn{}
	c.spreads = map[string]*spread{}
	open := make([]*netio.MuxConn, 0, len(c.open))
	for mc := range c.open {
		open = append(open, mc)
	}
	c.mu.Unlock()
	for _, mc := range open {
		mc.Close(errClientClosed) // its OnClose takes c.mu: not held
	}
	return nil
}

var errClientClosed = errors.New("client closed")

type result struct {
	payload []byte
	err     error
}

// waiter is one call waiting for its answer: the netio.Answerer the
// connection hands it to.
type waiter struct{ ch chan result }

var waiterPool = sync.Pool{New: func() any { return &waiter{ch: make(chan result, 1)} }}

func (w *waiter) Answer(f netio.Frame, err error) {
	switch {
	case err != nil:
		msg := err.Error()
		if errors.Is(err, netio.ErrClosedByPeer) {
			msg = "connection closed by the node"
		}
		w.ch <- result{err: &netio.Error{Code: netio.CodeNetworkDown, Message: msg}}
	case f.Kind == netio.KindReply:
		w.ch <- result{payload: f.Payload}
	case f.Kind == netio.KindError:
		w.ch <- result{err: &netio.Error{Code: f.Code, Message: string(f.Payload)}}
	default:
		w.ch <- result{err: &netio.Error{Code: netio.CodeProtocol, Message: "unexpected " + f.Kind.String() + " frame"}}
	}
}

// wait waits for w's answer on mc, for ctx, or (when ctx has no deadline)
// for timeout and a little more.
func wait(ctx context.Context, mc *netio.MuxConn, id uint64, w *waiter, timeout time.Duration) ([]byte, error) {
	limit := timeout // for the message: what the caller had when the call began (header)
	var timer <-chan time.Time
	dl, hasDeadline := ctx.Deadline()
	if timeout > 0 && (!hasDeadline || time.Until(dl) > timeout+watchGrace) {
		// No deadline, or one longer than this wait's own (a lookup's,
		// under WatchTime's or the caller's deadline): the node answers
		// 'timed out' itself at the limit; wait a little longer so its
		// answer, not ours, is what the caller sees.
		t := time.NewTimer(timeout + watchGrace)
		defer t.Stop()
		timer = t.C
	}
	select {
	case r := <-w.ch:
		waiterPool.Put(w)
		return r.payload, r.err
	case <-ctx.Done():
	case <-timer:
	}
	if !mc.Forget(id) {
		// Its answer came as the caller left: the reader (or a close)
		// took it off the connection and hands it to w now, without
		// blocking. It is the call's result, not 'timed out': the
		// service's reply is in hand.
		r := <-w.ch
		waiterPool.Put(w)
		return r.payload, r.err
	}
	// Never answered now; the waiter is left to the garbage collector.
	if ctx.Err() == context.Canceled {
		return nil, ctx.Err()
	}
	whose := "the caller's deadline"
	switch {
	case timer != nil && hasDeadline && !byWatch(ctx):
		whose = "the lookup's own limit, within the caller's deadline"
	case timer != nil || byWatch(ctx):
		whose = "watch_time, and no 'timed out' from the node either"
	}
	return nil, &netio.Error{Code: netio.CodeTimedOut, Message: fmt.Sprintf("no answer within %v (%s)", roundLimit(limit), whose)}
}

// roundLimit shows a limit as people set it: time.Until a 1 s deadline is
// a hair under 1 s by the time the call is sent.
func roundLimit(d time.Duration) time.Duration {
	if d >= 50*time.Millisecond {
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}
