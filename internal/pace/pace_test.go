package pace

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A loop with no work runs once per idle period, with work once per busy
// period, and a Wake runs a slow loop's round at once.
func TestLoopPaces(t *testing.T) {
	l := New(10*time.Millisecond, time.Hour)
	stop := make(chan struct{})
	var work atomic.Bool
	rounds := make(chan time.Time, 1000)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Run(stop, func(now time.Time) { rounds <- now }, work.Load)
	}()
	defer func() { close(stop); <-done }()
	<-rounds // the first, after busy
	// Idle: no round for a while (the next is an hour away).
	select {
	case <-rounds:
		t.Fatal("a round came while the loop had no work and its idle pace is an hour")
	case <-time.After(300 * time.Millisecond):
	}
	work.Store(true)
	l.Wake()
	select {
	case <-rounds:
	case <-time.After(10 * time.Second):
		t.Fatal("Wake did not bring a round")
	}
	// Busy: rounds keep coming without Wake.
	for i := range 5 {
		select {
		case <-rounds:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d of a busy loop did not come", i)
		}
	}
}

// Work put at any moment around the loop's decision to go slow is taken
// by a round soon, though the idle pace is an hour: a submitter puts an
// item and Wakes the loop at random moments, and waits for the item to be
// taken before it puts the next (so no later Wake can rescue a lost one).
func TestLoopNeverSleepsOnWork(t *testing.T) {
	l := New(time.Millisecond, time.Hour)
	stop := make(chan struct{})
	var mu sync.Mutex
	var item chan struct{} // the item waiting, closed when a round takes it
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Run(stop, func(time.Time) {
			mu.Lock()
			if item != nil {
				close(item)
				item = nil
			}
			mu.Unlock()
		}, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return item != nil
		})
	}()
	defer func() { close(stop); <-done }()
	for i := range 2000 {
		time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond)
		taken := make(chan struct{})
		mu.Lock()
		item = taken
		mu.Unlock()
		l.Wake()
		select {
		case <-taken:
		case <-time.After(5 * time.Second):
			t.Fatalf("item %d was not taken in 5 s: its Wake was lost", i)
		}
	}
}
