package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func newSeg(t testing.TB, l Layout) *Segment {
	t.Helper()
	s, err := Create(t.Name(), l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); s.Unmap() })
	return s
}

func attach(t testing.TB, s *Segment, slot int) *Server {
	t.Helper()
	srv, err := AttachFile(s.File(), slot)
	if err != nil {
		t.Fatal(err)
	}
	srv.Handle("echo", func(req []byte) ([]byte, error) { return req, nil })
	t.Cleanup(func() { srv.Close() })
	return srv
}

// waitN collects n completions or fails after d.
func waitN(t testing.TB, s scheduleQueue, n int, d time.Duration) []Completion {
	t.Helper()
	var all []Completion
	end := time.Now().Add(d)
	buf := make([]Completion, 0, 16)
	for len(all) < n {
		if time.Now().After(end) {
			t.Fatalf("got %d of %d completions after %v", len(all), n, d)
		}
		all = append(all, s.WaitCompletions(buf, 50*time.Millisecond)...)
	}
	return all
}

func (s *Segment) freeCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.free)
}

func TestFIFO(t *testing.T) {
	s := newSeg(t, Layout{Slots: 8, MaxMessage: 64, Processes: 1})
	srv := attach(t, s, 0)
	var order []string
	srv.Handle("rec", func(req []byte) ([]byte, error) {
		order = append(order, string(req))
		return append(req, '!'), nil
	})
	var toks []Token
	for i := range 8 {
		tok, err := s.Enqueue("rec", []byte(fmt.Sprint(i)), time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, tok)
	}
	for range 8 {
		if err := srv.ServeOne(); err != nil {
			t.Fatal(err)
		}
	}
	cs := waitN(t, s, 8, time.Second)
	for i, c := range cs {
		if want := fmt.Sprint(i); order[i] != want || c.Token != toks[i] || string(c.Reply) != want+"!" || c.Status != StatusOK {
			t.Fatalf("completion %d: token %x status %v reply %q (served %q)", i, c.Token, c.Status, c.Reply, order[i])
		}
		s.Release(c.Token)
	}
	if st := s.Stats(); st.Queued != 8 || st.Taken != 8 || st.Done != 8 || st.Depth != 0 || st.Busy != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestExactCapacity(t *testing.T) {
	// Slots 5 is not a power of two; Processes 2 gives 7 buffers.
	s := newSeg(t, Layout{Slots: 5, MaxMessage: 16, Processes: 2})
	srv := attach(t, s, 0)
	for i := range 5 {
		if _, err := s.Enqueue("echo", []byte{byte(i)}, time.Time{}); err != nil {
			t.Fatalf("enqueue %d: %v", i, err)
		}
	}
	if _, err := s.Enqueue("echo", []byte{5}, time.Time{}); !errors.Is(err, ErrFull) {
		t.Fatalf("enqueue beyond Slots: %v, want ErrFull", err)
	}
	if d := s.Stats().Depth; d != 5 {
		t.Fatalf("depth %d", d)
	}
	// Taking one frees a slot, though its buffer stays held until Release.
	if err := srv.ServeOne(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Enqueue("echo", []byte{6}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Enqueue("echo", []byte{7}, time.Time{}); !errors.Is(err, ErrFull) {
		t.Fatalf("queue full again: %v", err)
	}
	// Serve everything, release nothing: 6 of 7 buffers held.
	for range 5 {
		srv.ServeOne()
	}
	cs := waitN(t, s, 6, time.Second)
	if _, err := s.Enqueue("echo", []byte{8}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	// All 7 buffers held, queue has room: ErrFull for want of a buffer.
	if _, err := s.Enqueue("echo", []byte{9}, time.Time{}); !errors.Is(err, ErrFull) {
		t.Fatalf("no buffer: %v", err)
	}
	s.Release(cs[0].Token)
	if _, err := s.Enqueue("echo", []byte{10}, time.Time{}); err != nil {
		t.Fatalf("after release: %v", err)
	}
}

func TestWrapAround(t *testing.T) {
	s := newSeg(t, Layout{Slots: 3, MaxMessage: 32, Processes: 1})
	srv := attach(t, s, 0)
	total := 0
	buf := make([]Completion, 0, 4)
	for i := 0; i < 10000; i++ {
		n := 1 + i%3
		for j := range n {
			msg := fmt.Appendf(nil, "%d.%d", i, j)
			if _, err := s.Enqueue("echo", msg, time.Time{}); err != nil {
				t.Fatalf("iteration %d: %v", i, err)
			}
		}
		for range n {
			if err := srv.ServeOne(); err != nil {
				t.Fatal(err)
			}
		}
		got := 0
		for got < n {
			cs := s.WaitCompletions(buf, time.Second)
			if len(cs) == 0 {
				t.Fatalf("iteration %d: timeout", i)
			}
			for _, c := range cs {
				if want := fmt.Sprintf("%d.%d", i, got); string(c.Reply) != want {
					t.Fatalf("reply %q, want %q", c.Reply, want)
				}
				s.Release(c.Token)
				got++
			}
		}
		total += n
	}
	if st := s.Stats(); st.Queued != uint64(total) || st.Taken != uint64(total) || st.Done != uint64(total) {
		t.Fatalf("stats %+v, want %d", st, total)
	}
	if f := s.freeCount(); f != 4 {
		t.Fatalf("free buffers %d, want 4", f)
	}
}

func TestConcurrent(t *testing.T) {
	const producers, consumers, perProducer = 4, 3, 3000
	s := newSeg(t, Layout{Slots: 16, MaxMessage: 64, Processes: consumers})
	var served sync.WaitGroup
	for i := range consumers {
		srv := attach(t, s, i)
		served.Add(1)
		go func() {
			defer served.Done()
			if err := srv.Serve(); err != nil {
				t.Error(err)
			}
		}()
	}
	var produced sync.WaitGroup
	for p := range producers {
		produced.Add(1)
		go func() {
			defer produced.Done()
			var msg [8]byte
			for i := 0; i < perProducer; i++ {
				binary.LittleEndian.PutUint64(msg[:], uint64(p)<<32|uint64(i))
				for {
					_, err := s.Enqueue("echo", msg[:], time.Time{})
					if err == nil {
						break
					}
					if !errors.Is(err, ErrFull) {
						t.Error(err)
						return
					}
					runtime.Gosched()
				}
			}
		}()
	}
	seen := make([][]bool, producers)
	for p := range seen {
		seen[p] = make([]bool, perProducer)
	}
	tokens := make(map[Token]bool)
	buf := make([]Completion, 0, 32)
	end := time.Now().Add(60 * time.Second)
	for got := 0; got < producers*perProducer; {
		if time.Now().After(end) {
			t.Fatalf("timeout after %d completions", got)
		}
		for _, c := range s.WaitCompletions(buf, 100*time.Millisecond) {
			if c.Status != StatusOK || len(c.Reply) != 8 {
				t.Fatalf("completion %+v", c)
			}
			v := binary.LittleEndian.Uint64(c.Reply)
			p, i := v>>32, uint32(v)
			if p >= producers || i >= perProducer || seen[p][i] {
				t.Fatalf("duplicate or bad reply %d/%d", p, i)
			}
			if tokens[c.Token] {
				t.Fatalf("token %x seen twice", c.Token)
			}
			seen[p][i], tokens[c.Token] = true, true
			s.Release(c.Token)
			got++
		}
	}
	produced.Wait()
	s.Close()
	served.Wait()
	if cs := s.WaitCompletions(buf, time.Second); len(cs) != 0 {
		t.Fatalf("extra completions %v", cs)
	}
}

func TestReleaseGeneration(t *testing.T) {
	s := newSeg(t, Layout{Slots: 1, MaxMessage: 16, Processes: 1})
	srv := attach(t, s, 0)
	free := s.freeCount()
	tok, err := s.Enqueue("echo", []byte("a"), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if tok == 0 {
		t.Fatal("zero token")
	}
	srv.ServeOne()
	waitN(t, s, 1, time.Second)
	s.Release(tok)
	s.Release(tok) // twice: no double free
	s.Release(0)
	s.Release(Token(1<<32 | 99)) // index out of range
	if f := s.freeCount(); f != free {
		t.Fatalf("free %d after double release, want %d", f, free)
	}
	tok2, err := s.Enqueue("echo", []byte("b"), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if tok2.index() != tok.index() || tok2 == tok {
		t.Fatalf("reuse: %x then %x", tok, tok2)
	}
	s.Release(tok) // stale: the buffer stays with tok2
	if f := s.freeCount(); f != free-1 {
		t.Fatalf("stale release freed a buffer")
	}
	srv.ServeOne()
	cs := waitN(t, s, 1, time.Second)
	if cs[0].Token != tok2 || string(cs[0].Reply) != "b" {
		t.Fatalf("completion %+v", cs[0])
	}
	s.Release(tok2)
	if f := s.freeCount(); f != free {
		t.Fatalf("free %d, want %d", f, free)
	}
}

func TestEnqueueErrors(t *testing.T) {
	s := newSeg(t, Layout{Slots: 4, MaxMessage: 100, Processes: 1})
	if _, err := s.Enqueue("echo", make([]byte, 101), time.Time{}); !errors.Is(err, ErrTooBig) {
		t.Fatalf("101 bytes: %v", err)
	}
	if _, err := s.Enqueue("echo", make([]byte, 100), time.Time{}); err != nil {
		t.Fatalf("100 bytes: %v", err)
	}
	if _, err := s.Enqueue(strings.Repeat("s", 33), nil, time.Time{}); !errors.Is(err, ErrNameTooLong) {
		t.Fatalf("33-byte name: %v", err)
	}
	if _, err := s.Enqueue(strings.Repeat("s", 32), nil, time.Time{}); err != nil {
		t.Fatalf("32-byte name: %v", err)
	}
	s.Close()
	if _, err := s.Enqueue("echo", nil, time.Time{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
	if _, err := Create("bad", Layout{Slots: 0, MaxMessage: 1, Processes: 1}); err == nil {
		t.Fatal("Slots 0 accepted")
	}
	if err := s.PrepareSlot(1); err == nil {
		t.Fatal("slot 1 of 1 accepted")
	}
}

func TestStatuses(t *testing.T) {
	s := newSeg(t, Layout{Slots: 8, MaxMessage: 64, Processes: 1})
	srv := attach(t, s, 0)
	called := false
	srv.Handle("fail", func(req []byte) ([]byte, error) { called = true; return nil, errors.New("boom") })
	srv.Handle("huge", func(req []byte) ([]byte, error) { return make([]byte, 65), nil })
	srv.Handle("grow", func(req []byte) ([]byte, error) { return append(req, " world"...), nil })
	cases := []struct {
		svc      string
		deadline time.Time
		st       Status
		reply    string
	}{
		{"fail", time.Time{}, StatusAppError, "boom"},
		{"nope", time.Time{}, StatusNoSuchService, ""},
		{"fail", time.Now().Add(-time.Second), StatusTimedOut, ""},
		{"huge", time.Time{}, StatusAppError, "reply too big"},
		{"grow", time.Now().Add(time.Hour), StatusOK, "hello world"},
	}
	for _, c := range cases {
		called = false
		if _, err := s.Enqueue(c.svc, []byte("hello"), c.deadline); err != nil {
			t.Fatal(err)
		}
		srv.ServeOne()
		cs := waitN(t, s, 1, time.Second)
		if cs[0].Status != c.st || string(cs[0].Reply) != c.reply {
			t.Errorf("%s: status %v reply %q, want %v %q", c.svc, cs[0].Status, cs[0].Reply, c.st, c.reply)
		}
		if c.st == StatusTimedOut && called {
			t.Errorf("handler ran past its deadline")
		}
		s.Release(cs[0].Token)
	}
}

func blocks(t *testing.T, s *Segment) int64 {
	var st unix.Stat_t
	if err := unix.Fstat(s.fd, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

func TestPunchHole(t *testing.T) {
	s := newSeg(t, Layout{Slots: 2, MaxMessage: 1 << 20, Processes: 1})
	srv := attach(t, s, 0)
	base := blocks(t, s)
	for _, tc := range []struct {
		size   int
		punish bool
	}{{300 << 10, true}, {100 << 10, false}} {
		req := bytes.Repeat([]byte{0xa5}, tc.size)
		tok, err := s.Enqueue("echo", req, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if used := blocks(t, s) - base; used < int64(tc.size) {
			t.Fatalf("%d bytes queued but only %d allocated", tc.size, used)
		}
		srv.ServeOne()
		cs := waitN(t, s, 1, time.Second)
		if !bytes.Equal(cs[0].Reply, req) {
			t.Fatal("reply differs")
		}
		s.Release(tok)
		used := blocks(t, s) - base
		if tc.punish && used != 0 {
			t.Fatalf("%d bytes still allocated after releasing a %d-byte request", used, tc.size)
		}
		if !tc.punish && used < int64(tc.size) {
			t.Fatalf("small buffer punched (%d bytes left)", used)
		}
	}
}

// The Reclaim cases below stop a UAP at each step of its dequeue and
// completion by doing the steps by hand, as if the process died there.

func TestReclaimDiedAfterClaimCAS(t *testing.T) {
	s := newSeg(t, Layout{Slots: 1, MaxMessage: 16, Processes: 2})
	dead := attach(t, s, 0)
	tok, _ := s.Enqueue("echo", []byte("x"), time.Time{})
	dead.cb.state.Store(stateIdle)
	if _, ok := dead.q.take(&dead.cb.claim); !ok {
		t.Fatal("nothing to take")
	}
	// Died before reading the entry: the slot is not released and the
	// 1-slot queue is full.
	if _, err := s.Enqueue("echo", []byte("y"), time.Time{}); !errors.Is(err, ErrFull) {
		t.Fatalf("queue should be stuck full: %v", err)
	}
	got, ok := s.Reclaim(0)
	if !ok || got != tok {
		t.Fatalf("Reclaim = %x %v, want %x", got, ok, tok)
	}
	s.Release(got)
	// The queue moves again.
	live := attach(t, s, 1)
	if _, err := s.Enqueue("echo", []byte("y"), time.Time{}); err != nil {
		t.Fatal(err)
	}
	live.ServeOne()
	if cs := waitN(t, s, 1, time.Second); string(cs[0].Reply) != "y" {
		t.Fatalf("reply %q", cs[0].Reply)
	}
	if got, ok := s.Reclaim(0); ok {
		t.Fatalf("second Reclaim = %x", got)
	}
}

func TestReclaimDiedBusy(t *testing.T) {
	s := newSeg(t, Layout{Slots: 2, MaxMessage: 16, Processes: 1})
	dead := attach(t, s, 0)
	tok, _ := s.Enqueue("echo", []byte("x"), time.Time{})
	pos, _ := dead.q.take(&dead.cb.claim)
	e := (*qEntry)(dead.q.entry(pos))
	dead.cb.token.Store(e.token)
	dead.cb.state.Store(stateBusy) // died before releasing the entry
	if st := s.Stats(); st.Busy != 1 || st.Depth != 0 {
		t.Fatalf("stats %+v", st)
	}
	got, ok := s.Reclaim(0)
	if !ok || got != tok {
		t.Fatalf("Reclaim = %x %v, want %x", got, ok, tok)
	}
	if seq := s.q.seq(pos).Load(); seq != freeSeq(pos+s.q.n) {
		t.Fatalf("entry not released: seq %d", seq)
	}
	if s.Stats().Busy != 0 {
		t.Fatal("still busy")
	}
}

func TestReclaimDiedBeforeCAS(t *testing.T) {
	s := newSeg(t, Layout{Slots: 2, MaxMessage: 16, Processes: 1})
	dead := attach(t, s, 0)
	s.Enqueue("echo", []byte("x"), time.Time{})
	dead.cb.state.Store(stateIdle)
	dead.cb.claim.Store(s.q.head.Load() + 1) // claim written, CAS never done
	if got, ok := s.Reclaim(0); ok {
		t.Fatalf("Reclaim = %x, want none", got)
	}
	if s.Stats().Depth != 1 {
		t.Fatal("request lost")
	}
}

func TestReclaimIdle(t *testing.T) {
	s := newSeg(t, Layout{Slots: 2, MaxMessage: 16, Processes: 1})
	srv := attach(t, s, 0)
	s.Enqueue("echo", []byte("x"), time.Time{})
	srv.ServeOne() // completed, idle
	if got, ok := s.Reclaim(0); ok {
		t.Fatalf("Reclaim = %x, want none", got)
	}
	if cs := waitN(t, s, 1, time.Second); cs[0].Status != StatusOK {
		t.Fatal(cs[0])
	}
}

// A live process inside its own CAS window on the same position must not be
// mistaken for the dead one.
func TestReclaimLiveClaimant(t *testing.T) {
	for _, liveWon := range []bool{false, true} {
		t.Run(fmt.Sprint("liveWon=", liveWon), func(t *testing.T) {
			s := newSeg(t, Layout{Slots: 2, MaxMessage: 16, Processes: 2})
			dead, live := attach(t, s, 0), attach(t, s, 1)
			tok, _ := s.Enqueue("echo", []byte("x"), time.Time{})
			dead.cb.state.Store(stateIdle)
			live.cb.state.Store(stateIdle)
			pos := s.q.head.Load()
			dead.cb.claim.Store(pos + 1)
			live.cb.claim.Store(pos + 1)
			s.q.head.Store(pos + 1) // somebody's CAS succeeded
			type result struct {
				tok Token
				ok  bool
			}
			done := make(chan result, 1)
			go func() {
				tok, ok := s.Reclaim(0)
				done <- result{tok, ok}
			}()
			select {
			case r := <-done:
				t.Fatalf("Reclaim decided %v while the live claimant was undecided", r)
			case <-time.After(20 * time.Millisecond):
			}
			if liveWon {
				s.q.release(pos) // the live one finishes its take
			}
			live.cb.claim.Store(0)
			r := <-done
			if liveWon && r.ok {
				t.Fatalf("Reclaim = %x, but the live process took it", r.tok)
			}
			if !liveWon && (!r.ok || r.tok != tok) {
				t.Fatalf("Reclaim = %v, want %x", r, tok)
			}
		})
	}
}

func TestReclaimCompletionReserved(t *testing.T) {
	s := newSeg(t, Layout{Slots: 2, MaxMessage: 16, Processes: 2})
	dead, live := attach(t, s, 0), attach(t, s, 1)
	t1, _ := s.Enqueue("echo", []byte("1"), time.Time{})
	t2, _ := s.Enqueue("echo", []byte("2"), time.Time{})
	// dead takes t1 and dies after reserving its completion entry.
	pos, _ := dead.q.take(&dead.cb.claim)
	dead.cb.token.Store((*qEntry)(dead.q.entry(pos)).token)
	dead.cb.state.Store(stateBusy)
	dead.q.release(pos)
	dead.cb.claim.Store(0)
	if _, ok := dead.c.reserve(&dead.cb.compClaim); !ok {
		t.Fatal("completion ring full")
	}
	live.ServeOne() // t2 completes behind the stuck entry
	if cs := s.WaitCompletions(nil, 20*time.Millisecond); len(cs) != 0 {
		t.Fatalf("completion visible past an unpublished entry: %v", cs)
	}
	got, ok := s.Reclaim(0)
	if !ok || got != t1 {
		t.Fatalf("Reclaim = %x %v, want %x", got, ok, t1)
	}
	cs := waitN(t, s, 1, time.Second)
	if len(cs) != 1 || cs[0].Token != t2 || string(cs[0].Reply) != "2" {
		t.Fatalf("completions %+v", cs)
	}
}

// A process that pushed its completion and died before going idle is
// reported twice; after Release the late completion is dropped.
func TestReclaimAndCompletionDedup(t *testing.T) {
	s := newSeg(t, Layout{Slots: 2, MaxMessage: 16, Processes: 1})
	dead := attach(t, s, 0)
	tok, _ := s.Enqueue("echo", []byte("x"), time.Time{})
	pos, _ := dead.q.take(&dead.cb.claim)
	dead.cb.token.Store(uint64(tok))
	dead.cb.state.Store(stateBusy)
	dead.q.release(pos)
	dead.cb.claim.Store(0)
	dead.complete(tok, StatusOK, 1) // died before state idle
	got, ok := s.Reclaim(0)
	if !ok || got != tok {
		t.Fatalf("Reclaim = %x %v", got, ok)
	}
	s.Release(got)
	if cs := s.WaitCompletions(nil, 10*time.Millisecond); len(cs) != 0 {
		t.Fatalf("stale completion delivered: %+v", cs)
	}
}

func TestAttachErrors(t *testing.T) {
	s := newSeg(t, Layout{Slots: 2, MaxMessage: 16, Processes: 1})
	attach(t, s, 0)
	if _, err := AttachFile(s.File(), 0); err == nil {
		t.Fatal("second attach to a used slot accepted")
	}
	if _, err := AttachFile(s.File(), 1); err == nil {
		t.Fatal("slot out of range accepted")
	}
	t.Setenv("TPSCHED_PROC_SLOT", "")
	t.Setenv("TPSCHED_SHM_FD", "")
	if _, err := Attach(); err == nil {
		t.Fatal("Attach without a number accepted")
	}
}

func TestNoAllocs(t *testing.T) {
	s := newSeg(t, Layout{Slots: 4, MaxMessage: 4096, Processes: 1})
	srv := attach(t, s, 0)
	req := make([]byte, 128)
	buf := make([]Completion, 0, 8)
	allocs := testing.AllocsPerRun(1000, func() {
		tok, err := s.Enqueue("echo", req, time.Now().Add(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.ServeOne(); err != nil {
			t.Fatal(err)
		}
		cs := s.WaitCompletions(buf, time.Second)
		if len(cs) != 1 {
			t.Fatal("no completion")
		}
		s.Release(tok)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per round trip", allocs)
	}
}

func TestSpinEnv(t *testing.T) {
	for v, want := range map[string]time.Duration{"": defaultSpin, "0": 0, "30": 30 * time.Microsecond, "x": defaultSpin, "5000": time.Millisecond} {
		if got := spinMaxFromEnv(v); got != want {
			t.Errorf("TPSCHED_SPIN_US=%q: %v, want %v", v, got, want)
		}
	}
}

func TestSpinnerAdapts(t *testing.T) {
	sp := spinner{budget: 2 * time.Microsecond, max: 40 * time.Microsecond}
	for range 20 {
		sp.learn(0) // spinning found work
	}
	if sp.budget != sp.max {
		t.Fatalf("budget %v after successes, want %v", sp.budget, sp.max)
	}
	for range 20 {
		sp.learn(-1) // work came only after sleeping, or never
	}
	if sp.budget != sp.max/16 {
		t.Fatalf("budget %v after misses, want %v", sp.budget, sp.max/16)
	}
	never := spinner{}
	never.learn(0)
	if never.budget != 0 || never.spin(time.Now(), func() bool { return true }) {
		t.Fatal("max 0 spins")
	}
	start := time.Now()
	if sp.spin(start, func() bool { return false }) || time.Since(start) < sp.budget {
		t.Fatal("spin gave up early")
	}
}
