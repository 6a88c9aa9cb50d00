package rpcport

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tpsched/netio"
)

// delayHandler answers each call from another goroutine after the number
// of milliseconds its payload starts with ("25 ..."), or at once (SendNow)
// when it starts with "now".
type delayHandler struct{ answered atomic.Int64 }

func (h *delayHandler) OnFrame(c *Conn, f netio.Frame) {
	if f.Kind != netio.KindCall {
		return
	}
	reply := netio.AppendReply(nil, f.ID, f.Payload)
	if bytes.HasPrefix(f.Payload, []byte("now")) {
		c.SendNow(reply)
		h.answered.Add(1)
		return
	}
	ms, _ := strconv.Atoi(string(bytes.Fields(f.Payload)[0]))
	go func() {
		time.Sleep(time.Duration(ms) * time.Millisecond)
		_ = c.Send(reply)
		h.answered.Add(1)
	}()
}

func (h *delayHandler) OnClose(*Conn) {}

// readAll reads answers until the connection ends and says how it ended.
func readAll(t *testing.T, c net.Conn) (map[uint64]netio.Frame, error) {
	t.Helper()
	got := map[uint64]netio.Frame{}
	r := bufio.NewReader(c)
	for {
		f, err := readFrame(r)
		if err != nil {
			return got, err
		}
		if _, dup := got[f.ID]; dup {
			t.Fatalf("two answers for id %d", f.ID)
		}
		got[f.ID] = f
	}
}

// TestHalfCloseGetsAnswers: a caller that sends its calls and then shuts
// its write side (shutdown(SHUT_WR)) gets every answer, then a clean end.
// gnet reads the caller's FIN as the end of the connection; netio keeps it
// writable until its answers are out. (Before: 0 answers of 4.)
func TestHalfCloseGetsAnswers(t *testing.T) {
	h := &delayHandler{}
	s := startServer(t, Options{Loops: 2, MaxPayload: 1 << 20}, h)
	for _, tc := range []struct {
		name  string
		calls int
		arg   func(i int) string
	}{
		{"four-late", 4, func(int) string { return "50" }},
		{"fifty-mixed", 50, func(i int) string { return []string{"now", "0", "10", "100"}[i%4] }},
		{"large-answers", 20, func(i int) string { return fmt.Sprintf("%d %s", i%3*20, bytes.Repeat([]byte("x"), 200<<10)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, s.Addr())
			var batch []byte
			for i := range tc.calls {
				batch = append(batch, callFrame(uint64(i+1), []byte(tc.arg(i)))...)
			}
			if _, err := c.Write(batch); err != nil {
				t.Fatal(err)
			}
			if err := c.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			if tc.name == "large-answers" {
				time.Sleep(200 * time.Millisecond) // the answers fill the socket; the rest waits in netio
			}
			got, err := readAll(t, c)
			if !errors.Is(err, io.EOF) {
				t.Errorf("the connection ended with %v, not a clean close", err)
			}
			for i := range tc.calls {
				f, ok := got[uint64(i+1)]
				if !ok || f.Kind != netio.KindReply || string(f.Payload) != tc.arg(i) {
					t.Errorf("call %d: answered %v (%v)", i+1, ok, f.Kind)
				}
			}
			t.Logf("%d calls, %d answered after the half-close", tc.calls, len(got))
		})
	}
	waitFor(t, "every half-closed connection to end", func() bool { return s.Stats().Conns == 0 })
	if n := s.Stats().Undelivered; n != 0 {
		t.Errorf("Stats().Undelivered = %d", n)
	}
}

// TestHalfCloseThenReset: a caller that half-closes and then resets before
// its answers come ends its connection at the next write; the answers are
// counted undelivered and the connection's slot is free again.
func TestHalfCloseThenReset(t *testing.T) {
	h := &delayHandler{}
	s := startServer(t, Options{}, h)
	c := dial(t, s.Addr())
	var batch []byte
	for i := range 3 {
		batch = append(batch, callFrame(uint64(i+1), []byte("100"))...)
	}
	if _, err := c.Write(batch); err != nil {
		t.Fatal(err)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	time.Sleep(30 * time.Millisecond)
	_ = c.(*net.TCPConn).SetLinger(0)
	c.Close()
	waitFor(t, "the answers", func() bool { return h.answered.Load() == 3 })
	waitFor(t, "the connection gone", func() bool { return s.Stats().Conns == 0 })
	if n := s.Stats().Undelivered; n == 0 {
		t.Errorf("no answer counted undelivered")
	}
}

// TestStopWhileCallerWrites: a caller that writes calls without pause
// (it takes no go-away, as a bare socket would not) through Stop gets an
// answer for every call the node read, and a clean close after them: no
// reset, no answer dropped. A call with no answer at the clean close was
// not read, never ran, and may be sent again.
func TestStopWhileCallerWrites(t *testing.T) {
	h := &delayHandler{}
	s, err := Listen(Options{Addr: "127.0.0.1:0", Loops: 2, MaxPayload: 1 << 20}, h)
	if err != nil {
		t.Fatal(err)
	}
	const callers = 4
	type result struct {
		sent, answered int
		end            error
	}
	results := make([]result, callers)
	var wg sync.WaitGroup
	var reading sync.WaitGroup
	for i := range callers {
		c := dial(t, s.Addr())
		reading.Add(1)
		wg.Go(func() {
			var sent atomic.Int64
			stop := make(chan struct{})
			go func() {
				// Calls of 16 KiB with answers of the same size: answers
				// queue in netio and in the socket when Stop comes.
				payload := append([]byte("now "), bytes.Repeat([]byte("y"), 16<<10)...)
				for id := uint64(1); ; id++ {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := c.Write(callFrame(id, payload)); err != nil {
						return
					}
					sent.Add(1)
				}
			}()
			got, err := readAllSlow(c, &reading)
			close(stop)
			results[i] = result{sent: int(sent.Load()), answered: got, end: err}
		})
	}
	reading.Wait()
	time.Sleep(100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, r := range results {
		t.Logf("caller %d: %d calls written, %d answered, ended with %v", i, r.sent, r.answered, r.end)
		if !errors.Is(r.end, io.EOF) {
			t.Errorf("caller %d: the connection ended with %v, not a clean close", i, r.end)
		}
	}
	if n := s.Stats().Undelivered; n != 0 {
		t.Errorf("Stats().Undelivered = %d: answers owed were dropped", n)
	}
}

// readAllSlow reads answers (checking each id comes once, in order) until
// the connection ends, a little slowly so that answers wait in the
// server; ready is done after the first answer.
func readAllSlow(c net.Conn, ready *sync.WaitGroup) (int, error) {
	r := bufio.NewReaderSize(c, 4<<10)
	n := 0
	for next := uint64(1); ; next++ {
		f, err := readFrame(r)
		if err != nil {
			if n == 0 {
				ready.Done()
			}
			return n, err
		}
		if f.ID != next {
			return n, fmt.Errorf("answer %d, want %d", f.ID, next)
		}
		n++
		if n == 1 {
			ready.Done()
		}
		if n%8 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
}
