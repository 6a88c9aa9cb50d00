package bpf

import (
	"strings"
	"testing"
)

// TestAddReasonSaysAReasonOnce: mechanisms that fail for the same reason
// share one entry (issue 31 item 4: a non-root node's warning said "not
// root" three times).
func TestAddReasonSaysAReasonOnce(t *testing.T) {
	var why []string
	why = addReason(why, TPBTF, "neither root nor CAP_BPF: cannot load")
	why = addReason(why, RawTP, "neither root nor CAP_BPF: cannot load")
	why = addReason(why, Tracepoint, "no tracefs")
	got := strings.Join(why, "; ")
	want := TPBTF + ", " + RawTP + ": neither root nor CAP_BPF: cannot load; " + Tracepoint + ": no tracefs"
	if got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}
