package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Errors returned by this package.
var (
	ErrTooBig      = errors.New("shm: message larger than max_message_size")
	ErrNameTooLong = errors.New("shm: entry name longer than 32 bytes")
	ErrClosed      = errors.New("shm: closed")
	errBusy        = errors.New("shm: every mailbox of the process holds a call")
)

// Group is the scheduler's side of one service group's shared memory: the
// group page (read-only to every UAP) and the processes' areas and
// doorbells. The reply reader sleeps in its Doorbells' Wait until a
// process rings.
//
// NewProc, Remove, Close and every Proc method run under the caller's group
// lock; Pending and Wait (one goroutine, the reader) do not need it. A
// removed area is unmapped only by the reader, between its looks, so a look
// never touches unmapped memory.
type Group struct {
	name      string
	maxMsg    int
	mailboxes int
	page      *os.File // the group page memfd, sealed against writes by anyone but us
	mem       []byte
	gp        *groupPage
	procs     []atomic.Pointer[Proc] // by slot, for Wait's lock-free look
	bells     *Doorbells             // where its processes' doorbells ring
	index     int                    // its index in bells
	ownBells  bool                   // bells are the group's alone (NewGroup): Unmap closes them

	retiredMu sync.Mutex
	retired   []*Proc // removed, to be unmapped by the reader
}

// NewGroup makes a group (see Doorbells.NewGroup) with doorbells of its
// own: its reader waits for it alone (Wait).
func NewGroup(name string, maxMessage, slots, mailboxes int) (*Group, error) {
	d, err := NewDoorbells()
	if err != nil {
		return nil, err
	}
	g, err := d.NewGroup(name, maxMessage, slots, mailboxes)
	if err != nil {
		d.Close()
		return nil, err
	}
	g.ownBells = true
	return g, nil
}

// makeGroup makes the group page.
func makeGroup(name string, maxMessage, slots, mailboxes int) (*Group, error) {
	if err := checkMaxMessage(maxMessage); err != nil {
		return nil, err
	}
	if mailboxes < 1 || mailboxes > MaxMailboxes {
		return nil, fmt.Errorf("shm: %d mailboxes, want 1..%d", mailboxes, MaxMailboxes)
	}
	if slots < 1 || slots > 1<<16 {
		return nil, fmt.Errorf("shm: %d process slots, want 1..65536", slots)
	}
	f, mem, err := createMemfd(name+"-group", pageSize)
	if err != nil {
		return nil, err
	}
	g := &Group{name: name, maxMsg: maxMessage, mailboxes: mailboxes, page: f, mem: mem, gp: (*groupPage)(unsafe.Pointer(&mem[0])),
		procs: make([]atomic.Pointer[Proc], slots)}
	g.gp.version, g.gp.maxMessage = Version, uint32(maxMessage)
	atomic.StoreUint64(&g.gp.magic, groupMagic)
	// Our mapping stays writable; every later mapping (the UAPs') can only
	// be read-only.
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_FUTURE_WRITE); err != nil {
		g.unmap()
		return nil, fmt.Errorf("shm: group %s: %w (F_SEAL_FUTURE_WRITE needs Linux 5.1)",
			name, os.NewSyscallError("fcntl F_ADD_SEALS", err))
	}
	return g, nil
}

// createMemfd makes a memfd of size bytes, seals its size and maps it
// shared and writable.
func createMemfd(name string, size int64) (*os.File, []byte, error) {
	fd, err := unix.MemfdCreate("tpsched-"+name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, nil, fmt.Errorf("shm: %s: %w", name, os.NewSyscallError("memfd_create", err))
	}
	f := os.NewFile(uintptr(fd), "memfd:tpsched-"+name)
	fail := func(op string, err error) (*os.File, []byte, error) {
		f.Close()
		return nil, nil, fmt.Errorf("shm: %s: %w", name, os.NewSyscallError(op, err))
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		return fail("ftruncate", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_GROW|unix.F_SEAL_SHRINK); err != nil {
		return fail("fcntl F_ADD_SEALS", err)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("mmap", err)
	}
	return f, mem, nil
}

// MaxMessage is the group's max_message_size.
func (g *Group) MaxMessage() int { return g.maxMsg }

// Mailboxes is how many calls a process may hold.
func (g *Group) Mailboxes() int { return g.mailboxes }

// Slots is the number of process slots.
func (g *Group) Slots() int { return len(g.procs) }

// Proc is the process in slot now, nil if there is none.
func (g *Group) Proc(slot int) *Proc {
	if slot < 0 || slot >= len(g.procs) {
		return nil
	}
	return g.procs[slot].Load()
}

// NewProc makes a fresh area and doorbell for a process about to be started
// into slot, replacing (and closing) what the slot had.
func (g *Group) NewProc(slot int) (*Proc, error) {
	if slot < 0 || slot >= len(g.procs) {
		return nil, fmt.Errorf("shm: process slot %d out of range 0..%d", slot, len(g.procs)-1)
	}
	g.Remove(slot)
	name := fmt.Sprintf("%s-%d", g.name, slot)
	f, mem, err := createMemfd(name, areaSize(g.maxMsg, g.mailboxes))
	if err != nil {
		return nil, err
	}
	p := &Proc{g: g, slot: slot, area: f, mem: mem, ctl: (*procCtl)(unsafe.Pointer(&mem[0])),
		bufs: make([][]byte, g.mailboxes), held: make([]handed, 0, g.mailboxes)}
	stride := bufStride(g.maxMsg)
	for i := range p.bufs {
		off := pBuffer + i*stride
		p.bufs[i] = mem[off : off+g.maxMsg : off+g.maxMsg]
	}
	off := pBuffer + g.mailboxes*stride
	p.outBuf = mem[off : off+g.maxMsg+outNames : off+g.maxMsg+outNames]
	p.ctl.version, p.ctl.maxMessage, p.ctl.mailboxes = Version, uint32(g.maxMsg), uint32(g.mailboxes)
	atomic.StoreUint64(&p.ctl.magic, procMagic)
	// Blocking (a UAP's write blocks only if the counter is about to
	// overflow, after 2^64 rings), so os.NewFile keeps it out of Go's
	// netpoller: scdd never reads it, the reader's epoll watches it.
	bell, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		p.unmap()
		return nil, fmt.Errorf("shm: %s: %w", name, os.NewSyscallError("eventfd", err))
	}
	p.bell = os.NewFile(uintptr(bell), "eventfd:tpsched-"+name)
	if p.line, p.lineChild, err = newControlLine(name); err != nil {
		p.unmap()
		return nil, fmt.Errorf("shm: %s: %w", name, err)
	}
	if err := g.bells.add(g, slot, bell); err != nil {
		p.unmap()
		return nil, fmt.Errorf("shm: %s: %w", name, err)
	}
	g.procs[slot].Store(p)
	return p, nil
}

// Remove closes the process area of slot, if any: after the process ended.
func (g *Group) Remove(slot int) {
	if slot < 0 || slot >= len(g.procs) {
		return
	}
	if p := g.procs[slot].Swap(nil); p != nil {
		g.bells.remove(int(p.bell.Fd()))
		g.retiredMu.Lock()
		g.retired = append(g.retired, p)
		g.retiredMu.Unlock()
	}
}

// unmapRetired frees the areas of removed processes; only the reader calls
// it, between its looks.
func (g *Group) unmapRetired() {
	g.retiredMu.Lock()
	ps := g.retired
	g.retired = nil
	g.retiredMu.Unlock()
	for _, p := range ps {
		p.unmap()
	}
}

// Pending reports, without the group lock, whether some process has
// something for the reader: a completion, or it has just become ready.
func (g *Group) Pending() bool {
	for i := range g.procs {
		if p := g.procs[i].Load(); p != nil && p.pending() {
			return true
		}
	}
	return false
}

// Wait is the Wait of the group's doorbells: it returns when a process of
// this group, or of another group on the same doorbells, may have
// something for the reader (Pending), or after timeout (a closed group
// does not end it: see Doorbells.Wait). Call it from one goroutine only,
// never from a gnet event loop.
func (g *Group) Wait(timeout time.Duration) { g.bells.Wait(timeout) }

// Close tells every process that the node is stopping: each leaves once it
// holds no call. Calls already handed over are still completed.
func (g *Group) Close() {
	g.gp.closed.Store(1)
	for i := range g.procs {
		if p := g.procs[i].Load(); p != nil {
			p.ctl.wake.Add(1)
			futexWake(&p.ctl.wake, 1)
			if p.laneIn != nil {
				p.laneIn.wakeCallee()
			}
		}
	}
}

// Unmap releases the group page and every process area, and the
// doorbells if they are the group's own. Nothing of the group may be used
// afterwards.
func (g *Group) Unmap() error {
	for i := range g.procs {
		g.Remove(i)
	}
	g.unmapRetired()
	return g.unmap()
}

func (g *Group) unmap() error {
	var err error
	if g.mem != nil {
		err = os.NewSyscallError("munmap", unix.Munmap(g.mem))
		g.mem, g.gp = nil, nil
	}
	if g.page != nil {
		err = errors.Join(err, g.page.Close())
		g.page = nil
	}
	if g.ownBells && g.bells != nil {
		err = errors.Join(err, g.bells.Close())
		g.bells = nil
	}
	return err
}

// Proc is the scheduler's side of one UAP process: its area (the calls
// handed to it, its state, its replies) and its doorbell. Nothing the
// process writes is trusted: a completion counts only for a call this Proc
// handed over, and its length and status are checked.
type Proc struct {
	g    *Group
	slot int
	area *os.File
	mem  []byte
	ctl  *procCtl
	bufs [][]byte // one per mailbox
	bell *os.File

	// Under the group lock: the last number used, the calls handed over
	// and not completed, oldest (the current call) first, and the mailboxes
	// they are in (a bit each).
	no   uint64
	held []handed
	busy uint64

	pid      atomic.Int32  // the process's pid as the node started it (SetPID), never what it wrote in its area
	cur      atomic.Uint64 // number of the current call, 0 none: for pending's lock-free look
	attached atomic.Bool   // seen ready by the reader
	rings    atomic.Uint64 // doorbell events seen (see Rings)
	ignored  atomic.Bool   // Ignore: its area pends nothing, its doorbell is out of the reader's epoll

	// The process's own call (UAP.Call): the number of the last one the
	// reader took (for pending's look), and, under outMu, whether it waits
	// for its answer and whether the area is gone. AnswerOutCall runs on
	// any goroutine, so it may not write an area the reader unmapped.
	outSeen atomic.Uint64
	outMu   sync.Mutex
	outOpen bool
	outCopy []byte // OutCall's copy of the call, reused
	outGone bool
	outBuf  []byte

	// Lanes (lane.go): the process's control line (ours, and its end until
	// it started), the lane it serves as callee (under the group lock),
	// and whether it is refused lanes.
	line, lineChild *os.File
	laneIn          *Lane
	noLanes         atomic.Bool
}

type handed struct {
	no uint64
	mb int
}

// Completion is a process's answer to a call it was handed.
type Completion struct {
	Status Status
	Reply  []byte // aliases the process area: valid until the next Dispatch or Close
}

// ProtocolError is a process that broke the shared-memory protocol: its
// call fails and the process should be killed.
type ProtocolError struct {
	PID int
	Why string
}

func (e *ProtocolError) Error() string {
	return fmt.Sprintf("shm: uap pid %d broke the protocol: %s", e.PID, e.Why)
}

// Files are what the process is started with, in order as fd 3, 4, 5 and
// 6: its area (read-write), the group page (read-only), its doorbell and
// its end of its control line (lane.go).
func (p *Proc) Files() []*os.File { return []*os.File{p.area, p.g.page, p.bell, p.lineChild} }

// Slot is the process slot.
func (p *Proc) Slot() int { return p.slot }

// PID is the process's pid as its starter gave it (SetPID), 0 before. The
// pid the process wrote in its area is its own claim, never repeated.
func (p *Proc) PID() int { return int(p.pid.Load()) }

// SetPID records the pid the process was started with. Its end of the
// control line is its own from then on: ours is closed.
func (p *Proc) SetPID(pid int) {
	p.pid.Store(int32(pid))
	if p.lineChild != nil {
		p.lineChild.Close()
		p.lineChild = nil
	}
}

func (p *Proc) pending() bool {
	if p.ignored.Load() {
		return false
	}
	if p.ctl.out.no.Load() != p.outSeen.Load() {
		return true // it made a call
	}
	if c := p.cur.Load(); c != 0 {
		return p.ctl.doneNo.Load() >= c
	}
	return !p.attached.Load() && p.ctl.state.Load() == stateReady
}

// Attach reports, once, that the process has attached and waits for
// calls: true the first time it is seen ready.
func (p *Proc) Attach() bool {
	if p.attached.Load() || p.ctl.state.Load() != stateReady {
		return false
	}
	p.attached.Store(true)
	return true
}

// Entries are the entry names the process registered (as it says: for
// messages to the operator, never trusted for anything else).
func (p *Proc) Entries() []string {
	n := min(p.ctl.entries.Load(), maxEntries)
	out := make([]string, 0, n)
	for i := range n {
		b := p.mem[pEntryTable+int(i)*maxName:][:maxName]
		l := 0
		for l < maxName && b[l] != 0 {
			l++
		}
		out = append(out, string(b[:l]))
	}
	return out
}

// Dispatch hands the process a call: entry names its handler, req is
// copied into a mailbox's buffer, deadline (unix ns, 0 none) is when it
// must no longer start it. The process may hold calls already (the new one
// goes after them). Wake it afterwards.
func (p *Proc) Dispatch(entry string, req []byte, deadline int64) error {
	switch {
	case len(req) > p.g.maxMsg:
		return ErrTooBig
	case len(entry) > maxName:
		return ErrNameTooLong
	case len(p.held) == len(p.bufs):
		return errBusy // every mailbox holds a call
	}
	no, mb := p.no+1, bits.TrailingZeros64(^p.busy) // the lowest free mailbox
	p.busy |= 1 << mb
	m := &p.ctl.mb[mb]
	copy(p.bufs[mb], req)
	m.reqLen, m.entryLen, m.deadline = uint32(len(req)), uint32(len(entry)), deadline
	copy(m.entry[:], entry)
	m.claim.Store(no << 2)
	p.no = no
	p.held = append(p.held, handed{no: no, mb: mb})
	if len(p.held) == 1 {
		p.cur.Store(no)
	}
	p.ctl.dispatchNo.Store(no) // publishes the mailbox
	p.ctl.wake.Add(1)
	return nil
}

// Wake rouses the process if it sleeps; call it after Dispatch or Stop.
// It clears the process's sleeping word as it wakes it: calls handed over
// in the same burst then cost no further syscall, and none is needed (the
// process had read wake before it said it sleeps, so its futex wait fails
// or is woken by this one).
func (p *Proc) Wake() {
	if s := &p.ctl.sleeping; s.Load() != 0 && s.Swap(0) != 0 {
		futexWake(&p.ctl.wake, 1)
	}
	if p.laneIn != nil { // it sleeps on the lane's word while it serves one
		p.laneIn.wakeCallee()
	}
}

// Completion returns the process's answer to its current call, once; ok is
// false while it has not answered. Its next call, if any, becomes current:
// call Completion again, it may be done too. A *ProtocolError means the
// answer is unusable (the call fails, the process should be killed).
func (p *Proc) Completion() (c Completion, ok bool, err error) {
	if len(p.held) == 0 || p.ctl.doneNo.Load() < p.held[0].no {
		return c, false, nil
	}
	h := p.held[0]
	p.busy &^= 1 << h.mb
	p.held = append(p.held[:0], p.held[1:]...)
	if len(p.held) > 0 {
		p.cur.Store(p.held[0].no)
	} else {
		p.cur.Store(0)
	}
	m := &p.ctl.mb[h.mb]
	st, n := Status(m.status.Load()), m.replyLen.Load()
	switch {
	case st >= statusEnd:
		return c, true, &ProtocolError{PID: p.PID(), Why: fmt.Sprintf("completion status %d", st)}
	case uint64(n) > uint64(p.g.maxMsg):
		return c, true, &ProtocolError{PID: p.PID(), Why: fmt.Sprintf("reply of %d bytes, max_message_size %d", n, p.g.maxMsg)}
	}
	return Completion{Status: st, Reply: p.bufs[h.mb][:n:n]}, true, nil
}

// Holding reports how many calls the process holds and has not answered.
func (p *Proc) Holding() int { return len(p.held) }

// Taken is how many of the calls the process holds, from the current one
// on, it may have started: up to the last one whose claim says taken. The
// others never started and can go elsewhere. An honest UAP takes its calls
// in order; counting up to the last taken one keeps a call that a hostile
// one took out of order from running twice.
func (p *Proc) Taken() int {
	n := 0
	for i, h := range p.held {
		if p.ctl.mb[h.mb].claim.Load() == h.no<<2|claimTaken {
			n = i + 1
		}
	}
	return n
}

// Revoke takes back the last call handed to the process if it has not
// taken it; false if it had (or holds no call but its current one). The
// request is not read back: what the process's buffer holds now is the
// process's to write, so the scheduler keeps its own copy of every call it
// hands over.
func (p *Proc) Revoke() bool {
	if len(p.held) < 2 {
		return false
	}
	h := p.held[len(p.held)-1]
	m := &p.ctl.mb[h.mb]
	if !m.claim.CompareAndSwap(h.no<<2|claimOffered, h.no<<2|claimRevoked) {
		return false
	}
	p.busy &^= 1 << h.mb
	p.held = p.held[:len(p.held)-1]
	return true
}

// Rings is how many times the reader was woken by this process's
// doorbell. A process that completes nothing and keeps ringing misbehaves.
func (p *Proc) Rings() uint64 { return p.rings.Load() }

// Ignore makes the reader deaf to the process until it is removed: its
// doorbell leaves the reader's epoll and nothing in its area counts as
// pending any more. For a process the scheduler has ruled killed and no
// longer reads: until its exit is seen, which may be long (a process in
// uninterruptible sleep, or dead under a tracer that does not wait for
// it), neither it nor a child that holds its area and doorbell can keep
// the reader awake. Its area is still there to read when its exit is
// settled.
func (p *Proc) Ignore() {
	if !p.ignored.Swap(true) && p.g.bells != nil {
		p.g.bells.remove(int(p.bell.Fd()))
	}
}

// Stop asks the process to take no further call: it leaves once it holds
// none. Wake it afterwards.
func (p *Proc) Stop() {
	p.ctl.stop.Store(1)
	p.ctl.wake.Add(1)
}

// Left reports whether the process said it leaves (stop, close, refresh).
func (p *Proc) Left() bool { return p.ctl.state.Load() == stateLeft }

func (p *Proc) unmap() {
	p.outMu.Lock()
	p.outGone = true // an answer that comes later is dropped
	p.outMu.Unlock()
	if p.mem != nil {
		_ = unix.Munmap(p.mem)
		p.mem = nil
	}
	if p.area != nil {
		// The area's pages are scdd's (it writes the requests), so they
		// are charged to scdd's memory cgroup, not the server's. A process
		// may have passed the area's descriptor to a child that outlives
		// it: closing ours would keep its pages for as long as that child
		// lives, one area per life. Punched out, the child keeps an empty
		// file; nothing of the node is left for it to read either.
		_ = unix.Fallocate(int(p.area.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, areaSize(p.g.maxMsg, p.g.mailboxes))
		p.area.Close()
	}
	if p.bell != nil {
		p.bell.Close()
	}
	for _, f := range []*os.File{p.line, p.lineChild} {
		if f != nil {
			f.Close()
		}
	}
}

// OutCall is a call a process made to a service (UAP.Call), as the
// scheduler copied it out of the process's area.
type OutCall struct {
	No uint64
	// Group, Service and Request are the scheduler's own copy, made once
	// per call into a buffer of the Proc's: valid until its next OutCall.
	Group, Service, Request []byte
	TimeoutMs               uint32 // 0: the target group's watch_time
}

// OutCall returns the call the process made, once; ok is false when it
// made none since the last. The call is copied, so the process cannot
// change it afterwards. A call that breaks the protocol (a second one
// before the first was answered, a number that skips, a name or a request
// out of bounds) is a *ProtocolError. Under the group lock, on the reader.
func (p *Proc) OutCall() (OutCall, bool, error) {
	no, seen := p.ctl.out.no.Load(), p.outSeen.Load()
	if no == seen {
		return OutCall{}, false, nil
	}
	violation := func(why string, args ...any) (OutCall, bool, error) {
		p.outSeen.Store(no) // once
		return OutCall{}, true, &ProtocolError{PID: p.PID(), Why: fmt.Sprintf(why, args...)}
	}
	p.outMu.Lock()
	open := p.outOpen
	p.outMu.Unlock()
	o := &p.ctl.out
	gl, sl, rl := o.groupLen, o.serviceLen, o.reqLen
	switch {
	case open:
		return violation("call %d made before call %d was answered", no, seen)
	case no != seen+1:
		return violation("call %d made after call %d", no, seen)
	case gl < 1 || gl >= maxName || sl < 1 || sl >= maxName:
		return violation("call with a group name of %d bytes and a service name of %d (1..%d each)", gl, sl, maxName-1)
	case uint64(rl) > uint64(p.g.maxMsg):
		return violation("call with a request of %d bytes, max_message_size %d", rl, p.g.maxMsg)
	}
	// One copy of the whole line's buffer, checked lengths and all: the
	// process may write the area again at any moment.
	p.outCopy = append(p.outCopy[:0], p.outBuf[:gl+sl+rl]...)
	b := p.outCopy
	c := OutCall{No: no, Group: b[:gl:gl], Service: b[gl : gl+sl : gl+sl], Request: b[gl+sl:], TimeoutMs: o.timeoutMs}
	p.outMu.Lock()
	p.outOpen = true
	p.outSeen.Store(no)
	p.outMu.Unlock()
	return c, true, nil
}

// AnswerOutCall answers the process's call no: code 0 with the reply, or an
// error code (netio's) with its message, and wakes the process. It returns
// false, answering nothing, when data is longer than the process's
// max_message_size (the caller answers with an error instead). An answer
// for a call the process no longer waits for, or after its area is gone,
// is dropped. Safe on any goroutine.
func (p *Proc) AnswerOutCall(no uint64, code uint32, data []byte) bool {
	fits, wake := p.PublishOutAnswer(no, code, data)
	if wake {
		p.WakeOutCaller()
	}
	return fits
}

// PublishOutAnswer is AnswerOutCall without the wake-up: the process sees
// the answer when it next looks, and WakeOutCaller, called afterwards
// (wake true), wakes it if it sleeps. So a reader can answer under a lock
// and make the wake-up's system call after it.
func (p *Proc) PublishOutAnswer(no uint64, code uint32, data []byte) (fits, wake bool) {
	if len(data) > p.g.maxMsg {
		return false, false
	}
	p.outMu.Lock()
	defer p.outMu.Unlock()
	if p.outGone || !p.outOpen || no != p.outSeen.Load() {
		return true, false
	}
	o := &p.ctl.out
	o.code.Store(code)
	o.replyLen.Store(uint32(copy(p.outBuf, data)))
	o.done.Store(no) // publishes them
	p.outOpen = false
	return true, true
}

// WakeOutCaller wakes the process if it sleeps waiting for its call's
// answer (after PublishOutAnswer). The process reads the futex word
// before it says it sleeps, so an answer published before this bump
// cannot be slept through. Safe on any goroutine.
func (p *Proc) WakeOutCaller() {
	p.outMu.Lock() // its area stays mapped while we hold it
	defer p.outMu.Unlock()
	if p.outGone {
		return
	}
	o := &p.ctl.out
	o.wake.Add(1)
	if s := &o.sleeping; s.Load() != 0 && s.Swap(0) != 0 {
		futexWake(&o.wake, 1)
	}
}

// OutOpen reports whether the process waits for the answer to a call it
// made.
func (p *Proc) OutOpen() bool {
	p.outMu.Lock()
	defer p.outMu.Unlock()
	return p.outOpen
}

// ring writes 1 to an eventfd.
func ring(fd int) {
	var one [8]byte
	binary.LittleEndian.PutUint64(one[:], 1)
	for {
		if _, err := unix.Write(fd, one[:]); err != unix.EINTR {
			return
		}
	}
}
