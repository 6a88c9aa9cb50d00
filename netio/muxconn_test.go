package netio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testDeadline bounds every wait of these tests.
const testDeadline = 20 * time.Second

// answers records every answer an Answerer gets.
type answers struct {
	ch    chan answer
	count atomic.Int64
}

type answer struct {
	f   Frame
	err error
}

func newAnswers() *answers { return &answers{ch: make(chan answer, 1024)} }

func (a *answers) Answer(f Frame, err error) {
	a.count.Add(1)
	a.ch <- answer{f, err}
}

func (a *answers) next(t *testing.T) answer {
	t.Helper()
	select {
	case r := <-a.ch:
		return r
	case <-time.After(testDeadline):
		t.Fatal("no answer")
		return answer{}
	}
}

// frameServer accepts one connection on loopback and hands each frame it
// reads (a copy) to serve, which writes answers with reply.
func frameServer(t *testing.T, serve func(f Frame, reply func([]byte), nc net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		nc, err := l.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		var wmu sync.Mutex
		reply := func(b []byte) {
			wmu.Lock()
			defer wmu.Unlock()
			_, _ = nc.Write(b)
		}
		fr := NewFrameReader(nc, 1<<20)
		for {
			f, _, err := fr.Read(nil)
			if err != nil {
				return
			}
			serve(f, reply, nc)
		}
	}()
	return l.Addr().String()
}

func dialMux(t *testing.T, addr string, opts MuxOptions) *MuxConn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	m := NewMuxConn(nc, opts)
	t.Cleanup(func() { m.Close(nil) })
	return m
}

// TestMuxConnMatchesAnswersByID: many calls at once on one connection, the
// answers coming back in another order than the calls went out, each
// reaches its own caller.
func TestMuxConnMatchesAnswersByID(t *testing.T) {
	addr := frameServer(t, func(f Frame, reply func([]byte), _ net.Conn) {
		payload := bytes.Clone(f.Payload)
		go func() { // answers overtake each other
			time.Sleep(time.Duration(len(payload)%7) * time.Millisecond)
			reply(AppendReply(nil, f.ID, payload))
		}()
	})
	m := dialMux(t, addr, MuxOptions{})
	const goroutines, calls = 32, 50
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			a := newAnswers()
			for i := range calls {
				want := fmt.Sprintf("goroutine %d call %d%s", g, i, bytes.Repeat([]byte{'.'}, i%5))
				if _, sent, err := m.Call(Header{Kind: KindCall}, "g", "s", []byte(want), time.Time{}, a); !sent || err != nil {
					t.Errorf("Call: %v, %v", sent, err)
					return
				}
				if r := a.next(t); r.err != nil || string(r.f.Payload) != want {
					t.Errorf("%s: answered %q, %v", want, r.f.Payload, r.err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestMuxConnCloseAnswersEveryWaiterOnce: Close answers every call still
// waiting, once, with its reason, after OnClose; it happens once however
// often and from wherever it is called; later calls are not sent.
func TestMuxConnCloseAnswersEveryWaiterOnce(t *testing.T) {
	addr := frameServer(t, func(Frame, func([]byte), net.Conn) {}) // never answers
	var onClose atomic.Int64
	var answeredBeforeOnClose atomic.Int64
	a := newAnswers()
	m := dialMux(t, addr, MuxOptions{OnClose: func(_ *MuxConn, err error) {
		onClose.Add(1)
		answeredBeforeOnClose.Store(a.count.Load())
	}})
	const calls = 100
	for range calls {
		if _, sent, err := m.Call(Header{Kind: KindCall}, "g", "s", nil, time.Time{}, a); !sent || err != nil {
			t.Fatalf("Call: %v, %v", sent, err)
		}
	}
	reason := errors.New("test closes")
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { m.Close(reason) })
	}
	wg.Wait()
	for range calls {
		if r := a.next(t); !errors.Is(r.err, reason) {
			t.Errorf("answer %v, want the close reason", r.err)
		}
	}
	time.Sleep(20 * time.Millisecond) // a second answer would show by now
	if n := a.count.Load(); n != calls {
		t.Errorf("%d answers to %d calls", n, calls)
	}
	if n := onClose.Load(); n != 1 {
		t.Errorf("OnClose called %d times", n)
	}
	if n := answeredBeforeOnClose.Load(); n != 0 {
		t.Errorf("%d calls answered before OnClose", n)
	}
	select {
	case <-m.Done():
	default:
		t.Error("Done not closed")
	}
	if !errors.Is(m.Err(), reason) {
		t.Errorf("Err = %v", m.Err())
	}
	if _, sent, err := m.Call(Header{Kind: KindCall}, "g", "s", nil, time.Time{}, a); sent || !errors.Is(err, reason) {
		t.Errorf("Call after Close: sent %v, %v", sent, err)
	}
	if _, err := m.Expect(time.Time{}, a); !errors.Is(err, reason) {
		t.Errorf("Expect after Close: %v", err)
	}
}

// TestMuxConnPeerCloses: when the other side closes, the calls waiting get
// ErrClosedByPeer; a bad frame from it closes the connection with the
// decoding error.
func TestMuxConnPeerCloses(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(nc net.Conn)
		want error
	}{
		{"close", func(nc net.Conn) { nc.Close() }, ErrClosedByPeer},
		{"bad frame", func(nc net.Conn) { _, _ = nc.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n")) }, ErrBadMagic},
		{"cut frame", func(nc net.Conn) {
			_, _ = nc.Write(AppendReply(nil, 1, []byte("cut short"))[:HeaderSize+3])
			nc.Close()
		}, io.ErrUnexpectedEOF},
		// A frame of a kind a node never answers with, under a call's id,
		// is no answer: before, it was handed to the call as its answer
		// (and the forwarder passed it on to its own caller as it was).
		{"call as an answer", func(nc net.Conn) {
			_, _ = nc.Write(AppendFrame(nil, Header{Kind: KindCall, ID: 2}, "g", "s", nil))
		}, ErrBadKind},
		{"go-away as an answer", func(nc net.Conn) {
			_, _ = nc.Write(AppendFrame(nil, Header{Kind: KindGoAway, ID: 1}, "", "", nil))
		}, ErrBadKind},
	} {
		t.Run(tc.name, func(t *testing.T) {
			arrived := make(chan struct{}, 2)
			addr := frameServer(t, func(f Frame, _ func([]byte), nc net.Conn) {
				arrived <- struct{}{}
				if f.ID == 2 {
					tc.end(nc)
				}
			})
			a := newAnswers()
			m := dialMux(t, addr, MuxOptions{})
			for range 2 {
				if _, sent, err := m.Call(Header{Kind: KindCall}, "g", "s", nil, time.Time{}, a); !sent || err != nil {
					t.Fatalf("Call: %v, %v", sent, err)
				}
			}
			for range 2 {
				if r := a.next(t); !errors.Is(r.err, tc.want) {
					t.Errorf("answer %v, want %v", r.err, tc.want)
				}
			}
		})
	}
}

// TestMuxConnExpireAndForget: Expire answers only calls past their
// deadline; their late answers, and answers to forgotten calls, are
// dropped; the others are answered as usual.
func TestMuxConnExpireAndForget(t *testing.T) {
	release := make(chan struct{})
	addr := frameServer(t, func(f Frame, reply func([]byte), _ net.Conn) {
		go func() {
			<-release
			reply(AppendReply(nil, f.ID, []byte("late")))
		}()
	})
	m := dialMux(t, addr, MuxOptions{})
	now := time.Now()
	late, forgotten, onTime := newAnswers(), newAnswers(), newAnswers()
	// Sent before its deadline (Call refuses a call already late), and
	// expired by an Expire that looks later.
	if _, _, err := m.Call(Header{Kind: KindCall}, "g", "s", nil, now.Add(time.Minute), late); err != nil {
		t.Fatal(err)
	}
	id, _, err := m.Call(Header{Kind: KindCall}, "g", "s", nil, time.Time{}, forgotten)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Call(Header{Kind: KindCall}, "g", "s", nil, now.Add(time.Hour), onTime); err != nil {
		t.Fatal(err)
	}
	if !m.Forget(id) || m.Forget(id) {
		t.Error("Forget: want true, then false")
	}
	if n := m.Expire(now.Add(2 * time.Minute)); n != 1 {
		t.Errorf("Expire answered %d calls, want 1", n)
	}
	if r := late.next(t); !errors.Is(r.err, ErrCallExpired) {
		t.Errorf("late call: %v", r.err)
	}
	close(release)
	if r := onTime.next(t); r.err != nil || string(r.f.Payload) != "late" {
		t.Errorf("call on time: %q, %v", r.f.Payload, r.err)
	}
	time.Sleep(20 * time.Millisecond)
	if late.count.Load() != 1 || forgotten.count.Load() != 0 {
		t.Errorf("answers: expired call %d (want 1), forgotten call %d (want 0)", late.count.Load(), forgotten.count.Load())
	}
}

// TestMuxConnSharedWrites: frames written while another write is under way
// go out with the next write, whole and in order; a frame that did not go
// out because the connection had failed is reported unsent and its caller
// never answered.
func TestMuxConnSharedWrites(t *testing.T) {
	var mu sync.Mutex
	var got []uint64
	addr := frameServer(t, func(f Frame, reply func([]byte), _ net.Conn) {
		mu.Lock()
		got = append(got, f.ID)
		mu.Unlock()
		reply(AppendReply(nil, f.ID, nil))
	})
	m := dialMux(t, addr, MuxOptions{})
	const writers, each = 16, 50
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			a := newAnswers()
			for range each {
				if _, _, err := m.Call(Header{Kind: KindCall}, "g", "s", make([]byte, 4096), time.Time{}, a); err != nil {
					t.Error(err)
					return
				}
				a.next(t)
			}
		})
	}
	wg.Wait()
	mu.Lock()
	n := len(got)
	ids := slices.Clone(got)
	mu.Unlock()
	slices.Sort(ids)
	if n != writers*each || len(slices.Compact(ids)) != n {
		t.Errorf("server read %d frames (%d distinct), want %d", n, len(ids), writers*each)
	}

	// The next write fails, and the peer does not close: with CloseWrite
	// the peer saw EOF and closed, and the close could answer the call
	// before its write failed (then it counts as sent, rightly).
	_ = m.NetConn().SetWriteDeadline(time.Now().Add(-time.Second))
	a := newAnswers()
	if _, sent, err := m.Call(Header{Kind: KindCall}, "g", "s", nil, time.Time{}, a); sent || err == nil {
		t.Errorf("Call on a connection that cannot write: sent %v, %v", sent, err)
	}
	time.Sleep(20 * time.Millisecond)
	if a.count.Load() != 0 {
		t.Error("an unsent call was answered")
	}
}

func TestFrameReader(t *testing.T) {
	var stream []byte
	stream = AppendReply(stream, 1, []byte("one"))
	stream = AppendReply(stream, 2, bytes.Repeat([]byte("x"), 100))
	stream = AppendError(stream, 3, CodeServerBusy, "full")
	fr := NewFrameReader(bytes.NewReader(stream), 1000)
	buf := make([]byte, 0, 40)
	var ids []uint64
	for {
		f, b, err := fr.Read(buf)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("Read: %v", err)
		}
		buf = b
		ids = append(ids, f.ID)
	}
	if !slices.Equal(ids, []uint64{1, 2, 3}) || cap(buf) < HeaderSize+100 {
		t.Errorf("ids %v, buffer capacity %d", ids, cap(buf))
	}
	for _, tc := range []struct {
		name   string
		stream []byte
		max    int
		want   error
	}{
		{"cut header", stream[:10], 1000, io.ErrUnexpectedEOF},
		{"cut payload", stream[:HeaderSize+1], 1000, io.ErrUnexpectedEOF},
		{"over the limit", stream, 2, ErrFrameSize},
		{"bad magic", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), 1000, ErrBadMagic},
	} {
		if _, _, err := NewFrameReader(bytes.NewReader(tc.stream), tc.max).Read(nil); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

// TestFrameReaderSkipsOversize: a frame over the limit is a
// *FrameSizeError naming its id and size; the next Read drops its bytes
// without holding them (64 MiB of payload, read through a buffer of 64 KiB)
// and returns the frame after it.
func TestFrameReaderSkipsOversize(t *testing.T) {
	const size = 64 << 20
	hdr := AppendFrame(nil, Header{Kind: KindReply, ID: 7}, "", "", nil)
	binary.BigEndian.PutUint32(hdr[20:24], size)
	stream := io.MultiReader(bytes.NewReader(hdr), io.LimitReader(zeros{}, size),
		bytes.NewReader(AppendReply(nil, 8, []byte("next"))))
	fr := NewFrameReader(stream, 1<<20)
	_, _, err := fr.Read(nil)
	var fse *FrameSizeError
	if !errors.As(err, &fse) || !errors.Is(err, ErrFrameSize) || fse.ID != 7 || fse.Kind != KindReply || fse.Size != size || fse.Limit != 1<<20 {
		t.Fatalf("Read of the big frame: %#v", err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f, _, err := fr.Read(nil)
	runtime.ReadMemStats(&after)
	if err != nil || f.ID != 8 || string(f.Payload) != "next" {
		t.Fatalf("Read after the big frame: id %d %q, %v", f.ID, f.Payload, err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Errorf("skipping %d bytes allocated %d", size, n)
	}
	if _, _, err := fr.Read(nil); err != io.EOF {
		t.Errorf("Read at the end: %v", err)
	}
	// A stream that ends inside the skipped frame was cut.
	fr = NewFrameReader(io.MultiReader(bytes.NewReader(hdr), io.LimitReader(zeros{}, 100)), 1<<20)
	if _, _, err := fr.Read(nil); !errors.Is(err, ErrFrameSize) {
		t.Fatalf("Read of the big frame: %v", err)
	}
	if _, _, err := fr.Read(nil); err != io.ErrUnexpectedEOF {
		t.Errorf("Read of a stream cut in the skipped frame: %v", err)
	}
}

type zeros struct{}

func (zeros) Read(b []byte) (int, error) { clear(b); return len(b), nil }

// TestMuxConnRoundTrip: with CallerReads the caller reads its own answer,
// into its own buffer; an answer to another id is skipped, one over
// MaxPayload too, and its own over MaxPayload is 'message too big' with
// the connection kept; a deadline that passes ends the call and the
// connection.
func TestMuxConnRoundTrip(t *testing.T) {
	addr := frameServer(t, func(f Frame, reply func([]byte), _ net.Conn) {
		switch string(f.Service) {
		case "stray":
			reply(AppendReply(nil, f.ID+100, []byte("not yours")))
			reply(AppendReply(nil, f.ID, []byte("yours")))
		case "big": // over the default MaxPayload: another id's, then its own
			reply(AppendReply(nil, f.ID+100, make([]byte, 1<<20+1)))
			reply(AppendReply(nil, f.ID, make([]byte, 1<<20+2)))
		case "never":
		default:
			reply(AppendReply(nil, f.ID, f.Payload))
		}
	})
	m := dialMux(t, addr, MuxOptions{CallerReads: true})
	buf := make([]byte, 0, 64)
	for i := range 3 {
		want := bytes.Repeat([]byte{'a' + byte(i)}, 10*(i+1)*(i+1))
		f, b, err := m.RoundTrip(Header{Kind: KindCall}, "g", "echo", want, time.Now().Add(testDeadline), buf)
		if err != nil || !bytes.Equal(f.Payload, want) {
			t.Fatalf("round trip %d: %q, %v", i, f.Payload, err)
		}
		buf = b
	}
	if f, _, err := m.RoundTrip(Header{Kind: KindCall}, "g", "stray", nil, time.Time{}, buf); err != nil || string(f.Payload) != "yours" {
		t.Fatalf("round trip after a stray answer: %q, %v", f.Payload, err)
	}
	f, _, err := m.RoundTrip(Header{Kind: KindCall}, "g", "big", nil, time.Now().Add(testDeadline), buf)
	if err != nil || f.Kind != KindError || f.Code != CodeMessageTooBig || !strings.Contains(string(f.Payload), fmt.Sprint(1<<20+2)) {
		t.Fatalf("round trip answered over MaxPayload: %v %v %q, %v; want 'message too big' naming its size", f.Kind, f.Code, f.Payload, err)
	}
	if f, _, err := m.RoundTrip(Header{Kind: KindCall}, "g", "echo", []byte("after"), time.Now().Add(testDeadline), buf); err != nil || string(f.Payload) != "after" {
		t.Fatalf("round trip after one answered over MaxPayload: %q, %v", f.Payload, err)
	}
	_, _, err = m.RoundTrip(Header{Kind: KindCall}, "g", "never", nil, time.Now().Add(50*time.Millisecond), buf)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("round trip past its deadline: %v", err)
	}
	if m.Err() == nil {
		t.Error("the connection stays open after a round trip failed")
	}
}

// TestMuxConnRoundTripWriteLeavesAtItsDeadline: a round trip to a node
// that does not read returns at its deadline, os.ErrDeadlineExceeded,
// even while its frame is still being written, and closes the
// connection. Before, its write had no deadline (only its read had one)
// and the round trip waited for the node for ever.
func TestMuxConnRoundTripWriteLeavesAtItsDeadline(t *testing.T) {
	l, accepted := nodeNotReading(t)
	m := dialMux(t, l.Addr().String(), MuxOptions{CallerReads: true})
	defer func() {
		select {
		case nc := <-accepted:
			nc.Close()
		default:
		}
	}()
	type result struct {
		err  error
		took time.Duration
	}
	done := make(chan result, 1)
	go func() {
		start := time.Now()
		_, _, err := m.RoundTrip(Header{Kind: KindCall}, "g", "s", make([]byte, 16<<20), start.Add(300*time.Millisecond), nil)
		done <- result{err, time.Since(start)}
	}()
	select {
	case r := <-done:
		if !errors.Is(r.err, os.ErrDeadlineExceeded) || r.took > 3*time.Second {
			t.Errorf("round trip to a node that does not read: %v after %v; want os.ErrDeadlineExceeded at its deadline", r.err, r.took)
		}
	case <-time.After(5 * time.Second):
		m.Close(nil) // lets the round trip go
		<-done
		t.Fatal("the round trip did not return at its deadline: its write waited for the node")
	}
	if m.Err() == nil {
		t.Error("the connection stays open after a round trip failed")
	}
}

// TestMuxConnRetire: a retired connection refuses new calls as unsent,
// answers the calls sent before as usual and closes once the last is
// answered.
func TestMuxConnRetire(t *testing.T) {
	release := make(chan struct{})
	addr := frameServer(t, func(f Frame, reply func([]byte), _ net.Conn) {
		go func() { <-release; reply(AppendReply(nil, f.ID, f.Payload)) }()
	})
	m := dialMux(t, addr, MuxOptions{})
	a := newAnswers()
	for i := range 3 {
		if _, sent, err := m.Call(Header{Kind: KindCall}, "g", "s", []byte{byte(i)}, time.Time{}, a); !sent || err != nil {
			t.Fatalf("Call: %v, %v", sent, err)
		}
	}
	m.Retire()
	if _, sent, err := m.Call(Header{Kind: KindCall}, "g", "s", nil, time.Time{}, a); sent || !errors.Is(err, ErrGoingAway) {
		t.Errorf("a call after Retire: sent %v, %v; want unsent, ErrGoingAway", sent, err)
	}
	if !m.GoingAway() || m.Err() != nil {
		t.Errorf("retired: GoingAway %v, Err %v; want true, still open", m.GoingAway(), m.Err())
	}
	close(release)
	for range 3 {
		if r := a.next(t); r.err != nil {
			t.Errorf("a call sent before Retire: %v", r.err)
		}
	}
	select {
	case <-m.Done():
	case <-time.After(testDeadline):
		t.Fatal("the retired connection did not close after its last answer")
	}
	if a.count.Load() != 3 {
		t.Errorf("%d answers, want 3", a.count.Load())
	}
}

// TestMuxConnOversizeAnswer: an answer over MaxPayload fails only its own
// call, 'message too big' with the answer's size and the limit, as the
// node answers a call over its own limit; its bytes are skipped, and the
// connection and the calls waiting beside it go on. Before, the reader
// closed the connection and every call on it lost its answer.
func TestMuxConnOversizeAnswer(t *testing.T) {
	const limit = 1 << 10
	big := make(chan struct{})
	addr := frameServer(t, func(f Frame, reply func([]byte), _ net.Conn) {
		payload := bytes.Clone(f.Payload)
		if string(f.Service) == "big" {
			// An error frame, not a reply: its message counts too.
			reply(AppendError(nil, f.ID, CodeApplication, string(bytes.Repeat([]byte{'x'}, 3*limit))))
			close(big)
			return
		}
		go func() { // answered after the big one: behind its bytes
			<-big
			reply(AppendReply(nil, f.ID, payload))
		}()
	})
	var closed atomic.Int64
	m := dialMux(t, addr, MuxOptions{MaxPayload: limit, OnClose: func(*MuxConn, error) { closed.Add(1) }})
	a := newAnswers()
	for i := range 3 {
		if _, sent, err := m.Call(Header{Kind: KindCall}, "g", "s", []byte{'0' + byte(i)}, time.Time{}, a); !sent || err != nil {
			t.Fatalf("Call: %v, %v", sent, err)
		}
	}
	tooBig := newAnswers()
	if _, sent, err := m.Call(Header{Kind: KindCall}, "g", "big", nil, time.Time{}, tooBig); !sent || err != nil {
		t.Fatalf("Call: %v, %v", sent, err)
	}
	r := tooBig.next(t)
	if r.err != nil || r.f.Kind != KindError || r.f.Code != CodeMessageTooBig {
		t.Fatalf("the call answered over the limit: %v %v, %v; want an error frame 'message too big'", r.f.Kind, r.f.Code, r.err)
	}
	if msg := string(r.f.Payload); !strings.Contains(msg, fmt.Sprint(3*limit)) || !strings.Contains(msg, fmt.Sprint(limit)) {
		t.Errorf("message %q does not say the answer's size (%d) and the limit (%d)", msg, 3*limit, limit)
	}
	got := map[string]bool{}
	for range 3 {
		r := a.next(t)
		if r.err != nil {
			t.Fatalf("a call beside the big answer: %v", r.err)
		}
		got[string(r.f.Payload)] = true
	}
	if len(got) != 3 {
		t.Errorf("the calls beside got %v, want 0, 1 and 2", got)
	}
	if _, _, err := m.Call(Header{Kind: KindCall}, "g", "s", []byte("after"), time.Time{}, a); err != nil {
		t.Fatal(err)
	}
	if r := a.next(t); r.err != nil || string(r.f.Payload) != "after" {
		t.Errorf("a call after: %q, %v", r.f.Payload, r.err)
	}
	if m.Err() != nil || closed.Load() != 0 {
		t.Errorf("the connection closed: %v", m.Err())
	}
}

// TestMuxConnGoAwayWaitsForQueuedWrites: a call without an answer queued
// behind another call's write is written whole before a go-away closes
// the connection. Its caller was told it was sent; before, the close that
// followed the last answer cut the write under way (or left the frame
// unsent in the buffer), and the call was lost.
func TestMuxConnGoAwayWaitsForQueuedWrites(t *testing.T) {
	const size = 8 << 20
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	proceed := make(chan struct{})
	type outcome struct {
		frames []Frame
		err    error
	}
	served := make(chan outcome, 1)
	go func() {
		nc, err := l.Accept()
		if err != nil {
			served <- outcome{err: err}
			return
		}
		defer nc.Close()
		<-proceed // read nothing while A and C are queued
		fr := NewFrameReader(nc, 2*size)
		a, _, err := fr.Read(nil)
		if err != nil {
			served <- outcome{err: err}
			return
		}
		var out []byte
		out = AppendFrame(out, Header{Kind: KindGoAway}, "", "", nil)
		out = AppendReply(out, a.ID, []byte("a"))
		if _, err := nc.Write(out); err != nil {
			served <- outcome{err: err}
			return
		}
		time.Sleep(200 * time.Millisecond) // the answer and go-away are read meanwhile
		var frames []Frame
		for {
			f, _, err := fr.Read(nil)
			if err == io.EOF {
				break
			}
			if err != nil {
				served <- outcome{frames, err}
				return
			}
			frames = append(frames, f)
		}
		served <- outcome{frames, nil}
	}()
	m := dialMux(t, l.Addr().String(), MuxOptions{})
	a := newAnswers()
	aSent := make(chan error, 1)
	go func() {
		_, _, err := m.Call(Header{Kind: KindCall}, "g", "a", make([]byte, size), time.Time{}, a)
		aSent <- err
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(testDeadline); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatal(what)
			}
		}
	}
	waitFor("A's write did not begin", func() bool {
		m.wmu.Lock()
		defer m.wmu.Unlock()
		return m.flushing
	})
	if _, sent, err := m.Call(Header{Kind: KindCallNoReply}, "g", "c", bytes.Repeat([]byte{'c'}, size), time.Time{}, nil); !sent || err != nil {
		t.Fatalf("C: sent %v, %v", sent, err)
	}
	m.wmu.Lock()
	queued := len(m.wbuf)
	m.wmu.Unlock()
	if queued == 0 {
		t.Fatal("C was written at once, not queued behind A: the test needs A's write to block")
	}
	close(proceed)
	if r := a.next(t); r.err != nil || string(r.f.Payload) != "a" {
		t.Fatalf("A: %q, %v", r.f.Payload, r.err)
	}
	if err := <-aSent; err != nil {
		t.Errorf("A's writer: %v", err)
	}
	var o outcome
	select {
	case o = <-served:
	case <-time.After(testDeadline):
		t.Fatal("the connection did not close after the go-away")
	}
	if o.err != nil {
		t.Errorf("the node read %d frames after A, then %v", len(o.frames), o.err)
	}
	if len(o.frames) != 1 || string(o.frames[0].Service) != "c" || len(o.frames[0].Payload) != size {
		t.Errorf("the node read %d frames after A, want C whole", len(o.frames))
	}
	<-m.Done()
	if !errors.Is(m.Err(), ErrGoingAway) {
		t.Errorf("closed with %v, want ErrGoingAway", m.Err())
	}
}

// TestMuxConnCallsLeaveAtTheirDeadline: on a connection whose node does
// not read, the writer's call returns at its deadline, sent, while another
// goroutine writes the rest of its frame on; a call that would queue over
// MaxQueued waits for room and, its deadline passing, is not sent, and
// never answered. The connection stays open, and once the node reads, the
// frames sent arrive whole and the unsent one not at all. Before, the
// writer stayed in its write for ever and the queue grew without bound.
func TestMuxConnCallsLeaveAtTheirDeadline(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	read := make(chan struct{})
	got := make(chan []string, 1)
	finished := make(chan struct{}) // the node closes only then: its close is no finding
	defer close(finished)
	go func() {
		nc, err := l.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer func() { <-finished; nc.Close() }()
		<-read
		fr := NewFrameReader(nc, 16<<20)
		var services []string
		for {
			f, _, err := fr.Read(nil)
			if err != nil {
				break // after A and B, nothing more comes: the read times out
			}
			services = append(services, string(f.Service))
			if len(services) == 2 {
				nc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			}
		}
		got <- services
	}()
	m := dialMux(t, l.Addr().String(), MuxOptions{MaxQueued: 1 << 20})
	a, c := newAnswers(), newAnswers()
	type result struct {
		sent bool
		err  error
		took time.Duration
	}
	aDone := make(chan result, 1)
	payload := make([]byte, 8<<20)
	go func() {
		// A second, not less: a busy machine may stall this goroutine
		// between its start and the Call's look at the deadline, which
		// would then refuse A unsent.
		start := time.Now()
		_, sent, err := m.Call(Header{Kind: KindCall}, "g", "a", payload, start.Add(time.Second), a)
		aDone <- result{sent, err, time.Since(start)}
	}()
	waitForWrite(t, m, func() {
		select {
		case r := <-aDone:
			t.Fatalf("A returned before its write began: sent %v, %v after %v", r.sent, r.err, r.took)
		default:
		}
	})
	// B fits the empty queue whatever its size; C does not fit behind it.
	if _, sent, err := m.Call(Header{Kind: KindCallNoReply}, "g", "b", make([]byte, 2<<20), time.Time{}, nil); !sent || err != nil {
		t.Fatalf("B: sent %v, %v", sent, err)
	}
	start := time.Now()
	_, sent, err := m.Call(Header{Kind: KindCall}, "g", "c", make([]byte, 1<<10), start.Add(200*time.Millisecond), c)
	if took := time.Since(start); sent || !errors.Is(err, ErrWriteTimeout) || took > time.Second {
		t.Errorf("C, over the queue's bound: sent %v, %v after %v; want unsent, ErrWriteTimeout, at its deadline", sent, err, took)
	}
	r := <-aDone
	if !r.sent || !errors.Is(r.err, ErrWriteTimeout) || r.took > 3*time.Second {
		t.Errorf("A, the writer: sent %v, %v after %v; want sent, ErrWriteTimeout, at its deadline", r.sent, r.err, r.took)
	}
	if m.Err() != nil {
		t.Fatalf("the connection closed: %v", m.Err())
	}
	close(read)
	select {
	case services := <-got:
		if !slices.Equal(services, []string{"a", "b"}) {
			t.Errorf("the node read %q, want A and B whole", services)
		}
	case <-time.After(testDeadline):
		t.Fatal("the node did not read A and B")
	}
	if m.Err() != nil || c.count.Load() != 0 {
		t.Errorf("after: connection %v, C answered %d times (want open, 0)", m.Err(), c.count.Load())
	}
}

// TestMuxConnQueuedDeadlineBoundsTheWriteAhead: a call with a near
// deadline queued behind a write to a node that does not read bounds that
// write as if its frame were in it: by its deadline, and at least
// writePatience, the connection fails (ErrWriteTimeout) and the call is
// answered, and its owner can go to another node. Before, the write ahead
// kept its own bound (a minute here; a Go client's call without a deadline
// of its own is given WatchTime, 180 s by default, or none), the queued
// frame never left, and every call after it on the connection waited for
// room until its deadline and was refused, for as long.
func TestMuxConnQueuedDeadlineBoundsTheWriteAhead(t *testing.T) {
	l, accepted := nodeNotReading(t)
	m := dialMux(t, l.Addr().String(), MuxOptions{})
	defer func() {
		select {
		case nc := <-accepted:
			nc.Close()
		default:
		}
	}()
	a, b := newAnswers(), newAnswers()
	aDone := make(chan error, 1)
	go func() {
		_, _, err := m.Call(Header{Kind: KindCall}, "g", "a", make([]byte, 16<<20), time.Now().Add(time.Minute), a)
		aDone <- err
	}()
	waitForWrite(t, m, nil)
	start := time.Now()
	if _, sent, err := m.Call(Header{Kind: KindCall}, "g", "b", []byte("b"), start.Add(200*time.Millisecond), b); !sent || err != nil {
		t.Fatalf("B, queued behind A: sent %v, %v", sent, err)
	}
	select {
	case <-m.Done():
	case <-time.After(writePatience + 5*time.Second):
		t.Fatal("the connection is still open: the write ahead of B is not bounded by B's deadline")
	}
	if took := time.Since(start); took > writePatience+3*time.Second {
		t.Errorf("the connection failed %v after B was queued, want about writePatience (%v)", took, writePatience)
	}
	if !errors.Is(m.Err(), ErrWriteTimeout) {
		t.Errorf("closed with %v, want ErrWriteTimeout", m.Err())
	}
	if r := b.next(t); !errors.Is(r.err, ErrWriteTimeout) {
		t.Errorf("B answered %v, want the close reason", r.err)
	}
	if r := a.next(t); !errors.Is(r.err, ErrWriteTimeout) {
		t.Errorf("A answered %v, want the close reason", r.err)
	}
	if err := <-aDone; !errors.Is(err, ErrWriteTimeout) {
		t.Errorf("A's writer: %v", err)
	}
}

// nodeNotReading listens on loopback and hands over the one connection it
// accepts without ever reading from it (closed with the listener at the
// test's end).
func nodeNotReading(t *testing.T) (net.Listener, <-chan net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		nc, err := l.Accept()
		if err != nil {
			return
		}
		accepted <- nc // read nothing
	}()
	return l, accepted
}

// waitForWrite waits until m has a write under way (A's, in the tests that
// call it), running meanwhile, if set, at each look.
func waitForWrite(t *testing.T, m *MuxConn, meanwhile func()) {
	t.Helper()
	for end := time.Now().Add(testDeadline); ; time.Sleep(time.Millisecond) {
		m.wmu.Lock()
		flushing := m.flushing
		m.wmu.Unlock()
		if flushing {
			return
		}
		if meanwhile != nil {
			meanwhile()
		}
		if time.Now().After(end) {
			t.Fatal("A's write did not begin")
		}
	}
}
