package rpcport

import (
	"bufio"
	"net"
	"sync"
	"testing"
	"time"

	"tpsched/netio"
)

// TestCallersClosingMidCallKeepThePort: callers that send a call and close
// at once (callers that give up) while others connect. Each close with a
// call in flight makes the event loop keep the socket for its answer
// (detach, a duplicate from the descriptor reserve) while the accept loop
// is enrolling the next connection with that loop. The accept loop used to
// hold the reserve's lock while it waited for the loop, and the loop
// waited for the lock: two such callers wedged the port for good.
func TestCallersClosingMidCallKeepThePort(t *testing.T) {
	h := &delayHandler{}
	s := startServer(t, Options{Loops: 1, MaxPayload: 1 << 20}, h)
	const callers, rounds = 4, 150
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for i := range rounds {
				c, err := net.DialTimeout("tcp", s.Addr(), 2*time.Second)
				if err != nil {
					return // the port is wedged: the probe below says so
				}
				_, _ = c.Write(callFrame(uint64(i+1), []byte("20 gave up")))
				_ = c.Close()
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the closing callers did not finish connecting in 60 s: the accept loop is stuck")
	}
	// A caller that stays gets its answer.
	c, err := net.DialTimeout("tcp", s.Addr(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(callFrame(7, []byte("now"))); err != nil {
		t.Fatal(err)
	}
	f, err := readFrame(bufio.NewReader(c))
	if err != nil || f.ID != 7 || f.Kind != netio.KindReply {
		t.Fatalf("after %d callers closed mid-call, a new call got %v, %v: the port is wedged", callers*rounds, f, err)
	}
	waitFor(t, "every closed caller's connection to end", func() bool { return s.Stats().Conns <= 1 })
}
