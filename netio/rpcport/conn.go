package rpcport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
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

	fd int // the socket: every write is netio's own (see Send); guarded by mu once half

	// half: the caller shut its write side with answers still owed, and
	// gnet let the connection go; fd is then netio's own duplicate, written
	// until the last answer is out (detach). Set under mu.
	half atomic.Bool

	// discard: Stop has answered what the socket held and shuts the write
	// side once the answers are out; what arrives after is not read as
	// calls. Loop-only.
	discard bool

	// mu orders every write to the socket and the close: OnClose sets
	// closed before gnet closes the descriptor, so a write under mu never
	// hits a closed or reused descriptor.
	mu        sync.Mutex
	closed    bool     // guarded by mu
	out       [][]byte // guarded by mu: answers the socket has not taken yet, in order
	outOff    int      // guarded by mu: bytes of out[0] already written
	polled    bool     // guarded by mu: the outPoller watches the socket
	wantShut  bool     // guarded by mu: shut the write side once out is empty (Stop)
	wrShut    bool     // guarded by mu: the write side is shut (FIN sent after every answer)
	unlockEnd bool     // guarded by mu: a half connection ended under mu; unlock finishes it
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
	if _, cs, ok := partClass(size); ok {
		size = cs // what getPart allocates, and the budget is charged
	}
	if !c.srv.charge(c, int64(size-have)) {
		return false
	}
	p := getPart(len(c.part), size) // partpool.go
	copy(p, c.part)
	putPart(c.part)
	c.part = p
	return true
}

// dropPart ends the incomplete frame and gives its bytes back to the
// budget; keepTimer leaves the FrameTimeout clock running (a skip follows).
func (c *Conn) dropPart(keepTimer bool) {
	c.srv.charge(c, -int64(cap(c.part)))
	putPart(c.part) // the Handler is done with it: a frame aliases it only during OnFrame
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

// finish answers what the socket holds when Stop begins, then has the
// write side shut once every answer is out: the caller reads its answers,
// then a FIN. Frames that arrive after are not read as calls (discard): a
// call the node did not answer before its FIN never ran, and may be sent
// again. Stop closes the connection once the caller has them all (or its
// time is up). On the loop, as a task.
func (c *Conn) finish() {
	c.mu.Lock()
	if c.half.Load() && !c.closed {
		// Detached since Stop looked (its OnClose ran on this loop
		// first): c.fd is netio's duplicate, which an answer may close
		// at any moment and the number go to another descriptor, so it
		// is not read; the caller sent all it will. As Stop does for a
		// connection half already.
		c.shutWhenWrittenLocked()
		c.unlock()
		return
	}
	closed := c.closed
	c.mu.Unlock()
	if closed || c.discard {
		return
	}
	// Read until the socket is empty: frames that reached the node are
	// answered.
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
	c.discard = true
	if c.part != nil {
		c.dropPart(false)
	}
	c.skip = 0
	c.partialSince.Store(0)
	c.mu.Lock()
	c.shutWhenWrittenLocked()
	c.unlock()
}

// shutWhenWrittenLocked shuts the socket's write side now if no answer is
// owed, else once the last is written (shutIfAnsweredLocked). c.mu is
// held.
func (c *Conn) shutWhenWrittenLocked() {
	c.wantShut = true
	c.shutIfAnsweredLocked()
}

// shutIfAnsweredLocked shuts the write side, as Stop wants, once no answer
// waits in the queue and none is owed: a call the handler has not yet
// answered holds the FIN back, so a clean close still means every answer
// came (Stop resets the connection if the answer does not come within
// stopLinger). c.mu is held.
func (c *Conn) shutIfAnsweredLocked() {
	if c.wantShut && !c.wrShut && !c.closed && len(c.out) == 0 && c.inFlight.Load() <= 0 {
		c.wrShut = true
		_ = unix.Shutdown(c.fd, unix.SHUT_WR)
	}
}

// settled reports whether Stop may close c: it is closed, or its write
// side is shut and the caller's kernel has taken every byte (SIOCOUTQ: none
// unacknowledged), so that a close, even one that resets because the
// caller wrote on, loses no answer.
func (c *Conn) settled() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return true
	}
	if !c.wrShut {
		return false
	}
	n, err := unix.IoctlGetInt(c.fd, unix.SIOCOUTQ)
	return err != nil || n == 0
}

// Close closes the connection asynchronously; OnClose follows on the loop
// (for a connection its caller half-closed, at once, on this goroutine).
func (c *Conn) Close() error {
	c.mu.Lock()
	defer c.unlock()
	if c.closed {
		return nil
	}
	c.closeLocked()
	return nil
}

// closeLocked closes c: through gnet (OnClose follows on the loop), or,
// for a half connection, here (unlock runs the Handler's OnClose). c.mu is
// held.
func (c *Conn) closeLocked() {
	if c.closed {
		return
	}
	if c.half.Load() {
		c.endLocked()
		c.unlockEnd = true
		return
	}
	_ = c.gc.Close()
}

// abort closes c from a goroutine that must not take c.mu first (one
// holding the Port's lock): through gnet, or on a goroutine of its own.
func (c *Conn) abort() {
	if c.half.Load() {
		go func() { _ = c.Close() }()
		return
	}
	_ = c.gc.Close()
}

// unlock releases c.mu and, when a half connection ended under it, does
// what gnet's OnClose does for the others: gives its bytes and counts back
// and tells the Handler.
func (c *Conn) unlock() {
	end := c.unlockEnd
	c.unlockEnd = false
	c.mu.Unlock()
	if end {
		c.srv.released(c)
	}
}

// A half-closed caller. A caller may send its calls and shut its write
// side (shutdown(SHUT_WR)) and then read its answers. gnet reads that as
// the end of the connection and closes it; its answers would go nowhere
// (a caller that sent 4 calls so got none). So when gnet ends a connection
// on the caller's EOF while answers are owed (calls in flight, or answers
// waiting to be written) and the socket can still be written (CLOSE_WAIT:
// the caller sent FIN, not RST), netio takes a duplicate of the socket
// before gnet closes its own (from the descriptor reserve) and goes on
// writing answers on it; the connection stays counted and open until its
// last owed answer is written, then closes (FIN). Each call's own deadline
// (watch_time, the caller's timeout) and the node's drain bound the wait;
// a caller that resets meanwhile ends it at the next write.

// tcpCloseWait is the kernel's TCP_CLOSE_WAIT: the peer sent FIN.
const tcpCloseWait = 8

// detach keeps c open for its owed answers after the caller's EOF, when
// gnet is about to close it; it reports whether it did. On the loop, in
// OnClose, before gnet closes its descriptor.
func (c *Conn) detach(err error) bool {
	if !errors.Is(err, io.EOF) || c.doomed.Load() || c.timedOut.Load() || c.slow.Load() {
		return false // netio closes it, or it failed: nothing to keep it for
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || (c.inFlight.Load() <= 0 && len(c.out) == 0) {
		return false
	}
	info, ierr := unix.GetsockoptTCPInfo(c.fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if ierr != nil || info.State != tcpCloseWait {
		return false // reset, or not a plain half-close
	}
	nfd, derr := c.srv.fds.dup(c.fd)
	if derr != nil {
		c.srv.log.Warn("netio: a caller that half-closed its connection cannot be kept for its answers", "remote", c.remote, "err", derr)
		return false
	}
	if c.polled {
		c.srv.outPoll.del(c) // gnet's descriptor, about to close
		c.polled = false
	}
	gnetFD := c.fd
	c.fd = nfd
	if len(c.out) > 0 {
		if err := c.srv.outPoll.add(c); err != nil {
			c.fd = gnetFD // gnet closes the connection as it meant to
			unix.Close(nfd)
			return false
		}
		c.polled = true
	}
	c.half.Store(true)
	return true
}

// endIfAnsweredLocked ends a half connection once it owes no answer.
// c.mu is held.
func (c *Conn) endIfAnsweredLocked() {
	if c.half.Load() && !c.closed && c.inFlight.Load() <= 0 && len(c.out) == 0 {
		c.endLocked()
		c.unlockEnd = true
	}
}

// endLocked marks c closed: the answers it still owes are counted as
// undelivered, the outPoller lets it go, and a half connection's own
// descriptor is closed (gnet closes the others' after OnClose). c.mu is
// held.
func (c *Conn) endLocked() {
	c.closed = true
	owed := c.inFlight.Swap(0)
	c.rcv.inFlight.Add(-owed) // their answers, if any come, are not written
	owed += int64(c.queuedAnswers())
	if owed > 0 {
		c.srv.countUndelivered(int(owed))
		if !c.half.Load() {
			// Answers were owed and will not come: a reset, not a FIN,
			// so that a clean end always means every answer came.
			_ = unix.SetsockoptLinger(c.fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
		}
	}
	if c.polled {
		c.srv.outPoll.del(c) // before the descriptor closes
		c.polled = false
	}
	if c.half.Load() {
		if owed > 0 {
			_ = unix.SetsockoptLinger(c.fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
		}
		unix.Close(c.fd)
	}
	c.out = nil
}

// queuedAnswers counts the answer frames in c.out not wholly written.
// c.mu is held.
func (c *Conn) queuedAnswers() int {
	n := 0
	for i, b := range c.out {
		from := 0
		if i == 0 {
			from = c.outOff
		}
		n += countAnswers(b, from)
	}
	return n
}

// countAnswers counts the replies and errors among the whole frames of b
// that end after byte from.
func countAnswers(b []byte, from int) int {
	n := 0
	for off := 0; off+netio.HeaderSize <= len(b); {
		h := b[off:]
		end := off + netio.HeaderSize + int(h[5]) + int(h[6]) + int(binary.BigEndian.Uint32(h[20:24]))
		if k := netio.Kind(h[3]); end > from && (k == netio.KindReply || k == netio.KindError) {
			n++
		}
		off = end
	}
	return n
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
