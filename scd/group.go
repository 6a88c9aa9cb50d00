package scd

import (
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/netio"
	"tpsched/procmgr"
	"tpsched/scd/def"
	"tpsched/shm"
)

// group is one service group on this node: its schedule queue, the calls in
// flight on it, and the user server whose processes serve it.
type group struct {
	name     string
	def      def.Server
	services map[string]string // interned service names, looked up without allocating
	seg      queue
	procs    *procmgr.Server
	held     atomic.Bool
	closed   atomic.Bool // the queue was closed: the node is stopping
	watch    time.Duration

	// mu orders every change to pending. Enqueue happens under it too, so
	// the reply reader can never see a completion before its call is known.
	mu      sync.Mutex
	pending map[shm.Token]*call

	load groupLoad

	refused  *metrics.Counter // calls refused server busy: the queue was full
	timedOut *metrics.Counter
	latency  *metrics.Histogram
}

// queue is the channel between the node and a group's UAP processes: the
// shared-memory schedule queue (*shm.Segment) or, for receive_from=socket,
// a socket to the one process.
type queue interface {
	File() *os.File
	Enqueue(service string, req []byte, deadline time.Time) (shm.Token, error)
	WaitCompletions(buf []shm.Completion, timeout time.Duration) []shm.Completion
	Release(t shm.Token)
	PrepareSlot(slot int) error
	Reclaim(slot int) (shm.Token, bool)
	SlotInfo(slot int) shm.SlotInfo
	RequestStop(slot int)
	Depth() int
	Stats() shm.Stats
	Close() error
	Unmap() error
}

// call is one request between Enqueue and the release of its buffer. Its
// caller may have been answered earlier (timed out): answered says so.
type call struct {
	conn     *netio.Conn
	id       uint64
	start    time.Time
	deadline time.Time // zero: wait for ever
	noReply  bool
	answered bool
}

var callPool = sync.Pool{New: func() any { return new(call) }}

// enqueue puts a request on the schedule queue and remembers who waits.
func (g *group) enqueue(c *netio.Conn, f *netio.Frame, service string, now time.Time) netio.Code {
	cl := callPool.Get().(*call)
	*cl = call{conn: c, id: f.ID, start: now, noReply: f.Kind == netio.KindCallNoReply}
	timeout := g.watch
	if f.TimeoutMs > 0 {
		timeout = time.Duration(f.TimeoutMs) * time.Millisecond
	}
	if timeout > 0 {
		cl.deadline = now.Add(timeout)
	}
	g.mu.Lock()
	tok, err := g.seg.Enqueue(service, f.Payload, cl.deadline)
	if err == nil {
		g.pending[tok] = cl
	}
	g.mu.Unlock()
	switch err {
	case nil:
		g.procs.Kick(g.seg.Depth())
		return netio.CodeOK
	case shm.ErrFull:
		callPool.Put(cl)
		return netio.CodeServerBusy
	case shm.ErrTooBig:
		callPool.Put(cl)
		return netio.CodeMessageTooBig
	default:
		callPool.Put(cl)
		return netio.CodeShuttingDown
	}
}

// finish removes a call whose buffer is done with and hands it to the
// caller, who owns it from then on; nil if it was gone already (a completion
// and a reclaim can race for one token).
func (g *group) finish(tok shm.Token) *call {
	g.mu.Lock()
	cl := g.pending[tok]
	delete(g.pending, tok)
	g.mu.Unlock()
	return cl
}

// expire answers 'timed out' to every caller whose deadline has passed. The
// calls stay pending: their buffers are in use until the UAP finishes or the
// reclaim after its death.
func (g *group) expire(now time.Time) {
	type caller struct {
		conn  *netio.Conn
		id    uint64
		limit time.Duration
	}
	var late []caller // copied out: a call is pooled again once it leaves pending
	g.mu.Lock()
	for _, cl := range g.pending {
		if !cl.answered && !cl.deadline.IsZero() && now.After(cl.deadline) {
			cl.answered = true
			if !cl.noReply {
				late = append(late, caller{cl.conn, cl.id, cl.deadline.Sub(cl.start)})
			}
		}
	}
	g.mu.Unlock()
	for _, c := range late {
		g.timedOut.Inc()
		_ = c.conn.Send(netio.AppendError(nil, c.id, netio.CodeTimedOut, timedOutMessage(c.limit, g.watch)))
	}
}

// inFlight counts calls not yet answered.
func (g *group) inFlight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.pending)
}

// readReplies is the group's reply reader: it takes completions off the
// segment and sends each answer to its caller's connection. Answers to one
// connection found in the same batch go out in one write.
func (g *group) readReplies(stop <-chan struct{}) {
	var comps []shm.Completion
	batches := make(map[*netio.Conn][]byte)
	for {
		select {
		case <-stop:
			return
		default:
		}
		comps = g.seg.WaitCompletions(comps[:0], 100*time.Millisecond)
		if len(comps) == 0 && g.closed.Load() {
			// A closed, drained queue answers at once: do not spin while
			// the node waits for the processes to exit.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		now := time.Now()
		for i := range comps {
			cp := &comps[i]
			cl := g.finish(cp.Token)
			if cl != nil {
				if !cl.answered && !cl.noReply {
					batches[cl.conn] = appendAnswer(batches[cl.conn], cl.id, cp)
				}
				g.latency.Update(now.Sub(cl.start).Seconds())
				callPool.Put(cl)
			}
			g.seg.Release(cp.Token)
		}
		for c, b := range batches {
			_ = c.Send(b)
			delete(batches, c)
		}
	}
}

func appendAnswer(dst []byte, id uint64, cp *shm.Completion) []byte {
	switch cp.Status {
	case shm.StatusOK:
		return netio.AppendReply(dst, id, cp.Reply)
	case shm.StatusAppError:
		return netio.AppendError(dst, id, netio.CodeApplication, string(cp.Reply))
	case shm.StatusNoSuchService:
		return netio.AppendError(dst, id, netio.CodeNoSuchService, "not registered by the UAP")
	case shm.StatusTimedOut:
		return netio.AppendError(dst, id, netio.CodeTimedOut, "its deadline passed while it waited in the schedule queue")
	}
	return netio.AppendError(dst, id, netio.CodeProtocol, "unknown completion status")
}

// processExited fails the call the dead process was serving, if any.
func (g *group) processExited(slot int) {
	tok, ok := g.seg.Reclaim(slot)
	if !ok {
		return
	}
	if cl := g.finish(tok); cl != nil {
		if !cl.answered && !cl.noReply {
			_ = cl.conn.Send(netio.AppendError(nil, cl.id, netio.CodeServerTerminated,
				"the UAP process serving the call died"))
		}
		callPool.Put(cl)
	}
	g.seg.Release(tok)
}
