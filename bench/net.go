package bench

import (
	"fmt"
	"strings"

	"tpsched/internal/freeport"
	"tpsched/internal/netlab"
)

// Where S6's and S7's scdd nodes run (tpbench -net): on addresses of this
// host's loopback, as so far, or each in a network namespace of its own
// with its own address on a bridge (internal/netlab), as on hosts of one
// LAN, with a loss on every link between two nodes if asked (issue 30
// item 5). The load generator and the observers (/metrics, lookups,
// /status) stay on the host either way: netlab gives the host an address
// on the bridge and never faults it, so only what the nodes say to each
// other (announces, memberlist, transferred calls) crosses a faulty link.

// The networks of -net.
const (
	NetLoopback = "loopback"
	NetLab      = "lab"
)

// nodeNet is one scenario's network of nodes: their addresses, how to
// start a program on one, and the lab behind them (nil on loopback).
type nodeNet struct {
	ips  []string
	lab  *netlab.Lab
	loss float64 // percent, on every link between two nodes
}

// openNet makes the network of n nodes cfg.Net names. On loopback the
// nodes take loopbackIPs; on the lab each gets a namespace, and what
// openNet made is removed by close (the caller defers it: tpbench cancels
// its context on SIGINT and SIGTERM, so the deferred close runs then too).
func openNet(cfg Config, loopbackIPs []string) (*nodeNet, error) {
	switch cfg.Net {
	case "", NetLoopback:
		return &nodeNet{ips: loopbackIPs}, nil
	case NetLab:
	default:
		return nil, fmt.Errorf("bench: network %q: want %s or %s", cfg.Net, NetLoopback, NetLab)
	}
	logf := func(format string, args ...any) { fmt.Fprintf(cfg.Log, "  "+format+"\n", args...) }
	lab, err := netlab.Open(len(loopbackIPs), logf, func(l *netlab.Lab) {
		if cfg.NetLoss > 0 {
			l.LossAll(cfg.NetLoss)
		}
	})
	if err != nil {
		return nil, err
	}
	nn := &nodeNet{lab: lab, loss: cfg.NetLoss}
	for _, nd := range lab.Nodes {
		nn.ips = append(nn.ips, nd.IP)
	}
	fmt.Fprintf(cfg.Log, "  network: %s\n", nn.short())
	return nn, nil
}

// close removes the lab, if any; the nodes must have stopped (a
// namespace lives on while a process runs in it).
func (nn *nodeNet) close() error {
	if nn.lab == nil {
		return nil
	}
	return nn.lab.Close()
}

// ports are k ports free on every node. On the lab each namespace is
// fresh and has all its ports, but the nodes of an earlier run may still
// hold theirs: ports free on the host's bridge address differ from run to
// run like loopback's do.
func (nn *nodeNet) ports(k int) ([]int, error) {
	if nn.lab == nil {
		return freeport.Common(nn.ips, k)
	}
	return freeport.Common([]string{nn.lab.HostIP()}, k)
}

// command is how to run prog with args on node i: as it is on loopback,
// under nsenter --net on the lab (netlab's CommandArgs says why not `ip
// netns exec`). nsenter execs prog, so the pid started is prog's.
func (nn *nodeNet) command(i int, prog string, args ...string) (string, []string) {
	if nn.lab == nil {
		return prog, args
	}
	return "nsenter", nn.lab.CommandArgs(i, prog, args...)
}

// sent is what the nodes have sent so far: on loopback the machine's lo
// transmit counters (other tenants' traffic included), on the lab the
// nodes' links (to each other and to the host).
func (nn *nodeNet) sent() (bytes, pkts uint64) {
	if nn.lab == nil {
		return loopback()
	}
	for i := range nn.lab.Nodes {
		b, p := nn.lab.Sent(i)
		bytes, pkts = bytes+b, pkts+p
	}
	return bytes, pkts
}

// dropped is how many packets the loss rules have dropped so far, over
// every node.
func (nn *nodeNet) dropped() int {
	if nn.lab == nil {
		return 0
	}
	n := 0
	for i := range nn.lab.Nodes {
		for _, d := range nn.lab.Dropped(i) {
			n += d
		}
	}
	return n
}

// short names the network for logs and tables: "loopback", "lab",
// "lab, 1% loss".
func (nn *nodeNet) short() string {
	switch {
	case nn.lab == nil:
		return NetLoopback
	case nn.loss > 0:
		return fmt.Sprintf("%s, %g%% loss", NetLab, nn.loss)
	}
	return NetLab
}

// describe is the network's setup line, with the packets the loss
// dropped by now.
func (nn *nodeNet) describe() string {
	if nn.lab == nil {
		return fmt.Sprintf("Network: loopback: every node on an address of its own on this host's lo (%s), as on one machine; "+
			"no loss, no latency (tpbench -net lab puts each node in a network namespace of its own).", ipRange(nn.ips))
	}
	s := fmt.Sprintf("Network: lab (tpbench -net lab, internal/netlab): each node in a network namespace of its own with its own address "+
		"(%s) on a veth to a bridge, the host (load generator and observers) on %s on the same bridge; ", ipRange(nn.ips), nn.lab.HostIP())
	if nn.loss > 0 {
		s += fmt.Sprintf("%g%% of the packets on every link between two nodes, each way, dropped at random (nftables numgen in the "+
			"receiving node's input chain; -net-loss), none between a node and the host: %d packets dropped by the report's time; ",
			nn.loss, nn.dropped())
	} else {
		s += "no loss; "
	}
	return s + "no added latency (this kernel has no netem) and no rate limit, so a packet between nodes crosses two veths and a " +
		"bridge in this kernel instead of lo."
}

// ipRange writes the nodes' addresses, in order, or the first and last
// of more than three.
func ipRange(ips []string) string {
	if len(ips) <= 3 {
		return strings.Join(ips, ", ")
	}
	return fmt.Sprintf("%s to %s, %d addresses", ips[0], ips[len(ips)-1], len(ips))
}
