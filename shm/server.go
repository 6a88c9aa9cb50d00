package shm

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// HandlerFunc runs one service. req aliases shared memory and is valid only
// during the call; its capacity reaches MaxMessage, so appending to it builds
// the reply in place. Returning req itself (or a sub-slice) is fine. An error
// becomes StatusAppError with err.Error() as the reply. A panic is not
// recovered: the process dies and the scheduler reports 'server terminated'.
type HandlerFunc func(req []byte) ([]byte, error)

// Server is the UAP side of a schedule queue: it owns one control block.
// Handle must be called before Serve; Serve and ServeOne must not run
// concurrently (a UAP process serves one request at a time).
type Server struct {
	mapping
	slot     int
	cb       *ctrlBlock
	handlers map[string]HandlerFunc
	spin     spinner
	name     [maxName]byte
	wq       *waitq // where this process sleeps: resident or non-resident queue
	refresh  bool   // serve one request, then stop (scd_refresh_process)
	served   bool
	sock     *sockServer // socket mode (receive_from = socket); nil for a segment
}

// Attach attaches the calling process, started by scdd, to its schedule queue:
// the memfd is fd TPSCHED_SHM_FD (default 3) and the control block is
// TPSCHED_PROC_SLOT. With TPSCHED_RECEIVE=socket (receive_from = socket) that
// fd is instead a connected unix stream socket to the scheduler (see
// SocketQueue); Handle, Serve and ServeOne work the same.
func Attach() (*Server, error) {
	switch v := os.Getenv("TPSCHED_RECEIVE"); v {
	case "socket":
		return attachSocketEnv()
	case "", "queue":
	default:
		return nil, fmt.Errorf("shm: TPSCHED_RECEIVE=%q: want queue or socket", v)
	}
	slotEnv, ok := os.LookupEnv("TPSCHED_PROC_SLOT")
	if !ok {
		return nil, errors.New("shm: TPSCHED_PROC_SLOT is not set (a UAP must be started by scdd)")
	}
	slot, err := strconv.Atoi(slotEnv)
	if err != nil {
		return nil, fmt.Errorf("shm: TPSCHED_PROC_SLOT=%q: not a number", slotEnv)
	}
	fd := 3
	if v := os.Getenv("TPSCHED_SHM_FD"); v != "" {
		if fd, err = strconv.Atoi(v); err != nil || fd < 0 {
			return nil, fmt.Errorf("shm: TPSCHED_SHM_FD=%q: not a file descriptor", v)
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("shm: fd %d: %w (a UAP must be started by scdd, which passes the schedule queue as fd %d)",
			fd, os.NewSyscallError("fstat", err), fd)
	}
	f := os.NewFile(uintptr(fd), "tpsched-shm")
	srv, err := AttachFile(f, slot)
	f.Close() // the Server keeps its own duplicate
	if srv != nil {
		// scd_refresh_process: the scheduler replaces this process after
		// each request.
		srv.refresh = os.Getenv("TPSCHED_REFRESH") == "1"
	}
	return srv, err
}

// AttachFile attaches to the segment in f (a memfd made by Create) as control
// block slot. f stays the caller's: the Server maps and keeps a duplicate of
// it (Close releases both). The slot must be free (see Segment.PrepareSlot).
func AttachFile(f *os.File, slot int) (*Server, error) {
	if f == nil {
		return nil, errors.New("shm: attach: nil file")
	}
	// A duplicate fd keeps f usable by its owner (and Fd's blocking-mode
	// switch harmless).
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("shm: attach: %w", os.NewSyscallError("fcntl F_DUPFD_CLOEXEC", err))
	}
	own := os.NewFile(uintptr(fd), f.Name())
	s, err := attachFD(own, fd, slot)
	if err != nil {
		own.Close()
		return nil, err
	}
	return s, nil
}

func attachFD(f *os.File, fd, slot int) (*Server, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("shm: attach: %w", os.NewSyscallError("fstat", err))
	}
	notOurs := fmt.Errorf("shm: attach: fd %d is not a tpsched schedule queue (a UAP must be started by scdd)", fd)
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size < pageSize {
		return nil, notOurs
	}
	mem, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("shm: attach: %w", os.NewSyscallError("mmap", err))
	}
	h := (*header)(unsafe.Pointer(&mem[0]))
	fail := func(err error) (*Server, error) {
		unix.Munmap(mem)
		return nil, err
	}
	if atomic.LoadUint64(&h.magic) != magic {
		return fail(notOurs)
	}
	if h.version != version {
		return fail(fmt.Errorf("shm: attach: segment layout version %d, this UAP knows %d (rebuild it with the scheduler's shm package)", h.version, version))
	}
	g, err := newGeometry(h.slots, h.maxMessage, h.procs)
	if err != nil || g.size != h.size || g.size != uint64(st.Size) || g.nbuf != h.nbuf || g.compCap != h.compCap {
		return fail(fmt.Errorf("shm: attach: inconsistent segment header (size %d)", st.Size))
	}
	if slot < 0 || uint64(slot) >= g.procs {
		return fail(fmt.Errorf("shm: attach: process slot %d out of range 0..%d", slot, g.procs-1))
	}
	s := &Server{slot: slot, handlers: make(map[string]HandlerFunc), spin: newSpinner()}
	s.init(f, fd, mem, g)
	s.cb = s.mapping.cb(slot)
	s.wq = s.waitqOf(slot)
	if st := s.cb.state.Load(); st != stateFree {
		pid := s.cb.pid.Load()
		unix.Munmap(mem) // f stays with the caller's error path
		return nil, fmt.Errorf("shm: attach: process slot %d in use by pid %d (the scheduler calls PrepareSlot before a spawn)", slot, pid)
	}
	s.cb.pid.Store(uint32(os.Getpid()))
	s.cb.state.Store(stateAttached)
	return s, nil
}

// Handle registers the handler of a service. Names longer than 32 bytes can
// never be requested.
func (s *Server) Handle(service string, h HandlerFunc) {
	s.handlers[service] = h
}

// MaxMessage is the largest request or reply of the segment.
func (s *Server) MaxMessage() int { return int(s.g.maxMessage) }

// Serve takes requests one at a time until the segment is closed and its
// queue drained; it then returns nil.
func (s *Server) Serve() error {
	for {
		if err := s.ServeOne(); err != nil {
			if errors.Is(err, ErrClosed) {
				return nil
			}
			return err
		}
	}
}

// ServeOne waits for exactly one request, serves it and returns. It returns
// ErrClosed once the segment is closed and the queue drained, once the
// scheduler asked this process to stop, or, in refresh mode, after the one
// request the process exists for (and then marks the control block free).
func (s *Server) ServeOne() error {
	if s.sock != nil {
		return s.serveSocket()
	}
	if s.mem == nil {
		return ErrClosed
	}
	if s.refresh && s.served {
		s.leave()
		return ErrClosed
	}
	pos, ok := s.next()
	if !ok {
		s.leave()
		return ErrClosed
	}
	s.serve(pos)
	s.served = true
	return nil
}

func (s *Server) leave() {
	s.cb.pid.Store(0)
	s.cb.state.Store(stateFree)
}

func (s *Server) ready() bool { return s.q.ready() }

// next takes the next request, spinning and then sleeping for one. It reports
// false when the segment is closed and nothing is queued.
func (s *Server) next() (uint64, bool) {
	if s.cb.state.Load() == stateAttached {
		s.cb.state.Store(stateIdle)
	}
	if s.cb.stop.Load() != 0 {
		return 0, false
	}
	claim := &s.cb.claim
	if pos, ok := s.q.take(claim); ok {
		return pos, true
	}
	start := time.Now()
	if s.spin.spin(start, s.ready) {
		if pos, ok := s.q.take(claim); ok {
			s.spin.learn(time.Since(start))
			return pos, true
		}
	}
	h := s.hdr
	for {
		if s.cb.stop.Load() != 0 {
			return 0, false
		}
		closed := h.closed.Load() == 2 // before the last look at the queue
		v := s.wq.prepare()
		if pos, ok := s.q.take(claim); ok {
			s.wq.done()
			s.spin.learn(time.Since(start))
			s.passWake()
			return pos, true
		}
		if closed {
			s.wq.done()
			return 0, false
		}
		s.wq.sleep(v, maxSleep)
	}
}

// passWake wakes another sleeping UAP when requests are left after this one
// took its own: producers wake one sleeper per wake-up in flight, so a
// burst reaches the others through the ones that woke first.
func (s *Server) passWake() {
	if s.q.depth() > 0 {
		s.wakeUAP()
	}
}

// serve runs the request at queue position pos, claimed by next. The order
// of the control-block writes is what makes Reclaim exact: token, then busy,
// then release the queue entry; reply, completion, then idle.
func (s *Server) serve(pos uint64) {
	e := (*qEntry)(s.q.entry(pos))
	tok := Token(e.token)
	n := uint64(e.reqLen)
	deadline := e.deadline
	nl := min(int(e.nameLen), maxName)
	copy(s.name[:], e.name[:nl])
	s.cb.token.Store(uint64(tok))
	s.cb.state.Store(stateBusy)
	s.q.release(pos)
	s.cb.claim.Store(0)

	status, rl := StatusAppError, uint64(0)
	idx := tok.index()
	if uint64(idx) < s.g.nbuf && n <= s.g.maxMessage {
		buf := s.buf(idx)
		status, rl = s.run(buf, n, deadline, s.name[:nl])
	}
	s.complete(tok, status, rl)
	s.cb.served.Add(1)
	s.cb.state.Store(stateIdle)
	s.cb.token.Store(0)
}

func (s *Server) run(buf []byte, n uint64, deadline int64, name []byte) (Status, uint64) {
	if deadline != 0 && time.Now().UnixNano() > deadline {
		return StatusTimedOut, 0
	}
	h, ok := s.handlers[string(name)]
	if !ok {
		return StatusNoSuchService, 0
	}
	reply, err := h(buf[:n])
	if err != nil {
		return StatusAppError, uint64(copy(buf, err.Error()))
	}
	if uint64(len(reply)) > s.g.maxMessage {
		return StatusAppError, uint64(copy(buf, "reply too big"))
	}
	if len(reply) > 0 && &reply[0] != &buf[0] {
		copy(buf, reply) // memmove: a reply inside buf may overlap
	}
	return StatusOK, uint64(len(reply))
}

// complete pushes the completion of tok and wakes the reply reader.
func (s *Server) complete(tok Token, st Status, rl uint64) {
	pos, ok := s.c.reserve(&s.cb.compClaim)
	for !ok {
		// Cannot happen while the reply reader runs: the ring holds twice
		// as many entries as there are buffers.
		time.Sleep(50 * time.Microsecond)
		pos, ok = s.c.reserve(&s.cb.compClaim)
	}
	e := (*cEntry)(s.c.entry(pos))
	e.token = uint64(tok)
	e.status = uint32(st)
	e.replyLen = uint32(rl)
	s.c.publish(pos)
	s.cb.compClaim.Store(0)
	s.hdr.cWait.signal()
}

// Close frees the control block and unmaps the segment. Serve must have
// returned.
func (s *Server) Close() error {
	if s.sock != nil {
		return s.sock.close()
	}
	if s.mem == nil {
		return nil
	}
	s.cb.pid.Store(0)
	s.cb.state.Store(stateFree)
	s.cb = nil
	return s.unmap()
}
