package sockmode

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"tpsched/shm/internal/sockwire"
)

// The protocol a UAP speaks on its socket is tested with the other
// implementations in shm's TestUAPProtocol; here, what a UAP that breaks it
// gets.

func newTransport(tb testing.TB, maxMsg int) *Transport {
	tb.Helper()
	tr, err := New("test", maxMsg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { tr.Unmap() })
	return tr
}

func until(tb testing.TB, tr *Transport, what string, cond func() bool) {
	tb.Helper()
	end := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(end) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		tr.Wait(10 * time.Millisecond)
	}
}

// A reply over max_message_size, or to a call the process was not given,
// or a second hello, is a protocol error: the node closes the socket,
// takes no reply, and its Completion says the error once, whether the
// process holds a call or not, so that the reader answers the call and has
// the process killed. Before, it said nothing: a process that stayed
// alive after it (a hostile one) held its slot for ever.
func TestSocketProtocolErrorFromUAP(t *testing.T) {
	for _, bad := range []sockwire.Msg{
		{Kind: sockwire.KindReply, PayLen: 65, A: 1},
		{Kind: sockwire.KindReply, A: 7},
		{Kind: sockwire.KindReply, Status: 9, A: 1},
		{Kind: sockwire.KindHello, A: 4242, B: sockwire.Version}, // idle: no call dispatched
	} {
		idle := bad.Kind == sockwire.KindHello
		tr := newTransport(t, 64)
		p, err := tr.NewProc(0)
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.FileConn(p.Files()[0])
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		h := make([]byte, sockwire.HeaderSize+sockwire.MaxName+64)
		sockwire.Put(h, sockwire.Msg{Kind: sockwire.KindHello, A: 4242, B: sockwire.Version})
		c.Write(h[:sockwire.HeaderSize])
		m, err := sockwire.Read(c, h, 0, statusEnd)
		if err != nil || m.Kind != sockwire.KindWelcome || m.A != 64 {
			t.Fatalf("welcome: %+v %v", m, err)
		}
		until(t, tr, "hello", p.Attach)
		if !idle {
			if err := p.Dispatch("echo", []byte("abc"), 0); err != nil {
				t.Fatal(err)
			}
			m, err = sockwire.Read(c, h, 64, statusEnd)
			if err != nil || m.Kind != sockwire.KindRequest || m.A != 1 || m.NameLen != 4 || m.PayLen != 3 {
				t.Fatalf("request: %+v %v", m, err)
			}
			io.ReadFull(c, h[:7])
		}
		sockwire.Put(h, bad)
		c.Write(h[:sockwire.HeaderSize])
		if _, err := c.Read(h); err != io.EOF {
			t.Fatalf("%+v: read after the protocol error: %v, want EOF", bad, err)
		}
		if got, ok, err := p.Completion(); !ok || !errors.Is(err, sockwire.ErrProtocol) || got.Reply != nil {
			t.Fatalf("%+v: completion %+v, %v, %v; want the protocol error and no reply", bad, got, ok, err)
		}
		if _, ok, err := p.Completion(); ok {
			t.Fatalf("%+v: the protocol error said twice, or a reply taken (%v)", bad, err)
		}
		c.Close()
	}
}
