// Package freeport finds ports free on loopback addresses for the tests
// and the benchmark that start servers on them. It owns nothing else: a
// port found free may be taken by another process before it is used, so
// callers that can listen on port 0 should.
package freeport

import (
	"fmt"
	"net"
	"slices"
	"strconv"
)

// Addr returns a free address on 127.0.0.1 ("127.0.0.1:port").
func Addr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("freeport: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// Common returns n distinct ports free for both TCP and UDP on every
// address of ips, for nodes that use the same ports each on its own
// address (as scdd's cluster does on 127.0.0.2-4).
func Common(ips []string, n int) ([]int, error) {
	if len(ips) == 0 || n <= 0 {
		return nil, fmt.Errorf("freeport: want addresses and a count, got %d addresses and %d", len(ips), n)
	}
	var out []int
	for range 200 {
		// A port the kernel hands out on the first address; try it on all.
		l, err := net.Listen("tcp", net.JoinHostPort(ips[0], "0"))
		if err != nil {
			return nil, fmt.Errorf("freeport: listen on %s: %w (is the loopback address configured?)", ips[0], err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !slices.Contains(out, p) && freeOnAll(ips, p) {
			out = append(out, p)
			if len(out) == n {
				return out, nil
			}
		}
	}
	return nil, fmt.Errorf("freeport: no %d ports free on all of %v", n, ips)
}

func freeOnAll(ips []string, p int) bool {
	for _, ip := range ips {
		addr := net.JoinHostPort(ip, strconv.Itoa(p))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return false
		}
		l.Close()
		u, err := net.ListenPacket("udp", addr)
		if err != nil {
			return false
		}
		u.Close()
	}
	return true
}
