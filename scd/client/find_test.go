package client

import (
	"context"
	"testing"
	"time"

	"tpsched/netio"
)

// TestFindServer: a find is a name lookup with service "find" that carries
// the caller's deadline (the node may start a server before it answers);
// the answer's nodes come back, an error answer as its code.
func TestFindServer(t *testing.T) {
	t.Parallel()
	n := startNode(t, "n")
	c := newClient(t, Options{Hosts: []string{n.addr}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	nodes, err := c.FindServer(ctx, "orders")
	if err != nil || len(nodes) != 1 || nodes[0].Addr != findAddr || nodes[0].Level != 1 {
		t.Fatalf("FindServer = %+v, %v; want %s at LEVEL1", nodes, err, findAddr)
	}
	n.mu.Lock()
	ms := n.timeouts["orders"]
	n.mu.Unlock()
	if ms < 2500 || ms > 3001 {
		t.Errorf("the find carried a timeout of %d ms, want the caller's 3 s", ms)
	}
	_, err = c.FindServer(ctx, "none")
	wantCode(t, err, netio.CodeNoSuchGroup)
	if _, err := c.FindServer(ctx, string(make([]byte, 300))); err == nil {
		t.Error("a find of a 300-byte name was sent")
	}
}

// TestFindAfterGoAwayIsSentAgain: a find refused as unsent by a connection
// going away (the node's go-away read, the client not yet told) goes on a
// new connection to the same node, as a call does. Before, it went on to
// the next dchost host, and with none left failed 'network down'.
func TestFindAfterGoAwayIsSentAgain(t *testing.T) {
	n := startNode(t, "n")
	c := newClient(t, Options{Hosts: []string{n.addr}})
	slow := goingAwayWithACall(t, n, c)
	if nodes, err := c.FindServer(testCtx(t), "orders"); err != nil || len(nodes) != 1 {
		t.Errorf("FindServer on a connection going away: %+v, %v; want the answer, sent on a new connection", nodes, err)
	}
	if err := <-slow; err != nil {
		t.Errorf("the call sent before: %v", err)
	}
}
