package client

import (
	"context"
	"errors"

	"tpsched/netio"
)

// FindServer is the routing manager's "find server" (source document 004)
// for an application environment env (a service group its nodes' svcpolicy
// names with environment -g): the nodes that serve it, those where its
// calls meet their goals first. When no node serves it, the cluster starts
// one server, on the node with the most spare CPU at its importance, and
// the answer comes when that server is ready; the wait is bounded by ctx's
// deadline (else WatchTime, else the node's own limit of 30 s). A node
// without a service policy answers as a plain name lookup.
func (c *Client) FindServer(ctx context.Context, env string) ([]netio.NodeLevel, error) {
	h, timeout, err := c.header(ctx, netio.KindNameLookup, env, netio.LookupFind, nil)
	if err != nil {
		return nil, err
	}
	ctx, cancel := watched(ctx, timeout)
	defer cancel()
	var lastErr error
	for range c.nDC {
		idx, mc, err := c.pick(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil, notSent(ctx)
			}
			lastErr = err
			continue
		}
		id, w, sent, err := c.start(ctx, idx, mc, h, env, netio.LookupFind, nil, timeout)
		for attempt := 0; !sent && errors.Is(err, netio.ErrGoingAway) && attempt < 3; attempt++ {
			// It did not leave, and the node hands its port over: a new
			// connection reaches the process taking it, as deliver does.
			if mc, err = c.connFor(ctx, idx); err != nil {
				break
			}
			id, w, sent, err = c.start(ctx, idx, mc, h, env, netio.LookupFind, nil, timeout)
		}
		if !sent {
			if errors.Is(err, netio.ErrWriteTimeout) {
				return nil, timedOut(err)
			}
			if ctx.Err() != nil {
				return nil, notSent(ctx)
			}
			lastErr = err
			continue
		}
		if err != nil {
			return nil, sentErr(err)
		}
		answer, err := wait(ctx, mc, id, w, timeout)
		if err != nil {
			return nil, err
		}
		return netio.ParseLookupAnswer(answer)
	}
	return nil, &netio.Error{Code: netio.CodeNetworkDown, Message: lastErr.Error()}
}
