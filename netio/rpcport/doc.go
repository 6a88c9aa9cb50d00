// Package rpcport owns the TCP server that a node's RPC port runs on, with
// what a caller may make that port hold. The bytes it reads and writes are
// package netio's frames.
//
// It must not know what a service group is. A frame's group and service are
// opaque bytes here; routing, queueing and answering belong to package scd,
// which implements Handler. netio cuts the byte stream into frames, hands
// each one to the Handler on the event loop, and writes what the Handler
// sends back.
//
// # Port
//
// Listen opens Options.Loops receiving sockets on one port with SO_REUSEPORT
// (OpenTP1's scdmulti), each with its own accept goroutine and its own gnet
// event loop, and the same for every named group of Options.Receivers (the
// multi-scheduler groups), each on a port of its own; Conn.ReceiverGroup
// tells the Handler where a connection arrived. The kernel's 4-tuple hash
// picks the socket for each new connection unless Options.Steer places
// them (an SK_REUSEPORT program choosing the receiver with the least
// work); the loops keep each receiver's calls in flight and connections for
// it (receivers.go). netio accepts itself and hands each connection to gnet
// (accept.go says why). Accept failures such as EMFILE pause and retry,
// and a small reserve of descriptors makes sure that a connection accepted
// can be enrolled (reserve.go): when the fd table is full, callers wait in
// the backlog rather than being reset. Connections beyond Options.MaxConns
// are closed at once and counted.
//
// A port is the Port's alone (exclusive.go): before it binds a port, Listen
// makes a bind without SO_REUSEPORT that any socket listening there makes
// fail, and after binding it checks that every socket listening on the
// port is its own or inherited; otherwise it fails with ErrPortShared,
// naming the process that holds the port. Bind opens the sockets ahead of
// Listen (Options.Bound), so that a node can hold its ports before it
// starts processes it does not trust; callers wait in the backlog until it
// serves.
//
// HandOff, Options.Inherit, GoAway and Resume let another process take the
// port over without dropping a connection or a call (handoff.go); a
// MuxConn told to go away (KindGoAway) sends no new call on the connection
// and closes it after its last answer.
//
// Each event loop calls Handler.OnFrame for every complete frame it has read,
// with a Frame that aliases a read buffer: copy what must outlive the call.
// OnFrame must not block. An answer ready at once goes through Conn.SendNow,
// which batches every answer of one read into one write; an answer produced
// later, on another goroutine, goes through Conn.Send.
//
// What a peer can make the server hold is bounded. A frame whose payload
// exceeds Options.MaxPayload is answered 'message too big' and its bytes are
// skipped unkept. A frame must arrive whole within Options.FrameTimeout of
// its first byte. The bytes held in partial frames and unsent answers, all
// connections together, are kept under Options.BufferBudget by closing the
// connection that holds the most. A connection whose unsent answers exceed
// Options.MaxOutbound is closed (a slow reader). Bad bytes (bad magic,
// version or kind) close that connection only.
//
// A connection ends with a FIN only when every answer it was owed has
// been written: a caller that half-closes its connection (shutdown
// SHUT_WR) still gets its answers, the connection kept open for them after
// gnet lets it go (conn.go); one closed with answers owed (by a limit, or
// because its caller reset it) ends with a reset and counts them in
// Stats.Undelivered. So a caller that sees a clean end knows that every
// call it has no answer for was never read, and may send it again.
//
// Done and Err tell when the server has ended on its own (a receiving
// socket or an event loop failed). Stop answers every call that reached the
// server with 'node shutting down', shuts each connection's write side once
// its answers are written, and closes it once the caller has taken them
// (or after a short linger); what the caller sends after that FIN is not
// read as calls.
//
// Metrics (with Options.Metrics): tpsched_bad_frames_total,
// tpsched_slow_reader_closes_total, tpsched_connections,
// tpsched_accept_errors_total,
// tpsched_connections_refused_total{reason="max_connections"},
// tpsched_oversized_frames_total, tpsched_frame_timeouts_total,
// tpsched_buffer_budget_closes_total, tpsched_buffered_bytes,
// tpsched_answers_undelivered_total,
// tpsched_error_answers_total{code=...}, the error frames the ports of
// this process wrote; per receiving socket tpsched_receiver_connections,
// tpsched_receiver_in_flight, tpsched_receiver_accepted_total,
// tpsched_receiver_calls_total {receiver_group, receiver}; per group
// tpsched_receiver_steering{receiver_group, mechanism}. MetricHelp has
// their HELP text.
//
// # Usage
//
//	srv, err := rpcport.Listen(rpcport.Options{Addr: ":7000", Loops: 2, MaxPayload: 1 << 20}, h)
//	if err != nil { ... }
//	defer srv.Stop(ctx)
//	go func() { <-srv.Done(); if err := srv.Err(); err != nil { ... the port is gone } }()
//
//	func (h *handler) OnFrame(c *rpcport.Conn, f netio.Frame) {
//		if f.Kind != netio.KindCall { return }
//		c.SendNow(netio.AppendReply(nil, f.ID, f.Payload))
//	}
//
// # gnet notes
//
// gnet keeps one process-wide logger: the Logger of the most recent Listen
// also receives gnet's own messages for every Port. gnet's Info messages
// are logged at Debug level here.
package rpcport
