// Package sockwire is the wire format of socket mode (receive_from =
// socket), shared by the UAP side (package shm) and the scheduler side
// (package shm/sockmode), so that neither can drift from the other.
//
// Every message is a 24-byte little-endian header, then the entry name (a
// request only), then the payload (a request or a reply only):
//
//	offset 0  u8   kind
//	offset 1  u8   status (reply), flags (hello: 1 = refresh mode, the UAP
//	               serves one request and leaves); 0 otherwise
//	offset 2  u16  entry name length (request, <= 32; 0 otherwise)
//	offset 4  u32  payload length (request, reply, <= max_message_size; 0 otherwise)
//	offset 8  u64  a: pid (hello), max_message_size (welcome), dispatch
//	               number (request, reply)
//	offset 16 u64  b: wire version (hello, welcome), deadline in unix ns,
//	               0 for none (request); 0 otherwise
//
// Kinds, in the order a connection sees them:
//
//	1 hello   UAP -> node  first message, sent by Attach
//	2 welcome node -> UAP  answer to hello; Attach returns after it
//	3 request node -> UAP  one at a time: the next only after the reply
//	4 reply   UAP -> node  status and payload of the request in hand
//	5 stop    node -> UAP  leave after the request in hand
//	6 close   node -> UAP  the node is stopping: leave once you hold no request
//	7 bye     UAP -> node  the UAP leaves cleanly (stop, close, refresh)
//
// A message of an unknown or unexpected kind, a name over 32 bytes, a
// payload over max_message_size, a reply for a request other than the one
// in hand, or non-zero fields where the kind has none is a protocol error:
// the side that reads it closes its end.
package sockwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Sizes and limits.
const (
	HeaderSize = 24
	Version    = 2
	MaxName    = 32
	BufSize    = 64 << 10 // of the buffered reader on each side
)

// Message kinds.
const (
	KindHello   = 1
	KindWelcome = 2
	KindRequest = 3
	KindReply   = 4
	KindStop    = 5
	KindClose   = 6
	KindBye     = 7
)

// HelloRefresh is the hello flag of a process that serves one request.
const HelloRefresh = 1

// ErrProtocol marks a message that breaks the protocol.
var ErrProtocol = errors.New("socket protocol error")

// Msg is a message header.
type Msg struct {
	Kind    uint8
	Status  uint8
	NameLen uint16
	PayLen  uint32
	A, B    uint64
}

// Put writes m into h (HeaderSize bytes).
func Put(h []byte, m Msg) {
	h[0], h[1] = m.Kind, m.Status
	binary.LittleEndian.PutUint16(h[2:], m.NameLen)
	binary.LittleEndian.PutUint32(h[4:], m.PayLen)
	binary.LittleEndian.PutUint64(h[8:], m.A)
	binary.LittleEndian.PutUint64(h[16:], m.B)
}

// Read reads one header into h and checks the limits every kind shares: a
// name only in a request, a payload only in a request or reply and never
// over maxMsg, a status only in a reply (below statusEnd) or a hello flag.
func Read(r io.Reader, h []byte, maxMsg uint64, statusEnd uint8) (Msg, error) {
	if _, err := io.ReadFull(r, h[:HeaderSize]); err != nil {
		return Msg{}, err
	}
	m := Msg{
		Kind:    h[0],
		Status:  h[1],
		NameLen: binary.LittleEndian.Uint16(h[2:]),
		PayLen:  binary.LittleEndian.Uint32(h[4:]),
		A:       binary.LittleEndian.Uint64(h[8:]),
		B:       binary.LittleEndian.Uint64(h[16:]),
	}
	switch {
	case m.Kind < KindHello || m.Kind > KindBye:
		return m, fmt.Errorf("%w: unknown message kind %d", ErrProtocol, m.Kind)
	case m.NameLen > MaxName || (m.NameLen != 0 && m.Kind != KindRequest):
		return m, fmt.Errorf("%w: entry name of %d bytes in a message of kind %d", ErrProtocol, m.NameLen, m.Kind)
	case uint64(m.PayLen) > maxMsg:
		return m, fmt.Errorf("%w: message of %d bytes, max_message_size is %d", ErrProtocol, m.PayLen, maxMsg)
	case m.PayLen != 0 && m.Kind != KindRequest && m.Kind != KindReply:
		return m, fmt.Errorf("%w: payload in a message of kind %d", ErrProtocol, m.Kind)
	case m.Kind == KindReply && m.Status >= statusEnd:
		return m, fmt.Errorf("%w: reply status %d", ErrProtocol, m.Status)
	case m.Status != 0 && m.Kind != KindReply && !(m.Kind == KindHello && m.Status == HelloRefresh):
		return m, fmt.Errorf("%w: status in a message of kind %d", ErrProtocol, m.Kind)
	}
	return m, nil
}
