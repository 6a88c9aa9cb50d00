package itest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"tpsched/netio"
	"tpsched/scd"
	"tpsched/scd/client"
)

// Receiver groups (scdsvcdef's scdmulti -g NAME -m COUNT -p PORT) and
// multi_schedule, on real scdd processes.

const heavyServer = `set service_group = "heavy"
set service = "echo=echo", "sleep=sleep"
set module = MODULE
set parallel_count = 2
scdmulti -g heavy
`

const lightServer = `set service_group = "light"
set service = "echo=echo"
set module = MODULE
`

// receiverNode starts a node whose default group has two sockets and whose
// receiver group heavy has three, with the server heavy bound to it.
func receiverNode(t *testing.T) *node {
	t.Helper()
	dir := defDir(t, "", map[string]string{"heavy": heavyServer, "light": lightServer})
	must(t, os.WriteFile(filepath.Join(dir, "scdsvcdef"), []byte("set scdmulti = 2\nscdmulti -g heavy -m 3 -p 0\n"), 0o644))
	return startNode(t, "-c", dir)
}

// receiverCalls is the calls each socket of a receiver group read.
func receiverCalls(t *testing.T, n *node, group string) []uint64 {
	t.Helper()
	st, err := n.status()
	must(t, err)
	var out []uint64
	for _, r := range st.Receivers {
		if r.Group == group {
			out = append(out, r.Calls)
		}
	}
	return out
}

func groupAddr(t *testing.T, st scd.Status, group string) string {
	t.Helper()
	for _, s := range st.Steering {
		if s.Group == group {
			return s.Addr
		}
	}
	t.Fatalf("no receiver group %q in %+v", group, st.Steering)
	return ""
}

// directCall sends one call on its own connection and returns the answer's
// error: no client logic in between.
func directCall(t *testing.T, addr, group, service string, payload []byte) error {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	must(t, err)
	mc := netio.NewMuxConn(nc, netio.MuxOptions{})
	defer mc.Close(nil)
	ch := make(chan error, 1)
	_, sent, err := mc.Call(netio.Header{Kind: netio.KindCall, TimeoutMs: 5000}, group, service, payload, time.Time{}, answerFn(func(f netio.Frame, err error) {
		switch {
		case err != nil:
			ch <- err
		case f.Kind == netio.KindError:
			ch <- &netio.Error{Code: f.Code, Message: string(f.Payload)}
		default:
			ch <- nil
		}
	}))
	if !sent {
		t.Fatal(err)
	}
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("no answer")
		return nil
	}
}

type answerFn func(netio.Frame, error)

func (a answerFn) Answer(f netio.Frame, err error) { a(f, err) }

// TestReceiverGroupsTakeOnlyTheirServers: a server bound to a receiver
// group has its calls taken on that group's port only, and that port
// takes no other server's calls: each refusal is 'wrong receiver' naming
// the right address. The Go client follows it by itself (the call did not
// run); a call without an answer, which could not be told, is served where
// it came and counted. Status and /metrics show each receiving socket's
// calls.
func TestReceiverGroupsTakeOnlyTheirServers(t *testing.T) {
	skipShort(t)
	n := receiverNode(t)
	st, err := n.status()
	must(t, err)
	heavy := groupAddr(t, st, "heavy")
	if heavy == n.rpc || len(receiverCalls(t, n, "")) != 2 || len(receiverCalls(t, n, "heavy")) != 3 {
		t.Fatalf("receivers %+v, steering %+v", st.Receivers, st.Steering)
	}
	for _, g := range st.Groups {
		if want := map[string]string{"heavy": "heavy", "light": ""}[g.Group]; g.Receivers != want {
			t.Errorf("group %s: receiver group %q, want %q", g.Group, g.Receivers, want)
		}
	}

	var te *netio.Error
	err = directCall(t, n.rpc, "heavy", "echo", []byte("x"))
	if !errors.As(err, &te) || te.Code != netio.CodeWrongReceiver || !strings.Contains(te.Message, heavy) {
		t.Fatalf("heavy on the default port: %v; want 'wrong receiver' naming %s", err, heavy)
	}
	err = directCall(t, heavy, "light", "echo", []byte("x"))
	if !errors.As(err, &te) || te.Code != netio.CodeWrongReceiver || !strings.Contains(te.Message, n.rpc) {
		t.Fatalf("light on heavy's port: %v; want 'wrong receiver' naming %s", err, n.rpc)
	}
	if err := directCall(t, heavy, "heavy", "echo", []byte("x")); err != nil {
		t.Fatalf("heavy on its own port: %v", err)
	}
	if err := directCall(t, n.rpc, "light", "echo", []byte("x")); err != nil {
		t.Fatalf("light on the default port: %v", err)
	}

	// A client that knows only the default port reaches heavy all the same.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := n.client()
	for i := range 20 {
		want := strconv.Itoa(i)
		out, err := c.Call(ctx, "heavy", "echo", []byte(want))
		if err != nil || string(out) != want {
			t.Fatalf("call %d to heavy through the default port: %q, %v", i, out, err)
		}
	}
	before := groupStatus(t, n, "heavy").Processed
	c2 := n.client()
	for range 5 {
		must(t, c2.CallNoReply(ctx, "heavy", "echo", []byte("no reply")))
	}
	waitFor(t, 10*time.Second, "the calls without an answer served", func() bool {
		return groupStatus(t, n, "heavy").Processed == before+5
	}, n.stderr.String)

	m := n.metrics()
	// Three refusals: the two direct calls, and the client's first call.
	for _, series := range []string{`tpsched_receiver_calls_total{receiver_group="heavy",receiver="2"}`,
		`tpsched_receiver_connections{receiver_group="default",receiver="1"}`,
		`tpsched_receiver_steering{receiver_group="heavy",mechanism=`,
		`tpsched_requests_refused_total{reason="wrong_receiver"} 3`,
		`tpsched_receiver_misdirected_total{receiver_group="default"} 5`} {
		if !strings.Contains(m, series) {
			t.Errorf("/metrics lacks %s", series)
		}
	}
	out, err := n.scdctl("status")
	if err != nil || !strings.Contains(out, "heavy") || !strings.Contains(out, "receiver") {
		t.Errorf("scdctl status: %v\n%s", err, out)
	}
}

// TestMultiScheduleSpreadsOverReceivers: one client with MultiSchedule
// sends a group's calls over every receiving socket of its receiver
// group; one without sends them all through one.
func TestMultiScheduleSpreadsOverReceivers(t *testing.T) {
	skipShort(t)
	n := receiverNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run := func(c *client.Client) []uint64 {
		before := receiverCalls(t, n, "heavy")
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				for i := range 40 {
					want := fmt.Sprintf("%d-%d", w, i)
					if out, err := c.Call(ctx, "heavy", "echo", []byte(want)); err != nil || string(out) != want {
						t.Errorf("call %s: %q, %v", want, out, err)
						return
					}
				}
			})
		}
		wg.Wait()
		after := receiverCalls(t, n, "heavy")
		for i := range after {
			after[i] -= before[i]
		}
		return after
	}
	one := run(n.client())
	busy := 0
	for _, k := range one {
		if k > 0 {
			busy++
		}
	}
	if busy != 1 {
		t.Errorf("without multi_schedule the calls went over %d receivers (%v), want 1: one connection", busy, one)
	}
	// The client dials until it has a connection on each of the 3
	// sockets, up to 9 times, and again at most once a second: where the
	// kernel's hash (or the steering program) lands connections is its
	// own, so 9 dials miss a socket now and then (about 1 time in 13 by
	// chance). More rounds of 320 calls, a second apart, give the client
	// its refills; the calls must reach every socket within a few.
	mc := n.client(func(o *client.Options) { o.MultiSchedule = true })
	spread := make([]uint64, len(one))
	rounds := 0
	for ; rounds < 5; rounds++ {
		if rounds > 0 {
			time.Sleep(1100 * time.Millisecond)
		}
		for i, k := range run(mc) {
			spread[i] += k
		}
		if slices.Min(spread) >= 30 {
			break
		}
	}
	t.Logf("calls per heavy receiver: one connection %v, multi_schedule %v in %d round(s) of 320", one, spread, min(rounds+1, 5))
	for i, k := range spread {
		if k < 30 { // 320 calls a round over 3 sockets
			t.Errorf("with multi_schedule receiver %d read %d calls (%v) in 5 rounds: not spread", i, k, spread)
		}
	}
}

// TestMultiScheduleForwarding: a node that transfers a group's calls sends
// them to the receiver group that takes them on the other node (it learns
// where from the first 'wrong receiver'); with multi_schedule (usrrc's, for
// a group it does not define) spread over all that group's sockets,
// without it through one.
func TestMultiScheduleForwarding(t *testing.T) {
	skipShort(t)
	for _, multi := range []bool{true, false} {
		t.Run(fmt.Sprintf("multi_schedule %v", multi), func(t *testing.T) { testForwarding(t, multi) })
	}
}

func testForwarding(t *testing.T, multi bool) {
	ips := clusterIPs[:2]
	nodes := startOnFreePorts(t, func(rpc, name int) ([]*node, error) {
		heavyPort := rpc + 2
		l, err := net.Listen("tcp", net.JoinHostPort(clusterIPs[1], strconv.Itoa(heavyPort)))
		if err != nil {
			return nil, fmt.Errorf("heavy's port %d: %w", heavyPort, err)
		}
		l.Close()
		var nodes []*node
		for i := range ips {
			dir := t.TempDir()
			sys := clusterSysconf(i, ips, rpc, name)
			must(t, os.WriteFile(filepath.Join(dir, "sysconf"), []byte(sys), 0o644))
			must(t, os.MkdirAll(filepath.Join(dir, "usr"), 0o755))
			servers := map[string]string{"light": lightServer}
			if i == 0 {
				yn := map[bool]string{true: "Y", false: "N"}[multi]
				must(t, os.WriteFile(filepath.Join(dir, "usrrc"), []byte("set multi_schedule = "+yn+"\n"), 0o644))
			} else {
				servers["heavy"] = heavyServer
				must(t, os.WriteFile(filepath.Join(dir, "scdsvcdef"),
					[]byte(fmt.Sprintf("scdmulti -g heavy -m 3 -p %d\n", heavyPort)), 0o644))
			}
			for s, body := range servers {
				must(t, os.WriteFile(filepath.Join(dir, "usr", s), []byte(strings.ReplaceAll(body, "MODULE", strconv.Quote(bin("uap-echo")))), 0o644))
			}
			n, err := tryStartCommand(t, nil, bin("scdd"), "-c", dir, "-fast-failure-detection")
			if err != nil {
				return append(nodes, n), err
			}
			nodes = append(nodes, n)
		}
		return nodes, nil
	})
	waitFor(t, 15*time.Second, "n0 to know that n1 runs heavy", func() bool { return knowsGroup(t, nodes[0], "n1", "heavy") },
		nodes[0].stderr.String)
	c := nodes[0].client()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 40 {
				want := fmt.Sprintf("%d-%d", w, i)
				if out, err := c.Call(ctx, "heavy", "echo", []byte(want)); err != nil || string(out) != want {
					t.Errorf("call %s through n0: %q, %v", want, out, err)
					return
				}
			}
		})
	}
	wg.Wait()
	calls := receiverCalls(t, nodes[1], "heavy")
	t.Logf("n1's heavy receivers read %v of 320 transferred calls", calls)
	busy := 0
	for i, k := range calls {
		if k > 0 {
			busy++
		}
		if multi && k < 30 {
			t.Errorf("n1's heavy receiver %d read %d calls (%v): the transfers were not spread", i, k, calls)
		}
	}
	if !multi && busy != 1 {
		t.Errorf("without multi_schedule the transfers went over %d receivers (%v), want 1", busy, calls)
	}
	if p := groupStatus(t, nodes[1], "heavy").Processed; p != 320 {
		t.Errorf("n1 served %d heavy calls, want 320", p)
	}
}
