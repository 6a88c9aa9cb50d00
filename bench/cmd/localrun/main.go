// Command localrun sends one run call to each of N caller UAPs
// (bench/cmd/uap-caller) of a node at once, each calling bench/echo in a
// loop for 2 s, and prints the local calls/s they made in that window:
// one S10 cell by hand, on a node set up by tools/local-callers.sh, for
// comparing builds without the whole grid.
//
//	localrun ADDR [N]
package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"tpsched/bench/uapcall"
	"tpsched/netio"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: localrun ADDR [N callers, default 5]")
		os.Exit(2)
	}
	addr, n := os.Args[1], 5
	if len(os.Args) > 2 {
		var err error
		if n, err = strconv.Atoi(os.Args[2]); err != nil || n < 1 {
			fmt.Fprintln(os.Stderr, "localrun: N must be a positive number")
			os.Exit(2)
		}
	}
	d := 2 * time.Second
	start := time.Now().Add(300 * time.Millisecond)
	r := uapcall.Run{Group: "bench", Service: "echo", Payload: 128, Start: start, End: start.Add(d)}
	var mu sync.Mutex
	total := 0
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			nc, err := net.Dial("tcp", addr)
			if err != nil {
				fmt.Fprintln(os.Stderr, "localrun:", err)
				os.Exit(1)
			}
			mc := netio.NewMuxConn(nc, netio.MuxOptions{MaxPayload: 64 << 20, CallerReads: true})
			defer mc.Close(nil)
			f, _, err := mc.RoundTrip(netio.Header{Kind: netio.KindCall, TimeoutMs: 10000}, "callers", "run", r.Encode(), time.Now().Add(10*time.Second), make([]byte, 64<<10))
			if err == nil && f.Kind != netio.KindReply {
				err = fmt.Errorf("error answer %d: %s", f.Code, f.Payload)
			}
			var s uapcall.Summary
			if err == nil {
				s, err = uapcall.ParseSummary(f.Payload)
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, "localrun: run call:", err)
				os.Exit(1)
			}
			mu.Lock()
			total += s.InWindow
			mu.Unlock()
		})
	}
	wg.Wait()
	fmt.Printf("%.0f\n", float64(total)/d.Seconds())
}
