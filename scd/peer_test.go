package scd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"tpsched/netio"
	"tpsched/netio/rpcport"
	"tpsched/scd/def"
	"tpsched/scd/names"
	"tpsched/scd/peers"
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
	if cfg.Sched.BalanceRule == "" {
		cfg.Sched.BalanceRule = "opentp1"
	}
	n, err := New(cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.prepareCluster(true); err != nil { // in a cluster, without membership: the table is filled here
		t.Fatal(err)
	}
	n.buildFrames()
	t.Cleanup(n.pool.Close)
	for _, m := range members {
		m.Boot, m.Seq = 1, 1
		if _, err := n.router.Names().Apply(m); err != nil {
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
						fr, err := peers.Handshake(nc, name, "n1", key)
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

// forgeProof says hello as name on nc (the steps as scd/peers' hello.go
// writes them) and answers the challenge with a proof made without the
// key; the node must refuse it.
func forgeProof(t *testing.T, nc net.Conn, name string) {
	_ = nc.SetDeadline(time.Now().Add(testWait))
	step := func(n byte, group string, body []byte) []byte {
		return netio.AppendFrame(nil, netio.Header{Kind: netio.KindAnnounce}, group, "", append([]byte{n}, body...))
	}
	if _, err := nc.Write(step(1, name, make([]byte, 32))); err != nil {
		t.Error(err)
		return
	}
	fr := netio.NewFrameReader(nc, 4<<10)
	if f, _, err := fr.Read(nil); err != nil || f.Kind != netio.KindAnnounce || len(f.Payload) == 0 || f.Payload[0] != 2 {
		t.Errorf("no challenge: %+v, %v", f.Header, err)
		return
	}
	_, _ = nc.Write(step(3, "", bytes.Repeat([]byte{1}, 32)))
	if f, _, err := fr.Read(nil); err == nil && (f.Kind != netio.KindError || f.Code != netio.CodeProtocol) {
		t.Errorf("forged proof answered %+v, want refused", f.Header)
	}
}

const testWait = 10 * time.Second // bound on every wait in these tests
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

func codeOf(err error) netio.Code {
	var te *netio.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 255
}
