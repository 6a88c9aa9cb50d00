package cluster

import (
	"net"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/netio"
	"tpsched/netio/rpcport"
	"tpsched/scd/call"
)

// This file is the node's part in receiver groups (OpenTP1's grouped
// multi-scheduler daemons, scdsvcdef's scdmulti -g NAME -m COUNT -p PORT):
// the RPC port runs each group's receiving sockets on its own port; a user
// server bound to a group (usr scdmulti -g NAME) has its calls taken there
// and only there, and the group's sockets take no other server's calls. A
// call that comes to the wrong group is answered 'wrong receiver' with the
// right address; it did not run, so a sender may resend it there (the Go
// client and the peer pool do). A call without an answer is served where
// it came, since nobody would hear a refusal, and counted as misdirected.
// A receivers lookup tells a sender a group's address and receiving
// sockets, for multi_schedule.

// Receivers is the receiver groups' stage and lookup.
type Receivers struct {
	self    string
	local   Local
	metrics *metrics.Set
}

// NewReceivers is the receiver groups of node self.
func NewReceivers(self string, local Local, set *metrics.Set) *Receivers {
	return &Receivers{self: self, local: local, metrics: set}
}

// receiverOf is the receiver group that takes g's calls ("" the default
// group; a group this node does not define is taken there too).
func receiverOf(g Group, ok bool) string {
	if !ok {
		return ""
	}
	return g.Def().ReceiverGroup
}

// Route is the stage: it refuses, with 'wrong receiver' and the right
// address, a call that came on another receiver group than the one that
// takes its service group's calls. A call without an answer cannot be told
// where to go: it is taken where it came (its bytes were read there
// already) and counted as misdirected.
func (rv *Receivers) Route(_ call.Caller, from call.From, f *netio.Frame) (bool, netio.Code, string) {
	c, ok := from.Conn.(portConn)
	if !ok {
		return false, 0, "" // not from a receiving socket: nothing to tell
	}
	here, want := c.ReceiverGroup(), receiverOf(rv.local.Group(string(f.Group)))
	if here == want {
		return false, 0, ""
	}
	if f.Kind == netio.KindCallNoReply {
		rv.metrics.GetOrCreateCounter(`tpsched_receiver_misdirected_total{receiver_group="` + labelOf(here) + `"}`).Inc()
		return false, 0, ""
	}
	rv.metrics.GetOrCreateCounter(`tpsched_requests_refused_total{reason="wrong_receiver"}`).Inc()
	msg := string(f.Group) + " is received on " + rv.addr(c.Port(), want)
	if want != "" {
		msg += " (receiver group " + want + ")"
	}
	return true, netio.CodeWrongReceiver, msg + ", not on receiver group " + labelOf(here) + " (" + rv.addr(c.Port(), here) + ")"
}

// portConn is a connection of the RPC port, which knows the addresses of
// its port's receiver groups (rpcport.Conn).
type portConn interface {
	call.Conn
	Port() *rpcport.Port
}

func labelOf(receiverGroup string) string {
	if receiverGroup == "" {
		return "default"
	}
	return receiverGroup
}

// addr is the address a sender reaches the named receiver group of port p
// on: the advertised RPC host with the group's port.
func (rv *Receivers) addr(p *rpcport.Port, name string) string {
	addr, ok := p.GroupAddr(name)
	if !ok {
		return "?"
	}
	_, port, _ := net.SplitHostPort(addr)
	host, _, _ := net.SplitHostPort(AdvertisedAddr(p, rv.self))
	return net.JoinHostPort(host, port)
}

// Answer answers a receivers lookup (netio.LookupReceivers) for this node
// alone, on the event loop.
func (rv *Receivers) Answer(c *rpcport.Conn, f *netio.Frame) {
	group := string(f.Group)
	g, ok := rv.local.Group(group)
	if !ok {
		c.SendNow(netio.AppendError(nil, f.ID, netio.CodeNoSuchGroup, rv.local.UnknownGroup(group)+": not defined on this node"))
		return
	}
	name := receiverOf(g, ok)
	p := c.Port()
	r := netio.Receivers{Group: name, Addr: rv.addr(p, name), Count: p.GroupSize(name), Here: -1}
	if c.ReceiverGroup() == name {
		r.Here = c.Receiver()
	}
	c.SendNow(netio.AppendFrame(nil, netio.Header{Kind: netio.KindReply, ID: f.ID}, "", "", netio.AppendReceivers(nil, r)))
}
