package main

import (
	"flag"
	"fmt"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"tpsched/netio"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:12000", "")
	conns := flag.Int("c", 64, "")
	dur := flag.Duration("d", 5*time.Second, "")
	size := flag.Int("s", 128, "")
	group := flag.String("g", "demo", "")
	flag.Parse()
	var n atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(*dur)
	lat := make([][]time.Duration, *conns)
	for i := range *conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nc, err := net.Dial("tcp", *addr)
			if err != nil {
				panic(err)
			}
			fr := netio.NewFrameReader(nc, 1<<20)
			payload := make([]byte, *size)
			var out, buf []byte
			for id := uint64(1); time.Now().Before(end); id++ {
				t0 := time.Now()
				out = netio.AppendFrame(out[:0], netio.Header{Kind: netio.KindCall, ID: id}, *group, "echo", payload)
				nc.Write(out)
				var f netio.Frame
				f, buf, err = fr.Read(buf)
				if err != nil || f.Kind != netio.KindReply {
					panic(fmt.Sprint(err, f.Kind, f.Code, string(f.Payload)))
				}
				lat[i] = append(lat[i], time.Since(t0))
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(a, b int) bool { return all[a] < all[b] })
	fmt.Printf("%d calls, %.0f/s, p50 %v p99 %v\n", n.Load(), float64(n.Load())/dur.Seconds(), all[len(all)/2], all[len(all)*99/100])
}
