package scd

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"tpsched/netio"
	"tpsched/scd/def"
)

// This file carries the routing manager's requests between nodes: "decide
// a start" to the deciding node, "start a server" to the node it chose,
// "quiesce", "resume", "refresh" and "read the policy again" to every
// node. Each is a name lookup (KindNameLookup) whose service names the
// request, sent with the hop mark on a connection opened with the peer
// hello (hello.go), so a node takes them only from nodes that proved the
// cluster key; the answer is a reply, or an error frame with a code. One
// connection per peer, dialled on first use and again after a failure.

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

// wlmPeers are this node's connections for the routing manager's requests.
type wlmPeers struct {
	self string
	key  []byte

	mu    sync.Mutex
	conns map[string]*netio.MuxConn // by node id
	done  bool
}

func newWLMPeers(self string, key []byte) *wlmPeers {
	return &wlmPeers{self: self, key: key, conns: map[string]*netio.MuxConn{}}
}

// errPeerUnreachable marks a request that could not be sent: it certainly
// did not reach the node.
var errPeerUnreachable = errors.New("node unreachable")

// request sends a request to node at addr and waits for its answer until
// deadline. A communication failure wraps errPeerUnreachable when the
// request was not sent; an error answer is a *netio.Error.
func (p *wlmPeers) request(node, addr, service, group string, payload []byte, deadline time.Time) ([]byte, error) {
	for attempt := 0; ; attempt++ {
		mc, err := p.conn(node, addr)
		if err != nil {
			return nil, fmt.Errorf("node %s (%s): %w: %v", node, addr, errPeerUnreachable, err)
		}
		w := &lookupWaiter{ch: make(chan lookupResult, 1)}
		timeout := uint32(max(time.Until(deadline).Milliseconds(), 1))
		id, sent, err := mc.Call(netio.Header{Kind: netio.KindNameLookup, Flags: netio.FlagForwarded, TimeoutMs: timeout},
			group, service, payload, deadline, w)
		if !sent {
			p.drop(node, mc)
			if attempt == 0 {
				continue // a connection that had closed: dial again once
			}
			return nil, fmt.Errorf("node %s: %w: %v", node, errPeerUnreachable, err)
		}
		t := time.NewTimer(max(time.Until(deadline), time.Millisecond))
		select {
		case r := <-w.ch:
			t.Stop()
			if r.err != nil {
				p.drop(node, mc)
				return nil, fmt.Errorf("node %s: %w", node, r.err)
			}
			if r.f.Kind != netio.KindReply {
				return nil, &netio.Error{Code: r.f.Code, Message: string(r.f.Payload)}
			}
			return r.f.Payload, nil
		case <-t.C:
			mc.Forget(id)
			return nil, &netio.Error{Code: netio.CodeTimedOut, Message: fmt.Sprintf("node %s did not answer %s in time", node, service)}
		}
	}
}

// conn is the connection to node, dialled (with the peer hello) if need be.
func (p *wlmPeers) conn(node, addr string) (*netio.MuxConn, error) {
	p.mu.Lock()
	if p.done {
		p.mu.Unlock()
		return nil, errors.New("this node is stopping")
	}
	mc := p.conns[node]
	p.mu.Unlock()
	if mc != nil && mc.Err() == nil && !mc.GoingAway() && mc.NetConn().RemoteAddr().String() == addr {
		return mc, nil
	}
	nc, fr, err := dialPeer(addr, p.self, node, p.key)
	if err != nil {
		return nil, err
	}
	mc = netio.NewMuxConn(nc, netio.MuxOptions{MaxPayload: def.MaxMaxMessageSize, Reader: fr})
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		mc.Close(errors.New("this node is stopping"))
		return nil, errors.New("this node is stopping")
	}
	if old := p.conns[node]; old != nil && old != mc {
		go old.Close(errors.New("replaced"))
	}
	p.conns[node] = mc
	return mc, nil
}

func (p *wlmPeers) drop(node string, mc *netio.MuxConn) {
	p.mu.Lock()
	if p.conns[node] == mc {
		delete(p.conns, node)
	}
	p.mu.Unlock()
	mc.Close(errors.New("dropped after a failure"))
}

// close closes every connection; requests waiting are answered.
func (p *wlmPeers) close() {
	p.mu.Lock()
	p.done = true
	conns := p.conns
	p.conns = map[string]*netio.MuxConn{}
	p.mu.Unlock()
	for _, mc := range conns {
		mc.Close(errors.New("this node is stopping"))
	}
}
