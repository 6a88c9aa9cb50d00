package bench

import (
	"context"
	"sync"
	"time"
)

// Stamped is one reading of a poller, with when it was taken.
type Stamped[T any] struct {
	At time.Time
	V  T
}

// poll reads every interval, at once and then on each tick, until the
// returned stop is called; stop returns the readings that succeeded, in
// order. S3, S5 and S6 watch a system this way while the load runs.
func poll[T any](ctx context.Context, every time.Duration, read func() (T, bool)) (stop func() []Stamped[T]) {
	var (
		mu   sync.Mutex
		seen []Stamped[T]
		wg   sync.WaitGroup
	)
	pctx, cancel := context.WithCancel(ctx)
	wg.Add(1)
	go func() {
		defer wg.Done()
		tk := time.NewTicker(every)
		defer tk.Stop()
		for {
			at := time.Now()
			if v, ok := read(); ok {
				mu.Lock()
				seen = append(seen, Stamped[T]{at, v})
				mu.Unlock()
			}
			select {
			case <-pctx.Done():
				return
			case <-tk.C:
			}
		}
	}()
	return func() []Stamped[T] {
		cancel()
		wg.Wait()
		return seen
	}
}
