package rpcport

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"time"
	"tpsched/netio"

	"golang.org/x/sys/unix"
)

// This file is a connection's writing side: answers sent at once when the
// socket takes them, else queued and written by the poller.

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
	defer c.unlock()
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
	case c.wrShut:
		// Stop shut the write side: an answer made after that (a late
		// one) cannot reach the caller.
		c.srv.countUndelivered(countAnswers(b, 0))
		return ErrConnClosed
	}
	c.answered(b)
	off := 0
	if len(c.out) == 0 {
		n, err := writeSome(c.fd, b)
		if err != nil {
			c.srv.countUndelivered(countAnswers(b, 0))
			c.closeLocked()
			return fmt.Errorf("netio: send to %s: %w", c.remote, err)
		}
		if n == len(b) {
			c.shutIfAnsweredLocked()
			c.endIfAnsweredLocked()
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

// Refuse answers a frame that is not a call (a reply or error sent to the
// node, a kind it does not take) with the error frame b, as SendNow does.
// Such a frame was never counted as owed an answer, so it is counted now:
// the error must not settle one of the connection's real calls, whose
// answer a half-close would then find not owed and leave unwritten.
func (c *Conn) Refuse(b []byte) {
	c.inFlight.Add(1)
	c.rcv.inFlight.Add(1)
	c.SendNow(b)
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
		c.srv.countUndelivered(countAnswers(b, off))
		if c.slow.CompareAndSwap(false, true) {
			c.srv.countSlow(c)
			c.closeLocked()
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
			c.closeLocked()
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
	defer c.unlock()
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
			c.closeLocked()
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
	c.shutIfAnsweredLocked()
	c.endIfAnsweredLocked()
}

// flushBatch writes the answers made during one read. On the loop.
func (c *Conn) flushBatch() error {
	if len(c.batch) == 0 {
		return nil
	}
	c.mu.Lock()
	err := c.sendLocked(c.batch, true)
	c.unlock()
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
