package rpcport

import (
	"bytes"
	"encoding/binary"
	"io"
	"log/slog"
	"testing"
	"tpsched/netio"

	"github.com/panjf2000/gnet/v2"
)

// frameRecorder keeps a copy of every frame handed to it.
type frameRecorder struct{ frames []netio.Frame }

func (r *frameRecorder) OnFrame(_ *Conn, f netio.Frame) {
	f.Group, f.Service, f.Payload = bytes.Clone(f.Group), bytes.Clone(f.Service), bytes.Clone(f.Payload)
	r.frames = append(r.frames, f)
}
func (r *frameRecorder) OnClose(*Conn) {}

// cutWhole reads stream as one piece by the rules consume follows: the
// frames it holds, the ids answered 'message too big', and whether a bad
// header ends it.
func cutWhole(stream []byte, maxPayload int) (frames []netio.Frame, tooBig []uint64, bad bool) {
	for {
		total, payload, err := netio.CheckHeader(stream)
		if err == netio.ErrShort {
			return
		}
		if err != nil {
			return frames, tooBig, true
		}
		if uint64(payload) > uint64(maxPayload) {
			if k := netio.Kind(stream[3]); k == netio.KindCall || k == netio.KindNameLookup {
				tooBig = append(tooBig, binary.BigEndian.Uint64(stream[8:16]))
			}
			if int64(len(stream)) < total {
				return
			}
			stream = stream[total:]
			continue
		}
		if int64(len(stream)) < total {
			return
		}
		f, n, _ := netio.Decode(stream, maxPayload)
		frames = append(frames, f)
		stream = stream[n:]
	}
}

// FuzzConsume feeds a byte stream to a connection's frame cutter in pieces
// of arbitrary sizes: the frames handed on, the 'message too big' answers
// and the verdict on a bad header must be those of reading it whole, and
// the budget must be charged exactly what the partial frame holds.
func FuzzConsume(f *testing.F) {
	call := netio.AppendFrame(nil, netio.Header{Kind: netio.KindCall, ID: 1, Flags: netio.FlagBalanced}, "grp", "svc", []byte("payload"))
	big := netio.AppendFrame(nil, netio.Header{Kind: netio.KindCall, ID: 2}, "g", "s", make([]byte, 300))
	lookup := netio.AppendFrame(nil, netio.Header{Kind: netio.KindNameLookup, ID: 3}, "g", "", make([]byte, 200))
	f.Add(append(append(bytes.Clone(call), big...), call...), []byte{1, 5, 24, 3, 200}, uint16(100))
	f.Add(append(bytes.Clone(lookup), call...), []byte{7}, uint16(10))
	f.Add(append(bytes.Clone(call), "XXgarbage"...), []byte{30, 1}, uint16(1000))
	f.Add(call[:20], []byte{}, uint16(0))
	f.Fuzz(func(t *testing.T, stream, cuts []byte, maxPayload uint16) {
		rec := &frameRecorder{}
		s := &Port{h: rec, log: slog.New(slog.NewTextHandler(io.Discard, nil)), maxPayload: int(maxPayload),
			budget: 1 << 40, conns: map[*Conn]struct{}{}}
		c := &Conn{srv: s, inTraffic: true, rcv: newReceiver(&receiverGroup{}, 0, 0)}
		closed := false
		for rest, i := stream, 0; len(rest) > 0 && !closed; i++ {
			k := len(rest)
			if len(cuts) > 0 {
				k = min(int(cuts[i%len(cuts)])+1, len(rest))
			}
			closed = c.consume(rest[:k]) != gnet.None
			rest = rest[k:]
			if got, want := c.partCharge.Load(), int64(cap(c.part)); got != want || s.held.Load() != want {
				t.Fatalf("charged %d (server %d), the partial frame holds %d", got, s.held.Load(), want)
			}
		}
		frames, tooBig, bad := cutWhole(stream, int(maxPayload))
		if closed != bad {
			t.Fatalf("closed %v, reading it whole says bad %v", closed, bad)
		}
		if len(rec.frames) != len(frames) {
			t.Fatalf("%d frames handed on, %d in the stream", len(rec.frames), len(frames))
		}
		for i, fr := range frames {
			got := rec.frames[i]
			if got.Header != fr.Header || !bytes.Equal(got.Group, fr.Group) || !bytes.Equal(got.Service, fr.Service) ||
				!bytes.Equal(got.Payload, fr.Payload) {
				t.Fatalf("frame %d: %+v, want %+v", i, got.Header, fr.Header)
			}
		}
		var answered []uint64
		for b := c.batch; len(b) > 0; {
			ans, n, err := netio.Decode(b, 1<<20)
			if err != nil || ans.Kind != netio.KindError || ans.Code != netio.CodeMessageTooBig {
				t.Fatalf("answer %+v, %v: want 'message too big'", ans.Header, err)
			}
			answered = append(answered, ans.ID)
			b = b[n:]
		}
		if len(answered) != len(tooBig) {
			t.Fatalf("answered 'message too big' to %v, want %v", answered, tooBig)
		}
		for i := range tooBig {
			if answered[i] != tooBig[i] {
				t.Fatalf("answered 'message too big' to %v, want %v", answered, tooBig)
			}
		}
	})
}
