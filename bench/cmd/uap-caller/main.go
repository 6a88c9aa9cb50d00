// Command uap-caller is the bench's caller UAP: a worker process of a
// service group, started by scdd like any UAP, whose one service, run,
// makes local calls in a loop, as Enduro/X's exbenchcl does, and answers
// with what it measured. S10's "tpsched local call" is N of these,
// each sent one run call by the harness, calling bench/echo through the
// node (shm.UAP.Call) until the run's end.
//
// It uses the public UAP API only (shm.Attach, UAP.Handle, UAP.Call,
// UAP.Serve), as a UAP author's program would; the run request and the
// summary it answers with are package uapcall's.
//
//	run   the request is uapcall.Run (group, service, payload bytes, start
//	      and end of the measured window); the reply is uapcall.Summary
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"tpsched/bench/uapcall"
	"tpsched/shm"
)

// callGrace is how long after the run's end a call may still wait for its
// answer (the harness's own closed loop waits 2 s for a call's answer).
const callGrace = 2 * time.Second

func main() {
	u, err := shm.Attach()
	if err != nil {
		fmt.Fprintln(os.Stderr, "uap-caller:", err)
		os.Exit(2)
	}
	u.Handle("run", func(req []byte) ([]byte, error) {
		r, err := uapcall.ParseRun(req)
		if err != nil {
			return nil, err
		}
		s := loop(u, r)
		out := s.Append(req[:0]) // req aliases the reply buffer
		if len(out) > u.MaxMessage() {
			return nil, fmt.Errorf("a summary of %d bytes, max_message_size %d", len(out), u.MaxMessage())
		}
		return out, nil
	})
	if err := u.Serve(); err != nil {
		fmt.Fprintln(os.Stderr, "uap-caller:", err)
		os.Exit(1)
	}
}

// loop calls r.Group/r.Service until r.End, one call at a time, and tallies
// the calls.
func loop(u *shm.UAP, r uapcall.Run) uapcall.Summary {
	// One deadline for every call of the run: a context per call would
	// cost each call a timer.
	ctx, cancel := context.WithDeadline(context.Background(), r.End.Add(callGrace))
	defer cancel()
	payload := uapcall.Payload(r.Payload)
	t := uapcall.Tally{Start: r.Start, End: r.End}
	t.PID = os.Getpid()
	for {
		sent := time.Now()
		if !sent.Before(r.End) {
			break
		}
		reply, err := u.Call(ctx, r.Group, r.Service, payload)
		done := time.Now()
		var code uint32
		var ce *shm.CallError
		switch {
		case err == nil:
		case errors.As(err, &ce):
			code = ce.Code
		case ctx.Err() != nil:
			// Unanswered past the grace: a timeout, and the run is over.
			t.Count(sent, done, uapcall.TimedOut)
			return t.Summary
		default:
			// No answer from the node at all (the process is closing, a
			// request it refused): do not spin on it.
			code = ^uint32(0)
			time.Sleep(time.Millisecond)
		}
		t.Count(sent, done, uapcall.OutcomeOf(code, reply, payload))
	}
	return t.Summary
}
