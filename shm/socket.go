package shm

// Socket mode (receive_from = socket): a user server with exactly one process
// that gets its requests over a connected unix stream socket instead of the
// memfd schedule queue. The scheduler side is SocketQueue, with the method set
// of *Segment; the UAP side is the same Server (Attach, Handle, Serve), which
// Attach puts in socket mode when TPSCHED_RECEIVE=socket.
//
// # Wire format
//
// Every message is a 24-byte little-endian header, then the service name (a
// request only), then the payload (a request or a reply only):
//
//	offset 0  u8   kind
//	offset 1  u8   status (reply), flags (hello: 1 = refresh mode, the UAP
//	               serves one request and leaves); 0 otherwise
//	offset 2  u16  service name length (request, <= 32; 0 otherwise)
//	offset 4  u32  payload length (request, reply, <= MaxMessage; 0 otherwise)
//	offset 8  u64  a: pid (hello), MaxMessage (welcome), token (request, reply)
//	offset 16 u64  b: wire version 1 (hello, welcome), deadline in unix ns,
//	               0 for none (request); 0 otherwise
//
// Kinds, in the order a connection sees them:
//
//	1 hello   UAP -> node  first message, sent by Attach
//	2 welcome node -> UAP  answer to hello; Attach returns after it
//	3 request node -> UAP  one at a time: the next only after the reply
//	4 reply   UAP -> node  status and payload of the request in hand
//	5 stop    node -> UAP  RequestStop: leave after the request in hand
//	6 close   node -> UAP  Close: sent once nothing is queued any more,
//	                       after the last request; the UAP leaves after it
//	7 bye     UAP -> node  the UAP leaves cleanly (stop, close, refresh)
//
// A message of an unknown or unexpected kind, a name over 32 bytes, a payload
// over MaxMessage, a reply for a token other than the one in hand or non-zero
// fields where the kind has none is a protocol error: the reader closes its
// end. The UAP's Serve then returns an error (the process should exit); the
// node treats the process as dead (SlotInfo says free) and Reclaim names the
// request it held.
//
// # Process lifecycle on the node side
//
// CreateSocket makes the first socketpair; File is its child end, to pass as
// fd 3. Before every spawn call PrepareSlot(0) and then File(): the pair a
// process used (said hello on, died with, broke the protocol on) is replaced
// by a fresh one; only a pair no process touched is kept. After the process
// ended call Reclaim(0) before the next PrepareSlot. The node's copy of the
// child end stays open until Reclaim, PrepareSlot or Unmap, all called by
// the spawner: closing it from the reader when the UAP says hello would race
// with the spawn still reading the *os.File. So, as with Segment, the node
// learns of a death from procmgr (Reclaim), not from an EOF; a protocol error
// the node detects closes its own end, which the UAP sees as EOF.
//
// Socket mode copies (Enqueue copies the request, the reader allocates each
// reply) and pays two socket hand-offs per request; it is there for servers
// that must receive from a socket, not for speed.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

const (
	sockHdrSize = 24
	sockVersion = 1
	sockBufSize = 64 << 10

	kindHello   = 1
	kindWelcome = 2
	kindRequest = 3
	kindReply   = 4
	kindStop    = 5
	kindClose   = 6
	kindBye     = 7

	helloRefresh = 1 // hello flag: the UAP serves one request, then leaves
)

// errProtocol marks a message that breaks the socket protocol.
var errProtocol = errors.New("shm: socket protocol error")

type sockMsg struct {
	kind    uint8
	status  uint8
	nameLen uint16
	payLen  uint32
	a, b    uint64
}

func putSockHdr(h []byte, m sockMsg) {
	h[0], h[1] = m.kind, m.status
	binary.LittleEndian.PutUint16(h[2:], m.nameLen)
	binary.LittleEndian.PutUint32(h[4:], m.payLen)
	binary.LittleEndian.PutUint64(h[8:], m.a)
	binary.LittleEndian.PutUint64(h[16:], m.b)
}

// readSockHdr reads one header and checks the limits every kind shares: a
// name only in a request, a payload only in a request or reply and never
// over maxMsg.
func readSockHdr(r io.Reader, h []byte, maxMsg uint64) (sockMsg, error) {
	if _, err := io.ReadFull(r, h[:sockHdrSize]); err != nil {
		return sockMsg{}, err
	}
	m := sockMsg{
		kind:    h[0],
		status:  h[1],
		nameLen: binary.LittleEndian.Uint16(h[2:]),
		payLen:  binary.LittleEndian.Uint32(h[4:]),
		a:       binary.LittleEndian.Uint64(h[8:]),
		b:       binary.LittleEndian.Uint64(h[16:]),
	}
	switch {
	case m.kind < kindHello || m.kind > kindBye:
		return m, fmt.Errorf("%w: unknown message kind %d", errProtocol, m.kind)
	case m.nameLen > maxName || (m.nameLen != 0 && m.kind != kindRequest):
		return m, fmt.Errorf("%w: service name of %d bytes in a message of kind %d", errProtocol, m.nameLen, m.kind)
	case uint64(m.payLen) > maxMsg:
		return m, fmt.Errorf("%w: message of %d bytes, max_message_size is %d", errProtocol, m.payLen, maxMsg)
	case m.payLen != 0 && m.kind != kindRequest && m.kind != kindReply:
		return m, fmt.Errorf("%w: payload in a message of kind %d", errProtocol, m.kind)
	case m.status != 0 && m.kind != kindReply && !(m.kind == kindHello && m.status == helloRefresh):
		return m, fmt.Errorf("%w: status in a message of kind %d", errProtocol, m.kind)
	}
	return m, nil
}

// ---------------------------------------------------------------------------
// Scheduler side

// sreq is one request from Enqueue until Release.
type sreq struct {
	tok      Token
	service  string
	deadline int64
	payload  []byte
}

// sconn is one socketpair and what its process said on it.
type sconn struct {
	parent      *net.UnixConn // the node's end
	child       *os.File      // the UAP's end; closed once the UAP said hello
	childClosed bool
	nread       atomic.Int64 // bytes the reader got from the UAP

	// Under SocketQueue.mu.
	hello, left, dead             bool
	pid                           int
	oneShot                       bool // refresh mode: one request only
	handed                        int  // requests handed to this process
	welcomed, stopSent, closeSent bool
}

// SocketQueue is the scheduler's side of a socket-receiving user server
// (receive_from = socket): one UAP process served over a unix stream
// socket. It has the method set of *Segment. Requests wait in the node (at
// most Slots of them, Stats.Depth) and are written to the UAP one at a time,
// the next after the reply to the previous, by a writer goroutine; a reader
// goroutine takes the replies. The rules of the package comment for Segment
// hold, with slot always 0; see the top of socket.go for the wire format and
// the spawn sequence (PrepareSlot, then File).
type SocketQueue struct {
	name   string
	layout Layout
	maxMsg uint64

	mu      sync.Mutex
	cond    sync.Cond // the writer waits on it
	conn    *sconn
	wait    []*sreq // ring of Slots waiting requests
	head, n int
	cur     *sreq // written (or about to be) to the UAP, not answered
	curSent bool
	live    map[Token]*sreq // enqueued and not released
	nextTok uint64
	comps   []Completion // replies not yet taken by WaitCompletions
	stopReq bool
	closed  bool
	gone    bool // Unmap called
	served  uint64

	queued, taken, done uint64

	notify chan struct{} // a completion arrived or the queue closed
	timer  *time.Timer   // WaitCompletions' (one goroutine)
	wg     sync.WaitGroup
}

// CreateSocket makes the scheduler side of a socket-receiving server named
// name: a socketpair whose child end (File) is the UAP's fd 3, and the writer
// goroutine. l.Slots is queue_size (requests waiting in the node, not yet
// written to the UAP), l.MaxMessage is max_message_size and l.Processes must
// be 1.
func CreateSocket(name string, l Layout) (*SocketQueue, error) {
	if l.Processes != 1 {
		return nil, fmt.Errorf("shm: socket %q: a socket-receiving server has exactly 1 process, not %d", name, l.Processes)
	}
	if l.Slots < 1 || l.Slots > maxSlots {
		return nil, fmt.Errorf("shm: slots %d out of range 1..%d", l.Slots, maxSlots)
	}
	if l.MaxMessage < 1 || l.MaxMessage > maxMessage {
		return nil, fmt.Errorf("shm: max message %d out of range 1..%d", l.MaxMessage, maxMessage)
	}
	q := &SocketQueue{
		name:   name,
		layout: l,
		maxMsg: uint64(l.MaxMessage),
		wait:   make([]*sreq, l.Slots),
		live:   make(map[Token]*sreq),
		notify: make(chan struct{}, 1),
		timer:  time.NewTimer(time.Hour),
	}
	q.timer.Stop()
	q.cond.L = &q.mu
	c, err := newSconn(name)
	if err != nil {
		return nil, err
	}
	q.conn = c
	q.wg.Add(2)
	go q.read(c)
	go q.write()
	return q, nil
}

func newSconn(name string) (*sconn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("shm: socket %q: %w", name, os.NewSyscallError("socketpair", err))
	}
	pf := os.NewFile(uintptr(fds[0]), "socket:"+name)
	fc, err := net.FileConn(pf) // a duplicate, in the runtime's poller
	pf.Close()
	if err != nil {
		unix.Close(fds[1])
		return nil, fmt.Errorf("shm: socket %q: %w", name, err)
	}
	return &sconn{parent: fc.(*net.UnixConn), child: os.NewFile(uintptr(fds[1]), "socket:"+name)}, nil
}

// File is the UAP's end of the current socketpair, to pass as fd 3 in
// exec.Cmd.ExtraFiles. Reclaim closes it and PrepareSlot may replace it:
// call File after PrepareSlot, for every spawn.
func (q *SocketQueue) File() *os.File {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.conn.child
}

// Layout is the layout the queue was created with.
func (q *SocketQueue) Layout() Layout { return q.layout }

// Enqueue copies req and queues it for the UAP; the writer goroutine sends it
// when the UAP holds no other request. It fails with ErrNameTooLong,
// ErrTooBig, ErrClosed, or ErrFull when Slots requests wait in the node (one
// more may be in the UAP). Safe for concurrent use; it never blocks on the
// socket.
func (q *SocketQueue) Enqueue(service string, req []byte, deadline time.Time) (Token, error) {
	if len(service) > maxName {
		return 0, ErrNameTooLong
	}
	if uint64(len(req)) > q.maxMsg {
		return 0, ErrTooBig
	}
	r := &sreq{service: service}
	if len(req) > 0 {
		r.payload = append([]byte(nil), req...)
	}
	if !deadline.IsZero() {
		r.deadline = deadline.UnixNano()
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || q.gone {
		return 0, ErrClosed
	}
	if q.n >= len(q.wait) {
		return 0, ErrFull
	}
	q.nextTok++
	r.tok = Token(q.nextTok)
	q.live[r.tok] = r
	q.wait[(q.head+q.n)%len(q.wait)] = r
	q.n++
	q.queued++
	q.advance()
	return r.tok, nil
}

// advance hands the oldest waiting request to the UAP if it can take one.
// Under mu.
func (q *SocketQueue) advance() {
	c := q.conn
	if q.cur != nil || q.n == 0 || c.dead || !c.hello || c.left || q.stopReq || (c.oneShot && c.handed > 0) {
		return
	}
	c.handed++
	q.cur = q.wait[q.head]
	q.wait[q.head] = nil
	q.head = (q.head + 1) % len(q.wait)
	q.n--
	q.curSent = false
	q.taken++
	q.cond.Broadcast()
}

// Release forgets t; a reply for it that is still to come is dropped. A stale
// or released token is ignored.
func (q *SocketQueue) Release(t Token) {
	q.mu.Lock()
	delete(q.live, t)
	q.mu.Unlock()
}

func (q *SocketQueue) wake() {
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// WaitCompletions returns buf[:0] with every reply available now appended,
// waiting up to timeout when there is none. It returns at once when the queue
// is closed and nothing is waiting or in the UAP. Reply is valid until
// Release. Call it from one goroutine only.
func (q *SocketQueue) WaitCompletions(buf []Completion, timeout time.Duration) []Completion {
	out := buf[:0]
	var end time.Time
	for {
		q.mu.Lock()
		for _, c := range q.comps {
			q.done++
			if _, ok := q.live[c.Token]; ok {
				out = append(out, c)
			}
		}
		clear(q.comps)
		q.comps = q.comps[:0]
		idle := q.gone || (q.closed && q.n == 0 && q.cur == nil)
		q.mu.Unlock()
		if len(out) > 0 || idle {
			return out
		}
		if end.IsZero() {
			end = time.Now().Add(timeout)
		}
		left := time.Until(end)
		if left <= 0 {
			return out
		}
		q.timer.Reset(left)
		select {
		case <-q.notify:
		case <-q.timer.C:
		}
		q.timer.Stop()
	}
}

// kill marks c dead and closes the node's end: a blocked write or read on it
// returns and the UAP reads EOF. The child end is closed by closeChild, only
// from the spawner's calls. Under mu.
func (q *SocketQueue) kill(c *sconn) {
	if !c.dead {
		c.dead = true
		c.parent.Close()
		q.cond.Broadcast()
		q.wake()
	}
}

func (q *SocketQueue) closeChild(c *sconn) {
	if !c.childClosed {
		c.childClosed = true
		c.child.Close()
	}
}

// used reports whether a process may have touched c, so that it cannot be
// handed to the next one. Under mu.
func (c *sconn) used() bool {
	if c.dead || c.hello || c.nread.Load() > 0 {
		return true
	}
	n := 0
	if rc, err := c.parent.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) }) // SIOCINQ: unread bytes
	}
	return n > 0 || c.nread.Load() > 0
}

func checkSockSlot(slot int) error {
	if slot != 0 {
		return fmt.Errorf("shm: process slot %d out of range 0..0 (socket mode has one process)", slot)
	}
	return nil
}

// PrepareSlot readies the queue for a new process, before each spawn: it
// forgets any stop request and any request the last process held (call
// Reclaim first to learn it) and, unless the current socketpair was never
// used by a process, replaces it with a fresh one. Call File after it.
func (q *SocketQueue) PrepareSlot(slot int) error {
	if err := checkSockSlot(slot); err != nil {
		return err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.gone {
		return ErrClosed
	}
	q.cur, q.curSent = nil, false
	q.stopReq = false
	q.served = 0
	if !q.conn.used() {
		return nil
	}
	c, err := newSconn(q.name)
	if err != nil {
		return err
	}
	q.kill(q.conn)
	q.closeChild(q.conn)
	q.conn = c
	q.wg.Add(1)
	go q.read(c)
	q.cond.Broadcast()
	return nil
}

// Reclaim is called after the process ended. It reports the request written
// to it and not answered, if any (fail it with 'server terminated'; then
// Release it), and closes both ends of the socket. A reply that raced with the death is
// dropped, so a token is reported by WaitCompletions or by Reclaim, never both.
func (q *SocketQueue) Reclaim(slot int) (Token, bool) {
	if checkSockSlot(slot) != nil {
		return 0, false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	var tok Token
	found := false
	if q.cur != nil {
		tok, found = q.cur.tok, true
		q.cur, q.curSent = nil, false
	}
	q.served = 0
	q.kill(q.conn)
	q.closeChild(q.conn)
	return tok, found
}

// Depth is the number of requests waiting in the node now (Stats.Depth).
func (q *SocketQueue) Depth() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// Stats reads the counters: Queued requests ever accepted, Taken ever handed
// to the UAP, Done replies ever read by WaitCompletions, Depth requests
// waiting in the node, Busy 1 while the UAP holds a request.
func (q *SocketQueue) Stats() Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	st := Stats{Queued: q.queued, Taken: q.taken, Done: q.done, Depth: q.n}
	if q.cur != nil {
		st.Busy = 1
	}
	return st
}

// SlotInfo says what the one process is doing: free until it said hello and
// after it said bye, broke the protocol or was reclaimed; busy while it holds
// a request; idle otherwise (as with Segment, a process that died is busy or
// idle until Reclaim). PID is the one its hello reported.
func (q *SocketQueue) SlotInfo(slot int) SlotInfo {
	if checkSockSlot(slot) != nil {
		return SlotInfo{}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	c := q.conn
	if !c.hello || c.dead || c.left {
		return SlotInfo{State: SlotFree, Served: q.served}
	}
	st := SlotIdle
	if q.cur != nil {
		st = SlotBusy
	}
	return SlotInfo{State: st, PID: c.pid, Served: q.served}
}

// RequestStop asks the process to take no further request: it finishes the
// one in hand, then its Serve returns nil. Waiting requests stay queued for
// the next process (PrepareSlot forgets the stop request).
func (q *SocketQueue) RequestStop(slot int) {
	if checkSockSlot(slot) != nil {
		return
	}
	q.mu.Lock()
	q.stopReq = true
	q.cond.Broadcast()
	q.mu.Unlock()
}

// Close stops Enqueue (ErrClosed); the UAP is sent what is queued, then a
// close message, after which its Serve returns nil. Closing twice is a no-op.
func (q *SocketQueue) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		q.closed = true
		q.cond.Broadcast()
		q.wake()
	}
	return nil
}

// Unmap closes the sockets and stops the queue's goroutines. Nothing of the
// queue may be used afterwards.
func (q *SocketQueue) Unmap() error {
	q.mu.Lock()
	if q.gone {
		q.mu.Unlock()
		return nil
	}
	q.gone = true
	q.kill(q.conn)
	q.closeChild(q.conn)
	q.cond.Broadcast()
	q.wake()
	q.mu.Unlock()
	q.wg.Wait()
	return nil
}

// write is the writer goroutine: welcome, requests, stop and close, in that
// order of priority, to whichever socketpair is current.
func (q *SocketQueue) write() {
	defer q.wg.Done()
	var hb [sockHdrSize + maxName]byte
	var arr [2][]byte
	q.mu.Lock()
	defer q.mu.Unlock()
	for !q.gone {
		c := q.conn
		if c.dead || !c.hello || c.left {
			q.cond.Wait()
			continue
		}
		var m sockMsg
		var name string
		var payload []byte
		switch {
		case !c.welcomed:
			c.welcomed = true
			m = sockMsg{kind: kindWelcome, a: q.maxMsg, b: sockVersion}
		case q.cur != nil && !q.curSent:
			q.curSent = true
			r := q.cur
			name, payload = r.service, r.payload
			m = sockMsg{kind: kindRequest, nameLen: uint16(len(name)), payLen: uint32(len(payload)),
				a: uint64(r.tok), b: uint64(r.deadline)}
		case q.stopReq && !c.stopSent:
			c.stopSent = true
			m = sockMsg{kind: kindStop}
		case q.closed && q.n == 0 && (q.cur == nil || q.curSent) && !c.closeSent:
			c.closeSent = true
			m = sockMsg{kind: kindClose}
		default:
			q.cond.Wait()
			continue
		}
		putSockHdr(hb[:], m)
		n := sockHdrSize + copy(hb[sockHdrSize:], name)
		arr[0], arr[1] = hb[:n], payload
		bufs := net.Buffers(arr[:])
		q.mu.Unlock()
		_, err := bufs.WriteTo(c.parent) // writev; may block on a slow UAP
		q.mu.Lock()
		arr[1] = nil
		if err != nil {
			q.kill(c)
		}
	}
}

type countReader struct{ c *sconn }

func (r countReader) Read(p []byte) (int, error) {
	n, err := r.c.parent.Read(p)
	r.c.nread.Add(int64(n))
	return n, err
}

// read is the reader goroutine of one socketpair: hello, replies and bye
// until EOF, an error or a protocol error, which all make c dead.
func (q *SocketQueue) read(c *sconn) {
	defer q.wg.Done()
	br := bufio.NewReaderSize(countReader{c}, sockBufSize)
	var h [sockHdrSize]byte
	for q.readOne(c, br, h[:]) == nil {
	}
	q.mu.Lock()
	q.kill(c)
	q.mu.Unlock()
}

func (q *SocketQueue) readOne(c *sconn, br *bufio.Reader, h []byte) error {
	m, err := readSockHdr(br, h, q.maxMsg)
	if err != nil {
		return err
	}
	switch m.kind {
	case kindHello:
		q.mu.Lock()
		defer q.mu.Unlock()
		if c.hello || m.b != sockVersion || m.a == 0 || m.a > 1<<31 {
			return fmt.Errorf("%w: hello (pid %d, version %d)", errProtocol, m.a, m.b)
		}
		c.hello, c.pid, c.oneShot = true, int(m.a), m.status == helloRefresh
		q.advance()
		q.cond.Broadcast()
		return nil
	case kindReply:
		if Status(m.status) > StatusTimedOut {
			return fmt.Errorf("%w: reply status %d", errProtocol, m.status)
		}
		q.mu.Lock()
		r := q.cur
		ok := r != nil && q.curSent && q.conn == c && uint64(r.tok) == m.a
		q.mu.Unlock()
		if !ok {
			return fmt.Errorf("%w: reply for token %x, which the UAP does not hold", errProtocol, m.a)
		}
		var reply []byte
		if m.payLen > 0 {
			reply = make([]byte, m.payLen)
			if _, err := io.ReadFull(br, reply); err != nil {
				return err
			}
		}
		q.mu.Lock()
		defer q.mu.Unlock()
		if q.cur != r || c.dead { // reclaimed meanwhile: Reclaim reported it
			return nil
		}
		q.cur, q.curSent = nil, false
		q.served++
		q.comps = append(q.comps, Completion{Token: r.tok, Status: Status(m.status), Reply: reply})
		q.wake()
		q.advance()
		return nil
	case kindBye:
		q.mu.Lock()
		defer q.mu.Unlock()
		if !c.hello {
			return fmt.Errorf("%w: bye before hello", errProtocol)
		}
		c.left = true
		q.cond.Broadcast()
		return nil
	}
	return fmt.Errorf("%w: message of kind %d from the UAP", errProtocol, m.kind)
}

// ---------------------------------------------------------------------------
// UAP side

// sockServer is a Server's socket when it receives from a socket.
type sockServer struct {
	conn *net.UnixConn // nil once closed
	r    *bufio.Reader
	h    [sockHdrSize]byte
	buf  []byte // the request buffer, MaxMessage long, made at the first request
}

// attachSocketEnv is Attach in socket mode: fd TPSCHED_SHM_FD (default 3) is
// the UAP's end of the socketpair.
func attachSocketEnv() (*Server, error) {
	fd := 3
	if v := os.Getenv("TPSCHED_SHM_FD"); v != "" {
		var err error
		if fd, err = strconv.Atoi(v); err != nil || fd < 0 {
			return nil, fmt.Errorf("shm: TPSCHED_SHM_FD=%q: not a file descriptor", v)
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("shm: fd %d: %w (a UAP must be started by scdd, which passes its socket as fd %d)",
			fd, os.NewSyscallError("fstat", err), fd)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("shm: TPSCHED_RECEIVE=socket but fd %d is not a socket (a UAP must be started by scdd)", fd)
	}
	f := os.NewFile(uintptr(fd), "tpsched-socket")
	srv, err := attachSocketFile(f, os.Getenv("TPSCHED_REFRESH") == "1")
	f.Close() // the Server keeps its own duplicate
	return srv, err
}

// attachSocketFile says hello on the socket in f (a duplicate is kept; f
// stays the caller's) and waits for the welcome that tells MaxMessage. In
// refresh mode the hello says so, and the node hands this process one
// request only.
func attachSocketFile(f *os.File, refresh bool) (*Server, error) {
	fc, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("shm: attach socket: %w", err)
	}
	uc, ok := fc.(*net.UnixConn)
	if !ok {
		fc.Close()
		return nil, errors.New("shm: attach socket: not a unix socket")
	}
	ss := &sockServer{conn: uc, r: bufio.NewReaderSize(uc, sockBufSize)}
	hello := sockMsg{kind: kindHello, a: uint64(os.Getpid()), b: sockVersion}
	if refresh {
		hello.status = helloRefresh
	}
	putSockHdr(ss.h[:], hello)
	if _, err := uc.Write(ss.h[:]); err != nil {
		uc.Close()
		return nil, fmt.Errorf("shm: attach socket: hello: %w", err)
	}
	m, err := readSockHdr(ss.r, ss.h[:], 0)
	if err == nil && (m.kind != kindWelcome || m.b != sockVersion || m.a < 1 || m.a > maxMessage) {
		err = fmt.Errorf("%w: expected welcome, got kind %d (version %d, max message %d)", errProtocol, m.kind, m.b, m.a)
	}
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("shm: attach socket: %w", err)
	}
	s := &Server{handlers: make(map[string]HandlerFunc), sock: ss, refresh: refresh}
	s.g.maxMessage = m.a
	return s, nil
}

// serveSocket is ServeOne in socket mode.
func (s *Server) serveSocket() error {
	ss := s.sock
	if ss.conn == nil {
		return ErrClosed
	}
	if s.refresh && s.served {
		ss.leave()
		return ErrClosed
	}
	fail := func(err error) error {
		ss.conn.Close()
		ss.conn = nil
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return errors.New("shm: socket: the scheduler closed the connection")
		}
		return fmt.Errorf("shm: socket: %w", err)
	}
	m, err := readSockHdr(ss.r, ss.h[:], s.g.maxMessage)
	if err != nil {
		return fail(err)
	}
	switch m.kind {
	case kindStop, kindClose:
		ss.leave()
		return ErrClosed
	case kindRequest:
	default:
		return fail(fmt.Errorf("%w: message of kind %d from the scheduler", errProtocol, m.kind))
	}
	nl := int(m.nameLen)
	if _, err := io.ReadFull(ss.r, s.name[:nl]); err != nil {
		return fail(err)
	}
	if ss.buf == nil {
		ss.buf = make([]byte, s.g.maxMessage)
	}
	n := uint64(m.payLen)
	if _, err := io.ReadFull(ss.r, ss.buf[:n]); err != nil {
		return fail(err)
	}
	st, rl := s.run(ss.buf, n, int64(m.b), s.name[:nl])
	putSockHdr(ss.h[:], sockMsg{kind: kindReply, status: uint8(st), payLen: uint32(rl), a: m.a})
	bufs := net.Buffers{ss.h[:], ss.buf[:rl]}
	if _, err := bufs.WriteTo(ss.conn); err != nil {
		return fail(err)
	}
	s.served = true
	return nil
}

// leave says bye and closes the socket.
func (ss *sockServer) leave() {
	putSockHdr(ss.h[:], sockMsg{kind: kindBye})
	_, _ = ss.conn.Write(ss.h[:])
	ss.conn.Close()
	ss.conn = nil
}

func (ss *sockServer) close() error {
	if ss.conn == nil {
		return nil
	}
	err := ss.conn.Close()
	ss.conn = nil
	return err
}
