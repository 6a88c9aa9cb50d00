package rpcport

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"tpsched/netio"

	"github.com/VictoriaMetrics/metrics"
	"github.com/panjf2000/gnet/v2"
)

const testDeadline = 20 * time.Second

// echoHandler answers KindCall with a KindReply of the same payload, at once
// through SendNow or later through Send from a goroutine.
type echoHandler struct {
	async bool

	mu     sync.Mutex
	loops  map[gnet.EventLoop]int // connections seen per event loop
	closed atomic.Int64
}

func (h *echoHandler) OnFrame(c *Conn, f netio.Frame) {
	if c.Context() == nil {
		c.SetContext(true)
		h.mu.Lock()
		if h.loops == nil {
			h.loops = map[gnet.EventLoop]int{}
		}
		h.loops[c.gc.EventLoop()]++
		h.mu.Unlock()
	}
	if f.Kind != netio.KindCall {
		return
	}
	if !h.async {
		c.SendNow(netio.AppendReply(nil, f.ID, f.Payload))
		return
	}
	reply := netio.AppendReply(nil, f.ID, f.Payload) // copies f.Payload
	go func() { _ = c.Send(reply) }()
}

func (h *echoHandler) OnClose(*Conn) { h.closed.Add(1) }

func (h *echoHandler) loopCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.loops)
}

func startServer(t *testing.T, opts Options, h Handler) *Port {
	t.Helper()
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	s, err := Listen(opts, h)
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return s
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	_ = c.SetDeadline(time.Now().Add(testDeadline))
	t.Cleanup(func() { c.Close() })
	return c
}

func callFrame(id uint64, payload []byte) []byte {
	return netio.AppendFrame(nil, netio.Header{Kind: netio.KindCall, ID: id}, "grp", "svc", payload)
}

// readFrame reads one frame and returns a copy of it.
func readFrame(r io.Reader) (netio.Frame, error) {
	hdr := make([]byte, netio.HeaderSize)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return netio.Frame{}, err
	}
	n, err := netio.FrameLen(hdr, 1<<30)
	if err != nil {
		return netio.Frame{}, err
	}
	buf := append(hdr, make([]byte, n-netio.HeaderSize)...)
	if _, err := io.ReadFull(r, buf[netio.HeaderSize:]); err != nil {
		return netio.Frame{}, err
	}
	f, _, err := netio.Decode(buf, 1<<30)
	return f, err
}

func call(c net.Conn, r io.Reader, id uint64, payload []byte) error {
	if _, err := c.Write(callFrame(id, payload)); err != nil {
		return err
	}
	f, err := readFrame(r)
	if err != nil {
		return err
	}
	if f.Kind != netio.KindReply || f.ID != id || !bytes.Equal(f.Payload, payload) {
		return fmt.Errorf("call %d: got kind %v id %d payload %d bytes", id, f.Kind, f.ID, len(f.Payload))
	}
	return nil
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testDeadline)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// expectClosed reads until the server closes c.
func expectClosed(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(testDeadline))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection not closed by the server: %v", err)
	}
}

func TestEcho(t *testing.T) {
	for _, mode := range []string{"sendnow", "send"} {
		t.Run(mode, func(t *testing.T) {
			h := &echoHandler{async: mode == "send"}
			s := startServer(t, Options{}, h)
			ordered := mode == "sendnow"

			t.Run("single", func(t *testing.T) {
				c := dial(t, s.Addr())
				if err := call(c, c, 1, []byte("hello")); err != nil {
					t.Fatal(err)
				}
				if err := call(c, c, 2, nil); err != nil {
					t.Fatal(err)
				}
			})

			t.Run("pipelined", func(t *testing.T) {
				c := dial(t, s.Addr())
				const n = 2000
				var out []byte
				for i := range n {
					out = append(out, callFrame(uint64(i), []byte(strconv.Itoa(i)))...)
				}
				if _, err := c.Write(out); err != nil {
					t.Fatal(err)
				}
				r := bufio.NewReader(c)
				seen := make(map[uint64]bool, n)
				for i := range n {
					f, err := readFrame(r)
					if err != nil {
						t.Fatalf("reply %d: %v", i, err)
					}
					if ordered && f.ID != uint64(i) {
						t.Fatalf("reply %d has id %d", i, f.ID)
					}
					if string(f.Payload) != strconv.FormatUint(f.ID, 10) || seen[f.ID] {
						t.Fatalf("reply id %d payload %q (dup %v)", f.ID, f.Payload, seen[f.ID])
					}
					seen[f.ID] = true
				}
			})

			t.Run("byte-by-byte", func(t *testing.T) {
				c := dial(t, s.Addr())
				var out []byte
				for i := range 3 {
					out = append(out, callFrame(uint64(i), []byte("split across writes"))...)
				}
				go func() {
					for i := range out {
						if _, err := c.Write(out[i : i+1]); err != nil {
							return
						}
						time.Sleep(50 * time.Microsecond)
					}
				}()
				seen := map[uint64]bool{}
				for range 3 {
					f, err := readFrame(c)
					if err != nil {
						t.Fatal(err)
					}
					if string(f.Payload) != "split across writes" || seen[f.ID] {
						t.Fatalf("bad reply %d %q", f.ID, f.Payload)
					}
					seen[f.ID] = true
				}
			})

			t.Run("large-payload", func(t *testing.T) {
				// Larger than gnet's 64 KiB read buffer: the frame gathers in the inbound ring.
				c := dial(t, s.Addr())
				p := bytes.Repeat([]byte("0123456789abcdef"), 40000) // 640000 bytes
				r := bufio.NewReader(c)
				for i := range 3 {
					errc := make(chan error, 1)
					go func() { _, err := c.Write(callFrame(uint64(i), p)); errc <- err }()
					f, err := readFrame(r)
					if err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(f.Payload, p) {
						t.Fatalf("large payload %d corrupted", i)
					}
					if err := <-errc; err != nil {
						t.Fatal(err)
					}
				}
			})
		})
	}
}

func TestManyConnections(t *testing.T) {
	for _, mode := range []string{"sendnow", "send"} {
		t.Run(mode, func(t *testing.T) {
			h := &echoHandler{async: mode == "send"}
			s := startServer(t, Options{Loops: 2}, h)
			const conns, calls = 100, 100
			errc := make(chan error, conns)
			var wg sync.WaitGroup
			for i := range conns {
				c := dial(t, s.Addr())
				wg.Go(func() {
					p := []byte(fmt.Sprintf("conn %d", i))
					for j := range calls {
						if err := call(c, c, uint64(j), p); err != nil {
							errc <- fmt.Errorf("conn %d call %d: %w", i, j, err)
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
			if got := s.Stats().Conns; got != conns {
				t.Errorf("Stats().Conns = %d, want %d", got, conns)
			}
		})
	}
}

func TestBadFrames(t *testing.T) {
	good := callFrame(7, []byte("ok"))
	patch := func(off int, b ...byte) []byte {
		f := bytes.Clone(good)
		copy(f[off:], b)
		return f
	}
	cases := []struct {
		name  string
		bytes []byte
	}{
		{"bad-magic", patch(0, 'X', 'X')},
		{"bad-version", patch(2, 9)},
		{"bad-kind-0", patch(3, 0)},
		{"bad-kind-200", patch(3, 200)},
		{"garbage", bytes.Repeat([]byte{0xff}, 100)},
	}
	set := metrics.NewSet()
	h := &echoHandler{}
	s := startServer(t, Options{MaxPayload: 1024, Metrics: set}, h)
	other := dial(t, s.Addr())
	if err := call(other, other, 1, []byte("before")); err != nil {
		t.Fatal(err)
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, s.Addr())
			// A good frame ahead of the bad one in the same write is answered.
			if _, err := c.Write(append(bytes.Clone(good), tc.bytes...)); err != nil {
				t.Fatal(err)
			}
			f, err := readFrame(c)
			if err != nil || f.ID != 7 || string(f.Payload) != "ok" {
				t.Fatalf("answer to the good frame: %+v, %v", f, err)
			}
			expectClosed(t, c)
			waitFor(t, "bad frame count", func() bool { return s.Stats().BadFrames == uint64(i+1) })
			if err := call(other, other, uint64(i+2), []byte("still here")); err != nil {
				t.Fatalf("other connection: %v", err)
			}
		})
	}
	var buf bytes.Buffer
	set.WritePrometheus(&buf)
	want := fmt.Sprintf("tpsched_bad_frames_total %d", len(cases))
	if !strings.Contains(buf.String(), want) || !strings.Contains(buf.String(), "tpsched_connections 1") {
		t.Errorf("metrics lack %q or tpsched_connections 1:\n%s", want, buf.String())
	}
	waitFor(t, "closes", func() bool { return h.closed.Load() == int64(len(cases)) })
}

// listeningSockets counts LISTEN sockets on port in /proc/net/tcp and tcp6.
func listeningSockets(t *testing.T, port int) int {
	t.Helper()
	n := 0
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fields := strings.Fields(line)
			if len(fields) < 4 || fields[3] != "0A" {
				continue
			}
			local := fields[1]
			p, err := strconv.ParseUint(local[strings.LastIndexByte(local, ':')+1:], 16, 16)
			if err == nil && int(p) == port {
				n++
			}
		}
	}
	return n
}

func TestReusePortLoops(t *testing.T) {
	for _, loops := range []int{1, 2, 4} {
		t.Run(strconv.Itoa(loops), func(t *testing.T) {
			h := &echoHandler{}
			s := startServer(t, Options{Loops: loops}, h)
			_, ps, _ := net.SplitHostPort(s.Addr())
			port, _ := strconv.Atoi(ps)
			if port == 0 {
				t.Fatalf("Addr() = %q has no port", s.Addr())
			}
			if got := listeningSockets(t, port); got != loops {
				t.Fatalf("%d listening sockets on port %d, want %d", got, port, loops)
			}
			if out, err := exec.Command("ss", "-Hltn", "sport = :"+ps).Output(); err == nil {
				if got := strings.Count(strings.TrimSpace(string(out)), "\n") + 1; got != loops {
					t.Fatalf("ss lists %d listening sockets, want %d:\n%s", got, loops, out)
				}
				t.Logf("ss -ltn:\n%s", out)
			}
			// The kernel hashes each 4-tuple to a socket: 64 connections
			// miss a loop with probability about loops x ((loops-1)/loops)^64.
			for i := range 64 {
				c := dial(t, s.Addr())
				if err := call(c, c, uint64(i), nil); err != nil {
					t.Fatal(err)
				}
			}
			if got := h.loopCount(); got != loops {
				t.Errorf("connections landed on %d loops, want %d", got, loops)
			}
		})
	}
}

func TestPortZeroWildcard(t *testing.T) {
	s := startServer(t, Options{Addr: ":0", Loops: 2}, &echoHandler{})
	_, ps, _ := net.SplitHostPort(s.Addr())
	c := dial(t, net.JoinHostPort("127.0.0.1", ps))
	if err := call(c, c, 1, []byte("x")); err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(ps)
	if got := listeningSockets(t, port); got != 2 {
		t.Fatalf("%d listening sockets, want 2", got)
	}
}

func TestListenErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if s, err := Listen(Options{Addr: ln.Addr().String(), Loops: 2}, &echoHandler{}); err == nil {
		_ = s.Stop(context.Background())
		t.Fatal("listen on a port in use succeeded")
	} else if !errors.Is(err, ErrPortShared) || !strings.Contains(err.Error(), "port "+strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)) {
		t.Errorf("error %q does not say the port is taken", err)
	}
	if _, err := Listen(Options{Addr: "no-such-host.invalid:1"}, &echoHandler{}); err == nil {
		t.Error("listen on a bad host succeeded")
	}
	if _, err := Listen(Options{Addr: "127.0.0.1:0"}, nil); err == nil {
		t.Error("listen with a nil handler succeeded")
	}
}

// floodHandler answers the first call by Sending chunks from a goroutine
// until Send fails.
type floodHandler struct {
	sendErr chan error
	closed  chan struct{}
}

func (h *floodHandler) OnFrame(c *Conn, f netio.Frame) {
	if f.Kind != netio.KindCall {
		return
	}
	go func() {
		chunk := 64 << 10
		for i := range 100000 {
			if err := c.Send(netio.AppendReply(nil, uint64(i), make([]byte, chunk))); err != nil {
				h.sendErr <- err
				return
			}
			if i%16 == 0 {
				time.Sleep(time.Millisecond) // let the loop run the writes
			}
		}
		h.sendErr <- errors.New("every send succeeded")
	}()
}

func (h *floodHandler) OnClose(*Conn) { close(h.closed) }

func TestSlowReader(t *testing.T) {
	t.Run("send", func(t *testing.T) {
		h := &floodHandler{sendErr: make(chan error, 1), closed: make(chan struct{})}
		s := startServer(t, Options{MaxOutbound: 1 << 20}, h)
		c := dial(t, s.Addr())
		if _, err := c.Write(callFrame(1, nil)); err != nil {
			t.Fatal(err)
		}
		// Never read.
		select {
		case err := <-h.sendErr:
			if !errors.Is(err, ErrSlowReader) && !errors.Is(err, ErrConnClosed) {
				t.Fatalf("Send error %v, want ErrSlowReader or ErrConnClosed", err)
			}
		case <-time.After(testDeadline):
			t.Fatal("Send never failed")
		}
		select {
		case <-h.closed:
		case <-time.After(testDeadline):
			t.Fatal("OnClose not called")
		}
		if got := s.Stats().SlowReaderCloses; got != 1 {
			t.Errorf("SlowReaderCloses = %d, want 1", got)
		}
	})
	t.Run("sendnow", func(t *testing.T) {
		h := &echoHandler{}
		s := startServer(t, Options{MaxOutbound: 1 << 20}, h)
		c := dial(t, s.Addr())
		p := make([]byte, 32<<10)
		frame := callFrame(1, p)
		// Pipeline calls and never read the echoes: they pile up on the server.
		for i := 0; s.Stats().SlowReaderCloses == 0; i++ {
			_ = c.SetWriteDeadline(time.Now().Add(testDeadline))
			if _, err := c.Write(frame); err != nil {
				break // the server closed the connection
			}
			if i > 100000 {
				t.Fatal("server never closed the slow reader")
			}
		}
		waitFor(t, "slow reader close", func() bool { return s.Stats().SlowReaderCloses == 1 && s.Stats().Conns == 0 })
	})
}

func TestStop(t *testing.T) {
	h := &echoHandler{async: true}
	s, err := Listen(Options{Addr: "127.0.0.1:0", Loops: 2}, h)
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	for i := range 10 {
		c := dial(t, s.Addr())
		if err := call(c, c, uint64(i), []byte("x")); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	start := time.Now()
	if err := s.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	t.Logf("stop took %v", time.Since(start))
	for _, c := range conns {
		expectClosed(t, c)
	}
	if got := h.closed.Load(); got != 10 {
		t.Errorf("OnClose ran %d times, want 10", got)
	}
	if got := s.Stats().Conns; got != 0 {
		t.Errorf("Stats().Conns = %d after stop", got)
	}
	if err := s.Stop(ctx); err != nil {
		t.Errorf("second stop: %v", err)
	}
	_, ps, _ := net.SplitHostPort(s.Addr())
	port, _ := strconv.Atoi(ps)
	if n := listeningSockets(t, port); n != 0 {
		t.Errorf("%d sockets still listen after stop", n)
	}
	// The port is free again once the clients close too.
	for _, c := range conns {
		c.Close()
	}
	ln, err := net.Listen("tcp", s.Addr())
	if err != nil {
		t.Fatalf("port still taken after stop: %v", err)
	}
	ln.Close()
}

// A Send racing with Stop never fails in a way other than the sentinel errors.
func TestSendDuringStop(t *testing.T) {
	var got atomic.Pointer[Conn]
	h := &hookHandler{onFrame: func(c *Conn, _ netio.Frame) { got.Store(c) }}
	s, err := Listen(Options{Addr: "127.0.0.1:0"}, h)
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, s.Addr())
	if _, err := c.Write(callFrame(1, nil)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "frame", func() bool { return got.Load() != nil })
	sc := got.Load()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			err := sc.Send([]byte("x"))
			if errors.Is(err, ErrConnClosed) {
				return
			}
		}
	}()
	time.Sleep(10 * time.Millisecond)
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-done
}

type hookHandler struct {
	onFrame func(*Conn, netio.Frame)
}

func (h *hookHandler) OnFrame(c *Conn, f netio.Frame) { h.onFrame(c, f) }
func (h *hookHandler) OnClose(*Conn)                  {}

// BenchmarkEchoServer measures pipelined calls answered with SendNow over
// 16 connections to a 2-loop server; one op is one call and its reply.
func BenchmarkEchoServer(b *testing.B) {
	s, err := Listen(Options{Addr: "127.0.0.1:0", Loops: 2}, &echoHandler{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Stop(context.Background())
	const conns, window = 16, 64
	payload := make([]byte, 128)
	b.SetBytes(int64(len(callFrame(0, payload))))
	b.ResetTimer()
	var wg sync.WaitGroup
	per := b.N/conns + 1
	for range conns {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		wg.Go(func() {
			go func() {
				w := bufio.NewWriter(c)
				for i := range per {
					w.Write(callFrame(uint64(i), payload))
					if i%window == window-1 {
						w.Flush()
					}
				}
				w.Flush()
			}()
			r := bufio.NewReader(c)
			for range per {
				if _, err := readFrame(r); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// mixedHandler answers even ids at once (SendNow, on the loop) and odd ids
// from another goroutine (Send, which writes to the socket itself while
// nothing is queued and queues behind the loop once the socket is full).
type mixedHandler struct{}

func (mixedHandler) OnFrame(c *Conn, f netio.Frame) {
	reply := netio.AppendReply(nil, f.ID, f.Payload)
	if f.ID%2 == 0 {
		c.SendNow(reply)
		return
	}
	go func() { _ = c.Send(reply) }()
}

func (mixedHandler) OnClose(*Conn) {}

// TestMixedAnswerPathsKeepFramesWhole fills the socket so that direct
// writes from Send come up short and the rest goes through the loop, while
// the loop writes answers of its own: every frame must arrive whole.
func TestMixedAnswerPathsKeepFramesWhole(t *testing.T) {
	s := startServer(t, Options{MaxPayload: 1 << 20}, mixedHandler{})
	c := dial(t, s.Addr())
	const calls = 60
	payload := func(id uint64) []byte {
		p := make([]byte, 100_000+int(id)*997)
		for i := range p {
			p[i] = byte(id) ^ byte(i)
		}
		return p
	}
	go func() {
		for id := uint64(1); id <= calls; id++ {
			if _, err := c.Write(callFrame(id, payload(id))); err != nil {
				return
			}
			time.Sleep(time.Millisecond) // answers keep coming while the socket drains
		}
	}()
	// A slow reader: the socket fills, drains a little, fills again, so
	// Send meets a full socket, a partly free one and an empty one in turn.
	r := bufio.NewReader(slowReader{c})
	seen := map[uint64]bool{}
	for range calls {
		f, err := readFrame(r)
		if err != nil {
			t.Fatalf("after %d answers: %v", len(seen), err)
		}
		if f.Kind != netio.KindReply || seen[f.ID] || !bytes.Equal(f.Payload, payload(f.ID)) {
			t.Fatalf("answer %d: kind %v, %d bytes, seen before %v", f.ID, f.Kind, len(f.Payload), seen[f.ID])
		}
		seen[f.ID] = true
	}
}

type slowReader struct{ r io.Reader }

func (s slowReader) Read(p []byte) (int, error) {
	time.Sleep(200 * time.Microsecond)
	return s.r.Read(p[:min(len(p), 16<<10)])
}

// TestResetWhileAnswering: a caller that resets its connection while its
// answers are being written must cost that connection only. gnet closes a
// connection inside Write when the write fails; the loop must not then
// wait on a lock it holds itself.
func TestResetWhileAnswering(t *testing.T) {
	h := &hookHandler{onFrame: func(c *Conn, f netio.Frame) {
		if string(f.Payload) == "slow" {
			time.Sleep(200 * time.Millisecond) // the caller resets meanwhile
		}
		c.SendNow(netio.AppendReply(nil, f.ID, f.Payload))
	}}
	s := startServer(t, Options{}, h) // one loop: a stuck loop stops everyone
	bad := dial(t, s.Addr())
	if _, err := bad.Write(callFrame(1, []byte("slow"))); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	_ = bad.(*net.TCPConn).SetLinger(0)
	bad.Close() // RST: the server's write of the answer fails
	time.Sleep(300 * time.Millisecond)
	good := dial(t, s.Addr())
	_ = good.SetDeadline(time.Now().Add(5 * time.Second))
	if err := call(good, good, 2, []byte("next")); err != nil {
		t.Fatalf("a caller after the reset: %v", err)
	}
}

// loopBlocker holds the loop (tests only) in the OnFrame of a call whose
// payload is "block" until release is closed, and echoes every call.
type loopBlocker struct {
	blocked chan struct{}
	release chan struct{}
}

func (h *loopBlocker) OnFrame(c *Conn, f netio.Frame) {
	if string(f.Payload) == "block" {
		close(h.blocked)
		<-h.release
	}
	c.SendNow(netio.AppendReply(nil, f.ID, f.Payload))
}
func (h *loopBlocker) OnClose(*Conn) {}

// TestStopAnswersWhatArrived: call frames that reach the node while Stop
// begins each get one answer, 'node shutting down', and then the caller
// gets a clean close (FIN, never a reset): no answer is lost. The loop is
// held in an OnFrame while Stop begins and calls arrive on the other
// connections.
func TestStopAnswersWhatArrived(t *testing.T) {
	h := &loopBlocker{blocked: make(chan struct{}), release: make(chan struct{})}
	s, err := Listen(Options{Addr: "127.0.0.1:0"}, h)
	if err != nil {
		t.Fatal(err)
	}
	type caller struct {
		c    net.Conn
		r    *bufio.Reader
		sent int
	}
	var cs []*caller
	for i := range 4 {
		c := dial(t, s.Addr())
		cl := &caller{c: c, r: bufio.NewReader(c)}
		if err := call(c, cl.r, uint64(i), []byte("hello")); err != nil {
			t.Fatal(err)
		}
		cs = append(cs, cl)
	}
	blocker := dial(t, s.Addr())
	if _, err := blocker.Write(callFrame(99, []byte("block"))); err != nil {
		t.Fatal(err)
	}
	<-h.blocked
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
		defer cancel()
		stopped <- s.Stop(ctx)
	}()
	waitFor(t, "Stop to begin", func() bool { return s.stopping.Load() })
	const late = 50
	for _, cl := range cs {
		var batch []byte
		for i := range late {
			batch = append(batch, callFrame(uint64(100+i), []byte("late"))...)
		}
		if _, err := cl.c.Write(batch); err != nil {
			t.Fatal(err)
		}
		cl.sent = late
	}
	time.Sleep(50 * time.Millisecond)
	close(h.release)
	if err := <-stopped; err != nil {
		t.Fatalf("stop: %v", err)
	}
	for i, cl := range cs {
		got := map[uint64]netio.Frame{}
		for {
			f, err := readFrame(cl.r)
			if err != nil {
				if !errors.Is(err, io.EOF) {
					t.Errorf("caller %d: the connection ended with %v, not a clean close", i, err)
				}
				break
			}
			if _, dup := got[f.ID]; dup {
				t.Fatalf("caller %d: two answers for id %d", i, f.ID)
			}
			got[f.ID] = f
		}
		missing := 0
		for id := range uint64(late) {
			f, ok := got[100+id]
			switch {
			case !ok:
				missing++
			case f.Kind != netio.KindError || f.Code != netio.CodeShuttingDown:
				t.Errorf("caller %d call %d: %+v, want 'node shutting down'", i, 100+id, f.Header)
			}
		}
		t.Logf("caller %d: %d calls arrived during Stop, %d not answered", i, cl.sent, missing)
		if missing > 0 {
			t.Errorf("caller %d: %d of %d calls that reached the node got no answer before the connection closed", i, missing, cl.sent)
		}
	}
	if n := s.Stats().Undelivered; n != 0 {
		t.Errorf("Stats().Undelivered = %d after Stop", n)
	}
}

// resetHandler answers at once, but first sleeps on a frame whose service
// is "slow": long enough for the caller to reset the connection, so the
// answer's write fails inside the event loop.
type resetHandler struct{ echoHandler }

func (h *resetHandler) OnFrame(c *Conn, f netio.Frame) {
	if string(f.Service) == "slow" {
		time.Sleep(100 * time.Millisecond)
	}
	h.echoHandler.OnFrame(c, f)
}

// TestAnswerToResetConnection: a caller that resets its connection (RST)
// while the node prepares its answer makes the answer's write fail inside
// the event loop, which closes the connection there. The loop must go on
// serving every other connection.
func TestAnswerToResetConnection(t *testing.T) {
	s := startServer(t, Options{Loops: 1}, &resetHandler{})
	for i := range 3 {
		rc := dial(t, s.Addr())
		if _, err := rc.Write(netio.AppendFrame(nil, netio.Header{Kind: netio.KindCall, ID: 1}, "grp", "slow", []byte("x"))); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // the loop has read the frame and sleeps
		_ = rc.(*net.TCPConn).SetLinger(0)
		rc.Close() // RST
		c := dial(t, s.Addr())
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if err := call(c, c, 2, []byte("after a reset")); err != nil {
			t.Fatalf("round %d: a call on another connection after a caller reset its own: %v", i, err)
		}
	}
}

// TestStopHoldsTheFINForAnAnswerOwed: Stop shuts a connection's write side
// only once the answers it owes are written, so that a clean close still
// means every answer came: a call answered after Stop began gets its
// answer and then the FIN; one never answered ends with a reset, not a
// FIN, within stopLinger.
func TestStopHoldsTheFINForAnAnswerOwed(t *testing.T) {
	var mu sync.Mutex
	held := map[uint64]*Conn{}
	h := &hookHandler{onFrame: func(c *Conn, f netio.Frame) {
		mu.Lock()
		held[f.ID] = c
		mu.Unlock()
	}}
	s, err := Listen(Options{Addr: "127.0.0.1:0"}, h)
	if err != nil {
		t.Fatal(err)
	}
	late, never := dial(t, s.Addr()), dial(t, s.Addr())
	for id, c := range map[uint64]net.Conn{1: late, 2: never} {
		if _, err := c.Write(callFrame(id, []byte("x"))); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "both calls", func() bool { mu.Lock(); defer mu.Unlock(); return len(held) == 2 })
	stopped := make(chan error, 1)
	go func() { stopped <- s.Stop(context.Background()) }()
	time.Sleep(200 * time.Millisecond) // Stop has looked at both connections
	mu.Lock()
	sc := held[1]
	mu.Unlock()
	if err := sc.Send(netio.AppendReply(nil, 1, []byte("late"))); err != nil {
		t.Fatalf("the answer sent after Stop began: %v", err)
	}
	if f, err := readFrame(late); err != nil || f.ID != 1 || string(f.Payload) != "late" {
		t.Fatalf("the caller answered after Stop began read %+v %q, %v; want its reply", f.Header, f.Payload, err)
	}
	if _, err := readFrame(late); !errors.Is(err, io.EOF) {
		t.Errorf("after its answer: %v, want the FIN (EOF)", err)
	}
	if _, err := readFrame(never); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("the caller never answered: %v, want a reset (no clean close with an answer owed)", err)
	}
	if err := <-stopped; err != nil {
		t.Errorf("stop: %v", err)
	}
}
