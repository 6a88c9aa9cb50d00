package shm

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"golang.org/x/sys/unix"

	"tpsched/shm/internal/sockwire"
)

// sockUAP is a UAP's socket when its server receives from a socket
// (receive_from = socket); the scheduler's side is package shm/sockmode.
type sockUAP struct {
	conn   *net.UnixConn // nil once closed
	r      *bufio.Reader
	h      [sockwire.HeaderSize]byte
	maxMsg int
	buf    []byte // the request buffer, made at the first request
	entry  [maxName]byte
}

// attachSocket is Attach in socket mode: fd is the UAP's end of the
// socketpair. It says hello and waits for the welcome that tells
// max_message_size.
func attachSocket(fd int, refresh bool) (*UAP, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("shm: TPSCHED_RECEIVE=socket but fd %d is not a socket (a UAP must be started by scdd, which passes its socket as fd %d)", fd, fd)
	}
	f := os.NewFile(uintptr(fd), "tpsched-socket")
	fc, err := net.FileConn(f) // a duplicate in the runtime's poller
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("shm: attach socket: %w", err)
	}
	uc, ok := fc.(*net.UnixConn)
	if !ok {
		fc.Close()
		return nil, errors.New("shm: attach socket: not a unix socket")
	}
	s := &sockUAP{conn: uc, r: bufio.NewReaderSize(uc, sockwire.BufSize)}
	hello := sockwire.Msg{Kind: sockwire.KindHello, A: uint64(os.Getpid()), B: sockwire.Version}
	if refresh {
		hello.Status = sockwire.HelloRefresh
	}
	sockwire.Put(s.h[:], hello)
	if _, err := uc.Write(s.h[:]); err != nil {
		uc.Close()
		return nil, fmt.Errorf("shm: attach socket: hello: %w", err)
	}
	m, err := sockwire.Read(s.r, s.h[:], 0, uint8(statusEnd))
	if err == nil && (m.Kind != sockwire.KindWelcome || m.B != sockwire.Version || m.A < 1 || m.A > maxMessage) {
		err = fmt.Errorf("%w: expected welcome, got kind %d (version %d, max message %d)", sockwire.ErrProtocol, m.Kind, m.B, m.A)
	}
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("shm: attach socket: %w", err)
	}
	s.maxMsg = int(m.A)
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	return &UAP{handlers: map[string]HandlerFunc{}, sock: s, refresh: refresh}, nil
}

// serveOne is ServeOne in socket mode.
func (s *sockUAP) serveOne(u *UAP) error {
	if s.conn == nil {
		return ErrClosed
	}
	if u.refresh && u.served {
		s.leave()
		return ErrClosed
	}
	fail := func(err error) error {
		s.conn.Close()
		s.conn = nil
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return errors.New("shm: socket: the scheduler closed the connection")
		}
		return fmt.Errorf("shm: socket: %w", err)
	}
	m, err := sockwire.Read(s.r, s.h[:], uint64(s.maxMsg), uint8(statusEnd))
	if err != nil {
		return fail(err)
	}
	switch m.Kind {
	case sockwire.KindStop, sockwire.KindClose:
		s.leave()
		return ErrClosed
	case sockwire.KindRequest:
	default:
		return fail(fmt.Errorf("%w: message of kind %d from the scheduler", sockwire.ErrProtocol, m.Kind))
	}
	nl := int(m.NameLen)
	if _, err := io.ReadFull(s.r, s.entry[:nl]); err != nil {
		return fail(err)
	}
	if s.buf == nil {
		s.buf = make([]byte, s.maxMsg)
	}
	n := uint64(m.PayLen)
	if _, err := io.ReadFull(s.r, s.buf[:n]); err != nil {
		return fail(err)
	}
	st, rl := u.run(s.buf, n, int64(m.B), s.entry[:nl])
	sockwire.Put(s.h[:], sockwire.Msg{Kind: sockwire.KindReply, Status: uint8(st), PayLen: uint32(rl), A: m.A})
	bufs := net.Buffers{s.h[:], s.buf[:rl]}
	if _, err := bufs.WriteTo(s.conn); err != nil {
		return fail(err)
	}
	u.served = true
	return nil
}

// leave says bye and closes the socket.
func (s *sockUAP) leave() { _ = s.close() }

// close is leave for Close: without the bye a process that closed and
// lived on was a ready one to the node, until its eofGrace ruled it one
// that broke the protocol.
func (s *sockUAP) close() error {
	if s.conn == nil {
		return nil
	}
	sockwire.Put(s.h[:], sockwire.Msg{Kind: sockwire.KindBye})
	_, _ = s.conn.Write(s.h[:])
	err := s.conn.Close()
	s.conn = nil
	return err
}
