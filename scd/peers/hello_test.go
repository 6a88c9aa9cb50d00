package peers

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"tpsched/netio"
	"tpsched/netio/rpcport"
	"tpsched/scd/client"
)

// hopRecorder answers every call 'no such service group' and records the
// hop mark each carried, as the node's hello proved it.
type hopRecorder struct {
	mu   sync.Mutex
	hops []string
}

func (r *hopRecorder) answer(c *rpcport.Conn, f netio.Frame, hop string) {
	r.mu.Lock()
	r.hops = append(r.hops, hop)
	r.mu.Unlock()
	noSuchGroup(c, f, hop)
}

func (r *hopRecorder) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.hops...)
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
// meant and that the node has the key; after it, the node trusts the hop
// mark of the dialer's calls.
func TestHelloMutual(t *testing.T) {
	const other = "another-key-0123456789"
	cases := []struct {
		name               string
		dialerKey, nodeKey string
		want               string // node id the dialer expects
		refused            bool
	}{
		{name: "same key", dialerKey: testKey, nodeKey: testKey, want: "n1"},
		{name: "no key on either", want: "n1"},
		{name: "another key", dialerKey: testKey, nodeKey: other, want: "n1", refused: true},
		{name: "node without key", dialerKey: testKey, want: "n1", refused: true},
		{name: "dialer without key", nodeKey: testKey, want: "n1", refused: true},
		{name: "another node", dialerKey: testKey, nodeKey: testKey, want: "n2", refused: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var rec hopRecorder
			n := startFakeNode(t, "n1", tc.nodeKey, rec.answer)
			var key []byte
			if tc.dialerKey != "" {
				key = []byte(tc.dialerKey)
			}
			nc, fr, err := dial(context.Background(), n.addr, "n0", tc.want, key, DefaultUserTimeout)
			if tc.refused {
				if !errors.Is(err, ErrHelloRefused) {
					t.Fatalf("dial = %v, want a refused hello", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer nc.Close()
			if code, err := forwardedCall(nc, fr, 7); err != nil || code != netio.CodeNoSuchGroup {
				t.Fatalf("forwarded call: %v, %v", code, err)
			}
			if hops := rec.seen(); len(hops) != 1 || hops[0] != "n0" {
				t.Errorf("hop marks %q, want the call trusted as from n0", hops)
			}
		})
	}
}

// TestHelloRefusesAForgedProof: a dialer that says hello and answers the
// challenge with a proof made without the key is refused and counted, and
// the connection is closed; a forwarded call it sends before the close
// takes effect is not trusted.
func TestHelloRefusesAForgedProof(t *testing.T) {
	var rec hopRecorder
	n := startFakeNode(t, "n1", testKey, rec.answer)
	nc, err := net.Dial("tcp", n.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(testWait))
	var nonce [helloNonceSize]byte
	if _, err := nc.Write(helloFrame(nil, "n0", helloStepHello, nonce[:])); err != nil {
		t.Fatal(err)
	}
	fr := netio.NewFrameReader(nc, 4<<10)
	if _, _, err := readHelloStep(fr, helloStepChallenge); err != nil {
		t.Fatal(err)
	}
	_, _ = nc.Write(helloFrame(nil, "", helloStepProof, bytes.Repeat([]byte{1}, helloMACSize)))
	if _, _, err := readHelloStep(fr, helloStepWelcome); !errors.Is(err, ErrHelloRefused) {
		t.Errorf("forged proof: %v, want refused", err)
	}
	_, _ = forwardedCall(nc, fr, 1)
	if k := n.refused.Get(); k != 1 {
		t.Errorf("%d hellos refused, want 1", k)
	}
	for _, h := range rec.seen() {
		if h != "" {
			t.Errorf("a call after a refused hello was trusted as forwarded from %q", h)
		}
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

// TestChaosReplayedHello records what a real pool sends on its connection
// to a node (the hello, then a forwarded call) and replays it byte for
// byte on a new connection. The replayed call must not be taken as
// forwarded: the node's nonce is new, the recorded proof does not fit it,
// the hello is refused and counted, and the call is not trusted.
func TestChaosReplayedHello(t *testing.T) {
	var rec hopRecorder
	n1 := startFakeNode(t, "n1", testKey, rec.answer)
	proxy := startRecordingProxy(t, n1.addr)
	_, viaN0 := startTransferSide(t, "n0", testKey, 1, func(string) (string, string) { return "n1", proxy.addr })
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
	if hops := rec.seen(); len(hops) != 1 || hops[0] != "n0" {
		t.Fatalf("n1 saw hop marks %q, want the one forwarded call from n0", hops)
	}
	recording := proxy.recorded()

	replay, err := net.Dial("tcp", n1.addr)
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
	hops := rec.seen()
	trusted := 0
	for _, h := range hops[1:] {
		if h != "" {
			trusted++
			t.Errorf("after the replay n1 saw hop marks %q: the replayed call was taken as forwarded", hops)
		}
	}
	if k := n1.refused.Get(); k != 1 {
		t.Errorf("refused hellos %d, want 1 (answers to the replay: %v)", k, answers)
	}
	t.Logf("chaos figures: replayed hello: %d bytes of a real pool's connection replayed; calls seen after it %d, trusted as forwarded %d; hellos refused %d",
		len(recording), len(hops)-1, trusted, n1.refused.Get())
}
