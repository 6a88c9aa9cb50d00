package rpcport

import (
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// outPoller writes the answers a socket did not take at once when it
// becomes writable again. They wait in their Conn's queue, as the slices
// the caller handed over: gnet's outbound buffer would copy each into a
// pooled slice rounded up to a power of two (up to twice the bytes) that
// the buffer budget could not see. One epoll instance and one goroutine
// serve every connection of a Port; a connection is registered only
// while its queue is not empty.
type outPoller struct {
	epfd, wakefd int
	mu           sync.Mutex
	conns        map[uint64]*Conn // by Conn.id; 0 is the wake-up eventfd
	done         chan struct{}
}

func newOutPoller() (*outPoller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	wakefd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(epfd)
		return nil, os.NewSyscallError("eventfd", err)
	}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wakefd, &unix.EpollEvent{Events: unix.EPOLLIN}); err != nil {
		unix.Close(epfd)
		unix.Close(wakefd)
		return nil, os.NewSyscallError("epoll_ctl", err)
	}
	p := &outPoller{epfd: epfd, wakefd: wakefd, conns: make(map[uint64]*Conn), done: make(chan struct{})}
	go p.run()
	return p, nil
}

// add watches c's socket for writability; an event follows at once if it
// is writable already. c.mu is held.
func (p *outPoller) add(c *Conn) error {
	p.mu.Lock()
	p.conns[c.id] = c
	p.mu.Unlock()
	ev := unix.EpollEvent{Events: unix.EPOLLOUT | unix.EPOLLET, Fd: int32(uint32(c.id)), Pad: int32(uint32(c.id >> 32))}
	if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, c.fd, &ev); err != nil {
		p.mu.Lock()
		delete(p.conns, c.id)
		p.mu.Unlock()
		return fmt.Errorf("netio: watch %s for writing: %w", c.remote, os.NewSyscallError("epoll_ctl", err))
	}
	return nil
}

// del stops watching c. c.mu is held, and c's descriptor is still open.
func (p *outPoller) del(c *Conn) {
	_ = unix.EpollCtl(p.epfd, unix.EPOLL_CTL_DEL, c.fd, nil)
	p.mu.Lock()
	delete(p.conns, c.id)
	p.mu.Unlock()
}

func (p *outPoller) run() {
	defer close(p.done)
	events := make([]unix.EpollEvent, 128)
	for {
		n, err := unix.EpollWait(p.epfd, events, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return // only a closed or broken epoll descriptor; close() is the only way here
		}
		for _, ev := range events[:n] {
			id := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			if id == 0 {
				return
			}
			p.mu.Lock()
			c := p.conns[id]
			p.mu.Unlock()
			if c != nil {
				c.drainOut()
			}
		}
	}
}

// close ends the goroutine and frees the descriptors.
func (p *outPoller) close() {
	var one [8]byte
	one[7] = 1
	_, _ = unix.Write(p.wakefd, one[:])
	<-p.done
	unix.Close(p.epfd)
	unix.Close(p.wakefd)
}
