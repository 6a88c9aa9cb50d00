package scd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/netio"
	"tpsched/netio/rpcport"
	"tpsched/scd/client"
	"tpsched/scd/def"
	"tpsched/scd/names"
)

// These tests run the forwarder on real sockets in process: a netio server
// stands in for this node's RPC port and hands every call it receives to
// the forwarder; the other nodes are Nodes with no groups (their RPC
// handling is the real one: the hello, then 'no such service group' for
// every call), so every transferred call gets exactly one answer.

const testWait = 10 * time.Second // bound on every wait in these tests

// peerNode is a Node without groups listening on a loopback port.
func peerNode(t *testing.T, name, key string) (*Node, string) {
	t.Helper()
	cfg := &def.Config{System: def.System{NodeID: name, ClusterKey: key}}
	n, err := New(cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := rpcport.Listen(rpcport.Options{Addr: "127.0.0.1:0", MaxPayload: def.MaxMaxMessageSize,
		Logger: slog.New(slog.DiscardHandler)}, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testWait)
		defer cancel()
		_ = srv.Stop(ctx)
	})
	return n, srv.Addr()
}

// transferSide is this node's RPC port in the test: each call's group says
// where it goes (route), and the forwarder takes it there.
type transferSide struct {
	fwd   *forwarder
	route func(group string) (node, addr string)
}

func (s *transferSide) OnFrame(c *rpcport.Conn, f netio.Frame) {
	if f.Kind != netio.KindCall && f.Kind != netio.KindCallNoReply {
		return
	}
	node, addr := s.route(string(f.Group))
	fc := &fwdCall{caller: c, callerID: f.ID, kind: f.Kind, group: string(f.Group), service: string(f.Service),
		payload: append([]byte(nil), f.Payload...), timeoutMs: f.TimeoutMs, start: time.Now(),
		deadline: time.Now().Add(testWait)}
	if code, msg := testSend(s.fwd, node, addr, fc); code != netio.CodeOK && f.Kind == netio.KindCall {
		c.SendNow(netio.AppendError(nil, f.ID, code, msg))
	}
}

func (s *transferSide) OnClose(*rpcport.Conn) {}

// startTransferSide starts a forwarder named self behind a netio server
// with loops event loops; a call that cannot be sent, or is refused, is
// answered so, not retried.
func startTransferSide(t *testing.T, self, key string, loops int, route func(string) (string, string)) (*transferSide, string) {
	t.Helper()
	s := &transferSide{route: route}
	s.fwd = newForwarder(self, []byte(key), slog.New(slog.DiscardHandler), metrics.NewSet())
	s.fwd.reroute = func(fc *fwdCall, err error) { answerUnsent(fc, err, "") }
	srv, err := rpcport.Listen(rpcport.Options{Addr: "127.0.0.1:0", Loops: loops, Logger: slog.New(slog.DiscardHandler)}, s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testWait)
		defer cancel()
		_ = srv.Stop(ctx)
		s.fwd.close()
	})
	return s, srv.Addr()
}

// TestTransferToReplacedPeerIsAnswered: a node that moves to another
// address gets a new peer, and the old one stops. Calls handed to the old
// peer in the moment it is replaced must still be answered. Here every
// call names the address to use, so the peer is replaced on almost every
// call while calls come in on four event loops.
func TestTransferToReplacedPeerIsAnswered(t *testing.T) {
	// More Ps than cores: the OS then preempts a thread anywhere, also
	// between a peer's lookup and the hand-over of a call to it.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(16))
	_, addrA := peerNode(t, "x", "")
	_, addrB := peerNode(t, "x", "")
	_, addr := startTransferSide(t, "self", "", 4, func(group string) (string, string) {
		if strings.HasSuffix(group, "a") {
			return "x", addrA
		}
		return "x", addrB
	})
	const callers, calls = 16, 200
	clients := make([]*client.Client, callers)
	for i := range clients {
		c, err := client.New(client.Options{Hosts: []string{addr}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients[i] = c
	}
	var unanswered, answered atomic.Int64
	// The window is a few instructions wide: several rounds make it show.
	for round := 0; round < 5 && unanswered.Load() == 0; round++ {
		var wg sync.WaitGroup
		for i, c := range clients {
			wg.Go(func() {
				for j := range calls {
					group := "to-a"
					if (i+j)%2 == 1 {
						group = "to-b"
					}
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					_, err := c.Call(ctx, group, "echo", nil)
					cancel()
					// x answers every call 'no such service group'; a call sent on
					// the connection of a peer that is replaced fails 'network
					// down'. A time-out is no answer at all.
					if code := codeOf(err); code != netio.CodeNoSuchGroup && code != netio.CodeNetworkDown {
						unanswered.Add(1)
						t.Errorf("round %d, call %d of caller %d: %v", round, j, i, err)
						return // one is enough; do not wait for each
					}
					answered.Add(1)
				}
			})
		}
		wg.Wait()
	}
	if n := unanswered.Load(); n > 0 {
		t.Errorf("calls transferred while their peer was replaced went unanswered (%d answered)", answered.Load())
	}
}

// TestTransferInFlightNeverNegative: the in-flight count of a peer (P2C's
// second key) counts a call from before it is queued until it is answered,
// so it is never below zero, and zero once every call is answered.
func TestTransferInFlightNeverNegative(t *testing.T) {
	// More Ps than cores: the OS then preempts a thread anywhere, also
	// between a call's hand-over and its count, for a whole time slice.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(16))
	_, addrA := peerNode(t, "x", "")
	s, addr := startTransferSide(t, "self", "", 4, func(string) (string, string) { return "x", addrA })
	stop := make(chan struct{})
	var lowest atomic.Int64
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if v := int64(s.fwd.inFlight("x")); v < lowest.Load() {
				lowest.Store(v)
			}
		}
	})
	const callers, calls = 8, 400 // below the peer's queue bound
	clients := make([]*client.Client, callers)
	for i := range clients {
		c, err := client.New(client.Options{Hosts: []string{addr}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients[i] = c
	}
	var wg sync.WaitGroup
	// The window is a few instructions wide: many rounds make it show.
	for round := 0; round < 60 && lowest.Load() >= 0 && !t.Failed(); round++ {
		for _, c := range clients {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), testWait)
				defer cancel()
				for range calls {
					if err := c.CallNoReply(ctx, "g", "log", nil); err != nil {
						t.Errorf("CallNoReply: %v", err)
						return
					}
				}
				// One answered call behind them: every no-reply call before
				// it has been written to the peer.
				if _, err := c.Call(ctx, "g", "echo", nil); codeOf(err) != netio.CodeNoSuchGroup {
					t.Errorf("call after the no-reply calls: %v", err)
				}
			})
		}
		wg.Wait()
	}
	wg.Wait()
	close(stop)
	sampler.Wait()
	if v := lowest.Load(); v < 0 {
		t.Errorf("in-flight count to the peer went down to %d", v)
	}
	if v := s.fwd.inFlight("x"); v != 0 {
		t.Errorf("in-flight count %d after every call was answered", v)
	}
}

func codeOf(err error) netio.Code {
	var te *netio.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 255
}

// testSend hands fc to node's peer.
func testSend(f *forwarder, node, addr string, fc *fwdCall) (netio.Code, string) {
	return f.send(node, addr, fc)
}

// echoNode is a node that says hello as nodes do and answers every call
// with its payload: a node that serves the group.
type echoNode struct{ *Node }

func (e echoNode) OnFrame(c *rpcport.Conn, f netio.Frame) {
	if f.Kind != netio.KindCall {
		e.Node.OnFrame(c, f)
		return
	}
	c.SendNow(netio.AppendReply(nil, f.ID, f.Payload))
}

// TestRefusedTransferGoesElsewhere: a node that refuses a transferred call
// before running it ('node shutting down': it drains) makes the forwarder
// send the call to another node, with scd_retry_of_comm_error; without
// retries the caller gets the refusal itself.
func TestRefusedTransferGoesElsewhere(t *testing.T) {
	for _, retries := range []int{1, 0} {
		t.Run(fmt.Sprintf("retries %d", retries), func(t *testing.T) {
			stopping, stoppingAddr := clusterNode(t, "n1", testKey)
			stopping.draining.Store(true)
			_, servingAddr := testClusterNode(t, &def.Config{System: def.System{NodeID: "n2", ClusterKey: testKey}},
				func(n *Node) rpcport.Handler { return echoNode{n} })
			work := []names.GroupInfo{{Group: "work"}}
			n0, addr := testClusterNode(t, &def.Config{
				System: def.System{NodeID: "n0", ClusterKey: testKey},
				Sched:  def.Sched{RetryOfCommError: retries, AnnounceServerStatus: true},
			}, nil, names.NodeInfo{Node: "n1", Addr: stoppingAddr, Groups: work},
				names.NodeInfo{Node: "n2", Addr: servingAddr, Groups: work})
			c, err := client.New(client.Options{Hosts: []string{addr}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), testWait)
			defer cancel()
			var served, refused int
			for i := range 200 { // about half go to n1 first
				want := strconv.Itoa(i)
				out, err := c.Call(ctx, "work", "echo", []byte(want))
				switch {
				case err == nil && string(out) == want:
					served++
				case retries == 0 && codeOf(err) == netio.CodeShuttingDown:
					refused++
				default:
					t.Fatalf("call %d: %q, %v", i, out, err)
				}
			}
			var b bytes.Buffer
			n0.metrics.WritePrometheus(&b)
			toN1 := metricValue(b.String(), `tpsched_forwarded_total{to="n1"}`)
			retried := metricValue(b.String(), `tpsched_transfer_retries_total{reason="refused"}`)
			t.Logf("served %d, refused %d; %d sent to the stopping node, %d sent on", served, refused, toN1, retried)
			switch {
			case retries == 1 && served != 200:
				t.Errorf("%d of 200 calls served with a retry", served)
			case retries == 1 && (toN1 == 0 || retried != toN1):
				t.Errorf("%d calls sent to the stopping node, %d sent on:\n%s", toN1, retried, b.String())
			case retries == 0 && (refused < 50 || served < 50):
				t.Errorf("without retries: %d refused, %d served; want about half each", refused, served)
			}
		})
	}
}

// metricValue is the value of the series named exactly name in a
// Prometheus text exposition, 0 if absent.
func metricValue(text, name string) int {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// TestRefusedBeforeRunning: only an answer that proves the call never ran
// on the other node lets it go to a third; every code that a call which
// may have run can get is final (a resent call could run twice).
func TestRefusedBeforeRunning(t *testing.T) {
	resend := map[netio.Code]bool{
		netio.CodeShuttingDown:  true, // the node drains: it took no new call
		netio.CodeServiceClosed: true, // held there: refused at admission
		netio.CodeNoSuchGroup:   true, // the table was stale: nothing ran
		netio.CodeServerBusy:    true, // its queue was full: refused at admission
	}
	for _, code := range netio.Codes() {
		if got := refusedBeforeRunning(code); got != resend[code] {
			t.Errorf("%v: refusedBeforeRunning %v, want %v", code, got, resend[code])
		}
	}
}
