// Package netio owns tpsched's bytes on the wire: the frame codec (frame.go,
// codes.go) and the gnet v2 TCP server that the scheduler's RPC port runs on.
//
// It must not know what a service group is. A frame's group and service are
// opaque bytes here; routing, queueing and answering belong to package scd,
// which implements Handler. netio only cuts the byte stream into frames,
// hands each one to the Handler on the event loop, and writes what the
// Handler sends back.
//
// # Server
//
// Listen opens Options.Loops receiving sockets on one port with SO_REUSEPORT
// (OpenTP1's scdmulti), one gnet event loop per socket; the kernel's
// 4-tuple hash picks the socket for each new connection. Port 0 is resolved
// before gnet binds, so every socket shares the one port.
//
// Each event loop calls Handler.OnFrame for every complete frame it has read,
// with a Frame that aliases gnet's inbound buffer: copy what must outlive the
// call. OnFrame must not block. An answer ready at once goes through
// Conn.SendNow, which batches every answer of one read into one write; an
// answer produced later, on another goroutine, goes through Conn.Send.
//
// Bad bytes (bad magic, version or kind, or a payload over
// Options.MaxPayload) close that connection only and count
// tpsched_bad_frames_total. A connection whose unsent output grows over
// Options.MaxOutbound (a client that does not read) is closed and counts
// tpsched_slow_reader_closes_total.
//
// # Usage
//
//	srv, err := netio.Listen(netio.Options{Addr: ":7000", Loops: 2, MaxPayload: 1 << 20}, h)
//	if err != nil { ... }
//	defer srv.Stop(ctx)
//
//	func (h *handler) OnFrame(c *netio.Conn, f netio.Frame) {
//		if f.Kind != netio.KindCall { return }
//		c.SendNow(netio.AppendReply(nil, f.ID, f.Payload))
//	}
//
// # gnet notes
//
// gnet keeps one process-wide logger: the Logger of the most recent Listen
// also receives gnet's own messages for every Server. gnet's Info messages
// are logged at Debug level here.
package netio
