package wlmnode

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"tpsched/netio"
	"tpsched/scd/names"
	"tpsched/scd/wlm"
)

// The requests, as the lookup's service.
const (
	wlmDecide  = "wlm-decide"  // group: the environment; payload: the purpose; answer: a lookup answer
	wlmStart   = "wlm-start"   // group: the environment; answer when its server is ready
	wlmQuiesce = "wlm-quiesce" // group: the environment; payload: the epoch; answer when its server stopped
	wlmResume  = "wlm-resume"  // group: the environment; payload: the epoch
	wlmRefresh = "wlm-refresh" // group: the environment; answer when its processes were replaced
	wlmPolicy  = "wlm-policy"  // no group; answer when the node read svcpolicy again
	wlmMeasure = "wlm-measure" // no group; answer: the node's spare CPU (appendSpare), measured at once if it never was
)

// Requests are the services of the name lookups that are the routing
// manager's requests between nodes (ServeRequest answers them).
var Requests = []string{wlmDecide, wlmStart, wlmQuiesce, wlmResume, wlmRefresh, wlmPolicy, wlmMeasure}

// serveRequest answers another node's request, whose sender ServeRequest
// checked; it runs on the event loop, so the work is done on a goroutine
// of the manager's own.
func (m *envs) serveRequest(c conn, f *netio.Frame) {
	id, service, env, payload := f.ID, string(f.Service), string(f.Group), append([]byte(nil), f.Payload...)
	deadline := time.Now().Add(envStartTimeout)
	if f.TimeoutMs > 0 {
		deadline = time.Now().Add(min(time.Duration(f.TimeoutMs)*time.Millisecond, 2*envStartTimeout))
	}
	// Each request waits on a goroutine of its own, up to a minute (a
	// start in progress, a quiesce's calls): a peer may send them without
	// end, so past maxRequests it is told 'server busy', as finds are.
	if m.requests.Add(1) > maxRequests {
		m.requests.Add(-1)
		c.SendNow(netio.AppendError(nil, id, netio.CodeServerBusy, "too many routing manager requests in progress on node "+m.self))
		return
	}
	started := m.w.goTracked(func(ctx context.Context) {
		defer m.requests.Add(-1)
		out, err := m.handle(ctx, service, env, payload, deadline)
		if err != nil {
			code := netio.CodeNoSuchGroup
			var ne *netio.Error
			if errors.As(err, &ne) {
				code = ne.Code
			}
			msg := err.Error()
			if ne != nil {
				msg = ne.Message
			}
			_ = c.Send(netio.AppendError(nil, id, code, msg))
			return
		}
		_ = c.Send(netio.AppendFrame(nil, netio.Header{Kind: netio.KindReply, ID: id}, "", "", out))
	})
	if !started { // Close began after ServeRequest's check
		m.requests.Add(-1)
		c.SendNow(netio.AppendError(nil, id, netio.CodeShuttingDown, "the node is stopping"))
	}
}

// handle does what another node asks (service) and returns the answer's
// payload.
func (m *envs) handle(ctx context.Context, service, env string, payload []byte, deadline time.Time) ([]byte, error) {
	switch service {
	case wlmQuiesce, wlmResume, wlmRefresh:
		// Only an environment of this node's policy: quiesceLocal would
		// stop a plain server, which nothing starts again, and every name
		// a peer sends would stay in states. A peer may lie, or have read
		// a policy this node has not yet.
		if !m.isEnv(env) {
			return nil, &netio.Error{Code: netio.CodeNoSuchGroup, Message: env + " is not an application environment of node " + m.self + "'s policy"}
		}
	}
	if service == wlmDecide {
		if err := m.handedOverRefusal(service); err != nil {
			return nil, err
		}
	}
	switch service {
	case wlmDecide:
		if len(payload) != 1 || payload[0] < purposeFirst || payload[0] > purposeReplenish {
			return nil, &netio.Error{Code: netio.CodeProtocol, Message: "decide: bad purpose"}
		}
		if !m.tableSettled() {
			// Its table may not list this node's own groups yet: the
			// asker tries again.
			return nil, &netio.Error{Code: netio.CodeTimedOut, Message: "node " + m.self + " has not learned the cluster's name table yet"}
		}
		if node, _ := m.dec.node(env); node != m.self {
			// Our tables disagree for a moment (a node joining or leaving):
			// the asker tries again and finds the same decider as we do.
			return nil, &netio.Error{Code: netio.CodeTimedOut, Message: "node " + node + " decides starts, as far as node " + m.self + " knows"}
		}
		s, err := m.dec.decide(ctx, env, payload[0], deadline)
		if err != nil {
			return nil, err
		}
		return appendServers(nil, s), nil
	case wlmStart:
		return nil, m.activateFor(ctx, env, deadline, true)
	case wlmQuiesce, wlmResume:
		epoch, k := binary.Uvarint(payload)
		if k <= 0 || k != len(payload) || epoch > 1<<32-1 {
			return nil, &netio.Error{Code: netio.CodeProtocol, Message: service + ": bad epoch"}
		}
		st := wlm.EnvState{Epoch: uint32(epoch), Quiesced: service == wlmQuiesce}
		m.mu.Lock()
		m.states[env] = m.states[env].Merge(st)
		m.mu.Unlock()
		if service == wlmQuiesce {
			m.park.answerAll(env, netio.CodeServiceClosed, env+" was quiesced")
			return nil, m.quiesceLocalIf(ctx, env, "quiesce", st.Epoch, true)
		}
		m.opts.Announce()
		return nil, nil
	case wlmRefresh:
		n, err := m.refreshLocal(ctx, env, deadline)
		return binary.AppendUvarint(nil, uint64(n)), err
	case wlmMeasure:
		if err := m.w.measureNow(ctx); err != nil {
			return nil, &netio.Error{Code: netio.CodeShuttingDown, Message: "the node is stopping"}
		}
		return appendSpare(nil, m.w.Announced().Spare), nil
	case wlmPolicy:
		res, err := m.w.reloadLocal()
		if err != nil {
			return nil, &netio.Error{Code: netio.CodeApplication, Message: err.Error()}
		}
		return []byte(res), nil
	}
	return nil, &netio.Error{Code: netio.CodeProtocol, Message: "unknown request " + service}
}

// appendServers encodes servers for a decide answer: uvarint count, then
// per server its node id and address as strings.
func appendServers(dst []byte, s []serverAt) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	for _, x := range s {
		dst = binary.AppendUvarint(dst, uint64(len(x.node)))
		dst = append(dst, x.node...)
		dst = binary.AppendUvarint(dst, uint64(len(x.addr)))
		dst = append(dst, x.addr...)
	}
	return dst
}

func parseServers(b []byte) ([]serverAt, error) {
	bad := errors.New("routing manager: bad decide answer")
	n, k := binary.Uvarint(b)
	if k <= 0 || n > names.MaxNodes {
		return nil, bad
	}
	b = b[k:]
	str := func() (string, bool) {
		l, k := binary.Uvarint(b)
		if k <= 0 || l == 0 || l > netio.MaxNameLen || uint64(len(b)-k) < l {
			return "", false
		}
		s := string(b[k : k+int(l)])
		b = b[k+int(l):]
		return s, true
	}
	out := make([]serverAt, 0, n)
	for range n {
		node, ok1 := str()
		addr, ok2 := str()
		if !ok1 || !ok2 {
			return nil, bad
		}
		out = append(out, serverAt{node: node, addr: addr})
	}
	if len(b) != 0 {
		return nil, bad
	}
	return out, nil
}

// appendSpare encodes a measure answer: the spare CPU at importance 1..5
// in thousandths of a CPU, as uvarints.
func appendSpare(dst []byte, spare [names.Importances]uint32) []byte {
	for _, s := range spare {
		dst = binary.AppendUvarint(dst, uint64(s))
	}
	return dst
}

func parseSpare(b []byte) (spare [names.Importances]uint32, err error) {
	for i := range spare {
		v, k := binary.Uvarint(b)
		if k <= 0 || v > 1<<32-1 {
			return spare, errors.New("routing manager: bad measure answer")
		}
		spare[i], b = uint32(v), b[k:]
	}
	if len(b) != 0 {
		return spare, errors.New("routing manager: bad measure answer")
	}
	return spare, nil
}

// The cluster-wide actions (scdctl quiesce, resume, refresh, policy).

// others are the other nodes with a service policy.
func (m *envs) others() []names.NodeInfo {
	var out []names.NodeInfo
	for _, info := range m.names.Nodes() { // none alone
		if info.WLM != nil && info.Node != m.self {
			out = append(out, info)
		}
	}
	return out
}

// everywhere runs local here and sends service to every other node, in
// parallel, and reports each node's result.
func (m *envs) everywhere(env, service string, payload []byte, local func() (string, error)) []NodeResult {
	others := m.others()
	results := make([]NodeResult, len(others)+1)
	var wg sync.WaitGroup
	deadline := time.Now().Add(envQuiesceTimeout + 10*time.Second)
	for i, info := range others {
		wg.Go(func() {
			out, err := m.peers.Request(m.w.ctx, info.Node, info.Addr, service, env, payload, deadline)
			results[i+1] = NodeResult{Node: info.Node}
			if err != nil {
				results[i+1].Error = err.Error()
			} else {
				results[i+1].Done = describe(service, out)
			}
		})
	}
	done, err := local()
	results[0] = NodeResult{Node: m.self, Done: done}
	if err != nil {
		results[0].Error = err.Error()
	}
	wg.Wait()
	return results
}

func describe(service string, out []byte) string {
	switch service {
	case wlmRefresh:
		n, _ := binary.Uvarint(out)
		return fmt.Sprintf("%d process(es) replaced", n)
	case wlmPolicy:
		return string(out)
	}
	return "done"
}
