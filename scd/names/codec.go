package names

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"sync"

	"tpsched/scd/loadlevel"
)

// The announce message; the package comment draws it.
const (
	msgVersion = 1
	headerSize = 2 // version, flags
	tagSize    = sha256.Size

	flagTagged = 1 << 0 // in flags: a tag follows
	flagWLM    = 1 << 1 // in flags: the routing manager's part follows the groups (wlm.go)

	nodeAnnounce = 1 << 0 // in the node bits: scd_announce_server_status=Y

	stateLevel  = 0b11   // in a group's state byte: the load level
	stateHeld   = 1 << 2 // in a group's state byte: held
	stateSocket = 1 << 3 // in a group's state byte: receive_from=socket

	// minGroupSize is the fewest bytes a group takes (a name length, one
	// byte of name, the state byte); Decode checks a group count against
	// it before it allocates.
	minGroupSize = 3
)

// Decode errors, always wrapped with what was wrong.
var (
	// ErrUnauthenticated: the codec has a key and the message carries no
	// tag, or a tag that key did not make.
	ErrUnauthenticated = errors.New("names: unauthenticated announce")
	// ErrMalformed: the bytes are no announce this version writes.
	ErrMalformed = errors.New("names: malformed announce")
)

// Codec writes and reads announce messages. It is safe for concurrent use.
type Codec struct {
	macs *sync.Pool // of *macState; nil without a key
}

// macState is one HMAC-SHA256 keyed with the codec's key, reused because
// hmac.New allocates and Decode runs for every message gossip delivers.
type macState struct {
	h   hash.Hash
	sum [tagSize]byte
}

// NewCodec returns a codec that tags messages with HMAC-SHA256 under key
// and rejects messages without the right tag. Every node of a cluster needs
// the same key; 32 random bytes are right. With a nil or empty key messages
// go untagged and every message is trusted. NewCodec keeps its own copy of
// key.
func NewCodec(key []byte) *Codec {
	if len(key) == 0 {
		return &Codec{}
	}
	key = bytes.Clone(key)
	return &Codec{macs: &sync.Pool{New: func() any {
		return &macState{h: hmac.New(sha256.New, key)}
	}}}
}

// Authenticated reports whether the codec has a key: whether it tags what
// it encodes and checks what it decodes.
func (c *Codec) Authenticated() bool { return c.macs != nil }

// Encode appends the announce message for info to dst and returns the
// extended slice. It does not check info: an info that Apply would refuse
// gives a message that Decode refuses. When info.Announce is false every
// level is sent as LEVEL0, whatever info holds.
func (c *Codec) Encode(dst []byte, info NodeInfo) []byte {
	start := len(dst)
	var flags byte
	if info.WLM != nil {
		flags |= flagWLM
	}
	if c.macs == nil {
		dst = append(dst, msgVersion, flags)
		return appendBody(dst, &info)
	}
	dst = append(dst, msgVersion, flags|flagTagged)
	dst = append(dst, make([]byte, tagSize)...)
	dst = appendBody(dst, &info)
	var tag [tagSize]byte
	c.tag(&tag, dst[start:start+headerSize], dst[start+headerSize+tagSize:])
	copy(dst[start+headerSize:], tag[:])
	return dst
}

// tag computes the tag of a message from its header and body.
func (c *Codec) tag(tag *[tagSize]byte, header, body []byte) {
	m := c.macs.Get().(*macState)
	m.h.Reset()
	m.h.Write(header)
	m.h.Write(body)
	m.h.Sum(m.sum[:0])
	*tag = m.sum
	c.macs.Put(m)
}

func appendBody(dst []byte, info *NodeInfo) []byte {
	dst = appendString(dst, info.Node)
	dst = appendString(dst, info.Addr)
	dst = binary.BigEndian.AppendUint64(dst, info.Boot)
	dst = binary.AppendUvarint(dst, info.Seq)
	var bits byte
	if info.Announce {
		bits |= nodeAnnounce
	}
	dst = append(dst, bits)
	dst = binary.AppendUvarint(dst, uint64(len(info.Groups)))
	for _, g := range info.Groups {
		dst = appendString(dst, g.Group)
		var state byte
		if info.Announce {
			// A level above Level2 becomes 3, which Decode refuses,
			// rather than wrapping to a level that looks right.
			state = byte(min(g.Level, stateLevel))
		}
		if g.Held {
			state |= stateHeld
		}
		if g.Socket {
			state |= stateSocket
		}
		dst = append(dst, state)
	}
	if info.WLM != nil {
		dst = appendWLM(dst, info)
	}
	return dst
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// Decode reads one announce message, which must fill b. Errors wrap
// ErrUnauthenticated or ErrMalformed; the NodeInfo returned with nil is one
// Apply accepts. Decode never panics, and allocates at most twice: one
// string holding every name of the message, and the Groups slice, both
// bounded by len(b). The result does not alias b.
func (c *Codec) Decode(b []byte) (NodeInfo, error) {
	if len(b) < headerSize {
		return NodeInfo{}, fmt.Errorf("%w: %d bytes, shorter than the header", ErrMalformed, len(b))
	}
	if b[0] != msgVersion {
		return NodeInfo{}, fmt.Errorf("%w: version %d (this node reads version %d)", ErrMalformed, b[0], msgVersion)
	}
	if flags := b[1]; flags&^(flagTagged|flagWLM) != 0 {
		return NodeInfo{}, fmt.Errorf("%w: unknown flags %#x", ErrMalformed, flags)
	}
	body := b[headerSize:]
	switch {
	case b[1]&flagTagged != 0:
		if len(body) < tagSize {
			return NodeInfo{}, fmt.Errorf("%w: tag cut short at %d of %d bytes", ErrMalformed, len(body), tagSize)
		}
		got := body[:tagSize]
		body = body[tagSize:]
		if c.macs == nil {
			break // an unkeyed node cannot check the tag
		}
		var want [tagSize]byte
		c.tag(&want, b[:headerSize], body)
		if !hmac.Equal(got, want[:]) {
			return NodeInfo{}, fmt.Errorf("%w: tag does not match (do the nodes' announce keys differ?)", ErrUnauthenticated)
		}
	case c.macs != nil:
		return NodeInfo{}, fmt.Errorf("%w: no tag (the sender has no announce key?)", ErrUnauthenticated)
	}
	return decodeBody(body, len(b)-len(body), b[1]&flagWLM != 0)
}

// decodeBody reads a message body, which starts at byte base of the
// message; withWLM says the routing manager's part follows the groups.
func decodeBody(body []byte, base int, withWLM bool) (NodeInfo, error) {
	r := reader{s: string(body), base: base}
	var info NodeInfo
	info.Node = r.readString("node id")
	info.Addr = r.readString("address")
	info.Boot = r.readUint64("boot")
	info.Seq = r.readUvarint("seq")
	bits := r.readByte("node bits")
	if bits&^nodeAnnounce != 0 {
		r.fail("node bits", "unknown bits %#x", bits)
	}
	info.Announce = bits&nodeAnnounce != 0
	n := r.readUvarint("group count")
	switch left := uint64(len(r.s) - r.off); {
	case r.err != nil:
	case n > maxGroups:
		r.fail("group count", "%d service groups (at most %d)", n, maxGroups)
	case n > left/minGroupSize:
		r.fail("group count", "%d service groups cannot fit in %d bytes", n, left)
	case n > 0:
		info.Groups = make([]GroupInfo, n)
	}
	for i := range info.Groups {
		if r.err != nil {
			break
		}
		g := &info.Groups[i]
		g.Group = r.readString("service group name")
		state := r.readByte("service group state")
		g.Level = loadlevel.Level(state & stateLevel)
		g.Held = state&stateHeld != 0
		g.Socket = state&stateSocket != 0
		switch {
		case state&^(stateLevel|stateHeld|stateSocket) != 0:
			r.fail("service group state", "unknown bits %#x", state)
		case g.Level > loadlevel.Level2:
			r.fail("service group state", "load level %d", g.Level)
		case g.Level != loadlevel.Level0 && !info.Announce:
			r.fail("service group state", "%v from a node that announces no load", g.Level)
		}
	}
	if withWLM && r.err == nil {
		info.WLM = readWLM(&r, info.Groups)
	}
	if r.err == nil && r.off != len(r.s) {
		r.fail("end", "%d bytes after the last service group", len(r.s)-r.off)
	}
	if r.err != nil {
		return NodeInfo{}, r.err
	}
	if err := info.validate(); err != nil {
		return NodeInfo{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return info, nil
}

// reader reads a message body held in one string, so that every name it
// returns is a substring of it and costs no allocation. After the first
// error every read returns zero.
type reader struct {
	s     string
	off   int
	start int // where the field read last begins, for errors
	base  int // offset of s in the message, for errors
	err   error
}

func (r *reader) fail(what, format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s at byte %d: %s", ErrMalformed, what, r.base+r.start, fmt.Sprintf(format, args...))
	}
}

func (r *reader) readByte(what string) byte {
	if r.err != nil {
		return 0
	}
	r.start = r.off
	if r.off >= len(r.s) {
		r.fail(what, "message ends")
		return 0
	}
	r.off++
	return r.s[r.off-1]
}

func (r *reader) readUint64(what string) uint64 {
	if r.err != nil {
		return 0
	}
	r.start = r.off
	if len(r.s)-r.off < 8 {
		r.fail(what, "message ends")
		return 0
	}
	var x uint64
	for i := range 8 {
		x = x<<8 | uint64(r.s[r.off+i])
	}
	r.off += 8
	return x
}

// readUvarint reads what binary.AppendUvarint writes and nothing else: an
// overlong encoding is an error, so that one NodeInfo has one encoding.
func (r *reader) readUvarint(what string) uint64 {
	if r.err != nil {
		return 0
	}
	r.start = r.off
	var x uint64
	for i, shift := 0, uint(0); ; i, shift = i+1, shift+7 {
		if r.off+i >= len(r.s) {
			r.fail(what, "message ends")
			return 0
		}
		c := r.s[r.off+i]
		if i == binary.MaxVarintLen64-1 && c > 1 {
			r.fail(what, "overflows 64 bits")
			return 0
		}
		if c < 0x80 {
			if c == 0 && i > 0 {
				r.fail(what, "overlong uvarint")
				return 0
			}
			r.off += i + 1
			return x | uint64(c)<<shift
		}
		x |= uint64(c&0x7f) << shift
	}
}

func (r *reader) readString(what string) string {
	n := r.readUvarint(what)
	switch {
	case r.err != nil:
		return ""
	case n > maxNameLen:
		r.fail(what, "%d bytes (at most %d)", n, maxNameLen)
		return ""
	case n > uint64(len(r.s)-r.off):
		r.fail(what, "%d bytes but the message ends after %d", n, len(r.s)-r.off)
		return ""
	}
	s := r.s[r.off : r.off+int(n)]
	r.off += int(n)
	return s
}
