package rpcport

import (
	"errors"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// fdReserve holds descriptors back so that a connection, once accepted,
// can always be enrolled with its event loop: gnet duplicates the socket
// (a second descriptor for a moment), and an accept that took the last free
// descriptor used to leave gnet none, so the caller was reset (238 of 300
// connections under RLIMIT_NOFILE 99). Now the accept loops accept only
// while the reserve holds a placeholder, and free one of them for the
// duplicate: when the table is full, accept fails (EMFILE) or the reserve
// cannot be refilled, and callers wait in the kernel's backlog until a
// descriptor frees. A connection whose caller half-closed also takes one
// (dup2 onto it, needing no free slot) to stay writable for its answers.
//
// The lock guards the placeholder list only and is never held across a
// wait: an enrollment waits for its event loop, and that loop takes the
// lock itself (dup, when a caller closes with a call in flight). Holding it
// across the enrollment wedged the port for good (issue 27, break 1).
type fdReserve struct {
	mu   sync.Mutex
	fds  []int // placeholders: eventfds that stand for free slots
	lent int   // placeholders closed for enrollments under way: their slots are not refilled
	size int
}

// errReserveShort is why an accept loop waits: the reserve could not be
// refilled, so the descriptor table is (nearly) full.
var errReserveShort = errors.New("descriptors kept for enrolling connections are in use: the open-file limit is reached")

func newFDReserve(size int) *fdReserve {
	r := &fdReserve{size: size}
	r.mu.Lock()
	r.fillLocked()
	r.mu.Unlock()
	return r
}

// fillLocked opens placeholders until the reserve is full, not counting
// the slots lent to enrollments under way (a placeholder opened now would
// take the slot an enrollment freed for gnet's duplicate); false when the
// table has no room for them. r.mu is held.
func (r *fdReserve) fillLocked() bool {
	for len(r.fds)+r.lent < r.size {
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
		if err != nil {
			return false
		}
		r.fds = append(r.fds, fd)
	}
	return true
}

// ready refills the reserve and reports whether a connection accepted now
// can be enrolled: the reserve is full and holds a placeholder to lend.
func (r *fdReserve) ready() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fillLocked() && len(r.fds) > 0
}

// enroll runs register (which needs one free descriptor for a moment) with
// a placeholder closed for it, then refills the reserve. The lock is not
// held while register waits for the event loop (see fdReserve).
func (r *fdReserve) enroll(register func() error) error {
	r.mu.Lock()
	lent := false
	if n := len(r.fds); n > 0 {
		unix.Close(r.fds[n-1])
		r.fds = r.fds[:n-1]
		r.lent++
		lent = true
	}
	r.mu.Unlock()
	err := register()
	r.mu.Lock()
	if lent {
		r.lent--
	}
	r.fillLocked()
	r.mu.Unlock()
	return err
}

// dup duplicates fd onto a placeholder (dup3: no free slot is needed) and
// hands that descriptor over; without a placeholder it takes a free slot
// if there is one. It does not refill: a new placeholder could take a slot
// an enrollment has freed; the accept loop refills (ready) before its next
// accept.
func (r *fdReserve) dup(fd int) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := len(r.fds); n > 0 {
		p := r.fds[n-1]
		if err := unix.Dup3(fd, p, unix.O_CLOEXEC); err != nil {
			return -1, os.NewSyscallError("dup3", err)
		}
		r.fds = r.fds[:n-1]
		return p, nil
	}
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, os.NewSyscallError("fcntl F_DUPFD_CLOEXEC", err)
	}
	return nfd, nil
}

// close frees the placeholders.
func (r *fdReserve) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, fd := range r.fds {
		unix.Close(fd)
	}
	r.fds = nil
	r.size = 0
}
