package bench

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"tpsched/netio"
)

// connCaller holds the connection state shared by the stream callers: a
// lazily dialled TCP connection that Close may end from another goroutine.
type connCaller struct {
	addr   string
	mu     sync.Mutex
	nc     net.Conn
	r      *bufio.Reader
	closed bool
	hasDL  bool
}

func (c *connCaller) conn() (net.Conn, *bufio.Reader, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, nil, net.ErrClosed
	}
	if c.nc == nil {
		nc, err := net.DialTimeout("tcp", c.addr, 2*time.Second)
		if err != nil {
			return nil, nil, err
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
		}
		c.nc, c.r = nc, bufio.NewReaderSize(nc, 64<<10)
		c.hasDL = false
	}
	return c.nc, c.r, nil
}

// drop forgets a connection that broke or timed out; the next call redials.
func (c *connCaller) drop() {
	c.mu.Lock()
	if c.nc != nil {
		c.nc.Close()
		c.nc = nil
	}
	c.mu.Unlock()
}

func (c *connCaller) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.nc != nil {
		c.nc.Close()
		c.nc = nil
	}
	return nil
}

// setDeadline sets the call's deadline, clearing a stale one cheaply.
func (c *connCaller) setDeadline(nc net.Conn, d time.Time) {
	if !d.IsZero() || c.hasDL {
		nc.SetDeadline(d)
		c.hasDL = !d.IsZero()
	}
}

// ioOutcome classifies an I/O error: a deadline is a timeout, anything else
// a failed call. Either way the connection is dropped.
func (c *connCaller) ioOutcome(err error) (outcome, error) {
	c.drop()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return callTimedOut, nil
	}
	return callFailed, nil
}

// tpCaller speaks the tpsched frame protocol (netio), one call at a time,
// on a netio.MuxConn, the connection type of the Go client and of the
// forwarder between nodes; it reads its answers itself (CallerReads).
type tpCaller struct {
	addr, group, service string
	reply                []byte // the last answer's buffer, reused
	// prefix goes before every request (S10's "bench/echo/", which
	// uap-echo's call service reads as the call to make); the reply must
	// echo what follows it.
	prefix []byte
	req    []byte // prefix and payload, reused

	mu     sync.Mutex
	mc     *netio.MuxConn
	closed bool
}

// tpschedDialer calls group/service on a tpsched node (or the gnet echo
// peer, which answers any call frame) at addr.
func tpschedDialer(addr, group, service string) dialer {
	return func() caller {
		return &tpCaller{addr: addr, group: group, service: service, reply: make([]byte, 64<<10)}
	}
}

func (c *tpCaller) conn() (*netio.MuxConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, net.ErrClosed
	}
	if c.mc == nil {
		nc, err := net.DialTimeout("tcp", c.addr, 2*time.Second)
		if err != nil {
			return nil, err
		}
		c.mc = netio.NewMuxConn(nc, netio.MuxOptions{MaxPayload: 64 << 20, CallerReads: true})
	}
	return c.mc, nil
}

// Close ends the connection, also from another goroutine than the caller's.
func (c *tpCaller) Close() error {
	c.mu.Lock()
	c.closed = true
	mc := c.mc
	c.mc = nil
	c.mu.Unlock()
	if mc != nil {
		mc.Close(nil)
	}
	return nil
}

// tpschedCallDialer is tpschedDialer with prefix before every request.
func tpschedCallDialer(addr, group, service, prefix string) dialer {
	return func() caller {
		return &tpCaller{addr: addr, group: group, service: service, reply: make([]byte, 64<<10), prefix: []byte(prefix)}
	}
}

func (c *tpCaller) Call(payload []byte, deadline time.Time) (outcome, error) {
	req := payload
	if c.prefix != nil {
		c.req = append(append(c.req[:0], c.prefix...), payload...)
		req = c.req
	}
	var timeout uint32
	if !deadline.IsZero() {
		timeout = uint32(max(time.Until(deadline)/time.Millisecond, 1))
	}
	for try := 0; ; try++ {
		mc, err := c.conn()
		if err != nil {
			return callFailed, nil
		}
		f, reply, err := mc.RoundTrip(netio.Header{Kind: netio.KindCall, TimeoutMs: timeout}, c.group, c.service, req, deadline, c.reply)
		c.reply = reply
		if err != nil {
			// A broken or timed-out connection is dropped (RoundTrip closed
			// it), and so is one the node asked to go away from; the next
			// call redials.
			c.mu.Lock()
			if c.mc == mc {
				c.mc = nil
			}
			c.mu.Unlock()
			switch {
			case errors.Is(err, netio.ErrGoingAway) && try == 0:
				// The node is handing its port to a new process (a
				// restart) and the call was not sent: send it on a new
				// connection, as tpsched's client does.
				mc.Close(err)
				continue
			case errors.Is(err, os.ErrDeadlineExceeded):
				return callTimedOut, nil
			case isProtocolError(err):
				return callFailed, fmt.Errorf("bench: tpsched reply: %w", err)
			}
			return callFailed, nil
		}
		switch {
		case f.Kind == netio.KindReply:
			return callOK, checkEcho(f.Payload, payload)
		case f.Kind == netio.KindError && f.Code == netio.CodeServerBusy:
			return callRefused, nil
		case f.Kind == netio.KindError && f.Code == netio.CodeTimedOut:
			return callTimedOut, nil
		}
		return callFailed, nil
	}
}

// isProtocolError says the peer sent bytes that are no tpsched frame.
func isProtocolError(err error) bool {
	for _, e := range []error{netio.ErrBadMagic, netio.ErrBadVersion, netio.ErrBadKind, netio.ErrFrameSize} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// checkEcho verifies a reply is the request sent back: length and, cheaply,
// the first and last bytes.
func checkEcho(got, want []byte) error {
	if len(got) != len(want) || (len(want) > 0 && (got[0] != want[0] || got[len(got)-1] != want[len(want)-1])) {
		return fmt.Errorf("bench: reply of %d B to a request of %d B does not echo it", len(got), len(want))
	}
	return nil
}
