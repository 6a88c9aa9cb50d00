package shm

import (
	"bytes"
	"testing"
	"time"
)

// outCall waits on g's doorbells for the call p's process makes.
func awaitOutCall(tb testing.TB, g *Group, p *Proc) OutCall {
	tb.Helper()
	var c OutCall
	until(tb, g, 10*time.Second, "a call from the UAP", func() bool {
		var ok bool
		var err error
		c, ok, err = p.OutCall()
		if err != nil {
			tb.Fatal(err)
		}
		return ok
	})
	return c
}

// TestCallThroughTheArea has a handler call another service: the call
// reaches the scheduler's side with its names, request and the deadline
// of the call being served, and the answer (a reply, an error) reaches
// the handler, call after call.
func TestCallThroughTheArea(t *testing.T) {
	g := newGroup(t, 64<<10, 1)
	p := startUAP(t, g, 0)
	attached(t, g, p)
	for i, tc := range []struct {
		code  uint32
		reply string
		want  string
	}{
		{0, "pong", "pong"},
		{4, "timed out", "error 4: timed out"},
		{0, "", ""},
		{0, string(bytes.Repeat([]byte("x"), 64<<10)), string(bytes.Repeat([]byte("x"), 64<<10))},
	} {
		if err := p.Dispatch("relay", []byte("other/svc/ping"), time.Now().Add(5*time.Second).UnixNano()); err != nil {
			t.Fatal(err)
		}
		p.Wake()
		oc := awaitOutCall(t, g, p.Proc)
		if oc.No != uint64(i+1) || string(oc.Group) != "other" || string(oc.Service) != "svc" || string(oc.Request) != "ping" {
			t.Fatalf("call %d: %+v", i, oc)
		}
		if oc.TimeoutMs == 0 || oc.TimeoutMs > 5000 {
			t.Errorf("call %d: timeout %d ms; want the served call's remaining 5 s or less", i, oc.TimeoutMs)
		}
		if !p.OutOpen() {
			t.Errorf("call %d: not open while unanswered", i)
		}
		if p.AnswerOutCall(oc.No, 0, make([]byte, g.MaxMessage()+1)) {
			t.Fatalf("call %d: an answer over max_message_size was accepted", i)
		}
		if !p.AnswerOutCall(oc.No, tc.code, []byte(tc.reply)) {
			t.Fatalf("call %d: answer refused", i)
		}
		c := waitCompletion(t, g, p.Proc)
		if c.Status != StatusOK || string(c.Reply) != tc.want {
			t.Fatalf("call %d: status %v, reply %.40q; want %.40q", i, c.Status, c.Reply, tc.want)
		}
		if p.OutOpen() {
			t.Errorf("call %d: still open after its answer", i)
		}
		// A second answer for the same call changes nothing.
		p.AnswerOutCall(oc.No, 1, []byte("late"))
	}
}

// TestCallOutOfBounds: a call whose fields break the protocol is a
// violation, reported once, and opens nothing.
func TestCallOutOfBounds(t *testing.T) {
	g := newGroup(t, 4096, 1)
	p, err := g.NewProc(0)
	if err != nil {
		t.Fatal(err)
	}
	o := &p.ctl.out
	o.groupLen, o.serviceLen, o.reqLen = 40, 3, 1 // a group name past maxName
	o.no.Store(1)
	if _, ok, err := p.OutCall(); !ok || err == nil {
		t.Fatalf("got ok %v, err %v; want a protocol error", ok, err)
	}
	if _, ok, _ := p.OutCall(); ok || p.OutOpen() {
		t.Fatal("a refused call was reported twice or left open")
	}
	o.groupLen, o.reqLen = 3, 4097
	o.no.Store(2)
	if _, _, err := p.OutCall(); err == nil {
		t.Fatal("a request over max_message_size was accepted")
	}
	o.reqLen = 1
	o.no.Store(5)
	if _, _, err := p.OutCall(); err == nil {
		t.Fatal("a call number that skips was accepted")
	}
	o.no.Store(6)
	if _, ok, err := p.OutCall(); !ok || err != nil {
		t.Fatalf("a good call after bad ones: ok %v, err %v", ok, err)
	}
	o.no.Store(7)
	if _, _, err := p.OutCall(); err == nil {
		t.Fatal("a second call before the first was answered was accepted")
	}
}

// TestCallCancelledWakesAtOnce: a handler's call whose context is
// cancelled returns then, not at the wait's next timed look (with the
// looks 10 s apart here, the old code returned after 10 s).
func TestCallCancelledWakesAtOnce(t *testing.T) {
	g := newGroup(t, 64<<10, 1)
	p := startUAP(t, g, 0, "TPSCHED_SHM_TEST_MAXSLEEP=10s", "TPSCHED_SPIN_US=0")
	attached(t, g, p)
	if err := p.Dispatch("cancel", []byte("50ms"), 0); err != nil {
		t.Fatal(err)
	}
	p.Wake()
	awaitOutCall(t, g, p.Proc) // never answered
	start := time.Now()
	c := waitCompletion(t, g, p.Proc)
	if c.Status != StatusOK || !bytes.HasPrefix(c.Reply, []byte("context canceled after")) {
		t.Fatalf("status %v, reply %q", c.Status, c.Reply)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the cancelled call returned %v after its out-call was seen (%s)", d, c.Reply)
	}
}

// TestCloseEndsACallInFlight: a handler's goroutine calls another service
// and waits for the answer after the call it served ended; the process is
// stopped, Serve returns and main closes the UAP. The goroutine's Call
// returns ErrClosed, and Close unmaps nothing it still reads (it did:
// the waiting Call woke at its next timed look in unmapped memory). The
// helper's timed looks are an hour apart: Close must wake the Call.
func TestCloseEndsACallInFlight(t *testing.T) {
	g := newGroup(t, 64<<10, 1)
	p := startUAP(t, g, 0, "TPSCHED_SHM_TEST_AFTER_CLOSE=background", "TPSCHED_SHM_TEST_MAXSLEEP=1h", "TPSCHED_SPIN_US=0")
	attached(t, g, p)
	if c := call(t, g, p.Proc, "background", []byte("x")); c.Status != StatusOK {
		t.Fatalf("background: %v %q", c.Status, c.Reply)
	}
	awaitOutCall(t, g, p.Proc) // never answered
	until(t, g, 10*time.Second, "the call to sleep on its answer", func() bool { return p.ctl.out.sleeping.Load() != 0 })
	p.Stop()
	p.Wake()
	if err := p.wait(t, 10*time.Second); err != nil {
		t.Fatalf("the UAP closed with a call in flight: %v", err)
	}
}
