package rpcport

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestListenRefusesSharedPort: a port another socket listens on with
// SO_REUSEPORT (a second scdd, or a process of the node's user that bound
// it first) is refused, with the port and the holder named: SO_REUSEPORT
// would have let Listen share it, and the kernel would have split the
// callers between the two.
func TestListenRefusesSharedPort(t *testing.T) {
	for _, squat := range []string{"127.0.0.1", "0.0.0.0"} {
		t.Run(squat, func(t *testing.T) {
			other, err := reusePortConfig.Listen(context.Background(), "tcp", squat+":0")
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			_, ps, _ := net.SplitHostPort(other.Addr().String())
			for _, opts := range []Options{
				{Addr: "127.0.0.1:" + ps, Loops: 2},
				{Addr: "127.0.0.1:0", Receivers: []ReceiverGroup{{Name: "heavy", Addr: "127.0.0.1:" + ps, Count: 1}}},
			} {
				s, err := Listen(opts, &echoHandler{})
				if err == nil {
					_ = s.Stop(context.Background())
					t.Fatalf("listen %+v beside another socket on port %s succeeded", opts, ps)
				}
				want := fmt.Sprintf("process %d", os.Getpid())
				if !errors.Is(err, ErrPortShared) || !strings.Contains(err.Error(), ps) || !strings.Contains(err.Error(), want) {
					t.Errorf("error %q: want ErrPortShared naming port %s and %s", err, ps, want)
				}
				if _, err := Bind(opts, false); !errors.Is(err, ErrPortShared) {
					t.Errorf("bind beside another socket: %v, want ErrPortShared", err)
				}
			}
			port, _ := strconv.Atoi(ps)
			if n := listeningSockets(t, port); n != 1 {
				t.Errorf("%d sockets listen on port %d after the refusals, want the other's alone", n, port)
			}
		})
	}
}

// TestListenRaceOneOrNone: two Listens on one port at the same moment
// never both succeed: the probe misses a socket bound just after it, and
// the check after binding sees it.
func TestListenRaceOneOrNone(t *testing.T) {
	var outcomes [2]int
	for i := range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		var wg sync.WaitGroup
		ports := make([]*Port, 2)
		for j := range ports {
			wg.Go(func() {
				if s, err := Listen(Options{Addr: addr, Loops: 2}, &echoHandler{}); err == nil {
					ports[j] = s
				}
			})
		}
		wg.Wait()
		ok := 0
		for _, s := range ports {
			if s != nil {
				ok++
				_ = s.Stop(context.Background())
			}
		}
		if ok == 2 {
			t.Fatalf("round %d: two ports listen on %s", i, addr)
		}
		outcomes[ok]++
	}
	t.Logf("one of two listened in %d rounds, neither in %d", outcomes[1], outcomes[0])
}

// TestBindThenServe: sockets bound ahead take callers into their backlog
// and nobody else may bind the port; Listen serves them, with what waited.
func TestBindThenServe(t *testing.T) {
	b, err := Bind(Options{Addr: "127.0.0.1:0", Loops: 2,
		Receivers: []ReceiverGroup{{Name: "heavy", Addr: "127.0.0.1:0", Count: 1}}}, false)
	if err != nil {
		t.Fatal(err)
	}
	addrs := map[string]string{}
	for _, g := range b.groups {
		addrs[g.name] = g.lns[0].Addr().String()
	}
	c := dial(t, addrs[""])
	if _, err := c.Write(callFrame(5, []byte("early"))); err != nil {
		t.Fatal(err)
	}
	// The same user may join a bound port with SO_REUSEPORT (a UAP is
	// another user, and may not); Listen's check then refuses.
	squat, err := reusePortConfig.Listen(context.Background(), "tcp", addrs["heavy"])
	if err != nil {
		t.Fatal(err)
	}
	defer squat.Close()
	s, err := Listen(Options{Addr: addrs[""], Loops: 2, Bound: b,
		Receivers: []ReceiverGroup{{Name: "heavy", Addr: addrs["heavy"], Count: 1}}}, &echoHandler{})
	if err == nil {
		defer s.Stop(context.Background())
		t.Fatal("listen with another socket on the heavy group's port succeeded")
	}
	b, err = Bind(Options{Addr: "127.0.0.1:0", Loops: 2,
		Receivers: []ReceiverGroup{{Name: "heavy", Addr: "127.0.0.1:0", Count: 1}}}, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range b.groups {
		addrs[g.name] = g.lns[0].Addr().String()
	}
	c = dial(t, addrs[""])
	if _, err := c.Write(callFrame(5, []byte("early"))); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	s = startServer(t, Options{Addr: addrs[""], Loops: 2, Bound: b,
		Receivers: []ReceiverGroup{{Name: "heavy", Addr: addrs["heavy"], Count: 1}}}, &echoHandler{})
	if s.Addr() != addrs[""] {
		t.Fatalf("serving on %s, bound %s", s.Addr(), addrs[""])
	}
	if f, err := readFrame(bufio.NewReader(c)); err != nil || f.ID != 5 {
		t.Fatalf("the call that waited between Bind and Listen: %+v, %v", f, err)
	}
	port, _ := strconv.Atoi(addrs[""][strings.LastIndexByte(addrs[""], ':')+1:])
	if n := listeningSockets(t, port); n != 2 {
		t.Fatalf("%d sockets listen on the default group's port, want the 2 bound", n)
	}
}
