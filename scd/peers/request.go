package peers

import (
	"context"
	"fmt"
	"math"
	"time"

	"tpsched/netio"
)

// Request sends the routing manager's request service (a name lookup whose
// service names the request, with the hop mark, so that the node takes it
// only from a node that proved the cluster key) for group to node at addr
// on the pool's connection to it, and waits for the answer until
// deadline. The answer is the reply's payload, or a *netio.Error: the
// node's error answer, 'network down' when the node could not be reached
// (the request certainly did not reach it) or the connection was lost,
// 'timed out' when no answer came in time. A request is never sent to
// another node. When ctx ends first, Request returns 'node shutting down'
// (the answer, if one comes, is dropped).
func (p *Pool) Request(ctx context.Context, node, addr, service, group string, payload []byte, deadline time.Time) ([]byte, error) {
	w := &requestWaiter{ch: make(chan netio.Frame, 1)}
	now := time.Now()
	c := &Call{Caller: w, Kind: netio.KindNameLookup, Group: group, Service: service, Payload: payload,
		Deadline: deadline, Start: now, request: true}
	if code, msg := p.Send(node, addr, c); code != netio.CodeOK {
		return nil, &netio.Error{Code: code, Message: msg}
	}
	// The pool answers every request it took (the node, an expiry on the
	// node's tick, a lost connection, Close); the timer only bounds a wait
	// whose tick has stopped.
	t := time.NewTimer(max(time.Until(deadline), 0) + time.Second)
	defer t.Stop()
	select {
	case f := <-w.ch:
		if f.Kind != netio.KindReply {
			return nil, &netio.Error{Code: f.Code, Message: string(f.Payload)}
		}
		return f.Payload, nil
	case <-t.C:
		return nil, &netio.Error{Code: netio.CodeTimedOut, Message: fmt.Sprintf("node %s did not answer %s in time", node, service)}
	case <-ctx.Done():
		return nil, &netio.Error{Code: netio.CodeShuttingDown, Message: fmt.Sprintf("%s to node %s: %v", service, node, ctx.Err())}
	}
}

// requestWaiter is a Request's caller: it takes the one answer.
type requestWaiter struct{ ch chan netio.Frame }

func (w *requestWaiter) Send(b []byte) error {
	f, _, err := netio.Decode(b, math.MaxInt32)
	if err != nil {
		f = netio.Frame{Header: netio.Header{Kind: netio.KindError, Code: netio.CodeProtocol}, Payload: []byte(err.Error())}
	}
	select {
	case w.ch <- f:
	default: // answered already: a Request gets one answer
	}
	return nil
}
