package netlab

import (
	"bytes"
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"tpsched/internal/testenv"
)

// listen opens a TCP listener and a UDP socket on node i's address,
// inside its namespace; the TCP side reads everything and answers "ok".
func listen(t *testing.T, l *Lab, i int) (net.Listener, net.PacketConn) {
	t.Helper()
	var ln net.Listener
	var pc net.PacketConn
	err := l.Do(i, func() error {
		var err error
		if ln, err = net.Listen("tcp", l.Nodes[i].IP+":7000"); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", l.Nodes[i].IP+":7001")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close(); pc.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(io.Discard, c)
				_, _ = c.Write([]byte("ok"))
			}()
		}
	}()
	return ln, pc
}

// dial connects from node i (or the host, i < 0) to addr within d.
func dial(l *Lab, i int, addr string, d time.Duration) error {
	var c net.Conn
	do := func() (err error) { c, err = net.DialTimeout("tcp", addr, d); return err }
	var err error
	if i < 0 {
		err = do()
	} else {
		err = l.Do(i, do)
	}
	if err == nil {
		c.Close()
	}
	return err
}

// TestLab: nodes reach each other and the host reaches them; a cut stops
// one direction only, the host is never cut, a heal restores the link;
// loss drops about its share of datagrams; a rate slows a transfer; and
// the lab is gone when its test ends.
func TestLab(t *testing.T) {
	testenv.Slow(t, "network namespaces as root: make check runs it with the other netns tests")
	var names []string
	t.Run("lab", func(t *testing.T) {
		l := New(t, 3)
		for _, nd := range l.Nodes {
			names = append(names, nd.NS)
		}
		names = append(names, l.bridge)
		_, pc := listen(t, l, 1)
		to1 := l.Nodes[1].IP + ":7000"
		if err := dial(l, 0, to1, 2*time.Second); err != nil {
			t.Fatalf("node 0 to node 1 before any fault: %v", err)
		}
		l.Cut(0, 1)
		if err := dial(l, 0, to1, 300*time.Millisecond); err == nil {
			t.Errorf("node 0 reached node 1 across a cut")
		}
		if err := dial(l, -1, to1, 2*time.Second); err != nil {
			t.Errorf("the host could not reach node 1 while node 0 was cut from it: %v", err)
		}
		// One way: what node 1 sends node 0 still arrives (datagrams: a
		// TCP handshake needs both directions).
		_, pc0 := listen(t, l, 0)
		if n := datagrams(t, l, 1, pc0, l.Nodes[0].IP+":7001", 20); n != 20 {
			t.Errorf("node 0 got %d of 20 datagrams from node 1 with only 0 -> 1 cut", n)
		}
		if d := l.Dropped(1); d["cut from "+l.Nodes[0].IP] == 0 {
			t.Errorf("node 1's cut rule counted no packet: %v", d)
		}
		l.Heal(0, 1)
		if err := dial(l, 0, to1, 2*time.Second); err != nil {
			t.Errorf("node 0 to node 1 after the heal: %v", err)
		}

		// 50% loss on 0 -> 1: of 1000 datagrams about 500 arrive (one
		// sigma 16; 400 to 600 is six of them).
		l.Loss(0, 1, 50)
		if n := datagrams(t, l, 0, pc, l.Nodes[1].IP+":7001", 1000); n < 400 || n > 600 {
			t.Errorf("50%% loss: %d of 1000 datagrams arrived", n)
		} else {
			t.Logf("50%% loss: %d of 1000 datagrams arrived", n)
		}
		l.HealAll()

		// 2 Mbit/s out of node 0: 500 KB take about 2 s.
		l.Rate(0, "2mbit")
		start := time.Now()
		err := l.Do(0, func() error {
			c, err := net.DialTimeout("tcp", to1, 2*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			if _, err := c.Write(bytes.Repeat([]byte("x"), 500_000)); err != nil {
				return err
			}
			_ = c.(*net.TCPConn).CloseWrite()
			_, err = io.ReadAll(c)
			return err
		})
		took := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("500 KB at 2mbit: %v", took.Round(time.Millisecond))
		if took < 1500*time.Millisecond {
			t.Errorf("500 KB at 2 Mbit/s took %v: the rate did not hold", took)
		}
		l.Rate(0, "")
	})
	out, _ := exec.Command("ip", "netns", "list").Output()
	links, _ := exec.Command("ip", "-o", "link").Output()
	for _, name := range names {
		if strings.Contains(string(out), name) || strings.Contains(string(links), name+":") {
			t.Errorf("%s left behind after the lab's test ended", name)
		}
	}
}

// datagrams sends n datagrams from node i to addr and returns how many pc
// (addr's socket) received.
func datagrams(t *testing.T, l *Lab, i int, pc net.PacketConn, addr string, n int) int {
	t.Helper()
	got := make(chan int)
	go func() {
		k := 0
		buf := make([]byte, 64)
		for {
			_ = pc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			if _, _, err := pc.ReadFrom(buf); err != nil {
				got <- k
				return
			}
			k++
		}
	}()
	err := l.Do(i, func() error {
		c, err := net.Dial("udp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		for range n {
			if _, err := c.Write([]byte("x")); err != nil {
				return err
			}
			time.Sleep(50 * time.Microsecond)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return <-got
}

// TestOpen: a lab made outside a test (tpbench's) has its setup's faults,
// is gone after Close, and a failing Open leaves nothing behind.
func TestOpen(t *testing.T) {
	testenv.Slow(t, "network namespaces as root: make check runs it with the other netns tests")
	testenv.RequireRoot(t, "network namespaces")
	l, err := Open(2, t.Logf, func(l *Lab) { l.LossAll(1) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() }) // when the test fails before its own Close
	names := []string{l.bridge, l.Nodes[0].NS, l.Nodes[1].NS}
	rules, _ := exec.Command("ip", "netns", "exec", l.Nodes[1].NS, "nft", "list", "chain", "inet", "netlab", "in").Output()
	if !strings.Contains(string(rules), "loss from "+l.Nodes[0].IP) {
		t.Errorf("node 1 has no loss rule after Open's setup:\n%s", rules)
	}
	// Sent counts what node 0 puts on its link: 10 datagrams of 100
	// bytes and their headers (no one listens; they are sent all the same,
	// from an unconnected socket, which the port unreachable does not fail).
	b0, p0 := l.Sent(0)
	err = l.Do(0, func() error {
		c, err := net.ListenPacket("udp", l.Nodes[0].IP+":0")
		if err != nil {
			return err
		}
		defer c.Close()
		to := &net.UDPAddr{IP: net.ParseIP(l.Nodes[1].IP), Port: 7001}
		for range 10 {
			if _, err := c.WriteTo(bytes.Repeat([]byte("x"), 100), to); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if b1, p1 := l.Sent(0); b1-b0 < 1000 || p1-p0 < 10 {
		t.Errorf("node 0 sent 10 datagrams of 100 bytes; Sent grew by %d bytes and %d packets", b1-b0, p1-p0)
	}
	if err := l.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
	// 201 nodes: newLab fails before making anything; a bad fault in
	// setup fails after the lab exists, which must then be gone.
	if _, err := Open(201, t.Logf, nil); err == nil {
		t.Errorf("Open(201) did not fail")
	}
	var half *Lab
	if _, err := Open(1, t.Logf, func(l *Lab) { half = l; l.Rate(0, "not-a-rate") }); err == nil {
		t.Errorf("Open with a bad rate did not fail")
	} else {
		t.Logf("Open with a bad rate: %v", firstLine(err.Error()))
	}
	if half != nil {
		names = append(names, half.bridge, half.Nodes[0].NS)
	}
	out, _ := exec.Command("ip", "netns", "list").Output()
	links, _ := exec.Command("ip", "-o", "link").Output()
	for _, name := range names {
		if strings.Contains(string(out), name) || strings.Contains(string(links), name+":") {
			t.Errorf("%s left behind after Close or a failed Open", name)
		}
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
