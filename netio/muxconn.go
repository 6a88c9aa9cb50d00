package netio

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// This file is the calling side of the wire: a dialled connection that
// carries many calls at once (MuxConn) and the one loop that cuts a byte
// stream into frames (FrameReader). The Go client, the forwarder that moves
// calls between nodes and the bench's caller all use it. It imports only the
// standard library and the codec (frame.go), so a program that only calls
// (the client) never links gnet through it.

// Errors of a MuxConn's calls.
var (
	// ErrClosedByPeer ends the calls of a connection the other side closed.
	ErrClosedByPeer = errors.New("netio: connection closed by the peer")
	// ErrCallExpired answers a call whose deadline passed (MuxConn.Expire).
	ErrCallExpired = errors.New("netio: no answer before the call's deadline")
	// ErrGoingAway refuses a call on a connection the node asked to go
	// away from (KindGoAway): the call was not sent and may go on a new
	// connection. It is also the close reason once the last answer came.
	ErrGoingAway = errors.New("netio: the node asked for a new connection (it is handing its port over)")
	// ErrWriteTimeout is a write the node did not take in time: as the
	// close reason, a write that did not finish by the deadline of the
	// calls whose frames it held (and at least writePatience); as a call's
	// own error, its deadline passed before its frame was (all) written,
	// and the connection goes on.
	ErrWriteTimeout = errors.New("netio: the node did not take the frames written to it in time (it reads slowly or not at all)")
)

// writePatience is the least time a write is given before it fails the
// connection, however early the deadlines of the calls in it: frames that
// waited behind a long write may carry deadlines already past, and a node
// that reads, slowly, must not lose its connection for them. The peer
// pool counts a link silent after as long (TCP_USER_TIMEOUT, 5 s).
const writePatience = 5 * time.Second

// sendTimeout is a call's own deadline passing before its frame was
// written (or all of it): the call's error, not the connection's.
type sendTimeout struct{ why string }

func (e *sendTimeout) Error() string { return "netio: the call's deadline passed " + e.why }
func (e *sendTimeout) Unwrap() error { return ErrWriteTimeout }

// failsConn reports whether err, from a write, fails the connection.
func failsConn(err error) bool {
	var st *sendTimeout
	return err != nil && !errors.As(err, &st)
}

// FrameReader reads whole frames off a byte stream.
type FrameReader struct {
	r          *bufio.Reader
	maxPayload int
	skip       int64 // bytes of a frame over maxPayload the next Read drops first
}

// FrameSizeError is a frame whose good header announces a payload over
// the reader's limit. The frame is not read: the next Read drops its bytes
// as they come, never holding them, so a reader that goes on stays in
// step with the stream (as the node's port does with a call over its cap).
// errors.Is(err, ErrFrameSize) holds.
type FrameSizeError struct {
	Header        // the frame's header: whose answer it is
	Size   uint32 // the payload length it announces
	Limit  int    // the reader's limit
}

func (e *FrameSizeError) Error() string {
	return fmt.Sprintf("netio: %v frame of %d bytes, over the limit of %d", e.Kind, e.Size, e.Limit)
}

func (e *FrameSizeError) Unwrap() error { return ErrFrameSize }

// NewFrameReader reads frames from r; a frame whose payload exceeds
// maxPayload is a *FrameSizeError, which the reader may go on after; bad
// magic, version or kind is an error it may not.
func NewFrameReader(r io.Reader, maxPayload int) *FrameReader {
	return &FrameReader{r: bufio.NewReaderSize(r, 64<<10), maxPayload: maxPayload}
}

// Read reads the next frame into buf, growing it when the frame does not
// fit, and returns the frame, which aliases the returned buffer. It returns
// io.EOF only when the stream ends between frames; a stream that ends
// inside a frame is io.ErrUnexpectedEOF.
func (fr *FrameReader) Read(buf []byte) (Frame, []byte, error) {
	for fr.skip > 0 {
		// Discard goes through bufio's own buffer: nothing the size of
		// the frame is allocated. In steps, for an int of 32 bits.
		n, err := fr.r.Discard(int(min(fr.skip, 1<<30)))
		fr.skip -= int64(n)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return Frame{}, buf, err
		}
	}
	hdr, err := fr.r.Peek(HeaderSize)
	if err != nil {
		if err == io.EOF && len(hdr) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, buf, err
	}
	n, err := FrameLen(hdr, fr.maxPayload)
	if err == ErrFrameSize {
		total, size, _ := CheckHeader(hdr) // good: FrameLen checked it
		fr.skip = total
		return Frame{}, buf, &FrameSizeError{Header: header(hdr), Size: size, Limit: fr.maxPayload}
	}
	if err != nil {
		return Frame{}, buf, err
	}
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(fr.r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, buf, err
	}
	f, _, err := Decode(buf, fr.maxPayload)
	return f, buf, err
}

// tooBig is the answer a call gets when its own is over the connection's
// limit: a 'message too big' error frame, as the node sends for a call
// over its cap. The service may have run; only its answer is lost.
func tooBig(e *FrameSizeError) Frame {
	msg := fmt.Sprintf("the answer has %d bytes, this caller takes at most %d", e.Size, e.Limit)
	return Frame{Header: Header{Kind: KindError, Code: CodeMessageTooBig, ID: e.ID}, Payload: []byte(msg)}
}

// Answerer receives the answer to one call of a MuxConn, exactly once: the
// answering frame (err nil; its buffer belongs to the Answerer), or the
// reason there is none (the connection closed, the deadline passed). An
// answer over MaxPayload comes as an error frame 'message too big' made by
// the MuxConn. It is called on the connection's reader goroutine, or on
// whichever goroutine closes or expires, and must not block.
type Answerer interface {
	Answer(f Frame, err error)
}

// MuxOptions configure a MuxConn.
type MuxOptions struct {
	// MaxPayload bounds the answers read. A larger one is skipped, its
	// bytes never held, and its call alone is answered 'message too big'
	// (the service may have run); the connection and its other calls go
	// on. Default 1 MiB.
	MaxPayload int
	// Reader, if set, is the FrameReader already used on the connection (a
	// handshake), so that bytes it buffered are not lost.
	Reader *FrameReader
	// OnClose, if set, is called once when the connection closes, with the
	// connection and the reason, before any waiting call is answered: by
	// the time a caller hears of the close, its owner has forgotten the
	// connection. It may come before NewMuxConn returns (the read loop
	// runs at once), so it is given the connection rather than left to
	// read the owner's variable.
	OnClose func(m *MuxConn, err error)
	// OnGoAway, if set, is called once when the node asks the caller to
	// leave the connection (KindGoAway), before the connection closes:
	// its owner should stop handing it calls (they would get ErrGoingAway)
	// and open another. Calls already sent are answered as usual, and
	// the connection closes itself once none waits and every frame queued
	// is written. It is given the connection, as OnClose is.
	OnGoAway func(m *MuxConn)
	// MaxQueued bounds the bytes of frames that wait behind a write under
	// way: a call that would queue more waits for room until its deadline
	// (then it is not sent, ErrWriteTimeout) or the close. A frame always
	// fits an empty queue. Default 8 MiB.
	MaxQueued int
	// CallerReads starts no reader goroutine: calls are made with
	// RoundTrip, which reads its own answer on the caller's goroutine. For
	// a connection that carries one call at a time, it saves a goroutine
	// hand-off per call (the bench's closed loop).
	CallerReads bool
}

// MuxConn is one dialled connection carrying any number of calls at once.
// A call registers an Answerer under a fresh request id and its frame goes
// out; a reader goroutine hands each answer to the Answerer of its id. The
// connection closes once (Close, a failed write, a failed read); every call
// still waiting is then answered with the reason.
//
// Writers share write syscalls: a frame is appended to one buffer, and
// whoever finds no write under way writes the buffer, taking along what
// others appended meanwhile. A node that stops reading cannot hold them:
// each write is bounded by the earliest deadline of the calls whose
// frames it holds or that queue behind it (at least writePatience), and
// one that does not finish fails the connection (ErrWriteTimeout); the
// writer's own caller leaves at its own deadline, handing the rest of the
// write to a goroutine; and the frames queued behind a write are bounded
// (MuxOptions.MaxQueued).
type MuxConn struct {
	nc       net.Conn
	fr       *FrameReader
	onClose  func(*MuxConn, error)
	onGoAway func(*MuxConn)

	wmu       sync.Mutex
	wbuf      []byte
	wdl       time.Time // the earliest deadline of the calls in wbuf; zero: none
	spare     []byte
	flushing  bool
	werr      error         // the first write error, or the close reason
	ndl       time.Time     // the write deadline set on nc (under wmu)
	room      chan struct{} // closed when wbuf is taken for writing; nil: nobody waits
	maxQueued int

	readDeadline bool // RoundTrip set one on nc

	mu        sync.Mutex
	pending   map[uint64]waiting
	nextID    uint64
	err       error // why it closed; nil while open
	goingAway bool  // the node sent KindGoAway: no new call, close when pending is empty
	done      chan struct{}
}

type waiting struct {
	a        Answerer
	deadline time.Time // zero: none
}

// NewMuxConn takes over nc and starts its reader goroutine.
func NewMuxConn(nc net.Conn, opts MuxOptions) *MuxConn {
	if opts.MaxPayload <= 0 {
		opts.MaxPayload = 1 << 20 // OpenTP1's default max_message_size
	}
	fr := opts.Reader
	if fr == nil {
		fr = NewFrameReader(nc, opts.MaxPayload)
	}
	fr.maxPayload = opts.MaxPayload
	if opts.MaxQueued <= 0 {
		opts.MaxQueued = 8 << 20 // one frame of the largest max_message_size
	}
	m := &MuxConn{nc: nc, fr: fr, onClose: opts.OnClose, onGoAway: opts.OnGoAway, pending: map[uint64]waiting{},
		done: make(chan struct{}), maxQueued: opts.MaxQueued}
	if !opts.CallerReads {
		go m.readLoop()
	}
	return m
}

// RoundTrip, on a connection made with CallerReads, sends one call and
// reads frames until its answer, which it returns in buf (grown when too
// small); answers to other ids are dropped. Its answer over MaxPayload is
// skipped, and RoundTrip returns an error frame 'message too big' in its
// place, as a reader goroutine would. A deadline that passes fails it with
// os.ErrDeadlineExceeded, while its frame is written as while its answer
// is awaited. Any error closes the connection. One RoundTrip at a time.
func (m *MuxConn) RoundTrip(h Header, group, service string, payload []byte, deadline time.Time, buf []byte) (Frame, []byte, error) {
	m.mu.Lock()
	err := m.err
	if err == nil && m.goingAway {
		err = ErrGoingAway
	}
	m.nextID++
	h.ID = m.nextID
	m.mu.Unlock()
	if err != nil {
		return Frame{}, buf, err
	}
	if !deadline.IsZero() || m.readDeadline {
		if err := m.nc.SetReadDeadline(deadline); err != nil {
			m.Close(err)
			return Frame{}, buf, err
		}
		m.readDeadline = !deadline.IsZero()
	}
	m.wmu.Lock()
	if m.werr == nil {
		m.wbuf = AppendFrame(m.wbuf, h, group, service, payload)
		m.wdl = deadline
	}
	// The write leaves at the deadline too: a node that does not read must
	// not hold the round trip past it. What is cut goes nowhere: the close
	// below ends the connection.
	if _, err := m.flushLocked(nil, time.Time{}, deadline); err != nil {
		if !failsConn(err) {
			err = fmt.Errorf("%w: %w", err, os.ErrDeadlineExceeded)
		}
		m.Close(err)
		return Frame{}, buf, err
	}
	for {
		var f Frame
		f, buf, err = m.fr.Read(buf)
		var fse *FrameSizeError
		if errors.As(err, &fse) {
			if err = notAnswer(Frame{Header: fse.Header}); err == nil && fse.ID == h.ID {
				return tooBig(fse), buf, nil
			}
			if err == nil {
				continue // the next Read skips it
			}
		}
		if err != nil {
			if err == io.EOF {
				err = ErrClosedByPeer
			}
			m.Close(err)
			return Frame{}, buf, err
		}
		if f.Kind == KindGoAway && f.ID == 0 {
			m.mu.Lock()
			m.goingAway = true // the next RoundTrip is refused; this one's answer still comes
			m.mu.Unlock()
			continue
		}
		if err := notAnswer(f); err != nil {
			m.Close(err)
			return Frame{}, buf, err
		}
		if f.ID == h.ID {
			return f, buf, nil
		}
	}
}

// notAnswer is the error of a frame a node never sends a caller: all it
// sends are answers (reply, error) and the go-away (id 0). Any other is a
// peer that speaks another protocol, and closes the connection; it is
// never handed to a call as its answer.
func notAnswer(f Frame) error {
	if f.Kind == KindReply || f.Kind == KindError {
		return nil
	}
	return fmt.Errorf("%w: a %v frame (id %d) from the node, which sends only answers", ErrBadKind, f.Kind, f.ID)
}

// NetConn is the underlying connection (for its addresses and socket
// options; reading or writing it directly breaks the MuxConn).
func (m *MuxConn) NetConn() net.Conn { return m.nc }

// Expect registers a for the answer to a call under a fresh id, which the
// caller puts in the call's frame. A non-zero deadline lets Expire answer
// it ErrCallExpired. It fails with the close reason once the connection
// closed.
func (m *MuxConn) Expect(deadline time.Time, a Answerer) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return 0, m.err
	}
	if m.goingAway {
		return 0, ErrGoingAway
	}
	m.nextID++
	m.pending[m.nextID] = waiting{a: a, deadline: deadline}
	return m.nextID, nil
}

// GoingAway reports whether the node asked the caller to leave this
// connection (KindGoAway): it takes no new call.
func (m *MuxConn) GoingAway() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.goingAway
}

// closeIfLeft closes a connection the node asked to leave once no call
// waits on it and no frame is queued or being written: a call without an
// answer is in no pending set, and its frame, queued behind another
// writer's, must go out whole before the close (its caller was told it
// was sent). The writer calls it again when it is done. Neither lock is
// held.
func (m *MuxConn) closeIfLeft() {
	m.mu.Lock()
	left := m.goingAway && m.err == nil && len(m.pending) == 0
	m.mu.Unlock()
	if !left {
		return
	}
	// A call that passed the go-away check before it was set may append a
	// frame after this look: it then finds the connection closed and is
	// told its frame was not sent.
	m.wmu.Lock()
	writing := m.flushing || len(m.wbuf) > 0
	m.wmu.Unlock()
	if !writing {
		m.Close(ErrGoingAway)
	}
}

// goAway marks the connection as left by the node's wish.
func (m *MuxConn) goAway() {
	m.mu.Lock()
	first := !m.goingAway && m.err == nil
	m.goingAway = true
	m.mu.Unlock()
	if first && m.onGoAway != nil {
		m.onGoAway(m)
	}
	m.closeIfLeft()
}

// Retire is its owner's go-away: the connection takes no new call (as
// after the node's KindGoAway, a new one fails with ErrGoingAway and
// GoingAway reports true) and closes itself once no call waits on it and
// every frame queued is written. The calls sent on it are answered as usual. OnGoAway is not called: the
// owner knows.
func (m *MuxConn) Retire() {
	m.mu.Lock()
	m.goingAway = true
	m.mu.Unlock()
	m.closeIfLeft()
}

// Forget withdraws the Answerer of id and reports whether it was still
// waiting: if so it will never be called; if not, it has been or is being
// answered.
func (m *MuxConn) Forget(id uint64) bool {
	m.mu.Lock()
	if _, ok := m.pending[id]; !ok {
		m.mu.Unlock()
		return false
	}
	delete(m.pending, id)
	m.mu.Unlock()
	m.closeIfLeft()
	return true
}

// Call sends one frame. With a, the answer goes to a under the id Call
// gives the frame (h.ID is ignored) and returns, for Forget; without (a
// call nobody waits for), the frame gets a fresh id all the same.
//
// sent reports whether the frame may have reached the other side, even
// when err is set: a writer that flushes other callers' frames after its
// own must not make its own, already written call look unsent. When sent is
// false the frame certainly did not go out and a is never called: the call
// may be tried elsewhere. When sent is true a gets exactly one answer.
//
// A non-zero deadline bounds the call's stay: a frame queued behind
// others over MaxQueued waits for room until then; Call returns by then
// even when it is the writer (the rest of its write goes on in another
// goroutine), and the writes of its frame fail the connection when the
// node takes none of it by then (or writePatience). Its own deadline
// passing is ErrWriteTimeout with the connection open, and sent says
// whether any of the frame left. Call returns once the frame is written
// or queued behind a write under way.
func (m *MuxConn) Call(h Header, group, service string, payload []byte, deadline time.Time, a Answerer) (id uint64, sent bool, err error) {
	if !deadline.IsZero() && !time.Now().Before(deadline) {
		// Written now, it would fail the connection at once.
		return 0, false, &sendTimeout{"before the call was sent"}
	}
	if a != nil {
		if h.ID, err = m.Expect(deadline, a); err != nil {
			return 0, false, err
		}
	} else {
		m.mu.Lock()
		if err = m.err; err == nil && m.goingAway {
			err = ErrGoingAway
		}
		m.nextID++
		h.ID = m.nextID
		m.mu.Unlock()
		if err != nil {
			return 0, false, err
		}
	}
	m.wmu.Lock()
	if err = m.roomLocked(HeaderSize+len(group)+len(service)+len(payload), deadline); err != nil { // lockcheck: it lets go of wmu while it waits
		m.wmu.Unlock()
	} else {
		if m.werr == nil {
			m.wbuf = AppendFrame(m.wbuf, h, group, service, payload)
			if !deadline.IsZero() && (m.wdl.IsZero() || deadline.Before(m.wdl)) {
				m.wdl = deadline
			}
		}
		sent, err = m.flushLocked(nil, time.Time{}, deadline) // bounds a write under way by deadline
	}
	if !sent && a != nil && !m.Forget(h.ID) {
		// The connection closed under us and answered a already.
		sent = true
	}
	if failsConn(err) {
		m.Close(err) // after Forget: an unsent call is not answered
	}
	return h.ID, sent, err
}

// roomLocked waits until a frame of n bytes may join wbuf: while a write
// is under way and wbuf holds more than maxQueued with it, until deadline
// (zero: none) or the close. wmu is held, and is again on return.
func (m *MuxConn) roomLocked(n int, deadline time.Time) error {
	var expired <-chan time.Time
	for m.werr == nil && m.flushing && len(m.wbuf) > 0 && len(m.wbuf)+n > m.maxQueued {
		if expired == nil && !deadline.IsZero() {
			t := time.NewTimer(time.Until(deadline))
			defer t.Stop()
			expired = t.C
		}
		if m.room == nil {
			m.room = make(chan struct{})
		}
		room, queued := m.room, len(m.wbuf)
		m.wmu.Unlock()
		select { // lockcheck: wmu was let go just above, and is taken again after
		case <-room:
		case <-m.done: // werr is set by then
		case <-expired:
			m.wmu.Lock()
			return &sendTimeout{fmt.Sprintf("while %d bytes waited to be written ahead of it (the node reads slowly or not at all)", queued)}
		}
		m.wmu.Lock()
	}
	return nil
}

// Write sends frames already encoded (their ids from Expect). deadline is
// the earliest of their calls' (zero: none): as for Call's frames, a write
// of them that does not finish by then, and at least writePatience, fails
// the connection (ErrWriteTimeout), so a node that stops reading cannot
// hold the writer. sent is as for Call; the Answerers of frames that were
// not sent are answered by the close that a failed write causes.
func (m *MuxConn) Write(frames []byte, deadline time.Time) (sent bool, err error) {
	m.wmu.Lock()
	sent, err = m.flushLocked(frames, deadline, time.Time{})
	if err != nil {
		m.Close(err)
	}
	return sent, err
}

// flushLocked writes direct (if not nil; dl is the earliest deadline of
// its calls, zero: none) and then wbuf, unless another writer is at it:
// then direct joins wbuf for that writer. own is the
// deadline of the caller (zero: none), past which it hands the write to
// another goroutine and returns. wmu is held and is released on return.
// err is the write error this call met, or the connection's if it could
// not write at all; a close that comes after its writes succeeded is not
// its error.
func (m *MuxConn) flushLocked(direct []byte, dl, own time.Time) (sent bool, err error) {
	if m.werr != nil {
		err := m.werr
		m.wmu.Unlock()
		return false, err
	}
	if m.flushing {
		m.wbuf = append(m.wbuf, direct...)
		if !dl.IsZero() && (m.wdl.IsZero() || dl.Before(m.wdl)) {
			m.wdl = dl
		}
		m.boundLocked()
		m.wmu.Unlock()
		return true, nil // the writer under way takes our frame with it
	}
	m.flushing = true
	if direct != nil {
		return m.writeOn(direct, dl, true, own)
	}
	out, dl := m.takeLocked()
	return m.writeOn(out, dl, false, own)
}

// takeLocked takes wbuf for writing, with its calls' earliest deadline.
func (m *MuxConn) takeLocked() ([]byte, time.Time) {
	// wbuf and spare never share an array: appends during the next
	// write must not touch the bytes being written.
	out, dl := m.wbuf, m.wdl
	m.wbuf, m.wdl = m.spare[:0], time.Time{}
	if m.room != nil {
		close(m.room) // the calls waiting for room may queue again
		m.room = nil
	}
	return out, dl
}

// writeOn writes out, whose calls' earliest deadline is dl (zero: none),
// and then what others queue meanwhile, until wbuf is empty; flushing is
// set and wmu held, and released on return. ours says out is the caller's
// own buffer (Write's frames), never kept as spare. sent says whether the
// first write took any byte. own is as for flushLocked.
func (m *MuxConn) writeOn(out []byte, dl time.Time, ours bool, own time.Time) (sent bool, err error) {
	first := true // our frame is in the first write
	for len(out) > 0 {
		limit := dl
		if !m.wdl.IsZero() && (limit.IsZero() || m.wdl.Before(limit)) {
			limit = m.wdl // the frames queued behind wait for this write too
		}
		if !limit.IsZero() {
			limit = later(limit, time.Now().Add(writePatience))
		}
		stop, handOff := limit, false
		if !own.IsZero() && (stop.IsZero() || own.Before(stop)) {
			stop, handOff = own, true // the caller leaves earlier than the write must end
		}
		var n int
		werr := m.deadlineLocked(stop)
		if werr == nil {
			m.wmu.Unlock()
			n, werr = m.nc.Write(out)
			m.wmu.Lock()
		}
		wasFirst := first
		if first {
			sent, first = werr == nil || n > 0, false
		}
		if werr != nil && handOff && m.werr == nil && errors.Is(werr, os.ErrDeadlineExceeded) && !time.Now().Before(own) {
			// Our caller's deadline, not the frames': the caller goes, and
			// another goroutine writes on (a frame begun must not be cut).
			// Write (ours) has no own deadline: never here.
			if wasFirst && n == 0 {
				// None of our frame left (the first write holds it
				// alone: wbuf was empty before it): it is dropped, and
				// the call was not sent.
				m.spare = out
				err = &sendTimeout{"before its frame could be written (the node reads slowly or not at all)"}
				if len(m.wbuf) == 0 {
					break
				}
				go m.carry(nil, time.Time{}) // what others queued meanwhile
			} else {
				sent = sent || wasFirst // the rest of our frame goes on
				err = &sendTimeout{"while its frame, or frames queued with it, were being written (the node reads slowly or not at all)"}
				go m.carry(out[n:], dl)
			}
			m.wmu.Unlock()
			return sent, err
		}
		if !ours {
			m.spare = out
		}
		if werr != nil {
			if errors.Is(werr, os.ErrDeadlineExceeded) {
				werr = fmt.Errorf("%w: %w", ErrWriteTimeout, werr)
			}
			err = werr
			if m.werr == nil {
				m.werr = werr
			}
			break
		}
		if m.werr != nil || len(m.wbuf) == 0 {
			break // closed meanwhile (what others appended stays unsent), or all written
		}
		out, dl = m.takeLocked()
		ours = false
	}
	m.flushing = false
	if cap(m.spare) > 1<<20 {
		m.spare = nil // a huge frame's buffers are not kept
	}
	if len(m.wbuf) == 0 && cap(m.wbuf) > 1<<20 {
		m.wbuf = nil
	}
	m.wmu.Unlock()
	if !failsConn(err) {
		m.closeIfLeft() // a go-away's close waited for these writes
	}
	return sent, err
}

// carry writes on what a caller that left at its deadline had begun.
func (m *MuxConn) carry(rest []byte, dl time.Time) {
	m.wmu.Lock()
	if len(rest) == 0 {
		rest, dl = m.takeLocked()
	}
	if _, err := m.writeOn(rest, dl, false, time.Time{}); err != nil {
		m.Close(err)
	}
}

// deadlineLocked sets the write deadline stop (zero: none) on nc. wmu is
// held.
func (m *MuxConn) deadlineLocked(stop time.Time) error {
	if !stop.Equal(m.ndl) {
		if err := m.nc.SetWriteDeadline(stop); err != nil {
			return err
		}
		m.ndl = stop
	}
	return nil
}

// boundLocked bounds the write under way by the deadline of the frames
// queued behind it (wdl), at least writePatience from now, as if they were
// in it: they wait for it, and a node that does not read must not hold
// them past that. The deadline of a write only comes nearer here; the
// writer sets the next write's. wmu is held.
func (m *MuxConn) boundLocked() {
	if !m.flushing || m.wdl.IsZero() {
		return
	}
	b := later(m.wdl, time.Now().Add(writePatience))
	if m.ndl.IsZero() || b.Before(m.ndl) {
		_ = m.deadlineLocked(b) // a failure is the write's to meet
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Expire answers ErrCallExpired to the calls whose deadline is before now
// and returns how many.
func (m *MuxConn) Expire(now time.Time) int {
	var late []Answerer
	m.mu.Lock()
	for id, w := range m.pending {
		if !w.deadline.IsZero() && now.After(w.deadline) {
			late = append(late, w.a)
			delete(m.pending, id)
		}
	}
	m.mu.Unlock()
	for _, a := range late {
		a.Answer(Frame{}, ErrCallExpired)
	}
	if len(late) > 0 {
		m.closeIfLeft()
	}
	return len(late)
}

// Close closes the connection with reason (nil: net.ErrClosed), calls
// OnClose, and answers every waiting call with the reason. Only the first
// Close does anything.
func (m *MuxConn) Close(reason error) error {
	if reason == nil {
		reason = net.ErrClosed
	}
	m.mu.Lock()
	if m.err != nil {
		m.mu.Unlock()
		return nil
	}
	m.err = reason
	waiters := m.pending
	m.pending = nil
	m.mu.Unlock()
	m.wmu.Lock()
	if m.werr == nil {
		m.werr = reason
	}
	m.wmu.Unlock()
	err := m.nc.Close()
	close(m.done)
	if m.onClose != nil {
		m.onClose(m, reason)
	}
	for _, w := range waiters {
		w.a.Answer(Frame{}, reason)
	}
	return err
}

// Done is closed when the connection has closed.
func (m *MuxConn) Done() <-chan struct{} { return m.done }

// Err is why the connection closed; nil while it is open.
func (m *MuxConn) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// readLoop hands each answer to the call waiting for its id until the
// connection fails; an answer nobody waits for (expired, forgotten) is
// dropped. An answer over MaxPayload does not fail the connection: its
// call gets 'message too big' and the reader skips its bytes, so the
// calls beside it, which may have run too, keep their answers. A frame
// that is no answer (notAnswer) closes it, as a bad header does.
func (m *MuxConn) readLoop() {
	var err error
	for {
		var f Frame
		f, _, err = m.fr.Read(nil)
		var fse *FrameSizeError
		if errors.As(err, &fse) {
			if err = notAnswer(Frame{Header: fse.Header}); err == nil {
				f = tooBig(fse) // the next Read skips its bytes
			}
		}
		if err != nil {
			break
		}
		if f.Kind == KindGoAway && f.ID == 0 {
			m.goAway()
			continue
		}
		if err = notAnswer(f); err != nil {
			break
		}
		m.mu.Lock()
		w, ok := m.pending[f.ID]
		if ok {
			delete(m.pending, f.ID)
		}
		m.mu.Unlock()
		if ok {
			w.a.Answer(f, nil)
			m.closeIfLeft()
		}
	}
	if err == io.EOF {
		err = ErrClosedByPeer
	}
	m.Close(err)
}
