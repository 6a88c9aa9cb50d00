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
	var m mailbox
	var l laneHdr
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
		{"proc stop", unsafe.Offsetof(p.stop), pStop},
		{"proc dispatch no", unsafe.Offsetof(p.dispatchNo), pDispatchNo},
		{"proc mailboxes", unsafe.Offsetof(p.mailboxes), pMailboxes},
		{"proc lane in", unsafe.Offsetof(p.laneIn), pLaneIn},
		{"proc lane out", unsafe.Offsetof(p.laneOut), pLaneOut},
		{"proc state", unsafe.Offsetof(p.state), pState},
		{"proc sleeping", unsafe.Offsetof(p.sleeping), pSleeping},
		{"proc done no", unsafe.Offsetof(p.doneNo), pDoneNo},
		{"proc pid", unsafe.Offsetof(p.pid), pPID},
		{"proc entries", unsafe.Offsetof(p.entries), pEntries},
		{"proc lanes", unsafe.Offsetof(p.lanes), pLanes},
		{"proc lane in on", unsafe.Offsetof(p.laneInOn), pLaneInOn},
		{"proc lane out on", unsafe.Offsetof(p.laneOutOn), pLaneOutOn},
		{"proc mailbox 0", unsafe.Offsetof(p.mb), pMailbox},
		{"proc mailbox 1", unsafe.Offsetof(p.mb) + unsafe.Sizeof(p.mb[0]), pMailbox + mailboxSize},
		{"mailbox claim", unsafe.Offsetof(m.claim), mClaim},
		{"mailbox deadline", unsafe.Offsetof(m.deadline), mDeadline},
		{"mailbox request length", unsafe.Offsetof(m.reqLen), mReqLen},
		{"mailbox entry length", unsafe.Offsetof(m.entryLen), mEntryLen},
		{"mailbox status", unsafe.Offsetof(m.status), mStatus},
		{"mailbox reply length", unsafe.Offsetof(m.replyLen), mReplyLen},
		{"mailbox entry", unsafe.Offsetof(m.entry), mEntry},
		{"mailboxes end at the out-call lines", unsafe.Offsetof(p.out), pOut},
		{"out no", unsafe.Offsetof(p.out) + unsafe.Offsetof(p.out.no), pOutNo},
		{"out timeout", unsafe.Offsetof(p.out) + unsafe.Offsetof(p.out.timeoutMs), pOutTimeout},
		{"out group length", unsafe.Offsetof(p.out) + unsafe.Offsetof(p.out.groupLen), pOutGroupLen},
		{"out service length", unsafe.Offsetof(p.out) + unsafe.Offsetof(p.out.serviceLen), pOutServiceLen},
		{"out request length", unsafe.Offsetof(p.out) + unsafe.Offsetof(p.out.reqLen), pOutReqLen},
		{"out sleeping", unsafe.Offsetof(p.out) + unsafe.Offsetof(p.out.sleeping), pOutSleeping},
		{"out done", unsafe.Offsetof(p.out) + unsafe.Offsetof(p.out.done), pOutDone},
		{"out code", unsafe.Offsetof(p.out) + unsafe.Offsetof(p.out.code), pOutCode},
		{"out reply length", unsafe.Offsetof(p.out) + unsafe.Offsetof(p.out.replyLen), pOutReplyLen},
		{"out wake", unsafe.Offsetof(p.out) + unsafe.Offsetof(p.out.wake), pOutWake},
		{"page 0 ends at the page", unsafe.Sizeof(p), pageSize},
		{"lane seq", unsafe.Offsetof(l.seq), lSeq},
		{"lane deadline", unsafe.Offsetof(l.deadline), lDeadline},
		{"lane request length", unsafe.Offsetof(l.reqLen), lReqLen},
		{"lane caller sleeping", unsafe.Offsetof(l.callerSleeping), lCallerSleeping},
		{"lane callee wake", unsafe.Offsetof(l.calleeWake), lCalleeWake},
		{"lane callee sleeping", unsafe.Offsetof(l.calleeSleeping), lCalleeSleeping},
		{"lane status", unsafe.Offsetof(l.status), lStatus},
		{"lane reply length", unsafe.Offsetof(l.replyLen), lReplyLen},
		{"lane caller wake", unsafe.Offsetof(l.callerWake), lCallerWake},
		{"lane claim", unsafe.Offsetof(l.claim), lClaim},
		{"lane magic", unsafe.Offsetof(l.magic), lMagic},
		{"lane version", unsafe.Offsetof(l.version), lVersion},
		{"lane gen", unsafe.Offsetof(l.gen), lGen},
		{"lane max message", unsafe.Offsetof(l.maxMessage), lMaxMessage},
		{"lane rule length", unsafe.Offsetof(l.ruleLen), lRuleLen},
		{"lane rule text", unsafe.Offsetof(l.ruleText), lRuleText},
	} {
		if c.got != c.want {
			t.Errorf("%s at offset %#x, the layout says %#x", c.name, c.got, c.want)
		}
	}
	if MaxMailboxes != 60 {
		t.Errorf("page 0 holds %d mailboxes, the layout says 60", MaxMailboxes)
	}
	// The out buffer holds max_message_size and the two names.
	if got := areaSize(1, 8); got != pBuffer+9*pageSize {
		t.Errorf("area of 8 mailboxes of a 1-byte max message is %d bytes, want %d", got, pBuffer+9*pageSize)
	}
	if got := areaSize(pageSize+1, 2); got != pBuffer+6*pageSize {
		t.Errorf("area of 2 mailboxes of a %d-byte max message is %d bytes, want %d", pageSize+1, got, pBuffer+6*pageSize)
	}
	if got := areaSize(pageSize-outNames, 1); got != pBuffer+2*pageSize {
		t.Errorf("area of 1 mailbox of a %d-byte max message is %d bytes, want %d", pageSize-outNames, got, pBuffer+2*pageSize)
	}
}
