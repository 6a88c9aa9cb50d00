package rpcport

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// netio accepts connections itself and hands each to its socket's gnet
// event loop (gnet.Client.Enroll), rather than letting gnet listen: gnet
// v2's accept path returns ErrAcceptSocket for any accept error but EAGAIN,
// EINTR, ECONNRESET and ECONNABORTED, and that error ends the event loop's
// polling and shuts the whole engine down. One EMFILE (a full fd table)
// would so close the port for good while the process lived on.

// reusePortConfig makes listening sockets with SO_REUSEPORT set before
// bind, so that every socket of a receiver group (and of a process that
// takes the port over) shares the port. They are plain TCP: Go listens
// with MPTCP by default (since 1.24), and an SK_REUSEPORT program's socket
// array takes TCP and UDP sockets only.
var reusePortConfig = func() net.ListenConfig {
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		})
		if serr != nil {
			return fmt.Errorf("setsockopt SO_REUSEPORT: %w", serr)
		}
		return err
	}}
	lc.SetMultipathTCP(false)
	return lc
}()

// Accept back-off: the first retry after a failed accept waits
// acceptBackoffMin, each further one twice as long up to acceptBackoffMax.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// acceptLoop accepts on ln and registers each connection with cli, the
// event loop of this receiving socket. Failures that may pass (EMFILE,
// ENFILE, ENOBUFS, ENOMEM, ..., a descriptor reserve that cannot be
// refilled) pause the loop and retry: connections wait in the kernel's
// backlog meanwhile. A listener that can no longer accept
// (closed, shut down) ends the server.
func (s *Port) acceptLoop(ln *net.TCPListener, r *receiver) {
	defer s.acceptWG.Done()
	cli := s.loops[r.pos]
	var backoff time.Duration
	pause := func(err error) bool {
		s.acceptErrs.Add(1)
		inc(s.mAcceptErr)
		backoff = min(max(2*backoff, acceptBackoffMin), acceptBackoffMax)
		if n, ok := s.acceptLog.Allow(); ok {
			s.log.Warn("netio: accept failed; pausing before the next", "addr", s.addr, "err", err,
				"pause", backoff, "failures_since_last_log", n)
		}
		select {
		case <-time.After(backoff):
			return true
		case <-s.quit:
			return false
		}
	}
	for {
		// Accept only what can be enrolled: with the reserve short, the
		// callers wait in the backlog, not reset (reserve.go).
		if !s.fds.ready() {
			if !pause(errReserveShort) {
				return
			}
			continue
		}
		nc, err := ln.AcceptTCP()
		if err != nil {
			select {
			case <-s.quit:
				return
			default:
			}
			if s.handedOff.Load() && errors.Is(err, net.ErrClosed) {
				return // another process accepts on the socket now
			}
			if listenerGone(err) {
				s.fail(fmt.Errorf("accept on %s: %w", ln.Addr(), err))
				return
			}
			if !pause(err) {
				return
			}
			continue
		}
		backoff = 0
		if s.open.Add(1) > s.maxConns {
			s.open.Add(-1)
			s.refuse(nc)
			continue
		}
		if err := s.fds.enroll(func() error { _, err := cli.EnrollContext(nc, nil); return err }); err != nil { // closes nc in every case
			s.open.Add(-1)
			if !pause(fmt.Errorf("register with the event loop: %w", err)) {
				return
			}
			continue
		}
		r.accepted.Add(1)
	}
}

// listenerGone tells errors after which the socket will never accept again
// from those worth a retry.
func listenerGone(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EBADF) ||
		errors.Is(err, unix.ENOTSOCK) || errors.Is(err, unix.EOPNOTSUPP)
}

// refuse closes a connection accepted while MaxConns were open.
func (s *Port) refuse(nc *net.TCPConn) {
	remote := nc.RemoteAddr().String()
	s.refused.Add(1) // counted before the caller can see the close
	inc(s.mRefused)
	_ = nc.Close()
	if n, ok := s.refuseLog.Allow(); ok {
		s.log.Warn("netio: connection refused: max_connections are open", "addr", s.addr, "remote", remote,
			"max_connections", s.maxConns, "refused_since_last_log", n)
	}
}
