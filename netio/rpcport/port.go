package rpcport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"tpsched/internal/ratelog"
	"tpsched/netio"

	"github.com/VictoriaMetrics/metrics"
	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"
)

// Defaults for zero Options fields.
const (
	DefaultMaxPayload   = 1 << 20  // 1 MiB, OpenTP1's default max_message_size
	DefaultMaxOutbound  = 64 << 20 // 64 MiB
	DefaultUnreadLimit  = 4 << 20  // 4 MiB
	DefaultMaxConns     = 10000
	DefaultFrameTimeout = 30 * time.Second
	DefaultBufferBudget = 64 << 20 // 64 MiB
	maxLoops            = 256      // gnet's limit on event loops
)

// Errors returned by Conn.Send and Listen.
var (
	ErrConnClosed = errors.New("netio: connection closed")
	ErrSlowReader = errors.New("netio: connection closed: peer does not read its answers")
	ErrOverBudget = errors.New("netio: connection closed: it held the most of the node's buffer budget")
)

// Handler receives the frames of a Port.
type Handler interface {
	// OnFrame runs on an event loop for each complete frame and must not block.
	// f aliases the inbound buffer: valid only during the call.
	OnFrame(c *Conn, f netio.Frame)
	// OnClose runs once per connection, after its last OnFrame: on the
	// event loop, or, for a connection kept open for its answers after its
	// caller half-closed it, on the goroutine whose Send (or Close) ended
	// it. Send on c fails from then on.
	OnClose(c *Conn)
}

// Options configure a Port.
type Options struct {
	Addr  string // "host:port"; port 0 picks a free port shared by every receiving socket
	Loops int    // scdmulti: receiving sockets (event loops) of the default group on Addr, SO_REUSEPORT; default 1
	// Receivers are named receiver groups beside the default one, each
	// on its own port (OpenTP1's multi-scheduler groups).
	Receivers []ReceiverGroup
	// Steer, if set, places each group's new connections among its
	// sockets (an SK_REUSEPORT program); without it, or when it fails, the
	// kernel's hash does.
	Steer Steerer
	// Inherit are listening sockets a previous process handed over
	// (Port.HandOff there): a group takes those of its name and address
	// instead of binding new ones, so no connection waiting in their
	// backlog is lost. Those it does not take are closed.
	Inherit []Listener
	// Bound are sockets Bind opened ahead, taken after Inherit's; Listen
	// closes those it does not take.
	Bound *Bound
	// MaxPayload is the frame cap. A frame whose header announces a larger
	// payload is answered 'message too big' (a call or name lookup) and
	// its bytes are skipped as they arrive, never kept; the connection
	// stays. Default DefaultMaxPayload.
	MaxPayload int
	// MaxOutbound is the per-connection cap on bytes queued for writing; a
	// connection over it is closed and counted (slow reader). Default
	// DefaultMaxOutbound.
	MaxOutbound int
	// UnreadLimit: a call that arrives on a connection whose unsent
	// answers pass it, and whose socket has taken none of them for half
	// a second, is answered 'server busy' by the port, without running: a
	// caller that does not read its answers gets no more work done (it
	// would take the UAPs from those that read), while one that reads
	// slowly is still served. Default DefaultUnreadLimit, or MaxPayload if
	// that is larger.
	UnreadLimit int
	// MaxConns caps the connections open at once; one accepted beyond it is
	// closed at once, counted and logged. Default DefaultMaxConns.
	MaxConns int
	// FrameTimeout is how long a frame may take to arrive whole once its
	// first bytes came; a connection that exceeds it is closed and counted.
	// Default DefaultFrameTimeout.
	FrameTimeout time.Duration
	// BufferBudget caps the bytes the whole server holds in partial frames
	// and unsent answers. Past it, the connection holding the most is
	// closed and counted. Default DefaultBufferBudget.
	BufferBudget int64
	Metrics      *metrics.Set // optional: the tpsched_* series listed in the package comment
	Logger       *slog.Logger // optional; default slog.Default()
}

// Stats are a Port's counters since Listen.
type Stats struct {
	BadFrames        uint64 // connections closed for a bad frame
	SlowReaderCloses uint64 // connections closed for exceeding MaxOutbound
	UnreadRefusals   uint64 // calls answered 'server busy' for their connection's unread answers
	Conns            int    // connections open now
	AcceptErrors     uint64 // accept or registration failures, retried after a pause
	Refused          uint64 // connections closed at once: MaxConns were open
	Oversized        uint64 // frames over MaxPayload, answered 'message too big' and skipped
	FrameTimeouts    uint64 // connections closed: a frame did not arrive whole within FrameTimeout
	BudgetCloses     uint64 // connections closed: they held the most when the budget was exceeded
	Buffered         int64  // bytes held now in partial frames and unsent answers
	// Undelivered are answers owed that were never written: their
	// connection ended first (the caller reset it, or a limit closed it).
	Undelivered uint64
}

// loopDeadAfter is how long an event loop's engine may go without a tick
// before the server counts it as ended (a variable for tests).
var loopDeadAfter = 5 * time.Second

// Port is the node's RPC port: receiver groups of receiving sockets, each
// group on one TCP port, each socket with its own accept goroutine and its
// own gnet event loop.
type Port struct {
	h            Handler
	log          *slog.Logger
	addr         string
	maxPayload   int
	maxOutbound  int64
	unreadLimit  int64
	maxConns     int64
	frameTimeout time.Duration
	budget       int64

	groups    []*receiverGroup // the default group first
	rcv       []*receiver      // every group's, in order; rcv[i] owns listeners[i], loops[i], lastTick[i]
	listeners []*net.TCPListener
	loops     []*gnet.Client
	outPoll   *outPoller
	fds       *fdReserve     // descriptors kept so that an accepted connection can be enrolled (reserve.go)
	lastTick  []atomic.Int64 // per loop: when its engine last ticked (unix ns)
	handedOff atomic.Bool    // the listeners went to another process: their close is no failure
	lnMu      sync.Mutex     // guards the elements of listeners once accept loops run (Resume replaces them)
	// loopDeadAfter is how long a loop's engine may go without a tick
	// before the server counts it as ended.
	loopDeadAfter time.Duration

	acceptWG sync.WaitGroup
	janitor  sync.WaitGroup

	mu    sync.Mutex // guards conns
	conns map[*Conn]struct{}

	stopping atomic.Bool
	quit     chan struct{} // closed when Stop begins or the server fails: accept loops and the janitor end
	quitOnce sync.Once
	stopOnce sync.Once
	stopped  chan struct{} // closed when Stop has finished
	done     chan struct{} // closed when the server ended: Stop, or a failure
	doneOnce sync.Once
	err      error // why the server ended on its own; set before done closes

	nextID        atomic.Uint64
	open          atomic.Int64 // connections accepted and not yet closed
	held          atomic.Int64 // bytes charged to the budget
	doomed        atomic.Int64 // of held, bytes of connections already being closed for the budget
	badFrames     atomic.Uint64
	slowClose     atomic.Uint64
	acceptErrs    atomic.Uint64
	refused       atomic.Uint64
	oversized     atomic.Uint64
	frameTimeouts atomic.Uint64
	budgetCloses  atomic.Uint64
	unreadRefused atomic.Uint64
	undelivered   atomic.Uint64

	refuseLog, acceptLog, budgetLog, timeoutLog ratelog.Limiter

	mBad, mSlow, mAcceptErr, mRefused, mOversized, mTimeout, mBudget, mUnread, mUndelivered *metrics.Counter // nil without Options.Metrics
	mConns                                                                                  *metrics.Gauge
}

// Listen starts a server and returns once every receiving socket listens.
// Errors (address in use, bad address, another socket listening on a port:
// ErrPortShared) are returned, not logged.
func Listen(opts Options, h Handler) (*Port, error) {
	defer opts.Bound.Close() // what no group took
	if h == nil {
		return nil, errors.New("netio: listen: nil handler")
	}
	specs, err := groupSpecs(opts)
	if err != nil {
		return nil, err
	}
	s := &Port{
		h:             h,
		log:           opts.Logger,
		maxPayload:    opts.MaxPayload,
		maxOutbound:   int64(opts.MaxOutbound),
		unreadLimit:   int64(opts.UnreadLimit),
		maxConns:      int64(opts.MaxConns),
		frameTimeout:  opts.FrameTimeout,
		budget:        opts.BufferBudget,
		loopDeadAfter: loopDeadAfter,
		conns:         make(map[*Conn]struct{}),
		quit:          make(chan struct{}),
		stopped:       make(chan struct{}),
		done:          make(chan struct{}),
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
	if s.unreadLimit <= 0 {
		s.unreadLimit = max(DefaultUnreadLimit, int64(s.maxPayload)+netio.HeaderSize)
	}
	if s.maxConns <= 0 {
		s.maxConns = DefaultMaxConns
	}
	if s.frameTimeout <= 0 {
		s.frameTimeout = DefaultFrameTimeout
	}
	if s.budget <= 0 {
		s.budget = DefaultBufferBudget
	}
	s.refuseLog.Every, s.acceptLog.Every, s.budgetLog.Every, s.timeoutLog.Every = 10*time.Second, 10*time.Second, 10*time.Second, 10*time.Second

	if s.outPoll, err = newOutPoller(); err != nil {
		return nil, fmt.Errorf("netio: listen %s: %w", opts.Addr, err)
	}
	s.fds = newFDReserve(fdReserveSize)
	inherited := opts.Inherit
	ours := ownInodes(inherited)
	for _, spec := range specs {
		lns, addr, rest, err := listenGroup(spec, inherited, opts.Bound.take(spec.Name), ours, s.log)
		inherited = rest
		if err != nil {
			s.closeAll()
			closeInherited(inherited)
			return nil, groupErr(spec, err)
		}
		g := &receiverGroup{name: spec.Name, addr: addr}
		for i, ln := range lns {
			r := newReceiver(g, i, len(s.rcv))
			g.receivers = append(g.receivers, r)
			s.rcv = append(s.rcv, r)
			s.listeners = append(s.listeners, ln)
		}
		s.groups = append(s.groups, g)
	}
	closeInherited(inherited) // listeners of groups this Port no longer has
	s.addr = s.groups[0].addr
	s.lastTick = make([]atomic.Int64, len(s.rcv))
	now := time.Now().UnixNano()
	for _, r := range s.rcv {
		s.lastTick[r.pos].Store(now)
		cli, err := s.engineOf(r)
		if err != nil {
			s.closeAll()
			return nil, fmt.Errorf("netio: listen %s: event loop: %w", r.group.addr, err)
		}
		s.loops = append(s.loops, cli)
	}
	for _, g := range s.groups {
		s.steer(g, opts.Steer)
	}
	if m := opts.Metrics; m != nil {
		s.registerMetrics(m)
		s.registerReceiverMetrics(m)
	}
	for _, r := range s.rcv {
		s.acceptWG.Add(1)
		go s.acceptLoop(s.listeners[r.pos], r)
	}
	s.janitor.Add(1)
	go s.runJanitor()
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) == nil && uint64(s.maxConns)+fdHeadroom > lim.Cur {
		s.log.Warn("netio: max_connections is above what the open-file limit allows; accept will fail (and retry) before it",
			"max_connections", s.maxConns, "rlimit_nofile", lim.Cur)
	}
	return s, nil
}

// closeAll undoes a Listen that failed half way.
func (s *Port) closeAll() {
	for _, ln := range s.listeners {
		_ = ln.Close()
	}
	for _, c := range s.loops {
		_ = c.Stop()
	}
	for _, g := range s.groups {
		if g.steered != nil {
			_ = g.steered.Close()
		}
	}
	s.outPoll.close()
	s.fds.close()
}

// stopLinger is how long Stop waits for callers to take their last
// answers before it closes their connections all the same.
const stopLinger = 2 * time.Second

// fdReserveSize is how many descriptors a Port keeps back: one for
// enrolling an accepted connection, one for a connection that must stay
// open for its answers after its caller half-closed it (conn.go).
const fdReserveSize = 2

// fdHeadroom is what a node needs besides its RPC connections: listeners,
// shared-memory segments, UAP pipes and pidfds, peers, the control port.
const fdHeadroom = 256

// Addr returns the host:port every receiving socket listens on; the host is
// empty for a wildcard address.
func (s *Port) Addr() string { return s.addr }

// Stats returns the server's counters.
func (s *Port) Stats() Stats {
	return Stats{
		BadFrames:        s.badFrames.Load(),
		SlowReaderCloses: s.slowClose.Load(),
		UnreadRefusals:   s.unreadRefused.Load(),
		Conns:            int(s.open.Load()),
		AcceptErrors:     s.acceptErrs.Load(),
		Refused:          s.refused.Load(),
		Oversized:        s.oversized.Load(),
		FrameTimeouts:    s.frameTimeouts.Load(),
		BudgetCloses:     s.budgetCloses.Load(),
		Buffered:         s.held.Load(),
		Undelivered:      s.undelivered.Load(),
	}
}

// Done is closed when the server has ended: after Stop, or on its own when
// a receiving socket or an event loop failed (Err says why). After a
// failure the port takes no new connections; the ones open are still
// served until Stop.
func (s *Port) Done() <-chan struct{} { return s.done }

// Err says why the server ended on its own; nil while it runs and after a
// Stop that was not preceded by a failure.
func (s *Port) Err() error {
	select {
	case <-s.done:
		return s.err
	default:
		return nil
	}
}

// fail records that the server can no longer serve (the first reason
// wins) and stops every accept loop, so callers are refused at once rather
// than left waiting in a backlog no one accepts from.
func (s *Port) fail(err error) {
	first := false
	s.doneOnce.Do(func() {
		s.err = err
		first = true
		close(s.done)
	})
	if !first {
		return
	}
	s.log.Error("netio: rpc port ended", "addr", s.addr, "err", err)
	s.closeQuit()
}

func (s *Port) closeQuit() {
	s.quitOnce.Do(func() {
		close(s.quit)
		s.lnMu.Lock()
		for _, ln := range s.listeners {
			_ = ln.Close()
		}
		s.lnMu.Unlock()
	})
}

// Stop closes the listeners, answers every complete call frame that has
// reached the server with 'node shutting down', closes every connection
// (each gets OnClose) and waits for the event loops to end or ctx to
// expire. It is idempotent and safe from any goroutine but the server's own
// event loops.
func (s *Port) Stop(ctx context.Context) error {
	s.stopOnce.Do(func() { go s.stop(ctx) })
	select {
	case <-s.stopped:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("netio: stop %s: %w", s.addr, ctx.Err())
	}
}

func (s *Port) stop(ctx context.Context) {
	defer close(s.stopped)
	s.stopping.Store(true) // from here every frame read is answered by netio, not the Handler
	s.closeQuit()
	wait := func(wg *sync.WaitGroup) {
		ch := make(chan struct{})
		go func() { wg.Wait(); close(ch) }()
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
	wait(&s.acceptWG) // Enroll returns after OnOpen: every accepted connection is in s.conns now
	s.mu.Lock()
	conns := make([]*Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	var finishing sync.WaitGroup
	for _, c := range conns {
		if c.half.Load() { // no loop reads it any more
			c.mu.Lock()
			c.shutWhenWrittenLocked()
			c.unlock()
			continue
		}
		finishing.Add(1)
		task := gnet.RunnableFunc(func(context.Context) error {
			defer finishing.Done()
			c.finish()
			return nil
		})
		if err := c.gc.EventLoop().Execute(ctx, task); err != nil {
			finishing.Done()
		}
	}
	wait(&finishing)
	// Each caller takes its answers and the FIN before its connection
	// closes: a close while the socket still holds unsent answers would
	// lose them (a reset drops them; the caller wrote on, so the close
	// resets). A caller that does not read is given stopLinger.
	linger := time.NewTimer(stopLinger)
	defer linger.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for settled := false; !settled; {
		settled = true
		for _, c := range conns {
			if !c.settled() {
				settled = false
				break
			}
		}
		if settled {
			break
		}
		select {
		case <-tick.C:
		case <-linger.C:
			settled = true
		case <-ctx.Done():
			settled = true
		}
	}
	for _, c := range conns {
		if c.half.Load() {
			_ = c.Close()
		}
	}
	var loops sync.WaitGroup
	for _, cli := range s.loops {
		loops.Go(func() { _ = cli.Stop() }) // closes what is left; OnClose for each
	}
	wait(&loops)
	s.outPoll.close() // after every OnClose: no connection is watched any more
	s.fds.close()
	s.janitor.Wait()
	for _, g := range s.groups {
		if g.steered != nil {
			_ = g.steered.Close()
		}
	}
	s.doneOnce.Do(func() { close(s.done) })
}

func (s *Port) countBad(c *Conn, err error) {
	s.badFrames.Add(1)
	if s.mBad != nil {
		s.mBad.Inc()
	}
	s.log.Debug("netio: bad frame, closing connection", "remote", c.remote, "conn", c.id, "err", err)
}

func (s *Port) countSlow(c *Conn) {
	s.slowClose.Add(1)
	if s.mSlow != nil {
		s.mSlow.Inc()
	}
	s.log.Debug("netio: slow reader, closing connection", "remote", c.remote, "conn", c.id, "limit", s.maxOutbound)
}

func (s *Port) countUndelivered(n int) {
	if n <= 0 {
		return
	}
	s.undelivered.Add(uint64(n))
	if s.mUndelivered != nil {
		s.mUndelivered.Add(n)
	}
}

func (s *Port) countUnread() {
	s.unreadRefused.Add(1)
	inc(s.mUnread)
}

func inc(c *metrics.Counter) {
	if c != nil {
		c.Inc()
	}
}

// engineHandler keeps gnet's callbacks off Port's exported method set.
// There is one per event loop.
type engineHandler struct {
	gnet.BuiltinEventEngine
	s *Port
	r *receiver
}

// ticksPerDeadline is how many liveness ticks a loop makes within
// loopDeadAfter: margin enough, and no more, since each tick wakes the
// process and a quiet node should sleep.
const ticksPerDeadline = 5

// OnTick runs on gnet's ticker goroutine, which ends when the loop's engine
// ends for any reason: the janitor counts a loop whose ticks stop as ended.
func (e *engineHandler) OnTick() (time.Duration, gnet.Action) {
	e.s.lastTick[e.r.pos].Store(time.Now().UnixNano())
	return e.s.loopDeadAfter / ticksPerDeadline, gnet.None
}

func (e *engineHandler) OnOpen(gc gnet.Conn) ([]byte, gnet.Action) {
	s := e.s
	c := &Conn{gc: gc, srv: s, rcv: e.r, id: s.nextID.Add(1), fd: gc.Fd()}
	if ra := gc.RemoteAddr(); ra != nil {
		c.remote = ra.String()
	}
	gc.SetContext(c)
	s.mu.Lock()
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	e.r.conns.Add(1)
	if s.mConns != nil {
		s.mConns.Inc()
	}
	return nil, gnet.None
}

func (e *engineHandler) OnClose(gc gnet.Conn, err error) gnet.Action {
	c, ok := gc.Context().(*Conn)
	if !ok {
		return gnet.None
	}
	c.batch = nil
	if c.part != nil {
		c.dropPart(false) // a frame that can no longer come whole
	}
	c.skip = 0
	c.partialSince.Store(0)
	if c.detach(err) {
		return gnet.None // open for its answers (conn.go), closed by netio
	}
	c.mu.Lock()
	c.endLocked()
	c.mu.Unlock()
	e.s.released(c)
	return gnet.None
}

// released gives back what a closed connection held, counts it closed and
// tells the Handler: on the loop for a connection gnet closed, on the
// closing goroutine for a half connection.
func (s *Port) released(c *Conn) {
	out := c.outCharge.Swap(0)
	part := c.partCharge.Swap(0)
	s.mu.Lock()
	delete(s.conns, c)
	if c.doomed.Load() {
		s.doomed.Add(-c.doomedBytes.Load())
	}
	s.held.Add(-(out + part))
	s.mu.Unlock()
	s.open.Add(-1)
	c.rcv.conns.Add(-1)
	if s.mConns != nil {
		s.mConns.Dec()
	}
	s.h.OnClose(c)
}

func (e *engineHandler) OnTraffic(gc gnet.Conn) gnet.Action {
	c, ok := gc.Context().(*Conn)
	if !ok {
		return gnet.Close
	}
	if c.discard {
		// Stop answered what came before and shuts the write side: the
		// rest is not read as calls.
		_, _ = gc.Discard(-1)
		return gnet.None
	}
	// Everything read is consumed at once: whole frames straight from
	// gnet's buffer, the start of an incomplete one copied into c.part, so
	// gnet never keeps bytes of ours between reads.
	buf, _ := gc.Peek(-1)
	e.r.bytesRead.Add(uint64(len(buf)))
	c.inTraffic = true
	action := c.consume(buf)
	c.inTraffic = false
	_, _ = gc.Discard(-1)
	if err := c.flushBatch(); err != nil {
		action = gnet.Close
	}
	return action
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
