// Package oldreserve is the descriptor reserve as it was before issue 27
// fixed break 1: enroll held the lock while register waited for an event
// loop. The check must name it.
package oldreserve

import "sync"

type fdReserve struct {
	mu  sync.Mutex
	fds []int
}

func (r *fdReserve) enroll(register func() error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := len(r.fds); n > 0 {
		r.fds = r.fds[:n-1]
	}
	err := register()
	r.fillLocked()
	return err
}

func (r *fdReserve) fillLocked() {}

// waitLoop waits for a loop's answer; calling it under the lock is the
// same fault one call deeper.
func (r *fdReserve) waitLoop(done chan struct{}) { <-done }

func (r *fdReserve) deeper(done chan struct{}) {
	r.mu.Lock()
	r.waitLoop(done)
	r.mu.Unlock()
}

// excused says why it cannot block.
func (r *fdReserve) excused(done chan struct{}) {
	r.mu.Lock()
	select {
	case <-done:
	default:
	}
	close(done) // lockcheck: closing never waits
	r.mu.Unlock()
}
