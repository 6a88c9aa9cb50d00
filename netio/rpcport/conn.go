package rpcport

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"tpsched/netio"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"
)

// Conn is one client connection of a Port. Its methods are safe on the
// event loop; Send, ID and RemoteAddr are safe from any goroutine.
type Conn struct {
	gc     gnet.Conn
	srv    *Port
	rcv    *receiver // the receiving socket it arrived on
	id     uint64
	remote string

	// inFlight is the calls and name lookups read and not yet answered; it
	// is added to on the loop and taken from under mu, as the answers are
	// written, so that its receiver's count (the steering load) stays true.
	inFlight atomic.Int64

	// Loop-only state.
	user      any
	batch     []byte
	inTraffic bool
	part      []byte // the start of an incomplete frame; nil when none
	need      int    // the length of the frame in part, once its header is in
	skip      int64  // bytes still to drop of a frame over MaxPayload

	// Read by the janitor and the budget from other goroutines.
	partialSince atomic.Int64 // unix ns when the frame now arriving began; 0 when none
	partCharge   atomic.Int64 // cap(part), charged to the budget
	outCharge    atomic.Int64 // cap of every slice in out, charged to the budget; written under mu
	outMoved     atomic.Int64 // unix ns when the socket last took queued bytes, or the queue began; written under mu
	doomed       atomic.Bool  // being closed for the budget
	doomedBytes  atomic.Int64 // what it held when doomed
	timedOut     atomic.Bool
	slow         atomic.Bool

	fd int // the socket: every write is netio's own (see Send)

	// mu orders every write to the socket and the close: OnClose sets
	// closed before gnet closes the descriptor, so a write under mu never
	// hits a closed or reused descriptor.
	mu     sync.Mutex
	closed bool     // guarded by mu
	out    [][]byte // guarded by mu: answers the socket has not taken yet, in order
	outOff int      // guarded by mu: bytes of out[0] already written
	polled bool     // guarded by mu: the outPoller watches the socket
}

// Port is the port the connection came in on. A frame's handler uses it,
// not the value Listen returns: the loops serve before Listen returns.
func (c *Conn) Port() *Port { return c.srv }

// ID is unique among the connections of one Port.
func (c *Conn) ID() uint64 { return c.id }

// RemoteAddr is the peer's host:port.
func (c *Conn) RemoteAddr() string { return c.remote }

// Context returns what SetContext stored. Event loop only.
func (c *Conn) Context() any { return c.user }

// SetContext stores the caller's per-connection state. Event loop only.
func (c *Conn) SetContext(v any) { c.user = v }

// consume cuts b, bytes just read, into frames. Whole frames are handed on
// straight from b; the start of an incomplete one is copied into c.part
// (charged to the budget, timed by FrameTimeout); a frame over MaxPayload
// is answered and its bytes dropped as they come. On the loop.
func (c *Conn) consume(b []byte) gnet.Action {
	for len(b) > 0 {
		if c.doomed.Load() || c.timedOut.Load() {
			return gnet.Close // being closed: read nothing more into memory
		}
		if c.skip > 0 {
			k := min(c.skip, int64(len(b)))
			c.skip -= k
			b = b[k:]
			if c.skip == 0 {
				c.partialSince.Store(0)
			}
			continue
		}
		if c.part != nil {
			if len(c.part) < netio.HeaderSize {
				k := min(netio.HeaderSize-len(c.part), len(b))
				c.part = append(c.part, b[:k]...)
				b = b[k:]
				if len(c.part) < netio.HeaderSize {
					return gnet.None
				}
				n, ok, action := c.header(c.part)
				if !ok {
					c.dropPart(c.skip > 0)
					if action != gnet.None {
						return action
					}
					continue
				}
				c.need = n
			}
			k := min(c.need-len(c.part), len(b))
			if !c.growPart(len(c.part) + k) {
				return gnet.Close
			}
			c.part = append(c.part, b[:k]...)
			b = b[k:]
			if len(c.part) < c.need {
				return gnet.None
			}
			action := c.dispatch(c.part)
			c.dropPart(false)
			if action != gnet.None {
				return action
			}
			continue
		}
		if len(b) < netio.HeaderSize {
			c.startPart(0)
			if !c.growPart(len(b)) {
				return gnet.Close
			}
			c.part = append(c.part, b...)
			return gnet.None
		}
		n, ok, action := c.header(b)
		if !ok {
			if action != gnet.None {
				return action
			}
			b = b[netio.HeaderSize:] // the rest is skipped above
			continue
		}
		if len(b) < n {
			c.startPart(n)
			if !c.growPart(len(b)) {
				return gnet.Close
			}
			c.part = append(c.part, b...)
			return gnet.None
		}
		if action := c.dispatch(b[:n]); action != gnet.None {
			return action
		}
		b = b[n:]
	}
	return gnet.None
}

// header checks the header at the start of h. For a good frame within
// MaxPayload it returns its length and ok. A frame over MaxPayload is
// answered, counted and set to be skipped (ok false, gnet.None); a bad
// header is counted and closes the connection.
func (c *Conn) header(h []byte) (n int, ok bool, action gnet.Action) {
	s := c.srv
	total, payload, err := netio.CheckHeader(h)
	if err != nil {
		s.countBad(c, err)
		return 0, false, gnet.Close
	}
	if uint64(payload) <= uint64(s.maxPayload) {
		return int(total), true, gnet.None
	}
	s.oversized.Add(1)
	inc(s.mOversized)
	switch netio.Kind(h[3]) {
	case netio.KindCall, netio.KindNameLookup:
		c.expectAnswer()
		c.SendNow(netio.AppendError(nil, binary.BigEndian.Uint64(h[8:16]), netio.CodeMessageTooBig,
			fmt.Sprintf("%d bytes, this node takes at most %d", payload, s.maxPayload)))
	}
	c.skip = total - netio.HeaderSize
	if c.partialSince.Load() == 0 {
		c.partialSince.Store(time.Now().UnixNano())
	}
	return 0, false, gnet.None
}

// startPart begins an incomplete frame of n bytes (0: its header is not in
// yet).
func (c *Conn) startPart(n int) {
	c.need = n
	c.part = []byte{}
	c.partialSince.Store(time.Now().UnixNano())
}

// growPart makes room in c.part for want bytes, charging the budget for
// what it adds. It reports false when the budget closed this connection.
func (c *Conn) growPart(want int) bool {
	have := cap(c.part)
	if want <= have {
		return true
	}
	limit := c.need
	if limit == 0 {
		limit = netio.HeaderSize
	}
	size := min(max(want, 2*have, 512), limit)
	if !c.srv.charge(c, int64(size-have)) {
		return false
	}
	p := make([]byte, len(c.part), size)
	copy(p, c.part)
	c.part = p
	return true
}

// dropPart ends the incomplete frame and gives its bytes back to the
// budget; keepTimer leaves the FrameTimeout clock running (a skip follows).
func (c *Conn) dropPart(keepTimer bool) {
	c.srv.charge(c, -int64(cap(c.part)))
	c.part, c.need = nil, 0
	if !keepTimer {
		c.partialSince.Store(0)
	}
}

// dispatch hands one whole frame to the Handler or, once Stop has begun,
// answers it 'node shutting down' itself.
func (c *Conn) dispatch(b []byte) gnet.Action {
	s := c.srv
	f, _, err := netio.Decode(b, s.maxPayload)
	if err != nil { // cannot happen after header(); never trust it
		s.countBad(c, err)
		return gnet.Close
	}
	if f.Kind == netio.KindCall || f.Kind == netio.KindNameLookup {
		c.expectAnswer()
	}
	if s.stopping.Load() {
		switch f.Kind {
		case netio.KindCall, netio.KindNameLookup:
			c.SendNow(netio.AppendError(nil, f.ID, netio.CodeShuttingDown, ""))
		}
		return gnet.None
	}
	if f.Kind == netio.KindCall {
		if unread := c.outCharge.Load(); unread > s.unreadLimit && c.unreadFor() > unreadStall {
			s.countUnread()
			c.SendNow(netio.AppendError(nil, f.ID, netio.CodeServerBusy,
				fmt.Sprintf("%d bytes of answers on this connection are unread", unread)))
			return gnet.None
		}
	}
	s.h.OnFrame(c, f)
	return gnet.None
}

// finish answers what the socket holds when Stop begins, then closes the
// connection. On the loop, as a task.
func (c *Conn) finish() {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return
	}
	// Read until the socket is empty: frames that reached the node are
	// answered, and a close with nothing unread sends FIN, not RST, so the
	// caller reads its answers before the end.
	buf := make([]byte, 64<<10)
	c.inTraffic = true
	for {
		n, err := unix.Read(c.fd, buf)
		if n > 0 && c.consume(buf[:n]) != gnet.None {
			break
		}
		if err == unix.EINTR {
			continue
		}
		if n <= 0 || err != nil {
			break
		}
	}
	c.inTraffic = false
	_ = c.flushBatch()
	c.drainOut() // once, as far as the socket takes it now
	_ = c.gc.EventLoop().Close(c.gc)
}

// Send writes b from any goroutine and takes ownership of b. When nothing
// is waiting to be written on the connection, Send writes to the socket
// itself, so an answer made off the event loop costs no wake-up of the loop;
// what the socket does not take at once waits in the connection's queue,
// and later sends queue behind it, until the socket takes it (written by
// the server's outPoller). It returns ErrConnClosed after the connection
// closed, ErrSlowReader when the bytes waiting exceed Options.MaxOutbound
// and ErrOverBudget when the connection was closed for the node's buffer
// budget; in the last two cases the connection is closed and counted.
func (c *Conn) Send(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sendLocked(b, false)
}

// sendLocked writes b or queues it; with reuse, b is the caller's buffer
// and what is queued is a copy. c.mu is held.
func (c *Conn) sendLocked(b []byte, reuse bool) error {
	switch {
	case c.closed:
		return ErrConnClosed
	case c.slow.Load():
		return ErrSlowReader
	case c.doomed.Load():
		return ErrOverBudget
	}
	c.answered(b)
	off := 0
	if len(c.out) == 0 {
		n, err := writeSome(c.fd, b)
		if err != nil {
			_ = c.gc.Close()
			return fmt.Errorf("netio: send to %s: %w", c.remote, err)
		}
		if n == len(b) {
			return nil
		}
		off = n
	}
	if reuse {
		b, off = bytes.Clone(b[off:]), 0
	}
	return c.queueLocked(b, off)
}

// expectAnswer counts a call (or name lookup) just read as in flight on c
// and its receiver. On the loop.
func (c *Conn) expectAnswer() {
	c.inFlight.Add(1)
	c.rcv.inFlight.Add(1)
	c.rcv.calls.Add(1)
}

// answered takes the answers among the frames of b (replies and errors)
// off c's calls in flight and its receiver's. b holds whole frames, as
// every Send does; a count that would go below zero (an answer to no call
// of ours, a peer's hello refused) stops at zero. c.mu is held.
func (c *Conn) answered(b []byte) {
	var k int64
	for off := 0; off+netio.HeaderSize <= len(b); {
		h := b[off:]
		switch netio.Kind(h[3]) {
		case netio.KindReply:
			k++
		case netio.KindError:
			k++
			countErrorAnswer(netio.Code(h[7]))
		}
		off += netio.HeaderSize + int(h[5]) + int(h[6]) + int(binary.BigEndian.Uint32(h[20:24]))
	}
	for k > 0 {
		have := c.inFlight.Load()
		take := min(have, k)
		if take <= 0 {
			return
		}
		if c.inFlight.CompareAndSwap(have, have-take) {
			c.rcv.inFlight.Add(-take)
			return
		}
	}
}

// writeSome writes what the non-blocking socket takes now.
func writeSome(fd int, b []byte) (int, error) {
	for {
		n, err := unix.Write(fd, b)
		switch err {
		case nil:
			return n, nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, nil
		}
		return 0, os.NewSyscallError("write", err)
	}
}

// queueLocked puts b, of which off bytes are written, behind what waits
// already, and has the outPoller watch the socket. c.mu is held.
func (c *Conn) queueLocked(b []byte, off int) error {
	if c.outCharge.Load()+int64(cap(b)) > c.srv.maxOutbound {
		if c.slow.CompareAndSwap(false, true) {
			c.srv.countSlow(c)
			_ = c.gc.Close()
		}
		return ErrSlowReader
	}
	if len(c.out) == 0 {
		c.outOff = off
		c.outMoved.Store(time.Now().UnixNano())
	}
	c.out = append(c.out, b)
	c.chargeOut(int64(cap(b)))
	if c.doomed.Load() {
		return ErrOverBudget // the budget chose this connection; its close is on the way
	}
	if !c.polled {
		if err := c.srv.outPoll.add(c); err != nil {
			_ = c.gc.Close()
			return err
		}
		c.polled = true
	}
	return nil
}

// drainOut writes what waits in the queue, as far as the socket takes it.
// The outPoller calls it when the socket is writable again.
func (c *Conn) drainOut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writeQueuedLocked()
}

// writeQueuedLocked writes the queue until it is empty or the socket is
// full. c.mu is held.
func (c *Conn) writeQueuedLocked() {
	if c.closed {
		return
	}
	for len(c.out) > 0 {
		head := c.out[0]
		n, err := writeSome(c.fd, head[c.outOff:])
		if err != nil {
			_ = c.gc.Close()
			return
		}
		if n > 0 {
			c.outMoved.Store(time.Now().UnixNano())
		}
		c.outOff += n
		if c.outOff < len(head) {
			return // full: the outPoller calls again when it is writable
		}
		c.out[0] = nil
		c.out = c.out[1:]
		c.outOff = 0
		c.chargeOut(-int64(cap(head)))
	}
	c.out = nil
	if c.polled {
		c.srv.outPoll.del(c)
		c.polled = false
	}
}

// flushBatch writes the answers made during one read. On the loop.
func (c *Conn) flushBatch() error {
	if len(c.batch) == 0 {
		return nil
	}
	c.mu.Lock()
	err := c.sendLocked(c.batch, true)
	c.mu.Unlock()
	if cap(c.batch) > 64<<10 {
		c.batch = nil
	} else {
		c.batch = c.batch[:0]
	}
	return err
}

// SendNow appends b to the answers of the current read, written in one
// write when OnTraffic ends. Only inside OnFrame; b is copied. Called
// elsewhere on the loop it falls back to Send with a copy of b.
func (c *Conn) SendNow(b []byte) {
	if !c.inTraffic {
		_ = c.Send(bytes.Clone(b))
		return
	}
	c.batch = append(c.batch, b...)
}

// Close closes the connection asynchronously; OnClose follows on the loop.
func (c *Conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	return c.gc.Close()
}

// unreadStall is how long a caller may take none of its waiting answers
// before its new calls are refused (with more than the unread limit
// waiting): a caller that reads, however slowly, keeps being served.
const unreadStall = 500 * time.Millisecond

// unreadFor is how long the socket has taken none of the answers waiting
// for it; 0 when none wait.
func (c *Conn) unreadFor() time.Duration {
	if c.outCharge.Load() == 0 {
		return 0
	}
	return time.Duration(time.Now().UnixNano() - c.outMoved.Load())
}
