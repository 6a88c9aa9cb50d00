package shm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// A UAP calls another service through its own area, not through a socket:
// it writes the call into the out buffer and the out-call line of page 0,
// rings its doorbell if the scheduler's reader sleeps, and waits on the
// out-call futex word. The scheduler copies the call out, routes it as it
// routes a client's (this node's queue, or another node) and writes the
// answer back. The call never reaches another process's memory directly:
// the scheduler stays the one that admits, counts and checks every call.

// CallError is an error answer to a Call: Code is the error code of the
// tpsched frame protocol (netio.Code: 4 server busy, 5 timed out, ...),
// Message the node's text for it.
type CallError struct {
	Code    uint32
	Message string
}

func (e *CallError) Error() string { return e.Message }

// outState is the UAP's side of its calls.
type outState struct {
	mu        sync.Mutex // one call at a time, whatever the goroutines
	buf       []byte
	no        uint64 // the last call made
	abandoned bool   // the last call's context ended before its answer came
	spin      spinner
	closing   atomic.Bool // Close began: a call waiting returns ErrClosed
	// asleepOn is the word a Call sleeps on now (the out-call line's or a
	// lane's; nil: none), for Close to wake. Under asleepMu, which the
	// Call holds to set and clear it and Close to wake it, never across a
	// sleep: the Call unmaps a lane only after clearing it, so Close never
	// wakes a word already unmapped.
	asleepMu sync.Mutex
	asleepOn *atomic.Uint32

	// lane is the lane the process calls on (lane_uap.go), laneTried the
	// last generation it tried to map.
	lane      *laneEnd
	laneTried uint32
}

// ErrCallFromSocket is Call's error in socket mode (receive_from = socket).
var ErrCallFromSocket = errors.New("shm: a UAP receiving from a socket cannot make calls through shared memory")

// Call calls service of group through the node, as a client would, and
// returns the reply (a copy, the caller's to keep). Inside a handler it is
// how one service calls another: the node routes the call like any other
// (its own queue for a group served here, another node's otherwise) and
// answers it once, with a reply or a *CallError.
//
// ctx's deadline is the call's timeout; without one, the deadline of the
// call being served, then the target group's watch_time. If ctx ends
// first, Call returns ctx.Err(); the process's next Call then waits for
// the abandoned call's answer, which the node sends by its deadline. One
// call at a time per process: concurrent Calls wait for each other.
func (u *UAP) Call(ctx context.Context, group, service string, req []byte) ([]byte, error) {
	if u.sock != nil {
		return nil, ErrCallFromSocket
	}
	o := &u.out
	switch {
	case o.closing.Load():
		return nil, ErrClosed
	case len(group) < 1 || len(group) >= maxName || len(service) < 1 || len(service) >= maxName:
		return nil, fmt.Errorf("shm: call %s/%s: group and service names are 1..%d bytes", group, service, maxName-1)
	case len(req) > len(o.buf)-outNames:
		return nil, fmt.Errorf("shm: call %s/%s: a request of %d bytes, max_message_size %d", group, service, len(req), len(o.buf)-outNames)
	}
	// o.mu is held across the waits for scdd's answer: the UAP has one
	// out-mailbox, so its goroutines' calls take turns. What ends the wait
	// (scdd, the call's deadline, ctx, Close) never takes o.mu; Close takes
	// it to unmap, after it has ended the wait.
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closing.Load() {
		return nil, ErrClosed
	}
	if o.abandoned {
		if err := u.awaitOut(ctx); err != nil { // lockcheck: see o.mu above
			return nil, err
		}
		o.abandoned = false
	}
	deadline, ok := ctx.Deadline()
	if cur := u.curDeadline.Load(); !ok && cur != 0 {
		deadline, ok = time.Unix(0, cur), true
	}
	if ok && time.Until(deadline) <= 0 {
		return nil, context.DeadlineExceeded
	}
	var dl int64
	if ok {
		dl = deadline.UnixNano()
	}
	if reply, err, sent := u.callLane(ctx, group, service, req, dl); sent { // lockcheck: see o.mu above
		return reply, err
	}
	// What is left of it now: a call given back by its lane waited there.
	var timeoutMs uint32
	if ok {
		left := time.Until(deadline)
		if left <= 0 {
			return nil, context.DeadlineExceeded
		}
		timeoutMs = uint32(min(max(left.Milliseconds(), 1), 1<<31))
	}
	c := &u.ctl.out
	gl := copy(o.buf, group)
	sl := copy(o.buf[gl:], service)
	copy(o.buf[gl+sl:], req)
	c.timeoutMs, c.groupLen, c.serviceLen, c.reqLen = timeoutMs, uint32(gl), uint32(sl), uint32(len(req))
	o.no++
	c.no.Store(o.no) // publishes the call
	if u.gp.sleeping.Load() != 0 {
		ring(u.bell)
	}
	if err := u.awaitOut(ctx); err != nil { // lockcheck: see o.mu above
		o.abandoned = true
		return nil, err
	}
	n := min(int(c.replyLen.Load()), len(o.buf))
	if code := c.code.Load(); code != 0 {
		return nil, &CallError{Code: code, Message: string(o.buf[:n])}
	}
	return append([]byte(nil), o.buf[:n]...), nil
}

// awaitOut waits until the node answered the last call made, spinning
// briefly and then sleeping on the out-call futex word; ctx.Err() if ctx
// ends first.
func (u *UAP) awaitOut(ctx context.Context) error {
	o, c := &u.out, &u.ctl.out
	_, err := u.awaitAnswer(ctx, &o.spin, &c.wake, &c.sleeping, func() bool { return c.done.Load() >= o.no }, 0)
	return err
}

// awaitAnswer waits until answered, spinning briefly (sp) and then
// sleeping on the futex word wake, saying so in sleeping; ctx.Err() if ctx
// ends first, ErrClosed if the UAP closes, errLaneLate past late (unix ns;
// 0 none). It counts the wake-ups that brought no answer. The out-call
// line's wait and a lane's (awaitLane) are this one on their own words.
func (u *UAP) awaitAnswer(ctx context.Context, sp *spinner, wake, sleeping *atomic.Uint32, answered func() bool, late int64) (idle int, err error) {
	o := &u.out
	ready := func() bool { return answered() || o.closing.Load() }
	start := time.Now()
	if sp.spin(start, answered) {
		sp.learn(time.Since(start))
		return 0, nil
	}
	sp.learn(-1)
	// A cancel wakes the wait at once (a deadline bounds the sleep
	// anyway): the wake word moves, and the loop looks at ctx. A wake
	// under way when the wait ends is waited for: the word may be unmapped
	// as soon as the wait has returned. Close wakes it through asleepOn.
	if ctx.Done() != nil {
		woke := make(chan struct{})
		stop := context.AfterFunc(ctx, func() {
			defer close(woke)
			wake.Add(1)
			futexWake(wake, 1)
		})
		defer func() {
			if !stop() {
				<-woke
			}
		}()
	}
	o.asleepMu.Lock()
	o.asleepOn = wake
	o.asleepMu.Unlock()
	defer func() {
		o.asleepMu.Lock()
		o.asleepOn = nil
		o.asleepMu.Unlock()
	}()
	for !answered() {
		if o.closing.Load() {
			return idle, ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return idle, err
		}
		sleep := maxSleep
		if d, ok := ctx.Deadline(); ok {
			left := time.Until(d)
			if left <= 0 {
				// Past the deadline, before ctx's own timer says so: a
				// sleep of nothing would spin until it does.
				return idle, context.DeadlineExceeded
			}
			sleep = min(sleep, left)
		}
		if late != 0 && time.Now().UnixNano() > late {
			return idle, errLaneLate
		}
		w := wake.Load()
		sleepOn(wake, sleeping, ready, sleep)
		if wake.Load() != w && !answered() {
			idle++
		}
	}
	return idle, nil
}
