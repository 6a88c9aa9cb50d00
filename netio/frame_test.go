package netio

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	long := strings.Repeat("g", 300)
	cases := []struct {
		name             string
		h                Header
		group, service   string
		payload          []byte
		wantGrp, wantSvc string
	}{
		{"call", Header{Kind: KindCall, ID: 1, TimeoutMs: 3000}, "grp", "svc", []byte("hello"), "grp", "svc"},
		{"forwarded-balanced", Header{Kind: KindCall, Flags: FlagBalanced | FlagForwarded, ID: 7}, "grp", "svc", []byte("x"), "grp", "svc"},
		{"no-reply-empty", Header{Kind: KindCallNoReply, ID: 1<<64 - 1}, "", "", nil, "", ""},
		{"reply", Header{Kind: KindReply, ID: 42}, "", "", []byte{0, 1, 2}, "", ""},
		{"error", Header{Kind: KindError, Code: CodeServerBusy, ID: 9}, "", "", []byte("queue full"), "", ""},
		{"lookup", Header{Kind: KindNameLookup}, "g", "", nil, "g", ""},
		{"announce", Header{Kind: KindAnnounce, TimeoutMs: 1<<32 - 1}, "", "s", bytes.Repeat([]byte{7}, 70000), "", "s"},
		{"long-names-truncated", Header{Kind: KindCall}, long, long, nil, long[:MaxNameLen], long[:MaxNameLen]},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			prefix := []byte("prefix")
			b := AppendFrame(bytes.Clone(prefix), tc.h, tc.group, tc.service, tc.payload)
			if !bytes.HasPrefix(b, prefix) {
				t.Fatal("AppendFrame clobbered dst")
			}
			b = b[len(prefix):]
			// Two frames back to back: Decode must stop at the first.
			b2 := append(bytes.Clone(b), b...)
			n, err := FrameLen(b2, 1<<20)
			if err != nil || n != len(b) {
				t.Fatalf("FrameLen = %d, %v; want %d", n, err, len(b))
			}
			f, m, err := Decode(b2, 1<<20)
			if err != nil || m != len(b) {
				t.Fatalf("Decode = %d, %v; want %d", m, err, len(b))
			}
			if f.Header != tc.h || string(f.Group) != tc.wantGrp || string(f.Service) != tc.wantSvc || !bytes.Equal(f.Payload, tc.payload) {
				t.Fatalf("round trip: got %+v", f.Header)
			}
			for cut := range len(b) {
				if _, _, err := Decode(b[:cut], 1<<20); !errors.Is(err, ErrShort) {
					t.Fatalf("Decode of %d/%d bytes: %v, want ErrShort", cut, len(b), err)
				}
			}
		})
	}
}

func TestFrameErrors(t *testing.T) {
	good := AppendFrame(nil, Header{Kind: KindCall, ID: 1}, "g", "s", []byte("12345"))
	mod := func(off int, v byte) []byte { b := bytes.Clone(good); b[off] = v; return b }
	cases := []struct {
		name string
		b    []byte
		max  int
		want error
	}{
		{"empty", nil, 100, ErrShort},
		{"magic", mod(0, 'x'), 100, ErrBadMagic},
		{"version", mod(2, 2), 100, ErrBadVersion},
		{"kind-0", mod(3, 0), 100, ErrBadKind},
		{"kind-8", mod(3, 8), 100, ErrBadKind},
		{"too-big", good, 4, ErrFrameSize},
		{"at-limit", good, 5, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := FrameLen(tc.b, tc.max); !errors.Is(err, tc.want) {
				t.Errorf("FrameLen: %v, want %v", err, tc.want)
			}
			if _, _, err := Decode(tc.b, tc.max); !errors.Is(err, tc.want) {
				t.Errorf("Decode: %v, want %v", err, tc.want)
			}
		})
	}
}

func TestAppendReplyError(t *testing.T) {
	b := AppendReply([]byte("x"), 5, []byte("pay"))
	b = AppendError(b, 6, CodeTimedOut, "watch_time passed")
	b = AppendError(b, 7, CodeProtocol, "")
	b = b[1:]
	f, n, err := Decode(b, 100)
	if err != nil || f.Kind != KindReply || f.ID != 5 || string(f.Payload) != "pay" {
		t.Fatalf("reply: %+v %v", f, err)
	}
	b = b[n:]
	f, n, err = Decode(b, 100)
	if err != nil || f.Kind != KindError || f.ID != 6 || f.Code != CodeTimedOut || string(f.Payload) != "watch_time passed" {
		t.Fatalf("error: %+v %v", f, err)
	}
	b = b[n:]
	f, n, err = Decode(b, 100)
	if err != nil || f.Kind != KindError || f.ID != 7 || f.Code != CodeProtocol || len(f.Payload) != 0 || n != len(b) {
		t.Fatalf("empty error: %+v %v", f, err)
	}
	e := &Error{Code: f.Code}
	if !errors.Is(e, &Error{Code: CodeProtocol}) || errors.Is(e, &Error{Code: CodeTimedOut}) {
		t.Error("Error.Is does not match on code")
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(AppendFrame(nil, Header{Kind: KindCall, ID: 1, TimeoutMs: 10}, "grp", "svc", []byte("payload")), 1024)
	f.Add(AppendFrame(nil, Header{Kind: KindError, Code: CodeServerBusy}, "", "", nil), 0)
	f.Add(AppendFrame(nil, Header{Kind: KindCall, Flags: FlagBalanced | FlagForwarded, ID: 9}, "g", "s", []byte("fwd")), 64)
	f.Add(AppendFrame(nil, Header{Kind: KindReply}, "", "", []byte("x"))[:HeaderSize+0], 16)
	f.Add(AppendFrame(nil, Header{Kind: KindCall}, "g", "s", []byte("x"))[:10], 16)
	f.Add([]byte("TP\x01\x09garbage garbage garbage"), 16)
	f.Add([]byte("XX\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\xff\xff\xff\xff"), 1<<30)
	f.Add([]byte{}, -1)
	f.Fuzz(func(t *testing.T, b []byte, maxPayload int) {
		n, lerr := FrameLen(b, maxPayload)
		fr, m, derr := Decode(b, maxPayload)
		switch {
		case lerr != nil:
			if derr != lerr {
				t.Fatalf("FrameLen error %v, Decode error %v", lerr, derr)
			}
		case n > len(b):
			if !errors.Is(derr, ErrShort) {
				t.Fatalf("FrameLen %d > %d bytes but Decode: %v", n, len(b), derr)
			}
		default:
			if derr != nil || m != n {
				t.Fatalf("FrameLen %d, Decode %d, %v", n, m, derr)
			}
			if n < HeaderSize || len(fr.Group) != int(b[5]) || len(fr.Service) != int(b[6]) {
				t.Fatalf("bad frame lengths")
			}
			// Re-encoding the decoded frame gives the same bytes, flags
			// included.
			enc := AppendFrame(nil, fr.Header, string(fr.Group), string(fr.Service), fr.Payload)
			if !bytes.Equal(enc, b[:n]) {
				t.Fatalf("re-encode differs:\n%x\n%x", enc, b[:n])
			}
			fr2, m2, err := Decode(enc, maxPayload)
			if err != nil || m2 != n || fr2.Header != fr.Header || !bytes.Equal(fr2.Payload, fr.Payload) ||
				!bytes.Equal(fr2.Group, fr.Group) || !bytes.Equal(fr2.Service, fr.Service) {
				t.Fatalf("round trip: %+v %v", fr2.Header, err)
			}
		}
		// Whatever the input, encoding then decoding round-trips.
		if len(b) >= 3 {
			h := Header{Kind: Kind(b[0]%6 + 1), Flags: Flags(b[1] >> 4), Code: Code(b[1]), ID: uint64(len(b)) << 7, TimeoutMs: uint32(b[2])}
			grp, svc := string(b[:len(b)/3]), string(b[len(b)/3:2*len(b)/3])
			pay := b[2*len(b)/3:]
			enc := AppendFrame(nil, h, grp, svc, pay)
			fr, m, err := Decode(enc, len(pay))
			if err != nil || m != len(enc) || fr.Header != h || string(fr.Group) != grp[:min(len(grp), MaxNameLen)] ||
				string(fr.Service) != svc[:min(len(svc), MaxNameLen)] || !bytes.Equal(fr.Payload, pay) {
				t.Fatalf("encode/decode: %+v %d %v", fr.Header, m, err)
			}
		}
	})
}
