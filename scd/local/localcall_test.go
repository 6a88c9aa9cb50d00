package local

import (
	"testing"

	"tpsched/netio"
	"tpsched/shm"
)

// areaAnswers records what a uapCaller writes into a process's area.
type areaAnswers struct{ got map[uint64]string }

func (a *areaAnswers) OutCall() (shm.OutCall, bool, error) { return shm.OutCall{}, false, nil }
func (a *areaAnswers) AnswerOutCall(no uint64, code uint32, data []byte) bool {
	if len(data) > 8 && code == 0 {
		return false // too big for the caller
	}
	a.got[no] = netio.Code(code).String() + " " + string(data)
	return true
}
func (a *areaAnswers) PublishOutAnswer(uint64, uint32, []byte) (bool, bool) { return true, false }
func (a *areaAnswers) WakeOutCaller()                                       {}
func (a *areaAnswers) OutOpen() bool                                        { return true }

// TestUAPCallerAnswersEveryFrame: call.Caller's Send takes one or more
// whole frames; a UAP's caller end used to answer only the first.
func TestUAPCallerAnswersEveryFrame(t *testing.T) {
	a := &areaAnswers{got: map[uint64]string{}}
	u := &uapCaller{p: a, maxMsg: 200}
	var b []byte
	b = netio.AppendReply(b, 1, []byte("one"))
	b = netio.AppendError(b, 2, netio.CodeTimedOut, "late")
	b = netio.AppendReply(b, 3, []byte("a reply too big"))
	if err := u.Send(b); err != nil {
		t.Fatal(err)
	}
	want := map[uint64]string{
		1: netio.CodeOK.String() + " one",
		2: netio.CodeTimedOut.String() + " " + netio.CodeTimedOut.String() + ": late",
		3: netio.CodeMessageTooBig.String() + " " + netio.CodeMessageTooBig.String() + ": a reply of 15 bytes, the calling UAP's max_message_size is 200",
	}
	for id, w := range want {
		if a.got[id] != w {
			t.Errorf("answer %d = %q, want %q", id, a.got[id], w)
		}
	}
	if err := u.Send(b[:5]); err == nil {
		t.Error("a cut frame was taken")
	}
}
