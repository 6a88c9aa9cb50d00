package scd

import (
	"errors"
	"net"
	"strconv"

	"tpsched/bpf"
	"tpsched/netio"
	"tpsched/netio/rpcport"
	"tpsched/scd/local"
)

// This file is the node's part in receiver groups (OpenTP1's grouped
// multi-scheduler daemons, scdsvcdef's scdmulti -g NAME -m COUNT -p PORT):
// netio runs each group's receiving sockets on its own port; a user server
// bound to a group (usr scdmulti -g NAME) has its calls taken there and
// only there, and the group's sockets take no other server's calls. A call
// that comes to the wrong group is answered 'wrong receiver' with the
// right address; it did not run, so a sender may resend it there (the Go
// client and the forwarder do). A call without an answer is served where it
// came, since nobody would hear a refusal, and counted as misdirected. A receivers lookup tells a sender a
// group's address and receiving sockets, for multi_schedule.

// Steering choices (Options.Steering).
const (
	SteeringOff = "off" // the kernel's hash places every group's connections
)

// receiverGroups are the named receiver groups for netio.
func (n *Node) receiverGroups() []rpcport.ReceiverGroup {
	var out []rpcport.ReceiverGroup
	for _, rg := range n.cfg.Sched.ReceiverGroups {
		out = append(out, rpcport.ReceiverGroup{Name: rg.Name, Count: rg.Count,
			Addr: net.JoinHostPort(n.cfg.System.RPCAddress, strconv.Itoa(rg.Port))})
	}
	return out
}

// steerer places each receiver group's new connections: the SK_REUSEPORT
// program of package bpf, unless Options.Steering turns it off.
type steerer struct{ off bool }

func (s steerer) Steer(_ string, fds []int) (rpcport.Steered, error) {
	if s.off {
		return nil, errors.New("turned off (scdd -steering off, or TPSCHED_STEERING=off)")
	}
	st, err := bpf.Steer(fds)
	if err != nil {
		return nil, err
	}
	return st, nil
}

// receiverOf is the receiver group that takes g's calls ("" the default
// group; a group this node does not define is taken there too).
func receiverOf(g *local.Group) string {
	if g == nil {
		return ""
	}
	return g.Def().ReceiverGroup
}

// wrongReceiver says why a call for g that came on c's receiver group may
// not be taken there, or "" when it may. A call without an answer cannot
// be told where to go: it is taken where it came (its bytes were read
// there already) and counted as misdirected.
func (n *Node) wrongReceiver(c *rpcport.Conn, g *local.Group, f *netio.Frame) (string, bool) {
	here, want := c.ReceiverGroup(), receiverOf(g)
	if here == want {
		return "", false
	}
	if f.Kind == netio.KindCallNoReply {
		n.metrics.GetOrCreateCounter(`tpsched_receiver_misdirected_total{receiver_group="` + labelOf(here) + `"}`).Inc()
		return "", false
	}
	n.metrics.GetOrCreateCounter(`tpsched_requests_refused_total{reason="wrong_receiver"}`).Inc()
	msg := string(f.Group) + " is received on " + n.receiverAddr(c.Port(), want)
	if want != "" {
		msg += " (receiver group " + want + ")"
	}
	return msg + ", not on receiver group " + labelOf(here) + " (" + n.receiverAddr(c.Port(), here) + ")", true
}

func labelOf(receiverGroup string) string {
	if receiverGroup == "" {
		return "default"
	}
	return receiverGroup
}

// receiverAddr is the address a sender reaches the named receiver group
// of port p on: the advertised RPC host with the group's port.
func (n *Node) receiverAddr(p *rpcport.Port, name string) string {
	addr, ok := p.GroupAddr(name)
	if !ok {
		return "?"
	}
	_, port, _ := net.SplitHostPort(addr)
	host, _, _ := net.SplitHostPort(n.advertisedAddr(p))
	return net.JoinHostPort(host, port)
}

// answerReceivers answers a receivers lookup (netio.LookupReceivers) for
// this node alone.
func (n *Node) answerReceivers(c *rpcport.Conn, f *netio.Frame) {
	group := string(f.Group)
	g, ok := n.local.Group(group)
	if !ok {
		c.SendNow(netio.AppendError(nil, f.ID, netio.CodeNoSuchGroup, n.local.UnknownGroup(group)+": not defined on this node"))
		return
	}
	name := receiverOf(g)
	p := c.Port()
	r := netio.Receivers{Group: name, Addr: n.receiverAddr(p, name), Count: p.GroupSize(name), Here: -1}
	if c.ReceiverGroup() == name {
		r.Here = c.Receiver()
	}
	c.SendNow(netio.AppendFrame(nil, netio.Header{Kind: netio.KindReply, ID: f.ID}, "", "", netio.AppendReceivers(nil, r)))
}

// multiSchedule reports whether this node spreads the calls it transfers
// for group over the receivers of the group's receiver group on the other
// node: the group's multi_schedule here, or usrrc's for a group this node
// does not define.
func (n *Node) multiSchedule(group string) bool {
	if g, ok := n.local.Group(group); ok {
		return g.Def().MultiSchedule
	}
	return n.cfg.Usrrc.MultiSchedule
}
