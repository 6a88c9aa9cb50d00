package netio

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Frame layout, big-endian, HeaderSize bytes then group, service and payload:
//
//	off size field
//	 0   2   magic      0x5450 ("TP")
//	 2   1   version    1
//	 3   1   kind       Kind
//	 4   1   flags      Flags
//	 5   1   group len
//	 6   1   service len
//	 7   1   code       Code (KindError only)
//	 8   8   request id chosen by the caller, echoed in the answer
//	16   4   timeout    milliseconds the caller waits; 0 = the server's watch_time
//	20   4   payload len
const (
	HeaderSize = 24
	Magic      = 0x5450
	Version    = 1
)

// Kind says what a frame carries.
type Kind uint8

const (
	KindCall        Kind = 1 // request, answered by KindReply or KindError
	KindCallNoReply Kind = 2 // request, never answered
	KindReply       Kind = 3 // successful answer; payload is the service's reply
	KindError       Kind = 4 // failed answer; Code says why, payload is a message
	KindNameLookup  Kind = 5 // reserved for the name service
	KindAnnounce    Kind = 6 // reserved for load-level announcements
	// KindGoAway (id 0, from a node) tells the caller to send no new call
	// on this connection and to close it once every answer it waits for
	// has come: the node is handing its port to a new process.
	KindGoAway = 7
	kindMax    = KindGoAway
)

func (k Kind) String() string {
	switch k {
	case KindCall:
		return "call"
	case KindCallNoReply:
		return "call-no-reply"
	case KindReply:
		return "reply"
	case KindError:
		return "error"
	case KindNameLookup:
		return "name-lookup"
	case KindAnnounce:
		return "announce"
	case KindGoAway:
		return "go-away"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Flags say how a call reached this node, for the node-choice rules.
type Flags uint8

const (
	// FlagBalanced marks a call whose sender already chose this node (a
	// balancing client): it is served here unless the group is held, or
	// LEVEL2 while another node is lower.
	FlagBalanced Flags = 1 << iota
	// FlagForwarded marks a call another node transferred here: the hop
	// mark. It is served here or refused, never transferred again.
	FlagForwarded
	// FlagDestination marks a call to an explicit destination: the caller
	// named this node (OpenTP1's RPC with a destination), so it is served
	// here or refused, never balanced or transferred.
	FlagDestination
	// FlagSchedulerDirect marks a call from a scheduler-direct client
	// (dcscddirect = Y): the node balances it with schedule_rate
	// weighting LEVEL0 against LEVEL1 nodes, which the documents give only
	// for such calls (000). Any other call the node balances goes to the
	// least-loaded node (Table 3-7).
	FlagSchedulerDirect
)

// Header is the fixed part of a frame.
type Header struct {
	Kind      Kind
	Flags     Flags
	Code      Code
	ID        uint64
	TimeoutMs uint32
}

// Frame is one decoded frame. Group, Service and Payload alias the buffer
// it was decoded from and are valid only as long as that buffer is.
type Frame struct {
	Header
	Group   []byte
	Service []byte
	Payload []byte
}

// Decoding errors. ErrShort is not a protocol error: more bytes are needed.
var (
	ErrShort      = errors.New("netio: short frame")
	ErrBadMagic   = errors.New("netio: bad magic")
	ErrBadVersion = errors.New("netio: unsupported version")
	ErrBadKind    = errors.New("netio: unknown frame kind")
	ErrFrameSize  = errors.New("netio: frame larger than the limit")
)

// FrameLen reports the total length of the frame at the start of b, checking
// only the header. It returns ErrShort when b holds less than a header and a
// protocol error when the header is bad or the frame exceeds maxPayload.
func FrameLen(b []byte, maxPayload int) (int, error) {
	n, payload, err := CheckHeader(b)
	if err != nil {
		return 0, err
	}
	if uint64(payload) > uint64(maxPayload) {
		return 0, ErrFrameSize
	}
	return int(n), nil
}

// CheckHeader checks the magic, version and kind of the header at the start
// of b and returns the frame's total length and its payload length,
// whatever their size.
func CheckHeader(b []byte) (frameLen int64, payload uint32, err error) {
	if len(b) < HeaderSize {
		return 0, 0, ErrShort
	}
	if binary.BigEndian.Uint16(b[0:2]) != Magic {
		return 0, 0, ErrBadMagic
	}
	if b[2] != Version {
		return 0, 0, ErrBadVersion
	}
	if k := Kind(b[3]); k == 0 || k > kindMax {
		return 0, 0, ErrBadKind
	}
	payload = binary.BigEndian.Uint32(b[20:24])
	return HeaderSize + int64(b[5]) + int64(b[6]) + int64(payload), payload, nil
}

// Decode decodes the frame at the start of b and returns it with its length.
// It returns ErrShort when b does not yet hold the whole frame.
func Decode(b []byte, maxPayload int) (Frame, int, error) {
	n, err := FrameLen(b, maxPayload)
	if err != nil {
		return Frame{}, 0, err
	}
	if len(b) < n {
		return Frame{}, 0, ErrShort
	}
	gl, sl := int(b[5]), int(b[6])
	f := Frame{
		Header:  header(b),
		Group:   b[HeaderSize : HeaderSize+gl : HeaderSize+gl],
		Service: b[HeaderSize+gl : HeaderSize+gl+sl : HeaderSize+gl+sl],
		Payload: b[HeaderSize+gl+sl : n : n],
	}
	return f, n, nil
}

// header reads the fixed fields of the header at the start of b, which
// holds at least HeaderSize bytes.
func header(b []byte) Header {
	return Header{
		Kind:      Kind(b[3]),
		Flags:     Flags(b[4]),
		Code:      Code(b[7]),
		ID:        binary.BigEndian.Uint64(b[8:16]),
		TimeoutMs: binary.BigEndian.Uint32(b[16:20]),
	}
}

// MaxNameLen is the longest group or service name a frame can carry.
const MaxNameLen = 255

// AppendFrame appends one encoded frame to dst. Names longer than
// MaxNameLen are a programming error reported by the caller's validation;
// here they are truncated rather than corrupting the stream.
func AppendFrame(dst []byte, h Header, group, service string, payload []byte) []byte {
	group = group[:min(len(group), MaxNameLen)]
	service = service[:min(len(service), MaxNameLen)]
	var hdr [HeaderSize]byte
	binary.BigEndian.PutUint16(hdr[0:2], Magic)
	hdr[2] = Version
	hdr[3] = byte(h.Kind)
	hdr[4] = byte(h.Flags)
	hdr[5] = byte(len(group))
	hdr[6] = byte(len(service))
	hdr[7] = byte(h.Code)
	binary.BigEndian.PutUint64(hdr[8:16], h.ID)
	binary.BigEndian.PutUint32(hdr[16:20], h.TimeoutMs)
	binary.BigEndian.PutUint32(hdr[20:24], uint32(len(payload)))
	dst = append(dst, hdr[:]...)
	dst = append(dst, group...)
	dst = append(dst, service...)
	return append(dst, payload...)
}

// AppendReply appends a KindReply frame answering request id.
func AppendReply(dst []byte, id uint64, payload []byte) []byte {
	return AppendFrame(dst, Header{Kind: KindReply, ID: id}, "", "", payload)
}

// AppendError appends a KindError frame answering request id with code and
// msg as the payload.
func AppendError(dst []byte, id uint64, code Code, msg string) []byte {
	dst = AppendFrame(dst, Header{Kind: KindError, Code: code, ID: id}, "", "", nil)
	// Patch the payload length rather than convert msg to []byte.
	binary.BigEndian.PutUint32(dst[len(dst)-HeaderSize+20:], uint32(len(msg)))
	return append(dst, msg...)
}
