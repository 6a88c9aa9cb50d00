package shm

// Segment layout (version 1). All offsets are from the start of the memfd; the
// file is sized once with ftruncate and sealed (F_SEAL_GROW|F_SEAL_SHRINK|
// F_SEAL_SEAL), so no process can get SIGBUS from a truncation. Pages cost
// memory only once touched.
//
//	offset 0, page 0: header, one 64-byte cache line per group
//	  line 0  magic "TPSCHSHM", version, slots, max message, processes,
//	          buffers, completion ring capacity, total size (uint64 each)
//	  line 1  closed flag (0 open, 1 closing, 2 closed: no Enqueue in flight)
//	  line 2  queue tail  = requests queued (counter "queued")
//	  line 3  queue head  = requests taken by UAPs (counter "taken")
//	  line 4  completion ring tail
//	  line 5  completion ring head
//	  line 6  done: completions read by the scheduler (counter "done")
//	  line 7  queue futex word, queue waiters count
//	  line 8  completion futex word, completion waiters count
//	4096: schedule queue, Slots entries of 64 bytes:
//	  seq u64, token u64, deadline i64 (unix ns, 0 none), request length u32,
//	  service name length u32, service name [32]byte
//	  (the request buffer index is the low 32 bits of the token)
//	then (64-aligned): completion ring, 2 x buffers entries of 32 bytes:
//	  seq u64, token u64, status u32, reply length u32, unused u64
//	then (128-aligned): Processes control blocks of 128 bytes:
//	  state u32 (free/attached/idle/busy), pid u32, token u64, queue claim
//	  u64, completion claim u64, served u64 (a claim is position+1, 0 none)
//	then (page-aligned): Slots+Processes request buffers, each MaxMessage
//	  rounded up to a page; the reply is written in place over the request.
//
// Token = generation<<32 | buffer index; the generation (>= 1) is kept by the
// scheduler and bumped on each allocation, so a Token is never 0 and a stale
// one is recognised.

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Errors returned by this package.
var (
	ErrFull        = errors.New("shm: schedule queue full")
	ErrTooBig      = errors.New("shm: message larger than max_message_size")
	ErrClosed      = errors.New("shm: schedule queue closed")
	ErrNameTooLong = errors.New("shm: service name longer than 32 bytes")
)

const (
	magic        = 0x4d48534843535054 // "TPSCHSHM" little-endian
	version      = 3
	pageSize     = 4096
	maxName      = 32
	qEntrySize   = 64
	cEntrySize   = 32
	cbSize       = 128
	bigThreshold = 256 << 10 // buffers that held more are punched on Release
	maxSlots     = 1 << 24
	maxProcs     = 1 << 16
	maxMessage   = 1 << 30
)

// Control block states.
const (
	stateFree     = 0 // no process
	stateAttached = 1 // process mapped the segment, not serving yet
	stateIdle     = 2 // serving, holds no request
	stateBusy     = 3 // serving the request in token
)

type header struct {
	// line 0: parameters, written once by Create.
	magic, version, slots, maxMessage, procs, nbuf, compCap, size uint64

	closed   atomic.Uint32
	resident uint32 // control blocks below this serve resident processes; written once by Create
	_        [56]byte
	qTail    atomic.Uint64
	_        [56]byte
	qHead    atomic.Uint64
	_        [56]byte
	cTail    atomic.Uint64
	_        [56]byte
	cHead    atomic.Uint64
	_        [56]byte
	done     atomic.Uint64
	_        [56]byte

	qWait waitq // the schedule queue: resident UAPs sleep, the scheduler wakes
	xWait waitq // the schedule queue: non-resident UAPs sleep, woken only when no resident sleeps
	cWait waitq // the completion ring: the reply reader sleeps, UAPs wake
}

type qEntry struct {
	seq      atomic.Uint64
	token    uint64
	deadline int64
	reqLen   uint32
	nameLen  uint32
	name     [maxName]byte
}

type cEntry struct {
	seq      atomic.Uint64
	token    uint64
	status   uint32
	replyLen uint32
	_        uint64
}

type ctrlBlock struct {
	state     atomic.Uint32
	pid       atomic.Uint32
	token     atomic.Uint64
	claim     atomic.Uint64 // schedule queue position+1 being taken
	compClaim atomic.Uint64 // completion ring position+1 being pushed
	served    atomic.Uint64
	stop      atomic.Uint32 // set by the scheduler: take no further request
	_         [cbSize - 44]byte
}

// Compile-time layout checks.
var (
	_ [qEntrySize - unsafe.Sizeof(qEntry{})]byte
	_ [unsafe.Sizeof(qEntry{}) - qEntrySize]byte
	_ [cEntrySize - unsafe.Sizeof(cEntry{})]byte
	_ [unsafe.Sizeof(cEntry{}) - cEntrySize]byte
	_ [cbSize - unsafe.Sizeof(ctrlBlock{})]byte
	_ [unsafe.Sizeof(ctrlBlock{}) - cbSize]byte
	_ [pageSize - unsafe.Sizeof(header{})]byte
)

// Layout sizes a schedule queue.
type Layout struct {
	Slots      int // queue_size: requests that may wait in the queue
	MaxMessage int // max_message_size: largest request or reply, bytes
	Processes  int // most UAP processes (control blocks)
	// Resident is how many of the control blocks, from slot 0, serve
	// resident processes. A sleeping resident process is woken before a
	// non-resident one, so that at light load the non-resident processes
	// stay idle and the Multiserver rule can stop them. 0 or more than
	// Processes: every process counts as resident.
	Resident int
}

// geometry is where everything lives, derived from the header parameters.
type geometry struct {
	slots, maxMessage, procs, nbuf, compCap uint64
	ringOff, compOff, cbOff, bufOff, stride uint64
	size                                    uint64
}

func alignUp(v, a uint64) uint64 { return (v + a - 1) &^ (a - 1) }

func newGeometry(slots, maxMsg, procs uint64) (geometry, error) {
	if slots < 1 || slots > maxSlots {
		return geometry{}, fmt.Errorf("shm: slots %d out of range 1..%d", slots, maxSlots)
	}
	if maxMsg < 1 || maxMsg > maxMessage {
		return geometry{}, fmt.Errorf("shm: max message %d out of range 1..%d", maxMsg, maxMessage)
	}
	if procs < 1 || procs > maxProcs {
		return geometry{}, fmt.Errorf("shm: processes %d out of range 1..%d", procs, maxProcs)
	}
	g := geometry{slots: slots, maxMessage: maxMsg, procs: procs}
	g.nbuf = slots + procs
	g.compCap = 2 * g.nbuf
	g.ringOff = pageSize
	g.compOff = alignUp(g.ringOff+slots*qEntrySize, 64)
	g.cbOff = alignUp(g.compOff+g.compCap*cEntrySize, cbSize)
	g.bufOff = alignUp(g.cbOff+procs*cbSize, pageSize)
	g.stride = alignUp(maxMsg, pageSize)
	g.size = g.bufOff + g.nbuf*g.stride
	if g.size > 1<<46 {
		return geometry{}, fmt.Errorf("shm: segment of %d bytes too large", g.size)
	}
	return g, nil
}

// mapping is what both sides share: the mapped memory and views into it.
type mapping struct {
	f    *os.File
	fd   int
	mem  []byte
	base unsafe.Pointer
	hdr  *header
	g    geometry
	q, c ring
}

func (m *mapping) init(f *os.File, fd int, mem []byte, g geometry) {
	m.f, m.fd, m.mem, m.g = f, fd, mem, g
	m.base = unsafe.Pointer(&mem[0])
	m.hdr = (*header)(m.base)
	m.q = ring{head: &m.hdr.qHead, tail: &m.hdr.qTail,
		ents: unsafe.Add(m.base, g.ringOff), stride: qEntrySize, n: g.slots}
	m.c = ring{head: &m.hdr.cHead, tail: &m.hdr.cTail,
		ents: unsafe.Add(m.base, g.compOff), stride: cEntrySize, n: g.compCap}
}

func (m *mapping) cb(slot int) *ctrlBlock {
	return (*ctrlBlock)(unsafe.Add(m.base, m.g.cbOff+uint64(slot)*cbSize))
}

// buf is request buffer idx, MaxMessage long.
func (m *mapping) buf(idx uint32) []byte {
	off := m.g.bufOff + uint64(idx)*m.g.stride
	return m.mem[off : off+m.g.maxMessage : off+m.g.maxMessage]
}

func (m *mapping) unmap() error {
	var err error
	if m.mem != nil {
		err = os.NewSyscallError("munmap", unix.Munmap(m.mem))
		m.mem = nil
	}
	if m.f != nil {
		if cerr := m.f.Close(); err == nil {
			err = cerr
		}
		m.f = nil
	}
	return err
}

// Token names one request for its life in the segment: the buffer index in
// the low 32 bits and a generation (never 0) above.
type Token uint64

func (t Token) index() uint32 { return uint32(t) }

// Status is how a UAP finished a request.
type Status uint8

// Completion statuses.
const (
	StatusOK            Status = iota // Reply is the service's reply
	StatusAppError                    // the handler failed; Reply is its message
	StatusNoSuchService               // the UAP has no handler for the service
	StatusTimedOut                    // the deadline passed before the UAP started it
)

func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusAppError:
		return "application error"
	case StatusNoSuchService:
		return "no such service"
	case StatusTimedOut:
		return "timed out"
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Completion is one finished request.
type Completion struct {
	Token  Token
	Status Status
	Reply  []byte // aliases shared memory: valid until Release(Token)
}

// Stats are the queue counters.
type Stats struct {
	Queued uint64 // requests ever queued
	Taken  uint64 // requests ever taken by a UAP
	Done   uint64 // completions ever read by WaitCompletions
	Depth  int    // requests in the queue now
	Busy   int    // control blocks serving a request now
}

type bufState struct {
	token atomic.Uint64 // live token, 0 when free
	big   atomic.Bool   // request or reply exceeded bigThreshold
}

// Segment is the scheduler's side of one service group's schedule queue.
type Segment struct {
	mapping
	layout Layout

	mu   sync.Mutex
	free []uint32 // free buffer indices (LIFO: hot buffers stay hot)
	gens []uint32 // generation of each buffer's last allocation

	bufs      []bufState
	inflight  atomic.Int64 // Enqueue calls between their closed check and publish
	reclaimMu sync.Mutex
	spin      spinner // WaitCompletions' (one goroutine)
}

// Create makes a sealed memfd segment named name (the name shows in
// /proc/PID/fd) sized for l, and maps it.
func Create(name string, l Layout) (*Segment, error) {
	if l.Slots < 0 || l.MaxMessage < 0 || l.Processes < 0 {
		return nil, fmt.Errorf("shm: negative layout %+v", l)
	}
	g, err := newGeometry(uint64(l.Slots), uint64(l.MaxMessage), uint64(l.Processes))
	if err != nil {
		return nil, err
	}
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, os.NewSyscallError("memfd_create", err)
	}
	f := os.NewFile(uintptr(fd), "memfd:"+name)
	fail := func(op string, err error) (*Segment, error) {
		f.Close()
		return nil, fmt.Errorf("shm: create %q: %w", name, os.NewSyscallError(op, err))
	}
	if err := unix.Ftruncate(fd, int64(g.size)); err != nil {
		return fail("ftruncate", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS,
		unix.F_SEAL_GROW|unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL); err != nil {
		return fail("fcntl F_ADD_SEALS", err)
	}
	mem, err := unix.Mmap(fd, 0, int(g.size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("mmap", err)
	}
	s := &Segment{layout: l}
	s.init(f, fd, mem, g)
	h := s.hdr
	h.version, h.slots, h.maxMessage, h.procs = version, g.slots, g.maxMessage, g.procs
	h.nbuf, h.compCap, h.size = g.nbuf, g.compCap, g.size
	h.resident = uint32(g.procs)
	if l.Resident > 0 && uint64(l.Resident) < g.procs {
		h.resident = uint32(l.Resident)
	}
	for i := uint64(0); i < g.slots; i++ {
		s.q.seq(i).Store(freeSeq(i))
	}
	for i := uint64(0); i < g.compCap; i++ {
		s.c.seq(i).Store(freeSeq(i))
	}
	atomic.StoreUint64(&h.magic, magic) // last: a mapper checks it first
	s.free = make([]uint32, g.nbuf)
	for i := range s.free {
		s.free[i] = uint32(g.nbuf) - 1 - uint32(i)
	}
	s.gens = make([]uint32, g.nbuf)
	s.bufs = make([]bufState, g.nbuf)
	s.spin = newSpinner()
	return s, nil
}

// File is the memfd, to pass to a UAP process in exec.Cmd.ExtraFiles.
func (s *Segment) File() *os.File { return s.f }

// Layout is the layout the segment was created with.
func (s *Segment) Layout() Layout { return s.layout }

func (s *Segment) alloc(n int) (uint32, Token, bool) {
	s.mu.Lock()
	if len(s.free) == 0 {
		s.mu.Unlock()
		return 0, 0, false
	}
	idx := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	gen := s.gens[idx] + 1
	if gen == 0 {
		gen = 1
	}
	s.gens[idx] = gen
	s.mu.Unlock()
	tok := Token(uint64(gen)<<32 | uint64(idx))
	b := &s.bufs[idx]
	b.big.Store(n > bigThreshold)
	b.token.Store(uint64(tok))
	return idx, tok, true
}

// Enqueue copies req into a request buffer and queues it for service, waking a
// sleeping UAP. It is safe for concurrent use. It fails with ErrNameTooLong,
// ErrTooBig, ErrClosed, or ErrFull when Slots requests are queued or no buffer
// is free (buffers are held from Enqueue until Release). A zero deadline means
// none; a UAP answers StatusTimedOut without running a request whose deadline
// passed before it started.
func (s *Segment) Enqueue(service string, req []byte, deadline time.Time) (Token, error) {
	if len(service) > maxName {
		return 0, ErrNameTooLong
	}
	if uint64(len(req)) > s.g.maxMessage {
		return 0, ErrTooBig
	}
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	if s.hdr.closed.Load() != 0 {
		return 0, ErrClosed
	}
	if s.q.depth() >= int(s.g.slots) {
		return 0, ErrFull // cheap early answer; reserve below decides
	}
	idx, tok, ok := s.alloc(len(req))
	if !ok {
		return 0, ErrFull
	}
	copy(s.buf(idx), req)
	pos, ok := s.q.reserve(nil)
	if !ok {
		s.Release(tok)
		return 0, ErrFull
	}
	e := (*qEntry)(s.q.entry(pos))
	e.token = uint64(tok)
	e.deadline = 0
	if !deadline.IsZero() {
		e.deadline = deadline.UnixNano()
	}
	e.reqLen = uint32(len(req))
	e.nameLen = uint32(copy(e.name[:], service))
	s.q.publish(pos)
	s.wakeUAP()
	return tok, nil
}

// Release frees the buffer of t, giving its pages back to the kernel if the
// request or reply exceeded 256 KiB. A stale or already released token is
// ignored. See the package comment for when a token may be released.
func (s *Segment) Release(t Token) {
	idx := t.index()
	if uint64(idx) >= s.g.nbuf || t == 0 {
		return
	}
	b := &s.bufs[idx]
	if !b.token.CompareAndSwap(uint64(t), 0) {
		return
	}
	if b.big.Load() {
		off := s.g.bufOff + uint64(idx)*s.g.stride
		// Failure only means the pages stay resident.
		_ = unix.Fallocate(s.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE,
			int64(off), int64(s.g.stride))
		b.big.Store(false)
	}
	s.mu.Lock()
	s.free = append(s.free, idx)
	s.mu.Unlock()
}

// drain appends every completion in the ring to out.
func (s *Segment) drain(out []Completion) []Completion {
	var n uint64
	for {
		pos, ok := s.c.take(nil)
		if !ok {
			break
		}
		e := (*cEntry)(s.c.entry(pos))
		tok, st, rl := Token(e.token), Status(e.status), uint64(e.replyLen)
		s.c.release(pos)
		n++
		idx := tok.index()
		if tok == 0 || uint64(idx) >= s.g.nbuf {
			continue // null entry left by Reclaim
		}
		b := &s.bufs[idx]
		if b.token.Load() != uint64(tok) {
			continue // already released (reclaimed): stale
		}
		if rl > s.g.maxMessage {
			st, rl = StatusAppError, 0
		}
		if rl > bigThreshold {
			b.big.Store(true)
		}
		out = append(out, Completion{Token: tok, Status: st, Reply: s.buf(idx)[:rl:rl]})
	}
	if n > 0 {
		s.hdr.done.Add(n)
	}
	return out
}

// idle reports that the segment is closed and no request is queued or being
// served, so no completion can come any more.
func (s *Segment) idle() bool {
	if s.hdr.closed.Load() != 2 || s.q.depth() != 0 {
		return false
	}
	for i := 0; i < int(s.g.procs); i++ {
		if s.cb(i).state.Load() == stateBusy {
			return false
		}
	}
	return true
}

// WaitCompletions returns buf[:0] with every completion available now
// appended, spinning briefly and then sleeping on the completion futex up to
// timeout when there is none. It returns buf[:0] on timeout, or at once when
// the segment is closed and nothing is left to complete. A buf with capacity
// Slots+Processes never grows. Call it from one goroutine only, never from a
// gnet event loop.
func (s *Segment) WaitCompletions(buf []Completion, timeout time.Duration) []Completion {
	out := s.drain(buf[:0])
	if len(out) > 0 {
		return out
	}
	start := time.Now()
	if s.spin.spin(start, s.c.ready) {
		s.spin.learn(time.Since(start))
		return s.drain(out)
	}
	h := s.hdr
	end := start.Add(timeout)
	for {
		v := h.cWait.prepare()
		if out = s.drain(out); len(out) > 0 {
			h.cWait.done()
			s.spin.learn(time.Since(start))
			return out
		}
		if s.idle() {
			h.cWait.done()
			return s.drain(out)
		}
		left := time.Until(end)
		if left <= 0 {
			h.cWait.done()
			s.spin.learn(-1)
			return out
		}
		h.cWait.sleep(v, min(left, maxSleep))
	}
}

func (s *Segment) checkSlot(slot int) error {
	if slot < 0 || uint64(slot) >= s.g.procs {
		return fmt.Errorf("shm: process slot %d out of range 0..%d", slot, s.g.procs-1)
	}
	return nil
}

// PrepareSlot resets control block slot before a process is spawned into it.
// It repairs the rings like Reclaim but forgets the token: after a process
// ended, call Reclaim first to learn what it held.
func (s *Segment) PrepareSlot(slot int) error {
	if err := s.checkSlot(slot); err != nil {
		return err
	}
	s.reclaim(slot)
	return nil
}

// Reclaim is called after the process in control block slot ended. It
// reports the token of the request that process had taken and not finished,
// if any (fail it with 'server terminated'), repairs any ring step the process
// left half done so the queue keeps moving, and frees the control block. The
// token may also arrive from WaitCompletions (the process died after pushing
// its completion): de-duplicate by token. Safe for concurrent use.
func (s *Segment) Reclaim(slot int) (Token, bool) {
	if s.checkSlot(slot) != nil {
		return 0, false
	}
	return s.reclaim(slot)
}

func (s *Segment) reclaim(slot int) (Token, bool) {
	s.reclaimMu.Lock()
	defer s.reclaimMu.Unlock()
	cb := s.cb(slot)
	var tok Token
	found := false
	if cb.state.Load() == stateBusy {
		tok, found = Token(cb.token.Load()), true
	}
	// Schedule queue: a claim whose CAS moved the head but whose entry was
	// never released. Another process's claim on the same position is live
	// (it will release or retry soon) unless it is dead too.
	if c := cb.claim.Load(); c != 0 {
		pos := c - 1
		if s.q.head.Load() > pos && s.awaitClaim(slot, &s.q, pos, pubSeq(pos), queueClaim) {
			e := (*qEntry)(s.q.entry(pos))
			if !found {
				tok, found = Token(e.token), true
			}
			s.q.release(pos)
		}
	}
	// Completion ring: a reserved entry never published blocks the reply
	// reader forever; publish it as a null entry (token 0).
	if c := cb.compClaim.Load(); c != 0 {
		pos := c - 1
		if s.c.tail.Load() > pos && s.awaitClaim(slot, &s.c, pos, freeSeq(pos), compClaim) {
			e := (*cEntry)(s.c.entry(pos))
			e.token, e.status, e.replyLen = 0, 0, 0
			s.c.publish(pos)
			s.hdr.cWait.signal()
		}
	}
	cb.claim.Store(0)
	cb.compClaim.Store(0)
	cb.token.Store(0)
	cb.pid.Store(0)
	cb.served.Store(0)
	cb.stop.Store(0)
	cb.state.Store(stateFree)
	return tok, found
}

type claimKind int

const (
	queueClaim claimKind = iota
	compClaim
)

// awaitClaim decides whether the dead process in slot won the CAS on position
// pos of r: the entry's sequence is still want (the step was never finished)
// and no other attached process announces a claim on pos. A live process with
// the same claim is inside its short CAS window and resolves it without
// blocking, so wait for it (at most 100 ms: past that it is presumably dead
// too, and the entry is attributed to slot, once).
func (s *Segment) awaitClaim(slot int, r *ring, pos, want uint64, kind claimKind) bool {
	end := time.Now().Add(maxSleep)
	for {
		if r.seq(pos).Load() != want {
			return false
		}
		other := false
		for i := 0; i < int(s.g.procs); i++ {
			cb := s.cb(i)
			if i == slot || cb.state.Load() == stateFree {
				continue
			}
			c := &cb.claim
			if kind == compClaim {
				c = &cb.compClaim
			}
			if c.Load() == pos+1 {
				other = true
				break
			}
		}
		if !other || time.Now().After(end) {
			return true
		}
		runtime.Gosched()
		time.Sleep(20 * time.Microsecond)
	}
}

// SlotState is the life stage of a control block.
type SlotState uint32

const (
	SlotFree     SlotState = stateFree     // no process
	SlotAttached SlotState = stateAttached // mapped, not yet waiting for work
	SlotIdle     SlotState = stateIdle     // waiting for a request
	SlotBusy     SlotState = stateBusy     // serving a request
)

func (s SlotState) String() string {
	switch s {
	case SlotFree:
		return "free"
	case SlotAttached:
		return "attached"
	case SlotIdle:
		return "idle"
	case SlotBusy:
		return "busy"
	}
	return fmt.Sprintf("state(%d)", uint32(s))
}

// SlotInfo is what a control block says about its process.
type SlotInfo struct {
	State  SlotState
	PID    int
	Served uint64 // requests it completed
}

// SlotInfo reads control block slot.
func (s *Segment) SlotInfo(slot int) SlotInfo {
	if s.checkSlot(slot) != nil {
		return SlotInfo{}
	}
	cb := s.cb(slot)
	return SlotInfo{State: SlotState(cb.state.Load()), PID: int(cb.pid.Load()), Served: cb.served.Load()}
}

// RequestStop asks the process in slot to take no further request: its
// Serve returns nil once it holds none. A request it has taken is finished
// first, so stopping a process never fails a call.
func (s *Segment) RequestStop(slot int) {
	if s.checkSlot(slot) != nil {
		return
	}
	s.cb(slot).stop.Store(1)
	s.hdr.qWait.wakeAll()
	s.hdr.xWait.wakeAll()
}

// wakeUAP wakes a sleeping UAP for a request just queued: a resident one
// if any sleeps, else a non-resident one.
func (m *mapping) wakeUAP() {
	if m.hdr.qWait.waiters.Load() != 0 {
		m.hdr.qWait.signal()
		return
	}
	m.hdr.xWait.signal()
}

// waitqOf is the queue the process in slot sleeps on.
func (m *mapping) waitqOf(slot int) *waitq {
	if uint32(slot) < m.hdr.resident {
		return &m.hdr.qWait
	}
	return &m.hdr.xWait
}

// Depth is the number of requests in the schedule queue now; cheaper than
// Stats, for calling after every Enqueue.
func (s *Segment) Depth() int { return s.q.depth() }

// Stats reads the queue counters.
func (s *Segment) Stats() Stats {
	st := Stats{
		Queued: s.hdr.qTail.Load(),
		Taken:  s.hdr.qHead.Load(),
		Done:   s.hdr.done.Load(),
		Depth:  s.q.depth(),
	}
	for i := 0; i < int(s.g.procs); i++ {
		if s.cb(i).state.Load() == stateBusy {
			st.Busy++
		}
	}
	return st
}

// Close marks the segment closed: Enqueue fails with ErrClosed from now on,
// UAPs drain what is queued and then Serve returns nil. It waits for Enqueue
// calls in flight and wakes every sleeper. Closing twice is a no-op.
func (s *Segment) Close() error {
	if !s.hdr.closed.CompareAndSwap(0, 1) {
		return nil
	}
	for s.inflight.Load() != 0 {
		runtime.Gosched()
	}
	s.hdr.closed.Store(2)
	s.hdr.qWait.wakeAll()
	s.hdr.xWait.wakeAll()
	s.hdr.cWait.wakeAll()
	return nil
}

// Unmap releases the mapping and the memfd. Nothing of the segment may be used
// afterwards (Completion.Reply included). UAP processes keep their own
// mappings.
func (s *Segment) Unmap() error { return s.unmap() }
