package scd

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"tpsched/internal/freeport"
	"tpsched/scd/client"
	"tpsched/scd/def"
)

// A node in a cluster answers calls and /status while it is still joining
// the others: the inter-node state exists before the RPC port opens, and
// the race detector sees no write to it afterwards. (It used to be set
// after the port opened, and /status read a gossip handle not yet made.)
func TestClusterNodeServesWhileJoining(t *testing.T) {
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
	usr := "set service_group = g\nset service = echo\nset module = " + fmt.Sprintf("%q", os.Args[0]) + "\nset parallel_count = 1\n"
	if err := os.MkdirAll(filepath.Join(dir, "usr"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{"sysconf": sysconf, "usr/g": usr} {
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

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	started := make(chan struct{})
	wg.Add(2)
	go func() { // calls, from before the port opens until after Start
		defer wg.Done()
		c, err := client.New(client.Options{Hosts: []string{rpcAddr}})
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		for ctx.Err() == nil {
			out, err := c.Call(ctx, "g", "echo", []byte("x"))
			if err == nil && string(out) != "x" {
				t.Errorf("echo answered %q", out)
			}
			select {
			case <-started:
				if err == nil {
					return
				}
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
		t.Error("no successful call or /status after the node started")
	}
	if err := n.Drain(context.Background()); err != nil {
		t.Errorf("drain: %v", err)
	}
}
