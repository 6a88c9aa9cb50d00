package itest

// Attacks on the RPC port's network layer, run against a real scdd: the
// fd table filled, connections beyond max_connections, the listener killed
// from outside, partial frames held open, clients that never read, and
// frames larger than any max_message_size. Each TestChaos* prints its
// figures with t.Logf; TPSCHED_CHAOS_FULL=1 makes the attacks last longer.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tpsched/internal/testenv"
	"tpsched/netio"
)

// chaosDuration is how long an attack lasts: short by default, longer with
// TPSCHED_CHAOS_FULL=1.
func chaosDuration(quick, full time.Duration) time.Duration {
	if os.Getenv("TPSCHED_CHAOS_FULL") == "1" {
		return full
	}
	return quick
}

// procStatusKB reads one kB field (VmRSS, VmHWM) of /proc/pid/status.
func procStatusKB(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb
		}
	}
	return 0
}

// rssLimit is a bound on scdd's RSS in MiB, for a scdd that runs under the
// race detector too (make test): its shadow memory and bookkeeping take
// about twice the heap again.
func rssLimit(mib float64) float64 {
	if raceBuild {
		return 3 * mib
	}
	return mib
}

// rssPeak samples the memory of pid every 20 ms until stop is called and
// returns the highest VmRSS seen and the highest RssAnon (the heap and
// stacks, without the shared-memory queues it maps), in MiB.
func rssPeak(t *testing.T, pid int) (stop func() (rss, anon float64)) {
	var peak, peakAnon atomic.Int64
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tk := time.NewTicker(20 * time.Millisecond)
		defer tk.Stop()
		for {
			if kb := procStatusKB(t, pid, "VmRSS"); kb > peak.Load() {
				peak.Store(kb)
			}
			if kb := procStatusKB(t, pid, "RssAnon"); kb > peakAnon.Load() {
				peakAnon.Store(kb)
			}
			select {
			case <-done:
				return
			case <-tk.C:
			}
		}
	}()
	return func() (float64, float64) {
		close(done)
		<-finished
		return float64(peak.Load()) / 1024, float64(peakAnon.Load()) / 1024
	}
}

// callerFigures is what a well-behaved caller saw during an attack.
type callerFigures struct {
	mu     sync.Mutex
	lat    []time.Duration
	failed map[string]int
}

func (f *callerFigures) add(d time.Duration, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		if f.failed == nil {
			f.failed = map[string]int{}
		}
		f.failed[err.Error()]++
		return
	}
	f.lat = append(f.lat, d)
}

func (f *callerFigures) summary() (ok, failed int, p50, p99 time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, n := range f.failed {
		failed += n
	}
	if len(f.lat) == 0 {
		return 0, failed, 0, 0
	}
	s := slices.Clone(f.lat)
	slices.Sort(s)
	return len(s), failed, s[len(s)*50/100], s[len(s)*99/100]
}

// baseline runs the callers alone for a second and returns their p50 and
// p99, the figures an attack is compared with.
func baseline(t *testing.T, n *node, group string) (p50, p99 time.Duration) {
	t.Helper()
	stop := runCallers(t, n, group, 2)
	time.Sleep(time.Second)
	_, _, p50, p99 = stop().summary()
	return p50, p99
}

// runCallers starts workers goroutines that call group/echo with a 1 KiB
// payload, each through its own client, until stop is called.
func runCallers(t *testing.T, n *node, group string, workers int) (stop func() *callerFigures) {
	t.Helper()
	figs := &callerFigures{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	payload := bytes.Repeat([]byte("l"), 1024)
	for range workers {
		c := n.client()
		wg.Go(func() {
			for ctx.Err() == nil {
				cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
				start := time.Now()
				reply, err := c.Call(cctx, group, "echo", payload)
				ccancel()
				if err == nil && !bytes.Equal(reply, payload) {
					err = errors.New("wrong reply")
				}
				figs.add(time.Since(start), err)
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	return func() *callerFigures {
		cancel()
		wg.Wait()
		return figs
	}
}

// metricValue returns the value of the first /metrics line that starts
// with name (labels included), or -1.
func metricValue(metrics, name string) float64 {
	for _, line := range strings.Split(metrics, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err == nil {
				return v
			}
		}
	}
	return -1
}

func countFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	must(t, err)
	return len(ents)
}

// rawCall writes one call frame on c and reads one answer frame.
func rawCall(c net.Conn, r *bufio.Reader, id uint64, group string, payload []byte) (netio.Frame, error) {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(netio.AppendFrame(nil, netio.Header{Kind: netio.KindCall, ID: id}, group, "echo", payload)); err != nil {
		return netio.Frame{}, err
	}
	return readAnswer(r)
}

func readAnswer(r *bufio.Reader) (netio.Frame, error) {
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

// TestChaosFDExhaustion fills scdd's fd table with connections (a low
// RLIMIT_NOFILE set with prlimit(2)): accept fails with EMFILE. The RPC port
// must keep listening, a caller connected before must keep being answered,
// and once the flood ends new callers must be served.
func TestChaosFDExhaustion(t *testing.T) {
	skipShort(t)
	dir := defDir(t, "", map[string]string{"echo": echoDef("echo", 1, 256, 1<<20)})
	n := startNode(t, "-c", dir)
	pid := n.cmd.Process.Pid
	before := n.client()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := before.Call(ctx, "echo", "echo", []byte("before")); err != nil {
		t.Fatal(err)
	}
	open := countFDs(t, pid)
	limit := uint64(open + 64)
	must(t, unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: limit}, nil))
	flood := int(limit) + 200
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range flood {
		c, err := net.DialTimeout("tcp", n.rpc, 2*time.Second)
		if err != nil {
			break // the backlog is full: the kernel stops completing handshakes
		}
		conns = append(conns, c)
	}
	time.Sleep(chaosDuration(500*time.Millisecond, 10*time.Second))
	select {
	case <-n.done:
		t.Fatalf("scdd exited during the flood: %v", n.err)
	default:
	}
	var beforeErr error
	if _, beforeErr = before.Call(ctx, "echo", "echo", []byte("during")); beforeErr != nil {
		t.Errorf("caller connected before the flood: %v", beforeErr)
	}
	for _, c := range conns {
		c.Close()
	}
	start := time.Now()
	var recovered time.Duration
	for recovered == 0 && time.Since(start) < 10*time.Second {
		c, err := net.DialTimeout("tcp", n.rpc, time.Second)
		if err == nil {
			f, err := rawCall(c, bufio.NewReader(c), 1, "echo", []byte("after"))
			c.Close()
			if err == nil && f.Kind == netio.KindReply && string(f.Payload) == "after" {
				recovered = time.Since(start)
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if recovered == 0 {
		t.Fatalf("the RPC port did not answer a new caller within 10 s of the flood's end\n%s", n.stderr.String())
	}
	st, err := n.status()
	if err != nil {
		t.Fatalf("status after the flood: %v", err)
	}
	m := n.metrics()
	chaosFigures(t, "fd limit %d (scdd had %d open), %d connections opened, caller from before answered: %v, "+
		"new caller served %v after the flood; accept errors %v, draining %v",
		limit, open, len(conns), beforeErr == nil, recovered.Round(time.Millisecond),
		metricValue(m, "tpsched_accept_errors_total"), st.Draining)
	if v := metricValue(m, "tpsched_accept_errors_total"); v < 1 {
		t.Errorf("tpsched_accept_errors_total = %v, want > 0: the flood did not reach EMFILE", v)
	}
}

// TestChaosFDExhaustionCallsWait: 300 callers at once against a scdd
// whose RLIMIT_NOFILE leaves room for about 40 connections; each calls once
// and closes. A caller the node cannot take now must wait in the backlog
// until a descriptor frees, as README says, not be reset: every one of the
// 300 is answered. (Before the descriptor reserve, an accept that took the
// last free descriptor left none for enrolling the connection, which was
// then closed: 62 answered, 238 reset.)
func TestChaosFDExhaustionCallsWait(t *testing.T) {
	skipShort(t)
	dir := defDir(t, "", map[string]string{"echo": echoDef("echo", 2, 256, 1<<20)})
	n := startNode(t, "-c", dir)
	pid := n.cmd.Process.Pid
	open := countFDs(t, pid)
	limit := uint64(open + 40)
	must(t, unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: limit}, nil))
	callers := chaosCount(300, 1000)
	var answered, reset, other atomic.Int64
	var mu sync.Mutex
	var errs []string
	start := time.Now()
	// Every caller is connected (accepted or in the listen queue) before
	// any sends its call, so that more connections wait than scdd has
	// descriptors for: without it a quick node could accept, answer and
	// see each closed before the next came, and never meet the limit.
	var dialed sync.WaitGroup
	dialed.Add(callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			c, err := net.DialTimeout("tcp", n.rpc, 30*time.Second)
			dialed.Done()
			dialed.Wait()
			if err == nil {
				var f netio.Frame
				payload := []byte(fmt.Sprintf("caller %d", i))
				_ = c.SetDeadline(time.Now().Add(60 * time.Second))
				if _, err = c.Write(netio.AppendFrame(nil, netio.Header{Kind: netio.KindCall, ID: uint64(i)}, "echo", "echo", payload)); err == nil {
					f, err = readAnswer(bufio.NewReader(c))
				}
				// Held a moment after the answer: a node that answers
				// and sees each connection closed faster than it can
				// enrol the next never has 40 open at once (it passed
				// 300 callers in 72 ms without meeting the limit).
				time.Sleep(50 * time.Millisecond)
				c.Close()
				if err == nil && (f.Kind != netio.KindReply || f.ID != uint64(i) || !bytes.Equal(f.Payload, payload)) {
					err = fmt.Errorf("answer %+v %q", f.Header, f.Payload)
				}
			}
			switch {
			case err == nil:
				answered.Add(1)
				return
			case errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, syscall.EPIPE):
				reset.Add(1)
			default:
				other.Add(1)
			}
			mu.Lock()
			if len(errs) < 5 {
				errs = append(errs, err.Error())
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	took := time.Since(start)
	m := n.metrics()
	chaosFigures(t, "fd limit %d (scdd had %d open), %d callers at once: %d answered, %d reset or closed unanswered, %d other errors in %v; accept pauses %v",
		limit, open, callers, answered.Load(), reset.Load(), other.Load(), took.Round(time.Millisecond),
		metricValue(m, "tpsched_accept_errors_total"))
	if answered.Load() != int64(callers) {
		t.Errorf("%d of %d callers answered; first errors: %s", answered.Load(), callers, strings.Join(errs, "; "))
	}
	if v := metricValue(m, "tpsched_accept_errors_total"); v < 1 {
		t.Errorf("tpsched_accept_errors_total = %v, want > 0: the callers did not reach the fd limit", v)
	}
}

// chaosCount is quick under make test, full under make chaos.
func chaosCount(quick, full int) int {
	if os.Getenv("TPSCHED_CHAOS_FULL") == "1" {
		return full
	}
	return quick
}

// TestChaosMaxConnections: connections beyond max_connections are closed
// at once, counted and logged; the ones within are served, and a slot
// freed is taken by the next caller.
func TestChaosMaxConnections(t *testing.T) {
	skipShort(t)
	const max, extra = 20, 10
	dir := defDir(t, fmt.Sprintf("set max_connections = %d\n", max),
		map[string]string{"echo": echoDef("echo", 1, 256, 1<<20)})
	n := startNode(t, "-c", dir)
	type rc struct {
		c net.Conn
		r *bufio.Reader
	}
	var served []rc
	refused := 0
	for i := range max + extra {
		c, err := net.DialTimeout("tcp", n.rpc, 2*time.Second)
		must(t, err)
		defer c.Close()
		r := bufio.NewReader(c)
		f, err := rawCall(c, r, uint64(i), "echo", []byte("x"))
		switch {
		case err == nil && f.Kind == netio.KindReply:
			served = append(served, rc{c, r})
		case errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE):
			refused++
		default:
			t.Fatalf("connection %d: %+v, %v", i, f.Header, err)
		}
	}
	if len(served) != max || refused != extra {
		t.Fatalf("%d served, %d refused; want %d and %d", len(served), refused, max, extra)
	}
	waitFor(t, 5*time.Second, "the refusal metric", func() bool {
		return metricValue(n.metrics(), `tpsched_connections_refused_total{reason="max_connections"}`) == extra
	})
	if !strings.Contains(n.stderr.String(), "max_connections") {
		t.Errorf("no log line names max_connections:\n%s", n.stderr.String())
	}
	// Free five slots: five new callers are served.
	for _, s := range served[:5] {
		s.c.Close()
	}
	waitFor(t, 5*time.Second, "connections to close", func() bool {
		return metricValue(n.metrics(), "tpsched_connections") == max-5
	})
	for i := range 5 {
		c, err := net.DialTimeout("tcp", n.rpc, 2*time.Second)
		must(t, err)
		defer c.Close()
		if f, err := rawCall(c, bufio.NewReader(c), uint64(100+i), "echo", []byte("y")); err != nil || f.Kind != netio.KindReply {
			t.Fatalf("caller %d after slots were freed: %+v, %v", i, f.Header, err)
		}
	}
	for _, s := range served[5:] {
		if f, err := rawCall(s.c, s.r, 999, "echo", []byte("z")); err != nil || f.Kind != netio.KindReply {
			t.Fatalf("a connection within the limit: %+v, %v", f.Header, err)
		}
	}
	chaosFigures(t, "max_connections %d: %d served, %d refused at once and counted", max, len(served), refused)
}

// listenerFD finds the descriptor number, in process pid, of a socket
// listening on port.
func listenerFD(t *testing.T, pid, port int) int {
	t.Helper()
	inodes := map[string]bool{}
	for _, file := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, file))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" {
				continue
			}
			p, _ := strconv.ParseUint(f[1][strings.LastIndexByte(f[1], ':')+1:], 16, 16)
			if int(p) == port {
				inodes["socket:["+f[9]+"]"] = true
			}
		}
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	must(t, err)
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), e.Name()))
		if err == nil && inodes[target] {
			fd, _ := strconv.Atoi(e.Name())
			return fd
		}
	}
	t.Fatalf("no listening socket on port %d in process %d", port, pid)
	return -1
}

// TestChaosRPCPortDies shuts down scdd's listening socket from outside
// (pidfd_getfd, then shutdown(2), which acts on the socket, not only on
// the copy): the RPC port can no longer accept, so scdd must exit non-zero
// with a message saying why, for its supervisor to restart it.
func TestChaosRPCPortDies(t *testing.T) {
	skipShort(t)
	dir := defDir(t, "", map[string]string{"echo": echoDef("echo", 1, 256, 1<<20)})
	n := startNode(t, "-c", dir)
	pid := n.cmd.Process.Pid
	_, ps, _ := net.SplitHostPort(n.rpc)
	port, _ := strconv.Atoi(ps)
	target := listenerFD(t, pid, port)
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Skipf("pidfd_open: %v (needs Linux 5.3)", err)
	}
	defer unix.Close(pidfd)
	fd, err := unix.PidfdGetfd(pidfd, target, 0)
	if err != nil {
		t.Skipf("pidfd_getfd: %v (needs Linux 5.6 and ptrace rights over scdd)", err)
	}
	defer unix.Close(fd)
	start := time.Now()
	must(t, unix.Shutdown(fd, unix.SHUT_RDWR))
	select {
	case <-n.done:
	case <-time.After(15 * time.Second):
		st, serr := n.status()
		t.Fatalf("scdd still running 15 s after its RPC listener died (status: draining=%v err=%v)\n%s",
			st.Draining, serr, n.stderr.String())
	}
	var ee *exec.ExitError
	if !errors.As(n.err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("scdd exit: %v, want exit status 1\n%s", n.err, n.stderr.String())
	}
	if !regexp.MustCompile(`rpc port .*ended`).MatchString(n.stderr.String()) {
		t.Errorf("no log line says the rpc port ended:\n%s", n.stderr.String())
	}
	chaosFigures(t, "scdd exited with status 1 %v after its listener was shut down", time.Since(start).Round(time.Millisecond))
}

// TestChaosPartialFrames: 32 connections each hold an almost whole 8 MiB
// frame (and come back when closed) while other callers go on calling.
// scdd's RSS must stay under 256 MiB and the other callers be answered.
func TestChaosPartialFrames(t *testing.T) {
	testenv.Slow(t, "a fault experiment; 6 s without -race on a busy 2-core machine")
	skipShort(t)
	dir := defDir(t, "", map[string]string{
		"big":   echoDef("big", 1, 256, 8<<20),
		"legit": echoDef("legit", 1, 256, 1<<20),
	})
	n := startNode(t, "-c", dir)
	pid := n.cmd.Process.Pid
	base := float64(procStatusKB(t, pid, "VmRSS")) / 1024
	b50, b99 := baseline(t, n, "legit")
	stopRSS := rssPeak(t, pid)
	stopCallers := runCallers(t, n, "legit", 2)
	const attackers, size = 32, 8 << 20
	hdr := netio.AppendFrame(nil, netio.Header{Kind: netio.KindCall, ID: 1}, "big", "echo", nil)
	binary.BigEndian.PutUint32(hdr[20:], size)
	frame := append(hdr, make([]byte, size-4096)...) // almost all of the payload
	ctx, cancel := context.WithTimeout(context.Background(), chaosDuration(4*time.Second, 30*time.Second))
	defer cancel()
	var closes, held atomic.Int64
	var wg sync.WaitGroup
	for range attackers {
		wg.Go(func() {
			for ctx.Err() == nil {
				c, err := net.DialTimeout("tcp", n.rpc, 2*time.Second)
				if err != nil {
					time.Sleep(100 * time.Millisecond)
					continue
				}
				go func() { <-ctx.Done(); c.Close() }()
				_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
				if _, err := c.Write(frame); err == nil {
					held.Add(1)
					_, _ = io.Copy(io.Discard, c) // until scdd closes it, or the attack ends
				}
				c.Close()
				if ctx.Err() == nil {
					closes.Add(1)
					time.Sleep(250 * time.Millisecond) // and back: the attack goes on
				}
			}
		})
	}
	<-ctx.Done()
	wg.Wait()
	peak, anon := stopRSS()
	figs := stopCallers()
	ok, failed, p50, p99 := figs.summary()
	m := n.metrics()
	chaosFigures(t, "partial frames: %d attackers x %d MiB; RSS %.0f MiB before, peak %.0f MiB (+%.0f; anon peak %.0f MiB); "+
		"%d partial frames sent whole, %d attacker connections closed by scdd; other callers: %d answered, %d failed, "+
		"p50 %v p99 %v (alone: p50 %v p99 %v); budget closes %v, frame timeouts %v",
		attackers, size>>20, base, peak, peak-base, anon, held.Load(), closes.Load(), ok, failed,
		p50.Round(time.Microsecond), p99.Round(time.Microsecond), b50.Round(time.Microsecond), b99.Round(time.Microsecond),
		metricValue(m, "tpsched_buffer_budget_closes_total"), metricValue(m, "tpsched_frame_timeouts_total"))
	if limit := rssLimit(256); peak >= limit {
		t.Errorf("scdd RSS peaked at %.0f MiB, want under %.0f MiB", peak, limit)
	}
	if failed > 0 || ok == 0 {
		t.Errorf("other callers: %d answered, failures %v", ok, figs.failed)
	}
}

// TestChaosNonReaders: 8 clients pipeline calls whose replies (64 KiB each)
// they never read, and come back when closed (many calls are refused
// 'server busy': the attack is on memory, not on the queue). scdd's RSS must stay under
// 256 MiB and the other callers be answered.
func TestChaosNonReaders(t *testing.T) {
	testenv.Slow(t, "a fault experiment; 6 s without -race on a busy 2-core machine")
	skipShort(t)
	dir := defDir(t, "", map[string]string{
		"big":   echoDef("big", 2, 256, 1<<20),
		"legit": echoDef("legit", 1, 256, 1<<20),
	})
	n := startNode(t, "-c", dir)
	pid := n.cmd.Process.Pid
	base := float64(procStatusKB(t, pid, "VmRSS")) / 1024
	b50, b99 := baseline(t, n, "legit")
	stopRSS := rssPeak(t, pid)
	stopCallers := runCallers(t, n, "legit", 2)
	const attackers, size = 8, 64 << 10
	ctx, cancel := context.WithTimeout(context.Background(), chaosDuration(4*time.Second, 30*time.Second))
	defer cancel()
	var closes, sent atomic.Int64
	var wg sync.WaitGroup
	for range attackers {
		wg.Go(func() {
			payload := make([]byte, size)
			var batch []byte
			for i := range 16 {
				batch = netio.AppendFrame(batch, netio.Header{Kind: netio.KindCall, ID: uint64(i)}, "big", "echo", payload)
			}
			for ctx.Err() == nil {
				c, err := net.DialTimeout("tcp", n.rpc, 2*time.Second)
				if err != nil {
					time.Sleep(100 * time.Millisecond)
					continue
				}
				go func() { <-ctx.Done(); c.Close() }()
				for ctx.Err() == nil {
					_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
					if _, err := c.Write(batch); err != nil {
						break
					}
					sent.Add(16)
					time.Sleep(time.Millisecond)
				}
				c.Close()
				if ctx.Err() == nil {
					closes.Add(1)
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
	}
	<-ctx.Done()
	wg.Wait()
	peak, anon := stopRSS()
	figs := stopCallers()
	ok, failed, p50, p99 := figs.summary()
	m := n.metrics()
	chaosFigures(t, "non-readers: %d clients, %d KiB replies; RSS %.0f MiB before, peak %.0f MiB (+%.0f; anon peak %.0f MiB); "+
		"%d calls sent unread, %d attacker connections closed by scdd; other callers: %d answered, %d failed, "+
		"p50 %v p99 %v (alone: p50 %v p99 %v); budget closes %v, slow reader closes %v",
		attackers, size>>10, base, peak, peak-base, anon, sent.Load(), closes.Load(), ok, failed,
		p50.Round(time.Microsecond), p99.Round(time.Microsecond), b50.Round(time.Microsecond), b99.Round(time.Microsecond),
		metricValue(m, "tpsched_buffer_budget_closes_total"), metricValue(m, "tpsched_slow_reader_closes_total"))
	if limit := rssLimit(256); peak >= limit {
		t.Errorf("scdd RSS peaked at %.0f MiB, want under %.0f MiB", peak, limit)
	}
	if failed > 0 || ok == 0 {
		t.Errorf("other callers: %d answered, failures %v", ok, figs.failed)
	}
}

// TestOversizeFrameAnsweredAndSkipped: a call whose header announces more
// than any group's max_message_size is answered 'message too big' for its
// request id, its bytes are skipped without being kept, and the connection
// goes on serving.
func TestOversizeFrameAnsweredAndSkipped(t *testing.T) {
	skipShort(t)
	dir := defDir(t, "", map[string]string{"echo": echoDef("echo", 1, 256, 1<<20)})
	n := startNode(t, "-c", dir)
	pid := n.cmd.Process.Pid
	c, err := net.DialTimeout("tcp", n.rpc, 2*time.Second)
	must(t, err)
	defer c.Close()
	r := bufio.NewReader(c)
	base := procStatusKB(t, pid, "VmRSS")
	const size = 64 << 20
	hdr := netio.AppendFrame(nil, netio.Header{Kind: netio.KindCall, ID: 42}, "echo", "echo", nil)
	binary.BigEndian.PutUint32(hdr[20:], size)
	stopRSS := rssPeak(t, pid)
	werr := make(chan error, 1)
	go func() {
		_ = c.SetWriteDeadline(time.Now().Add(20 * time.Second))
		if _, err := c.Write(hdr); err != nil {
			werr <- err
			return
		}
		chunk := make([]byte, 1<<20)
		for range size / len(chunk) {
			if _, err := c.Write(chunk); err != nil {
				werr <- err
				return
			}
		}
		werr <- nil
	}()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	f, err := readAnswer(r)
	if err != nil || f.Kind != netio.KindError || f.Code != netio.CodeMessageTooBig || f.ID != 42 {
		t.Fatalf("answer to a %d MiB call: %+v %q, %v", size>>20, f.Header, f.Payload, err)
	}
	if err := <-werr; err != nil {
		t.Fatalf("writing the oversize payload: %v", err)
	}
	peak, _ := stopRSS()
	tooBig := f.Code
	f, err = rawCall(c, r, 43, "echo", []byte("next"))
	if err != nil || f.Kind != netio.KindReply || f.ID != 43 || string(f.Payload) != "next" {
		t.Fatalf("the call after the oversize one: %+v %q, %v", f.Header, f.Payload, err)
	}
	chaosFigures(t, "%d MiB call answered %q; RSS %.0f MiB before, peak %.0f MiB while its bytes were skipped",
		size>>20, tooBig, float64(base)/1024, peak)
	if grow := peak - float64(base)/1024; grow > 32 {
		t.Errorf("RSS grew by %.0f MiB while skipping a %d MiB payload", grow, size>>20)
	}
}

// TestChaosHalfClosedCaller: a caller that writes its calls and then
// shuts its write side (shutdown(SHUT_WR), as a batch job piping a file of
// calls would) gets an answer for every one, then a clean close. (The
// node took the caller's FIN for the end of the connection: 4 calls got
// no answer, and of 50 sleep calls 18 admitted ones were never answered.)
func TestChaosHalfClosedCaller(t *testing.T) {
	skipShort(t)
	dir := defDir(t, "", map[string]string{"g": "set service_group = \"g\"\nset service = \"echo\", \"sleep\"\n" +
		"set module = MODULE\nset parallel_count = 2\nset queue_size = 64\n"})
	n := startNode(t, "-c", dir)
	for _, tc := range []struct {
		name    string
		calls   int
		service string
		arg     string
	}{
		{"4 echo", 4, "echo", "x"},
		{"50 sleep", 50, "sleep", "20"},
	} {
		c, err := net.DialTimeout("tcp", n.rpc, 2*time.Second)
		must(t, err)
		var batch []byte
		for i := range tc.calls {
			batch = netio.AppendFrame(batch, netio.Header{Kind: netio.KindCall, ID: uint64(i + 1), TimeoutMs: 20_000}, "g", tc.service,
				[]byte(fmt.Sprintf("%s %d", tc.arg, i+1)))
		}
		_, err = c.Write(batch)
		must(t, err)
		must(t, c.(*net.TCPConn).CloseWrite())
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		got := map[uint64]netio.Frame{}
		r := bufio.NewReader(c)
		var end error
		for {
			f, err := readAnswer(r)
			if err != nil {
				end = err
				break
			}
			if _, dup := got[f.ID]; dup {
				t.Fatalf("%s: two answers for call %d", tc.name, f.ID)
			}
			got[f.ID] = f
		}
		c.Close()
		ok := 0
		for id := uint64(1); id <= uint64(tc.calls); id++ {
			f, answered := got[id]
			switch {
			case !answered:
				t.Errorf("%s: call %d got no answer", tc.name, id)
			case f.Kind == netio.KindReply && string(f.Payload) == fmt.Sprintf("%s %d", tc.arg, id):
				ok++
			default:
				t.Errorf("%s: call %d: %+v %q", tc.name, id, f.Header, f.Payload)
			}
		}
		if !errors.Is(end, io.EOF) {
			t.Errorf("%s: the connection ended with %v, not a clean close", tc.name, end)
		}
		chaosFigures(t, "%s: %d calls, then the write side shut: %d answered, then a clean close: %v", tc.name, tc.calls, ok, errors.Is(end, io.EOF))
	}
}
