package peers

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/netio"
	"tpsched/netio/rpcport"
)

// This file is the peer hello: how a connection between two nodes proves,
// both ways, that each end knows the cluster key, so that the receiving
// node may trust the hop mark (FlagForwarded) of the calls and requests
// that follow. The dialer's side is Handshake (every connection of the
// Pool opens with it); the node's side is an Acceptor's Accept. All four steps are KindAnnounce frames; the payload's first
// byte is the step:
//
//	dialer -> node  hello      group = dialer's node id; payload: 1, nonce D (32 bytes)
//	node -> dialer  challenge  group = node's node id;   payload: 2, nonce N (32 bytes), MAC("node")
//	dialer -> node  proof                                payload: 3, MAC("dialer")
//	node -> dialer  welcome                              payload: 4
//
//	MAC(role) = HMAC-SHA256(cluster_key, "tpsched peer hello v2" 0 role 0
//	            D N len(dialer) dialer len(node) node)
//
// The node checks the proof against the nonce it has just made, so a
// recorded hello replayed on another connection meets a new nonce and
// fails; the dialer checks the challenge against its own fresh nonce and
// the node id it meant to reach, so it knows it reached that node and that
// the node has the key. The two MACs differ in their role, so neither side
// can answer the other with what it was sent. Without a cluster_key the
// MACs are empty and nothing is authenticated: the steps still run, and
// the node trusts whatever id the dialer gives (the start-up warning says
// so). Anything out of order, malformed or wrongly MACed is refused: the
// node answers 'protocol error', counts tpsched_peer_hellos_refused_total,
// and closes the connection. The dialer waits for the welcome before it
// sends a call, so a refused hello is a communication error and its calls
// may go elsewhere.

// Hello steps, the first payload byte.
const (
	helloStepHello     = 1
	helloStepChallenge = 2
	helloStepProof     = 3
	helloStepWelcome   = 4
)

const (
	helloNonceSize = 32
	helloMACSize   = sha256.Size
	// helloTimeout bounds the dial and the whole handshake on the dialer.
	helloTimeout = 2 * time.Second
)

// helloMAC is the MAC one side of the handshake proves the key with.
func helloMAC(key []byte, role string, dialerNonce, nodeNonce []byte, dialer, node string) []byte {
	if len(key) == 0 {
		return nil
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte("tpsched peer hello v2\x00" + role + "\x00"))
	m.Write(dialerNonce)
	m.Write(nodeNonce)
	m.Write([]byte{byte(len(dialer))})
	m.Write([]byte(dialer))
	m.Write([]byte{byte(len(node))})
	m.Write([]byte(node))
	return m.Sum(nil)
}

func helloFrame(dst []byte, name string, step byte, parts ...[]byte) []byte {
	payload := []byte{step}
	for _, p := range parts {
		payload = append(payload, p...)
	}
	return netio.AppendFrame(dst, netio.Header{Kind: netio.KindAnnounce}, name, "", payload)
}

// ErrHelloRefused is a handshake that failed: the other end does not have
// our key (or has one we lack), or is not the node we meant.
var ErrHelloRefused = errors.New("peer hello refused")

// dial connects to the RPC port of node at addr as self and runs the
// hello. It returns the connection and the reader that read the node's
// side of the handshake, for the calls that follow. ctx ending ends the
// connect and the hello at once (the pool stops), not at their bounds.
func dial(ctx context.Context, addr, self, node string, key []byte, userTimeout time.Duration) (net.Conn, *netio.FrameReader, error) {
	d := peerDialer(userTimeout)
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	// Closed, not given a deadline: the hello sets its own deadline
	// first, which could undo one set before it.
	cut := context.AfterFunc(ctx, func() { nc.Close() })
	fr, err := Handshake(nc, self, node, key)
	if !cut() && err == nil {
		// ctx ended as the hello did: its close may have come after.
		err = ctx.Err()
	}
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, fr, nil
}

// Handshake runs the dialer's side of the hello on nc, as node self that
// means to reach node, bounded by helloTimeout. It returns the reader that
// read the node's side, which the connection's calls go on with (its
// buffer may hold what followed). A refusal wraps ErrHelloRefused.
func Handshake(nc net.Conn, self, node string, key []byte) (*netio.FrameReader, error) {
	_ = nc.SetDeadline(time.Now().Add(helloTimeout))
	defer nc.SetDeadline(time.Time{})
	var dn [helloNonceSize]byte
	_, _ = rand.Read(dn[:])
	if _, err := nc.Write(helloFrame(nil, self, helloStepHello, dn[:])); err != nil {
		return nil, fmt.Errorf("hello: %w", err)
	}
	fr := netio.NewFrameReader(nc, 4<<10)
	body, group, err := readHelloStep(fr, helloStepChallenge)
	if err != nil {
		return nil, err
	}
	switch macSize := len(body) - helloNonceSize; {
	case len(key) > 0 && macSize == 0:
		return nil, fmt.Errorf("%w: node %s has no cluster_key", ErrHelloRefused, node)
	case len(key) == 0 && macSize == helloMACSize:
		return nil, fmt.Errorf("%w: node %s has a cluster_key, this node none", ErrHelloRefused, node)
	case macSize != 0 && macSize != helloMACSize:
		return nil, fmt.Errorf("%w: challenge of %d bytes", ErrHelloRefused, len(body))
	}
	if string(group) != node {
		return nil, fmt.Errorf("%w: reached node %q, not %q", ErrHelloRefused, group, node)
	}
	nn := body[:helloNonceSize]
	if !hmac.Equal(body[helloNonceSize:], helloMAC(key, "node", dn[:], nn, self, node)) {
		return nil, fmt.Errorf("%w: node %s does not prove our cluster_key", ErrHelloRefused, node)
	}
	if _, err := nc.Write(helloFrame(nil, "", helloStepProof, helloMAC(key, "dialer", dn[:], nn, self, node))); err != nil {
		return nil, fmt.Errorf("hello proof: %w", err)
	}
	if _, _, err := readHelloStep(fr, helloStepWelcome); err != nil {
		return nil, err
	}
	return fr, nil
}

// readHelloStep reads the node's next hello frame, which must be step.
func readHelloStep(fr *netio.FrameReader, step byte) (body, group []byte, err error) {
	f, _, err := fr.Read(nil)
	if err != nil {
		return nil, nil, fmt.Errorf("hello: waiting for step %d: %w", step, err)
	}
	switch {
	case f.Kind == netio.KindError:
		return nil, nil, fmt.Errorf("%w: %v: %s", ErrHelloRefused, f.Code, f.Payload)
	case f.Kind != netio.KindAnnounce || len(f.Payload) == 0 || f.Payload[0] != step:
		return nil, nil, fmt.Errorf("%w: want hello step %d, got a %v frame", ErrHelloRefused, step, f.Kind)
	}
	return f.Payload[1:], f.Group, nil
}

// Acceptor is the node's side of the hello, for every connection of its
// RPC port. Accept runs on the connection's event loop and never blocks;
// the state of a connection's hello is its rpcport.Conn context, which the
// event loop alone touches.
type Acceptor struct {
	self    string // this node's id
	key     []byte // cluster_key; nil: none, nothing is authenticated
	refused *metrics.Counter
	log     *slog.Logger
}

// NewAcceptor is the hello of node self with cluster key key (nil for
// none); refused counts the hellos it refuses
// (tpsched_peer_hellos_refused_total).
func NewAcceptor(self string, key []byte, refused *metrics.Counter, log *slog.Logger) *Acceptor {
	return &Acceptor{self: self, key: key, refused: refused, log: log}
}

// peerHello is the node's side of the hello on one connection (its
// rpcport.Conn context); the event loop alone touches it.
type peerHello struct {
	dialer      string
	dialerNonce [helloNonceSize]byte
	nodeNonce   [helloNonceSize]byte
	trusted     bool // the proof checked out: calls marked forwarded came from dialer
	refused     bool // the hello failed; the connection is closing
}

// Accept takes one hello step on c; see the protocol above.
func (a *Acceptor) Accept(c *rpcport.Conn, f *netio.Frame) {
	st, _ := c.Context().(*peerHello)
	if st != nil && st.refused {
		return
	}
	if len(f.Payload) == 0 {
		a.refuse(c, st, string(f.Group), "empty hello frame")
		return
	}
	step, body := f.Payload[0], f.Payload[1:]
	switch {
	case step == helloStepHello && st == nil:
		if len(body) != helloNonceSize || len(f.Group) == 0 {
			a.refuse(c, st, string(f.Group), "malformed hello")
			return
		}
		st = &peerHello{dialer: string(f.Group)}
		copy(st.dialerNonce[:], body)
		_, _ = rand.Read(st.nodeNonce[:])
		c.SetContext(st)
		c.SendNow(helloFrame(nil, a.self, helloStepChallenge, st.nodeNonce[:],
			helloMAC(a.key, "node", st.dialerNonce[:], st.nodeNonce[:], st.dialer, a.self)))
	case step == helloStepProof && st != nil && !st.trusted:
		want := helloMAC(a.key, "dialer", st.dialerNonce[:], st.nodeNonce[:], st.dialer, a.self)
		if len(body) != len(want) || !hmac.Equal(body, want) {
			a.refuse(c, st, st.dialer, "wrong proof of the cluster_key")
			return
		}
		st.trusted = true
		c.SendNow(helloFrame(nil, "", helloStepWelcome))
	default:
		a.refuse(c, st, string(f.Group), fmt.Sprintf("hello step %d out of order", step))
	}
}

// refuse answers a failed hello, counts it and closes c. The log line
// comes at the 1st, 2nd, 4th, 8th... refusal: loud enough, never a flood
// an attacker can cause.
func (a *Acceptor) refuse(c *rpcport.Conn, st *peerHello, claimed, why string) {
	if st == nil {
		st = &peerHello{}
		c.SetContext(st)
	}
	st.refused, st.trusted = true, false
	a.refused.Inc()
	if k := a.refused.Get(); k&(k-1) == 0 {
		a.log.Warn("peer hello refused; its calls are not trusted as forwarded", "why", why,
			"claimed_node", claimed, "remote", c.RemoteAddr(), "refused_so_far", k)
	}
	c.SendNow(netio.AppendError(nil, 0, netio.CodeProtocol, "peer hello refused: "+why))
	_ = c.Close()
}

// Hop is the node the call or request f on c was transferred from: the
// dialer its connection's hello proved, when f bears the hop mark
// (FlagForwarded). "" when it was not transferred, or its hop mark cannot
// be trusted (no completed hello on c). It runs on c's event loop.
func Hop(c *rpcport.Conn, f *netio.Frame) string {
	if f.Flags&netio.FlagForwarded == 0 {
		return ""
	}
	if st, ok := c.Context().(*peerHello); ok && st.trusted {
		return st.dialer
	}
	return ""
}
