package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestAddrIsFree(t *testing.T) {
	a, err := Addr()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", a)
	if err != nil {
		t.Fatalf("%s not free: %v", a, err)
	}
	l.Close()
}

// TestCommonSkipsATakenPort: with a port held on the second address,
// Common still returns ports free for TCP and UDP on both, none of them
// the held one.
func TestCommonSkipsATakenPort(t *testing.T) {
	ips := []string{"127.0.0.1", "127.0.0.2"}
	if l, err := net.Listen("tcp", "127.0.0.2:0"); err != nil {
		t.Skipf("127.0.0.2 not usable here: %v", err)
	} else {
		defer l.Close()
		held := l.Addr().(*net.TCPAddr).Port
		ports, err := Common(ips, 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(ports) != 3 {
			t.Fatalf("got %v, want 3 ports", ports)
		}
		for _, p := range ports {
			if p == held {
				t.Errorf("port %d is held on 127.0.0.2", p)
			}
			for _, ip := range ips {
				a := net.JoinHostPort(ip, strconv.Itoa(p))
				tl, err := net.Listen("tcp", a)
				if err != nil {
					t.Errorf("%s not free for TCP: %v", a, err)
					continue
				}
				tl.Close()
				u, err := net.ListenPacket("udp", a)
				if err != nil {
					t.Errorf("%s not free for UDP: %v", a, err)
					continue
				}
				u.Close()
			}
		}
	}
	if _, err := Common(nil, 1); err == nil {
		t.Error("no addresses accepted")
	}
}
