package names

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"tpsched/scd/loadlevel"
)

var (
	testKey  = []byte("0123456789abcdef0123456789abcdef")
	otherKey = []byte("fedcba9876543210fedcba9876543210")
)

// typical is a node running 4 service groups with 8-byte names.
func typical() NodeInfo {
	return NodeInfo{
		Node: "node017", Addr: "10.0.0.17:7000", Announce: true,
		Boot: 1_764_000_000_123_456_789, Seq: 1234,
		Groups: []GroupInfo{
			{Group: "accounts"},
			{Group: "invoices", Level: loadlevel.Level1},
			{Group: "payments", Level: loadlevel.Level2, Held: true},
			{Group: "shipping", Socket: true},
		},
	}
}

// withWLM is info from a node with a service policy: performance indexes,
// spare CPU and two application environments, one of them served.
func withWLM(info NodeInfo) NodeInfo {
	info.Groups = slices.Clone(info.Groups)
	info.Groups[0].PI = 85
	info.Groups[2].PI = 230
	info.WLM = &WLMInfo{
		Spare: [Importances]uint32{1950, 1950, 700, 50, 0},
		Envs:  []EnvInfo{{Env: "accounts", Epoch: 2, HWM: 3}, {Env: "reports", Epoch: 1, Quiesced: true}},
	}
	return info
}

func TestCodecRoundTrip(t *testing.T) {
	longest := strings.Repeat("\xff", maxNameLen)
	many := make([]GroupInfo, maxGroups)
	for i := range many {
		many[i] = GroupInfo{Group: fmt.Sprintf("group%04d", i), Level: loadlevel.Level(i % 3), Held: i%5 == 0, Socket: i%7 == 0}
	}
	quiet := typical()
	quiet.Announce = false
	quietWant := typical()
	quietWant.Announce = false
	for i := range quietWant.Groups {
		quietWant.Groups[i].Level = loadlevel.Level0
	}
	cases := []struct {
		name string
		info NodeInfo
		want NodeInfo // what Decode returns; the zero value means info
	}{
		{"typical", typical(), NodeInfo{}},
		{"no groups, no address", NodeInfo{Node: "a"}, NodeInfo{}},
		{"announces no load: levels sent as LEVEL0", quiet, quietWant},
		{"largest numbers", NodeInfo{Node: "a", Boot: 1<<64 - 1, Seq: 1<<64 - 1, Announce: true}, NodeInfo{}},
		{"longest names, any bytes", NodeInfo{Node: longest, Addr: longest, Announce: true, Groups: []GroupInfo{
			{Group: "\x00"}, {Group: "é"}, {Group: longest, Level: loadlevel.Level2, Held: true, Socket: true},
		}}, NodeInfo{}},
		{"4096 groups", NodeInfo{Node: "a", Announce: true, Groups: many}, NodeInfo{}},
		{"with a service policy", withWLM(typical()), NodeInfo{}},
		{"a service policy, nothing else", NodeInfo{Node: "a", WLM: &WLMInfo{}}, NodeInfo{}},
		{"a service policy, largest numbers", NodeInfo{Node: "a", Groups: []GroupInfo{{Group: "g", PI: maxPI}},
			WLM: &WLMInfo{Spare: [Importances]uint32{1<<32 - 1}, Envs: []EnvInfo{{Env: longest, Epoch: 1<<32 - 1, HWM: 1<<32 - 1, Quiesced: true}}}}, NodeInfo{}},
	}
	for _, tc := range cases {
		want := tc.want
		if want.Node == "" {
			want = tc.info
		}
		for _, key := range [][]byte{nil, testKey} {
			t.Run(fmt.Sprintf("%s/keyed=%v", tc.name, key != nil), func(t *testing.T) {
				c := NewCodec(key)
				prefix := []byte("prefix")
				b := c.Encode(bytes.Clone(prefix), tc.info)
				if !bytes.HasPrefix(b, prefix) {
					t.Fatal("Encode clobbered dst")
				}
				b = b[len(prefix):]
				got, err := c.Decode(b)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("Decode =\n%+v\nwant\n%+v", got, want)
				}
				// The result must not alias the message.
				for i := range b {
					b[i] ^= 0xff
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatal("Decode's result aliases its input")
				}
				if _, err := NewTable("x").Apply(got); err != nil {
					t.Fatalf("Apply refuses what Decode returned: %v", err)
				}
			})
		}
	}
}

func TestCodecAuthentication(t *testing.T) {
	plain, keyed, other := NewCodec(nil), NewCodec(testKey), NewCodec(otherKey)
	if plain.Authenticated() || NewCodec([]byte{}).Authenticated() || !keyed.Authenticated() {
		t.Fatal("Authenticated: want false, false, true")
	}
	tagged := keyed.Encode(nil, typical())
	untagged := plain.Encode(nil, typical())
	if len(tagged) != len(untagged)+tagSize {
		t.Fatalf("tagged %d bytes, untagged %d: want %d more", len(tagged), len(untagged), tagSize)
	}
	flip := func(b []byte, at int, mask byte) []byte { b = bytes.Clone(b); b[at] ^= mask; return b }
	cases := []struct {
		name  string
		codec *Codec
		msg   []byte
		want  error
	}{
		{"keyed reads its own", keyed, tagged, nil},
		{"unkeyed reads tagged, unchecked", plain, tagged, nil},
		{"unkeyed reads untagged", plain, untagged, nil},
		{"unkeyed reads a forged tag, unchecked", plain, flip(tagged, 2, 1), nil},
		{"untagged to keyed", keyed, untagged, ErrUnauthenticated},
		{"tag from another key", other, tagged, ErrUnauthenticated},
		{"forged tag, first byte", keyed, flip(tagged, headerSize, 1), ErrUnauthenticated},
		{"forged tag, last byte", keyed, flip(tagged, headerSize+tagSize-1, 0x80), ErrUnauthenticated},
		{"tagged flag cleared", keyed, flip(tagged, 1, flagTagged), ErrUnauthenticated},
		{"version changed", keyed, flip(tagged, 0, 3), ErrMalformed},
		{"zero tag", keyed, append(append([]byte{msgVersion, flagTagged}, make([]byte, tagSize)...), untagged[headerSize:]...), ErrUnauthenticated},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			info, err := tc.codec.Decode(tc.msg)
			if !errors.Is(err, tc.want) || (err == nil) != (tc.want == nil) {
				t.Fatalf("Decode: %v, want %v", err, tc.want)
			}
			if tc.want == nil && !reflect.DeepEqual(info, typical()) {
				t.Fatalf("Decode = %+v", info)
			}
		})
	}
	// Any change to any byte the tag covers is caught.
	for at := range tagged {
		for _, mask := range []byte{0x01, 0x80} {
			if at == 1 && mask == 0x80 {
				continue // an unknown flag: ErrMalformed, checked above
			}
			if _, err := keyed.Decode(flip(tagged, at, mask)); err == nil {
				t.Errorf("byte %d ^ %#x: accepted", at, mask)
			}
		}
	}
}

func TestCodecTruncated(t *testing.T) {
	for _, key := range [][]byte{nil, testKey} {
		c := NewCodec(key)
		b := c.Encode(nil, typical())
		for cut := range len(b) {
			_, err := c.Decode(b[:cut])
			want := ErrMalformed
			if key != nil && cut >= headerSize+tagSize {
				want = ErrUnauthenticated // the body no longer matches the tag
			}
			if !errors.Is(err, want) {
				t.Errorf("keyed=%v, %d of %d bytes: %v, want %v", key != nil, cut, len(b), err, want)
			}
		}
		// An unkeyed codec reads a truncated tagged message as malformed.
		if key != nil {
			for cut := range len(b) {
				if _, err := NewCodec(nil).Decode(b[:cut]); !errors.Is(err, ErrMalformed) {
					t.Errorf("unkeyed, tagged, %d of %d bytes: %v, want ErrMalformed", cut, len(b), err)
				}
			}
		}
	}
}

// splice returns b with drop bytes at at replaced by ins.
func splice(b []byte, at, drop int, ins ...byte) []byte {
	return slices.Concat(b[:at], ins, b[at+drop:])
}

func TestCodecMalformed(t *testing.T) {
	plain := NewCodec(nil)
	// 0 version, 1 flags, 2 node len, 3 "a", 4 addr len, 5-7 "h:1",
	// 8-15 boot, 16 seq, 17 node bits, 18 count, 19 group len, 20 "g",
	// 21 state.
	good := plain.Encode(nil, NodeInfo{Node: "a", Addr: "h:1", Announce: true, Boot: 1, Seq: 2,
		Groups: []GroupInfo{{Group: "g", Level: loadlevel.Level1}}})
	if len(good) != 22 || good[16] != 2 || good[21] != 1 {
		t.Fatalf("layout changed: % x", good)
	}
	upToCount := good[:18]
	// The same with a service policy: 22 pi, 23-27 spare, 28 env count,
	// 29 env len, 30 "e", 31 state, 32 epoch, 33 hwm.
	gw := plain.Encode(nil, NodeInfo{Node: "a", Addr: "h:1", Announce: true, Boot: 1, Seq: 2,
		Groups: []GroupInfo{{Group: "g", Level: loadlevel.Level1}}, WLM: &WLMInfo{Envs: []EnvInfo{{Env: "e", Epoch: 1, HWM: 2}}}})
	if len(gw) != 34 || gw[1] != flagWLM || gw[30] != 'e' || gw[33] != 2 {
		t.Fatalf("layout with a service policy changed: % x", gw)
	}
	cases := []struct {
		name string
		b    []byte
		want string // in the error
	}{
		{"empty", nil, "0 bytes, shorter than the header"},
		{"version only", good[:1], "shorter than the header"},
		{"version 2", splice(good, 0, 1, 2), "version 2"},
		{"unknown flags", splice(good, 1, 1, 4), "unknown flags 0x4"},
		{"wlm flag without its part", splice(good, 1, 1, flagWLM), "performance index at byte"},
		{"tag cut short", append([]byte{1, flagTagged}, make([]byte, 31)...), "tag cut short at 31 of 32"},
		{"node longer than the message", splice(good, 2, 1, 50), "node id at byte 2: 50 bytes but the message ends after 19"},
		{"node length over 255", splice(good, 2, 1, 0x80, 0x02), "node id at byte 2: 256 bytes (at most 255)"},
		{"empty node id", plain.Encode(nil, NodeInfo{Addr: "h:1"}), "empty node id"},
		{"overlong seq", splice(good, 16, 1, 0x82, 0x00), "seq at byte 16: overlong uvarint"},
		{"seq over 64 bits", splice(good, 16, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02), "seq at byte 16: overflows 64 bits"},
		{"unknown node bits", splice(good, 17, 1, 3), "node bits at byte 17: unknown bits 0x3"},
		{"group count over 4096", binary.AppendUvarint(bytes.Clone(upToCount), 4097), "4097 service groups (at most 4096)"},
		{"group count over the bytes", append(binary.AppendUvarint(bytes.Clone(upToCount), 2), 1, 'g', 0, 1, 'h'), "2 service groups cannot fit in 5 bytes"},
		{"group name over 255", splice(good, 19, 2, 0xac, 0x02), "service group name at byte 19: 300 bytes"},
		{"empty group name", plain.Encode(nil, node("a", 1, 1, GroupInfo{Group: ""}, GroupInfo{Group: "bbbb"})), "service group 0 has an empty name"},
		{"level 3", splice(good, 21, 1, 3), "load level 3"},
		{"unknown state bits", splice(good, 21, 1, 0x11), "unknown bits 0x11"},
		{"level from a node that announces no load", splice(good, 17, 1, 0), "LEVEL1 from a node that announces no load"},
		{"trailing byte", append(bytes.Clone(good), 0), "1 bytes after the last service group"},
		{"unsorted groups", plain.Encode(nil, node("a", 1, 1, GroupInfo{Group: "b"}, GroupInfo{Group: "a"})), `"a" after "b"`},
		{"performance index over 16 bits", splice(gw, 22, 1, 0x80, 0x80, 0x04), "performance index at byte 22: 65536 (at most 65535)"},
		{"environment state bits", splice(gw, 31, 1, 2), "application environment state at byte 31: unknown bits 0x2"},
		{"environments over the bytes", splice(gw, 28, 1, 5), "5 application environments cannot fit in 5 bytes"},
		{"epoch over 32 bits", splice(gw, 32, 1, 0x80, 0x80, 0x80, 0x80, 0x10), "overflow 32 bits"},
		{"wlm part cut short", gw[:33], "high-water mark at byte 33: message ends"},
		{"unsorted environments", plain.Encode(nil, NodeInfo{Node: "a", WLM: &WLMInfo{Envs: []EnvInfo{{Env: "b"}, {Env: "a"}}}}), `application environment "a" after "b"`},
		{"empty environment name", plain.Encode(nil, NodeInfo{Node: "a", WLM: &WLMInfo{Envs: []EnvInfo{{Env: ""}}}}), "application environment 0 has an empty name"},
		{"trailing byte after the wlm part", append(bytes.Clone(gw), 0), "1 bytes after"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			info, err := plain.Decode(tc.b)
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Decode = %+v, %v; want ErrMalformed saying %q", info, err, tc.want)
			}
			if !reflect.DeepEqual(info, NodeInfo{}) {
				t.Fatalf("Decode returned %+v with its error", info)
			}
		})
	}
}

func TestTypicalSize(t *testing.T) {
	plain := len(NewCodec(nil).Encode(nil, typical()))
	tagged := len(NewCodec(testKey).Encode(nil, typical()))
	t.Logf("announce of a node with 4 groups: %d bytes untagged, %d bytes tagged (HMAC-SHA256)", plain, tagged)
	// The layout of the package comment: 2 header + 8 node + 15 address +
	// 8 boot + 2 seq + 1 node bits + 1 count + 4 x 10 per group.
	if plain != 77 || tagged != 77+tagSize {
		t.Errorf("sizes %d and %d, want 77 and %d: update the package comment", plain, tagged, 77+tagSize)
	}
}

func BenchmarkDecode(b *testing.B) {
	for _, key := range [][]byte{nil, testKey} {
		b.Run(fmt.Sprintf("keyed=%v", key != nil), func(b *testing.B) {
			c := NewCodec(key)
			msg := c.Encode(nil, typical())
			b.SetBytes(int64(len(msg)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Decode(msg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkEncode(b *testing.B) {
	for _, key := range [][]byte{nil, testKey} {
		b.Run(fmt.Sprintf("keyed=%v", key != nil), func(b *testing.B) {
			c := NewCodec(key)
			info := typical()
			buf := c.Encode(nil, info)
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			for b.Loop() {
				buf = c.Encode(buf[:0], info)
			}
		})
	}
}

// FuzzDecode: no input panics or allocates beyond its size; whatever an
// unkeyed codec accepts, Apply accepts and Encode writes back byte for byte;
// a keyed codec accepts only what the unkeyed one does; and a NodeInfo made
// from the input round-trips through both codecs.
func FuzzDecode(f *testing.F) {
	f.Add(NewCodec(nil).Encode(nil, typical()))
	f.Add(NewCodec(testKey).Encode(nil, typical()))
	f.Add(NewCodec(otherKey).Encode(nil, typical()))
	f.Add(NewCodec(nil).Encode(nil, NodeInfo{Node: "a"}))
	f.Add(NewCodec(nil).Encode(nil, typical())[:30])
	f.Add(binary.AppendUvarint([]byte{1, 0, 1, 'a', 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1}, 4096))
	f.Add([]byte{1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte("garbage garbage garbage"))
	f.Add([]byte{})
	f.Add(NewCodec(nil).Encode(nil, withWLM(typical())))
	f.Add(NewCodec(testKey).Encode(nil, withWLM(typical())))
	plain, keyed := NewCodec(nil), NewCodec(testKey)
	f.Fuzz(func(t *testing.T, b []byte) {
		info, err := plain.Decode(b)
		kinfo, kerr := keyed.Decode(b)
		if kerr == nil && (err != nil || !reflect.DeepEqual(info, kinfo)) {
			t.Fatalf("keyed codec accepts what the unkeyed one does not: %v", err)
		}
		switch {
		case err != nil:
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("unkeyed Decode: %v, want ErrMalformed", err)
			}
		default:
			if _, err := NewTable("self").Apply(info); err != nil {
				t.Fatalf("Apply refuses what Decode returned: %v", err)
			}
			want := b
			if b[1]&flagTagged != 0 {
				want = slices.Concat([]byte{b[0], b[1] &^ flagTagged}, b[headerSize+tagSize:])
			}
			if enc := plain.Encode(nil, info); !bytes.Equal(enc, want) {
				t.Fatalf("re-encode differs:\n% x\n% x", enc, want)
			}
		}
		// Whatever the input, a NodeInfo made from it round-trips.
		in := infoFrom(b)
		for _, c := range []*Codec{plain, keyed} {
			got, err := c.Decode(c.Encode(nil, in))
			if err != nil || !reflect.DeepEqual(got, in) {
				t.Fatalf("round trip (keyed=%v): %v\n%+v\n%+v", c.Authenticated(), err, got, in)
			}
		}
	})
}

// infoFrom makes a valid NodeInfo out of any bytes: names cut from them,
// levels and flags from their bits.
func infoFrom(b []byte) NodeInfo {
	cut := func(s []byte) string { return string(s[:min(len(s), maxNameLen)]) }
	info := NodeInfo{Node: cut(append([]byte("n"), b...)), Addr: cut(reversed(b)), Seq: uint64(len(b)) << 40}
	if len(b) > 0 {
		info.Announce = b[0]&1 != 0
		info.Boot = uint64(b[0]) << 56
	}
	for i, c := range b {
		g := GroupInfo{Group: string(b[i:min(len(b), i+1+int(c)%12)]), Held: c&4 != 0, Socket: c&8 != 0}
		if info.Announce {
			g.Level = loadlevel.Level(c % 3)
		}
		info.Groups = append(info.Groups, g)
	}
	slices.SortFunc(info.Groups, func(x, y GroupInfo) int { return strings.Compare(x.Group, y.Group) })
	info.Groups = slices.CompactFunc(info.Groups, func(x, y GroupInfo) bool { return x.Group == y.Group })
	if len(info.Groups) > maxGroups {
		info.Groups = info.Groups[:maxGroups]
	}
	return info
}

func reversed(b []byte) []byte {
	r := slices.Clone(b)
	slices.Reverse(r)
	return r
}
