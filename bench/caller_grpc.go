package bench

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/encoding/protowire"
)

// h2Caller makes unary gRPC calls written out by hand over HTTP/2 (one
// stream at a time on one connection), as the HTTP/1.1 and tpsched-frame
// callers are, so the load generator spends on the shared cores about
// what it spends for the other peers; grpc-go's own client costs as much
// CPU per call as the server it measures. The request and the reply are
// protobuf google.protobuf.BytesValue messages, the server is grpc-go.
type h2Caller struct {
	connCaller
	path, authority string

	h2conn   net.Conn // the connection the state below belongs to
	bw       *bufio.Writer
	fr       *http2.Framer
	hbuf     []byte // the request's header block
	henc     *hpack.Encoder
	hblock   headerBuffer
	stream   uint32
	sendConn int64 // flow-control window the server gave for the connection
	sendInit int64 // and for each new stream
	recvUsed int64 // bytes received since the last connection WINDOW_UPDATE we sent
	goAway   bool  // the server is closing the connection
	msg      []byte
	reply    []byte
}

// The windows this client grants the server: a large one so replies never
// wait for us, topped up on the connection when half is used.
const (
	h2Window     = 1 << 30
	h2MaxFrame   = 16 << 10 // what every HTTP/2 peer accepts
	grpcPrefix   = 5        // compressed flag and big-endian length
	grpcStatusOK = "0"
)

// gRPC status codes the bench tells apart.
const (
	grpcDeadlineExceeded  = 4
	grpcResourceExhausted = 8
	grpcUnavailable       = 14
)

type headerBuffer struct{ b *[]byte }

func (h headerBuffer) Write(p []byte) (int, error) { *h.b = append(*h.b, p...); return len(p), nil }

// grpcDialer calls method ("Echo" or "Burn") of bench.Echo at addr.
func grpcDialer(addr, method string) dialer {
	return func() caller {
		c := &h2Caller{connCaller: connCaller{addr: addr}, path: "/bench.Echo/" + method, authority: addr}
		c.hblock = headerBuffer{&c.hbuf}
		return c
	}
}

// setup starts HTTP/2 on a new connection: the preface, our settings and
// the connection window.
func (c *h2Caller) setup(nc net.Conn, r *bufio.Reader) error {
	c.h2conn = nc
	c.bw = bufio.NewWriterSize(nc, 64<<10)
	c.fr = http2.NewFramer(c.bw, r)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.henc = hpack.NewEncoder(c.hblock)
	c.stream, c.sendConn, c.sendInit, c.recvUsed, c.goAway = 0, 65535, 65535, 0, false
	if _, err := c.bw.WriteString(http2.ClientPreface); err != nil {
		return err
	}
	if err := c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: h2Window},
		http2.Setting{ID: http2.SettingEnablePush, Val: 0}); err != nil {
		return err
	}
	if err := c.fr.WriteWindowUpdate(0, h2Window-65535); err != nil {
		return err
	}
	return c.bw.Flush()
}

func (c *h2Caller) Call(payload []byte, deadline time.Time) (outcome, error) {
	if c.stream >= 1<<31-3 {
		c.drop() // stream ids used up: a new connection starts from 1
	}
	nc, r, err := c.conn()
	if err != nil {
		return callFailed, nil
	}
	if nc != c.h2conn {
		if err := c.setup(nc, r); err != nil {
			return c.ioOutcome(err)
		}
	}
	c.setDeadline(nc, deadline)
	if c.stream += 2; c.stream == 2 {
		c.stream = 1 // a client's streams are odd, from 1
	}
	// The message: the gRPC prefix and a BytesValue (field 1, bytes).
	body := protowire.SizeTag(1) + protowire.SizeBytes(len(payload))
	if len(payload) == 0 {
		body = 0
	}
	c.msg = append(c.msg[:0], 0, byte(body>>24), byte(body>>16), byte(body>>8), byte(body))
	if len(payload) > 0 {
		c.msg = protowire.AppendTag(c.msg, 1, protowire.BytesType)
		c.msg = protowire.AppendBytes(c.msg, payload)
	}
	c.hbuf = c.hbuf[:0]
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", c.path}, {":authority", c.authority},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		c.henc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if !deadline.IsZero() {
		ms := max(time.Until(deadline).Milliseconds(), 1)
		c.henc.WriteField(hpack.HeaderField{Name: "grpc-timeout", Value: strconv.FormatInt(ms, 10) + "m"})
	}
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: c.stream, BlockFragment: c.hbuf, EndHeaders: true}); err != nil {
		return c.ioOutcome(err)
	}
	o, err := c.send()
	if err != nil {
		return o, err
	}
	o, err = c.receive(!deadline.IsZero())
	if c.goAway {
		c.drop()
	}
	if o == callOK && err == nil {
		return callOK, checkEcho(c.reply, payload)
	}
	return o, err
}

// send writes the message as DATA frames within the server's windows,
// reading frames (window updates, settings, pings) while it must wait.
func (c *h2Caller) send() (outcome, error) {
	streamWin := c.sendInit
	rest := c.msg
	for {
		n := min(int64(len(rest)), h2MaxFrame, c.sendConn, streamWin)
		if n > 0 || len(rest) == 0 {
			if err := c.fr.WriteData(c.stream, int64(len(rest)) == n, rest[:n]); err != nil {
				return c.ioOutcome(err)
			}
			rest, c.sendConn, streamWin = rest[n:], c.sendConn-n, streamWin-n
			if len(rest) == 0 {
				if err := c.bw.Flush(); err != nil {
					return c.ioOutcome(err)
				}
				return callOK, nil
			}
			continue
		}
		if err := c.bw.Flush(); err != nil {
			return c.ioOutcome(err)
		}
		f, err := c.fr.ReadFrame()
		if err != nil {
			return c.readFailed(err)
		}
		if wu, ok := f.(*http2.WindowUpdateFrame); ok && wu.StreamID == c.stream {
			streamWin += int64(wu.Increment)
			continue
		}
		if done, o, err := c.control(f); done {
			return o, err
		}
	}
}

// receive reads the reply (headers, the message, trailers) into c.reply
// and returns the call's outcome by its grpc-status. A stream the server
// cancels while the call has a deadline timed out: grpc-go's server resets
// the stream when the grpc-timeout passes (its client reads that as
// DeadlineExceeded too).
func (c *h2Caller) receive(hasDeadline bool) (outcome, error) {
	c.reply = c.reply[:0]
	var data []byte
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return c.readFailed(err)
		}
		switch f := f.(type) {
		case *http2.DataFrame:
			if f.StreamID != c.stream {
				continue
			}
			data = append(data, f.Data()...)
			if err := c.consumed(f.Length); err != nil {
				return c.ioOutcome(err)
			}
			if f.StreamEnded() {
				return callFailed, nil // a reply without trailers
			}
		case *http2.MetaHeadersFrame:
			if f.StreamID != c.stream {
				continue
			}
			if s := f.PseudoValue("status"); s != "" && s != "200" {
				if s == "503" || s == "429" {
					return callRefused, nil
				}
				return callFailed, nil
			}
			if !f.StreamEnded() {
				continue
			}
			return c.finish(f.Fields, data)
		case *http2.RSTStreamFrame:
			if f.StreamID != c.stream {
				continue
			}
			switch {
			case f.ErrCode == http2.ErrCodeRefusedStream:
				return callRefused, nil
			case f.ErrCode == http2.ErrCodeCancel && hasDeadline:
				return callTimedOut, nil
			}
			return callFailed, nil
		default:
			if done, o, err := c.control(f); done {
				return o, err
			}
		}
	}
}

// finish reads the trailers' grpc-status and, for OK, the message.
func (c *h2Caller) finish(trailers []hpack.HeaderField, data []byte) (outcome, error) {
	status := ""
	for _, h := range trailers {
		if h.Name == "grpc-status" {
			status = h.Value
		}
	}
	if status != grpcStatusOK {
		switch code, _ := strconv.Atoi(status); code {
		case grpcDeadlineExceeded:
			return callTimedOut, nil
		case grpcResourceExhausted, grpcUnavailable:
			return callRefused, nil
		}
		return callFailed, nil
	}
	if len(data) < grpcPrefix || data[0] != 0 {
		return callFailed, fmt.Errorf("bench: grpc reply: %d bytes, compressed flag %v", len(data), len(data) > 0 && data[0] != 0)
	}
	n := int(data[1])<<24 | int(data[2])<<16 | int(data[3])<<8 | int(data[4])
	msg := data[grpcPrefix:]
	if n != len(msg) {
		return callFailed, fmt.Errorf("bench: grpc reply: message of %d bytes, prefix says %d", len(msg), n)
	}
	for len(msg) > 0 {
		num, typ, tl := protowire.ConsumeTag(msg)
		if tl < 0 {
			return callFailed, fmt.Errorf("bench: grpc reply: %w", protowire.ParseError(tl))
		}
		msg = msg[tl:]
		if num == 1 && typ == protowire.BytesType {
			v, vl := protowire.ConsumeBytes(msg)
			if vl < 0 {
				return callFailed, fmt.Errorf("bench: grpc reply: %w", protowire.ParseError(vl))
			}
			c.reply = append(c.reply[:0], v...)
			msg = msg[vl:]
			continue
		}
		fl := protowire.ConsumeFieldValue(num, typ, msg)
		if fl < 0 {
			return callFailed, fmt.Errorf("bench: grpc reply: %w", protowire.ParseError(fl))
		}
		msg = msg[fl:]
	}
	return callOK, nil
}

// control handles a frame that is not about the call's stream: settings,
// pings and connection window updates are answered and the read goes on
// (done false); GOAWAY marks the connection to be dropped after the call.
func (c *h2Caller) control(f http2.Frame) (done bool, o outcome, err error) {
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if f.IsAck() {
			return false, callOK, nil
		}
		if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
			c.sendInit = int64(v)
		}
		if err := c.fr.WriteSettingsAck(); err != nil {
			o, err := c.ioOutcome(err)
			return true, o, err
		}
		if err := c.bw.Flush(); err != nil {
			o, err := c.ioOutcome(err)
			return true, o, err
		}
	case *http2.PingFrame:
		if f.IsAck() {
			return false, callOK, nil
		}
		if err := c.fr.WritePing(true, f.Data); err != nil {
			o, err := c.ioOutcome(err)
			return true, o, err
		}
		if err := c.bw.Flush(); err != nil {
			o, err := c.ioOutcome(err)
			return true, o, err
		}
	case *http2.WindowUpdateFrame:
		if f.StreamID == 0 {
			c.sendConn += int64(f.Increment)
		}
	case *http2.GoAwayFrame:
		c.goAway = true
		if f.LastStreamID < c.stream {
			return true, callFailed, nil
		}
	}
	return false, callOK, nil
}

// consumed counts n bytes of DATA received and tops the connection window
// up when half of it is used.
func (c *h2Caller) consumed(n uint32) error {
	c.recvUsed += int64(n)
	if c.recvUsed < h2Window/2 {
		return nil
	}
	if err := c.fr.WriteWindowUpdate(0, uint32(c.recvUsed)); err != nil {
		return err
	}
	c.recvUsed = 0
	return c.bw.Flush()
}

// readFailed classifies an error reading a frame: a malformed frame is the
// server's protocol error (the call fails, the connection is dropped), an
// I/O error as for the other callers.
func (c *h2Caller) readFailed(err error) (outcome, error) {
	var ce http2.ConnectionError
	var se http2.StreamError
	if errors.As(err, &ce) || errors.As(err, &se) || errors.Is(err, io.ErrUnexpectedEOF) {
		c.drop()
		return callFailed, nil
	}
	return c.ioOutcome(err)
}
