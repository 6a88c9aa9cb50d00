package shm

import (
	"testing"
	"unsafe"
)

// TestLayoutOffsets holds the Go structs to the offsets of layout.go, which
// docs/SHM.md and the C library (uap-c/tpsched_uap.h) repeat: a field that
// moves fails here.
func TestLayoutOffsets(t *testing.T) {
	var g groupPage
	var p procCtl
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"group magic", unsafe.Offsetof(g.magic), gMagic},
		{"group version", unsafe.Offsetof(g.version), gVersion},
		{"group max message", unsafe.Offsetof(g.maxMessage), gMaxMessage},
		{"group closed", unsafe.Offsetof(g.closed), gClosed},
		{"group sleeping", unsafe.Offsetof(g.sleeping), gSleeping},
		{"proc magic", unsafe.Offsetof(p.magic), pMagic},
		{"proc version", unsafe.Offsetof(p.version), pVersion},
		{"proc max message", unsafe.Offsetof(p.maxMessage), pMaxMessage},
		{"proc wake", unsafe.Offsetof(p.wake), pWake},
		{"proc dispatch no", unsafe.Offsetof(p.dispatchNo), pDispatchNo},
		{"proc request length", unsafe.Offsetof(p.reqLen), pReqLen},
		{"proc entry length", unsafe.Offsetof(p.entryLen), pEntryLen},
		{"proc deadline", unsafe.Offsetof(p.deadline), pDeadline},
		{"proc stop", unsafe.Offsetof(p.stop), pStop},
		{"proc entry", unsafe.Offsetof(p.entry), pEntry},
		{"proc state", unsafe.Offsetof(p.state), pState},
		{"proc sleeping", unsafe.Offsetof(p.sleeping), pSleeping},
		{"proc taken no", unsafe.Offsetof(p.takenNo), pTakenNo},
		{"proc done no", unsafe.Offsetof(p.doneNo), pDoneNo},
		{"proc status", unsafe.Offsetof(p.status), pStatus},
		{"proc reply length", unsafe.Offsetof(p.replyLen), pReplyLen},
		{"proc pid", unsafe.Offsetof(p.pid), pPID},
		{"proc entries", unsafe.Offsetof(p.entries), pEntries},
	} {
		if c.got != c.want {
			t.Errorf("%s at offset %#x, the layout says %#x", c.name, c.got, c.want)
		}
	}
	if got := areaSize(1); got != pBuffer+pageSize {
		t.Errorf("area of a 1-byte max message is %d bytes, want %d", got, pBuffer+pageSize)
	}
	if got := areaSize(pageSize + 1); got != pBuffer+2*pageSize {
		t.Errorf("area of a %d-byte max message is %d bytes, want %d", pageSize+1, got, pBuffer+2*pageSize)
	}
}
