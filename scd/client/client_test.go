package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"tpsched/netio"
	"tpsched/netio/rpcport"
	"tpsched/scd/def"
)

const waitLimit = 10 * time.Second // bound on every wait in these tests

// testNode is a real netio server standing in for a node. By group:
//
//	"err"   answers an error frame whose code is the service name
//	"slow"  echoes after the delay the service name gives (time.ParseDuration)
//	"drop"  closes the connection
//	"who"   answers the node's name
//	"big"   answers as many bytes as the service name says
//	other   echoes the payload
type testNode struct {
	name string
	srv  *rpcport.Port
	addr string

	mu       sync.Mutex
	conns    map[uint64]bool // connections that carried a frame
	frames   map[string]int  // frames received per group
	timeouts map[string]uint32
	flags    map[string]netio.Flags // of the last frame per group
	closed   atomic.Int64
	noReply  chan []byte
	// receivers answers receivers lookups after receiversDelay (no
	// answer while its Count is 0).
	receivers      netio.Receivers
	receiversDelay time.Duration
	// lookup, if set, answers plain name lookups.
	lookup []netio.NodeLevel
}

func startNode(t *testing.T, name string) *testNode {
	t.Helper()
	n := &testNode{
		name:     name,
		conns:    map[uint64]bool{},
		frames:   map[string]int{},
		timeouts: map[string]uint32{},
		flags:    map[string]netio.Flags{},
		noReply:  make(chan []byte, 16),
	}
	srv, err := rpcport.Listen(rpcport.Options{Addr: "127.0.0.1:0", MaxPayload: 32 << 20}, n)
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	n.srv, n.addr = srv, srv.Addr()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		if err := srv.Stop(ctx); err != nil {
			t.Errorf("stop %s: %v", name, err)
		}
	})
	return n
}

func (n *testNode) OnFrame(c *rpcport.Conn, f netio.Frame) {
	group, service, payload := string(f.Group), string(f.Service), bytes.Clone(f.Payload)
	n.mu.Lock()
	n.conns[c.ID()] = true
	n.frames[group]++
	n.timeouts[group] = f.TimeoutMs
	n.flags[group] = f.Flags
	n.mu.Unlock()
	switch f.Kind {
	case netio.KindCallNoReply:
		select {
		case n.noReply <- payload:
		default:
		}
		return
	case netio.KindCall:
	case netio.KindNameLookup:
		if service == netio.LookupReceivers {
			n.mu.Lock()
			r, d := n.receivers, n.receiversDelay
			n.mu.Unlock()
			if r.Count > 0 {
				answer := netio.AppendReply(nil, f.ID, netio.AppendReceivers(nil, r))
				time.AfterFunc(d, func() { _ = c.Send(answer) })
			}
			return
		}
		if service != netio.LookupFind {
			n.mu.Lock()
			nodes := n.lookup
			n.mu.Unlock()
			if nodes != nil {
				answer := netio.AppendReply(nil, f.ID, netio.AppendLookupAnswer(nil, nodes))
				go func() { _ = c.Send(answer) }()
			}
			return // else this node answers no plain name lookup
		}
		// find: "none" has no server; any other group is served at
		// findAddr.
		answer := netio.AppendFrame(nil, netio.Header{Kind: netio.KindReply, ID: f.ID}, "", "",
			netio.AppendLookupAnswer(nil, []netio.NodeLevel{{Addr: findAddr, Level: 1}}))
		if group == "none" {
			answer = netio.AppendError(nil, f.ID, netio.CodeNoSuchGroup, "no node defines none")
		}
		go func() { _ = c.Send(answer) }()
		return
	default:
		return
	}
	var answer []byte
	switch group {
	case "err":
		code, _ := strconv.Atoi(service)
		answer = netio.AppendError(nil, f.ID, netio.Code(code), "detail "+service)
	case "slow":
		d, _ := time.ParseDuration(service)
		reply := netio.AppendReply(nil, f.ID, payload)
		time.AfterFunc(d, func() { _ = c.Send(reply) })
		return
	case "drop":
		_ = c.Close()
		return
	case "who":
		answer = netio.AppendReply(nil, f.ID, []byte(n.name))
	case "big":
		size, _ := strconv.Atoi(service)
		answer = netio.AppendReply(nil, f.ID, make([]byte, size))
	default:
		answer = netio.AppendReply(nil, f.ID, payload)
	}
	go func() { _ = c.Send(answer) }()
}

// findAddr is where the test node's find answers say a group is served.
const findAddr = "127.0.0.9:12000"

func (n *testNode) OnClose(*rpcport.Conn) { n.closed.Add(1) }

// usedConns counts connections that carried at least one frame.
func (n *testNode) usedConns() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.conns)
}

// accepted counts connections ever accepted, used or not.
func (n *testNode) accepted() int { return n.srv.Stats().Conns + int(n.closed.Load()) }

func (n *testNode) framesOf(group string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.frames[group]
}

// deadAddr returns a loopback address nobody listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func newClient(t *testing.T, opts Options) *Client {
	t.Helper()
	c, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// testCtx bounds a call that should succeed.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	return ctx
}

func wantCode(t *testing.T, err error, code netio.Code) *netio.Error {
	t.Helper()
	var te *netio.Error
	if !errors.As(err, &te) || te.Code != code {
		t.Fatalf("err = %v, want a *netio.Error with code %v", err, code)
	}
	return te
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", waitLimit, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// inFlight starts n calls and returns their errors' channel.
func inFlight(c *Client, n int, group, service string) <-chan error {
	errc := make(chan error, n)
	for i := range n {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
			defer cancel()
			_, err := c.Call(ctx, group, service, []byte(strconv.Itoa(i)))
			errc <- err
		}()
	}
	return errc
}

func TestNewNeedsHosts(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Error("New without hosts succeeded")
	}
}

func TestCallRoundTrip(t *testing.T) {
	t.Parallel()
	n := startNode(t, "a")
	c := newClient(t, Options{Hosts: []string{n.addr}})
	for _, payload := range [][]byte{[]byte("hello"), {}, bytes.Repeat([]byte{0xa5}, 512<<10)} {
		got, err := c.Call(testCtx(t), "demo", "echo", payload)
		if err != nil {
			t.Fatalf("Call(%d bytes): %v", len(payload), err)
		}
		if !bytes.Equal(got, payload) {
			t.Errorf("Call(%d bytes) answered %d bytes, not the payload", len(payload), len(got))
		}
	}
	if got := n.usedConns(); got != 1 {
		t.Errorf("server saw %d connections, want 1", got)
	}
}

func TestConcurrentCallsShareOneConnection(t *testing.T) {
	t.Parallel()
	n := startNode(t, "a")
	c := newClient(t, Options{Hosts: []string{n.addr}})
	const goroutines, calls = 64, 100
	ctx := testCtx(t)
	var wg sync.WaitGroup
	errc := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for i := range calls {
				want := fmt.Sprintf("goroutine %d call %d", g, i)
				got, err := c.Call(ctx, "demo", "echo", []byte(want))
				if err != nil {
					errc <- fmt.Errorf("%s: %w", want, err)
					return
				}
				if string(got) != want {
					errc <- fmt.Errorf("%s: answered %q", want, got)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if got := n.framesOf("demo"); got != goroutines*calls {
		t.Errorf("server got %d frames, want %d", got, goroutines*calls)
	}
	if got := n.usedConns(); got != 1 {
		t.Errorf("calls came on %d connections, want 1", got)
	}
	time.Sleep(50 * time.Millisecond) // let the server see any extra dial
	if got := n.accepted(); got != 1 {
		t.Errorf("server accepted %d connections, want 1", got)
	}
}

func TestCallNoReply(t *testing.T) {
	t.Parallel()
	n := startNode(t, "a")
	c := newClient(t, Options{Hosts: []string{n.addr}})
	if err := c.CallNoReply(testCtx(t), "demo", "log", []byte("fire and forget")); err != nil {
		t.Fatalf("CallNoReply: %v", err)
	}
	select {
	case got := <-n.noReply:
		if string(got) != "fire and forget" {
			t.Errorf("server got %q", got)
		}
	case <-time.After(waitLimit):
		t.Fatal("server never got the call")
	}
	if got, err := c.Call(testCtx(t), "demo", "echo", []byte("after")); err != nil || string(got) != "after" {
		t.Errorf("Call after CallNoReply = %q, %v", got, err)
	}
}

func TestPayloadOverMaxMessageSize(t *testing.T) {
	t.Parallel()
	n := startNode(t, "a")
	c := newClient(t, Options{Hosts: []string{n.addr}, MaxMessageSize: 1000})
	_, err := c.Call(testCtx(t), "demo", "echo", make([]byte, 1001))
	wantCode(t, err, netio.CodeMessageTooBig)
	err = c.CallNoReply(testCtx(t), "demo", "echo", make([]byte, 1001))
	wantCode(t, err, netio.CodeMessageTooBig)
	time.Sleep(50 * time.Millisecond) // a connection would have been seen by now
	if got := n.accepted(); got != 0 {
		t.Errorf("server accepted %d connections for refused payloads", got)
	}
	if _, err := c.Call(testCtx(t), "demo", "echo", make([]byte, 1000)); err != nil {
		t.Errorf("Call at the limit: %v", err)
	}
}

// TestReplyOverMaxMessageSize: a reply over what the client reads
// (MaxMessageSize and 64 KiB for error messages) fails its own call
// 'message too big', saying the reply's size and the limit; the calls in
// flight beside it on the same connection get their replies, and the
// connection stays. Before, the connection closed and every call on it
// failed 'network down'.
func TestReplyOverMaxMessageSize(t *testing.T) {
	t.Parallel()
	n := startNode(t, "a")
	c := newClient(t, Options{Hosts: []string{n.addr}, MaxMessageSize: 1000})
	const slow = 5
	errc := inFlight(c, slow, "slow", "300ms")
	waitUntil(t, "the slow calls to arrive", func() bool { return n.framesOf("slow") == slow })
	limit := 1000 + 64<<10
	_, err := c.Call(testCtx(t), "big", strconv.Itoa(limit+1), nil)
	var te *netio.Error
	switch {
	case !errors.As(err, &te) || te.Code != netio.CodeMessageTooBig:
		t.Errorf("the call answered over the limit: %v, want 'message too big'", err)
	case !strings.Contains(te.Message, strconv.Itoa(limit+1)) || !strings.Contains(te.Message, strconv.Itoa(limit)):
		t.Errorf("message %q does not say the reply's size (%d) and the limit (%d)", te.Message, limit+1, limit)
	}
	for range slow {
		if err := <-errc; err != nil {
			t.Errorf("a call in flight beside the big reply: %v", err)
		}
	}
	if got, err := c.Call(testCtx(t), "big", strconv.Itoa(limit), nil); err != nil || len(got) != limit {
		t.Errorf("a reply at the limit: %d bytes, %v", len(got), err)
	}
	if got := n.accepted(); got != 1 {
		t.Errorf("server accepted %d connections, want 1: the big reply closed one", got)
	}
}

func TestErrorFrames(t *testing.T) {
	t.Parallel()
	n := startNode(t, "a")
	c := newClient(t, Options{Hosts: []string{n.addr}})
	for _, code := range []netio.Code{netio.CodeNoSuchGroup, netio.CodeServerBusy, netio.CodeServerTerminated, netio.CodeApplication, netio.CodeShuttingDown} {
		service := strconv.Itoa(int(code))
		_, err := c.Call(testCtx(t), "err", service, nil)
		te := wantCode(t, err, code)
		if te.Message != "detail "+service {
			t.Errorf("code %v: message %q, want %q", code, te.Message, "detail "+service)
		}
		if !errors.Is(err, &netio.Error{Code: code}) {
			t.Errorf("errors.Is(%v, code %v) = false", err, code)
		}
		if errors.Is(err, &netio.Error{Code: netio.CodeTimedOut}) {
			t.Errorf("errors.Is(%v, timed out) = true", err)
		}
	}
	if got := n.usedConns(); got != 1 {
		t.Errorf("error answers took %d connections, want 1", got)
	}
}

func TestDeadlineTimesOut(t *testing.T) {
	t.Parallel()
	n := startNode(t, "a")
	c := newClient(t, Options{Hosts: []string{n.addr}})
	// The connection first: on a busy machine a dial can take the whole
	// 100 ms, and the call then never reaches the node.
	if _, err := c.Call(testCtx(t), "demo", "echo", nil); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err := c.Call(ctx, "slow", "300ms", []byte("late"))
	d := time.Since(t0)
	wantCode(t, err, netio.CodeTimedOut)
	if d > time.Second {
		t.Errorf("timed out after %v with a 100ms deadline", d)
	}
	// What the call had left when it began: 100 ms less the moments
	// before Call ran, on a busy machine a few.
	if m := regexp.MustCompile(`^tpsched: timed out: no answer within (\d+)ms \(the caller's deadline\)$`).FindStringSubmatch(err.Error()); m == nil {
		t.Errorf("error = %q: it does not say after how long", err)
	} else if ms, _ := strconv.Atoi(m[1]); ms < 50 || ms > 100 {
		t.Errorf("error = %q: want about 100ms", err)
	}
	n.mu.Lock()
	if ms := n.timeouts["slow"]; ms == 0 || ms > 101 {
		t.Errorf("frame carried timeout %d ms, want 1..101", ms)
	}
	n.mu.Unlock()

	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	_, err = c.Call(expired, "demo", "echo", nil)
	wantCode(t, err, netio.CodeTimedOut)
	if !strings.Contains(err.Error(), "deadline passed before the call was sent") {
		t.Errorf("error = %q: it does not say the deadline passed before sending", err)
	}

	// Still works, also once the late answer has come and been dropped.
	for range 2 {
		if got, err := c.Call(testCtx(t), "demo", "echo", []byte("next")); err != nil || string(got) != "next" {
			t.Errorf("Call after a timeout = %q, %v", got, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	if got := n.usedConns(); got != 1 {
		t.Errorf("server saw %d connections, want 1", got)
	}
}

func TestCanceledCall(t *testing.T) {
	t.Parallel()
	n := startNode(t, "a")
	c := newClient(t, Options{Hosts: []string{n.addr}})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	if _, err := c.Call(ctx, "slow", "5s", nil); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled Call = %v, want context.Canceled", err)
	}
}

func TestDroppedConnectionFailsCallsWithoutResending(t *testing.T) {
	t.Parallel()
	for _, hosts := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d hosts", hosts), func(t *testing.T) {
			t.Parallel()
			nodes := []*testNode{startNode(t, "a")}
			if hosts == 2 {
				nodes = append(nodes, startNode(t, "b")) // where a resend could go
			}
			var addrs []string
			sum := func(f func(*testNode) int) (s int) {
				for _, n := range nodes {
					addrs = append(addrs, n.addr)
					s += f(n)
				}
				return s
			}
			sum(func(*testNode) int { return 0 })
			c := newClient(t, Options{Hosts: addrs})
			const slow = 5
			errc := inFlight(c, slow, "slow", "5s")
			waitUntil(t, "the slow calls to arrive", func() bool { return nodes[0].framesOf("slow") == slow })

			t0 := time.Now()
			_, err := c.Call(testCtx(t), "drop", "close", nil)
			wantCode(t, err, netio.CodeNetworkDown)
			for range slow {
				wantCode(t, <-errc, netio.CodeNetworkDown)
			}
			if d := time.Since(t0); d > 2*time.Second {
				t.Errorf("calls failed %v after the connection dropped", d)
			}
			time.Sleep(50 * time.Millisecond)
			slowFrames := sum(func(n *testNode) int { return n.framesOf("slow") })
			dropFrames := sum(func(n *testNode) int { return n.framesOf("drop") })
			if slowFrames != slow || dropFrames != 1 {
				t.Errorf("nodes got %d slow and %d drop frames, want %d and 1: calls were resent", slowFrames, dropFrames, slow)
			}
			// The next call dials again.
			if got, err := c.Call(testCtx(t), "demo", "echo", []byte("again")); err != nil || string(got) != "again" {
				t.Fatalf("Call after the drop = %q, %v", got, err)
			}
			if got := sum((*testNode).usedConns); got != 2 {
				t.Errorf("nodes saw %d connections, want 2: the dropped one and a new one", got)
			}
		})
	}
}

func TestFailOverFromDeadHost(t *testing.T) {
	t.Parallel()
	n := startNode(t, "live")
	c := newClient(t, Options{Hosts: []string{deadAddr(t), n.addr}})
	for i := range 5 {
		got, err := c.Call(testCtx(t), "who", "", nil)
		if err != nil || string(got) != "live" {
			t.Fatalf("call %d = %q, %v", i, got, err)
		}
	}
	if got := n.usedConns(); got != 1 {
		t.Errorf("live node saw %d connections, want 1", got)
	}
}

func TestHostChangeAlternates(t *testing.T) {
	t.Parallel()
	a, b := startNode(t, "a"), startNode(t, "b")
	c := newClient(t, Options{Hosts: []string{a.addr, b.addr}, HostChange: true})
	var got []string
	for range 6 {
		name, err := c.Call(testCtx(t), "who", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(name))
	}
	if s := strings.Join(got, ","); s != "a,b,a,b,a,b" {
		t.Errorf("calls went to %s, want a,b,a,b,a,b", s)
	}
}

func TestHostSelectSpreadsFirstCalls(t *testing.T) {
	t.Parallel()
	a, b := startNode(t, "a"), startNode(t, "b")
	first := map[string]int{}
	for range 30 { // both hosts miss being first with probability 2^-29
		c, err := New(Options{Hosts: []string{a.addr, b.addr}, HostSelect: true})
		if err != nil {
			t.Fatal(err)
		}
		name, err := c.Call(testCtx(t), "who", "", nil)
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		first[string(name)]++
	}
	if first["a"] == 0 || first["b"] == 0 {
		t.Errorf("first hosts chosen %v, want both", first)
	}
}

func TestAllHostsDead(t *testing.T) {
	t.Parallel()
	dead1, dead2 := deadAddr(t), deadAddr(t)
	c := newClient(t, Options{Hosts: []string{dead1, dead2}})
	t0 := time.Now()
	_, err := c.Call(testCtx(t), "demo", "echo", nil)
	te := wantCode(t, err, netio.CodeNetworkDown)
	if !strings.Contains(te.Message, "refused") || !strings.Contains(te.Message, "127.0.0.1:") {
		t.Errorf("message %q does not name the dial error", te.Message)
	}
	if d := time.Since(t0); d > 3*time.Second {
		t.Errorf("took %v to find two refusing hosts", d)
	}
	err = c.CallNoReply(testCtx(t), "demo", "echo", nil)
	wantCode(t, err, netio.CodeNetworkDown)
}

func TestCloseFailsInFlightCalls(t *testing.T) {
	t.Parallel()
	n := startNode(t, "a")
	c := newClient(t, Options{Hosts: []string{n.addr}})
	const calls = 3
	errc := inFlight(c, calls, "slow", "5s")
	waitUntil(t, "the calls to arrive", func() bool { return n.framesOf("slow") == calls })
	t0 := time.Now()
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for range calls {
		select {
		case err := <-errc:
			if te := wantCode(t, err, netio.CodeNetworkDown); !strings.Contains(te.Message, "closed") {
				t.Errorf("message %q, want it to say the client closed", te.Message)
			}
		case <-time.After(waitLimit):
			t.Fatal("a call outlived Close")
		}
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("calls failed %v after Close", d)
	}
	_, err := c.Call(testCtx(t), "demo", "echo", nil)
	wantCode(t, err, netio.CodeNetworkDown)
}

// A writer that flushes its own frame and then, in the same turn, the frames
// other calls appended meanwhile must not resend its call elsewhere when a
// later write fails: its frame reached the node already.
func TestWrittenCallIsNotResentWhenALaterWriteFails(t *testing.T) {
	t.Parallel()
	// A node that takes the connection but reads only what it is told to.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		if nc, err := l.Accept(); err == nil {
			accepted <- nc
		}
	}()
	other := startNode(t, "b") // where a resend would go
	const size = 16 << 20      // far more than the socket buffers hold
	c := newClient(t, Options{Hosts: []string{l.Addr().String(), other.addr}, MaxMessageSize: size})

	big := bytes.Repeat([]byte("a"), size)
	errA := make(chan error, 1)
	go func() {
		_, err := c.Call(testCtx(t), "demo", "echo", big)
		errA <- err
	}()
	var srv net.Conn
	select {
	case srv = <-accepted:
		t.Cleanup(func() { srv.Close() })
	case <-time.After(waitLimit):
		t.Fatal("no connection")
	}
	// A's write has begun once the node sees its first byte, and cannot end
	// before the node reads the rest.
	if _, err := io.ReadFull(srv, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	mc := c.conns[0]
	c.mu.Unlock()
	// B's frame waits in the buffer for A's writer.
	if err := c.CallNoReply(testCtx(t), "demo", "log", big); err != nil {
		t.Fatalf("CallNoReply: %v", err)
	}
	// Read A's frame whole: A's first write is done, the next (B's) blocks.
	frameA := netio.HeaderSize + len("demo") + len("echo") + size
	if _, err := io.CopyN(io.Discard, srv, int64(frameA-1)); err != nil {
		t.Fatal(err)
	}
	if err := mc.NetConn().SetWriteDeadline(time.Now()); err != nil { // B's write fails
		t.Fatal(err)
	}
	select {
	case err := <-errA:
		wantCode(t, err, netio.CodeNetworkDown)
	case <-time.After(waitLimit):
		t.Fatal("call A did not end")
	}
	if got := other.framesOf("demo"); got != 0 {
		t.Errorf("the written call was sent again to the other host (%d frames)", got)
	}
}

func TestWatchTimeWithoutDeadline(t *testing.T) {
	t.Parallel()
	n := startNode(t, "a")
	c := newClient(t, Options{Hosts: []string{n.addr}, WatchTime: 100 * time.Millisecond})
	t0 := time.Now()
	_, err := c.Call(context.Background(), "slow", "5s", nil)
	d := time.Since(t0)
	wantCode(t, err, netio.CodeTimedOut)
	// The client leaves the node a second to answer 'timed out' itself.
	if d < time.Second || d > 3*time.Second {
		t.Errorf("gave up after %v with a 100ms watch time", d)
	}
	if want := "no answer within 100ms (watch_time"; !strings.Contains(err.Error(), want) {
		t.Errorf("error = %q, want it to say %q", err, want)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if ms := n.timeouts["slow"]; ms < 50 || ms > 101 {
		t.Errorf("frame carried timeout %d ms, want what was left of 100 ms when it was sent", ms)
	}
}

// TestWatchTimeBoundsTheStepsBeforeTheCall: without a deadline of the
// caller's, WatchTime bounds the whole call, not only the wait for its
// answer: here a receivers lookup (MultiSchedule) that the node never
// answers. Bounded at the wait alone, the call took 6 s with a WatchTime
// of 100 ms.
func TestWatchTimeBoundsTheStepsBeforeTheCall(t *testing.T) {
	t.Parallel()
	n := startNode(t, "a")
	n.mu.Lock()
	n.receivers = netio.Receivers{Addr: n.addr, Count: 2, Here: -1}
	n.receiversDelay = 10 * time.Second
	n.mu.Unlock()
	c := newClient(t, Options{Hosts: []string{n.addr}, MultiSchedule: true, WatchTime: 100 * time.Millisecond})
	t0 := time.Now()
	_, err := c.Call(context.Background(), "g", "echo", nil)
	d := time.Since(t0)
	wantCode(t, err, netio.CodeTimedOut)
	if d > 3*time.Second {
		t.Errorf("a call with a 100ms watch time, behind a lookup never answered, returned after %v", d)
	}
	if want := "watch_time"; !strings.Contains(err.Error(), want) {
		t.Errorf("error = %q, want it to name %s", err, want)
	}
}

func (n *testNode) flagsOf(group string) netio.Flags {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.flags[group]
}

// TestCallToExplicitDestination: CallTo goes to the named node only, marked
// as an explicit destination (never balanced), whatever the dchost list and
// the client's balancing options say, and a destination that cannot be
// reached fails the call: no other host is tried.
func TestCallToExplicitDestination(t *testing.T) {
	t.Parallel()
	dchost, dest := startNode(t, "dchost"), startNode(t, "dest")
	c := newClient(t, Options{Hosts: []string{dchost.addr}, Balanced: true, LoadBalance: true})
	for range 3 {
		got, err := c.CallTo(testCtx(t), dest.addr, "who", "x", nil)
		if err != nil || string(got) != "dest" {
			t.Fatalf("CallTo(dest) = %q, %v; want the answer of dest", got, err)
		}
	}
	if f := dest.flagsOf("who"); f != netio.FlagDestination {
		t.Errorf("flags at the destination %v, want FlagDestination only (not balanced)", f)
	}
	if got := dchost.framesOf("who"); got != 0 {
		t.Errorf("the dchost node got %d frames (a name lookup or a call); an explicit destination asks nobody else", got)
	}
	if err := c.CallNoReplyTo(testCtx(t), dest.addr, "quiet", "x", []byte("q")); err != nil {
		t.Fatalf("CallNoReplyTo: %v", err)
	}
	select {
	case got := <-dest.noReply:
		if string(got) != "q" {
			t.Errorf("no-reply payload %q", got)
		}
	case <-time.After(waitLimit):
		t.Fatal("the no-reply call did not reach the destination")
	}

	// A plain Call still goes the dchost way (the test node answers no
	// name lookup, so this client does not balance).
	plain := newClient(t, Options{Hosts: []string{dchost.addr}, Balanced: true})
	if _, err := plain.CallTo(testCtx(t), dest.addr, "who", "x", nil); err != nil {
		t.Fatalf("CallTo: %v", err)
	}
	if _, err := plain.Call(testCtx(t), "plain", "x", nil); err != nil {
		t.Fatalf("Call: %v", err)
	}
	if dest.framesOf("plain") != 0 || dchost.flagsOf("plain")&netio.FlagDestination != 0 {
		t.Error("a plain call went to the destination, or was marked as one")
	}

	dead := deadAddr(t)
	before := dchost.framesOf("who")
	_, err := c.CallTo(testCtx(t), dead, "who", "x", nil)
	te := wantCode(t, err, netio.CodeNetworkDown)
	if !strings.Contains(te.Message, dead) {
		t.Errorf("error %q does not name the destination %s", te.Message, dead)
	}
	if dchost.framesOf("who") != before {
		t.Error("a call to an unreachable destination went to the dchost node")
	}
	if _, err := c.CallTo(testCtx(t), "127.0.0.1:notaport", "who", "x", nil); err == nil {
		t.Error("CallTo a malformed address succeeded")
	}
}

// TestSchedulerDirectMarksPlainCalls: with SchedulerDirect (dcscddirect =
// Y) a plain call carries the scheduler-direct flag, so the node weighs
// LEVEL0 against LEVEL1 by schedule_rate; without it a call carries no
// flag, and neither a balanced call nor one to an explicit destination
// carries it: the node does not balance those by schedule_rate.
func TestSchedulerDirectMarksPlainCalls(t *testing.T) {
	t.Parallel()
	n := startNode(t, "n")
	call := func(c *Client, group string) error { _, err := c.Call(testCtx(t), group, "x", nil); return err }
	for _, tc := range []struct {
		group string
		opts  Options
		call  func(c *Client, group string) error
		want  netio.Flags
	}{
		{"direct", Options{SchedulerDirect: true}, call, netio.FlagSchedulerDirect},
		{"plain", Options{}, call, 0},
		{"balanced", Options{SchedulerDirect: true, Balanced: true}, call, netio.FlagBalanced},
		{"destination", Options{SchedulerDirect: true}, func(c *Client, group string) error {
			_, err := c.CallTo(testCtx(t), n.addr, group, "x", nil)
			return err
		}, netio.FlagDestination},
		{"noreply", Options{SchedulerDirect: true}, func(c *Client, group string) error {
			if err := c.CallNoReply(testCtx(t), group, "x", nil); err != nil {
				return err
			}
			select {
			case <-n.noReply:
				return nil
			case <-time.After(waitLimit):
				return errors.New("the no-reply call did not arrive")
			}
		}, netio.FlagSchedulerDirect},
	} {
		opts := tc.opts
		opts.Hosts = []string{n.addr}
		if err := tc.call(newClient(t, opts), tc.group); err != nil {
			t.Fatalf("%s: %v", tc.group, err)
		}
		if f := n.flagsOf(tc.group); f != tc.want {
			t.Errorf("%s: flags %v, want %v", tc.group, f, tc.want)
		}
	}
	if o := FromDefinition(&def.Client{SchedulerDirect: true}); !o.SchedulerDirect {
		t.Error("FromDefinition drops dcscddirect = Y")
	}
}

// TestNodeThatDoesNotReadCannotHoldCalls: a node that accepts and never
// reads (stopped, partitioned) fills the socket's buffers; every call
// still returns by its deadline, 'timed out' or 'network down'. Before,
// the call whose turn it was to write blocked in the write for ever, and
// the calls behind it queued their frames without bound and were told
// they were sent.
func TestNodeThatDoesNotReadCannotHoldCalls(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		nc, err := l.Accept()
		if err == nil {
			accepted <- nc // held open, never read
		}
		close(accepted)
	}()
	defer func() {
		l.Close()
		for nc := range accepted {
			nc.Close()
		}
	}()
	c := newClient(t, Options{Hosts: []string{l.Addr().String()}})
	const calls, limit = 10, 200 * time.Millisecond
	payload := make([]byte, 1<<20)
	type outcome struct {
		took time.Duration
		err  error
	}
	done := make(chan outcome, calls)
	for range calls {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), limit)
			defer cancel()
			start := time.Now()
			_, err := c.Call(ctx, "g", "s", payload)
			done <- outcome{time.Since(start), err}
		}()
	}
	for range calls {
		select {
		case o := <-done:
			var te *netio.Error
			if !errors.As(o.err, &te) || (te.Code != netio.CodeTimedOut && te.Code != netio.CodeNetworkDown) {
				t.Errorf("a call to a node that does not read: %v, want 'timed out' or 'network down'", o.err)
			}
			if o.took > time.Second {
				t.Errorf("a call with a %v deadline returned after %v", limit, o.took)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a call to a node that does not read did not return (5 s; its deadline was 200 ms)")
		}
	}
}

// TestGoAwayKeepsTheHost: after a node's go-away the client's next call
// goes to the same node on a new connection (the process taking its port
// over). Before, the old connection's clean close, once its last answer
// came, moved the client to the next dchost host.
func TestGoAwayKeepsTheHost(t *testing.T) {
	a, b := startNode(t, "a"), startNode(t, "b")
	c := newClient(t, Options{Hosts: []string{a.addr, b.addr}})
	if reply, err := c.Call(testCtx(t), "who", "s", nil); err != nil || string(reply) != "a" {
		t.Fatalf("first call: %q, %v", reply, err)
	}
	c.mu.Lock()
	old := c.conns[0]
	c.mu.Unlock()
	if n := a.srv.GoAway("test"); n != 1 {
		t.Fatalf("go-away told %d connections, want 1", n)
	}
	select {
	case <-old.Done():
	case <-time.After(waitLimit):
		t.Fatal("the old connection did not close after the go-away")
	}
	if reply, err := c.Call(testCtx(t), "who", "s", nil); err != nil || string(reply) != "a" {
		t.Errorf("the call after the go-away: %q, %v; want a", reply, err)
	}
}

// goingAwayWithACall makes the client's connection to n go away as a
// node's go-away would before the client is told: a slow call keeps it
// open, and it refuses new calls (Retire; OnGoAway not called, so the
// client still holds it). The slow call's outcome comes on the channel.
func goingAwayWithACall(t *testing.T, n *testNode, c *Client) <-chan error {
	t.Helper()
	slow := inFlight(c, 1, "slow", "300ms")
	waitUntil(t, "the slow call to arrive", func() bool { return n.framesOf("slow") == 1 })
	c.mu.Lock()
	old := c.conns[0]
	c.mu.Unlock()
	old.Retire()
	return slow
}

// TestCallToAfterGoAwayIsSentAgain: a CallTo refused as unsent by a
// connection going away (the node's go-away read, the client not yet told)
// goes on a new connection to the same node. Before, it failed 'network
// down', which says the call may have run, for a call that did not leave.
func TestCallToAfterGoAwayIsSentAgain(t *testing.T) {
	n := startNode(t, "a")
	c := newClient(t, Options{Hosts: []string{n.addr}})
	slow := goingAwayWithACall(t, n, c)
	if reply, err := c.CallTo(testCtx(t), n.addr, "who", "s", nil); err != nil || string(reply) != "a" {
		t.Errorf("CallTo on a connection going away: %q, %v; want a, sent on a new connection", reply, err)
	}
	if err := <-slow; err != nil {
		t.Errorf("the call sent before: %v", err)
	}
}

// TestSpreadKeepsNoClosedConnection: a connection of a MultiSchedule
// spread that the node closes before the fill keeps it (here during the
// receivers lookup) is not kept. Before, its OnClose had already run drop,
// the dead connection counted as one of the receiver group's sockets, and
// every call picked onto it failed 'network down', for good.
func TestSpreadKeepsNoClosedConnection(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			nc.Close() // closes every connection at once
		}
	}()
	c := newClient(t, Options{Hosts: []string{l.Addr().String()}, MultiSchedule: true})
	s := c.spreadFor(receiverRoute{addr: l.Addr().String(), count: 2}, "g")
	s.fill(testCtx(t))
	if kept := s.held(); kept != 0 {
		t.Errorf("the spread keeps %d connections the node closed", kept)
	}
}

// hangingAddr is an address whose dials hang: a socket listening with a
// backlog of 0 that never accepts, its queue filled, so the kernel drops
// every further SYN and connect waits for DialTimeout.
func hangingAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	for range 16 {
		nc, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			return addr // the queue is full
		}
		t.Cleanup(func() { nc.Close() })
	}
	t.Skip("cannot fill a listen queue here: every dial is accepted")
	return ""
}

// TestDialPastDeadlineTimesOut: callers whose deadline passes while their
// host is dialled leave at it, 'timed out', the one that started the dial
// and those that wait for it alike, and try no other host. Before, the
// first waited for DialTimeout (3 s) in net.DialTimeout, the others for it
// on the dial's done (the test's calls returned after 3.0 s).
func TestDialPastDeadlineTimesOut(t *testing.T) {
	t.Parallel()
	hang := hangingAddr(t)
	n := startNode(t, "b")
	c := newClient(t, Options{Hosts: []string{hang, n.addr}})
	errc := make(chan error, 3)
	t0 := time.Now()
	for range 3 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			_, err := c.Call(ctx, "demo", "echo", nil)
			errc <- err
		}()
	}
	for range 3 {
		err := <-errc
		wantCode(t, err, netio.CodeTimedOut)
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("the calls returned after %v with 200ms deadlines", d)
	}
	if got := n.framesOf("demo"); got != 0 {
		t.Errorf("the other host got %d calls, want none: a call whose time is up fails over nowhere", got)
	}
}

// silentAddr is a listener that accepts connections and reads them but
// never answers.
func silentAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer nc.Close()
				_, _ = io.Copy(io.Discard, nc)
			}()
		}
	}()
	return l.Addr().String()
}

// TestSpreadFillPastDeadlineTimesOut: with MultiSchedule, a caller that
// fills a spread whose receivers never answer the lookup leaves at its
// deadline, 'timed out'. Before, the fill ran on the caller's goroutine
// with a 5 s lookup on context.Background per connection (the call
// returned after 10 s).
func TestSpreadFillPastDeadlineTimesOut(t *testing.T) {
	t.Parallel()
	silent := silentAddr(t)
	n := startNode(t, "a")
	n.mu.Lock()
	n.receivers = netio.Receivers{Group: "r", Addr: silent, Count: 2, Here: -1}
	n.mu.Unlock()
	c := newClient(t, Options{Hosts: []string{n.addr}, MultiSchedule: true})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err := c.Call(ctx, "demo", "echo", nil)
	d := time.Since(t0)
	wantCode(t, err, netio.CodeTimedOut)
	if d > time.Second {
		t.Errorf("the call returned after %v with a 200ms deadline", d)
	}
}

// TestFrameTimeoutIsWhatIsLeft: a call's frame tells the node what is left
// of the caller's deadline when it is sent, not what was left when the
// call began: here a receivers lookup answered after 150 ms of a 500 ms
// deadline leaves at most 350 ms. Before, the frame carried 500 ms, and
// the node could work for a caller gone 150 ms before.
func TestFrameTimeoutIsWhatIsLeft(t *testing.T) {
	t.Parallel()
	n := startNode(t, "a")
	n.mu.Lock()
	n.receivers = netio.Receivers{Addr: n.addr, Count: 1, Here: 0}
	n.receiversDelay = 150 * time.Millisecond
	n.mu.Unlock()
	c := newClient(t, Options{Hosts: []string{n.addr}, MultiSchedule: true})
	if _, err := c.Call(testCtx(t), "warm", "echo", nil); err != nil { // the connection first
		t.Fatal(err)
	}
	const deadline = 500 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	if _, err := c.Call(ctx, "tm", "echo", nil); err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	ms := n.timeouts["tm"]
	n.mu.Unlock()
	if left := (deadline - n.receiversDelay).Milliseconds(); ms == 0 || int64(ms) > left {
		t.Errorf("the frame carried %d ms; the caller had at most %d ms left when it was sent", ms, left)
	}
}

// TestReplacedSpreadIsRetired: a spread replaced when its receiver group's
// number of sockets changes lets the calls in flight on its connections
// get their answers, then closes them; a fill still running on it keeps
// nothing. Before, its connections were closed at once (the call in flight
// failed 'network down', though it ran), and what a late fill made was
// kept by a spread no one closed.
func TestReplacedSpreadIsRetired(t *testing.T) {
	t.Parallel()
	n := startNode(t, "a")
	n.mu.Lock()
	n.receivers = netio.Receivers{Addr: n.addr, Count: 2, Here: -1}
	n.mu.Unlock()
	c := newClient(t, Options{Hosts: []string{n.addr}, MultiSchedule: true})
	slow := inFlight(c, 1, "slow", "300ms")
	waitUntil(t, "the slow call to arrive", func() bool {
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.timeouts["slow"] != 0 // the receivers lookups before it carry none
	})
	c.mu.Lock()
	old := c.spreads[n.addr]
	c.mu.Unlock()
	old.mu.Lock()
	conns := append([]*netio.MuxConn(nil), old.conns...)
	old.mu.Unlock()
	if len(conns) != 2 {
		t.Fatalf("the spread has %d connections, want 2", len(conns))
	}
	c.spreadFor(receiverRoute{addr: n.addr, count: 3}, "slow")
	if err := <-slow; err != nil {
		t.Errorf("the call in flight on the replaced spread: %v", err)
	}
	for _, mc := range conns {
		select {
		case <-mc.Done():
		case <-time.After(waitLimit):
			t.Fatal("a connection of the replaced spread is still open after its calls were answered")
		}
	}

	// A fill on a spread replaced meanwhile keeps nothing.
	s := c.spreadFor(receiverRoute{addr: n.addr, count: 4}, "g")
	c.spreadFor(receiverRoute{addr: n.addr, count: 5}, "g")
	s.fill(testCtx(t))
	if kept := s.held(); kept != 0 {
		t.Errorf("the replaced spread's fill kept %d connections nothing closes", kept)
	}
}

// held is how many connections the spread keeps.
func (s *spread) held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// TestCloseFailsCallsOnConnectionsGoingAway: Close fails the calls waiting
// on a connection the node asked the client to leave (go-away), and closes
// it, as it does those on the connections it still uses. Before, a
// go-away took the connection out of the client's table while its calls
// waited on, so Close left it open: the call outlived Close (here it got
// its reply 2 s later) and so did the connection and its reader.
func TestCloseFailsCallsOnConnectionsGoingAway(t *testing.T) {
	t.Parallel()
	n := startNode(t, "a")
	c := newClient(t, Options{Hosts: []string{n.addr}})
	errc := inFlight(c, 1, "slow", "2s")
	waitUntil(t, "the call to arrive", func() bool { return n.framesOf("slow") == 1 })
	c.mu.Lock()
	old := c.conns[0]
	c.mu.Unlock()
	if told := n.srv.GoAway("test"); told != 1 {
		t.Fatalf("go-away told %d connections, want 1", told)
	}
	waitUntil(t, "the client to leave the connection", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.conns[0] != old
	})
	t0 := time.Now()
	c.Close()
	select {
	case err := <-errc:
		wantCode(t, err, netio.CodeNetworkDown)
	case <-time.After(waitLimit):
		t.Fatal("the call outlived Close")
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("the call ended %v after Close", d)
	}
	select {
	case <-old.Done():
	default:
		t.Error("the connection going away is still open after Close")
	}
}

// TestReceiversLookupTimeoutIsNotAnAnswer: with MultiSchedule, a first
// call whose deadline passes while the node's receivers lookup is under
// way leaves the group's route unlearned, and the next call asks again.
// Before, the caller's own 'timed out' was taken for the node's answer
// that it does not define the group: the group was remembered as received
// on the node's own port, one socket, and its calls were never spread.
func TestReceiversLookupTimeoutIsNotAnAnswer(t *testing.T) {
	t.Parallel()
	n := startNode(t, "a")
	n.mu.Lock()
	n.receivers = netio.Receivers{Addr: n.addr, Count: 2, Here: -1}
	n.receiversDelay = 300 * time.Millisecond
	n.mu.Unlock()
	c := newClient(t, Options{Hosts: []string{n.addr}, MultiSchedule: true})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := c.Call(ctx, "g", "echo", nil)
	wantCode(t, err, netio.CodeTimedOut)
	if r, ok := c.routeFor(0, "g"); ok {
		t.Errorf("a lookup that timed out on the caller's side was remembered as route %+v", r)
	}
	if _, err := c.Call(testCtx(t), "g", "echo", nil); err != nil {
		t.Fatal(err)
	}
	if r, _ := c.routeFor(0, "g"); r.count != 2 {
		t.Errorf("route %+v after the node answered, want its 2 sockets", r)
	}
}

// TestFillOfAReplacedSpreadStops: a fill that finds its spread replaced
// (or the client closed) stops at the first connection it cannot keep.
// Before, it went on dialling and asking, and closing, three times as
// many connections as the receiver group has sockets, on its caller's
// time (here 12 for 4 sockets).
func TestFillOfAReplacedSpreadStops(t *testing.T) {
	t.Parallel()
	n := startNode(t, "a")
	n.mu.Lock()
	n.receivers = netio.Receivers{Addr: n.addr, Count: 4, Here: -1}
	n.mu.Unlock()
	c := newClient(t, Options{Hosts: []string{n.addr}, MultiSchedule: true})
	s := c.spreadFor(receiverRoute{addr: n.addr, count: 4}, "g")
	c.spreadFor(receiverRoute{addr: n.addr, count: 5}, "g")
	before := n.accepted()
	s.fill(testCtx(t))
	if dialled := n.accepted() - before; dialled > 1 {
		t.Errorf("the fill of a replaced spread dialled %d connections, want at most 1", dialled)
	}
}

// TestAnswerThatCameIsNotDroppedAtTheDeadline: an answer that came when
// the caller's deadline passed is the call's result, not 'timed out': the
// service ran and its reply is in hand. Before, wait chose at random
// between the two, and half the time dropped the reply.
func TestAnswerThatCameIsNotDroppedAtTheDeadline(t *testing.T) {
	t.Parallel()
	a, b := net.Pipe()
	defer b.Close()
	mc := netio.NewMuxConn(a, netio.MuxOptions{})
	defer mc.Close(nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 32 {
		w := &waiter{ch: make(chan result, 1)}
		w.Answer(netio.Frame{Header: netio.Header{Kind: netio.KindReply}, Payload: []byte("ran")}, nil)
		// The id is no longer pending: the reader handed its answer on.
		reply, err := wait(ctx, mc, uint64(1000+i), w, 0)
		if err != nil || string(reply) != "ran" {
			t.Fatalf("try %d: %q, %v; want the reply that came", i, reply, err)
		}
	}
}

// TestCanceledCallIsNotSent: a call whose ctx is cancelled before it is
// sent fails with ctx's error and is not sent, on a connection already
// open too, whichever way it goes (Call, CallTo, FindServer). Before,
// CallTo and FindServer handed the frame to the open connection all the
// same: the service ran for a caller that had already gone.
func TestCanceledCallIsNotSent(t *testing.T) {
	t.Parallel()
	n := startNode(t, "a")
	c := newClient(t, Options{Hosts: []string{n.addr}})
	if _, err := c.Call(testCtx(t), "warm", "echo", nil); err != nil { // the connection first
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Call(ctx, "gone", "echo", nil); !errors.Is(err, context.Canceled) {
		t.Errorf("Call = %v, want context.Canceled", err)
	}
	if _, err := c.CallTo(ctx, n.addr, "gone", "echo", nil); !errors.Is(err, context.Canceled) {
		t.Errorf("CallTo = %v, want context.Canceled", err)
	}
	if err := c.CallNoReplyTo(ctx, n.addr, "gone", "echo", nil); !errors.Is(err, context.Canceled) {
		t.Errorf("CallNoReplyTo = %v, want context.Canceled", err)
	}
	if _, err := c.FindServer(ctx, "gone"); !errors.Is(err, context.Canceled) {
		t.Errorf("FindServer = %v, want context.Canceled", err)
	}
	if _, err := c.Call(testCtx(t), "after", "echo", nil); err != nil { // the node read all before it
		t.Fatal(err)
	}
	if got := n.framesOf("gone"); got != 0 {
		t.Errorf("the node got %d frames of calls cancelled before they were sent", got)
	}
}

// TestCloseEndsASpreadFill: Close ends the wait of a call whose spread
// fill dials a receiver group that does not answer the dial. Before, the
// fill dialled on the caller's ctx alone, and the call outlived Close by
// up to DialTimeout (here 5 s).
func TestCloseEndsASpreadFill(t *testing.T) {
	t.Parallel()
	hang := hangingAddr(t)
	n := startNode(t, "a")
	n.mu.Lock()
	n.receivers = netio.Receivers{Group: "r", Addr: hang, Count: 2, Here: -1}
	n.mu.Unlock()
	c := newClient(t, Options{Hosts: []string{n.addr}, MultiSchedule: true, DialTimeout: 5 * time.Second})
	errc := inFlight(c, 1, "g", "echo")
	waitUntil(t, "the receivers lookup", func() bool { return n.framesOf("g") == 1 })
	time.Sleep(100 * time.Millisecond) // into the fill's dial
	t0 := time.Now()
	c.Close()
	select {
	case err := <-errc:
		if err == nil {
			t.Error("the call succeeded after Close")
		}
	case <-time.After(waitLimit):
		t.Fatal("the call outlived Close")
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("the call ended %v after Close", d)
	}
}

// TestLookupLimitHoldsUnderACallersDeadline: a name lookup (LoadBalance)
// or receivers lookup (MultiSchedule) the node does not answer ends at
// its own limit (5 s and the grace) when the caller's deadline is longer,
// as it does under WatchTime, and the call goes on the dchost way or the
// node's own port. Before, the limit held only for calls without a
// deadline of their own: a caller with a longer one waited the whole of
// it for the lookup, and its call failed 'timed out' without being sent.
func TestLookupLimitHoldsUnderACallersDeadline(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"name lookup", Options{LoadBalance: true}}, // the test node answers no plain name lookup
		{"receivers lookup", Options{MultiSchedule: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := startNode(t, "a")
			n.mu.Lock()
			n.receivers = netio.Receivers{Addr: n.addr, Count: 2, Here: -1}
			n.receiversDelay = time.Minute
			n.mu.Unlock()
			tc.opts.Hosts = []string{n.addr}
			c := newClient(t, tc.opts)
			ctx, cancel := context.WithTimeout(context.Background(), 9*time.Second)
			defer cancel()
			t0 := time.Now()
			if _, err := c.Call(ctx, "g", "echo", nil); err != nil {
				t.Errorf("Call after %v: %v", time.Since(t0), err)
			}
		})
	}
}

// TestUnreachableBalancedNodeIsLeftOut: a node a name lookup named that
// cannot be reached is left out of its group's nodes for as long as they
// are kept (dccltcachetim): the group's calls go the dchost way meanwhile
// without asking again. Before, the group's entry was forgotten, and the
// next call asked again, was told the same node and dialled it again: each
// call waited DialTimeout (here 300 ms) before it went the dchost way.
func TestUnreachableBalancedNodeIsLeftOut(t *testing.T) {
	t.Parallel()
	hang := hangingAddr(t)
	n := startNode(t, "a")
	n.mu.Lock()
	n.lookup = []netio.NodeLevel{{Addr: hang, Level: 0}}
	n.mu.Unlock()
	c := newClient(t, Options{Hosts: []string{n.addr}, LoadBalance: true, DialTimeout: 300 * time.Millisecond})
	t0 := time.Now()
	for i := range 4 {
		if reply, err := c.Call(testCtx(t), "who", "s", nil); err != nil || string(reply) != "a" {
			t.Fatalf("call %d: %q, %v; want the dchost node's answer", i, reply, err)
		}
	}
	if d := time.Since(t0); d > 900*time.Millisecond {
		t.Errorf("4 calls took %v: the unreachable node was dialled again (DialTimeout 300ms)", d)
	}
	// the lookups: the first call's alone
	if got := n.framesOf("who"); got != 5 {
		t.Errorf("the dchost node got %d frames of the group, want 1 lookup and 4 calls", got)
	}
}
