package scd

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"

	"tpsched/netio/rpcport"
	"tpsched/scd/def"
	"tpsched/scd/names"
)

// ports are the sockets the node listens on, bound before the first UAP
// runs (bindPorts), until the parts that serve on them take them: the RPC
// port and every receiver group's, metrics_address (the doors' HTTP
// endpoint), the control socket, and the name port (the router's gossip).
// A UAP started first could bind one of them itself (the RPC port with
// SO_REUSEPORT, as a UAP did, answering every call) or just hold it so
// that the node cannot start. Bound sockets keep callers in their
// backlogs until the node serves on them.
type ports struct {
	rpc     *rpcport.Bound
	http    net.Listener
	control *net.UnixListener
	names   *names.Transport
}

// bindPorts binds them. A new process that takes the node over leaves
// alone what the old one holds (a port taken, or port 0): those come from
// the old process, which keeps them open throughout (restart.go).
func bindPorts(cfg *def.Config, rpcOpts rpcport.Options, takingOver bool) (p ports, err error) {
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	if p.rpc, err = rpcport.Bind(rpcOpts, takingOver); err != nil {
		return p, fmt.Errorf("rpc port %s: %w", rpcOpts.Addr, err)
	}
	maddr := cfg.System.MetricsAddress
	if !takingOver || !portZero(maddr) {
		ln, err := net.Listen("tcp", maddr)
		switch {
		case err == nil:
			p.http = ln
		case !takingOver || !errors.Is(err, syscall.EADDRINUSE):
			// Taking over, only a port held is left for the hand-over
			// (takeInherited checks that the old process holds it).
			return p, fmt.Errorf("metrics_address %s: %w", maddr, rpcport.InUseError(maddr, err))
		}
	}
	ln, err := listenControl(ControlSocketPath(cfg))
	switch {
	case err == nil:
		p.control = ln
	case !takingOver:
		return p, fmt.Errorf("control socket: %w", err)
	}
	if others, err := seeds(cfg); err == nil && len(others) > 0 {
		sys := cfg.System
		if !takingOver || sys.NamePort != 0 {
			t, err := names.ListenTransport(sys.RPCAddress, sys.NamePort)
			switch {
			case err == nil:
				p.names = t
			case !takingOver:
				return p, err
			}
		}
	}
	return p, nil
}

// takeInherited puts the sockets a restart inherited (restart.go) where
// nothing was bound ahead, and closes the others: a socket bound ahead is
// served, else the old process's.
func (p *ports) takeInherited(rs *restarter) {
	if inh := rs.inheritMetrics; inh != nil {
		rs.inheritMetrics = nil
		// Not the old process's when the definitions moved
		// metrics_address to a port another program holds: then nothing
		// is bound, and the doors' own bind says so.
		if p.http == nil && listensAt(inh, rs.n.cfg.System.MetricsAddress) {
			p.http = inh
		} else {
			_ = inh.Close()
		}
	}
	if inh := rs.inheritControl; inh != nil {
		rs.inheritControl = nil
		if p.control == nil {
			p.control = inh
		} else {
			_ = inh.Close()
		}
	}
	if inh := rs.inheritNames; inh != nil {
		rs.inheritNames = nil
		if p.names == nil {
			p.names = inh
		} else {
			inh.Close()
		}
	}
}

// claimNames makes sure, when the node is in a cluster, that it holds its
// name port and that a join on it finds an address to advertise, before a
// new process that takes the node over says it serves: from then on the
// old process has let its sockets go, and a join that failed would leave
// the node to nobody. The port is bound ahead (bindPorts) or handed over
// as a rule; it is bound here when neither was (port 0, which the old
// process did not hold as it ran alone, or a port bindPorts found taken),
// and the error then names what holds it. A port the old process holds
// and did not hand over (an older version, or its descriptors ran out) it
// frees as it leaves, and the join binds it then, as before the name port
// went over: oldPID is that process, 0 on a fresh start.
func (p *ports) claimNames(cfg *def.Config, oldPID int) error {
	if others, err := seeds(cfg); err != nil || len(others) == 0 {
		return err
	}
	sys := cfg.System
	if p.names == nil {
		addr := net.JoinHostPort(sys.RPCAddress, strconv.Itoa(sys.NamePort))
		t, err := names.ListenTransport(sys.RPCAddress, sys.NamePort)
		switch {
		case err == nil:
			p.names = t
		case oldPID == 0 || !errors.Is(err, syscall.EADDRINUSE) || rpcport.HolderPID(addr) != oldPID:
			return fmt.Errorf("name port: %w", rpcport.InUseError(addr, err))
		}
	}
	return names.CheckAdvertise(sys.RPCAddress)
}

// close closes the sockets bound ahead that nothing took (a start that
// failed half way).
func (p *ports) close() {
	p.rpc.Close()
	p.rpc = nil
	if p.http != nil {
		_ = p.http.Close()
		p.http = nil
	}
	if p.control != nil {
		_ = p.control.Close()
		p.control = nil
	}
	if p.names != nil {
		p.names.Close()
		p.names = nil
	}
}

// listensAt reports whether ln listens where addr (host:port) says: on
// its port, unless that is 0, and on its IP address, unless it names a
// host.
func listensAt(ln net.Listener, addr string) bool {
	ta, ok := ln.Addr().(*net.TCPAddr)
	host, ps, err := net.SplitHostPort(addr)
	if !ok || err != nil {
		return false
	}
	if !portZero(addr) {
		if port, err := net.LookupPort("tcp", ps); err != nil || port != ta.Port {
			return false
		}
	}
	ip := net.ParseIP(host)
	return ip == nil || ip.Equal(ta.IP) || ip.IsUnspecified() && ta.IP.IsUnspecified()
}

// portZero reports whether host:port asks for a port the kernel picks.
func portZero(addr string) bool {
	_, p, err := net.SplitHostPort(addr)
	return err == nil && (p == "0" || p == "")
}
