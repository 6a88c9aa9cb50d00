package shm

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// The binary layout is a contract with every UAP, Go or C: docs/SHM.md
// describes it in words, and layout_test.go asserts these offsets so that
// neither can drift. Integers are little-endian (the machine's own; tpsched
// runs on amd64 and arm64), 4-byte words are accessed atomically, and a
// store that publishes (dispatchNo, doneNo, state) comes after the fields it
// publishes.
const (
	// Version of the layout; a UAP refuses a segment of another version.
	Version = 5

	pageSize = 4096
	// maxName is the longest entry name (OpenTP1 service names have at most
	// 31 characters).
	maxName = 32
	// maxEntries is how many entry names a UAP can register.
	maxEntries = pageSize / maxName

	groupMagic = 0x505247484353_5054 // "TPSCHGRP" read as a little-endian u64
	procMagic  = 0x435250484353_5054 // "TPSCHPRC"

	// maxMessage bounds max_message_size: larger areas are refused.
	maxMessage = 1 << 30
)

// Offsets in the group page (one per service group, written only by the
// scheduler; a UAP can map it read-only only: it is sealed with
// F_SEAL_FUTURE_WRITE after the scheduler mapped it).
const (
	gMagic      = 0x00 // u64 groupMagic
	gVersion    = 0x08 // u32 Version
	gMaxMessage = 0x0C // u32 max_message_size
	gClosed     = 0x10 // u32 1: the node is stopping; leave once you hold no call
	gSleeping   = 0x40 // u32 1: the scheduler's reader sleeps: ring the doorbell after a completion
)

// Offsets in a process area (one per process, a fresh memfd at each spawn;
// the process may write all of it, the scheduler trusts none of it).
//
// A process holds up to Mailboxes calls: its current one and those handed
// over before it finished it (prefetch), each in a mailbox with a buffer
// of its own. Calls are numbered 1, 2, ... per process, one after the
// other, and put in any free mailbox; the claim word of the mailbox that
// holds call n says n and whether the call is offered (n<<2), taken by the
// UAP (n<<2|1, before the handler runs) or revoked by the scheduler
// (n<<2|2): the UAP and the scheduler move it from offered with a
// compare-and-swap, so exactly one of them wins. The UAP takes calls in
// number order, finding each by its claim word, and skips a revoked one
// (its mailbox may already hold a later call).
const (
	// Page 0, line 0: written by the scheduler.
	pMagic      = 0x00 // u64 procMagic
	pVersion    = 0x08 // u32 Version
	pMaxMessage = 0x0C // u32 max_message_size: each buffer's size
	pWake       = 0x10 // u32 futex word: +1 at every call handed over, stop and close; the UAP sleeps on it
	pStop       = 0x14 // u32 1: leave once you hold no call
	pDispatchNo = 0x18 // u64 number of the latest call handed over; 0 before the first
	pMailboxes  = 0x20 // u32 the number of mailboxes, 1..MaxMailboxes
	pLaneIn     = 0x24 // u32 the lane the process serves as its callee (its generation); 0 none (lane.go)
	pLaneOut    = 0x28 // u32 the lane the process calls on; 0 none

	// Page 0, line 1: written by the UAP.
	pState     = 0x40 // u32 stateNew, stateReady (serving) or stateLeft
	pSleeping  = 0x44 // u32 1: the UAP sleeps (or is about to) on pWake
	pDoneNo    = 0x48 // u64 number of the last call completed, stored after its status and reply
	pPID       = 0x50 // u32 the UAP's process id
	pEntries   = 0x54 // u32 number of entry names registered in page 1
	pLanes     = 0x58 // u32 1: the UAP reads its control line and takes lanes
	pLaneInOn  = 0x5C // u32 the lane it serves, once mapped (pLaneIn's generation); 0 once it left it
	pLaneOutOn = 0x60 // u32 the lane it calls on, once mapped; 0 once it let it go

	// Page 0, lines 2 onwards: the mailboxes, one line each. The
	// scheduler writes the request's fields, the UAP the completion's; the
	// claim word is moved by both.
	pMailbox    = 0x80 // mailbox i at pMailbox + i*mailboxSize
	mailboxSize = 0x40
	mClaim      = 0x00 // u64 n<<2 | claimOffered, claimTaken or claimRevoked
	mDeadline   = 0x08 // i64 unix ns after which the UAP must not start the call; 0 none
	mReqLen     = 0x10 // u32 request length in the mailbox's buffer
	mEntryLen   = 0x14 // u32 length of the entry name
	mStatus     = 0x18 // u32 Status of the completion (UAP)
	mReplyLen   = 0x1C // u32 reply length in the mailbox's buffer (UAP)
	mEntry      = 0x20 // [32]byte entry name

	// MaxMailboxes is as many as page 0 holds before the out-call lines.
	MaxMailboxes = (pOut - pMailbox) / mailboxSize

	// Page 0, the last two lines: the process's own call to another
	// service (a local call, UAP.Call), one at a time. Line 62 is written
	// by the UAP, line 63 by the scheduler. The call's group name, service
	// name and request lie one after the other in the out buffer, and the
	// answer is written over them.
	pOut           = pageSize - 2*0x40
	pOutNo         = pOut + 0x00 // u64 number of the UAP's latest call, stored after its fields (UAP)
	pOutTimeout    = pOut + 0x08 // u32 ms the UAP waits at most; 0 the group's watch_time (UAP)
	pOutGroupLen   = pOut + 0x0C // u32 bytes of the group name, 1..31 (UAP)
	pOutServiceLen = pOut + 0x10 // u32 bytes of the service name, 1..31 (UAP)
	pOutReqLen     = pOut + 0x14 // u32 bytes of the request, up to max_message_size (UAP)
	pOutSleeping   = pOut + 0x18 // u32 1: the UAP sleeps (or is about to) on pOutWake (UAP)
	pOutDone       = pOut + 0x40 // u64 number of the last call answered, stored after the answer (scheduler)
	pOutCode       = pOut + 0x48 // u32 0: the buffer holds the reply; else an error code (netio's), the buffer its message (scheduler)
	pOutReplyLen   = pOut + 0x4C // u32 bytes of the reply or message (scheduler)
	pOutWake       = pOut + 0x50 // u32 futex word: +1 at every answer (scheduler)

	// Page 1: entry names the UAP registered, maxName bytes each,
	// NUL-padded; written before pState becomes stateReady.
	pEntryTable = pageSize

	// Page 2 onwards: the mailboxes' buffers, mailbox i's at pBuffer +
	// i*stride, stride being max_message_size rounded up to a page: the
	// request in, the reply out, in place. Then the out buffer, of
	// max_message_size plus room for the two names, rounded up to a page.
	pBuffer = 2 * pageSize

	// outNames is the room the out buffer keeps for the names.
	outNames = 2 * maxName
)

// Claim states, in the low two bits of a mailbox's claim word.
const (
	claimOffered = 0
	claimTaken   = 1
	claimRevoked = 2
)

// Process states in pState.
const (
	stateNew   = 0 // mapped by the scheduler, no UAP yet
	stateReady = 1 // the UAP serves: waits for calls or runs one
	stateLeft  = 2 // the UAP left (stop, close, refresh) and exits
)

// groupPage is the group page as the scheduler and the UAP see it.
type groupPage struct {
	magic      uint64
	version    uint32
	maxMessage uint32
	closed     atomic.Uint32
	_          [0x40 - 0x14]byte
	sleeping   atomic.Uint32
}

// mailbox is one call handed to a process.
type mailbox struct {
	claim    atomic.Uint64
	deadline int64
	reqLen   uint32
	entryLen uint32
	status   atomic.Uint32
	replyLen atomic.Uint32
	entry    [maxName]byte
}

// procCtl is page 0 of a process area.
type procCtl struct {
	magic      uint64
	version    uint32
	maxMessage uint32
	wake       atomic.Uint32
	stop       atomic.Uint32
	dispatchNo atomic.Uint64
	mailboxes  uint32
	laneIn     atomic.Uint32
	laneOut    atomic.Uint32
	_          [pState - 0x2C]byte
	state      atomic.Uint32
	sleeping   atomic.Uint32
	doneNo     atomic.Uint64
	pid        atomic.Uint32
	entries    atomic.Uint32
	lanes      atomic.Uint32
	laneInOn   atomic.Uint32
	laneOutOn  atomic.Uint32
	_          [pMailbox - 0x64]byte
	mb         [MaxMailboxes]mailbox
	out        outCall
}

// outCall is the process's call to another service (the last two lines
// of page 0).
type outCall struct {
	no         atomic.Uint64
	timeoutMs  uint32
	groupLen   uint32
	serviceLen uint32
	reqLen     uint32
	sleeping   atomic.Uint32
	_          [0x40 - 0x1C]byte
	done       atomic.Uint64
	code       atomic.Uint32
	replyLen   atomic.Uint32
	wake       atomic.Uint32
	_          [0x40 - 0x14]byte
}

// Compile-time checks that the structs are where the offsets say; the test
// checks every field.
var (
	_ [pageSize - unsafe.Sizeof(groupPage{})]byte
	_ [mailboxSize - unsafe.Sizeof(mailbox{})]byte
	_ [unsafe.Sizeof(mailbox{}) - mailboxSize]byte
	_ [pageSize - unsafe.Sizeof(procCtl{})]byte
	_ [unsafe.Sizeof(procCtl{}) - pageSize]byte
	_ [2*0x40 - unsafe.Sizeof(outCall{})]byte
)

// bufStride is the size of each buffer for max_message_size maxMsg.
func bufStride(maxMsg int) int { return int(alignUp(uint64(maxMsg), pageSize)) }

// outStride is the size of the out buffer for max_message_size maxMsg.
func outStride(maxMsg int) int { return int(alignUp(uint64(maxMsg+outNames), pageSize)) }

// areaSize is the size of a process area with mailboxes mailboxes for
// max_message_size maxMsg: two pages, a buffer per mailbox and the out
// buffer.
func areaSize(maxMsg, mailboxes int) int64 {
	return pBuffer + int64(mailboxes)*int64(bufStride(maxMsg)) + int64(outStride(maxMsg))
}

func alignUp(v, a uint64) uint64 { return (v + a - 1) &^ (a - 1) }

func checkMaxMessage(maxMsg int) error {
	if maxMsg < 1 || maxMsg > maxMessage {
		return fmt.Errorf("shm: max_message_size %d out of range 1..%d", maxMsg, maxMessage)
	}
	return nil
}

// Status is how a UAP finished a call.
type Status uint32

// Completion statuses.
const (
	StatusOK            Status = iota // the reply is the service's reply
	StatusAppError                    // the handler failed; the reply is its message
	StatusNoSuchService               // the UAP has no handler for the entry
	StatusTimedOut                    // the deadline passed before the UAP started it
	statusEnd
)

func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusAppError:
		return "application error"
	case StatusNoSuchService:
		return "no such service"
	case StatusTimedOut:
		return "timed out"
	}
	return fmt.Sprintf("status(%d)", uint32(s))
}
