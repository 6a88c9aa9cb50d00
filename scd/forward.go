package scd

import (
	"bufio"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/netio"
	"tpsched/scd/def"
)

// This file transfers calls to other nodes: one peer per node, each with
// one TCP connection to the node's RPC port that it dials when the first
// call comes and again after a failure. A call is handed to the peer's
// queue from the event loop (never blocking it); the peer's writer goroutine
// sends it under a fresh id, and its reader goroutine answers the original
// caller under the caller's id when the reply comes back.
//
// A connection opens with a hello frame naming this node, tagged with the
// cluster key when there is one, so the other node knows whom forwarded
// calls come from and can trust their hop mark.

// fwdCall is one call on its way to another node.
type fwdCall struct {
	caller    *netio.Conn
	callerID  uint64
	kind      netio.Kind
	group     string
	service   string
	payload   []byte // a copy: the frame's buffer belongs to the event loop
	timeoutMs uint32
	deadline  time.Time // zero: none
	start     time.Time
	tried     []string // nodes tried, for a retry after a communication error
	retries   int      // retries left
}

// errCommunication is a failure to reach a node before the call was sent:
// the call can go elsewhere.
var errCommunication = errors.New("communication error")

// peerQueue bounds the calls waiting for one peer's writer: beyond it a
// call is refused server busy rather than buffered without limit.
const peerQueue = 4096

// peer is the way to one other node.
type peer struct {
	f    *forwarder
	node string
	addr string

	queue    chan *fwdCall
	inFlight atomic.Int64 // calls sent or queued, not yet answered: P2C's second key
	sentTo   *metrics.Counter

	mu      sync.Mutex
	pending map[uint64]*fwdCall
	nextID  uint64
	stop    chan struct{}
}

// forwarder owns the peers.
type forwarder struct {
	self    string
	key     []byte
	log     *slog.Logger
	metrics *metrics.Set
	// reroute is called with a call that could not be sent: it tries
	// another node or answers the caller.
	reroute func(*fwdCall, error)

	mu    sync.Mutex
	peers map[string]*peer // by node id
	wg    sync.WaitGroup
	done  bool
}

func newForwarder(self string, key []byte, log *slog.Logger, set *metrics.Set) *forwarder {
	return &forwarder{self: self, key: key, log: log, metrics: set, peers: map[string]*peer{}}
}

// peerFor returns the peer of node at addr, replacing it if the node moved.
func (f *forwarder) peerFor(node, addr string) *peer {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.peers[node]
	if p != nil && p.addr == addr {
		return p
	}
	if p != nil {
		close(p.stop)
	}
	p = &peer{
		f: f, node: node, addr: addr,
		queue:   make(chan *fwdCall, peerQueue),
		pending: map[uint64]*fwdCall{},
		stop:    make(chan struct{}),
		sentTo:  f.metrics.GetOrCreateCounter(fmt.Sprintf(`tpsched_forwarded_total{to=%q}`, node)),
	}
	f.peers[node] = p
	if !f.done {
		f.wg.Add(1)
		go p.run()
	}
	return p
}

// inFlight is this node's calls in flight to node.
func (f *forwarder) inFlight(node string) int {
	f.mu.Lock()
	p := f.peers[node]
	f.mu.Unlock()
	if p == nil {
		return 0
	}
	return int(p.inFlight.Load())
}

// send hands cl to node's peer; false if its queue is full.
func (f *forwarder) send(node, addr string, cl *fwdCall) bool {
	p := f.peerFor(node, addr)
	select {
	case p.queue <- cl:
		p.inFlight.Add(1)
		return true
	default:
		return false
	}
}

// close stops every peer; calls waiting for an answer are answered
// 'network down'.
func (f *forwarder) close() {
	f.mu.Lock()
	f.done = true
	for _, p := range f.peers {
		close(p.stop)
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// expire answers forwarded calls whose deadline passed without a reply.
func (f *forwarder) expire(now time.Time) {
	f.mu.Lock()
	peers := make([]*peer, 0, len(f.peers))
	for _, p := range f.peers {
		peers = append(peers, p)
	}
	f.mu.Unlock()
	for _, p := range peers {
		var late []*fwdCall
		p.mu.Lock()
		for id, cl := range p.pending {
			if !cl.deadline.IsZero() && now.After(cl.deadline) {
				late = append(late, cl)
				delete(p.pending, id)
			}
		}
		p.mu.Unlock()
		for _, cl := range late {
			p.inFlight.Add(-1)
			answerErr(cl, netio.CodeTimedOut, fmt.Sprintf("no answer from node %s within %v", p.node, roundLimit(cl.deadline.Sub(cl.start))))
		}
	}
}

func answerErr(cl *fwdCall, code netio.Code, msg string) {
	if cl.kind == netio.KindCall {
		_ = cl.caller.Send(netio.AppendError(nil, cl.callerID, code, msg))
	}
}

// helloTag proves a hello comes from a node that knows the cluster key.
func helloTag(key []byte, node string) []byte {
	if len(key) == 0 {
		return nil
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte("tpsched peer hello\x00" + node))
	return m.Sum(nil)
}

// run keeps a connection to the peer while calls come.
func (p *peer) run() {
	defer p.f.wg.Done()
	for {
		var first *fwdCall
		select {
		case <-p.stop:
			p.failQueued(netio.CodeNetworkDown, "node "+p.node+": this node is stopping")
			return
		case first = <-p.queue:
		}
		conn, err := net.DialTimeout("tcp", p.addr, time.Second)
		if err != nil {
			p.f.log.Debug("peer unreachable", "node", p.node, "addr", p.addr, "err", err)
			p.retry(first, err)
			p.retryQueued(err)
			continue
		}
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		p.serve(conn, first)
	}
}

// serve writes calls to conn until it fails or the peer stops; a reader
// goroutine answers the callers.
func (p *peer) serve(conn net.Conn, first *fwdCall) {
	readerDone := make(chan struct{})
	go func() { defer close(readerDone); p.read(conn) }()
	defer func() {
		conn.Close()
		<-readerDone
		p.failPending("connection to node " + p.node + " lost")
	}()
	w := bufio.NewWriterSize(conn, 64<<10)
	buf := netio.AppendFrame(nil, netio.Header{Kind: netio.KindAnnounce}, p.f.self, "", helloTag(p.f.key, p.f.self))
	cl := first
	for {
		if cl != nil {
			buf = p.frame(buf, cl)
		}
		if _, err := w.Write(buf); err != nil {
			return
		}
		buf = buf[:0]
		select {
		case cl = <-p.queue:
			continue
		default:
		}
		if err := w.Flush(); err != nil {
			return
		}
		select {
		case <-p.stop:
			return
		case <-readerDone:
			return
		case cl = <-p.queue:
		}
	}
}

// frame appends cl's frame under a fresh id and remembers it if it is
// answered.
func (p *peer) frame(dst []byte, cl *fwdCall) []byte {
	p.sentTo.Inc()
	timeout := cl.timeoutMs
	if !cl.deadline.IsZero() {
		left := time.Until(cl.deadline).Milliseconds()
		timeout = uint32(max(1, left))
	}
	h := netio.Header{Kind: cl.kind, Flags: netio.FlagForwarded, TimeoutMs: timeout}
	if cl.kind == netio.KindCall {
		p.mu.Lock()
		p.nextID++
		h.ID = p.nextID
		p.pending[h.ID] = cl
		p.mu.Unlock()
	} else {
		p.inFlight.Add(-1) // nobody waits for an answer
	}
	return netio.AppendFrame(dst, h, cl.group, cl.service, cl.payload)
}

// read answers callers from the peer's replies until conn fails.
func (p *peer) read(conn net.Conn) {
	r := bufio.NewReaderSize(conn, 64<<10)
	hdr := make([]byte, netio.HeaderSize)
	var body []byte
	for {
		if _, err := io.ReadFull(r, hdr); err != nil {
			return
		}
		n, err := netio.FrameLen(hdr, def.MaxMaxMessageSize)
		if err != nil {
			p.f.log.Warn("bad frame from node", "node", p.node, "err", err)
			return
		}
		body = append(body[:0], hdr...)
		body = append(body, make([]byte, n-netio.HeaderSize)...)
		if _, err := io.ReadFull(r, body[netio.HeaderSize:]); err != nil {
			return
		}
		f, _, err := netio.Decode(body, def.MaxMaxMessageSize)
		if err != nil {
			return
		}
		p.mu.Lock()
		cl := p.pending[f.ID]
		delete(p.pending, f.ID)
		p.mu.Unlock()
		if cl == nil {
			continue // expired here already
		}
		p.inFlight.Add(-1)
		out := netio.AppendFrame(nil, netio.Header{Kind: f.Kind, Code: f.Code, ID: cl.callerID}, "", "", f.Payload)
		_ = cl.caller.Send(out)
	}
}

// retry sends cl elsewhere after a failure to reach this peer.
func (p *peer) retry(cl *fwdCall, err error) {
	p.inFlight.Add(-1)
	p.f.reroute(cl, fmt.Errorf("node %s (%s): %w: %v", p.node, p.addr, errCommunication, err))
}

func (p *peer) retryQueued(err error) {
	for {
		select {
		case cl := <-p.queue:
			p.retry(cl, err)
		default:
			return
		}
	}
}

func (p *peer) failQueued(code netio.Code, msg string) {
	for {
		select {
		case cl := <-p.queue:
			p.inFlight.Add(-1)
			answerErr(cl, code, msg)
		default:
			return
		}
	}
}

// failPending answers the calls that were sent and will never be answered.
// They are not retried: the other node may have run them.
func (p *peer) failPending(why string) {
	p.mu.Lock()
	lost := p.pending
	p.pending = map[uint64]*fwdCall{}
	p.mu.Unlock()
	for _, cl := range lost {
		p.inFlight.Add(-1)
		answerErr(cl, netio.CodeNetworkDown, why)
	}
}

// peerIdentity is what a verified hello leaves on a connection.
type peerIdentity struct{ node string }

// acceptHello checks a hello frame and marks c as coming from that node.
func (n *Node) acceptHello(c *netio.Conn, f *netio.Frame) {
	node := string(f.Group)
	if key := n.clusterKey(); len(key) > 0 && !hmac.Equal(f.Payload, helloTag(key, node)) {
		n.helloRefused.Inc()
		n.log.Warn("peer hello without a valid cluster_key tag; its calls are not trusted as forwarded",
			"node", node, "remote", c.RemoteAddr())
		return
	}
	c.SetContext(&peerIdentity{node: node})
}

// forwardedFrom is the node a call was transferred from, "" if it was not
// (or its hop mark cannot be trusted).
func forwardedFrom(c *netio.Conn, f *netio.Frame) string {
	if f.Flags&netio.FlagForwarded == 0 {
		return ""
	}
	if id, ok := c.Context().(*peerIdentity); ok {
		return id.node
	}
	return ""
}
