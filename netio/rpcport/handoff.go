package rpcport

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"tpsched/netio"
)

// Taking a port over (a restart without dropping a call): the old process
// hands its listening sockets to the new one (HandOff, then the files go
// over a unix socket), which passes them to Listen as Options.Inherit. The
// sockets are never closed on the way, so connections waiting in their
// backlog are accepted by the new process. The old process then tells each
// of its connections' callers to go away (GoAway: send no new call on this
// connection; the answers of those sent still come) and serves until they
// have closed them. If the new process fails before it serves, Resume
// takes the sockets back.

// Listener is one listening socket of a Port, duplicated, for another
// process (or for Resume).
type Listener struct {
	Group string   `json:"receiver_group"` // the receiver group's name; "" for the default group
	Index int      `json:"receiver"`       // its receiving socket within the group
	Addr  string   `json:"addr"`           // host:port it listens on
	File  *os.File `json:"-"`
}

// matches reports whether h may serve a group that asks for ta (port:
// the group's port so far; 0 takes any).
func (h Listener) matches(ta *net.TCPAddr, port int) bool {
	host, p, err := net.SplitHostPort(h.Addr)
	if err != nil {
		return false
	}
	hp, err := strconv.Atoi(p)
	if err != nil || (port != 0 && hp != port) {
		return false
	}
	want := ""
	if ta.IP != nil {
		want = ta.IP.String()
	}
	if host == "" || want == "" {
		return host == want || (host == "" && ta.IP.IsUnspecified()) || (want == "" && net.ParseIP(host).IsUnspecified())
	}
	return net.ParseIP(host).Equal(ta.IP)
}

// listener makes a TCP listener of h's file (which it closes: the
// listener holds a descriptor of its own).
func (h Listener) listener() (*net.TCPListener, error) {
	defer h.File.Close()
	ln, err := net.FileListener(h.File)
	if err != nil {
		return nil, err
	}
	tl, ok := ln.(*net.TCPListener)
	if !ok {
		ln.Close()
		return nil, fmt.Errorf("%s is not a TCP listener", h.Addr)
	}
	return tl, nil
}

func closeInherited(ls []Listener) {
	for _, h := range ls {
		if h.File != nil {
			_ = h.File.Close()
		}
	}
}

// ErrHandedOff is returned by HandOff when the sockets are gone already.
var ErrHandedOff = errors.New("netio: the listening sockets were handed off already")

// HandOff stops accepting and returns a duplicate of every listening
// socket, for a process that takes the port over. The sockets stay open
// (the duplicates hold them): connections that arrive meanwhile wait in
// their backlog. Connections already accepted are served as before. The
// caller owns the files; Resume takes them back.
func (s *Port) HandOff() ([]Listener, error) {
	if !s.handedOff.CompareAndSwap(false, true) {
		return nil, ErrHandedOff
	}
	s.lnMu.Lock()
	out := make([]Listener, 0, len(s.rcv))
	for _, r := range s.rcv {
		f, err := s.listeners[r.pos].File()
		if err != nil {
			s.lnMu.Unlock()
			closeInherited(out)
			s.handedOff.Store(false)
			return nil, fmt.Errorf("netio: hand off %s: %w", r.group.addr, err)
		}
		out = append(out, Listener{Group: r.group.name, Index: r.index, Addr: r.group.addr, File: f})
	}
	for _, ln := range s.listeners {
		_ = ln.Close() // the duplicate keeps the socket; the accept loop ends quietly
	}
	// Unlocked before the wait: a loop that fails meanwhile takes lnMu
	// (fail, closeQuit).
	s.lnMu.Unlock()
	s.acceptWG.Wait()
	for _, g := range s.groups {
		if g.steered != nil {
			if err := g.steered.Release(); err != nil {
				s.log.Warn("netio: steering did not let the sockets go; the new process will place connections by hash",
					"receiver_group", groupLabel(g.name), "err", err)
			}
		}
	}
	return out, nil
}

// Resume takes back what HandOff gave (a takeover failed) and accepts
// again. It takes ownership of the files. Steering, which the other
// process may have replaced with its own, is attached again.
func (s *Port) Resume(ls []Listener) error {
	if !s.handedOff.Load() {
		closeInherited(ls)
		return errors.New("netio: resume: nothing was handed off")
	}
	byPos := make(map[int]*net.TCPListener, len(ls))
	var errs []error
	for _, h := range ls {
		for _, r := range s.rcv {
			if r.group.name == h.Group && r.index == h.Index && byPos[r.pos] == nil {
				ln, err := h.listener()
				if err != nil {
					errs = append(errs, err)
					break
				}
				byPos[r.pos] = ln
				h.File = nil
				break
			}
		}
		if h.File != nil {
			_ = h.File.Close()
		}
	}
	if len(byPos) != len(s.rcv) {
		for _, ln := range byPos {
			_ = ln.Close()
		}
		// The port cannot accept on every socket again: it ends (Done,
		// Err), so that the node stops and its supervisor starts it
		// afresh. Left handed off, it accepted nothing and said so only
		// to the restart's caller: a node alive and deaf.
		err := fmt.Errorf("netio: resume: %d of %d listening sockets came back: %w", len(byPos), len(s.rcv), errors.Join(errs...))
		s.fail(err)
		return err
	}
	s.lnMu.Lock()
	defer s.lnMu.Unlock()
	for pos, ln := range byPos {
		s.listeners[pos] = ln
	}
	for _, g := range s.groups {
		if g.steered == nil {
			continue
		}
		fds, err := s.groupFDs(g)
		if err == nil {
			err = g.steered.Reattach(fds)
		}
		if err != nil {
			s.log.Warn("netio: steering not attached again after a hand-off was taken back", "receiver_group", groupLabel(g.name), "err", err)
		}
	}
	s.handedOff.Store(false)
	select {
	case <-s.quit: // stopped meanwhile: nothing accepts
		for _, ln := range s.listeners {
			_ = ln.Close()
		}
		return nil
	default:
	}
	for _, r := range s.rcv {
		s.acceptWG.Add(1)
		go s.acceptLoop(s.listeners[r.pos], r)
	}
	return nil
}

// GoAway tells the caller on every open connection to send no new calls
// on it (a KindGoAway frame, id 0, reason as the payload): the answers of
// calls it sent still come, and it closes the connection once it waits for
// none. Calls that still arrive are served. It returns how many
// connections were told.
func (s *Port) GoAway(reason string) int {
	s.mu.Lock()
	conns := make([]*Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	frame := netio.AppendFrame(nil, netio.Header{Kind: netio.KindGoAway}, "", "", []byte(reason))
	n := 0
	for _, c := range conns {
		if c.Send(append([]byte(nil), frame...)) == nil {
			n++
		}
	}
	return n
}
