package shm

import (
	"context"
	"errors"
	"os"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The UAP's side of lanes (lane.go): its control line, the lane it serves
// as a callee (Serve's goroutine) and the lane it calls on (under the
// out-call lock).

// controlLine is the UAP's end of its control line and the grants read
// from it and not yet used, the latest per role.
type controlLine struct {
	mu  sync.Mutex
	fd  int // -1: none (a UAP started without one, or the line ended)
	got [roleCaller + 1]struct {
		m  laneGrant
		fd int // -1: none
	}
}

// openControlLine takes fd as the process's control line if it is one (a
// SOCK_SEQPACKET socket); nil otherwise: the process then takes no lanes.
func openControlLine(fd int) *controlLine {
	if typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || typ != unix.SOCK_SEQPACKET {
		return nil
	}
	unix.CloseOnExec(fd) // the UAP's own children get none of its lanes
	c := &controlLine{fd: fd}
	for i := range c.got {
		c.got[i].fd = -1
	}
	return c
}

// take returns the grant of generation gen for role, reading whatever the
// line holds; false when it has not come (or never will).
func (c *controlLine) take(role, gen uint32) (laneGrant, int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.read()
	g := &c.got[role]
	if g.fd < 0 || g.m.gen != gen {
		return laneGrant{}, -1, false
	}
	m, fd := g.m, g.fd
	g.fd = -1
	return m, fd, true
}

// read takes every message waiting on the line, keeping the latest grant
// per role and closing the descriptors of those it replaces or cannot use.
func (c *controlLine) read() {
	var buf [laneMsgSize + 1]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	for c.fd >= 0 {
		n, oobn, _, _, err := unix.Recvmsg(c.fd, buf[:], oob, unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 && oobn == 0 {
			if err != unix.EAGAIN {
				unix.Close(c.fd) // ended: no more lanes
				c.fd = -1
			}
			return
		}
		var fds []int
		if cms, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, cm := range cms {
				if r, err := unix.ParseUnixRights(&cm); err == nil {
					fds = append(fds, r...)
				}
			}
		}
		m, ok := decodeLaneGrant(buf[:n])
		if !ok || len(fds) != 1 {
			for _, fd := range fds {
				unix.Close(fd)
			}
			continue
		}
		g := &c.got[m.role]
		if g.fd >= 0 {
			unix.Close(g.fd)
		}
		g.m, g.fd = m, fds[0]
	}
}

func (c *controlLine) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.got {
		if c.got[i].fd >= 0 {
			unix.Close(c.got[i].fd)
			c.got[i].fd = -1
		}
	}
	if c.fd >= 0 {
		unix.Close(c.fd)
		c.fd = -1
	}
}

// laneEnd is a UAP's mapping of one lane.
type laneEnd struct {
	grant laneGrant
	mem   []byte
	h     *laneHdr
	buf   []byte
	entry []byte // the callee's entry name
	spin  spinner
}

// mapLane maps the lane in fd, which m granted, and closes fd.
func mapLane(m laneGrant, fd int) (*laneEnd, error) {
	defer unix.Close(fd)
	mem, err := mapFD(fd, unix.PROT_READ|unix.PROT_WRITE)
	if err != nil {
		return nil, err
	}
	h := (*laneHdr)(unsafe.Pointer(&mem[0]))
	if int64(len(mem)) != laneSize(int(m.maxMsg)) || h.magic != laneMagicValue || h.version != Version ||
		h.gen != m.gen || h.maxMessage != m.maxMsg || m.maxMsg < 1 || m.maxMsg > maxMessage {
		unix.Munmap(mem)
		return nil, os.ErrInvalid
	}
	n := int(m.maxMsg)
	return &laneEnd{grant: m, mem: mem, h: h, buf: mem[lBuffer : lBuffer+n : lBuffer+n], entry: []byte(m.entry), spin: newSpinner(spinMax)}, nil
}

func (e *laneEnd) unmap() {
	if e.mem != nil {
		unix.Munmap(e.mem)
		e.mem, e.h, e.buf = nil, nil, nil
	}
}

// pending reports whether the caller made a call the callee has not taken.
func (e *laneEnd) pending() bool {
	c := e.h.claim.Load()
	return laneFinal(c) && e.h.seq.Load() != c>>8
}

// syncLaneIn brings the lane the process serves in step with its area:
// it leaves one the scheduler revoked and maps one granted. Between calls,
// on Serve's goroutine.
func (u *UAP) syncLaneIn() {
	gen := u.ctl.laneIn.Load()
	if e := u.laneIn; e != nil {
		if e.grant.gen == gen {
			return
		}
		u.leaveLaneIn()
	}
	if gen == 0 || gen == u.laneInTried {
		return
	}
	u.laneInTried = gen // one try per grant: a grant that fails is the scheduler's to revoke
	if e := u.mapGranted(roleCallee, gen); e != nil {
		u.laneIn = e
		u.ctl.laneInOn.Store(gen)
	}
}

// mapGranted maps the lane of generation gen that the node granted the
// process in role; nil if its grant has not come or cannot be mapped.
func (u *UAP) mapGranted(role, gen uint32) *laneEnd {
	if u.line == nil {
		return nil
	}
	m, fd, ok := u.line.take(role, gen)
	if !ok {
		return nil
	}
	e, err := mapLane(m, fd)
	if err != nil {
		return nil
	}
	return e
}

// takeLane claims the call the caller made on the lane the process
// serves; 0 when there is none (or the lane was revoked).
func (u *UAP) takeLane() uint64 {
	e := u.laneIn
	if e == nil || u.ctl.laneIn.Load() != e.grant.gen {
		return 0
	}
	c := e.h.claim.Load()
	if !laneFinal(c) || e.h.seq.Load() == c>>8 {
		return 0
	}
	n := c>>8 + 1
	if !e.h.claim.CompareAndSwap(c, n<<8|laneTaken) {
		return 0 // ruled meanwhile: given back to the caller
	}
	return n
}

// serveLane runs call n, which takeLane claimed, and answers it into the
// lane: the lane is the process's until it stores done.
func (u *UAP) serveLane(n uint64) {
	e := u.laneIn
	h := e.h
	reqLen := min(uint64(h.reqLen.Load()), uint64(len(e.buf)))
	deadline := h.deadline.Load()
	if w := e.grant.watchMs; w > 0 {
		if bound := time.Now().Add(time.Duration(w) * time.Millisecond).UnixNano(); deadline == 0 || deadline > bound {
			deadline = bound
		}
	}
	u.curDeadline.Store(deadline)
	st, rl := u.run(e.buf, reqLen, deadline, e.entry)
	u.curDeadline.Store(0)
	h.status.Store(uint32(st))
	h.replyLen.Store(uint32(rl))
	if h.claim.CompareAndSwap(n<<8|laneTaken, n<<8|laneDone) {
		h.callerWake.Add(1)
		if s := &h.callerSleeping; s.Load() != 0 && s.Swap(0) != 0 {
			futexWake(&h.callerWake, 1)
		}
	}
}

// syncLaneOut brings the lane the process calls on in step with its area,
// under the out-call lock.
func (u *UAP) syncLaneOut() {
	o := &u.out
	gen := u.ctl.laneOut.Load()
	if e := o.lane; e != nil {
		if e.grant.gen == gen {
			return
		}
		u.dropLane()
	}
	if gen == 0 || gen == o.laneTried {
		return
	}
	o.laneTried = gen
	if e := u.mapGranted(roleCaller, gen); e != nil {
		o.lane = e
		u.ctl.laneOutOn.Store(gen)
	}
}

// leaveLaneIn unmaps the lane the process serves and says so: it takes no
// call on it from here. Between calls.
func (u *UAP) leaveLaneIn() {
	if e := u.laneIn; e != nil {
		u.ctl.laneInOn.Store(0)
		e.unmap()
		u.laneIn = nil
		if u.gp.sleeping.Load() != 0 {
			ring(u.bell) // the node gives the process back to the queue at its next look
		}
	}
}

// dropLane unmaps the lane the process called on: revoked, or out of
// step with it (a call abandoned on it, an answer that breaks it).
func (u *UAP) dropLane() {
	o := &u.out
	if e := o.lane; e != nil {
		u.ctl.laneOutOn.Store(0)
		e.unmap()
		o.lane = nil
	}
}

// callLane makes a call on the lane to group/service, if the process has
// one for it: sent is false when it has none, or the call was given back
// unrun (the lane was revoked before the callee took it); the caller then
// makes it the usual way. Under the out-call lock.
func (u *UAP) callLane(ctx context.Context, group, service string, req []byte, deadline int64) (reply []byte, err error, sent bool) {
	u.syncLaneOut()
	o := &u.out
	e := o.lane
	if e == nil || e.grant.group != group || e.grant.service != service || len(req) > len(e.buf) {
		return nil, nil, false
	}
	h := e.h
	c := h.claim.Load()
	if !laneFinal(c) || h.seq.Load() != c>>8 {
		u.dropLane() // its last call is not over: abandoned, or the lane broken
		return nil, nil, false
	}
	n := c>>8 + 1
	if w := e.grant.watchMs; w > 0 {
		if bound := time.Now().Add(time.Duration(w) * time.Millisecond).UnixNano(); deadline == 0 || deadline > bound {
			deadline = bound
		}
	}
	copy(e.buf, req)
	h.reqLen.Store(uint32(len(req)))
	h.deadline.Store(deadline)
	h.seq.Store(n) // publishes the call
	if u.ctl.laneOut.Load() != e.grant.gen {
		// Revoked as it was made: take it back unless the callee took
		// it (or the scheduler gave it back: the claim says which).
		if h.claim.CompareAndSwap(c, n<<8|laneMoved<<2|laneRuled) {
			u.dropLane()
			return nil, nil, false
		}
	}
	h.calleeWake.Add(1)
	if s := &h.calleeSleeping; s.Load() != 0 && s.Swap(0) != 0 {
		futexWake(&h.calleeWake, 1)
	}
	ended := func() bool { c := h.claim.Load(); return c>>8 == n && laneFinal(c) }
	var late int64 // past it the node's ruling did not reach the call: a claim forged
	if deadline != 0 {
		late = deadline + int64(laneLate)
	}
	idle, err := u.awaitLane(ctx, e, ended, late)
	if err == errLaneLate {
		u.dropLane()
		return nil, &CallError{Code: codeTimedOut, Message: "timed out: no answer on the lane by its deadline"}, true
	}
	if err != nil {
		u.dropLane() // the call is not over: the lane is out of step
		return nil, err, true
	}
	if idle > laneIdleWakes {
		defer u.dropLane() // woken for nothing again and again: a callee that floods its caller
	}
	if code, ruled := laneRuling(h.claim.Load()); ruled {
		if code == laneMoved {
			u.dropLane()
			return nil, nil, false
		}
		msg := string(h.ruleText[:min(int(h.ruleLen.Load()), laneRuleMax)])
		// Over for the caller, maybe not for the callee ('timed out'
		// while it ran): it may still read the buffer and write its
		// reply there, so no further call shares the buffer with it.
		u.dropLane()
		return nil, &CallError{Code: code, Message: msg}, true
	}
	rl := min(int(h.replyLen.Load()), len(e.buf))
	switch st := Status(h.status.Load()); st {
	case StatusOK:
		return append([]byte(nil), e.buf[:rl]...), nil, true
	case StatusAppError:
		return nil, &CallError{Code: codeApplication, Message: "application error: " + string(e.buf[:rl])}, true
	case StatusNoSuchService:
		return nil, &CallError{Code: codeNoSuchService, Message: "no such service: entry " + string(e.buf[:rl]) + " is not registered by the UAP"}, true
	case StatusTimedOut:
		return nil, &CallError{Code: codeTimedOut, Message: "timed out: its deadline passed before the UAP process started it"}, true
	default:
		u.dropLane()
		return nil, &CallError{Code: codeProtocol, Message: "protocol error: the UAP process answered with an unknown status"}, true
	}
}

// The codes of the tpsched frame protocol (netio's) that a call on a lane
// answers by itself, without the node; scd/local's tests hold them to
// netio.
const (
	codeNoSuchService = 2
	codeTimedOut      = 5
	codeProtocol      = 9
	codeApplication   = 10
)

// laneIdleWakes bounds the wake-ups that bring no answer in one call on a
// lane: past it the caller lets the lane go after the call (the node's
// own wake-ups, a revoke or a ruling, are one or two).
const laneIdleWakes = 64

// laneLate is how long after its deadline a call on a lane waits for the
// node's ruling before the caller ends it itself, 'timed out': the ruling
// follows the claim word, which the callee can forge.
const laneLate = time.Second

// errLaneLate is awaitLane's error past late.
var errLaneLate = errors.New("shm: no answer on the lane past its deadline")

// awaitLane waits until ended on the lane's word for the caller
// (awaitAnswer), errLaneLate past late (unix ns; 0 none).
func (u *UAP) awaitLane(ctx context.Context, e *laneEnd, ended func() bool, late int64) (idle int, err error) {
	return u.awaitAnswer(ctx, &e.spin, &e.h.callerWake, &e.h.callerSleeping, ended, late)
}
