// Package netio owns tpsched's bytes on the wire: the frame codec
// (frame.go: kinds, flags, the header, Decode and the Append functions),
// the error codes (codes.go), the name-lookup and receivers answers
// (lookup.go) and the calling side of a connection (muxconn.go: FrameReader
// and MuxConn, many calls on one dialled connection, matched by id).
//
// It imports only the standard library, so a program that only calls (the
// Go client, scd/client) links no server code: the server that a node's
// RPC port runs on, on gnet event loops, is package netio/rpcport.
//
// It must not know what a service group is: a frame's group and service
// are opaque bytes here.
package netio
