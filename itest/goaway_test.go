package itest

import (
	"bytes"
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

	"tpsched/internal/testenv"
	"tpsched/netio"
)

// TestChaosRestartIgnoringGoAway restarts a node by hand-off under raw
// callers that ignore the go-away frame and write calls without pause (as
// a bare socket or another client library would). The old process serves
// them until -drain-timeout, drains, and closes their connections itself.
// Every call it read must be answered before that close (a FIN after the
// answers, never a reset); a call with no answer at the FIN was never read
// and is sent again on a new connection, which the new process takes. In
// the end every call has exactly one answer: its echo, or 'node shutting
// down' (which the caller does not send again). (The old process used to
// close such connections with answers still queued or unread calls in the
// socket, a reset: 4 calls of 532,922 lost with -drain-timeout 5s.)
func TestChaosRestartIgnoringGoAway(t *testing.T) {
	testenv.Slow(t, "a fault experiment; 5 s without -race on a busy 2-core machine")
	skipShort(t)
	dir := defDir(t, "", map[string]string{"g": echoDef("g", 2, 256, 1<<20)})
	n := startRestartingNode(t, dir, "-drain-timeout", "1s")
	first := n.cmd.Process.Pid

	const callers = 4
	acct := &idAccount{answers: map[string]int{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() { ignoringCaller(t, n.rpc, i, acct, stop) })
	}
	time.Sleep(500 * time.Millisecond)
	out, err := n.scdctl("restart")
	if err != nil || !restartedLine.MatchString(out) {
		close(stop)
		wg.Wait()
		t.Fatalf("scdctl restart: %v\n%s", err, out)
	}
	n.waitExit(t, "the old scdd to exit")
	time.Sleep(chaosDuration(500*time.Millisecond, 3*time.Second))
	close(stop)
	wg.Wait()

	acct.mu.Lock()
	defer acct.mu.Unlock()
	lost := 0
	for id, k := range acct.answers {
		if k == 0 {
			lost++
			if lost <= 5 {
				t.Errorf("call %s got no answer", id)
			}
		}
	}
	oldLog := "no 'rpc port closed' line"
	for _, line := range strings.Split(n.logText(), "\n") {
		if i := strings.Index(line, `msg="rpc port closed"`); i >= 0 {
			oldLog = line[i:]
			break
		}
	}
	chaosFigures(t, "hand-off restart under %d raw callers that ignore go-away (%d go-away frames ignored), -drain-timeout 1s: "+
		"%d calls, %d answered ok, %d 'node shutting down', %d resent after a clean close (never read), %d lost, %d duplicated, %d wrong; "+
		"connections closed by the old process: %d with a FIN, %d with a reset; old process: %s",
		callers, acct.goAways, len(acct.answers), acct.ok, acct.shutting, acct.resent, lost, acct.dup, acct.wrong,
		acct.fins, acct.resets, oldLog)
	if lost+acct.dup+acct.wrong > 0 {
		t.Errorf("%d lost, %d duplicated, %d wrong", lost, acct.dup, acct.wrong)
	}
	if acct.resets > 0 {
		t.Errorf("%d connections ended with a reset: answers may have been dropped", acct.resets)
	}
	if acct.goAways == 0 || acct.fins == 0 {
		t.Errorf("the test did not test: %d go-away frames ignored, %d connections closed by the old process", acct.goAways, acct.fins)
	}
	if m := regexp.MustCompile(`answers_undelivered=(\d+)`).FindStringSubmatch(oldLog); m == nil || m[1] != "0" {
		t.Errorf("the old process (pid %d) says of its answers: %q, want answers_undelivered=0", first, oldLog)
	}
}

// idAccount is what the callers of TestChaosRestartIgnoringGoAway saw,
// call by call ("caller/id").
type idAccount struct {
	mu                                                      sync.Mutex
	answers                                                 map[string]int
	ok, shutting, resent, dup, wrong, goAways, fins, resets int
}

// ignoringCaller writes calls (up to 32 outstanding) on one connection
// after another until stop, never heeding a go-away. When a connection
// ends with a clean close, the calls it did not answer were never read:
// they go again on the next connection.
func ignoringCaller(t *testing.T, addr string, caller int, acct *idAccount, stop <-chan struct{}) {
	next := uint64(1)
	var mu sync.Mutex    // guards pending and open
	var pending []uint64 // to send again
	// 16 KiB calls and answers: answers are still on their way (in the
	// node's queue, in the socket) when the old process closes.
	pad := bytes.Repeat([]byte("p"), 16<<10)
	payload := func(id uint64) []byte { return fmt.Appendf(nil, "caller %d call %d %s", caller, id, pad) }
	key := func(id uint64) string { return strconv.Itoa(caller) + "/" + strconv.FormatUint(id, 10) }
	for {
		select {
		case <-stop:
			mu.Lock()
			left := len(pending)
			mu.Unlock()
			if left == 0 {
				return
			}
		default:
		}
		nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		// A small receive buffer and a reader that takes its time: the
		// answers wait in the node's socket, as they do for a caller across
		// a network, when the old process closes.
		_ = nc.(*net.TCPConn).SetReadBuffer(32 << 10)
		var open map[uint64]bool
		mu.Lock()
		open = map[uint64]bool{} // written on this connection, not yet answered
		mu.Unlock()
		slots := make(chan struct{}, 32)
		done := make(chan struct{})
		writerDone := make(chan struct{})
		stopping := atomic.Bool{}
		go func() {
			defer close(writerDone)
			for {
				select {
				case slots <- struct{}{}:
				case <-done:
					return
				}
				// The call is taken (from pending, or made) and put in
				// open in one step under mu, where the reader decides it
				// is done (idle): a call made, or taken from pending,
				// between the reader's look and open was counted by
				// neither, its connection closed as idle, and the test
				// reported it lost.
				var id uint64
				mu.Lock()
				switch {
				case len(pending) > 0:
					id, pending = pending[0], pending[1:]
				case stopping.Load():
					mu.Unlock()
					<-slots
					return
				default:
					id = next
					next++
					acct.mu.Lock()
					acct.answers[key(id)] = 0
					acct.mu.Unlock()
				}
				open[id] = true
				mu.Unlock()
				if _, err := nc.Write(netio.AppendFrame(nil, netio.Header{Kind: netio.KindCall, ID: id, TimeoutMs: 10_000}, "g", "echo", payload(id))); err != nil {
					return // the reader sees the end and sends what is open again
				}
			}
		}()
		go func() { <-stop; stopping.Store(true) }()
		fr := netio.NewFrameReader(nc, 1<<20)
		var buf []byte
		var end error
		for {
			_ = nc.SetReadDeadline(time.Now().Add(20 * time.Second))
			var f netio.Frame
			f, buf, end = fr.Read(buf)
			if end != nil {
				break
			}
			if f.Kind == netio.KindGoAway {
				acct.mu.Lock()
				acct.goAways++
				acct.mu.Unlock()
				continue // ignored: this caller goes on writing here
			}
			mu.Lock()
			wasOpen := open[f.ID]
			delete(open, f.ID)
			idle := stopping.Load() && len(open) == 0 && len(pending) == 0
			mu.Unlock()
			acct.mu.Lock()
			k := key(f.ID)
			switch {
			case !wasOpen || acct.answers[k] > 0:
				acct.dup++
			case f.Kind == netio.KindReply && bytes.Equal(f.Payload, payload(f.ID)):
				acct.ok++
			case f.Kind == netio.KindError && f.Code == netio.CodeShuttingDown:
				acct.shutting++
			default:
				acct.wrong++
				t.Errorf("call %s: %+v %q", k, f.Header, f.Payload)
			}
			acct.answers[k]++
			acct.mu.Unlock()
			<-slots
			if idle {
				break
			}
			if f.ID%8 == 0 {
				time.Sleep(200 * time.Microsecond)
			}
		}
		close(done)
		nc.Close()
		<-writerDone
		mu.Lock()
		var unanswered []uint64
		for id := range open {
			unanswered = append(unanswered, id)
		}
		mu.Unlock()
		clean := errors.Is(end, io.EOF)
		acct.mu.Lock()
		switch {
		case end == nil:
		case clean:
			acct.fins++
			acct.resent += len(unanswered)
		case errors.Is(end, syscall.ECONNRESET):
			acct.resets++
		}
		acct.mu.Unlock()
		if end == nil {
			return // stopped with every call answered
		}
		if !clean {
			t.Errorf("caller %d: connection ended with %v, %d calls unanswered", caller, end, len(unanswered))
			return
		}
		// Never read by the node: send them again.
		mu.Lock()
		pending = append(unanswered, pending...)
		mu.Unlock()
	}
}
