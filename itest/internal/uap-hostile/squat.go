package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"tpsched/netio"
)

// The squat attack (TestChaosPortSquat): with HOSTILE_SQUAT set to a list
// of "tcp:host:port", "udp:host:port" and "unix:path", the process in
// slot 0 tries, from the moment it starts, to bind each of the node's
// sockets itself (SO_REUSEPORT on, as the node's RPC port has it), for a
// while, in case the node binds them later; what it gets it serves:
// every call on a TCP port it holds is answered "hijacked by the hostile
// UAP". It reports each attempt as the other attacks do, then "HOSTILE:
// squat done", and serves its own calls honestly meanwhile.

const squatFor = 2 * time.Second

func squat(targets string) {
	all := strings.Split(targets, ",")
	got := map[string]bool{}
	last := map[string]error{}
	for deadline := time.Now().Add(squatFor); len(got) < len(all) && time.Now().Before(deadline); {
		for _, t := range all {
			if got[t] {
				continue
			}
			err := squatOne(t)
			if err == nil {
				got[t] = true
			}
			last[t] = err
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, t := range all {
		if got[t] {
			report("squat "+t, nil)
		} else {
			report("squat "+t, last[t])
		}
	}
	fmt.Println("HOSTILE: squat done")
}

// reusePort sets SO_REUSEPORT and SO_REUSEADDR before bind.
var reusePort = net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	})
	if serr != nil {
		return serr
	}
	return err
}}

func squatOne(target string) error {
	kind, addr, _ := strings.Cut(target, ":")
	switch kind {
	case "tcp":
		ln, err := reusePort.Listen(context.Background(), "tcp", addr)
		if err != nil {
			return err
		}
		go hijack(ln)
		return nil
	case "udp":
		pc, err := reusePort.ListenPacket(context.Background(), "udp", addr)
		if err != nil {
			return err
		}
		go func() { // swallow the node's gossip
			buf := make([]byte, 65536)
			for {
				if _, _, err := pc.ReadFrom(buf); err != nil {
					return
				}
			}
		}()
		return nil
	case "unix":
		_ = os.Remove(addr)
		ln, err := net.Listen("unix", addr)
		if err != nil {
			return err
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		return nil
	}
	return fmt.Errorf("unknown target %q", target)
}

// hijack answers every call on the connections of ln itself.
func hijack(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			fr := netio.NewFrameReader(c, 8<<20)
			var buf []byte
			for {
				f, b, err := fr.Read(buf)
				if err != nil {
					return
				}
				buf = b
				if f.Kind == netio.KindCall {
					if _, err := c.Write(netio.AppendReply(nil, f.ID, []byte("hijacked by the hostile UAP"))); err != nil {
						return
					}
				}
			}
		}()
	}
}
