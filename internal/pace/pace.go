// Package pace owns the node's periodic duties that matter only while
// there is work: a Loop runs its round often while work is pending and
// rarely while none is, and Wake brings a slow loop back at once when work
// comes. The expiry loops of the local scheduler and of the peer pool
// ticked every 50 ms on an idle node, and each tick woke several of the Go
// runtime's threads: most of an idle scdd's wake-ups.
package pace

import (
	"sync/atomic"
	"time"
)

// Loop is a periodic round with two paces. Make it with New; Run it on one
// goroutine; Wake it from any.
type Loop struct {
	busy, idle time.Duration
	slow       atomic.Bool // Run waits idle: a Wake must kick it
	kick       chan struct{}
}

// New makes a loop that runs every busy while work is pending and every
// idle otherwise.
func New(busy, idle time.Duration) *Loop {
	return &Loop{busy: busy, idle: max(idle, busy), kick: make(chan struct{}, 1)}
}

// Wake says that work came. Call it after the work is where Run's pending
// sees it: a slow loop then runs its next round at once. While the loop is
// fast it is one atomic load, so it can sit on an admission path.
func (l *Loop) Wake() {
	if l.slow.Load() && l.slow.CompareAndSwap(true, false) {
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
}

// Run calls round, then waits busy if pending reports work and idle if not
// (a Wake ends an idle wait), until stop is closed.
//
// The loop says it is slow before it asks pending, so that work pending
// missed was put there after the flag, and its Wake sees the flag.
func (l *Loop) Run(stop <-chan struct{}, round func(now time.Time), pending func() bool) {
	t := time.NewTimer(l.busy)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-l.kick:
		case <-t.C:
		}
		round(time.Now())
		l.slow.Store(true)
		next := l.idle
		if pending() {
			l.slow.Store(false)
			next = l.busy
		}
		t.Reset(next)
	}
}
