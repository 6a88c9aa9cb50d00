package scd

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// The node's HTTP servers (metrics_address; the control socket) hold a
// descriptor per connection, and a browser or a client keeps connections
// alive between requests: 2,000 idle ones stayed 90 s and 41 MiB, and 66
// of them under a small RLIMIT_NOFILE took the descriptors the RPC port
// needed, so an RPC caller timed out. So each server has time limits
// (httpTimeouts) and a cap on its connections well below the RPC port's
// share of the fd table: at the cap, the connection idle the longest (or
// one that has sent nothing yet) is closed for the new one; when none is
// idle, the new one waits, accepted but not served, until one ends (those
// after it in the listen backlog).

// Time limits of the node's HTTP servers.
const (
	httpReadHeaderTimeout = 5 * time.Second
	httpReadTimeout       = 10 * time.Second // a request, body included
	// An answer on metrics_address; the control socket has none (a CPU
	// profile takes the seconds asked for, a restart up to 90 s).
	httpWriteTimeout   = 30 * time.Second
	httpIdleTimeout    = 10 * time.Second // a kept-alive connection between requests
	httpMaxHeaderBytes = 16 << 10         // the requests here are short GETs and POSTs
	metricsMaxConns    = 32               // metrics_address: a scraper, a dashboard, a few browsers
	controlMaxConns    = 16               // the control socket: scdctl, an operator
)

// newHTTPServer is an http.Server with the node's limits, whose
// connections are capped at max by the returned connLimit (serve with
// limit.listener(ln)); writeTimeout 0 leaves answers untimed.
func newHTTPServer(h http.Handler, max int, writeTimeout time.Duration) (*http.Server, *connLimit) {
	lim := &connLimit{max: max, conns: map[net.Conn]time.Time{}, freed: make(chan struct{}, 1)}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: httpReadHeaderTimeout,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    httpMaxHeaderBytes,
		ConnState:         lim.state,
	}
	return srv, lim
}

// connLimit caps the connections of one http.Server.
type connLimit struct {
	max   int
	mu    sync.Mutex
	conns map[net.Conn]time.Time // open connections; when each went idle, zero while a request is served
	freed chan struct{}          // a connection ended
}

// listener wraps ln so that Accept keeps the cap.
func (l *connLimit) listener(ln net.Listener) net.Listener {
	return &limitedListener{Listener: ln, lim: l, done: make(chan struct{})}
}

// state follows the server's connections (http.Server.ConnState).
func (l *connLimit) state(c net.Conn, s http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch s {
	case http.StateNew, http.StateIdle:
		l.conns[c] = time.Now() // nothing being served: may go for a new caller
	case http.StateActive:
		if _, ok := l.conns[c]; ok {
			l.conns[c] = time.Time{}
		}
	case http.StateClosed, http.StateHijacked:
		if _, ok := l.conns[c]; ok {
			delete(l.conns, c)
			select {
			case l.freed <- struct{}{}:
			default:
			}
		}
	}
}

// room makes room for one more connection: true when there is; otherwise
// it closes the connection idle the longest, if any, and reports false.
func (l *connLimit) room() bool {
	l.mu.Lock()
	if len(l.conns) < l.max {
		l.mu.Unlock()
		return true
	}
	var oldest net.Conn
	var since time.Time
	for c, t := range l.conns {
		if !t.IsZero() && (oldest == nil || t.Before(since)) {
			oldest, since = c, t
		}
	}
	l.mu.Unlock()
	if oldest != nil {
		_ = oldest.Close() // its server goroutine sees it and reports StateClosed
	}
	return false
}

type limitedListener struct {
	net.Listener
	lim      *connLimit
	done     chan struct{}
	doneOnce sync.Once
}

// Accept takes a connection from the backlog, then waits until the
// server has room for it. Room is made only for a connection that came:
// made before, at the cap it closed an idle connection with no other
// waiting, often the one just accepted, whose request had not come yet.
func (l *limitedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	for !l.lim.room() {
		select {
		case <-l.lim.freed:
		case <-time.After(100 * time.Millisecond): // an eviction's close takes a moment to be reported
		case <-l.done:
			_ = c.Close()
			return nil, net.ErrClosed
		}
	}
	l.lim.mu.Lock()
	l.lim.conns[c] = time.Now()
	l.lim.mu.Unlock()
	return c, nil
}

func (l *limitedListener) Close() error {
	l.doneOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}
