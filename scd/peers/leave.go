package peers

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"tpsched/netio"
)

// This file is what the pool does when the network, not a node, fails
// (issue 30 item 1): a node that leaves the tables takes its peer with it,
// and a peer connection on a silent link fails within a bound instead of
// waiting on TCP's retransmissions for many minutes.

// DefaultUserTimeout is a peer connection's TCP_USER_TIMEOUT when Options
// give none: how long data sent on it may go unacknowledged (or keepalive
// probes unanswered) before the kernel drops the connection and its calls
// are answered 'network down'. It matches the failure detector's time to
// declare a silent node dead with scdd's default probes (names.DetectTime:
// 1 s probes, suspicion 4 probes, 5 s in a three-node cluster), so a link
// that goes silent without its node leaving the tables (memberlist still
// hears it through another node) is given up as soon as a dead one is.
// Well above what a live link needs: at 1% loss the kernel's
// retransmissions resend a segment in 200 ms, and a loaded host's CPU does
// not delay ACKs, which the kernel sends without the process.
const DefaultUserTimeout = 5 * time.Second

// peerDialer dials peer connections: the hello's bound on the connect,
// TCP keepalive so that an idle connection over a cut link is found out
// too (probes after 1 s idle, every 1 s), and TCP_USER_TIMEOUT, which
// bounds both unacknowledged data and unanswered keepalive probes.
func peerDialer(userTimeout time.Duration) *net.Dialer {
	return &net.Dialer{
		Timeout:         helloTimeout,
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: time.Second, Interval: time.Second, Count: 5},
		Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(userTimeout.Milliseconds()))
			})
			if err == nil && serr != nil {
				err = fmt.Errorf("peer connection: TCP_USER_TIMEOUT: %w", serr)
			}
			return err
		},
	}
}

// ErrNodeLeft closes a connection to a node that left the tables while
// TCP says the link is silent; its calls are answered 'network down'.
var ErrNodeLeft = errors.New("node left the cluster and its link is silent")

// NodeLeft is told (by membership: memberlist's NotifyLeave) that node is
// no longer in the tables, dead or gone. Its peer stops: calls queued for
// it, never sent, go to the Delegate's Reroute; the next call for the node,
// if it comes back, gets a new peer and new connections, never one from
// before. Of the connections with calls on them, those over a silent link
// (TCP has had data unacknowledged past a retransmission) close at once
// and their calls are answered 'network down' (they may have run there:
// not resent); the others retire: a node that leaves on purpose serves
// what it was sent, and a node declared dead by a slow detector but still
// there answers too. A retired connection that falls silent later closes
// at its TCP_USER_TIMEOUT. It never blocks: memberlist's lock is held.
func (p *Pool) NodeLeft(node string) {
	p.mu.Lock()
	pr := p.peers[node]
	if pr == nil || p.done {
		p.mu.Unlock()
		return
	}
	delete(p.peers, node)
	p.gone[pr] = true
	p.mu.Unlock()
	pr.mu.Lock()
	if !pr.stopped {
		pr.stopped, pr.left = true, true
		close(pr.stop)
	}
	var conns []*netio.MuxConn
	for mc := range pr.conns {
		conns = append(conns, mc)
	}
	pr.mu.Unlock()
	// Off memberlist's goroutine: a Close waits for a writer that a full
	// send buffer on the silent link may hold until the user timeout.
	go func() {
		var closed, retired int
		for _, mc := range conns {
			if silent(mc) {
				mc.Close(fmt.Errorf("node %s: %w", node, ErrNodeLeft))
				closed++
			} else {
				mc.Retire()
				retired++
			}
		}
		if len(conns) > 0 {
			p.log.Info("peer connections of a node that left", "node", node, "closed", closed, "retired", retired)
		}
	}()
}

// silentAfter is how long without an ACK makes a peer connection's link
// silent: keepalive (peerDialer) has a live link acknowledge a probe after
// every second idle, so a live link's last ACK is at most about 2 s old.
const silentAfter = 2500 * time.Millisecond

// silent reports whether mc's link has stopped acknowledging: data sent
// and not acknowledged past a retransmission timeout (on a live LAN link
// an ACK comes within milliseconds), or no ACK for silentAfter (requests
// acknowledged before the cut, their answers lost in it). False when the
// kernel cannot say.
func silent(mc *netio.MuxConn) bool {
	sc, ok := mc.NetConn().(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var info *unix.TCPInfo
	_ = rc.Control(func(fd uintptr) { info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) })
	if err != nil || info == nil {
		return false
	}
	return info.Unacked > 0 && (info.Backoff > 0 || info.Retransmits > 0) ||
		time.Duration(info.Last_ack_recv)*time.Millisecond > silentAfter
}

// pruneGone forgets the peers of nodes that left or moved once their lanes
// have ended and their connections closed. p.mu is held.
func (p *Pool) pruneGoneLocked() {
	for pr := range p.gone {
		pr.mu.Lock()
		idle := len(pr.conns) == 0 && pr.lanesRunning == 0
		pr.mu.Unlock()
		if idle {
			delete(p.gone, pr)
		}
	}
}
