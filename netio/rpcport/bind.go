package rpcport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"

	"golang.org/x/sys/unix"
)

// Binding comes before serving. A node binds every port it listens on
// before it starts processes it does not trust (the UAPs), so that none of
// them can bind a port first and answer the node's callers; it serves on
// them once its groups run. Bind opens the sockets and Listen, given them in
// Options.Bound, serves: a caller that connects in between waits in the
// kernel's backlog, as during a hand-off.

// Bound is listening sockets bound ahead of Listen, per receiver group.
type Bound struct {
	groups []boundGroup
}

type boundGroup struct {
	name string
	lns  []*net.TCPListener
}

// Bind opens the listening sockets of every receiver group of opts (Addr
// and Loops for the default group, Receivers), each port checked as
// Listen checks it: nobody else may listen there. Nothing accepts on them
// until Listen takes them (Options.Bound). With takingOver, a group whose
// port is 0 or held already is left alone: the process that holds it will
// hand its sockets over (Options.Inherit), and Listen binds whatever
// remains.
func Bind(opts Options, takingOver bool) (*Bound, error) {
	specs, err := groupSpecs(opts)
	if err != nil {
		return nil, err
	}
	b := &Bound{}
	for _, spec := range specs {
		ta, host, err := resolveGroup(spec)
		if err != nil {
			b.Close()
			return nil, groupErr(spec, err)
		}
		if takingOver && (ta.Port == 0 || probeFree(ta.IP, ta.Port) != nil) {
			continue
		}
		lns, _, err := bindGroup(spec, ta, host, nil, ownInodes(nil))
		if err != nil {
			b.Close()
			return nil, groupErr(spec, err)
		}
		b.groups = append(b.groups, boundGroup{name: spec.Name, lns: lns})
	}
	return b, nil
}

// Close closes the sockets Listen did not take. Safe on nil.
func (b *Bound) Close() {
	if b == nil {
		return
	}
	for _, g := range b.groups {
		for _, ln := range g.lns {
			_ = ln.Close()
		}
	}
	b.groups = nil
}

// take removes and returns the sockets bound for the named group.
func (b *Bound) take(name string) []*net.TCPListener {
	if b == nil {
		return nil
	}
	for i, g := range b.groups {
		if g.name == name {
			b.groups = append(b.groups[:i], b.groups[i+1:]...)
			return g.lns
		}
	}
	return nil
}

func groupErr(spec ReceiverGroup, err error) error {
	if spec.Name != "" {
		return fmt.Errorf("netio: listen %s (receiver group %s): %w", spec.Addr, spec.Name, err)
	}
	return fmt.Errorf("netio: listen %s: %w", spec.Addr, err)
}

// resolveGroup is a group's address, and its host as Listen binds it
// (empty for a wildcard).
func resolveGroup(spec ReceiverGroup) (*net.TCPAddr, string, error) {
	ta, err := net.ResolveTCPAddr("tcp", spec.Addr)
	if err != nil {
		return nil, "", err
	}
	host := ""
	if ta.IP != nil {
		host = ta.IP.String()
		if ta.Zone != "" {
			host += "%" + ta.Zone
		}
	}
	return ta, host, nil
}

// ownInodes is the set of sockets a Port counts as its own on its ports:
// those it inherited, whether it takes them or not (the process that
// handed them over holds them still for a moment).
func ownInodes(inherited []Listener) map[uint64]bool {
	ours := map[uint64]bool{}
	for _, h := range inherited {
		if h.File == nil {
			continue
		}
		if ln, err := net.FileListener(h.File); err == nil { // a duplicate, closed at once
			if tl, ok := ln.(*net.TCPListener); ok {
				if ino, err := socketInode(tl); err == nil {
					ours[ino] = true
				}
			}
			ln.Close()
		}
	}
	return ours
}

// listenGroup opens the listening sockets of one receiver group: first
// those inherited for it (same group name, same address; port 0 matches
// any), then those bound ahead for it (pre), then new ones with
// SO_REUSEPORT on the same port. With port 0 the first socket picks the
// port. It returns the sockets, host:port (host empty for a wildcard
// address) and the inherited listeners it did not take. ours is the set of
// socket inodes the Port counts as its own, and grows by the group's.
func listenGroup(spec ReceiverGroup, inherited []Listener, pre []*net.TCPListener, ours map[uint64]bool, log *slog.Logger) ([]*net.TCPListener, string, []Listener, error) {
	ta, host, err := resolveGroup(spec)
	if err != nil {
		closeListeners(pre)
		return nil, "", inherited, err
	}
	lns := make([]*net.TCPListener, 0, spec.Count)
	rest := inherited[:0:0]
	for _, h := range inherited {
		port := ta.Port
		if len(lns) > 0 {
			port = listenerPort(lns[0])
		}
		if h.Group != spec.Name || len(lns) == spec.Count || !h.matches(ta, port) {
			rest = append(rest, h)
			continue
		}
		ln, err := h.listener()
		if err != nil {
			log.Warn("netio: an inherited listening socket cannot be used; binding a new one", "receiver_group", groupLabel(spec.Name),
				"addr", h.Addr, "err", err)
			continue
		}
		lns = append(lns, ln)
	}
	for _, ln := range pre {
		if len(lns) < spec.Count && (len(lns) == 0 || listenerPort(ln) == listenerPort(lns[0])) {
			lns = append(lns, ln)
		} else {
			_ = ln.Close()
		}
	}
	lns, addr, err := bindGroup(spec, ta, host, lns, ours)
	return lns, addr, rest, err
}

// bindGroup binds what spec still needs beside have (sockets it holds
// already, on one port) and checks the port: a probe before the first new
// socket of a fixed port, and after binding, that every socket listening
// there is in ours or have. On error every socket of have is closed.
func bindGroup(spec ReceiverGroup, ta *net.TCPAddr, host string, have []*net.TCPListener, ours map[uint64]bool) ([]*net.TCPListener, string, error) {
	lns := have
	fail := func(err error) ([]*net.TCPListener, string, error) {
		closeListeners(lns)
		return nil, "", err
	}
	port := ta.Port
	if len(lns) > 0 {
		port = listenerPort(lns[0])
	} else if port != 0 {
		// Any socket listening there makes this bind fail, whoever's
		// and with whatever options: a second scdd on this port.
		if err := probeFree(ta.IP, port); err != nil {
			if errors.Is(err, unix.EADDRINUSE) {
				return fail(inUseError(ta.IP, port, err))
			}
			return fail(err)
		}
	}
	for len(lns) < spec.Count {
		ln, err := reusePortConfig.Listen(context.Background(), "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return fail(err)
		}
		lns = append(lns, ln.(*net.TCPListener))
		port = listenerPort(lns[0])
	}
	for _, ln := range lns {
		ino, err := socketInode(ln)
		if err != nil {
			return fail(err)
		}
		ours[ino] = true
	}
	// Two processes that probed at the same moment both bound: each sees
	// the other's socket now, and both refuse.
	ip := ta.IP
	if ip == nil {
		ip = net.IPv6unspecified
	}
	if err := checkOwnPort(ip, port, ours); err != nil {
		return fail(err)
	}
	return lns, net.JoinHostPort(host, strconv.Itoa(port)), nil
}

func closeListeners(lns []*net.TCPListener) {
	for _, ln := range lns {
		_ = ln.Close()
	}
}
