package rpcport

import (
	"fmt"
	"time"
)

// The buffer budget: every byte a Port holds for a peer, in the start of
// an incomplete frame (Conn.part) or in an answer the socket has not taken
// yet (Conn.out), is charged to one node-wide count, by the capacity of the
// slices that hold them. When a charge takes the count over Options.BufferBudget, the
// connection holding the most is closed: a greedy client loses its own
// connection, and others keep being served.

// charge adds delta bytes of partial frame held by c. It reports false when
// the budget chose c to be closed.
func (s *Port) charge(c *Conn, delta int64) bool {
	if delta == 0 {
		return true
	}
	c.partCharge.Add(delta)
	if total := s.held.Add(delta); delta > 0 && total-s.doomed.Load() > s.budget {
		s.enforce()
		return !c.doomed.Load()
	}
	return true
}

// chargeOut adds delta bytes of unsent answers held by c. c.mu is held.
func (c *Conn) chargeOut(delta int64) {
	c.outCharge.Add(delta)
	s := c.srv
	if total := s.held.Add(delta); delta > 0 && total-s.doomed.Load() > s.budget {
		s.enforce()
	}
}

// enforce closes the connections holding the most until what the others
// hold fits the budget. Safe from any goroutine; it takes no Conn's lock.
func (s *Port) enforce() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.held.Load()-s.doomed.Load() > s.budget {
		var worst *Conn
		var most int64
		for c := range s.conns {
			if c.doomed.Load() {
				continue
			}
			if h := c.partCharge.Load() + c.outCharge.Load(); h > most {
				worst, most = c, h
			}
		}
		if worst == nil {
			return
		}
		worst.doomedBytes.Store(most)
		worst.doomed.Store(true)
		s.doomed.Add(most)
		s.budgetCloses.Add(1)
		inc(s.mBudget)
		if n, ok := s.budgetLog.Allow(); ok {
			s.log.Warn("netio: buffer budget exceeded; closing the connection holding the most",
				"addr", s.addr, "remote", worst.remote, "held_bytes", most, "budget_bytes", s.budget,
				"closed_since_last_log", n)
		}
		worst.abort() // asynchronous: OnClose gives its bytes back
	}
}

// runJanitor, every tick: closes connections whose frame has been arriving
// for longer than FrameTimeout, and counts an event loop whose engine
// stopped ticking as the server's end.
func (s *Port) runJanitor() {
	defer s.janitor.Done()
	every := max(min(s.frameTimeout/8, s.loopDeadAfter/8, 250*time.Millisecond), 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	last := time.Now()
	var expired []*Conn
	for {
		var now time.Time
		select {
		case <-s.quit:
			return
		case now = <-t.C:
		}
		if now.Sub(last) > s.loopDeadAfter/2 {
			// This goroutine itself did not run for a long while (the
			// process was stopped, or the machine starved it): nobody's
			// ticks say anything about the loops.
			for i := range s.lastTick {
				s.lastTick[i].Store(now.UnixNano())
			}
		}
		s.updateReadRates(now.Sub(last))
		last = now
		for i := range s.lastTick {
			if since := now.Sub(time.Unix(0, s.lastTick[i].Load())); since > s.loopDeadAfter {
				s.fail(fmt.Errorf("event loop %d of %d stopped (no tick for %v)", i+1, len(s.lastTick), since.Round(time.Millisecond)))
				return
			}
		}
		deadline := now.Add(-s.frameTimeout).UnixNano()
		expired = expired[:0]
		s.mu.Lock()
		for c := range s.conns {
			if since := c.partialSince.Load(); since != 0 && since < deadline {
				expired = append(expired, c)
			}
		}
		s.mu.Unlock()
		for _, c := range expired {
			if !c.timedOut.CompareAndSwap(false, true) {
				continue
			}
			s.frameTimeouts.Add(1)
			inc(s.mTimeout)
			if n, ok := s.timeoutLog.Allow(); ok {
				s.log.Warn("netio: a frame did not arrive whole in time; closing the connection",
					"addr", s.addr, "remote", c.remote, "frame_timeout", s.frameTimeout, "closed_since_last_log", n)
			}
			c.abort()
		}
	}
}
