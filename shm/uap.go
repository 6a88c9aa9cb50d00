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
// during the call; its capacity reaches MaxMessage, so appending to it
// builds the reply in place. Returning req itself (or a sub-slice) is fine.
// An error becomes StatusAppError with err.Error() as the reply. A panic is
// not recovered: the process dies and the scheduler answers 'server
// terminated'.
type HandlerFunc func(req []byte) ([]byte, error)

// UAP is a user application program's side of its schedule queue: the
// process's area, written by the scheduler when it hands over a call and by
// the UAP when it answers. Register handlers with Handle, then Serve. A UAP
// serves one call at a time.
type UAP struct {
	area     []byte
	ctl      *procCtl
	bufs     [][]byte // one per mailbox
	page     []byte   // the group page, mapped read-only
	gp       *groupPage
	bell     int
	handlers map[string]HandlerFunc
	spin     spinner
	refresh  bool // serve one call, then leave (scd_refresh_process)
	served   bool
	started  bool   // entries published, state ready
	lastNo   uint64 // the number of the last call taken or skipped
	entry    [maxName]byte
	sock     *sockUAP // socket mode (receive_from = socket); nil for shared memory

	// Lanes (lane_uap.go): the control line (nil: the process takes
	// none), and the lane it serves as callee, on Serve's goroutine, with
	// the last generation it tried to map.
	line        *controlLine
	laneIn      *laneEnd
	laneInTried uint32

	// The process's own calls (Call): the out buffer, the number of the
	// last call made, and the deadline of the call being served, which a
	// call made without one of its own inherits.
	out         outState
	curDeadline atomic.Int64 // read by Call, from any of the service's goroutines
}

// Attach attaches the calling process, started by scdd, to its schedule
// queue: its area is fd TPSCHED_SHM_FD (default 3), the group page the
// next fd and its doorbell the one after. With TPSCHED_RECEIVE=socket
// (receive_from = socket) that fd is instead a connected unix stream socket
// to the scheduler; Handle and Serve work the same.
func Attach() (*UAP, error) {
	base := 3
	if v := os.Getenv("TPSCHED_SHM_FD"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("shm: TPSCHED_SHM_FD=%q: not a file descriptor", v)
		}
		base = n
	}
	refresh := os.Getenv("TPSCHED_REFRESH") == "1"
	switch v := os.Getenv("TPSCHED_RECEIVE"); v {
	case "socket":
		return attachSocket(base, refresh)
	case "", "queue":
	default:
		return nil, fmt.Errorf("shm: TPSCHED_RECEIVE=%q: want queue or socket", v)
	}
	u, err := AttachFDs(base, base+1, base+2)
	if err != nil {
		return nil, err
	}
	u.refresh = refresh
	u.line = openControlLine(base + 3)
	return u, nil
}

// AttachFDs attaches to the process area in fd area, the group page in fd
// group and the doorbell eventfd bell (see Proc.Files). The UAP owns them
// from then on; Close releases them.
func AttachFDs(area, group, bell int) (*UAP, error) {
	notOurs := func(what string, fd int) error {
		return fmt.Errorf("shm: attach: fd %d is not a tpsched %s (a UAP must be started by scdd, which passes its area, the group page and its doorbell as fds %d, %d and %d)",
			fd, what, area, area+1, area+2)
	}
	amem, err := mapFD(area, unix.PROT_READ|unix.PROT_WRITE)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", notOurs("process area", area), err)
	}
	gmem, err := mapFD(group, unix.PROT_READ)
	if err != nil {
		unix.Munmap(amem)
		return nil, fmt.Errorf("%w: %w", notOurs("group page", group), err)
	}
	fail := func(err error) (*UAP, error) {
		unix.Munmap(amem)
		unix.Munmap(gmem)
		return nil, err
	}
	ctl := (*procCtl)(unsafe.Pointer(&amem[0]))
	gp := (*groupPage)(unsafe.Pointer(&gmem[0]))
	switch {
	case atomic.LoadUint64(&ctl.magic) != procMagic:
		return fail(notOurs("process area", area))
	case atomic.LoadUint64(&gp.magic) != groupMagic:
		return fail(notOurs("group page", group))
	case ctl.version != Version || gp.version != Version:
		return fail(fmt.Errorf("shm: attach: layout version %d, this UAP knows %d (rebuild it with the scheduler's shm package)", ctl.version, Version))
	case ctl.mailboxes < 1 || ctl.mailboxes > MaxMailboxes:
		return fail(fmt.Errorf("shm: attach: %d mailboxes, want 1..%d", ctl.mailboxes, MaxMailboxes))
	case ctl.maxMessage != gp.maxMessage || int64(len(amem)) != areaSize(int(ctl.maxMessage), int(ctl.mailboxes)):
		return fail(fmt.Errorf("shm: attach: area of %d bytes does not fit %d mailboxes of max_message_size %d",
			len(amem), ctl.mailboxes, ctl.maxMessage))
	case ctl.state.Load() != stateNew:
		return fail(fmt.Errorf("shm: attach: the process area is in use by pid %d", ctl.pid.Load()))
	}
	var st unix.Stat_t
	if err := unix.Fstat(bell, &st); err != nil {
		return fail(fmt.Errorf("%w: %w", notOurs("doorbell", bell), os.NewSyscallError("fstat", err)))
	}
	// Another process of the same user could otherwise open this one's
	// area through /proc/PID/fd and answer its calls.
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	maxMsg, stride := int(ctl.maxMessage), bufStride(int(ctl.maxMessage))
	u := &UAP{area: amem, ctl: ctl, page: gmem, gp: gp, bell: bell, handlers: map[string]HandlerFunc{}, spin: newSpinner(spinMax),
		bufs: make([][]byte, ctl.mailboxes)}
	for i := range u.bufs {
		off := pBuffer + i*stride
		u.bufs[i] = amem[off : off+maxMsg : off+maxMsg]
	}
	off := pBuffer + len(u.bufs)*stride
	u.out.buf = amem[off : off+maxMsg+outNames : off+maxMsg+outNames]
	u.out.spin = newSpinner(spinMax)
	_ = unix.Close(area) // mapped: the descriptors are no longer needed
	_ = unix.Close(group)
	ctl.pid.Store(uint32(os.Getpid()))
	return u, nil
}

func mapFD(fd, prot int) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, os.NewSyscallError("fstat", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size < pageSize {
		return nil, errors.New("not a shared memory file")
	}
	mem, err := unix.Mmap(fd, 0, int(st.Size), prot, unix.MAP_SHARED)
	if err != nil {
		return nil, os.NewSyscallError("mmap", err)
	}
	return mem, nil
}

// Handle registers the handler of an entry (the entry part of the
// definition's `service = "name=entry"`, the service name when there is
// none). Call it before Serve. Names longer than 32 bytes can never be
// called.
func (u *UAP) Handle(entry string, h HandlerFunc) { u.handlers[entry] = h }

// MaxMessage is the largest request or reply.
func (u *UAP) MaxMessage() int {
	if u.sock != nil {
		return u.sock.maxMsg
	}
	return len(u.bufs[0])
}

// Serve serves calls one at a time until the scheduler asks the process to
// leave (stop, the node closing, or after one call in refresh mode); it
// then returns nil.
func (u *UAP) Serve() error {
	for {
		if err := u.ServeOne(); err != nil {
			if errors.Is(err, ErrClosed) {
				return nil
			}
			return err
		}
	}
}

// ServeOne waits for exactly one call, serves it and returns. It returns
// ErrClosed when the process is to leave: stopped, the node closing, or,
// in refresh mode, after the one call the process exists for.
func (u *UAP) ServeOne() error {
	if u.sock != nil {
		return u.sock.serveOne(u)
	}
	if u.area == nil || (u.refresh && u.served) {
		u.leave()
		return ErrClosed
	}
	if !u.started {
		u.publish()
	}
	no, mb, ok := u.next()
	if !ok {
		u.leave()
		return ErrClosed
	}
	if mb < 0 {
		u.serveLane(no)
	} else {
		u.serve(no, mb)
	}
	u.served = true
	return nil
}

// publish registers the entries in page 1 and says the process is ready.
func (u *UAP) publish() {
	n := 0
	for name := range u.handlers {
		if n == maxEntries || len(name) > maxName {
			continue
		}
		copy(u.area[pEntryTable+n*maxName:][:maxName], name)
		n++
	}
	u.ctl.entries.Store(uint32(n))
	if u.line != nil && !u.refresh {
		u.ctl.lanes.Store(1)
	}
	u.ctl.state.Store(stateReady)
	u.started = true
	ring(u.bell) // the scheduler hands over calls only to a ready process
}

func (u *UAP) leave() {
	if u.ctl != nil && u.ctl.state.Load() != stateLeft {
		u.ctl.state.Store(stateLeft)
		ring(u.bell)
	}
}

// newCall reports whether the scheduler handed over a call not yet looked at.
func (u *UAP) newCall() bool { return u.ctl.dispatchNo.Load() > u.lastNo }

func (u *UAP) told() bool { return u.ctl.stop.Load() != 0 || u.gp.closed.Load() != 0 }

// take claims the next call handed over, in number order, skipping
// numbers the scheduler revoked; 0 when none is left to look at. It
// returns the call's number and mailbox.
func (u *UAP) take() (uint64, int) {
	for d := u.ctl.dispatchNo.Load(); u.lastNo < d; {
		u.lastNo++
		n := u.lastNo
		for i := range u.bufs {
			c := &u.ctl.mb[i].claim
			if v := c.Load(); v>>2 == n {
				if v&3 == claimOffered && c.CompareAndSwap(n<<2|claimOffered, n<<2|claimTaken) {
					return n, i
				}
				break // revoked
			}
		}
		// Not in any mailbox: revoked, and its mailbox holds a later call.
	}
	return 0, 0
}

// next waits for the next call, spinning and then sleeping; false when the
// process is to leave. A call on the lane the process serves comes back
// with mailbox -1.
func (u *UAP) next() (uint64, int, bool) {
	c := u.ctl
	start := time.Now()
	spun := false
	news := func() bool {
		e := u.laneIn
		if e == nil {
			return u.newCall() || c.laneIn.Load() != 0 && c.laneIn.Load() != u.laneInTried
		}
		return u.newCall() || e.pending() || c.laneIn.Load() != e.grant.gen
	}
	ready := func() bool { return news() || u.told() }
	sleep := maxSleep
	for {
		u.syncLaneIn()
		if n := u.takeLane(); n != 0 {
			u.laneIn.spin.learn(time.Since(start))
			return n, -1, true
		}
		if n, mb := u.take(); n != 0 {
			u.spin.learn(time.Since(start))
			return n, mb, true
		}
		if u.told() {
			// A call handed over between take's look and the flag's is
			// still ours to serve: leave only with none to take.
			if n, mb := u.take(); n != 0 {
				return n, mb, true
			}
			u.leaveLaneIn()
			return 0, 0, false
		}
		if !spun {
			spun = true
			sp := &u.spin
			if u.laneIn != nil {
				sp = &u.laneIn.spin
			}
			if sp.spin(start, news) {
				continue
			}
			sp.learn(-1)
		}
		if e := u.laneIn; e != nil {
			// The lane's word: the caller moves it at every call, the
			// scheduler at a revoke, a stop and the node's close.
			sleepOn(&e.h.calleeWake, &e.h.calleeSleeping, ready, sleep)
		} else {
			sleepOn(&c.wake, &c.sleeping, ready, sleep)
		}
		sleep = min(2*sleep, max(maxSleep, idleSleepMax))
	}
}

// idleSleepMax bounds the sleeps of a process that has waited for calls
// for a while: they start at maxSleep and double. Every call, stop and
// close wakes the process, so the bound only catches a wake-up lost to a
// bug; each wake-up of a Go UAP goes through its runtime (sysmon's
// retake, a thread woken to poll), and S10's 128 idle callers, waking
// every maxSleep, took 0.18-0.35 of a core from every measurement beside
// them (docs/ARCHITECTURE.md, "Idle caller UAPs").
const idleSleepMax = time.Second

// serve runs call no, which take claimed in mailbox i: the mailbox is the
// UAP's until it stores done.
func (u *UAP) serve(no uint64, i int) {
	m, buf := &u.ctl.mb[i], u.bufs[i]
	n := min(uint64(m.reqLen), uint64(len(buf)))
	nl := min(int(m.entryLen), maxName)
	copy(u.entry[:], m.entry[:nl])
	u.curDeadline.Store(m.deadline)
	st, rl := u.run(buf, n, m.deadline, u.entry[:nl])
	u.curDeadline.Store(0)
	m.status.Store(uint32(st))
	m.replyLen.Store(uint32(rl))
	u.ctl.doneNo.Store(no)
	if u.gp.sleeping.Load() != 0 {
		ring(u.bell)
	}
}

func (u *UAP) run(buf []byte, n uint64, deadline int64, entry []byte) (Status, uint64) {
	if deadline != 0 && time.Now().UnixNano() > deadline {
		return StatusTimedOut, 0
	}
	h, ok := u.handlers[string(entry)]
	if !ok {
		return StatusNoSuchService, uint64(copy(buf, entry))
	}
	reply, err := h(buf[:n])
	if err != nil {
		return StatusAppError, uint64(copy(buf, err.Error()))
	}
	if len(reply) > len(buf) {
		return StatusAppError, uint64(copy(buf, "reply too big"))
	}
	if len(reply) > 0 && &reply[0] != &buf[0] {
		copy(buf, reply) // memmove: a reply inside buf may overlap
	}
	return StatusOK, uint64(len(reply))
}

// Close says the process leaves and unmaps its area. Serve must have
// returned; a Call that another goroutine still waits in returns ErrClosed
// first (Close waits for it), and later Calls return ErrClosed.
func (u *UAP) Close() error {
	if u.sock != nil {
		return u.sock.close()
	}
	if u.area == nil {
		return nil
	}
	o := &u.out
	o.closing.Store(true)
	o.asleepMu.Lock() // a Call asleep on its answer looks again, and leaves
	if w := o.asleepOn; w != nil {
		w.Add(1)
		futexWake(w, 1)
	}
	o.asleepMu.Unlock()
	o.mu.Lock()
	defer o.mu.Unlock()
	u.dropLane()
	u.leaveLaneIn()
	if u.line != nil {
		u.line.close()
	}
	u.leave()
	err := errors.Join(
		os.NewSyscallError("munmap", unix.Munmap(u.area)),
		os.NewSyscallError("munmap", unix.Munmap(u.page)),
		os.NewSyscallError("close", unix.Close(u.bell)))
	u.area, u.page, u.ctl, u.gp = nil, nil, nil, nil
	return err
}
