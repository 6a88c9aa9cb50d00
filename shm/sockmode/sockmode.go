// Package sockmode is the node's side of a socket-receiving user server
// (receive_from = socket): its one process gets each call over a connected
// unix stream socket instead of shared memory. It has the shape of
// shm.Group and shm.Proc, so the schedule service drives both the same
// way; the UAP side is shm.Attach, which sees TPSCHED_RECEIVE=socket. The
// wire format is package shm/internal/sockwire.
//
// Each call and reply is copied through the socket, so this mode is for
// servers that must take work from a socket, not for speed.
//
// # Process lifecycle
//
// NewProc(0) makes a fresh socketpair for each spawn; Files is its child
// end, to pass as fd 3. A reader goroutine takes the hello, replies and bye;
// a writer goroutine sends the welcome, the call, stop and close, so that
// Dispatch never blocks on the socket. The node learns of a death from the
// process manager, not from an EOF. The child end is closed here once the
// process started (SetPID), so an EOF without a bye (or a write that
// fails: the process shut its reading side) is a process that closed its
// socket: one still alive eofGrace later, whose exit has not removed it,
// is ruled as breaking the protocol (killed; a call it was sent answered
// 'server terminated', one it never had whole back to the queue at its
// exit, ErrNothingTaken). A protocol error the node detects closes its
// end, which the UAP sees as EOF.
package sockmode

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"tpsched/shm"
	"tpsched/shm/internal/sockwire"
)

// statusEnd bounds the statuses a reply may carry.
const statusEnd = uint8(shm.StatusTimedOut) + 1

// ErrNothingTaken marks a protocol error of a process that held no call
// it had been sent (Completion): the call it holds, handed over but never
// written to its socket, goes back to the queue at its exit, as a dead
// process's untaken calls do, rather than being answered for.
var ErrNothingTaken = errors.New("holding no call it was sent")

// eofGrace is how long a process whose socket ended without a bye has to
// exit (a dying one closes it on its way out) before it is ruled as one
// that closed its socket and lives on.
const eofGrace = 2 * time.Second

// Transport is the node's side of a socket-receiving server: one process
// slot. NewProc, Remove, Close and the Proc methods run under the caller's
// group lock; Wait runs on the caller's reader goroutine.
type Transport struct {
	name   string
	maxMsg int
	proc   atomic.Pointer[Proc]
	closed atomic.Bool
	notify chan struct{}
	timer  *time.Timer
}

// New returns the transport of a server whose messages are at most
// maxMessage bytes.
func New(name string, maxMessage int) (*Transport, error) {
	if maxMessage < 1 || maxMessage > 1<<30 {
		return nil, fmt.Errorf("sockmode: max_message_size %d out of range", maxMessage)
	}
	t := &Transport{name: name, maxMsg: maxMessage, notify: make(chan struct{}, 1), timer: time.NewTimer(time.Hour)}
	t.timer.Stop()
	return t, nil
}

// MaxMessage is the server's max_message_size.
func (t *Transport) MaxMessage() int { return t.maxMsg }

// Slots is 1: a socket-receiving server has exactly one process.
func (t *Transport) Slots() int { return 1 }

func (t *Transport) wake() {
	select {
	case t.notify <- struct{}{}:
	default:
	}
}

// Proc is the process in slot 0 now, nil if there is none.
func (t *Transport) Proc(slot int) *Proc {
	if slot != 0 {
		return nil
	}
	return t.proc.Load()
}

// NewProc makes a fresh socketpair for a process about to start in slot 0.
func (t *Transport) NewProc(slot int) (*Proc, error) {
	if slot != 0 {
		return nil, fmt.Errorf("sockmode: process slot %d out of range 0..0 (socket mode has one process)", slot)
	}
	t.Remove(0)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("sockmode: %s: %w", t.name, os.NewSyscallError("socketpair", err))
	}
	pf := os.NewFile(uintptr(fds[0]), "socket:"+t.name)
	fc, err := net.FileConn(pf) // a duplicate, in the runtime's poller
	pf.Close()
	if err != nil {
		unix.Close(fds[1])
		return nil, fmt.Errorf("sockmode: %s: %w", t.name, err)
	}
	p := &Proc{t: t, parent: fc.(*net.UnixConn), child: os.NewFile(uintptr(fds[1]), "socket:"+t.name), shutting: make(chan struct{})}
	p.cond.L = &p.mu
	p.wg.Add(2)
	go p.read()
	go p.write()
	t.proc.Store(p)
	if t.closed.Load() {
		p.closeReq()
	}
	return p, nil
}

// Remove closes the process's socket, if any: after the process ended.
func (t *Transport) Remove(slot int) {
	if slot != 0 {
		return
	}
	if p := t.proc.Swap(nil); p != nil {
		p.shut()
	}
}

// Pending reports whether the process has something for the reader.
func (t *Transport) Pending() bool {
	p := t.proc.Load()
	return p != nil && p.pending()
}

// Wait returns when the process may have something for the reader, or
// after timeout.
func (t *Transport) Wait(timeout time.Duration) {
	if t.consume() {
		return
	}
	t.timer.Reset(timeout)
	select {
	case <-t.notify:
	case <-t.timer.C:
	}
	t.timer.Stop()
	t.consume()
}

// consume takes the process's "something for the reader" mark: the reader
// looks at everything after Wait, and a later event marks it again.
func (t *Transport) consume() bool {
	p := t.proc.Load()
	return p != nil && p.pend.Swap(false)
}

// Close tells the process that the node is stopping: it leaves once it
// holds no call.
func (t *Transport) Close() {
	t.closed.Store(true)
	if p := t.proc.Load(); p != nil {
		p.closeReq()
	}
	t.wake()
}

// Unmap closes the socket and stops the goroutines.
func (t *Transport) Unmap() error {
	t.Remove(0)
	return nil
}

// Proc is the node's side of the one process.
type Proc struct {
	t      *Transport
	parent *net.UnixConn
	child  *os.File
	wg     sync.WaitGroup
	// shutting is closed by shut: the reader stops waiting out eofGrace.
	shutting chan struct{}

	mu   sync.Mutex
	cond sync.Cond // the writer waits on it
	// What the process said.
	hello, left, dead bool
	pid               int
	// What the writer is to send, and has sent.
	welcomed, stopped, closing, closeSent bool
	no                                    uint64 // last dispatch number
	dispatched                            uint64 // awaiting a reply, 0 none
	sent                                  bool   // the request was written (or started to be)
	entry                                 string
	req                                   []byte
	deadline                              int64
	reply                                 []byte
	status                                shm.Status
	replied                               bool
	protoErr                              error
	protoSaid                             bool // Completion has returned protoErr
	// writeFailed: a write failed on a socket the node had not closed:
	// the process closed its end, or shut its reading side, which the
	// reader never sees as an EOF of its own (it meets the close the
	// failure makes).
	writeFailed bool

	attachSeen atomic.Bool
	pend       atomic.Bool // a hello or reply the reader has not looked at
}

// Files is what the process is started with: its end of the socket, fd 3.
func (p *Proc) Files() []*os.File { return []*os.File{p.child} }

// Slot is 0.
func (p *Proc) Slot() int { return 0 }

// PID is the process's pid as its starter gave it (SetPID), 0 before;
// what its hello says is its own claim, never repeated.
func (p *Proc) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid
}

// SetPID records the pid the process was started with, and closes the
// node's copy of the child end, which the process has its own of now: the
// process closing its end is then an EOF here.
func (p *Proc) SetPID(pid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pid = pid
	p.child.Close()
}

func (p *Proc) pending() bool { return p.pend.Load() }

// Attach reports, once, that the process said hello.
func (p *Proc) Attach() bool {
	p.mu.Lock()
	hello := p.hello && !p.dead
	p.mu.Unlock()
	if !hello || p.attachSeen.Load() {
		return false
	}
	p.attachSeen.Store(true)
	return true
}

// Entries is nil: socket mode does not say which entries a process has.
func (p *Proc) Entries() []string { return nil }

// Dispatch hands the process a call; the writer sends it.
func (p *Proc) Dispatch(entry string, req []byte, deadline int64) error {
	switch {
	case len(req) > p.t.maxMsg:
		return shm.ErrTooBig
	case len(entry) > sockwire.MaxName:
		return shm.ErrNameTooLong
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dispatched != 0 {
		return errors.New("sockmode: the process holds a call already")
	}
	p.no++
	p.dispatched, p.sent, p.replied = p.no, false, false
	p.entry, p.deadline = entry, deadline
	p.req = append([]byte(nil), req...) // the writer may still hold the last one
	p.cond.Broadcast()
	return nil
}

// Wake does nothing: Dispatch and Stop already told the writer.
func (p *Proc) Wake() {}

// Completion returns the reply to the call the process holds, once; or,
// once, the protocol error the process made (its socket is closed then).
func (p *Proc) Completion() (shm.Completion, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.protoErr != nil && !p.protoSaid {
		// Once, whether it holds a call or not: the reader answers the
		// call, if any, 'server terminated' and has the process killed.
		// Left alive with its socket closed, a process that stays (a
		// hostile one: an honest one exits at EOF) held its slot for
		// ever, and each call handed to it waited for its deadline.
		p.protoSaid = true
		if p.dispatched == 0 || !p.sent {
			return shm.Completion{}, true, fmt.Errorf("%w (%w)", p.protoErr, ErrNothingTaken)
		}
		// The error is the call's completion: a reply the process sent
		// before it broke the protocol is not returned later (at its exit)
		// as a second one, for a call the caller no longer holds.
		p.dispatched, p.replied = 0, false
		return shm.Completion{}, true, p.protoErr
	}
	if p.dispatched == 0 || !p.replied {
		return shm.Completion{}, false, nil
	}
	p.dispatched, p.replied = 0, false
	if p.closing {
		p.cond.Broadcast() // the writer holds the close back until now
	}
	return shm.Completion{Status: p.status, Reply: p.reply}, true, nil
}

// Holding reports how many calls (0 or 1) the process holds.
func (p *Proc) Holding() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dispatched != 0 {
		return 1
	}
	return 0
}

// Taken is 1 when the call it holds was written to the socket (the
// process may have run it), else 0. A socket process holds one call.
func (p *Proc) Taken() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dispatched != 0 && p.sent {
		return 1
	}
	return 0
}

// Revoke is false: a socket process holds one call at a time, and a call
// written to the socket cannot be taken back.
func (p *Proc) Revoke() bool { return false }

// Rings is 0: the socket has no doorbell to abuse.
func (p *Proc) Rings() uint64 { return 0 }

// Ignore does nothing: the reader's Wait takes the process's mark as it
// wakes (consume), so a process the node no longer reads cannot keep it
// awake.
func (p *Proc) Ignore() {}

// Stop asks the process to leave after the call it holds.
func (p *Proc) Stop() {
	p.mu.Lock()
	p.stopped = true
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Left reports whether the process said bye.
func (p *Proc) Left() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.left
}

func (p *Proc) closeReq() {
	p.mu.Lock()
	p.closing = true
	p.cond.Broadcast()
	p.mu.Unlock()
}

// kill marks the socket dead and closes the node's end: a blocked write or
// read returns and the UAP reads EOF. Under mu.
func (p *Proc) kill() {
	if !p.dead {
		p.dead = true
		p.parent.Close()
		p.cond.Broadcast()
	}
}

// shut closes both ends and waits for the goroutines.
func (p *Proc) shut() {
	p.mu.Lock()
	p.kill()
	p.mu.Unlock()
	close(p.shutting)
	p.wg.Wait()
	p.child.Close()
}

// write is the writer goroutine: welcome, the call, stop, close.
func (p *Proc) write() {
	defer p.wg.Done()
	var hb [sockwire.HeaderSize + sockwire.MaxName]byte
	p.mu.Lock()
	defer p.mu.Unlock()
	for !p.dead {
		var m sockwire.Msg
		var name string
		var payload []byte
		switch {
		case !p.hello || p.left:
			p.cond.Wait()
			continue
		case !p.welcomed:
			p.welcomed = true
			m = sockwire.Msg{Kind: sockwire.KindWelcome, A: uint64(p.t.maxMsg), B: sockwire.Version}
		case p.dispatched != 0 && !p.sent:
			p.sent = true
			name, payload = p.entry, p.req
			m = sockwire.Msg{Kind: sockwire.KindRequest, NameLen: uint16(len(name)), PayLen: uint32(len(payload)),
				A: p.dispatched, B: uint64(p.deadline)}
		case p.stopped && !p.closeSent:
			p.closeSent = true
			m = sockwire.Msg{Kind: sockwire.KindStop}
		case p.closing && !p.closeSent && p.dispatched == 0:
			p.closeSent = true
			m = sockwire.Msg{Kind: sockwire.KindClose}
		default:
			p.cond.Wait()
			continue
		}
		sockwire.Put(hb[:], m)
		n := sockwire.HeaderSize + copy(hb[sockwire.HeaderSize:], name)
		bufs := net.Buffers{hb[:n], payload}
		p.mu.Unlock()
		_, err := bufs.WriteTo(p.parent) // writev; may block on a slow UAP
		p.mu.Lock()
		if err != nil {
			p.writeFailed = !p.dead
			if m.Kind == sockwire.KindRequest && p.dispatched == m.A {
				// Not all of it reached the process, which can read no
				// more: it never had the call whole, so never ran it. The
				// call goes back to the queue at the exit (Taken).
				p.sent = false
			}
			p.kill()
		}
	}
}

// read is the reader goroutine: hello, replies and bye until EOF, an error
// or a protocol error, which all make the socket dead.
func (p *Proc) read() {
	defer p.wg.Done()
	br := bufio.NewReaderSize(p.parent, sockwire.BufSize)
	var h [sockwire.HeaderSize]byte
	for {
		err := p.readOne(br, h[:])
		if err == nil {
			continue
		}
		p.mu.Lock()
		broke := errors.Is(err, sockwire.ErrProtocol)
		if broke {
			p.protoErr = err
		}
		// The process closed its end (or died) without a bye; the node did
		// not close its own (kill, before a read that then fails), or did
		// only because a write failed for the same reason.
		ended := !broke && (!p.dead || p.writeFailed) && !p.left
		p.kill()
		p.mu.Unlock()
		if ended {
			broke = p.outliveEOF()
		}
		if broke {
			p.pend.Store(true) // for the reader's look (Completion)
			p.t.wake()
		}
		return
	}
}

// outliveEOF waits eofGrace for the exit of a process whose socket ended
// without a bye, which removes it (shut). Still here then, the process
// closed its socket and lives on: as the node never sends it a call again,
// its call would wait for its deadline and its slot be held for ever, so
// it is ruled as breaking the protocol, which has it killed. Reports
// whether it was.
func (p *Proc) outliveEOF() bool {
	t := time.NewTimer(eofGrace)
	defer t.Stop()
	select {
	case <-p.shutting:
		return false
	case <-t.C:
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.protoErr = fmt.Errorf("%w: closed its socket without a bye and did not exit within %v", sockwire.ErrProtocol, eofGrace)
	return true
}

func (p *Proc) readOne(br *bufio.Reader, h []byte) error {
	m, err := sockwire.Read(br, h, uint64(p.t.maxMsg), statusEnd)
	if err != nil {
		return err
	}
	switch m.Kind {
	case sockwire.KindHello:
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.hello || m.B != sockwire.Version || m.A == 0 || m.A > 1<<31 {
			return fmt.Errorf("%w: hello (pid %d, version %d)", sockwire.ErrProtocol, m.A, m.B)
		}
		p.hello = true
		p.cond.Broadcast()
		p.pend.Store(true)
		p.t.wake()
		return nil
	case sockwire.KindReply:
		p.mu.Lock()
		ok := p.dispatched != 0 && p.sent && !p.replied && m.A == p.dispatched
		p.mu.Unlock()
		if !ok {
			return fmt.Errorf("%w: reply to call %d, which the UAP does not hold", sockwire.ErrProtocol, m.A)
		}
		reply := make([]byte, m.PayLen)
		if _, err := io.ReadFull(br, reply); err != nil {
			return err
		}
		p.mu.Lock()
		if p.dispatched == m.A {
			p.reply, p.status, p.replied = reply, shm.Status(m.Status), true
		}
		p.cond.Broadcast()
		p.mu.Unlock()
		p.pend.Store(true)
		p.t.wake()
		return nil
	case sockwire.KindBye:
		p.mu.Lock()
		defer p.mu.Unlock()
		if !p.hello {
			return fmt.Errorf("%w: bye before hello", sockwire.ErrProtocol)
		}
		p.left = true
		p.cond.Broadcast()
		return nil
	}
	return fmt.Errorf("%w: message of kind %d from the UAP", sockwire.ErrProtocol, m.Kind)
}
