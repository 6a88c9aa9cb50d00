package shm

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Doorbells is where a node's reader waits for the processes of its
// shared-memory groups: one epoll instance holding the doorbell of every
// process of every group made on it (Doorbells.NewGroup), so one thread
// reads them all. A local call from a process of one group to a process of
// another is then seen, handed over, completed and answered by that one
// thread, which the reader of each group apart could not do without
// waking a second reader in between.
//
// Neither the doorbells nor the epoll instance are in Go's netpoller: a
// doorbell there woke the runtime's poller thread at every ring besides
// the reader (a perf trace of one local call showed both), and the reader
// sleeps in epoll_wait itself (see sleep).
//
// NewGroup may be called while another goroutine Waits; Wait runs on one
// goroutine only (the reader), never on a gnet event loop.
type Doorbells struct {
	epfd     int
	wake     int                      // an eventfd under epfd, tagged wakeTag: Interrupt's
	mu       sync.Mutex               // orders NewGroup
	groups   atomic.Pointer[[]*Group] // by index, the events' tag; Wait reads it without mu
	spin     spinner
	spinFree func() bool // SpinWhile's: whether no task waits for a CPU
	events   []unix.EpollEvent
	lastRing time.Time // when a Wait last found something (sleep: busy or idle)
}

// SpinWhile makes Wait spin only while free reports true, asked before
// the spin and every few microseconds of it: a spinning reader holds its
// CPU, and where the process it waits for was woken onto that CPU (or any
// task waits for one) the spin only delays what it waits for. scdd passes
// the eBPF run queues' look (bpf.RunQueues.Waiting); without it the spin
// is bounded by its budget alone. Call it before the first Wait.
func (d *Doorbells) SpinWhile(free func() bool) { d.spinFree = free }

// NewDoorbells makes an empty set of doorbells.
func NewDoorbells() (*Doorbells, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("shm: doorbells: %w", os.NewSyscallError("epoll_create1", err))
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: doorbells: %w", os.NewSyscallError("eventfd", err))
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Pad: wakeTag}
	if err := unix.EpollCtl(fd, unix.EPOLL_CTL_ADD, wake, &ev); err != nil {
		unix.Close(wake)
		unix.Close(fd)
		return nil, fmt.Errorf("shm: doorbells: %w", os.NewSyscallError("epoll_ctl", err))
	}
	d := &Doorbells{epfd: fd, wake: wake, spin: newSpinner(readerSpinMax), events: make([]unix.EpollEvent, 64)}
	d.groups.Store(new([]*Group))
	return d, nil
}

// wakeTag is the group index of Interrupt's event: no group has it.
const wakeTag = -1

// Interrupt ends the current Wait, or the next one if none is under way:
// how the reader's owner stops it without waiting out its timeout. Safe
// from any goroutine until Close.
func (d *Doorbells) Interrupt() {
	ring(d.wake)
}

// NewGroup makes the group page of a group whose messages are at most
// maxMessage bytes, for up to slots processes, each of which may hold up
// to mailboxes calls (its current one and those handed over ahead); its
// processes' doorbells ring here. Requires Linux 5.1 (F_SEAL_FUTURE_WRITE).
func (d *Doorbells) NewGroup(name string, maxMessage, slots, mailboxes int) (*Group, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	old := *d.groups.Load()
	if len(old) >= 1<<31-1 {
		return nil, fmt.Errorf("shm: group %s: too many groups on one set of doorbells", name)
	}
	g, err := makeGroup(name, maxMessage, slots, mailboxes)
	if err != nil {
		return nil, err
	}
	g.bells, g.index = d, len(old)
	groups := append(old[:len(old):len(old)], g)
	d.groups.Store(&groups)
	return g, nil
}

// Close closes the epoll instance. The groups made on d must be unmapped
// first, and nothing may Wait any more: a Wait after Close only sleeps out
// its timeout (the descriptor is -1, so it cannot reach a file that reused
// the number).
func (d *Doorbells) Close() error {
	fd := d.epfd
	if fd < 0 {
		return nil
	}
	d.epfd = -1
	unix.Close(d.wake)
	return os.NewSyscallError("close", unix.Close(fd))
}

// add puts a process's doorbell under d; edge-triggered, so every ring is
// an event and the counter is never read.
func (d *Doorbells) add(g *Group, slot, bell int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(slot), Pad: int32(g.index)}
	return os.NewSyscallError("epoll_ctl", unix.EpollCtl(d.epfd, unix.EPOLL_CTL_ADD, bell, &ev))
}

func (d *Doorbells) remove(bell int) {
	_ = unix.EpollCtl(d.epfd, unix.EPOLL_CTL_DEL, bell, nil)
}

// pending reports whether a process of any group has something for the
// reader (Group.Pending).
func (d *Doorbells) pending() bool {
	for _, g := range *d.groups.Load() {
		if g.Pending() {
			return true
		}
	}
	return false
}

// Wait returns when a process of one of the groups may have something for
// the reader (Group.Pending), on Interrupt, or after timeout; it reports
// whether it returned before the timeout, which is the caller's: the
// doorbells lose no ring (an eventfd counts them), so unlike a UAP's futex
// sleeps it is not cut to maxSleep, and a quiet node's reader sleeps as
// long as its owner asks. It spins briefly
// (adaptive, bounded by TPSCHED_READER_SPIN_US, and only while SpinWhile's
// function allows), then says on every group page that the reader sleeps,
// looks once more and sleeps on the doorbells; each ring it sees counts in
// its process's Rings.
//
// A closed group does not keep it awake: its processes still ring for
// what the reader must see (a completion while it sleeps, their leaving),
// and a Wait that returned at once for a closed group made the dispatcher
// spin a core from the node's stop until its Close (issue 29 item 7).
func (d *Doorbells) Wait(timeout time.Duration) bool {
	groups := *d.groups.Load()
	for _, g := range groups {
		g.unmapRetired()
	}
	start := time.Now()
	switch d.spinFor(start) {
	case spinFound:
		d.spin.learn(time.Since(start))
		d.lastRing = start
		return true
	case spinYielded:
		start = time.Time{} // what comes after the sleep teaches the budget nothing
	}
	for _, g := range groups {
		g.gp.sleeping.Store(1)
	}
	n := 0
	if !d.pending() {
		n = d.sleep(timeout)
	} else {
		n = -1 // something came while the flags were set: no sleep
	}
	for _, g := range groups {
		g.gp.sleeping.Store(0)
	}
	for _, ev := range d.events[:max(n, 0)] {
		if ev.Pad >= 0 && int(ev.Pad) < len(groups) {
			if p := groups[ev.Pad].Proc(int(ev.Fd)); p != nil {
				p.rings.Add(1)
			}
		}
	}
	if n != 0 {
		d.lastRing = time.Now()
	}
	switch {
	case start.IsZero():
	case n != 0:
		d.spin.learn(time.Since(start))
	default:
		d.spin.learn(-1)
	}
	return n != 0
}

// How a spin ended.
const (
	spinSpent   = iota // its budget is spent
	spinFound          // something is pending
	spinYielded        // a task waits for a CPU (SpinWhile), so it did not spin on
)

// spinFor polls the groups until something is pending, the budget
// (counted from start) is spent, or SpinWhile's free says a task waits for
// a CPU.
func (d *Doorbells) spinFor(start time.Time) int {
	if d.spin.budget <= 0 {
		return spinSpent
	}
	if d.spinFree != nil && !d.spinFree() {
		return spinYielded
	}
	for i := 1; ; i++ {
		if d.pending() {
			return spinFound
		}
		if i%16 == 0 {
			if time.Since(start) >= d.spin.budget {
				return spinSpent
			}
			if d.spinFree != nil && !d.spinFree() {
				return spinYielded
			}
		}
	}
}

// sleep waits up to timeout for a doorbell and returns the events.
//
// While the node is busy (a ring within busyFor) it waits with raw system
// calls of rawWaitMax at most, which keep the goroutine's P, as a UAP's
// short futex waits do (futexWait says why): through the runtime, each sleep
// woke sysmon and handed the P to another thread, which the reader's
// wake-up then had to take back. A signal (sysmon's preemption, a
// stop-the-world) ends a raw wait with EINTR. An idle node's reader parks
// in Go's netpoller instead (park), holding no P, so that sysmon sleeps
// and the idle node costs what it did before.
func (d *Doorbells) sleep(timeout time.Duration) int {
	if runtime.GOMAXPROCS(0) > 1 {
		for timeout > 0 && time.Since(d.lastRing) < busyFor {
			r := min(timeout, rawWaitMax)
			n, errno := epollWaitRaw(d.epfd, d.events, r)
			if n > 0 || errno == unix.EINTR {
				return max(n, 0) // a ring, or a signal: look again
			}
			if errno != 0 {
				return d.broken(timeout) // not an epoll instance any more
			}
			timeout -= r
		}
		if timeout <= 0 {
			return 0
		}
	}
	return d.park(timeout)
}

// busyFor is how long after its last wake-up the node's reader counts as
// busy.
const busyFor = 50 * time.Millisecond

// park waits up to timeout in Go's netpoller, on a duplicate of the epoll
// descriptor made for the wait: registered while the reader parks and no
// longer, since in the netpoller every ring would also wake the runtime's
// poller thread.
func (d *Doorbells) park(timeout time.Duration) int {
	fd, err := unix.FcntlInt(uintptr(d.epfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return d.blockingWait(timeout)
	}
	if err := unix.SetNonblock(fd, true); err != nil { // the file's, the original's too: epoll_wait minds only its timeout
		unix.Close(fd)
		return d.blockingWait(timeout)
	}
	f := os.NewFile(uintptr(fd), "epoll:tpsched-doorbells")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil || f.SetReadDeadline(time.Now().Add(timeout)) != nil {
		return d.blockingWait(timeout) // not in the netpoller after all
	}
	n := 0
	_ = rc.Read(func(fd uintptr) bool {
		var werr error
		n, werr = unix.EpollWait(int(fd), d.events, 0)
		return n > 0 || (werr != nil && werr != unix.EINTR)
	})
	return max(n, 0)
}

// blockingWait is epoll_wait through the runtime, holding the P while it
// blocks: what park falls back on.
func (d *Doorbells) blockingWait(timeout time.Duration) int {
	n, err := unix.EpollWait(d.epfd, d.events, max(int(timeout.Milliseconds()), 1))
	switch {
	case err == unix.EINTR:
		return 0
	case err != nil:
		return d.broken(timeout)
	}
	return n
}

// broken is the wait of a reader whose epoll instance fails (closed under
// it, EBADF): it sleeps out the timeout, since returning at once would
// make the reader's loop spin a core until it is stopped.
func (d *Doorbells) broken(timeout time.Duration) int {
	time.Sleep(timeout)
	return 0
}

// epollWaitRaw is epoll_pwait with no signal mask as a raw system call,
// returning the events and the errno.
func epollWaitRaw(epfd int, events []unix.EpollEvent, d time.Duration) (int, unix.Errno) {
	r, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])),
		uintptr(len(events)), uintptr(max(d.Milliseconds(), 1)), 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(r), 0
}
