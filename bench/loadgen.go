package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// outcome is how one call ended.
type outcome uint8

const (
	callOK       outcome = iota // answered with the payload sent
	callRefused                 // the server said it is busy (tpsched 'server busy', HTTP 5xx, gRPC ResourceExhausted/Unavailable)
	callFailed                  // any other failure: an error answer, a broken connection
	callTimedOut                // no answer before the call's deadline
)

// caller makes calls on one connection, one at a time. It dials lazily and
// redials after a broken connection or a timeout, so a call's Outcome is
// never lost to a stale connection. An error return is a fault of the
// benchmark itself (a reply that does not match the request, a protocol
// violation) and ends the run.
type caller interface {
	Call(payload []byte, deadline time.Time) (outcome, error)
	Close() error
}

// dialer makes a Caller for one connection of a run.
type dialer func() caller

// load describes one run. Rate 0 is a closed loop: Conns connections, each
// with one call outstanding at a time. Rate > 0 is an open loop: calls are
// due at Rate per second whether or not earlier ones were answered, carried
// by up to Conns connections; a call's latency counts from the time it was
// due, so time spent waiting for a free connection is queueing the server
// caused and is measured.
type load struct {
	Dial     dialer
	Payload  []byte
	Conns    int
	Warmup   time.Duration // unmeasured time before the window
	Duration time.Duration // the measured window
	Rate     float64       // calls per second; 0 = closed loop
	Timeout  time.Duration // open loop: a call due at t times out at t+Timeout (default 2 s)
	// Window, if set, is called at the start (true) and the end (false) of
	// the measured window, for accounting that must cover the same time.
	Window func(begin bool)
	// Profile, if set, makes the open loop's rate change over time: the
	// phases run one after another from the start, with no warm-up, and the
	// whole profile is measured (Rate, Warmup and Duration are ignored).
	Profile []phase
	// Trace keeps every call due in the window in Result.Trace.
	Trace bool
}

// phase is one stretch of an open-loop rate profile.
type phase struct {
	Rate float64       // calls per second
	For  time.Duration // how long
}

// callTrace is one call of a traced run.
type callTrace struct {
	Due     time.Duration // when it was due, from Result.Begin
	Latency time.Duration // from due to the answer (0 if it timed out before being sent)
	Late    time.Duration // from due to sending: the generator's own lateness (timer wake-up, waiting for a free connection)
	Outcome outcome
}

// result is what one run measured. Only calls in the window count; latency
// is of the calls answered OK.
type result struct {
	Offered    int // open loop: calls due in the window
	Calls      int // answered OK (of the calls sent, or due, in the window)
	Refused    int
	Failed     int
	TimedOut   int
	Throughput float64 // calls answered OK within the window, per second
	Latency    latency
	CDF        []cdfPoint
	Begin      time.Time   // when the run began (the profile's time 0)
	Trace      []callTrace // Load.Trace: every call due in the window, in no order
	// Loadgen are the processes other than the harness that made the load
	// (S10's caller UAPs), and Idle those of the system's tree that took
	// no part in this run (callers not needed in this cell).
	Loadgen, Idle []int
	// Sampled is the share of the calls' window that the window's CPU and
	// wake-up samples cover, when the calls are counted by other
	// processes on their own clocks (S10's callers: the harness, short of
	// CPU, may sample late); 0: the same window (the harness counts the
	// calls between its samples).
	Sampled float64
}

// closedLoop runs l with Rate 0.
func closedLoop(ctx context.Context, l load) (result, error) {
	l.Rate = 0
	return run(ctx, l)
}

// openLoop runs l at l.Rate calls per second.
func openLoop(ctx context.Context, l load) (result, error) {
	if len(l.Profile) > 0 {
		for _, p := range l.Profile {
			if p.Rate <= 0 || p.For <= 0 {
				return result{}, errors.New("bench: every phase of a profile needs a rate and a duration")
			}
		}
		l.Rate, l.Warmup, l.Duration = l.Profile[0].Rate, 0, profileDuration(l.Profile)
	}
	if l.Rate <= 0 {
		return result{}, errors.New("bench: open loop needs a rate")
	}
	return run(ctx, l)
}

// intended is the open-loop schedule: the time call i (from 0) is due when
// calls start at start and arrive at rate per second.
func intended(start time.Time, rate float64, i int64) time.Time {
	return start.Add(time.Duration(float64(i) * float64(time.Second) / rate))
}

// profileDuration is how long the phases last in all.
func profileDuration(phases []phase) time.Duration {
	var d time.Duration
	for _, p := range phases {
		d += p.For
	}
	return d
}

// profileIntended is Intended for a rate profile: the time call i (from 0)
// is due, counted from start, and whether the profile has a call i. Phase
// k holds round(rate x duration) calls spaced evenly from its start.
func profileIntended(start time.Time, phases []phase, i int64) (time.Time, bool) {
	at := start
	for _, p := range phases {
		n := int64(math.Round(p.Rate * p.For.Seconds()))
		if i < n {
			return intended(at, p.Rate, i), true
		}
		i -= n
		at = at.Add(p.For)
	}
	return time.Time{}, false
}

type tally struct {
	start, end                       time.Time // the window
	lat                              []time.Duration
	ok, refused, failed, timedOut, n int
	okInWindow                       int // answered OK within the window
	trace                            []callTrace
	err                              error
}

// count records a call that was sent (closed loop) or due (open loop) in
// the window and ended at done.
func (t *tally) count(o outcome, lat time.Duration, done time.Time) {
	t.n++
	switch o {
	case callOK:
		t.ok++
		t.lat = append(t.lat, lat)
		if !done.Before(t.start) && !done.After(t.end) {
			t.okInWindow++
		}
	case callRefused:
		t.refused++
	case callFailed:
		t.failed++
	case callTimedOut:
		t.timedOut++
	}
}

func run(ctx context.Context, l load) (result, error) {
	if l.Conns <= 0 || l.Duration <= 0 {
		return result{}, errors.New("bench: a run needs connections and a duration")
	}
	if l.Timeout <= 0 {
		l.Timeout = 2 * time.Second
	}
	// Every call ends by its deadline or by the end of this bound.
	ctx, cancel := context.WithTimeout(ctx, l.Warmup+l.Duration+l.Timeout+30*time.Second)
	defer cancel()
	begin := time.Now()
	start := begin.Add(l.Warmup)
	end := start.Add(l.Duration)
	windowDone := make(chan struct{})
	if l.Window == nil {
		close(windowDone)
	} else {
		go func() {
			defer close(windowDone)
			if !sleepUntil(ctx, start) {
				return
			}
			l.Window(true)
			if sleepUntil(ctx, end) {
				l.Window(false)
			}
		}()
	}
	tallies := make([]tally, l.Conns)
	for i := range tallies {
		tallies[i].start, tallies[i].end = start, end
	}
	var next atomic.Int64 // open loop: the next call to send
	var wg sync.WaitGroup
	for i := range tallies {
		wg.Add(1)
		go func(t *tally) {
			defer wg.Done()
			c := l.Dial()
			defer c.Close()
			// Close unblocks a call stuck on a server that stopped answering.
			defer context.AfterFunc(ctx, func() { c.Close() })()
			t.lat = make([]time.Duration, 0, 1<<14)
			if l.Rate > 0 {
				t.err = openConn(ctx, l, c, t, &next, begin, start, end)
			} else {
				t.err = closedConn(ctx, l, c, t, start, end)
			}
			if t.err != nil {
				cancel()
			}
		}(&tallies[i])
	}
	wg.Wait()
	<-windowDone
	var r result
	var all []time.Duration
	inWindow := 0
	for _, t := range tallies {
		inWindow += t.okInWindow
		if t.err != nil {
			return r, t.err
		}
		all = append(all, t.lat...)
		r.Calls += t.ok
		r.Refused += t.refused
		r.Failed += t.failed
		r.TimedOut += t.timedOut
		r.Offered += t.n
		r.Trace = append(r.Trace, t.trace...)
	}
	r.Begin = begin
	if err := ctx.Err(); err != nil && time.Now().Before(end) {
		return r, err
	}
	// Throughput counts what was answered in the window, so a server that
	// falls behind an open loop is not credited with answers it gives later.
	r.Throughput = float64(inWindow) / l.Duration.Seconds()
	r.Latency = summarize(all)
	r.CDF = cdfOf(all, 120)
	if r.Calls == 0 && r.Refused == 0 {
		return r, fmt.Errorf("bench: no call answered (%d failed, %d timed out)", r.Failed, r.TimedOut)
	}
	return r, nil
}

// closedConn sends a call as soon as the previous one is answered. Calls
// sent in the window count.
func closedConn(ctx context.Context, l load, c caller, t *tally, start, end time.Time) error {
	for ctx.Err() == nil {
		t0 := time.Now()
		if !t0.Before(end) {
			return nil
		}
		o, err := c.Call(l.Payload, time.Time{})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if o == callFailed {
			// A broken connection answers at once; do not spin on it.
			time.Sleep(time.Millisecond)
		}
		now := time.Now()
		switch {
		case !t0.Before(start):
			t.count(o, now.Sub(t0), now)
		case o == callOK && !now.Before(start):
			// Sent in the warm-up, answered in the window: it counts toward
			// throughput as the calls still out at the end do not.
			t.okInWindow++
		}
	}
	return nil
}

// openConn takes the next due call, waits for its time, sends it and
// measures from the time it was due. Calls due in the window count.
func openConn(ctx context.Context, l load, c caller, t *tally, next *atomic.Int64, begin, start, end time.Time) error {
	for ctx.Err() == nil {
		var due time.Time
		if len(l.Profile) > 0 {
			d, ok := profileIntended(begin, l.Profile, next.Add(1)-1)
			if !ok {
				return nil
			}
			due = d
		} else {
			due = intended(begin, l.Rate, next.Add(1)-1)
		}
		if !due.Before(end) {
			return nil
		}
		measured := !due.Before(start)
		deadline := due.Add(l.Timeout)
		if !sleepUntil(ctx, due) {
			return nil
		}
		if !time.Now().Before(deadline) {
			// It waited for a connection past its deadline: it would have
			// timed out without being sent.
			if measured {
				t.count(callTimedOut, 0, time.Now())
				if l.Trace {
					t.trace = append(t.trace, callTrace{Due: due.Sub(begin), Outcome: callTimedOut})
				}
			}
			continue
		}
		sent := time.Now()
		o, err := c.Call(l.Payload, deadline)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if measured {
			now := time.Now()
			if o == callOK && l.Timeout > 0 && now.After(deadline) {
				// Answered, but after the caller stopped waiting.
				o = callTimedOut
			}
			t.count(o, now.Sub(due), now)
			if l.Trace {
				t.trace = append(t.trace, callTrace{Due: due.Sub(begin), Latency: now.Sub(due), Late: sent.Sub(due), Outcome: o})
			}
		}
	}
	return nil
}

// sleepUntil waits for t or ctx; it reports whether t came first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}
