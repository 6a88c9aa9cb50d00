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
// while the reserve is full, and free one of its descriptors for the
// duplicate: when the table is full, accept fails (EMFILE) or the reserve
// cannot be refilled, and callers wait in the kernel's backlog until a
// descriptor frees. A connection whose caller half-closed also takes one
// (dup2 onto it, needing no free slot) to stay writable for its answers.
type fdReserve struct {
	mu   sync.Mutex
	fds  []int // placeholders: eventfds that stand for free slots
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

// fillLocked opens placeholders until the reserve is full; false when the
// table has no room for them. r.mu is held.
func (r *fdReserve) fillLocked() bool {
	for len(r.fds) < r.size {
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
		if err != nil {
			return false
		}
		r.fds = append(r.fds, fd)
	}
	return true
}

// ready refills the reserve and reports whether it is full: whether a
// connection accepted now can be enrolled.
func (r *fdReserve) ready() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fillLocked()
}

// enroll runs register (which needs one free descriptor for a moment) with
// a placeholder closed for it, then refills the reserve. Enrollments are
// serialised: each has the slot it freed.
func (r *fdReserve) enroll(register func() error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := len(r.fds); n > 0 {
		unix.Close(r.fds[n-1])
		r.fds = r.fds[:n-1]
	}
	err := register()
	r.fillLocked()
	return err
}

// dup duplicates fd onto a placeholder (dup3: no free slot is needed) and
// hands that descriptor over; without a placeholder it takes a free slot
// if there is one.
func (r *fdReserve) dup(fd int) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := len(r.fds); n > 0 {
		p := r.fds[n-1]
		if err := unix.Dup3(fd, p, unix.O_CLOEXEC); err != nil {
			return -1, os.NewSyscallError("dup3", err)
		}
		r.fds = r.fds[:n-1]
		r.fillLocked()
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
