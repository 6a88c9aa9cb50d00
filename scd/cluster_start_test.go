package scd

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"tpsched/internal/freeport"
	"tpsched/netio"
	"tpsched/scd/def"
)

// A node answers calls and /status from the moment its port opens, while
// Start still runs: the inter-node state exists before the port opens, and
// a frame's handler reaches the port through its connection, not through
// n.rpc, which Start sets after the loops serve. The race detector sees no
// write to either afterwards. (The cluster state used to be set after the
// port opened, /status read a gossip handle not yet made, and a call on
// the wrong receiver group read n.rpc while it was nil.) The group is
// bound to a receiver group of its own, so every call on the RPC port is
// answered 'wrong receiver' by that path until the client follows it.
func TestNodeServesWhileStarting(t *testing.T) {
	ips := []string{"127.0.0.1", "127.0.0.2"}
	ports, err := freeport.Common(ips, 2)
	if err != nil {
		t.Skip(err)
	}
	metricsAddr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	rpcAddr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	dir := t.TempDir()
	sysconf := fmt.Sprintf("set node_id = \"joining\"\nset rpc_address = \"127.0.0.1\"\nset rpc_port = %d\nset name_port = %d\n"+
		"set metrics_address = %q\nset control_socket = \"ctl.sock\"\nset all_node = \"127.0.0.1\", \"127.0.0.2\"\n",
		ports[0], ports[1], metricsAddr)
	usr := "set service_group = g\nset service = echo\nset module = " + fmt.Sprintf("%q", os.Args[0]) + "\nset parallel_count = 1\nscdmulti -g rg\n"
	if err := os.MkdirAll(filepath.Join(dir, "usr"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{"sysconf": sysconf, "scdsvcdef": "scdmulti -g rg -m 1 -p 0\n", "usr/g": usr} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := def.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	n, err := New(cfg, Options{Logger: slog.New(slog.DiscardHandler), SchedProbes: "off", DrainTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	n.pm = inProcess{}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	started := make(chan struct{})
	wg.Add(2)
	go func() { // calls, from before the port opens until after Start
		defer wg.Done()
		// Raw connections, each dialled and written at once: the first
		// lands in the listen backlog with its call before the loops run
		// (the port is bound before the groups start, and served once they
		// run: on a loaded machine that may take seconds), so the call is
		// served while Start still runs.
		frame := netio.AppendFrame(nil, netio.Header{Kind: netio.KindCall, ID: 1}, "g", "echo", []byte("x"))
		for ctx.Err() == nil {
			nc, err := net.Dial("tcp", rpcAddr)
			if err != nil {
				continue
			}
			nc.SetDeadline(time.Now().Add(20 * time.Second))
			_, err = nc.Write(frame)
			var f netio.Frame
			if err == nil {
				f, _, err = netio.NewFrameReader(nc, 1<<20).Read(nil)
			}
			nc.Close()
			if err != nil {
				t.Errorf("a call on the RPC port: %v", err)
				return
			}
			if f.Kind != netio.KindError || f.Code != netio.CodeWrongReceiver {
				t.Errorf("a call on the RPC port for a group bound to another receiver group: %+v, want 'wrong receiver'", f)
				return
			}
			select {
			case <-started:
				return
			default:
			}
		}
	}()
	go func() { // /status the same way
		defer wg.Done()
		for ctx.Err() == nil {
			if resp, err := http.Get("http://" + metricsAddr + "/status"); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				select {
				case <-started:
					if resp.StatusCode == http.StatusOK {
						return
					}
				default:
				}
			}
			time.Sleep(time.Millisecond)
		}
	}()
	if err := n.Start(); err != nil {
		cancel()
		wg.Wait()
		t.Fatal(err)
	}
	close(started)
	wg.Wait()
	if ctx.Err() != nil {
		t.Error("no answered call or /status after the node started")
	}
	if err := n.Drain(context.Background()); err != nil {
		t.Errorf("drain: %v", err)
	}
}

// TestSeedsLeaveThisNodeOut: this node's own all_node entry is no seed,
// however it is spelled (an IPv6 address written out, a host name in
// another case): as a seed, its first join asked itself, and a node whose
// only other seeds hang settled its table on its own state at once.
func TestSeedsLeaveThisNodeOut(t *testing.T) {
	for _, tc := range []struct {
		addr string
		all  []string
	}{
		{"127.0.0.2", []string{"127.0.0.2", "127.0.0.3"}},
		{"::1", []string{"[0:0:0:0:0:0:0:1]:7000", "[::2]:7000"}},
		{"NodeA", []string{"nodea:7000", "nodeb:7000"}},
	} {
		cfg := &def.Config{System: def.System{RPCAddress: tc.addr, RPCPort: 7000, NamePort: 7001, AllNodes: tc.all}}
		got, err := seeds(cfg)
		if err != nil || len(got) != 1 {
			t.Errorf("rpc_address %s, all_node %v: seeds %v (%v); want the other node's name port alone", tc.addr, tc.all, got, err)
		}
	}
}
