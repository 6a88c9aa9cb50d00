package rpcport

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"tpsched/netio"

	"github.com/VictoriaMetrics/metrics"
	"golang.org/x/sys/unix"
)

// oversizeHeader is the header alone of a call to grp/svc announcing
// payload bytes; the names and payload follow it on the wire.
func oversizeHeader(id uint64, payload uint32) []byte {
	h := netio.AppendFrame(nil, netio.Header{Kind: netio.KindCall, ID: id}, "grp", "svc", nil)[:netio.HeaderSize]
	binary.BigEndian.PutUint32(h[20:], payload)
	return h
}

// TestOversizeFrame: a frame over MaxPayload is answered 'message too big'
// for its request id (calls and name lookups), its bytes are dropped as
// they arrive, whatever way they are cut, and the connection goes on.
func TestOversizeFrame(t *testing.T) {
	set := metrics.NewSet()
	s := startServer(t, Options{MaxPayload: 1024, Metrics: set}, &echoHandler{})
	for _, cut := range []int{1, 7, 100, 1 << 20} {
		c := dial(t, s.Addr())
		r := bufio.NewReader(c)
		var stream []byte
		stream = append(stream, oversizeHeader(1, 5000)...)
		stream = append(stream, bytes.Repeat([]byte{0xee}, 5000+len("grpsvc"))...)
		noReply := netio.AppendFrame(nil, netio.Header{Kind: netio.KindCallNoReply, ID: 2}, "", "", nil)
		binary.BigEndian.PutUint32(noReply[20:], 2000)
		stream = append(stream, noReply...)
		stream = append(stream, make([]byte, 2000)...)
		stream = append(stream, callFrame(3, []byte("after"))...)
		go func() {
			for b := stream; len(b) > 0; {
				k := min(cut, len(b))
				if _, err := c.Write(b[:k]); err != nil {
					return
				}
				b = b[k:]
			}
		}()
		f, err := readFrame(r)
		if err != nil || f.Kind != netio.KindError || f.Code != netio.CodeMessageTooBig || f.ID != 1 || !strings.Contains(string(f.Payload), "5000") {
			t.Fatalf("cut %d: answer to the oversize call: %+v %q, %v", cut, f.Header, f.Payload, err)
		}
		f, err = readFrame(r)
		if err != nil || f.Kind != netio.KindReply || f.ID != 3 || string(f.Payload) != "after" {
			t.Fatalf("cut %d: the call after: %+v %q, %v (stats %+v)", cut, f.Header, f.Payload, err, s.Stats())
		}
	}
	if st := s.Stats(); st.Oversized != 8 || st.BadFrames != 0 || st.Buffered != 0 {
		t.Errorf("stats %+v: want 8 oversized, no bad frame, nothing buffered", st)
	}
}

// TestFrameTimeout: a connection whose frame stops arriving halfway (or
// whose header never completes, or whose oversize payload stops) is closed
// once FrameTimeout passes; one that sends whole frames slowly is not.
func TestFrameTimeout(t *testing.T) {
	s := startServer(t, Options{FrameTimeout: 200 * time.Millisecond, MaxPayload: 1 << 10}, &echoHandler{})
	cases := map[string][]byte{
		"half-frame":    callFrame(1, make([]byte, 1000))[:500],
		"half-header":   callFrame(1, nil)[:10],
		"oversize-skip": append(oversizeHeader(1, 1<<20), make([]byte, 1000)...),
	}
	var wg sync.WaitGroup
	for name, b := range cases {
		c := dial(t, s.Addr())
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			start := time.Now()
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err := io.Copy(io.Discard, c)
			if err != nil {
				t.Errorf("%s: %v, want the server to close the connection", name, err)
			}
			if d := time.Since(start); d < 150*time.Millisecond {
				t.Errorf("%s: closed after %v, before the frame timeout", name, d)
			}
		})
	}
	patient := dial(t, s.Addr())
	for i := range 6 {
		if err := call(patient, patient, uint64(i), []byte("x")); err != nil {
			t.Fatalf("a caller with whole frames, idle between them: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	wg.Wait()
	if got := s.Stats().FrameTimeouts; got != 3 {
		t.Errorf("FrameTimeouts = %d, want 3", got)
	}
}

// TestBudgetPartialFrames: connections each holding most of a large frame
// take the server over its budget: the ones holding the most are closed,
// what stays held fits the budget, and a small caller is still served.
//
// The clients judge which connections were closed only once the server has
// read every connection's frame so far (on a busy machine that takes
// longer than any fixed window): a connection the server closed then reads
// its end at once, one it holds reads nothing.
func TestBudgetPartialFrames(t *testing.T) {
	const budget, frame = 4 << 20, 1 << 20
	s := startServer(t, Options{MaxPayload: 2 * frame, BufferBudget: budget, Loops: 2}, &echoHandler{})
	var conns []net.Conn
	for range 12 {
		c := dial(t, s.Addr())
		if _, err := c.Write(callFrame(1, make([]byte, frame))[:frame-1000]); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	small := dial(t, s.Addr())
	if err := call(small, small, 1, []byte("small")); err != nil {
		t.Fatalf("a small caller: %v", err)
	}
	waitFor(t, "the server to read or close all 12 connections", func() bool {
		st := s.Stats()
		open := int64(st.Conns - 1) // the small caller's is open too
		return int64(st.BudgetCloses)+open == 12 && st.Buffered >= open*(frame-1000)
	})
	var closed sync.WaitGroup
	var closes, held int
	var mu sync.Mutex
	for _, c := range conns {
		closed.Go(func() {
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			_, err := io.Copy(io.Discard, c)
			mu.Lock()
			defer mu.Unlock()
			// Closed with bytes unread, the server's socket answers with a
			// reset: anything but the deadline is a close.
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				held++
			} else {
				closes++
			}
		})
	}
	closed.Wait()
	st := s.Stats()
	t.Logf("12 partial frames of %d KiB, budget %d KiB: %d closed, %d held; %d bytes buffered", frame>>10, budget>>10, closes, held, st.Buffered)
	if closes == 0 || st.BudgetCloses != uint64(closes) {
		t.Errorf("%d closed by the server, BudgetCloses %d: want the same, above 0", closes, st.BudgetCloses)
	}
	if st.Buffered > budget {
		t.Errorf("%d bytes buffered, over the budget of %d", st.Buffered, budget)
	}
	if held == 0 {
		t.Error("every connection was closed: the budget should keep what fits")
	}
}

// TestBudgetNonReaders: clients that pipeline calls and never read their
// answers are closed once the answers waiting for them pass the budget;
// a caller that reads is served throughout and nothing stays charged.
func TestBudgetNonReaders(t *testing.T) {
	const budget = 4 << 20
	h := &echoHandler{async: true}
	s := startServer(t, Options{BufferBudget: budget, Loops: 2}, h)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var closedByServer sync.Map
	for i := range 4 {
		c := dial(t, s.Addr())
		wg.Go(func() {
			batch := bytes.Repeat(callFrame(1, make([]byte, 64<<10)), 8)
			var rest []byte
			for ctx.Err() == nil {
				if len(rest) == 0 {
					rest = batch
				}
				_ = c.SetWriteDeadline(time.Now().Add(2 * time.Second))
				n, err := c.Write(rest)
				rest = rest[n:]
				if err != nil {
					// A write that times out is the server not reading yet
					// (a busy machine): the caller goes on from where it
					// stopped, as a non-reader does, until the server
					// closes it. (A new batch after a part of one would be
					// a bad frame, closed for that.)
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() {
						continue
					}
					closedByServer.Store(i, err)
					return
				}
			}
		})
	}
	reader := dial(t, s.Addr())
	for i := 0; ctx.Err() == nil && s.Stats().BudgetCloses < 4; i++ {
		if err := call(reader, reader, uint64(i), []byte("reader")); err != nil {
			t.Fatalf("the reading caller: %v", err)
		}
	}
	wg.Wait() // each writer ends when its connection is closed (or at ctx's end)
	n := 0
	closedByServer.Range(func(any, any) bool { n++; return true })
	if n != 4 || s.Stats().BudgetCloses < 4 {
		closedByServer.Range(func(k, v any) bool { t.Logf("writer %v: %v", k, v); return true })
		t.Fatalf("%d non-readers closed, BudgetCloses %d: want 4", n, s.Stats().BudgetCloses)
	}
	waitFor(t, "charges to go back", func() bool { return s.Stats().Buffered == 0 })
}

// countingHandler is echoHandler that counts the calls it was given.
type countingHandler struct {
	echoHandler
	calls atomic.Int64
}

func (h *countingHandler) OnFrame(c *Conn, f netio.Frame) {
	if f.Kind == netio.KindCall {
		h.calls.Add(1)
	}
	h.echoHandler.OnFrame(c, f)
}

// TestUnreadAnswersRefuseNewCalls: a caller that sends calls and reads
// none of their answers gets no more of them run once its unsent answers
// pass the unread limit and have not moved for half a second: the port
// answers 'server busy' itself. A caller that reads is served all along.
//
// How many of the first 256 calls run before the port refuses depends on
// how fast this machine runs them (on a busy one the later ones may come
// after the half second): the test counts each call as run or refused,
// and holds the port to its rule from there.
func TestUnreadAnswersRefuseNewCalls(t *testing.T) {
	const limit, size = 256 << 10, 64 << 10
	h := &countingHandler{echoHandler: echoHandler{async: true}}
	s := startServer(t, Options{UnreadLimit: limit, MaxPayload: size, Loops: 1}, h)
	greedy := dial(t, s.Addr())
	send := func(n int) {
		t.Helper()
		_ = greedy.SetWriteDeadline(time.Now().Add(testDeadline))
		if _, err := greedy.Write(bytes.Repeat(callFrame(1, make([]byte, size)), n)); err != nil {
			t.Fatal(err)
		}
	}
	send(256) // 16 MiB of answers: more than the socket buffers and the limit
	waitFor(t, "each of the first 256 calls to run or be refused", func() bool {
		return h.calls.Load()+int64(s.Stats().UnreadRefusals) == 256
	})
	first := h.calls.Load()
	t.Logf("of the first 256 calls, %d ran before the port refused the rest", first)
	// The port refuses only past the limit: the calls that ran hold more
	// than limit bytes of answers.
	if first*size <= limit {
		t.Errorf("%d calls ran (%d bytes of answers) before the port refused: the limit is %d", first, first*size, limit)
	}
	time.Sleep(unreadStall + 200*time.Millisecond)
	send(16)
	waitFor(t, "the later calls to be refused", func() bool { return h.calls.Load()+int64(s.Stats().UnreadRefusals) == 272 })
	if ran := h.calls.Load(); ran != first {
		t.Errorf("%d calls ran; want the %d run before the caller stalled", ran, first)
	}
	reader := dial(t, s.Addr())
	for i := range 20 {
		if err := call(reader, reader, uint64(i), []byte("reader")); err != nil {
			t.Fatalf("the reading caller: %v", err)
		}
	}
	// The greedy caller's answers: a reply for each call that ran, 'server
	// busy' for the rest.
	_ = greedy.SetReadDeadline(time.Now().Add(testDeadline))
	var replies, busy int
	for replies+busy < 272 {
		f, err := readFrame(greedy)
		if err != nil {
			t.Fatalf("reading the greedy caller's answers after %d replies and %d refusals: %v", replies, busy, err)
		}
		switch {
		case f.Kind == netio.KindReply:
			replies++
		case f.Kind == netio.KindError && f.Code == netio.CodeServerBusy && strings.Contains(string(f.Payload), "answers on this connection are unread"):
			busy++
		default:
			t.Fatalf("answer %v %v %q", f.Kind, f.Code, f.Payload)
		}
	}
	if int64(replies) != first || busy != 272-int(first) {
		t.Errorf("%d replies, %d refusals; want %d and %d", replies, busy, first, 272-first)
	}
}

// TestSlowReaderIsServed: a caller that reads its answers slowly, with
// more than the unread limit waiting, has every call run. "Reads" is
// taking some answers within unreadStall: a run in which the test's own
// reader went that long without a read (a busy machine starving the test
// process) proves nothing, and is made again, up to three times.
func TestSlowReaderIsServed(t *testing.T) {
	for try := 1; ; try++ {
		refused, gap := slowReaderRun(t)
		if refused < 0 {
			return
		}
		if gap < unreadStall/2 || try == 3 {
			t.Fatalf("answer %d refused for unread answers, though the caller read at most %v apart", refused, gap.Round(time.Millisecond))
		}
		t.Logf("try %d: answer %d refused after the reader itself went %v without a read; again", try, refused, gap.Round(time.Millisecond))
	}
}

// slowReaderRun is one run of TestSlowReaderIsServed: the first answer
// refused (-1: none) and the longest time between two of the reader's
// reads.
func slowReaderRun(t *testing.T) (refused int, gap time.Duration) {
	const limit, size = 256 << 10, 64 << 10
	h := &countingHandler{echoHandler: echoHandler{async: true}}
	s := startServer(t, Options{UnreadLimit: limit, MaxPayload: size, Loops: 1}, h)
	c := dial(t, s.Addr())
	defer c.Close()
	const calls = 200
	go func() {
		// A burst that leaves more than the limit waiting, then one call
		// every 5 ms while the answers are read as slowly.
		frame := callFrame(1, make([]byte, size))
		_, _ = c.Write(bytes.Repeat(frame, calls/2))
		for range calls / 2 {
			time.Sleep(5 * time.Millisecond)
			_, _ = c.Write(frame)
		}
	}()
	_ = c.SetReadDeadline(time.Now().Add(testDeadline))
	last := time.Now()
	for i := range calls {
		f, err := readFrame(c)
		if err != nil {
			t.Fatal(err)
		}
		gap = max(gap, time.Since(last))
		last = time.Now()
		if f.Kind != netio.KindReply {
			if f.Code != netio.CodeServerBusy {
				t.Fatalf("answer %d: %v %q", i, f.Code, f.Payload)
			}
			return i, gap
		}
		time.Sleep(5 * time.Millisecond) // 13 MB/s: slow, never stalled
	}
	if s.Stats().UnreadRefusals != 0 {
		t.Errorf("%d refusals for a caller that reads", s.Stats().UnreadRefusals)
	}
	return -1, gap
}

// TestMaxConns: connections beyond MaxConns are closed at once and counted;
// closing one lets the next in.
func TestMaxConns(t *testing.T) {
	set := metrics.NewSet()
	s := startServer(t, Options{MaxConns: 3, Metrics: set}, &echoHandler{})
	var kept []net.Conn
	for i := range 3 {
		c := dial(t, s.Addr())
		if err := call(c, c, uint64(i), []byte("in")); err != nil {
			t.Fatal(err)
		}
		kept = append(kept, c)
	}
	extra := dial(t, s.Addr())
	if err := call(extra, extra, 9, []byte("over")); err == nil {
		t.Fatal("a fourth connection was served")
	}
	if st := s.Stats(); st.Refused != 1 || st.Conns != 3 {
		t.Fatalf("stats %+v: want 1 refused, 3 open", st)
	}
	kept[0].Close()
	waitFor(t, "a slot to free", func() bool { return s.Stats().Conns == 2 })
	c := dial(t, s.Addr())
	if err := call(c, c, 10, []byte("in again")); err != nil {
		t.Fatalf("after a slot freed: %v", err)
	}
	var buf bytes.Buffer
	set.WritePrometheus(&buf)
	if !strings.Contains(buf.String(), `tpsched_connections_refused_total{reason="max_connections"} 1`) {
		t.Errorf("metrics lack the refusal:\n%s", buf.String())
	}
}

// TestListenerDeathEndsServer: a receiving socket that can no longer
// accept (shut down under the server) ends it: Done closes and Err says
// why. Stop afterwards still works and keeps that reason.
func TestListenerDeathEndsServer(t *testing.T) {
	s, err := Listen(Options{Addr: "127.0.0.1:0", Loops: 2}, &echoHandler{})
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, s.Addr())
	if err := call(c, c, 1, []byte("x")); err != nil {
		t.Fatal(err)
	}
	rc, err := s.listeners[1].SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	_ = rc.Control(func(fd uintptr) { _ = unix.Shutdown(int(fd), unix.SHUT_RDWR) })
	select {
	case <-s.Done():
	case <-time.After(testDeadline):
		t.Fatal("Done not closed after a listener died")
	}
	if err := s.Err(); err == nil || !strings.Contains(err.Error(), "accept") {
		t.Fatalf("Err() = %v, want the accept failure", err)
	}
	if err := call(c, c, 2, []byte("still")); err != nil {
		t.Errorf("a connection open before the failure: %v", err)
	}
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s.Err() == nil {
		t.Error("Stop erased the failure")
	}
}

// TestLoopDeathEndsServer: an event loop whose engine ends outside Stop
// ends the server.
func TestLoopDeathEndsServer(t *testing.T) {
	defer func(d time.Duration) { loopDeadAfter = d }(loopDeadAfter)
	loopDeadAfter = 500 * time.Millisecond
	s, err := Listen(Options{Addr: "127.0.0.1:0", Loops: 2}, &echoHandler{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop(context.Background())
	_ = s.loops[0].Stop()
	select {
	case <-s.Done():
	case <-time.After(testDeadline):
		t.Fatal("Done not closed after an event loop ended")
	}
	if err := s.Err(); err == nil || !strings.Contains(err.Error(), "event loop 1 of 2 stopped") {
		t.Fatalf("Err() = %v", err)
	}
}

// TestQuietLoopTicksSeldom: a loop's liveness tick comes as seldom as its
// deadline allows, since each tick wakes a quiet node (TestLoopDeathEndsServer
// shows a short deadline still caught).
func TestQuietLoopTicksSeldom(t *testing.T) {
	s, err := Listen(Options{Addr: "127.0.0.1:0"}, &echoHandler{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop(context.Background())
	time.Sleep(200 * time.Millisecond) // the first tick, at the start, is in
	first := s.lastTick[0].Load()
	time.Sleep(500 * time.Millisecond)
	if got := s.lastTick[0].Load(); got != first {
		t.Errorf("a quiet loop ticked again after %v; want one tick per %v", time.Duration(got-first), loopDeadAfter/ticksPerDeadline)
	}
}

// TestStopIsNotFailure: after a plain Stop, Done is closed and Err is nil.
func TestStopIsNotFailure(t *testing.T) {
	s, err := Listen(Options{Addr: "127.0.0.1:0"}, &echoHandler{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("Done open after Stop")
	}
	if err := s.Err(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Err() = %v after Stop", err)
	}
}
