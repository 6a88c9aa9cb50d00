package scd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"tpsched/netio"
	"tpsched/netio/rpcport"
	"tpsched/scd/client"
	"tpsched/scd/def"
	"tpsched/scd/names"
	"tpsched/scd/route"
)

const testKey = "the-right-key-0123456789"

// clusterNode is a Node named name with no groups, listening on loopback,
// with the inter-node state of a node whose name table holds members (it
// runs no membership: the table is filled here).
func clusterNode(t *testing.T, name, key string, members ...string) (*Node, string) {
	t.Helper()
	var infos []names.NodeInfo
	for _, m := range members {
		infos = append(infos, names.NodeInfo{Node: m, Addr: "127.0.0.1:1"})
	}
	return testClusterNode(t, &def.Config{System: def.System{NodeID: name, ClusterKey: key}}, nil, infos...)
}

// testClusterNode is a Node of cfg with no groups and a name table holding
// members, serving its RPC port on loopback; wrap, if not nil, stands
// between the port and the node.
func testClusterNode(t *testing.T, cfg *def.Config, wrap func(*Node) rpcport.Handler, members ...names.NodeInfo) (*Node, string) {
	t.Helper()
	n, err := New(cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	n.cluster = n.newCluster(route.OpenTP1)
	n.buildFrames()
	t.Cleanup(n.cluster.fwd.close)
	for _, m := range members {
		m.Boot, m.Seq = 1, 1
		if _, err := n.cluster.names.Apply(m); err != nil {
			t.Fatal(err)
		}
	}
	var h rpcport.Handler = n
	if wrap != nil {
		h = wrap(n)
	}
	srv, err := rpcport.Listen(rpcport.Options{Addr: "127.0.0.1:0", MaxPayload: def.MaxMaxMessageSize,
		Logger: slog.New(slog.DiscardHandler)}, h)
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

// received is n's tpsched_requests_received_total series, by their from
// label, and tpsched_peer_hellos_refused_total.
func received(t *testing.T, n *Node) (from map[string]int, refused int) {
	t.Helper()
	var b bytes.Buffer
	n.metrics.WritePrometheus(&b)
	from = map[string]int{}
	for _, line := range strings.Split(b.String(), "\n") {
		if rest, ok := strings.CutPrefix(line, `tpsched_requests_received_total{from="`); ok {
			name, value, _ := strings.Cut(rest, `"} `)
			from[name], _ = strconv.Atoi(value)
		}
		if v, ok := strings.CutPrefix(line, "tpsched_peer_hellos_refused_total "); ok {
			refused, _ = strconv.Atoi(v)
		}
	}
	return from, refused
}

// forwardedCall writes a call marked forwarded on nc and returns the code
// of its answer (CodeOK for a reply), or an error if none comes.
func forwardedCall(nc net.Conn, r *netio.FrameReader, id uint64) (netio.Code, error) {
	_ = nc.SetDeadline(time.Now().Add(testWait))
	defer nc.SetDeadline(time.Time{})
	if _, err := nc.Write(netio.AppendFrame(nil, netio.Header{Kind: netio.KindCall, Flags: netio.FlagForwarded, ID: id},
		"work", "echo", nil)); err != nil {
		return 0, err
	}
	for {
		f, _, err := r.Read(nil)
		if err != nil {
			return 0, err
		}
		if f.ID == id {
			return f.Code, nil
		}
	}
}

// TestHelloMutual: the hello succeeds only when both ends have the same
// key (or neither has one), and the dialer knows it reached the node it
// meant and that the node has the key.
func TestHelloMutual(t *testing.T) {
	cases := []struct {
		name               string
		dialerKey, nodeKey string
		want               string // node id the dialer expects
		refused            bool
	}{
		{name: "same key", dialerKey: testKey, nodeKey: testKey, want: "n1"},
		{name: "no key on either", want: "n1"},
		{name: "another key", dialerKey: testKey, nodeKey: "another-key-0123456789", want: "n1", refused: true},
		{name: "node without key", dialerKey: testKey, want: "n1", refused: true},
		{name: "dialer without key", nodeKey: testKey, want: "n1", refused: true},
		{name: "another node", dialerKey: testKey, nodeKey: testKey, want: "n2", refused: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n, addr := clusterNode(t, "n1", tc.nodeKey, "n0")
			var key []byte
			if tc.dialerKey != "" {
				key = []byte(tc.dialerKey)
			}
			nc, fr, err := dialPeer(addr, "n0", tc.want, key)
			if tc.refused {
				if !errors.Is(err, errHelloRefused) {
					t.Fatalf("dialPeer = %v, want a refused hello", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("dialPeer: %v", err)
			}
			defer nc.Close()
			if code, err := forwardedCall(nc, fr, 7); err != nil || code != netio.CodeNoSuchGroup {
				t.Fatalf("forwarded call: %v, %v", code, err)
			}
			if from, _ := received(t, n); from["n0"] != 1 {
				t.Errorf("received %v, want one call from n0", from)
			}
		})
	}
}

// recordingProxy passes one connection through to addr and keeps what the
// dialer sent.
type recordingProxy struct {
	addr string
	mu   sync.Mutex
	sent bytes.Buffer
}

func startRecordingProxy(t *testing.T, to string) *recordingProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	p := &recordingProxy{addr: l.Addr().String()}
	go func() {
		in, err := l.Accept()
		if err != nil {
			return
		}
		defer in.Close()
		out, err := net.Dial("tcp", to)
		if err != nil {
			return
		}
		defer out.Close()
		go func() { _, _ = io.Copy(in, out) }()
		buf := make([]byte, 64<<10)
		for {
			k, err := in.Read(buf)
			if k > 0 {
				p.mu.Lock()
				p.sent.Write(buf[:k])
				p.mu.Unlock()
				if _, err := out.Write(buf[:k]); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	return p
}

func (p *recordingProxy) recorded() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return bytes.Clone(p.sent.Bytes())
}

// TestChaosReplayedHello records what a real forwarder sends on its
// connection to a node (the hello, then a forwarded call) and replays it
// byte for byte on a new connection. The replayed call must not be taken
// as forwarded: the node's nonce is new, the recorded proof does not fit
// it, the hello is refused and counted, and the call is not counted as
// received from the node the recording names.
func TestChaosReplayedHello(t *testing.T) {
	for _, key := range []string{testKey} {
		n1, addr1 := clusterNode(t, "n1", key, "n0")
		proxy := startRecordingProxy(t, addr1)
		_, viaN0 := startTransferSide(t, "n0", key, 1, func(string) (string, string) { return "n1", proxy.addr })
		c, err := client.New(client.Options{Hosts: []string{viaN0}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), testWait)
		defer cancel()
		if _, err := c.Call(ctx, "work", "echo", nil); codeOf(err) != netio.CodeNoSuchGroup {
			t.Fatalf("call through n0 to n1: %v", err)
		}
		if from, _ := received(t, n1); from["n0"] != 1 {
			t.Fatalf("n1 received %v, want the one forwarded call from n0", from)
		}
		recording := proxy.recorded()

		replay, err := net.Dial("tcp", addr1)
		if err != nil {
			t.Fatal(err)
		}
		defer replay.Close()
		_ = replay.SetDeadline(time.Now().Add(testWait))
		if _, err := replay.Write(recording); err != nil {
			t.Fatal(err)
		}
		// Read until the node closes the connection.
		var answers []string
		fr := netio.NewFrameReader(bufio.NewReader(replay), 1<<20)
		for {
			f, _, err := fr.Read(nil)
			if err != nil {
				break
			}
			answers = append(answers, fmt.Sprintf("%v/%v %q", f.Kind, f.Code, f.Payload))
		}
		from, refused := received(t, n1)
		if from["n0"] != 1 || len(from) > 2 || from["unknown"] != 0 {
			t.Errorf("after the replay n1 counts %v received: the replayed call was taken as forwarded", from)
		}
		if refused != 1 {
			t.Errorf("refused hellos %d, want 1 (answers to the replay: %v)", refused, answers)
		}
		t.Logf("chaos figures: replayed hello: %d bytes of a real forwarder's connection replayed; calls trusted as forwarded %d, hellos refused %d",
			len(recording), from["n0"]-1, refused)
	}
}

// TestChaosFakePeerNames: 2,000 connections each naming another node
// make no new series. With the key (the dialers prove it, so their names
// are authenticated) and without one (names trusted blindly), a name that
// is not a member of the name table counts under from="unknown"; with a
// wrong key every hello is refused and nothing is counted as received.
func TestChaosFakePeerNames(t *testing.T) {
	const fakes = 2000
	for _, tc := range []struct{ name, nodeKey, dialerKey string }{
		{"authenticated", testKey, testKey},
		{"no key", "", ""},
		{"wrong key", testKey, "the-wrong-key-0123456789"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, addr := clusterNode(t, "n1", tc.nodeKey, "n0")
			var key []byte
			if tc.dialerKey != "" {
				key = []byte(tc.dialerKey)
			}
			refusedWanted := tc.nodeKey != tc.dialerKey
			var wg sync.WaitGroup
			next := make(chan int)
			for range 8 {
				wg.Go(func() {
					for i := range next {
						nc, err := net.Dial("tcp", addr)
						if err != nil {
							t.Error(err)
							return
						}
						name := fmt.Sprintf("fake-%d", i)
						fr, err := helloAsDialer(nc, name, "n1", key)
						if refusedWanted {
							if err == nil {
								t.Errorf("%s: hello with a wrong key accepted", name)
							}
							if tc.dialerKey != "" {
								// The dialer saw the node's MAC fail and stopped; prove
								// the node refuses a guessed proof too.
								nc.Close()
								nc, _ = net.Dial("tcp", addr)
								forgeProof(t, nc, name)
							}
							nc.Close()
							continue
						}
						if err != nil {
							t.Errorf("%s: %v", name, err)
						} else if code, err := forwardedCall(nc, fr, 1); err != nil || code != netio.CodeNoSuchGroup {
							t.Errorf("%s: forwarded call: %v, %v", name, code, err)
						}
						nc.Close()
					}
				})
			}
			for i := range fakes {
				next <- i
			}
			close(next)
			wg.Wait()
			from, refused := received(t, n)
			t.Logf("chaos figures: %d fake peer names (%s): %d series, received %v, hellos refused %d", fakes, tc.name, len(from), from, refused)
			for name := range from {
				if name != "unknown" {
					t.Errorf("a series from=%q", name)
				}
			}
			if refusedWanted {
				if from["unknown"] != 0 || refused != fakes {
					t.Errorf("received %v, %d hellos refused; want none received and %d refused", from, refused, fakes)
				}
			} else if from["unknown"] != fakes {
				t.Errorf("received %v, want %d calls under unknown", from, fakes)
			}
		})
	}
}

// forgeProof says hello as name on nc and answers the challenge with a
// proof made without the key; the node must refuse it.
func forgeProof(t *testing.T, nc net.Conn, name string) {
	_ = nc.SetDeadline(time.Now().Add(testWait))
	var nonce [helloNonceSize]byte
	if _, err := nc.Write(helloFrame(nil, name, helloStepHello, nonce[:])); err != nil {
		t.Error(err)
		return
	}
	fr := netio.NewFrameReader(nc, 4<<10)
	if _, _, err := readHelloStep(fr, helloStepChallenge); err != nil {
		t.Error(err)
		return
	}
	_, _ = nc.Write(helloFrame(nil, "", helloStepProof, bytes.Repeat([]byte{1}, helloMACSize)))
	if _, _, err := readHelloStep(fr, helloStepWelcome); !errors.Is(err, errHelloRefused) {
		t.Errorf("forged proof: %v, want refused", err)
	}
}
