package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A lane is a caller process's calls to one service of another group,
// made straight to one callee process reserved for it, with no thread of
// the scheduler on the call's path: the caller writes the request into the
// lane and wakes the callee, the callee answers into the lane and wakes
// the caller. The scheduler grants and revokes lanes, and rules a call the
// callee did not finish (its death, the deadline, a revoke before it took
// the call) through the claim word, which it and the callee move with a
// compare-and-swap, so that exactly one of them ends each call.
//
// A lane is a fresh memfd per grant, mapped by the scheduler, the caller
// and the callee, and by nobody else: its descriptor reaches each process
// over the process's control line (a SOCK_SEQPACKET socket, fd 6), and a
// word of the process's own area (pLaneIn, pLaneOut), which only the
// scheduler writes for it, says which lane it holds, and a word of its
// own (pLaneInOn, pLaneOutOn) says when it mapped it and when it let it go:
// what the node decides from never rests on a word the other process can
// write. Both processes may
// write all of the lane: what either can spoil is the calls made on it, the
// caller's own and the callee's handed ones. The size is sealed, so that
// neither can make the other's mapping fault. docs/SHM.md, "Lanes", is the
// byte-level specification.

// Offsets in a lane (page 0, then the buffer: the request in, the reply
// out, in place).
const (
	laneMagicValue = 0x454E_414C_4843_5054 // "TPCHLANE" read as a little-endian u64

	// Line 0: written by the caller.
	lSeq            = 0x00 // u64 number of the caller's latest call, stored after its fields
	lDeadline       = 0x08 // i64 unix ns after which the callee must not start it; 0 none
	lReqLen         = 0x10 // u32 request length in the buffer
	lCallerSleeping = 0x14 // u32 1: the caller sleeps (or is about to) on lCallerWake
	lCalleeWake     = 0x18 // u32 futex word: +1 at every call (caller) and revoke, stop, close (scheduler)

	// Line 1: written by the callee.
	lCalleeSleeping = 0x40 // u32 1: the callee sleeps (or is about to) on lCalleeWake
	lStatus         = 0x44 // u32 Status of the completion
	lReplyLen       = 0x48 // u32 reply length in the buffer
	lCallerWake     = 0x4C // u32 futex word: +1 at every completion (callee) and ruling (scheduler)

	// Line 2: the claim, moved by the callee and the scheduler (and by the
	// caller to take back a call it made as the lane was revoked).
	lClaim = 0x80 // u64 n<<8 | code<<2 | laneTaken, laneDone or laneRuled

	// Lines 3 onwards: written by the scheduler.
	lMagic      = 0xC0  // u64 laneMagicValue
	lVersion    = 0xC8  // u32 Version
	lGen        = 0xCC  // u32 the lane's generation, as in pLaneIn and pLaneOut
	lMaxMessage = 0xD0  // u32 the buffer's size: the callee group's max_message_size
	lRuleLen    = 0xD4  // u32 length of lRuleText
	lRuleText   = 0x100 // [laneRuleMax]byte the scheduler's message for its last ruling

	laneRuleMax = 0x100
	lBuffer     = pageSize
)

// Claim states in the low two bits of the claim word. The claim of call n
// goes from the last call's final state (done or ruled, n-1) to taken n
// (the callee, before the handler runs) and then to done n (the callee) or
// ruled n (the scheduler, with the code of its answer), or straight to
// ruled n when the callee never took it. A ruling with code 0 means the
// call never ran and was not answered: the caller sends it the usual way.
const (
	laneTaken = 1
	laneDone  = 2
	laneRuled = 3

	laneMoved = 0 // the code of a ruling that gives the call back unrun
)

// laneFinal reports whether claim c ends its call.
func laneFinal(c uint64) bool { return c&3 >= laneDone }

// laneRuling reports whether claim c is a ruling, and its code.
func laneRuling(c uint64) (code uint32, ruled bool) {
	return uint32(c>>2) & 0x3F, c&3 == laneRuled
}

// laneHdr is page 0 of a lane.
type laneHdr struct {
	seq            atomic.Uint64
	deadline       atomic.Int64
	reqLen         atomic.Uint32
	callerSleeping atomic.Uint32
	calleeWake     atomic.Uint32
	_              [lCalleeSleeping - 0x1C]byte
	calleeSleeping atomic.Uint32
	status         atomic.Uint32
	replyLen       atomic.Uint32
	callerWake     atomic.Uint32
	_              [lClaim - 0x50]byte
	claim          atomic.Uint64
	_              [lMagic - 0x88]byte
	magic          uint64
	version        uint32
	gen            uint32
	maxMessage     uint32
	ruleLen        atomic.Uint32
	_              [lRuleText - 0xD8]byte
	ruleText       [laneRuleMax]byte
}

var _ [lBuffer - unsafe.Sizeof(laneHdr{})]byte

// laneSize is the size of a lane whose buffer holds maxMsg bytes.
func laneSize(maxMsg int) int64 { return lBuffer + int64(bufStride(maxMsg)) }

// LaneSpec is what a lane serves: one service of the callee's group,
// called by the caller as Group and Service and run by the callee as
// Entry, each call at most Watch (the callee group's watch_time; 0 none).
type LaneSpec struct {
	Group, Service, Entry string
	Watch                 time.Duration
}

// Lane is the scheduler's side of one lane. Every method runs under the
// callee's group lock; what it writes into the caller's area it writes
// under the caller's own out-call lock, so a caller in another group (or
// one that died) is safe to reach.
type Lane struct {
	gen    uint32
	caller *Proc
	callee *Proc
	f      *os.File
	mem    []byte
	h      *laneHdr
	seen   uint64 // the last call whose end Look counted
	ruled  uint64 // calls Rule ended and Look has not yet counted
	// gaveBack is the call Rule last gave back unrun (laneMoved), which
	// Look tells from one the caller took back.
	gaveBack uint64
}

// Errors of NewLane.
var (
	ErrNoLanes = errors.New("shm: the process takes no lanes")
)

// LanesOK reports whether the process takes lanes: it attached, said it
// reads its control line, and was not refused one (NoLanes).
func (p *Proc) LanesOK() bool {
	return p.line != nil && p.attached.Load() && p.ctl.lanes.Load() == 1 && !p.noLanes.Load() && !p.ignored.Load()
}

// CallerLanesOK is LanesOK for a process met as a caller: it may be
// another group's, and may have ended and had its area unmapped by the
// reader (a call it made is completed after it died). Under outMu, as the
// caller's area is written, so false once the area is gone.
func (p *Proc) CallerLanesOK() bool {
	p.outMu.Lock()
	defer p.outMu.Unlock()
	return !p.outGone && p.LanesOK()
}

// NoLanes says the process gets no lane again (it did not take one it was
// given, or broke one).
func (p *Proc) NoLanes() { p.noLanes.Store(true) }

// NewLane grants a lane of generation gen (non-zero, unique on the node)
// from caller to callee for spec: a fresh lane, sent to both over their
// control lines, each told by its area. The callee must hold no call and
// get none while the lane is granted; the caller may be in any group.
// Under the callee's group lock.
func NewLane(caller, callee *Proc, gen uint32, spec LaneSpec) (*Lane, error) {
	switch {
	case gen == 0:
		return nil, errors.New("shm: lane generation 0")
	case !caller.CallerLanesOK() || !callee.LanesOK():
		return nil, ErrNoLanes
	case callee.laneIn != nil:
		return nil, errors.New("shm: the callee serves a lane already")
	case len(spec.Group) >= maxName || len(spec.Service) >= maxName || len(spec.Entry) > maxName:
		return nil, ErrNameTooLong
	}
	maxMsg := callee.g.maxMsg
	f, mem, err := createMemfd(fmt.Sprintf("lane-%d", gen), laneSize(maxMsg))
	if err != nil {
		return nil, err
	}
	l := &Lane{gen: gen, caller: caller, callee: callee, f: f, mem: mem, h: (*laneHdr)(unsafe.Pointer(&mem[0]))}
	l.h.version, l.h.gen, l.h.maxMessage = Version, gen, uint32(maxMsg)
	l.h.claim.Store(laneDone) // call 0 is done: call 1 may be made
	atomic.StoreUint64(&l.h.magic, laneMagicValue)
	watchMs := uint32(min(spec.Watch.Milliseconds(), 1<<31))
	// The caller first: a grant that fails there has reached nobody. One
	// that then fails at the callee is revoked at once (a call the caller
	// made on it meanwhile is given back), and the callee, which never
	// got it, never sleeps on it.
	if err := caller.grantOut(l, laneGrant{gen: gen, role: roleCaller, watchMs: watchMs, maxMsg: uint32(maxMsg), group: spec.Group, service: spec.Service}); err != nil {
		if !errors.Is(err, ErrClosed) {
			caller.NoLanes() // its line is full or gone: it does not read it
		}
		l.Close()
		return nil, fmt.Errorf("shm: granting a lane to pid %d: %w", caller.PID(), err)
	}
	if err := sendLane(callee.line, laneGrant{gen: gen, role: roleCallee, watchMs: watchMs, maxMsg: uint32(maxMsg), entry: spec.Entry}, f); err != nil {
		callee.NoLanes() // its line is full or gone: it does not read it
		l.Revoke()
		l.Close()
		return nil, fmt.Errorf("shm: granting a lane to pid %d: %w", callee.PID(), err)
	}
	callee.ctl.laneIn.Store(gen)
	callee.laneIn = l
	callee.ctl.wake.Add(1)
	callee.Wake()
	return l, nil
}

// grantOut sends the caller its end of l and says in its area that it
// holds it, under outMu: the caller may be another group's, and its area
// and control line stay ours while we hold outMu.
func (p *Proc) grantOut(l *Lane, m laneGrant) error {
	p.outMu.Lock()
	defer p.outMu.Unlock()
	if p.outGone {
		return ErrClosed
	}
	if err := sendLane(p.line, m, l.f); err != nil {
		return err
	}
	p.ctl.laneOut.Store(l.gen)
	return nil
}

// Gen is the lane's generation.
func (l *Lane) Gen() uint32 { return l.gen }

// Callee is the process serving the lane.
func (l *Lane) Callee() *Proc { return l.callee }

// Caller is the process calling on the lane.
func (l *Lane) Caller() *Proc { return l.caller }

// CallerGone reports whether the caller's area is gone (it died and was
// removed): the lane has nobody to serve.
func (l *Lane) CallerGone() bool {
	l.caller.outMu.Lock()
	defer l.caller.outMu.Unlock()
	return l.caller.outGone
}

// CallerOn reports whether the caller says it mapped the lane (and has
// not let it go).
func (l *Lane) CallerOn() bool {
	c := l.caller
	c.outMu.Lock()
	defer c.outMu.Unlock()
	return !c.outGone && c.ctl.laneOutOn.Load() == l.gen
}

// Revoke ends the grant: both areas say so, and both processes are woken
// to see it. The callee finishes a call it took and leaves the lane (Look:
// CalleeOn false); the caller makes no new call on it; a call made and not
// taken is the scheduler's to give back (Rule with laneMoved), which
// Revoke does at once if it can.
func (l *Lane) Revoke() {
	if l.callee.laneIn == l {
		l.callee.ctl.laneIn.CompareAndSwap(l.gen, 0)
		l.callee.ctl.wake.Add(1)
		l.callee.Wake()
	}
	c := l.caller
	c.outMu.Lock()
	if !c.outGone {
		c.ctl.laneOut.CompareAndSwap(l.gen, 0)
	}
	c.outMu.Unlock()
	l.Rule(laneMoved, "")
	l.wakeCaller()
}

// wakeCaller rouses the caller if it sleeps on the lane.
func (l *Lane) wakeCaller() {
	h := l.h
	h.callerWake.Add(1)
	if s := &h.callerSleeping; s.Load() != 0 && s.Swap(0) != 0 {
		futexWake(&h.callerWake, 1)
	}
}

// wakeCallee rouses the callee if it sleeps on the lane.
func (l *Lane) wakeCallee() {
	h := l.h
	h.calleeWake.Add(1)
	if s := &h.calleeSleeping; s.Load() != 0 && s.Swap(0) != 0 {
		futexWake(&h.calleeWake, 1)
	}
}

// LaneLook is what the scheduler sees of a lane at one look.
type LaneLook struct {
	Completed uint64 // calls the callee completed since the last look
	Made      uint64 // the number of the caller's latest call (its word)
	Over      uint64 // the calls made on it and over, less one given back unrun (its caller sends it again the usual way)
	Open      bool   // a call is made and not ended
	Taken     bool   // the callee took it
	Deadline  int64  // the open call's deadline as the caller wrote it (unix ns, 0 none)
	CalleeOn  bool   // the callee says (in its area) it mapped the lane and has not left it
}

// Look reads the lane's words: nothing in them is trusted beyond the
// counts and rulings the scheduler makes from them. Completed counts from
// the last Look that counted (count true) on.
func (l *Lane) Look(count bool) LaneLook {
	h := l.h
	c, made := h.claim.Load(), h.seq.Load()
	n := c >> 8
	done := n
	if !laneFinal(c) {
		done = n - 1
	}
	var lk LaneLook
	if count && done > l.seen && done-l.seen < 1<<32 {
		// Its own rulings are not the callee's completions, and nor is
		// a call its caller took back unrun as the lane was revoked (a
		// give-back the scheduler did not rule: the lane's last call).
		ended := done - l.seen
		r := min(l.ruled, ended)
		lk.Completed, l.ruled = ended-r, l.ruled-r
		if code, ruled := laneRuling(c); ruled && code == laneMoved && n != l.gaveBack && lk.Completed > 0 {
			lk.Completed--
		}
		l.seen = done
	}
	lk.Made, lk.Over = made, done
	if code, ruled := laneRuling(c); ruled && code == laneMoved {
		// Given back: the last call on the lane (its caller lets the
		// lane go), counted where the caller sends it again.
		lk.Over--
	}
	lk.Taken = c&3 == laneTaken
	lk.Open = lk.Taken || made != n
	lk.Deadline = h.deadline.Load()
	lk.CalleeOn = l.callee.ctl.laneInOn.Load() == l.gen
	return lk
}

// Rule ends the lane's open call with code (a netio code; laneMoved
// gives a call the callee never took back to the caller, unrun, to send
// the usual way) and msg, and wakes the caller: true if the ruling won
// the claim. A call the callee took can only end with an answer code
// (never laneMoved): it may have run.
func (l *Lane) Rule(code uint32, msg string) bool { return l.rule(code, msg, false) }

// RuleTaken is Rule for a call the callee took only: a call made and not
// taken is left as it is (the callee's death: it goes back to its caller,
// Rule with laneMoved, never answered 'server terminated').
func (l *Lane) RuleTaken(code uint32, msg string) bool { return l.rule(code, msg, true) }

func (l *Lane) rule(code uint32, msg string, takenOnly bool) bool {
	h := l.h
	c, made := h.claim.Load(), h.seq.Load()
	n := c >> 8
	var next uint64
	switch {
	case c&3 == laneTaken && code != laneMoved:
		next = n<<8 | uint64(code&0x3F)<<2 | laneRuled
	case !takenOnly && laneFinal(c) && made != n:
		next = (n+1)<<8 | uint64(code&0x3F)<<2 | laneRuled
	default:
		return false
	}
	h.ruleLen.Store(uint32(copy(h.ruleText[:], msg)))
	if !h.claim.CompareAndSwap(c, next) {
		return false
	}
	l.ruled++
	if code == laneMoved {
		l.gaveBack = next >> 8
	}
	l.wakeCaller()
	return true
}

// Close releases the scheduler's mapping and descriptor of the lane: after
// Revoke, once neither side can still need a ruling.
func (l *Lane) Close() {
	if l.callee.laneIn == l {
		l.callee.laneIn = nil
	}
	if l.mem != nil {
		_ = unix.Munmap(l.mem)
		l.mem, l.h = nil, nil
	}
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
}

// The control line carries one message per grant, scheduler to process:
// the lane's descriptor (SCM_RIGHTS) and what it serves.
const (
	roleCallee = 1
	roleCaller = 2

	laneMsgMagic = 0x4C4E_4154 // "TANL"
	laneMsgSize  = 9*4 + 3*maxName
)

type laneGrant struct {
	gen, role, watchMs, maxMsg uint32
	group, service, entry      string
}

func (m laneGrant) encode() []byte {
	b := make([]byte, laneMsgSize)
	le := binary.LittleEndian
	le.PutUint32(b[0:], laneMsgMagic)
	le.PutUint32(b[4:], Version)
	le.PutUint32(b[8:], m.gen)
	le.PutUint32(b[12:], m.role)
	le.PutUint32(b[16:], m.watchMs)
	le.PutUint32(b[20:], m.maxMsg)
	le.PutUint32(b[24:], uint32(len(m.group)))
	le.PutUint32(b[28:], uint32(len(m.service)))
	le.PutUint32(b[32:], uint32(len(m.entry)))
	copy(b[36:], m.group)
	copy(b[36+maxName:], m.service)
	copy(b[36+2*maxName:], m.entry)
	return b
}

func decodeLaneGrant(b []byte) (laneGrant, bool) {
	le := binary.LittleEndian
	if len(b) != laneMsgSize || le.Uint32(b[0:]) != laneMsgMagic || le.Uint32(b[4:]) != Version {
		return laneGrant{}, false
	}
	m := laneGrant{gen: le.Uint32(b[8:]), role: le.Uint32(b[12:]), watchMs: le.Uint32(b[16:]), maxMsg: le.Uint32(b[20:])}
	gl, sl, el := le.Uint32(b[24:]), le.Uint32(b[28:]), le.Uint32(b[32:])
	if gl > maxName || sl > maxName || el > maxName || m.gen == 0 || (m.role != roleCallee && m.role != roleCaller) {
		return laneGrant{}, false
	}
	m.group = string(b[36 : 36+gl])
	m.service = string(b[36+maxName : 36+maxName+sl])
	m.entry = string(b[36+2*maxName : 36+2*maxName+el])
	return m, true
}

// sendLane sends m and the lane's descriptor over a control line, without
// blocking: a process whose line is full does not read it.
func sendLane(line *os.File, m laneGrant, lane *os.File) error {
	if line == nil {
		return ErrNoLanes
	}
	rights := unix.UnixRights(int(lane.Fd()))
	for {
		err := unix.Sendmsg(int(line.Fd()), m.encode(), rights, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		if err != unix.EINTR {
			return os.NewSyscallError("sendmsg", err)
		}
	}
}

// newControlLine makes a process's control line: our end, non-blocking,
// and the process's.
func newControlLine(name string) (ours, theirs *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, os.NewSyscallError("socketpair", err)
	}
	// The node never reads the line: what a process sends on it (even
	// descriptors) is refused at its send rather than held in our end.
	if err := unix.Shutdown(fds[0], unix.SHUT_RD); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, nil, os.NewSyscallError("shutdown", err)
	}
	return os.NewFile(uintptr(fds[0]), "control:tpsched-"+name), os.NewFile(uintptr(fds[1]), "control:tpsched-"+name), nil
}
