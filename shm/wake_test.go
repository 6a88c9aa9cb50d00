package shm

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestNoLostWakeups drives several sleeping UAPs and a sleeping reply
// reader with bursts from two producers. With the futex sleep bound raised
// to 10 s, a lost wake-up would stall a request for seconds; every request
// must complete without such a stall.
func TestNoLostWakeups(t *testing.T) {
	for _, resident := range []int{3, 1} {
		t.Run(fmt.Sprintf("%d of 3 resident", resident), func(t *testing.T) { noLostWakeups(t, resident) })
	}
}

func noLostWakeups(t *testing.T, resident int) {
	old := maxSleep
	maxSleep = 10 * time.Second
	t.Cleanup(func() { maxSleep = old })

	s := newSeg(t, Layout{Slots: 16, MaxMessage: 64, Processes: 3, Resident: resident})
	var serving sync.WaitGroup
	for slot := range 3 {
		srv := attach(t, s, slot)
		srv.Handle("echo", func(req []byte) ([]byte, error) { return req, nil })
		serving.Add(1)
		go func() { defer serving.Done(); _ = srv.Serve() }()
	}
	const perProducer = 1500
	var sent, done atomic.Int64
	var producers sync.WaitGroup
	for p := range 2 {
		producers.Add(1)
		go func() {
			defer producers.Done()
			r := rand.New(rand.NewPCG(uint64(p), 7))
			for i := 0; i < perProducer; {
				for burst := 1 + r.IntN(5); burst > 0 && i < perProducer; burst-- {
					if _, err := s.Enqueue("echo", []byte{byte(i)}, time.Time{}); err != nil {
						time.Sleep(50 * time.Microsecond) // full: let the UAPs catch up
						continue
					}
					sent.Add(1)
					i++
				}
				// Gaps long enough for every UAP and the reader to fall asleep.
				time.Sleep(time.Duration(r.IntN(300)) * time.Microsecond)
			}
		}()
	}
	var comps []Completion
	lastProgress := time.Now()
	for done.Load() < 2*perProducer {
		comps = s.WaitCompletions(comps[:0], 50*time.Millisecond)
		for _, c := range comps {
			s.Release(c.Token)
		}
		if len(comps) > 0 {
			done.Add(int64(len(comps)))
			lastProgress = time.Now()
		} else if time.Since(lastProgress) > 2*time.Second && done.Load() < sent.Load() {
			t.Fatalf("stalled for 2 s with %d of %d sent requests done: a wake-up was lost",
				done.Load(), sent.Load())
		}
	}
	producers.Wait()
	s.Close()
	serving.Wait()
}

// A sleeping resident process is woken before a non-resident one, so that
// at light load the non-resident processes stay idle (and the Multiserver
// rule can stop them); they take work when the residents are busy.
func TestResidentWokenFirst(t *testing.T) {
	s := newSeg(t, Layout{Slots: 16, MaxMessage: 64, Processes: 2, Resident: 1})
	var serving sync.WaitGroup
	for slot := range 2 {
		srv := attach(t, s, slot)
		srv.Handle("echo", func(req []byte) ([]byte, error) { return req, nil })
		srv.Handle("sleep", func(req []byte) ([]byte, error) { time.Sleep(time.Second); return req, nil })
		serving.Add(1)
		go func() { defer serving.Done(); _ = srv.Serve() }()
	}
	t.Cleanup(func() { s.Close(); serving.Wait() })
	call := func(service string) {
		t.Helper()
		if _, err := s.Enqueue(service, []byte("x"), time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	asleep := func() {
		t.Helper()
		end := time.Now().Add(5 * time.Second)
		for s.hdr.qWait.waiters.Load() != 1 || s.hdr.xWait.waiters.Load() != 1 {
			if time.Now().After(end) {
				t.Fatal("the processes did not fall asleep")
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	for range 20 {
		asleep() // both processes sleep: the one to wake is the resident
		call("echo")
		for _, c := range waitN(t, s, 1, 5*time.Second) {
			s.Release(c.Token)
		}
	}
	// Served counts after the completion is pushed: let it catch up.
	served := func(want0, want1 uint64) bool {
		end := time.Now().Add(5 * time.Second)
		for time.Now().Before(end) {
			if s.SlotInfo(0).Served == want0 && s.SlotInfo(1).Served == want1 {
				return true
			}
			time.Sleep(time.Millisecond)
		}
		return false
	}
	if !served(20, 0) {
		t.Fatalf("light load served %d by the resident and %d by the non-resident; want 20 and 0",
			s.SlotInfo(0).Served, s.SlotInfo(1).Served)
	}
	call("sleep") // the resident is busy with this one...
	deadline := time.Now().Add(5 * time.Second)
	for s.SlotInfo(0).State != SlotBusy && s.SlotInfo(1).State != SlotBusy {
		if time.Now().After(deadline) {
			t.Fatal("the sleep call was not taken")
		}
		time.Sleep(time.Millisecond)
	}
	call("echo") // ...so the non-resident takes this one at once
	for _, c := range waitN(t, s, 1, 5*time.Second) {
		s.Release(c.Token)
	}
	if !served(20, 1) {
		t.Fatalf("echo behind a busy resident: served %d/%d, want the non-resident to take it",
			s.SlotInfo(0).Served, s.SlotInfo(1).Served)
	}
	for _, c := range waitN(t, s, 1, 5*time.Second) {
		s.Release(c.Token)
	}
}
