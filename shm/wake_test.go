package shm

import (
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
	old := maxSleep
	maxSleep = 10 * time.Second
	t.Cleanup(func() { maxSleep = old })

	s := newSeg(t, Layout{Slots: 16, MaxMessage: 64, Processes: 3})
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
