package scd

import (
	"bytes"
	"net"
	"testing"
	"time"

	"tpsched/netio"
)

// startFuzzNodes starts the two nodes of one run of FuzzNodeFrames: one
// without a cluster_key and one with a key and inter-node state (so hellos
// and forwarded calls take their real paths). They are the run's, stopped
// at its end: a run is once per process when fuzzing (f.Fuzz takes every
// input in that one run), once per -count otherwise. Nodes kept for the
// process (a sync.Once) were stopped by the first run's cleanup, and every
// later run of -count met their closed ports.
func startFuzzNodes(f *testing.F) [2]*Node {
	const server = "set service_group = g\nset service = echo, sleep\nset module = MODULE\n" +
		"set parallel_count = 2\nset queue_size = 4\nset max_message_size = 4096\n"
	plain := inProcNode(f, "", map[string]string{"g": server})
	keyed := inProcNodeWith(f, `set cluster_key = "the-right-key-0123456789"`+"\n", map[string]string{"g": server},
		func(n *Node) {
			if err := n.prepareCluster(true); err != nil { // in a cluster, without membership
				f.Fatal(err)
			}
			n.buildFrames()
			f.Cleanup(n.pool.Close)
		})
	return [2]*Node{plain, keyed}
}

// fuzzFrames cuts the input into frames, each from a small header
// (kind, flags, group, service, payload length) and the bytes after it;
// an input byte may also ask for raw garbage instead of a frame. The
// frames a node answers and keeps the connection open for (calls of any
// flags, lookups, replies and errors it did not ask for) go on one
// connection, whose calls must each be answered exactly once; each thing
// that ends a connection (garbage, a header the codec refuses, a hello the
// node may refuse) goes on a connection of its own.
func fuzzFrames(in []byte) (wire []byte, mustAnswer map[uint64]bool, side [][]byte) {
	mustAnswer = map[uint64]bool{}
	groups := []string{"g", "h", "", "n9", string(bytes.Repeat([]byte{'g'}, 300))}
	services := []string{"echo", "sleep", "nope", ""}
	for id := uint64(1); len(in) >= 4; id++ {
		kind, flags, sel, size := in[0], in[1], in[2], int(in[3])
		in = in[4:]
		size = min(size, len(in))
		payload := in[:size]
		in = in[size:]
		if sel == 0xff { // garbage where a frame should start
			side = append(side, payload)
			continue
		}
		group, service := groups[int(sel)%len(groups)], services[int(sel>>4)%len(services)]
		if service == "sleep" {
			payload = []byte("1ms")
		}
		h := netio.Header{Kind: netio.Kind(kind % 9), Flags: netio.Flags(flags), ID: id}
		if len(group) > netio.MaxNameLen || h.Kind == 0 || h.Kind > netio.KindAnnounce {
			// A header the codec refuses (an unknown kind), or one whose
			// group length says more than follows: the stream is broken
			// from there, and the node closes the connection.
			fr := netio.AppendFrame(nil, h, "g", service, payload)
			if len(group) > netio.MaxNameLen {
				fr[5] = 0xff // the group length byte
			}
			side = append(side, fr)
			continue
		}
		fr := netio.AppendFrame(nil, h, group, service, payload)
		switch h.Kind {
		case netio.KindAnnounce: // a hello the node refuses ends its connection
			side = append(side, fr)
			continue
		case netio.KindCall:
			mustAnswer[id] = true
		}
		wire = append(wire, fr...)
	}
	return wire, mustAnswer, side
}

// FuzzNodeFrames drives a node's frame handling with whatever frames the
// input makes (every kind and flag byte, calls, lookups, hellos in any
// step, replies and errors no node asks for, garbage), with and without a
// cluster_key, over real connections to a node running in process. For
// every input: each call on the connection that stays open gets exactly
// one answer, though the connection is half-closed after its frames; no
// id on any connection is answered twice; and the node still serves a
// plain call afterwards.
func FuzzNodeFrames(f *testing.F) {
	nodes := startFuzzNodes(f)
	f.Add([]byte{0, 1, 0, 0, 2, 'h', 'i'})
	f.Add([]byte{1, 6, 0, 3, 3, 1, 2, 3})                                  // a hello on the keyed node
	f.Add([]byte{0, 1, byte(netio.FlagForwarded), 0, 0, 1, 6, 0x3, 1, 0})  // a forwarded call, a hello
	f.Add([]byte{0, 5, 0, 0, 0, 4, 0, 0, 0, 1, 0, 0xff, 8, 1, 2, 3, 4, 5}) // a lookup, a reply, garbage
	f.Add(bytes.Repeat([]byte{1, 1, 0, 0x10, 1, 'x'}, 8))                  // sleeps past the queue
	f.Add([]byte{1, 1, 0, 0, 0, 0, 0xff, 3, 9, 9, 9, 1, 1, 0, 0, 0})       // calls around garbage
	f.Add([]byte{0, 1, 0, 0x14, 0, 3, 0, 0, 0})                            // a sleep, then a reply no node asks for
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) == 0 {
			return
		}
		n := nodes[in[0]%2]
		wire, mustAnswer, side := fuzzFrames(in[1:])
		for _, b := range side {
			answered := sendAndRead(t, n, b, nil)
			for id, k := range answered {
				if k > 1 {
					t.Errorf("id %d answered %d times on a connection the node closes", id, k)
				}
			}
		}
		answered := sendAndRead(t, n, wire, mustAnswer)
		for id := range mustAnswer {
			if answered[id] != 1 {
				t.Errorf("call %d answered %d times", id, answered[id])
			}
		}
		for id, k := range answered {
			if k > 1 {
				t.Errorf("id %d answered %d times", id, k)
			}
		}
		// The node serves a plain call on a fresh connection.
		ok, err := net.Dial("tcp", n.RPCAddr())
		if err != nil {
			t.Fatalf("the node stopped accepting: %v", err)
		}
		defer ok.Close()
		_ = ok.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := ok.Write(netio.AppendFrame(nil, netio.Header{Kind: netio.KindCall, ID: 7}, "g", "echo", []byte("alive"))); err != nil {
			t.Fatal(err)
		}
		var fm netio.Frame
		for {
			fm, _, err = netio.NewFrameReader(ok, 1<<20).Read(nil)
			if err != nil || fm.ID == 7 {
				break
			}
		}
		if err != nil || fm.Kind != netio.KindReply || string(fm.Payload) != "alive" {
			t.Fatalf("the node stopped serving: %+v %v", fm.Header, err)
		}
	})
}

// sendAndRead writes b on a new connection to n and counts the answers by
// id until every id of must is answered, the node closes the connection,
// or 5 s pass (then the missing ones count 0); with must empty it reads
// until the node closes or nothing more comes for a moment.
func sendAndRead(t *testing.T, n *Node, b []byte, must map[uint64]bool) map[uint64]int {
	t.Helper()
	answered := map[uint64]int{}
	if len(b) == 0 {
		return answered
	}
	nc, err := net.Dial("tcp", n.RPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := nc.Write(b); err != nil {
		return answered // the node closed a connection that sent garbage: fine
	}
	// A caller may half-close once it has sent its calls and still read
	// every answer (rpcport's half connections).
	_ = nc.(*net.TCPConn).CloseWrite()
	if len(must) == 0 {
		_ = nc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	}
	fr := netio.NewFrameReader(nc, 1<<20)
	var buf []byte
	for len(must) == 0 || !allAnswered(answered, must) {
		var fm netio.Frame
		fm, buf, err = fr.Read(buf)
		if err != nil {
			break
		}
		if fm.Kind != netio.KindReply && fm.Kind != netio.KindError {
			continue // a hello step answered by the node
		}
		answered[fm.ID]++
	}
	if allAnswered(answered, must) && len(must) > 0 {
		// A second answer to one of them would come at once.
		_ = nc.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		for {
			fm, _, err := fr.Read(nil)
			if err != nil {
				break
			}
			if fm.Kind == netio.KindReply || fm.Kind == netio.KindError {
				answered[fm.ID]++
			}
		}
	}
	return answered
}

func allAnswered(answered map[uint64]int, must map[uint64]bool) bool {
	for id := range must {
		if answered[id] == 0 {
			return false
		}
	}
	return true
}
