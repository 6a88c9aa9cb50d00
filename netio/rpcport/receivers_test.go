package rpcport

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
	"tpsched/netio"

	"github.com/VictoriaMetrics/metrics"
	"golang.org/x/sys/unix"
)

// groupHandler records the receiver group each call arrived on and holds
// the answers of calls whose payload is "hold" until release.
type groupHandler struct {
	mu      sync.Mutex
	seen    map[string]int // receiver group -> calls
	held    []func()
	release chan struct{}
}

func (h *groupHandler) OnFrame(c *Conn, f netio.Frame) {
	if f.Kind != netio.KindCall {
		return
	}
	h.mu.Lock()
	if h.seen == nil {
		h.seen = map[string]int{}
	}
	h.seen[c.ReceiverGroup()]++
	h.mu.Unlock()
	reply := netio.AppendReply(nil, f.ID, []byte(c.ReceiverGroup()))
	if string(f.Payload) == "hold" {
		go func() { <-h.release; _ = c.Send(reply) }()
		return
	}
	c.SendNow(reply)
}

func (h *groupHandler) OnClose(*Conn) {}

// TestReceiverGroups: a named group listens on a port of its own, and the
// Handler learns which group and socket a connection arrived on.
func TestReceiverGroups(t *testing.T) {
	h := &groupHandler{release: make(chan struct{})}
	set := metrics.NewSet()
	s := startServer(t, Options{Loops: 2, Metrics: set,
		Receivers: []ReceiverGroup{{Name: "heavy", Addr: "127.0.0.1:0", Count: 3}}}, h)
	heavy, ok := s.GroupAddr("heavy")
	if !ok || heavy == s.Addr() {
		t.Fatalf("heavy at %q (ok %v), default at %q", heavy, ok, s.Addr())
	}
	if s.GroupSize("heavy") != 3 || s.GroupSize("") != 2 || s.GroupSize("none") != 0 {
		t.Fatalf("group sizes %d %d %d", s.GroupSize("heavy"), s.GroupSize(""), s.GroupSize("none"))
	}
	for addr, want := range map[string]string{s.Addr(): "", heavy: "heavy"} {
		c := dial(t, addr)
		r := bufio.NewReader(c)
		if _, err := c.Write(callFrame(1, []byte("x"))); err != nil {
			t.Fatal(err)
		}
		f, err := readFrame(r)
		if err != nil || string(f.Payload) != want {
			t.Fatalf("call on %s answered by group %q (%v), want %q", addr, f.Payload, err, want)
		}
	}
	stats := s.Receivers()
	if len(stats) != 5 {
		t.Fatalf("%d receivers, want 5", len(stats))
	}
	var calls uint64
	for _, r := range stats {
		calls += r.Calls
		if r.InFlight != 0 {
			t.Errorf("receiver %+v: calls in flight after their answers", r)
		}
	}
	if calls != 2 {
		t.Errorf("%d calls counted, want 2", calls)
	}
	for _, st := range s.Steering() {
		if st.Mechanism != SteerHash || st.Reason == "" {
			t.Errorf("steering %+v: want hash, with the reason", st)
		}
	}
	var buf bytes.Buffer
	set.WritePrometheus(&buf)
	for _, series := range []string{`tpsched_receiver_calls_total{receiver_group="heavy",receiver="`,
		`tpsched_receiver_steering{receiver_group="default",mechanism="hash"} 1`} {
		if !strings.Contains(buf.String(), series) {
			t.Errorf("metrics lack %s:\n%s", series, buf.String())
		}
	}
}

// TestReceiverInFlight: a receiver counts the calls it read and has not
// answered, and forgets those of a connection that closed.
func TestReceiverInFlight(t *testing.T) {
	h := &groupHandler{release: make(chan struct{})}
	s := startServer(t, Options{Loops: 1}, h)
	c := dial(t, s.Addr())
	for id := uint64(1); id <= 3; id++ {
		if _, err := c.Write(callFrame(id, []byte("hold"))); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "3 calls in flight", func() bool { return s.Receivers()[0].InFlight == 3 })
	close(h.release)
	r := bufio.NewReader(c)
	for range 3 {
		if _, err := readFrame(r); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "no call in flight", func() bool { return s.Receivers()[0].InFlight == 0 })

	h2 := &groupHandler{release: make(chan struct{})}
	s2 := startServer(t, Options{Loops: 1}, h2)
	c2 := dial(t, s2.Addr())
	if _, err := c2.Write(callFrame(1, []byte("hold"))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "1 call in flight", func() bool { return s2.Receivers()[0].InFlight == 1 })
	// A caller's FIN may be a half-close (it still reads): the connection
	// stays, with its call counted, until the answer is written.
	c2.Close()
	time.Sleep(50 * time.Millisecond)
	if r := s2.Receivers()[0]; r.InFlight != 1 || r.Conns != 1 {
		t.Fatalf("after the caller's FIN: in flight %d, connections %d; want 1 and 1 until the answer", r.InFlight, r.Conns)
	}
	close(h2.release) // the answer is written; the connection ends
	waitFor(t, "the closed connection's call answered and the connection gone", func() bool {
		r := s2.Receivers()[0]
		return r.InFlight == 0 && r.Conns == 0
	})

	// A caller that resets its connection is forgotten at once, its call
	// too; the late answer counts nothing.
	h3 := &groupHandler{release: make(chan struct{})}
	s3 := startServer(t, Options{Loops: 1}, h3)
	c3 := dial(t, s3.Addr())
	if _, err := c3.Write(callFrame(1, []byte("hold"))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "1 call in flight", func() bool { return s3.Receivers()[0].InFlight == 1 })
	_ = c3.(*net.TCPConn).SetLinger(0)
	c3.Close()
	waitFor(t, "the reset connection's call forgotten", func() bool {
		r := s3.Receivers()[0]
		return r.InFlight == 0 && r.Conns == 0
	})
	close(h3.release) // its answer finds the connection closed and counts nothing
	time.Sleep(20 * time.Millisecond)
	if r := s3.Receivers()[0]; r.InFlight != 0 {
		t.Fatalf("in flight %d after a late answer to a closed connection", r.InFlight)
	}
	if got := s3.Stats().Undelivered; got != 1 {
		t.Errorf("Stats().Undelivered = %d, want 1: the reset connection's answer", got)
	}
}

// TestResumeThatFailsEndsThePort: a Port that cannot take back every
// socket it handed off (a descriptor limit, say) ends with the reason, so
// that its node stops and is started afresh. Before, it stayed handed off,
// accepting nothing, and only Resume's caller heard why.
func TestResumeThatFailsEndsThePort(t *testing.T) {
	s, err := Listen(Options{Addr: "127.0.0.1:0", Loops: 1,
		Receivers: []ReceiverGroup{{Name: "heavy", Addr: "127.0.0.1:0", Count: 1}}}, &groupHandler{release: make(chan struct{})})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop(context.Background())
	ls, err := s.HandOff()
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe() // one socket does not come back: a pipe in its place
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ls[len(ls)-1].File.Close()
	ls[len(ls)-1].File = r
	if err := s.Resume(ls); err == nil {
		t.Fatal("resume with a pipe for a socket: no error")
	}
	select {
	case <-s.Done():
		if s.Err() == nil {
			t.Error("the port ended without a reason")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a port that could not take its sockets back did not end")
	}
}

// TestHandOffAndResume: the listening sockets leave the Port without
// closing (a connection made meanwhile waits in the backlog), a second
// Port takes them over and serves that connection; and a Port that gets
// its sockets back serves again.
func TestHandOffAndResume(t *testing.T) {
	h := &groupHandler{release: make(chan struct{})}
	old, err := Listen(Options{Addr: "127.0.0.1:0", Loops: 2,
		Receivers: []ReceiverGroup{{Name: "heavy", Addr: "127.0.0.1:0", Count: 1}}}, h)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Stop(context.Background())
	heavy, _ := old.GroupAddr("heavy")

	ls, err := old.HandOff()
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 3 {
		t.Fatalf("%d listeners handed off, want 3", len(ls))
	}
	if _, err := old.HandOff(); !errors.Is(err, ErrHandedOff) {
		t.Fatalf("second hand-off: %v", err)
	}
	select {
	case <-old.Done():
		t.Fatalf("the port ended when its sockets were handed off: %v", old.Err())
	case <-time.After(50 * time.Millisecond):
	}
	// Nobody accepts now: the connection waits in the backlog.
	waiting := dial(t, heavy)
	if _, err := waiting.Write(callFrame(7, []byte("x"))); err != nil {
		t.Fatal(err)
	}

	// Resume with duplicates, then hand off again to a new Port.
	dups := make([]Listener, len(ls))
	for i, l := range ls {
		dups[i] = l
		if dups[i].File, err = dupFile(l); err != nil {
			t.Fatal(err)
		}
	}
	if err := old.Resume(ls); err != nil {
		t.Fatalf("resume: %v", err)
	}
	r := bufio.NewReader(waiting)
	if f, err := readFrame(r); err != nil || f.ID != 7 || string(f.Payload) != "heavy" {
		t.Fatalf("the waiting call after resume: %+v %v", f, err)
	}
	closeInherited(dups)

	ls, err = old.HandOff()
	if err != nil {
		t.Fatal(err)
	}
	second := dial(t, old.Addr()) // waits in the default group's backlog
	if _, err := second.Write(callFrame(8, []byte("x"))); err != nil {
		t.Fatal(err)
	}
	h2 := &groupHandler{release: make(chan struct{})}
	next := startServer(t, Options{Addr: old.Addr(), Loops: 2, Inherit: ls,
		Receivers: []ReceiverGroup{{Name: "heavy", Addr: heavy, Count: 1}}}, h2)
	if next.Addr() != old.Addr() {
		t.Fatalf("new port on %s, the old on %s", next.Addr(), old.Addr())
	}
	if f, err := readFrame(bufio.NewReader(second)); err != nil || f.ID != 8 {
		t.Fatalf("the call that waited during the hand-off: %+v %v", f, err)
	}
	h2.mu.Lock()
	got := h2.seen[""]
	h2.mu.Unlock()
	if got != 1 {
		t.Fatalf("the new port served %d calls on the default group, want 1", got)
	}
	// The old port still serves the connection it had.
	if _, err := waiting.Write(callFrame(9, []byte("x"))); err != nil {
		t.Fatal(err)
	}
	if f, err := readFrame(r); err != nil || f.ID != 9 {
		t.Fatalf("the old port's connection after the hand-off: %+v %v", f, err)
	}
}

func dupFile(l Listener) (*os.File, error) {
	fd, err := unix.Dup(int(l.File.Fd()))
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), l.Addr), nil
}

// TestGoAway: a MuxConn told to go away refuses new calls (unsent, so
// they may go elsewhere), still gets the answers of the calls it sent, and
// closes itself once the last one came.
func TestGoAway(t *testing.T) {
	h := &groupHandler{release: make(chan struct{})}
	s := startServer(t, Options{Loops: 1}, h)
	nc, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	toldCh := make(chan struct{})
	mc := netio.NewMuxConn(nc, netio.MuxOptions{OnGoAway: func(*netio.MuxConn) { close(toldCh) }})
	defer mc.Close(nil)
	held := make(chan result1, 1)
	if _, sent, err := mc.Call(netio.Header{Kind: netio.KindCall}, "g", "s", []byte("hold"), time.Time{}, answerFunc(func(f netio.Frame, err error) {
		held <- result1{f, err}
	})); !sent || err != nil {
		t.Fatal(sent, err)
	}
	waitFor(t, "the call in flight", func() bool { return s.Receivers()[0].InFlight == 1 })
	if n := s.GoAway("restart"); n != 1 {
		t.Fatalf("go-away told %d connections", n)
	}
	select {
	case <-toldCh:
	case <-time.After(testDeadline):
		t.Fatal("OnGoAway not called")
	}
	if !mc.GoingAway() {
		t.Fatal("not going away")
	}
	if _, sent, err := mc.Call(netio.Header{Kind: netio.KindCall}, "g", "s", nil, time.Time{}, answerFunc(func(netio.Frame, error) {
		t.Error("an unsent call was answered")
	})); sent || !errors.Is(err, netio.ErrGoingAway) {
		t.Fatalf("a call after go-away: sent %v err %v", sent, err)
	}
	select {
	case <-mc.Done():
		t.Fatal("closed with a call in flight")
	default:
	}
	close(h.release)
	r := <-held
	if r.err != nil || r.f.Kind != netio.KindReply {
		t.Fatalf("the call sent before go-away: %+v %v", r.f, r.err)
	}
	select {
	case <-mc.Done():
	case <-time.After(testDeadline):
		t.Fatal("the connection stayed open after its last answer")
	}
	waitFor(t, "the port sees the close", func() bool { return s.Stats().Conns == 0 })
}

type result1 struct {
	f   netio.Frame
	err error
}

type answerFunc func(netio.Frame, error)

func (a answerFunc) Answer(f netio.Frame, err error) { a(f, err) }
