package bench

import (
	"bufio"
	"errors"
	"fmt"
	"io"
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

// tpCaller speaks the tpsched frame protocol (netio), one call at a time.
type tpCaller struct {
	connCaller
	group, service string
	id             uint64
	out, reply     []byte
}

// tpschedDialer calls group/service on a tpsched node (or the gnet echo
// peer, which answers any call frame) at addr.
func tpschedDialer(addr, group, service string) dialer {
	return func() caller {
		return &tpCaller{connCaller: connCaller{addr: addr}, group: group, service: service,
			reply: make([]byte, 64<<10)}
	}
}

func (c *tpCaller) Call(payload []byte, deadline time.Time) (outcome, error) {
	nc, r, err := c.conn()
	if err != nil {
		return callFailed, nil
	}
	c.setDeadline(nc, deadline)
	c.id++
	var timeout uint32
	if !deadline.IsZero() {
		timeout = uint32(max(time.Until(deadline)/time.Millisecond, 1))
	}
	c.out = netio.AppendFrame(c.out[:0], netio.Header{Kind: netio.KindCall, ID: c.id, TimeoutMs: timeout},
		c.group, c.service, payload)
	if _, err := nc.Write(c.out); err != nil {
		return c.ioOutcome(err)
	}
	if _, err := io.ReadFull(r, c.reply[:netio.HeaderSize]); err != nil {
		return c.ioOutcome(err)
	}
	n, err := netio.FrameLen(c.reply[:netio.HeaderSize], 64<<20)
	if err != nil {
		return callFailed, fmt.Errorf("bench: tpsched reply: %w", err)
	}
	if n > len(c.reply) {
		c.reply = append(c.reply, make([]byte, n-len(c.reply))...)
	}
	if _, err := io.ReadFull(r, c.reply[netio.HeaderSize:n]); err != nil {
		return c.ioOutcome(err)
	}
	f, _, err := netio.Decode(c.reply[:n], 64<<20)
	if err != nil {
		return callFailed, fmt.Errorf("bench: tpsched reply: %w", err)
	}
	if f.ID != c.id {
		return callFailed, fmt.Errorf("bench: reply id %d, want %d", f.ID, c.id)
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

// checkEcho verifies a reply is the request sent back: length and, cheaply,
// the first and last bytes.
func checkEcho(got, want []byte) error {
	if len(got) != len(want) || (len(want) > 0 && (got[0] != want[0] || got[len(got)-1] != want[len(want)-1])) {
		return fmt.Errorf("bench: reply of %d B to a request of %d B does not echo it", len(got), len(want))
	}
	return nil
}
