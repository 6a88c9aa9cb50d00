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
	Version = 4

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
const (
	// Page 0, line 0: written by the scheduler.
	pMagic      = 0x00 // u64 procMagic
	pVersion    = 0x08 // u32 Version
	pMaxMessage = 0x0C // u32 max_message_size: each buffer's size
	pWake       = 0x10 // u32 futex word: +1 at every dispatch, stop and close; the UAP sleeps on it
	pDispatchNo = 0x14 // u32 number of the latest dispatch (1, 2, ...), 0 before the first
	pReqLen     = 0x18 // u32 request length in the buffer
	pEntryLen   = 0x1C // u32 length of the entry name
	pDeadline   = 0x20 // i64 unix ns after which the UAP must not start the call; 0 none
	pStop       = 0x28 // u32 1: leave once you hold no call
	pEntry      = 0x40 // [32]byte entry name of the dispatched call

	// Page 0, line 2: written by the UAP.
	pState    = 0x80 // u32 stateNew, stateReady (serving) or stateLeft
	pSleeping = 0x84 // u32 1: the UAP sleeps (or is about to) on pWake
	pTakenNo  = 0x88 // u32 dispatchNo of the last call taken, stored before its handler runs
	pDoneNo   = 0x8C // u32 dispatchNo of the last call completed, stored after status and reply
	pStatus   = 0x90 // u32 Status of that completion
	pReplyLen = 0x94 // u32 reply length in the buffer
	pPID      = 0x98 // u32 the UAP's process id
	pEntries  = 0x9C // u32 number of entry names registered in page 1

	// Page 1: entry names the UAP registered, maxName bytes each,
	// NUL-padded; written before pState becomes stateReady.
	pEntryTable = pageSize

	// Page 2 onwards: the buffer (max_message_size rounded up to a page):
	// the request in, the reply out, in place.
	pBuffer = 2 * pageSize
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

// procCtl is page 0 of a process area.
type procCtl struct {
	magic      uint64
	version    uint32
	maxMessage uint32
	wake       atomic.Uint32
	dispatchNo atomic.Uint32
	reqLen     uint32
	entryLen   uint32
	deadline   int64
	stop       atomic.Uint32
	_          [0x40 - 0x2C]byte
	entry      [maxName]byte
	_          [0x80 - 0x60]byte
	state      atomic.Uint32
	sleeping   atomic.Uint32
	takenNo    atomic.Uint32
	doneNo     atomic.Uint32
	status     atomic.Uint32
	replyLen   atomic.Uint32
	pid        atomic.Uint32
	entries    atomic.Uint32
}

// Compile-time checks that the structs are where the offsets say; the test
// checks every field.
var (
	_ [pageSize - unsafe.Sizeof(groupPage{})]byte
	_ [0x40 - unsafe.Sizeof(procCtl{})%0x40]byte
	_ [pageSize - unsafe.Sizeof(procCtl{})]byte
)

// areaSize is the size of a process area for max_message_size maxMsg: two
// pages and the buffer.
func areaSize(maxMsg int) int64 {
	return pBuffer + int64(alignUp(uint64(maxMsg), pageSize))
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
