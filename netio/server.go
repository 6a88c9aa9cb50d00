package netio

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"
)

// Defaults for zero Options fields.
const (
	DefaultMaxPayload  = 1 << 20  // 1 MiB, OpenTP1's default max_message_size
	DefaultMaxOutbound = 64 << 20 // 64 MiB
	maxLoops           = 256      // gnet's limit on event loops
)

// Errors returned by Conn.Send and Listen.
var (
	ErrConnClosed = errors.New("netio: connection closed")
	ErrSlowReader = errors.New("netio: connection closed: peer does not read its answers")
)

// Handler receives the frames of a Server.
type Handler interface {
	// OnFrame runs on an event loop for each complete frame and must not block.
	// f aliases the inbound buffer: valid only during the call.
	OnFrame(c *Conn, f Frame)
	// OnClose runs on the event loop once per connection, after its last
	// OnFrame. Send on c fails from then on.
	OnClose(c *Conn)
}

// Options configure a Server.
type Options struct {
	Addr        string       // "host:port"; port 0 picks a free port shared by every receiving socket
	Loops       int          // scdmulti: receiving sockets (event loops) on the one port, SO_REUSEPORT; default 1
	MaxPayload  int          // a frame whose payload exceeds this closes the connection and is counted as a bad frame; default DefaultMaxPayload
	MaxOutbound int          // per-connection cap on bytes queued for writing; a connection over it is closed and counted (slow reader); default DefaultMaxOutbound
	Metrics     *metrics.Set // optional: tpsched_bad_frames_total, tpsched_slow_reader_closes_total, tpsched_connections
	Logger      *slog.Logger // optional; default slog.Default()
}

// Stats are a Server's counters since Listen.
type Stats struct {
	BadFrames        uint64 // connections closed for a bad frame
	SlowReaderCloses uint64 // connections closed for exceeding MaxOutbound
	Conns            int    // connections open now
}

// Server is a running gnet engine with Loops receiving sockets on one port.
type Server struct {
	h           Handler
	log         *slog.Logger
	addr        string
	maxPayload  int
	maxOutbound int64

	eng      gnet.Engine // set in OnBoot, read after ready
	ready    chan struct{}
	readyOne sync.Once
	done     chan struct{} // closed when gnet.Run returns
	runErr   error         // valid after done
	stopOnce sync.Once

	nextID    atomic.Uint64
	badFrames atomic.Uint64
	slowClose atomic.Uint64
	conns     atomic.Int64

	mBad, mSlow *metrics.Counter // nil without Options.Metrics
	mConns      *metrics.Gauge
}

// Conn is one client connection of a Server. Its methods are safe on the
// event loop; Send, ID and RemoteAddr are safe from any goroutine.
type Conn struct {
	gc     gnet.Conn
	srv    *Server
	id     uint64
	remote string

	// Loop-only state.
	user      any
	batch     []byte
	inTraffic bool
	// inFlush: flushBatch holds mu around gnet's Write, and a failed Write
	// closes the connection at once, calling OnClose on this goroutine.
	inFlush bool

	fd int // the socket, for writes straight from Send (see Send)

	// mu orders every write to the socket and the close: gnet calls OnClose
	// (which sets closed) before it closes the descriptor, so a write under
	// mu never hits a closed or reused descriptor.
	mu        sync.Mutex
	closed    bool // guarded by mu
	loopOwned bool // guarded by mu: gnet may hold bytes for the socket; write through the loop
	pending   atomic.Int64
	slow      atomic.Bool
}

// Listen starts a server and returns once every receiving socket listens.
// Errors (address in use, bad address) are returned, not logged.
func Listen(opts Options, h Handler) (*Server, error) {
	if h == nil {
		return nil, errors.New("netio: listen: nil handler")
	}
	loops := opts.Loops
	if loops <= 0 {
		loops = 1
	}
	if loops > maxLoops {
		return nil, fmt.Errorf("netio: listen %s: %d loops, at most %d", opts.Addr, loops, maxLoops)
	}
	s := &Server{
		h:           h,
		log:         opts.Logger,
		maxPayload:  opts.MaxPayload,
		maxOutbound: int64(opts.MaxOutbound),
		ready:       make(chan struct{}),
		done:        make(chan struct{}),
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.maxPayload <= 0 {
		s.maxPayload = DefaultMaxPayload
	}
	if s.maxOutbound <= 0 {
		s.maxOutbound = DefaultMaxOutbound
	}
	if m := opts.Metrics; m != nil {
		// GetOrCreate: servers sharing a Set share the series.
		s.mBad = m.GetOrCreateCounter("tpsched_bad_frames_total")
		s.mSlow = m.GetOrCreateCounter("tpsched_slow_reader_closes_total")
		s.mConns = m.GetOrCreateGauge("tpsched_connections", nil)
	}

	// gnet opens the first listener itself and one more per extra loop, each
	// by resolving the address string again: with port 0 each would get a
	// different port. A bound, not listening SO_REUSEPORT socket fixes the
	// port and holds it against other programs until gnet's sockets listen;
	// it never accepts, so it takes no connections.
	fd, addr, err := reservePort(opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("netio: listen %s: %w", opts.Addr, err)
	}
	defer unix.Close(fd)
	s.addr = addr

	gopts := []gnet.Option{
		gnet.WithReusePort(true),
		gnet.WithReuseAddr(true), // a restarted node binds past its old connections' TIME_WAIT
		gnet.WithNumEventLoop(loops),
		gnet.WithMulticore(loops > 1),
		gnet.WithTCPNoDelay(gnet.TCPNoDelay),
		gnet.WithTicker(true), // the first OnTick says every socket listens
		gnet.WithLogger(gnetLogger{s.log}),
	}
	go func() {
		s.runErr = gnet.Run(&engineHandler{s: s}, "tcp://"+addr, gopts...)
		close(s.done)
	}()
	select {
	case <-s.ready:
		return s, nil
	case <-s.done:
		err := s.runErr
		if err == nil {
			err = errors.New("engine stopped while starting")
		}
		return nil, fmt.Errorf("netio: listen %s: %w", addr, err)
	}
}

// reservePort binds (without listening) an SO_REUSEPORT socket to addr and
// returns it with the resolved host:port. Its family and IPV6_V6ONLY match
// what gnet will choose for the same address.
func reservePort(addr string) (int, string, error) {
	ta, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return -1, "", err
	}
	var (
		family = unix.AF_INET6
		v6only = 0
		sa     unix.Sockaddr
	)
	if ip4 := ta.IP.To4(); ip4 != nil {
		family = unix.AF_INET
		sa4 := &unix.SockaddrInet4{Port: ta.Port}
		copy(sa4.Addr[:], ip4)
		sa = sa4
	} else {
		sa6 := &unix.SockaddrInet6{Port: ta.Port}
		if ta.IP != nil {
			v6only = 1
			copy(sa6.Addr[:], ta.IP.To16())
			if ta.Zone != "" {
				ifi, err := net.InterfaceByName(ta.Zone)
				if err != nil {
					return -1, "", err
				}
				sa6.ZoneId = uint32(ifi.Index)
			}
		}
		sa = sa6
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return -1, "", os.NewSyscallError("socket", err)
	}
	fail := func(op string, err error) (int, string, error) {
		unix.Close(fd)
		return -1, "", os.NewSyscallError(op, err)
	}
	if family == unix.AF_INET6 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, v6only); err != nil {
			return fail("setsockopt", err)
		}
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		return fail("setsockopt", err)
	}
	if err := unix.Bind(fd, sa); err != nil {
		return fail("bind", err)
	}
	got, err := unix.Getsockname(fd)
	if err != nil {
		return fail("getsockname", err)
	}
	var port int
	switch a := got.(type) {
	case *unix.SockaddrInet4:
		port = a.Port
	case *unix.SockaddrInet6:
		port = a.Port
	}
	host := ""
	if ta.IP != nil {
		host = ta.IP.String()
		if ta.Zone != "" {
			host += "%" + ta.Zone
		}
	}
	return fd, net.JoinHostPort(host, strconv.Itoa(port)), nil
}

// Addr returns the host:port every receiving socket listens on; the host is
// empty for a wildcard address.
func (s *Server) Addr() string { return s.addr }

// Stats returns the server's counters.
func (s *Server) Stats() Stats {
	return Stats{
		BadFrames:        s.badFrames.Load(),
		SlowReaderCloses: s.slowClose.Load(),
		Conns:            int(s.conns.Load()),
	}
}

// Stop closes the listeners and every connection (each gets OnClose) and
// waits for the event loops to end or ctx to expire. It is idempotent and
// safe from any goroutine but the server's own event loops.
func (s *Server) Stop(ctx context.Context) error {
	s.stopOnce.Do(func() {
		select {
		case <-s.done:
			return
		default:
		}
		// Engine.Stop signals the loops at once but then polls for the end
		// every 500 ms; waiting on Run's return instead ends as soon as gnet
		// has closed everything. The polling goroutine ends on its next tick.
		go func() { _ = s.eng.Stop(context.Background()) }()
	})
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("netio: stop %s: %w", s.addr, ctx.Err())
	}
}

func (s *Server) countBad(c *Conn, err error) {
	s.badFrames.Add(1)
	if s.mBad != nil {
		s.mBad.Inc()
	}
	s.log.Debug("netio: bad frame, closing connection", "remote", c.remote, "conn", c.id, "err", err)
}

func (s *Server) countSlow(c *Conn) {
	s.slowClose.Add(1)
	if s.mSlow != nil {
		s.mSlow.Inc()
	}
	s.log.Debug("netio: slow reader, closing connection", "remote", c.remote, "conn", c.id, "limit", s.maxOutbound)
}

// engineHandler keeps gnet's callbacks off Server's exported method set.
type engineHandler struct {
	gnet.BuiltinEventEngine
	s *Server
}

func (e *engineHandler) OnBoot(eng gnet.Engine) gnet.Action {
	e.s.eng = eng
	return gnet.None
}

// OnTick first fires after gnet has opened every loop's listener: with
// SO_REUSEPORT, OnBoot comes before the second and later listeners exist.
func (e *engineHandler) OnTick() (time.Duration, gnet.Action) {
	e.s.readyOne.Do(func() { close(e.s.ready) })
	return time.Hour, gnet.None
}

func (e *engineHandler) OnOpen(gc gnet.Conn) ([]byte, gnet.Action) {
	s := e.s
	c := &Conn{gc: gc, srv: s, id: s.nextID.Add(1), fd: gc.Fd()}
	if ra := gc.RemoteAddr(); ra != nil {
		c.remote = ra.String()
	}
	gc.SetContext(c)
	s.conns.Add(1)
	if s.mConns != nil {
		s.mConns.Inc()
	}
	return nil, gnet.None
}

func (e *engineHandler) OnClose(gc gnet.Conn, _ error) gnet.Action {
	c, ok := gc.Context().(*Conn)
	if !ok {
		return gnet.None
	}
	if c.inFlush {
		c.closed = true // mu is held by flushBatch, below us on this goroutine
	} else {
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
	}
	c.batch = nil
	e.s.conns.Add(-1)
	if e.s.mConns != nil {
		e.s.mConns.Dec()
	}
	e.s.h.OnClose(c)
	return gnet.None
}

func (e *engineHandler) OnTraffic(gc gnet.Conn) gnet.Action {
	s := e.s
	c, ok := gc.Context().(*Conn)
	if !ok {
		return gnet.Close
	}
	action := gnet.None
	c.inTraffic = true
	for {
		hdr, err := gc.Peek(HeaderSize)
		if err != nil {
			break // less than a header buffered
		}
		n, err := FrameLen(hdr, s.maxPayload)
		if err != nil {
			s.countBad(c, err)
			action = gnet.Close
			break
		}
		buf, err := gc.Peek(n)
		if err != nil {
			break // the rest of the frame has not arrived
		}
		f, _, err := Decode(buf, s.maxPayload)
		if err != nil { // cannot happen after FrameLen; never trust it
			s.countBad(c, err)
			action = gnet.Close
			break
		}
		s.h.OnFrame(c, f)
		// Discard after OnFrame: f aliases buf, which Discard may recycle.
		_, _ = gc.Discard(n)
	}
	c.inTraffic = false
	if len(c.batch) > 0 {
		err := c.flushBatch()
		if cap(c.batch) > 64<<10 {
			c.batch = nil
		} else {
			c.batch = c.batch[:0]
		}
		if err != nil {
			return gnet.Close
		}
	}
	if action == gnet.None && int64(gc.OutboundBuffered()) > s.maxOutbound && c.slow.CompareAndSwap(false, true) {
		s.countSlow(c)
		return gnet.Close
	}
	return action
}

// ID is unique among the connections of one Server.
func (c *Conn) ID() uint64 { return c.id }

// RemoteAddr is the peer's host:port.
func (c *Conn) RemoteAddr() string { return c.remote }

// Context returns what SetContext stored. Event loop only.
func (c *Conn) Context() any { return c.user }

// SetContext stores the caller's per-connection state. Event loop only.
func (c *Conn) SetContext(v any) { c.user = v }

// Send writes b from any goroutine and takes ownership of b. When nothing
// is waiting to be written on the connection, Send writes to the socket
// itself, so an answer made off the event loop costs no wake-up of the loop;
// what the socket does not take at once is queued to the loop behind it
// (gnet AsyncWrite), and later sends queue behind that until the loop has
// written it all. It returns ErrConnClosed after the connection closed and
// ErrSlowReader when the bytes queued but not yet written exceed
// Options.MaxOutbound; the connection is then closed and counted.
func (c *Conn) Send(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrConnClosed
	}
	if c.slow.Load() {
		return ErrSlowReader
	}
	if !c.loopOwned {
		n, err := writeSome(c.fd, b)
		if err != nil {
			_ = c.gc.Close()
			return fmt.Errorf("netio: send to %s: %w", c.remote, err)
		}
		if n == len(b) {
			return nil
		}
		b = b[n:]
	}
	return c.queueLocked(b)
}

// writeSome writes what the non-blocking socket takes now.
func writeSome(fd int, b []byte) (int, error) {
	for {
		n, err := unix.Write(fd, b)
		switch err {
		case nil:
			return n, nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, nil
		}
		return 0, os.NewSyscallError("write", err)
	}
}

// queueLocked hands b to the event loop, behind whatever it holds already.
// c.mu is held.
func (c *Conn) queueLocked(b []byte) error {
	n := int64(len(b))
	if c.pending.Add(n) > c.srv.maxOutbound {
		c.pending.Add(-n)
		if c.slow.CompareAndSwap(false, true) {
			c.srv.countSlow(c)
			_ = c.gc.Close()
		}
		return ErrSlowReader
	}
	c.loopOwned = true
	// gnet runs the callback on the loop, never inside AsyncWrite, so it
	// may take c.mu.
	err := c.gc.AsyncWrite(b, func(gc gnet.Conn, err error) error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.pending.Add(-n) == 0 && err == nil && gc.OutboundBuffered() == 0 {
			c.loopOwned = false // all written: Send may write directly again
		}
		if err == nil && int64(gc.OutboundBuffered()) > c.srv.maxOutbound && c.slow.CompareAndSwap(false, true) {
			c.srv.countSlow(c)
			_ = gc.Close()
		}
		return nil
	})
	if err != nil {
		c.pending.Add(-n)
		return fmt.Errorf("netio: send to %s: %w", c.remote, err)
	}
	return nil
}

// flushBatch writes the answers made during one OnTraffic. On the loop.
func (c *Conn) flushBatch() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.loopOwned {
		// Bytes are queued to the loop already (a partial direct write, say):
		// the batch must go behind them, not into the middle of a frame.
		return c.queueLocked(bytes.Clone(c.batch))
	}
	// Write copies what the socket does not take, so batch is reusable.
	c.inFlush = true
	_, err := c.gc.Write(c.batch)
	c.inFlush = false
	if err != nil {
		return err
	}
	if c.gc.OutboundBuffered() > 0 {
		c.loopOwned = true
	}
	return nil
}

// SendNow appends b to the answers of the current read, written in one
// write when OnTraffic ends. Only inside OnFrame; b is copied. Called
// elsewhere on the loop it falls back to Send with a copy of b.
func (c *Conn) SendNow(b []byte) {
	if !c.inTraffic {
		_ = c.Send(bytes.Clone(b))
		return
	}
	c.batch = append(c.batch, b...)
}

// Close closes the connection asynchronously; OnClose follows on the loop.
func (c *Conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	return c.gc.Close()
}

// AppendReply appends a KindReply frame answering request id.
func AppendReply(dst []byte, id uint64, payload []byte) []byte {
	return AppendFrame(dst, Header{Kind: KindReply, ID: id}, "", "", payload)
}

// AppendError appends a KindError frame answering request id with code and
// msg as the payload.
func AppendError(dst []byte, id uint64, code Code, msg string) []byte {
	dst = AppendFrame(dst, Header{Kind: KindError, Code: code, ID: id}, "", "", nil)
	// Patch the payload length rather than convert msg to []byte.
	binary.BigEndian.PutUint32(dst[len(dst)-HeaderSize+20:], uint32(len(msg)))
	return append(dst, msg...)
}

// gnetLogger sends gnet's messages to slog; gnet's Info is Debug here and
// Fatalf never exits.
type gnetLogger struct{ l *slog.Logger }

func (g gnetLogger) logf(level slog.Level, format string, args []any) {
	if g.l.Enabled(context.Background(), level) {
		g.l.Log(context.Background(), level, "gnet: "+fmt.Sprintf(format, args...))
	}
}

func (g gnetLogger) Debugf(format string, args ...any) { g.logf(slog.LevelDebug, format, args) }
func (g gnetLogger) Infof(format string, args ...any)  { g.logf(slog.LevelDebug, format, args) }
func (g gnetLogger) Warnf(format string, args ...any)  { g.logf(slog.LevelWarn, format, args) }
func (g gnetLogger) Errorf(format string, args ...any) { g.logf(slog.LevelError, format, args) }
func (g gnetLogger) Fatalf(format string, args ...any) { g.logf(slog.LevelError, format, args) }
