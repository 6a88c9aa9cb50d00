package itest

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"tpsched/netio"
)

// TestChaosForgedPeerFrames sends a node every frame a stranger
// can send to its RPC port: every kind (the defined ones and some that are
// not), every flag byte, with payloads shaped like each step of the peer
// hello and like nothing, with and without a cluster_key. After each kind
// the node must still be running and answer calls.
func TestChaosForgedPeerFrames(t *testing.T) {
	skipShort(t)
	for _, key := range []string{"", "the-right-key-0123456789"} {
		name := "without cluster_key"
		if key != "" {
			name = "with cluster_key"
		}
		t.Run(name, func(t *testing.T) {
			sys := ""
			if key != "" {
				sys = fmt.Sprintf("set cluster_key = %q\n", key)
			}
			n := startNode(t, "-c", defDir(t, sys, map[string]string{"work": echoDef("work", 1, 64, 1<<20)}))
			c := n.client()
			serving := func(after string) {
				t.Helper()
				select {
				case <-n.done:
					t.Fatalf("scdd died after %s: %v\n%s", after, n.err, n.stderr.String())
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if out, err := c.Call(ctx, "work", "echo", []byte("still here")); err != nil || string(out) != "still here" {
					t.Fatalf("call after %s: %q, %v\n%s", after, out, err, n.stderr.String())
				}
			}
			payloads := forgedPayloads()
			kinds := []netio.Kind{0, netio.KindCall, netio.KindCallNoReply, netio.KindReply, netio.KindError,
				netio.KindNameLookup, netio.KindAnnounce, 7, 8, 255}
			for _, kind := range kinds {
				for flags := range 256 {
					sendForged(t, n.rpc, kind, netio.Flags(flags), payloads)
				}
				serving(fmt.Sprintf("every flag of %v frames", kind))
			}
			// Handshake steps out of order and repeated, on one connection.
			for _, seq := range [][]int{{0, 0}, {2}, {3}, {1, 1}, {0, 3, 3}, {0, 1, 2, 3}, {3, 0}} {
				var frames [][]byte
				for _, i := range seq {
					frames = append(frames, payloads[i])
				}
				sendForged(t, n.rpc, netio.KindAnnounce, 0, frames)
				sendForged(t, n.rpc, netio.KindAnnounce, netio.FlagForwarded, frames)
			}
			time.Sleep(200 * time.Millisecond) // let the last connections be read
			serving("the handshake sequences")
			chaosFigures(t, "forged peer frames (%s): %d kinds x 256 flag bytes x %d payloads and 14 hello sequences; node served after each; refused hellos %.0f, bad frames %.0f",
				name, len(kinds), len(payloads), metricSum(n.metrics(), "tpsched_peer_hellos_refused_total"), metricSum(n.metrics(), "tpsched_bad_frames_total"))
			if key != "" {
				if m := n.metrics(); !strings.Contains(m, "tpsched_peer_hellos_refused_total") {
					t.Errorf("/metrics does not count refused hellos:\n%s", grep(m, "hello"))
				}
			}
		})
	}
}

// forgedPayloads are hello-like payloads: each handshake step byte (0..5)
// followed by nothing, a nonce's worth and two nonces' worth of random
// bytes, and a long run of 0xff.
func forgedPayloads() [][]byte {
	var out [][]byte
	for _, size := range []int{0, 32, 64} {
		for step := range 6 {
			p := make([]byte, 1+size)
			p[0] = byte(step)
			_, _ = rand.Read(p[1:])
			out = append(out, p)
		}
	}
	return append(out, nil, []byte(strings.Repeat("\xff", 1024)))
}

// sendForged writes one frame per payload on a fresh connection to addr,
// each naming a plausible peer (as a hello does; as a call's group it runs
// nowhere, so no call takes the work group's queue), then closes. Write errors are expected: the node may close the connection.
func sendForged(t *testing.T, addr string, kind netio.Kind, flags netio.Flags, payloads [][]byte) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	var buf []byte
	for i, p := range payloads {
		buf = appendRawFrame(buf, kind, flags, uint64(i+1), "n9", "echo", p)
	}
	_, _ = nc.Write(buf)
}

// appendRawFrame is netio.AppendFrame with any kind byte, also kinds netio
// would never send.
func appendRawFrame(dst []byte, kind netio.Kind, flags netio.Flags, id uint64, group, service string, payload []byte) []byte {
	start := len(dst)
	dst = netio.AppendFrame(dst, netio.Header{Kind: netio.KindCall, Flags: flags, ID: id, TimeoutMs: 2000}, group, service, payload)
	dst[start+3] = byte(kind)
	return dst
}
