package shm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

const helperEnv = "TPSCHED_SHM_TEST_UAP"

// TestHelperUAP is not a test: it is the UAP process that the cross-process
// tests start by re-executing the test binary.
func TestHelperUAP(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("helper process for the cross-process tests")
	}
	srv, err := Attach()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	srv.Handle("echo", func(req []byte) ([]byte, error) { return req, nil })
	srv.Handle("fail", func(req []byte) ([]byte, error) { return nil, errors.New("failed: " + string(req)) })
	srv.Handle("huge", func(req []byte) ([]byte, error) { return make([]byte, srv.MaxMessage()+1), nil })
	srv.Handle("sleep", func(req []byte) ([]byte, error) {
		d, err := time.ParseDuration(string(req))
		if err != nil {
			return nil, err
		}
		time.Sleep(d)
		return req, nil
	})
	if err := srv.Serve(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	os.Exit(0)
}

type uap struct {
	cmd  *exec.Cmd
	done chan error
}

// startUAP runs the helper UAP in control block slot, killed at cleanup.
func startUAP(tb testing.TB, s *Segment, slot int, env ...string) *uap {
	tb.Helper()
	if err := s.PrepareSlot(slot); err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperUAP$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=1", "TPSCHED_SHM_FD=3",
		"TPSCHED_PROC_SLOT="+strconv.Itoa(slot))
	cmd.Env = append(cmd.Env, env...)
	cmd.ExtraFiles = []*os.File{s.File()}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	u := &uap{cmd: cmd, done: make(chan error, 1)}
	go func() { u.done <- cmd.Wait() }()
	tb.Cleanup(func() {
		cmd.Process.Kill()
		<-u.done
	})
	return u
}

func (u *uap) wait(tb testing.TB, d time.Duration) error {
	tb.Helper()
	select {
	case err := <-u.done:
		u.done <- err
		return err
	case <-time.After(d):
		tb.Fatalf("UAP pid %d still running after %v", u.cmd.Process.Pid, d)
		return nil
	}
}

// poll waits for cond, failing the test at ctx's deadline.
func poll(ctx context.Context, tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	for !cond() {
		if ctx.Err() != nil {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestCrossProcessEcho(t *testing.T) {
	s := newSeg(t, Layout{Slots: 32, MaxMessage: 1 << 20, Processes: 2})
	startUAP(t, s, 0)
	startUAP(t, s, 1)
	echoLoad(t, s, 10000, 24, 1)
}

// echoLoad sends n echo requests of 1 B .. 1 MiB (the first two are the
// extremes), at most window in flight, through q and checks every reply
// byte and the counters afterwards.
func echoLoad(t *testing.T, q scheduleQueue, n, window int, seed uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	rng := rand.New(rand.NewPCG(seed, 2))
	src := make([]byte, 2<<20)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	type want struct{ off, size int }
	pending := make(map[Token]want)
	buf := make([]Completion, 0, 64)
	sent, got, moved := 0, 0, 0
	for got < n {
		if ctx.Err() != nil {
			t.Fatalf("timeout: sent %d, got %d", sent, got)
		}
		for sent < n && len(pending) < window {
			size := min(1+rng.IntN(1<<rng.IntN(21)), 1<<20)
			switch sent {
			case 0:
				size = 1
			case 1:
				size = 1 << 20
			}
			off := rng.IntN(len(src) - size + 1)
			tok, err := q.Enqueue("echo", src[off:off+size], time.Time{})
			if errors.Is(err, ErrFull) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			pending[tok] = want{off, size}
			sent++
		}
		for _, c := range q.WaitCompletions(buf, 100*time.Millisecond) {
			w, ok := pending[c.Token]
			if !ok {
				t.Fatalf("unknown token %x", c.Token)
			}
			if c.Status != StatusOK || !bytes.Equal(c.Reply, src[w.off:w.off+w.size]) {
				t.Fatalf("request of %d bytes: status %v, reply of %d bytes differs", w.size, c.Status, len(c.Reply))
			}
			moved += w.size
			delete(pending, c.Token)
			q.Release(c.Token)
			got++
		}
	}
	if st := q.Stats(); st.Queued != uint64(n) || st.Taken != uint64(n) || st.Done != uint64(n) || st.Depth != 0 || st.Busy != 0 {
		t.Fatalf("stats %+v", st)
	}
	t.Logf("%d requests, %d MiB echoed", n, moved>>20)
}

func TestCrossProcessStatuses(t *testing.T) {
	s := newSeg(t, Layout{Slots: 8, MaxMessage: 4096, Processes: 1})
	startUAP(t, s, 0)
	checkStatuses(t, s)
}

// checkStatuses sends a request for each completion status through q,
// whose one UAP is the test helper, and checks status and reply.
func checkStatuses(t *testing.T, q scheduleQueue) {
	t.Helper()
	cases := []struct {
		svc, req string
		deadline time.Time
		st       Status
		reply    string
	}{
		{"echo", "hi", time.Now().Add(time.Minute), StatusOK, "hi"},
		{"fail", "x", time.Time{}, StatusAppError, "failed: x"},
		{"nope", "x", time.Time{}, StatusNoSuchService, ""},
		{"sleep", "1h", time.Now().Add(-time.Millisecond), StatusTimedOut, ""},
		{"huge", "", time.Time{}, StatusAppError, "reply too big"},
		{"echo", "", time.Time{}, StatusOK, ""},
	}
	for _, c := range cases {
		tok, err := q.Enqueue(c.svc, []byte(c.req), c.deadline)
		if err != nil {
			t.Fatal(err)
		}
		cs := waitN(t, q, 1, 10*time.Second)
		if cs[0].Token != tok || cs[0].Status != c.st || string(cs[0].Reply) != c.reply {
			t.Errorf("%s: status %v reply %q, want %v %q", c.svc, cs[0].Status, cs[0].Reply, c.st, c.reply)
		}
		q.Release(tok)
	}
}

func TestCrossProcessCloseDrains(t *testing.T) {
	s := newSeg(t, Layout{Slots: 32, MaxMessage: 64, Processes: 1})
	checkCloseDrains(t, s, startUAP(t, s, 0))
}

// checkCloseDrains queues 20 requests for u, the one UAP of q, closes q and
// checks that they are all served, that u exits 0, and that q is then
// drained and idle.
func checkCloseDrains(t *testing.T, q scheduleQueue, u *uap) {
	t.Helper()
	for range 20 {
		if _, err := q.Enqueue("sleep", []byte("1ms"), time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	q.Close()
	if _, err := q.Enqueue("echo", nil, time.Time{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Enqueue after Close: %v", err)
	}
	cs := waitN(t, q, 20, 20*time.Second)
	for _, c := range cs {
		if c.Status != StatusOK {
			t.Fatalf("status %v", c.Status)
		}
		q.Release(c.Token)
	}
	if err := u.wait(t, 10*time.Second); err != nil {
		t.Fatalf("UAP exit: %v", err)
	}
	start := time.Now()
	if cs := q.WaitCompletions(nil, 5*time.Second); len(cs) != 0 || time.Since(start) > time.Second {
		t.Fatalf("WaitCompletions on a closed, drained queue: %v after %v", cs, time.Since(start))
	}
	if got, ok := q.Reclaim(0); ok {
		t.Fatalf("Reclaim after a clean exit = %x", got)
	}
	if st := q.Stats(); st.Done != 20 || st.Depth != 0 || st.Busy != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// RequestStop lets the process finish the request it holds, then its
// Serve returns and the process exits 0; queued requests stay for others.
func TestCrossProcessRequestStop(t *testing.T) {
	s := newSeg(t, Layout{Slots: 8, MaxMessage: 64, Processes: 2})
	checkRequestStop(t, s, startUAP(t, s, 0), func() int { startUAP(t, s, 1); return 1 })
}

// checkRequestStop stops u, the one UAP of q (slot 0), while it serves a
// request: that request completes, u exits 0, the request queued behind it
// stays queued and is served by the process next starts, in the slot next
// returns.
func checkRequestStop(t *testing.T, q scheduleQueue, u *uap, next func() int) {
	t.Helper()
	if _, err := q.Enqueue("sleep", []byte("200ms"), time.Time{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	poll(ctx, t, "the UAP to take the sleep", func() bool { return q.SlotInfo(0).State == SlotBusy })
	q.RequestStop(0)
	if _, err := q.Enqueue("echo", []byte("left for another"), time.Time{}); err != nil {
		t.Fatal(err)
	}
	cs := waitN(t, q, 1, 10*time.Second)
	if cs[0].Status != StatusOK || string(cs[0].Reply) != "200ms" {
		t.Fatalf("the request in hand: %v %q", cs[0].Status, cs[0].Reply)
	}
	q.Release(cs[0].Token)
	if err := u.wait(t, 10*time.Second); err != nil {
		t.Fatalf("stopped UAP exit: %v", err)
	}
	if got := q.Stats().Depth; got != 1 {
		t.Fatalf("queue depth after the stop %d, want the echo still queued", got)
	}
	if _, ok := q.Reclaim(0); ok {
		t.Fatal("a stopped process held a request")
	}
	slot := next() // another process takes what is left
	cs = waitN(t, q, 1, 10*time.Second)
	if string(cs[0].Reply) != "left for another" {
		t.Fatalf("got %q", cs[0].Reply)
	}
	// The completion is pushed before the control block says idle.
	poll(ctx, t, "the next process idle after serving 1", func() bool {
		info := q.SlotInfo(slot)
		return info.Served == 1 && info.State == SlotIdle
	})
}

// In refresh mode a process serves one request and exits 0.
func TestCrossProcessRefresh(t *testing.T) {
	s := newSeg(t, Layout{Slots: 8, MaxMessage: 64, Processes: 1})
	for i := range 3 {
		if _, err := s.Enqueue("echo", []byte{byte(i)}, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		u := startUAP(t, s, 0, "TPSCHED_REFRESH=1")
		cs := waitN(t, s, 1, 10*time.Second)
		if cs[0].Reply[0] != byte(i) {
			t.Fatalf("refresh %d served %v", i, cs[0].Reply)
		}
		s.Release(cs[0].Token)
		if err := u.wait(t, 10*time.Second); err != nil {
			t.Fatalf("refresh process %d exit: %v", i, err)
		}
		if got := s.Stats().Depth; got != 2-i {
			t.Fatalf("after refresh process %d the queue holds %d, want %d", i, got, 2-i)
		}
	}
}

func TestCrossProcessKill(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := newSeg(t, Layout{Slots: 4, MaxMessage: 64, Processes: 1})

	// Killed inside a slow handler: Reclaim names that request.
	u := startUAP(t, s, 0)
	tok, err := s.Enqueue("sleep", []byte("1h"), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	poll(ctx, t, "the UAP to take the request", func() bool { return s.Stats().Busy == 1 })
	u.cmd.Process.Signal(syscall.SIGKILL)
	u.wait(t, 10*time.Second)
	got, ok := s.Reclaim(0)
	if !ok || got != tok {
		t.Fatalf("Reclaim = %x %v, want %x", got, ok, tok)
	}
	s.Release(got)

	// Killed while idle: nothing to reclaim.
	u = startUAP(t, s, 0)
	poll(ctx, t, "the UAP to go idle", func() bool { return s.cb(0).state.Load() == stateIdle })
	time.Sleep(20 * time.Millisecond) // asleep on the futex by now
	u.cmd.Process.Signal(syscall.SIGKILL)
	u.wait(t, 10*time.Second)
	if got, ok := s.Reclaim(0); ok {
		t.Fatalf("Reclaim of an idle UAP = %x", got)
	}

	// The queue still works.
	startUAP(t, s, 0)
	if _, err := s.Enqueue("echo", []byte("after"), time.Time{}); err != nil {
		t.Fatal(err)
	}
	if cs := waitN(t, s, 1, 10*time.Second); string(cs[0].Reply) != "after" {
		t.Fatalf("reply %q", cs[0].Reply)
	}
}

func BenchmarkRoundTripCrossProcess(b *testing.B) {
	for _, size := range []int{128, 4096} {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			s := newSeg(b, Layout{Slots: 64, MaxMessage: 64 << 10, Processes: 1})
			startUAP(b, s, 0)
			req := make([]byte, size)
			buf := make([]Completion, 0, 80)
			roundTrip := func() {
				tok, err := s.Enqueue("echo", req, time.Time{})
				if err != nil {
					b.Fatal(err)
				}
				for {
					cs := s.WaitCompletions(buf, 5*time.Second)
					if len(cs) == 1 && cs[0].Token == tok && len(cs[0].Reply) == size {
						break
					}
					if len(cs) != 0 {
						b.Fatalf("completions %+v", cs)
					}
				}
				s.Release(tok)
			}
			for range 100 { // the UAP is up and warm
				roundTrip()
			}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				roundTrip()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/roundtrip")
		})
	}
}

// BenchmarkRingSameProcess is the cost of the queue itself: Enqueue, take,
// in-place echo, completion, WaitCompletions and Release on one goroutine
// (no wake-ups, no second process).
func BenchmarkRingSameProcess(b *testing.B) {
	for _, size := range []int{128, 4096} {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			s := newSeg(b, Layout{Slots: 64, MaxMessage: 64 << 10, Processes: 1})
			srv := attach(b, s, 0)
			req := make([]byte, size)
			buf := make([]Completion, 0, 80)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				tok, err := s.Enqueue("echo", req, time.Time{})
				if err != nil {
					b.Fatal(err)
				}
				if err := srv.ServeOne(); err != nil {
					b.Fatal(err)
				}
				if cs := s.WaitCompletions(buf, time.Second); len(cs) != 1 {
					b.Fatal("no completion")
				}
				s.Release(tok)
			}
		})
	}
}

// BenchmarkPipelinedCrossProcess keeps the queue busy (32 requests in
// flight) to show throughput rather than latency.
func BenchmarkPipelinedCrossProcess(b *testing.B) {
	s := newSeg(b, Layout{Slots: 64, MaxMessage: 4096, Processes: 1})
	startUAP(b, s, 0)
	req := make([]byte, 128)
	buf := make([]Completion, 0, 80)
	inflight, done := 0, 0
	b.ReportAllocs()
	for b.Loop() {
		for inflight < 32 {
			if _, err := s.Enqueue("echo", req, time.Time{}); err != nil {
				b.Fatal(err)
			}
			inflight++
		}
		for _, c := range s.WaitCompletions(buf, 5*time.Second) {
			s.Release(c.Token)
			inflight--
			done++
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(max(done, 1)), "ns/request")
}
