package scd

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestHTTPLimitEvictsOnlyForANewConnection: a server at its cap closes
// its longest idle connection only for a new one that came. The accept
// loop made room before it accepted: once the cap was reached, it closed
// the idle one with no other waiting, and the only one idle was often the
// one it had just accepted, whose request had not come yet: with max-1
// requests being served, the max-th caller got EOF instead of its answer.
func TestHTTPLimitEvictsOnlyForANewConnection(t *testing.T) {
	const max = 2
	release := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /slow", func(w http.ResponseWriter, r *http.Request) { <-release })
	mux.HandleFunc("GET /fast", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	srv, lim := newHTTPServer(mux, max, 0)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(lim.listener(ln)) }()
	defer func() { srv.Close(); <-served }()

	var slow []net.Conn
	defer func() {
		close(release)
		for _, c := range slow {
			c.Close()
		}
	}()
	for range max - 1 { // requests being served: none of them idle
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		slow = append(slow, c)
		if _, err := io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	c, err := net.Dial("tcp", ln.Addr().String()) // the max-th: there is room for it
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(300 * time.Millisecond) // it sends its request a moment after it connected
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET /fast HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatalf("connection %d of at most %d: %v", max, max, err)
	}
	b := make([]byte, 512)
	n, err := c.Read(b)
	if n == 0 {
		t.Fatalf("connection %d of at most %d, with no other waiting: no answer (%v)", max, max, err)
	}
}
