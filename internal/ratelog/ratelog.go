// Package ratelog owns the one way tpsched bounds a log line that an
// outside party can make repeat (a caller flooding the port, a UAP that
// dies after every call): one line per period, counting the events it
// held back so that the line that goes out says how many there were.
package ratelog

import (
	"sync"
	"time"
)

// Limiter lets one line through per Every. Its zero value with Every set
// is ready; it is safe for concurrent use.
type Limiter struct {
	Every time.Duration

	mu     sync.Mutex
	last   time.Time
	held   int
	primed bool
}

// Allow reports whether a line may be logged now and, if so, how many
// events it stands for: those held back since the last line, this one
// included.
func (r *Limiter) Allow() (int, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.held++
	now := time.Now()
	if r.primed && now.Sub(r.last) < r.Every {
		return 0, false
	}
	n := r.held
	r.primed, r.last, r.held = true, now, 0
	return n, true
}
