package local

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/netio"
	"tpsched/shm"
)

// outCaller is a process end that can make calls of its own (shm.Proc; a
// socket-receiving process cannot).
type outCaller interface {
	OutCall() (shm.OutCall, bool, error)
	AnswerOutCall(no uint64, code uint32, data []byte) bool
	PublishOutAnswer(no uint64, code uint32, data []byte) (fits, wake bool)
	WakeOutCaller()
	OutOpen() bool
}

// localCall is a call a process of the group made, as the reply reader
// found it.
type localCall struct {
	from *uapCaller
	call shm.OutCall
}

// uapCaller is a call.Caller: it answers the calls one UAP process makes
// through its shared memory, into that process's area, each under the
// call's number (the frame's id). One per process, made at its first call:
// a process has one call at a time. An answer for a call the process no
// longer waits for, or for a process that died meanwhile, is dropped
// there.
type uapCaller struct {
	p      outCaller
	maxMsg int              // the calling group's max_message_size
	calls  *metrics.Counter // the calling group's local calls (lane calls are counted by the callee's group's look)
	// cpuGroup says whether the calling group's processes have a cpu
	// cgroup of their own (Group.inCPUGroup); nil: taken as yes.
	cpuGroup func() bool

	// Its lane (lanes.go): whether it holds one (in any group), when it
	// may be offered one next (unix ns), and an offer that waits for the
	// end of its call (nil: none).
	laneHeld  atomic.Bool
	laneNext  atomic.Int64
	laneLater atomic.Pointer[laterLane]
}

// inCPUGroup says whether the calling process has a cpu cgroup of its
// own (a lane it calls on is capped, lanes.go).
func (u *uapCaller) inCPUGroup() bool { return u.cpuGroup == nil || u.cpuGroup() }

// Send answers every frame in b (call.Caller: one or more whole frames).
func (u *uapCaller) Send(b []byte) error {
	for len(b) > 0 {
		f, n, err := netio.Decode(b, math.MaxInt32)
		if err != nil {
			return fmt.Errorf("scd: answering a local call: %w", err)
		}
		u.answerFrame(f)
		b = b[n:]
	}
	return nil
}

// answerFrame writes one answer into the calling process's area.
func (u *uapCaller) answerFrame(f netio.Frame) {
	if f.Kind != netio.KindError {
		if u.p.AnswerOutCall(f.ID, 0, f.Payload) {
			return
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
	u.p.AnswerOutCall(f.ID, uint32(f.Code), []byte(msg[:min(len(msg), u.maxMsg)]))
}

// answer writes a completion of call no straight into the calling
// process's area, without waking it (the reader does, after its look:
// WakeOutCaller). It returns false for an answer it does not write this
// way (not a reply, or a reply too big for the caller): the caller then
// gets it through Send, as an error frame.
func (u *uapCaller) answer(no uint64, c *shm.Completion) bool {
	if c.Status != shm.StatusOK {
		return false
	}
	fits, _ := u.p.PublishOutAnswer(no, 0, c.Reply)
	return fits
}

// boundOutCall is the timeout of a call a process makes while serving a
// call whose deadline is served (unix ns, 0 none): the one it asked for
// (0: the target group's watch_time), but never past served. The process
// writes its own timeout, and an answer after the served call's deadline
// reaches nobody: a call left waiting so long would only keep the process
// and the target's queue room (a cycle of too few processes, until the
// target's watch_time, or for good where that is 0).
func boundOutCall(timeoutMs uint32, served int64, now time.Time) uint32 {
	if served == 0 {
		return timeoutMs
	}
	left := max(time.Duration(served-now.UnixNano()).Milliseconds(), 1)
	if timeoutMs == 0 || int64(timeoutMs) > left {
		return uint32(min(left, math.MaxUint32))
	}
	return timeoutMs
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
		f := netio.Frame{
			Header:  netio.Header{Kind: netio.KindCall, ID: lc.call.No, TimeoutMs: lc.call.TimeoutMs},
			Group:   lc.call.Group,
			Service: lc.call.Service,
			Payload: lc.call.Request,
		}
		if code, msg := g.place(lc.from, &f); code != netio.CodeOK {
			_ = lc.from.Send(netio.AppendError(nil, f.ID, code, msg))
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
