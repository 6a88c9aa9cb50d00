package bpf

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// MaxReceivers is the most listening sockets one Steering places
// connections among (steer.c's MAX_RECEIVERS).
const MaxReceivers = 256

// SteerMechanism names the steering program where status and metrics say
// how new connections are placed.
const SteerMechanism = "bpf"

// Steering is one receiver group's listening sockets under steer.c, an
// SK_REUSEPORT program that gives each new connection to the receiver with
// the least work: calls in flight plus connections open plus one per 4 KiB
// read per second lately, counters per receiver that the receivers' event
// loops keep in an array map mapped into this process (Load), so that
// keeping them costs an atomic add, not a syscall. It implements netio's Steered (through scd, which wires the
// two).
//
// Requires Linux 5.5 (mmapable array maps; SK_REUSEPORT programs 4.19),
// CAP_BPF and CAP_NET_ADMIN (or root), and RLIMIT_MEMLOCK high enough
// before Linux 5.11.
type Steering struct {
	objs   steerObjects
	mem    []byte // the load map, mmapped; after Close, private memory in its place
	n      int
	closed bool
}

// receiverLoadSize is the size of steer.c's struct receiver_load.
const receiverLoadSize = int(unsafe.Sizeof(steerReceiverLoad{}))

// Steer loads steer.c for one receiver group whose listening sockets are
// fds (in receiver order, all bound to one port with SO_REUSEPORT and
// listening) and attaches it to their reuseport group, replacing any
// program attached before (a previous process's, after a hand-off). The
// load counters start at zero.
func Steer(fds []int) (*Steering, error) {
	if len(fds) == 0 || len(fds) > MaxReceivers {
		return nil, fmt.Errorf("steer: %d sockets, want 1..%d", len(fds), MaxReceivers)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("steer: not root (loading an SK_REUSEPORT program needs CAP_BPF and CAP_NET_ADMIN)")
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("steer: %w", err)
	}
	spec, err := loadSteer()
	if err != nil {
		return nil, fmt.Errorf("steer: %w", err)
	}
	if err := spec.Variables["n_receivers"].Set(uint32(len(fds))); err != nil {
		return nil, fmt.Errorf("steer: n_receivers: %w", err)
	}
	s := &Steering{n: len(fds)}
	if err := spec.LoadAndAssign(&s.objs, nil); err != nil {
		return nil, fmt.Errorf("steer: load: %w (needs CAP_BPF and CAP_NET_ADMIN, Linux 5.5 or later)", err)
	}
	size := s.objs.Load.MaxEntries() * s.objs.Load.ValueSize()
	mem, err := unix.Mmap(s.objs.Load.FD(), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("steer: mmap the load map: %w", os.NewSyscallError("mmap", err))
	}
	s.mem = mem
	if err := s.attach(fds); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// attach puts the sockets in the program's socket array and attaches the
// program to their reuseport group.
func (s *Steering) attach(fds []int) error {
	for i, fd := range fds {
		if err := s.objs.Receivers.Update(uint32(i), uint64(fd), ebpf.UpdateAny); err != nil {
			return fmt.Errorf("steer: socket %d into the socket array: %w (is it listening, with SO_REUSEPORT?)", i, err)
		}
	}
	if err := unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_EBPF, s.objs.Steer.FD()); err != nil {
		return fmt.Errorf("steer: %w", os.NewSyscallError("setsockopt SO_ATTACH_REUSEPORT_EBPF", err))
	}
	return nil
}

// Release takes the sockets out of the program's socket array: a socket
// can be in one array at a time, so a process that hands its sockets over
// releases them first, for the new process's program to take. Until that
// one is attached, this program finds no socket and leaves each
// connection to the kernel's hash.
func (s *Steering) Release() error {
	var errs []error
	for i := range s.n {
		if err := s.objs.Receivers.Delete(uint32(i)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("steer: release the sockets: %w", err)
	}
	return nil
}

// Reattach attaches the program to the sockets again and puts them back in
// its array, after another process had them (a hand-off that was taken
// back). The other process's program, once replaced, frees its array (and
// with it the sockets) only after an RCU grace period, so a socket still
// held there (EBUSY) is tried again for a while; meanwhile this program
// finds no socket and leaves connections to the kernel's hash.
func (s *Steering) Reattach(fds []int) error {
	if len(fds) != s.n {
		return fmt.Errorf("steer: reattach %d sockets, loaded for %d", len(fds), s.n)
	}
	if err := unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_EBPF, s.objs.Steer.FD()); err != nil {
		return fmt.Errorf("steer: %w", os.NewSyscallError("setsockopt SO_ATTACH_REUSEPORT_EBPF", err))
	}
	var err error
	for try := 0; try < 50; try++ {
		if err = s.attach(fds); !errors.Is(err, unix.EBUSY) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
	return err
}

// Load returns receiver i's counters: calls in flight, connections open
// and bytes read per second lately. They live in the map the program reads.
func (s *Steering) Load(i int) (inFlight, conns, readRate *atomic.Int64) {
	if i < 0 || i >= s.n {
		panic(fmt.Sprintf("bpf: steering load %d of %d receivers", i, s.n)) // a programming error, not input
	}
	off := i * receiverLoadSize
	return (*atomic.Int64)(unsafe.Pointer(&s.mem[off])), (*atomic.Int64)(unsafe.Pointer(&s.mem[off+8])),
		(*atomic.Int64)(unsafe.Pointer(&s.mem[off+16]))
}

// Decisions are the connections the program placed, and those it left to
// the kernel's hash (the chosen socket was missing from the array).
func (s *Steering) Decisions() (steered, hashed uint64) {
	_ = s.objs.Decisions.Lookup(uint32(0), &steered)
	_ = s.objs.Decisions.Lookup(uint32(1), &hashed)
	return steered, hashed
}

// Mechanism is SteerMechanism.
func (s *Steering) Mechanism() string { return SteerMechanism }

// Close releases the program and its maps. It does not detach the
// program: the sockets may belong to a process that took them over and
// attached its own, which a detach would remove; closing the sockets ends
// the attachment.
//
// The cells Load gave stay valid after Close, with their last values:
// netio reads them for /metrics and /status after its port stopped (a
// scrape during shutdown), and an unmapped cell is a fault that kills the
// process. So the load map's pages give way to private memory at the same
// address instead of being unmapped; those few pages stay for the
// process's life, and a Steering is closed once, with its port.
func (s *Steering) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	var errs []error
	if s.mem != nil {
		last := bytes.Clone(s.mem)
		_, err := unix.MmapPtr(-1, 0, unsafe.Pointer(&s.mem[0]), uintptr(len(s.mem)),
			unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED)
		if err != nil {
			// The map stays mapped, and alive, rather than leave the
			// cells' pointers to nothing.
			errs = append(errs, fmt.Errorf("steer: keep the load cells: %w", os.NewSyscallError("mmap", err)))
		} else {
			copy(s.mem, last)
		}
	}
	errs = append(errs, s.objs.Close())
	return errors.Join(errs...)
}

// Detach removes whatever program steers the reuseport group of fd: the
// kernel's hash places its connections again.
func Detach(fd int) error {
	return os.NewSyscallError("setsockopt SO_DETACH_REUSEPORT_BPF", unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DETACH_REUSEPORT_BPF, 0))
}
