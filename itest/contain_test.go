package itest

// Issue 19's experiments on the node's side of the UAP boundary: an honest
// UAP that calls another group as it starts, a hostile one that rewrites
// the calls it never took, and one that banks credit for its doorbell
// rings.

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tpsched/internal/testenv"
	"tpsched/netio"
)

// hostileDef is a server of uap-hostile: slot 0 runs the attack of mode
// (UAP_HOSTILE), the others serve echo honestly.
func hostileDef(group, mode string, processes int) string {
	return fmt.Sprintf(`set service_group = %q
set service = "echo"
set module = %q
set parallel_count = %d
set queue_size = 64
putenv UAP_HOSTILE %q
`, group, bin("uap-hostile"), processes, mode)
}

// TestLocalCallAtStart: an honest UAP that calls another group between
// its attach and its Serve, while the node starts; the callee's name
// sorts later, so its processes start after the caller's (issue 19 item
// 1: scdd died of a nil pointer in group.submit, 5 runs of 5). Every
// caller process gets its answer, and both groups serve.
// (scd's TestLocalCallAtStart holds the callee's start until the call
// waits for it; this one has the timing of real processes.)
func TestLocalCallAtStart(t *testing.T) {
	skipShort(t)
	// Groups start in name order: the callee z after a and six others,
	// each with processes to start.
	servers := map[string]string{
		"a": hostileDef("a", "startcall=z/echo", 2),
		"z": echoDef("z", 2, 64, 1<<20),
	}
	for _, g := range []string{"b", "c", "d", "e", "f", "g"} {
		servers[g] = echoDef(g, 4, 64, 1<<20)
	}
	dir := defDir(t, "", servers)
	n := startNode(t, "-c", dir)
	// The UAPs' lines, from the "uap output" records of scdd's log.
	startcall := regexp.MustCompile(`STARTCALL: reply "([^"]*)", error (.*)`)
	uapOutput := func() string { return strings.Join(uapLines(n.stderr.String()), "\n") }
	waitFor(t, 20*time.Second, "both processes of a to get their answer", func() bool {
		return len(startcall.FindAllString(uapOutput(), -1)) >= 2
	})
	for _, m := range startcall.FindAllStringSubmatch(uapOutput(), -1) {
		if m[1] != "called at start" || m[2] != "<nil>" {
			t.Errorf("a UAP's call at start: %s", m[0])
		}
	}
	c := n.client()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, g := range []string{"a", "z"} {
		if out, err := c.Call(ctx, g, "echo", []byte(g)); err != nil || string(out) != g {
			t.Errorf("%s/echo: %q, %v", g, out, err)
		}
	}
}

// TestChaosHostileRewrite: a hostile process takes none of the calls
// handed to it, writes its own request over each one's buffer and length,
// and exits; the node hands the calls to its honest sibling with the
// requests their callers sent (issue 19 item 9: it copied them back out
// of the dead process's area, and the sibling served the forgeries).
func TestChaosHostileRewrite(t *testing.T) {
	skipShort(t)
	dir := defDir(t, "", map[string]string{"a": hostileDef("a", "rewrite", 2)})
	n := startNode(t, "-c", dir)
	ctx, cancel := context.WithTimeout(context.Background(), chaosDuration(3*time.Second, 15*time.Second))
	defer cancel()
	var out atomic.Int64
	ta := rawCallers(ctx, t, n.rpc, 8, "a", "echo", "", 5_000, &out)
	<-ctx.Done()
	time.Sleep(300 * time.Millisecond)

	rewrote := regexp.MustCompile(`HOSTILE: rewrote (\d+) requests`)
	exits, forged := 0, 0
	for _, m := range rewrote.FindAllStringSubmatch(n.stderr.String(), -1) {
		k, _ := strconv.Atoi(m[1])
		exits, forged = exits+1, forged+k
	}
	chaosFigures(t, "hostile process rewrote %d requests it never took, over %d lives; its callers: %s", forged, exits, ta)
	if forged == 0 {
		t.Fatalf("the hostile process rewrote no request: the experiment did not happen")
	}
	ta.mu.Lock()
	defer ta.mu.Unlock()
	if ta.spoiled > 0 {
		t.Errorf("%d callers got a reply to a request the hostile process wrote", ta.spoiled)
	}
	if ta.lost+ta.dup+ta.wrong+ta.stray > 0 || len(ta.byCode) > 0 || ta.ok < 100 {
		t.Errorf("callers: %s", ta)
	}
}

// TestChaosRingBank: a hostile process banks credit for doorbell rings
// while its group is busy (it serves its calls and makes local calls, all
// found by the node's reader awake, no ring needed); once the load stops
// it rings without cause as often as it served and called, never more. It
// is killed for its rings (issue 19 item 8: it never was), and another
// group is served all along.
func TestChaosRingBank(t *testing.T) {
	testenv.Slow(t, "a fault experiment; 9 s without -race on a busy 2-core machine")
	skipShort(t)
	dir := defDir(t, "", map[string]string{
		"a": hostileDef("a", "ringbank", 2),
		"b": echoDef("b", 2, 64, 1<<20),
	})
	n := startNode(t, "-c", dir)
	started := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var outA, outB atomic.Int64
	tb := rawCallers(ctx, t, n.rpc, 4, "b", "echo", "", 2_000, &outB)
	// The load that lets it bank.
	bank, stopBank := context.WithTimeout(ctx, chaosDuration(3*time.Second, 10*time.Second))
	defer stopBank()
	ta := rawCallers(bank, t, n.rpc, 8, "a", "echo", "", 2_000, &outA)
	<-bank.Done()
	killed := "rings the scheduler without cause; killing it"
	waitFor(t, 30*time.Second, "the hostile process to be killed for its rings",
		func() bool { return strings.Contains(n.stderr.String(), killed) },
		func() string { return grepLines(n.stderr.String(), "HOSTILE") })
	took := time.Since(started)
	time.Sleep(500 * time.Millisecond)
	cancel()
	time.Sleep(300 * time.Millisecond)

	log := n.stderr.String()
	line := grepLines(log, killed)
	line = strings.TrimSpace(line[strings.Index(line, "rings="):])
	line, _, _ = strings.Cut(line, "\n")
	reports := regexp.MustCompile(`HOSTILE: (\d+) calls served and (\d+) made without a ring`).FindAllStringSubmatch(log, -1)
	banked := "none reported"
	if len(reports) > 0 {
		r := reports[len(reports)-1]
		banked = r[1] + " calls served and " + r[2] + " local calls made without a ring"
	}
	chaosFigures(t, "hostile process killed for its rings %v after the node started (%s; it had banked %s by its last report); its group: %s; the other group: %s",
		took.Round(time.Millisecond), line, banked, ta, tb)
	for name, tl := range map[string]*tally{"its group": ta, "the other group": tb} {
		tl.mu.Lock()
		if tl.lost+tl.dup+tl.wrong+tl.stray+tl.spoiled > 0 || tl.ok < 100 {
			t.Errorf("%s: %s", name, tl)
		}
		tl.mu.Unlock()
	}
	if len(tb.byCode) > 0 {
		t.Errorf("the other group: %s", tb)
	}
}

// TestChaosQueuedBytes: the processes of a group with max_message_size
// 8 MiB are busy on long calls, and 200 calls of 8 MiB arrive for it
// (queue_size 256; 1 MiB under the race detector): the node admits only what fits rpc_buffer_budget (64
// MiB by default) and answers the rest 'server busy' at once; its memory
// stays bounded, and another group's callers are served all along (issue
// 19 item 18: scdd grew to 1.9 GiB, the other group's callers waited 5 s).
func TestChaosQueuedBytes(t *testing.T) {
	testenv.Slow(t, "a fault experiment; 8 s without -race on a busy 2-core machine")
	skipShort(t)
	const calls, conns = 200, 2
	size := 8<<20 - 64
	if raceBuild {
		// The race detector checks every byte scdd copies: 1.6 GB would
		// outlast the sleep calls. 1 MiB calls still pass the budget.
		size = 1<<20 - 64
	}
	dir := defDir(t, "", map[string]string{
		"big":   echoDef("big", 4, 256, 8<<20),
		"other": echoDef("other", 2, 64, 1<<20),
	})
	n := startNode(t, "-c", dir)
	pid := n.cmd.Process.Pid
	_, alone99 := baseline(t, n, "other")
	before := float64(procStatusKB(t, pid, "VmRSS")) / 1024
	stopRSS := rssPeak(t, pid)
	stopOther := runCallers(t, n, "other", 2)

	c := n.client()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The sleeps hold big's processes while scdd reads the flood: the
	// budget acts only once 64 MiB are read, so they must outlast that.
	// Under the race detector scdd reads several times slower (with 3 s,
	// 184 answered and 16 refused was seen on a quiet machine, none
	// refused on a busy one): 15 s there.
	hold := "3000"
	if raceBuild {
		hold = "15000"
	}
	var sleeps sync.WaitGroup
	for range 4 {
		sleeps.Go(func() {
			if _, err := c.Call(ctx, "big", "sleep", []byte(hold)); err != nil {
				t.Errorf("a sleep call: %v", err)
			}
		})
	}
	waitFor(t, 10*time.Second, "the four sleep calls to occupy big's processes", func() bool {
		return groupStatus(t, n, "big").InFlight >= 4
	})

	var ok, busy atomic.Int64
	var conn sync.WaitGroup
	for k := range conns {
		conn.Go(func() {
			nc, err := net.DialTimeout("tcp", n.rpc, 5*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			defer nc.Close()
			_ = nc.SetDeadline(time.Now().Add(50 * time.Second))
			// The service is pid (its reply is the process id): the
			// answers to the admitted calls are small, so that they do not
			// pile up in the port unread, which the port's own count of
			// rpc_buffer_budget would end by closing the connection.
			go func() {
				payload := bytes.Repeat([]byte{byte('a' + k)}, size)
				var out []byte
				for id := uint64(1); id <= calls/conns; id++ {
					out = netio.AppendFrame(out[:0], netio.Header{Kind: netio.KindCall, ID: id}, "big", "pid", payload)
					if _, err := nc.Write(out); err != nil {
						return
					}
				}
			}()
			fr := netio.NewFrameReader(nc, 9<<20)
			seen := map[uint64]bool{}
			var buf []byte
			for len(seen) < calls/conns {
				var f netio.Frame
				if f, buf, err = fr.Read(buf); err != nil {
					t.Errorf("connection %d: %d of %d calls answered: %v", k, len(seen), calls/conns, err)
					return
				}
				if seen[f.ID] {
					t.Errorf("connection %d: call %d answered twice", k, f.ID)
				}
				seen[f.ID] = true
				switch {
				case f.Kind == netio.KindReply && isPID(f.Payload):
					ok.Add(1)
				case f.Kind == netio.KindError && f.Code == netio.CodeServerBusy:
					busy.Add(1)
				default:
					t.Errorf("connection %d call %d: %v %v %.80q", k, f.ID, f.Kind, f.Code, f.Payload)
				}
			}
		})
	}
	conn.Wait()
	sleeps.Wait()
	figs := stopOther()
	peak, anon := stopRSS()
	okOther, failed, p50, p99 := figs.summary()
	slowest := time.Duration(0)
	figs.mu.Lock()
	for _, d := range figs.lat {
		slowest = max(slowest, d)
	}
	figs.mu.Unlock()
	chaosFigures(t, "%d calls of %d MiB while big's 4 processes slept: %d answered, %d 'server busy' at once; RSS %.0f MiB before, peak %.0f MiB (anonymous %.0f MiB); the other group: %d answered, %d failed, p50 %v p99 %v slowest %v (alone p99 %v)",
		calls, (size+64)>>20, ok.Load(), busy.Load(), before, peak, anon, okOther, failed,
		p50.Round(time.Microsecond), p99.Round(time.Microsecond), slowest.Round(time.Millisecond), alone99.Round(time.Microsecond))
	if busy.Load() == 0 || ok.Load() == 0 {
		t.Errorf("%d answered, %d refused: the budget did not act while big's processes slept %s ms", ok.Load(), busy.Load(), hold)
	}
	// The budget (64 MiB of requests, 64 MiB of frames and answers) plus
	// the Go heap's slack.
	if limit := rssLimit(600); peak > limit {
		t.Errorf("scdd's RSS peaked at %.0f MiB, over %.0f", peak, limit)
	}
	if failed > 0 || slowest > 3*time.Second {
		t.Errorf("the other group: %d failed, slowest %v", failed, slowest)
	}
}

func isPID(b []byte) bool {
	pid, err := strconv.Atoi(string(b))
	return err == nil && pid > 0
}

// TestBinariesUnderRace: under go test -race (make test) the daemon and
// the UAPs the tests start are built with the race detector, and a race
// ends the process that found it (issue 19 item 14).
func TestBinariesUnderRace(t *testing.T) {
	if !raceBuild {
		t.Skip("the tests do not run under the race detector (make chaos): neither do the binaries")
	}
	for _, name := range []string{"scdd", "uap-echo", "uap-hostile"} {
		info, err := buildinfo.ReadFile(bin(name))
		must(t, err)
		race := false
		for _, s := range info.Settings {
			race = race || (s.Key == "-race" && s.Value == "true")
		}
		if !race {
			t.Errorf("%s is not built with -race", name)
		}
	}
	if !strings.Contains(os.Getenv("GORACE"), "halt_on_error=1") {
		t.Errorf("GORACE=%q: a race would not end the daemon", os.Getenv("GORACE"))
	}
}
