package bench

import (
	"context"
	"testing"
	"time"

	"tpsched/internal/freeport"
)

// TestH2CallerAgainstGRPCGo: the hand-written gRPC client against a real
// grpc-go server: echoes of every size the grid uses (64 KiB needs the
// server's flow-control window updates), a deadline shorter than the work
// times out, an unknown method fails, and after the server restarts the
// caller dials again.
func TestH2CallerAgainstGRPCGo(t *testing.T) {
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	serve := func() (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- ServeGRPC(ctx, addr) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("serve: %v", err)
			}
		}
	}
	stop := serve()
	defer func() { stop() }()
	c := grpcDialer(addr, "Echo")()
	defer c.Close()
	deadline := func() time.Time { return time.Now().Add(5 * time.Second) }
	var o outcome
	for range 100 { // the server may not listen yet
		if o, err = c.Call([]byte("x"), deadline()); o == callOK {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if o != callOK || err != nil {
		t.Fatalf("first call: %v %v", o, err)
	}
	for _, n := range []int{0, 1, 128, 4 << 10, 64 << 10, 200 << 10} {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(i*7 + n)
		}
		for i := range 3 {
			if o, err := c.Call(p, time.Time{}); o != callOK || err != nil {
				t.Fatalf("echo %d B, call %d: %v %v", n, i, o, err)
			}
		}
	}
	burn := grpcDialer(addr, "Burn")()
	defer burn.Close()
	if o, err := burn.Call([]byte("300000"), time.Now().Add(50*time.Millisecond)); o != callTimedOut || err != nil {
		t.Errorf("burn 300 ms with a 50 ms deadline: %v %v, want timed out", o, err)
	}
	bad := grpcDialer(addr, "Nope")()
	defer bad.Close()
	if o, err := bad.Call([]byte("x"), deadline()); o != callFailed || err != nil {
		t.Errorf("unknown method: %v %v, want failed", o, err)
	}
	stop()
	if o, _ := c.Call([]byte("x"), deadline()); o == callOK {
		t.Error("a call to a stopped server answered")
	}
	stop = serve()
	for range 100 {
		if o, err = c.Call([]byte("again"), deadline()); o == callOK {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if o != callOK || err != nil {
		t.Errorf("after the restart: %v %v", o, err)
	}
}
