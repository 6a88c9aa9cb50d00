package bpf

import (
	"context"
	"errors"
	"net"
	"runtime/debug"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tpsched/internal/testenv"
)

// reuseListeners opens n listening sockets on one loopback port with
// SO_REUSEPORT, as netio does for a receiver group.
func reuseListeners(t *testing.T, n int) ([]*net.TCPListener, []int, string) {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1) })
		if serr != nil {
			return serr
		}
		return err
	}}
	lc.SetMultipathTCP(false) // Go listens with MPTCP by default; the socket array takes TCP only
	addr := "127.0.0.1:0"
	var lns []*net.TCPListener
	var fds []int
	for range n {
		ln, err := lc.Listen(context.Background(), "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		tl := ln.(*net.TCPListener)
		lns = append(lns, tl)
		addr = ln.Addr().String()
		raw, err := tl.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		must(t, raw.Control(func(fd uintptr) { fds = append(fds, int(fd)) }))
	}
	return lns, fds, addr
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// landing dials addr and reports which of lns accepted the connection.
func landing(t *testing.T, lns []*net.TCPListener, addr string) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The handshake is done: the connection is in exactly one backlog.
	for round := 0; round < 50; round++ {
		for i, ln := range lns {
			_ = ln.SetDeadline(time.Now().Add(time.Millisecond))
			ac, err := ln.Accept()
			if err == nil {
				ac.Close()
				return i
			}
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatal(err)
			}
		}
	}
	t.Fatal("no listener accepted the connection")
	return -1
}

// TestSteeringPicksTheLeastBusy loads steer.c for real, attaches it to
// three sockets of one port, and shows each new connection landing on the
// receiver whose counters say it has the least work (calls in flight,
// connections, bytes read per second): every one of 20 connections while
// the counters hold still (the kernel's hash would
// spread them about a third each), and another receiver as soon as the
// counters change.
func TestSteeringPicksTheLeastBusy(t *testing.T) {
	needProbes(t)
	lns, fds, addr := reuseListeners(t, 3)
	s, err := Steer(fds)
	if err != nil {
		testenv.SkipOrFail(t, "the steering program does not load here: %v", err)
	}
	defer s.Close()
	set := func(i int, inFlight, conns, rate int64) {
		a, b, c := s.Load(i)
		a.Store(inFlight)
		b.Store(conns)
		c.Store(rate)
	}
	set(0, 5, 1, 0)
	set(1, 0, 2, 4096) // work 3: the least
	set(2, 3, 0, 4096)
	for k := range 20 {
		if got := landing(t, lns, addr); got != 1 {
			t.Fatalf("connection %d landed on receiver %d, want 1 (work 6, 3, 4)", k, got)
		}
	}
	set(1, 0, 2, 1<<20) // reading 1 MiB/s: now receiver 2 (work 4) has the least
	if got := landing(t, lns, addr); got != 2 {
		t.Fatalf("after the change the connection landed on receiver %d, want 2 (work 6, 258, 4)", got)
	}
	if steered, hashed := s.Decisions(); steered != 21 || hashed != 0 {
		t.Fatalf("decisions: %d steered, %d left to the hash; want 21, 0", steered, hashed)
	}

	// Ties spread: with every receiver idle, connections go to each.
	for i := range 3 {
		set(i, 0, 0, 0)
	}
	seen := map[int]bool{}
	for range 60 {
		seen[landing(t, lns, addr)] = true
	}
	if len(seen) != 3 {
		t.Fatalf("idle receivers: connections landed only on %v", seen)
	}
}

// TestSteeringTakenOver: a socket is in one program's array at a time; once
// the first releases them, a second program attached to the same sockets (a
// new process after a hand-off) steers from then on; Reattach gives the
// sockets back to the first even when the second's owner went away
// without releasing them.
func TestSteeringTakenOver(t *testing.T) {
	needProbes(t)
	lns, fds, addr := reuseListeners(t, 2)
	first, err := Steer(fds)
	if err != nil {
		testenv.SkipOrFail(t, "the steering program does not load here: %v", err)
	}
	defer first.Close()
	busy, _, _ := first.Load(0)
	busy.Store(10) // the first program sends everything to receiver 1
	if got := landing(t, lns, addr); got != 1 {
		t.Fatalf("first program: receiver %d, want 1", got)
	}
	if _, err := Steer(fds); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("a second program while the first holds the sockets: %v, want EBUSY", err)
	}
	must(t, first.Release())
	second, err := Steer(fds)
	must(t, err)
	busy2, _, _ := second.Load(1)
	busy2.Store(10) // the second sends everything to receiver 0
	if got := landing(t, lns, addr); got != 0 {
		t.Fatalf("after the takeover: receiver %d, want 0", got)
	}
	// The second process dies holding the sockets (a hand-off taken
	// back): its program stays attached, with its array, until replaced.
	must(t, second.Close())
	must(t, first.Reattach(fds))
	if got := landing(t, lns, addr); got != 1 {
		t.Fatalf("after reattaching the first: receiver %d, want 1", got)
	}
	must(t, Detach(fds[0]))
}

// TestSteeringCellsOutliveClose: netio reads a receiver's cells for
// /metrics and /status after its port stopped and closed the steering (a
// scrape during scdd's shutdown). Close unmapped the load map under those
// pointers, and the read was a fault that killed the node; the cells now
// keep their last values.
func TestSteeringCellsOutliveClose(t *testing.T) {
	needProbes(t)
	_, fds, _ := reuseListeners(t, 2)
	s, err := Steer(fds)
	if err != nil {
		testenv.SkipOrFail(t, "the steering program does not load here: %v", err)
	}
	inFlight, conns, rate := s.Load(1)
	inFlight.Store(3)
	conns.Store(2)
	rate.Store(4096)
	must(t, s.Close())
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("reading a cell after Close: %v", r)
			}
		}()
		if a, b, c := inFlight.Load(), conns.Load(), rate.Load(); a != 3 || b != 2 || c != 4096 {
			t.Errorf("after Close the cells read %d, %d, %d; want 3, 2, 4096", a, b, c)
		}
		inFlight.Add(-1) // a loop's last answer: written, not a fault
	}()
	must(t, s.Close()) // twice is harmless
}
