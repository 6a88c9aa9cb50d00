package local

import (
	"fmt"
	"math"
	"time"

	"tpsched/netio"
	"tpsched/shm"
)

// outCaller is a process end that can make calls of its own (shm.Proc; a
// socket-receiving process cannot).
type outCaller interface {
	OutCall() (shm.OutCall, bool, error)
	AnswerOutCall(no uint64, code uint32, data []byte) bool
	OutOpen() bool
}

// localCall is a call a process of the group made, as the reply reader
// found it.
type localCall struct {
	from outCaller
	call shm.OutCall
}

// uapCaller is a call.Caller: it answers one call a UAP made through its
// shared memory into the calling process's area. An answer for a process
// that died meanwhile is dropped there.
type uapCaller struct {
	p      outCaller
	no     uint64
	maxMsg int // the calling group's max_message_size
}

func (u *uapCaller) Send(b []byte) error {
	f, _, err := netio.Decode(b, math.MaxInt32)
	if err != nil {
		return fmt.Errorf("scd: answering a local call: %w", err)
	}
	if f.Kind != netio.KindError {
		if u.p.AnswerOutCall(u.no, 0, f.Payload) {
			return nil
		}
		f.Code = netio.CodeMessageTooBig
		f.Payload = fmt.Appendf(nil, "a reply of %d bytes, the calling UAP's max_message_size is %d", len(f.Payload), u.maxMsg)
	}
	// The code's name and the node's detail, as netio.Error says them but
	// for its "tpsched: ": the UAP puts its own context in front.
	msg := f.Code.String()
	if len(f.Payload) > 0 {
		msg += ": " + string(f.Payload)
	}
	u.p.AnswerOutCall(u.no, uint32(f.Code), []byte(msg[:min(len(msg), u.maxMsg)]))
	return nil
}

// placeLocalCalls routes the calls the group's processes made, as a
// client's are routed (g.place: the node's line for a UAP's calls, which
// ends at this node's queue of the group they name), and answers at once
// those refused. A node that drains still takes them: they belong to calls
// it is finishing. On the reply reader, without mu.
func (r *reader) placeLocalCalls(calls []localCall) {
	g := r.g
	for _, lc := range calls {
		g.localCalls.Inc()
		to := &uapCaller{p: lc.from, no: lc.call.No, maxMsg: g.def.MaxMessageSize}
		f := netio.Frame{
			Header:  netio.Header{Kind: netio.KindCall, ID: lc.call.No, TimeoutMs: lc.call.TimeoutMs},
			Group:   []byte(lc.call.Group),
			Service: []byte(lc.call.Service),
			Payload: lc.call.Request,
		}
		if code, msg := g.place(to, &f); code != netio.CodeOK {
			_ = to.Send(netio.AppendError(nil, f.ID, code, msg))
		}
	}
}

// stallAfter is how long every process of a group may wait for calls of
// its own while calls wait for it before the node says so.
const stallAfter = time.Second

// checkStall warns when calls wait for the group while every one of its
// processes waits for a call of its own: a cycle (A calls B calls A, or A
// calls A) with too few processes, which holds until the calls' deadlines.
// Once per episode, counted. On the expiry loop.
func (g *Group) checkStall(now time.Time) {
	g.mu.Lock()
	waiting, procs, calling := g.q.Waiting(), 0, 0
	if waiting > 0 {
		for i := range g.slots {
			si := &g.slots[i]
			if si.p == nil || !si.attached {
				continue
			}
			procs++
			if oc, ok := si.p.(outCaller); ok && oc.OutOpen() {
				calling++
			}
		}
	}
	g.mu.Unlock()
	if waiting == 0 || procs == 0 || calling < procs {
		g.stallSince, g.stallWarned = time.Time{}, false
		return
	}
	if g.stallSince.IsZero() {
		g.stallSince = now
		return
	}
	if now.Sub(g.stallSince) >= stallAfter && !g.stallWarned {
		g.stallWarned = true
		g.stalls.Inc()
		g.log.Warn("every process of the group waits for a call of its own while calls wait for it: a call cycle with too few processes; they end at their deadlines",
			"group", g.name, "processes", procs, "waiting", waiting)
	}
}
