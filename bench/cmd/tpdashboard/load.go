package main

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"time"

	"tpsched/scd/client"
)

// stream is calls of one kind at a fixed rate over a part of the run
// (from and to are shares of it).
type stream struct {
	what           string
	node           int // index into the nodes; the call goes where the cluster routes it
	balanced       bool
	group, service string
	payload        string
	rate           float64 // calls per second
	from, to       float64
	timeout        time.Duration
}

// phases is the run drawn in the README: steady calls with a few
// application errors, a peak, CPU-heavy calls, a hot spot on one node that
// drives it to LEVEL2 and fills its queue, two UAP crashes and calls that
// time out. (tools/screenshots.sh holds orders on the second node for a
// while too.)
var phases = []stream{
	{"orders: echo through n2", 0, false, "orders", "echo", "order", 150, 0, 1, 5 * time.Second},
	{"orders: application errors", 0, false, "orders", "fail", "x", 3, 0, 1, 5 * time.Second},
	{"orders: the peak through n3", 1, false, "orders", "echo", "order", 350, 0.25, 0.75, 5 * time.Second},
	{"reports: 8 ms of CPU each", 0, false, "reports", "cpu", "8000", 30, 0.15, 0.85, 10 * time.Second},
	{"reports: 150 ms calls kept on n4 (balanced)", 2, true, "reports", "sleep", "150", 25, 0.4, 0.62, 10 * time.Second},
	{"reports: calls that time out", 0, false, "reports", "sleep", "1500", 1, 0.7, 0.85, 500 * time.Millisecond},
	{"reports: UAP crashes", 0, false, "reports", "crash", "", 0.2, 0.5, 0.6, 5 * time.Second},
}

// drive runs phases over d against the nodes at rpc and prints each
// stream as it starts.
func drive(ctx context.Context, rpc []string, d time.Duration) error {
	clients := map[string]*client.Client{}
	get := func(node int, balanced bool) (*client.Client, error) {
		key := strconv.Itoa(node) + strconv.FormatBool(balanced)
		if c := clients[key]; c != nil {
			return c, nil
		}
		c, err := client.New(client.Options{Hosts: []string{rpc[node%len(rpc)]}, Balanced: balanced})
		if err != nil {
			return nil, err
		}
		clients[key] = c
		return c, nil
	}
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	begin := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 512) // calls outstanding at once
	var mu sync.Mutex
	outcomes := map[string]map[string]int{}
	for _, s := range phases {
		c, err := get(s.node, s.balanced)
		if err != nil {
			return err
		}
		wg.Go(func() {
			from := begin.Add(time.Duration(s.from * float64(d)))
			to := begin.Add(time.Duration(s.to * float64(d)))
			if !sleepUntil(ctx, from) {
				return
			}
			fmt.Printf("tpdashboard: %5.1fs %s, %g/s for %v\n", time.Since(begin).Seconds(), s.what, s.rate, to.Sub(from).Round(time.Second))
			gap := time.Duration(float64(time.Second) / s.rate)
			for i := 0; ; i++ {
				at := from.Add(time.Duration(i) * gap)
				if at.After(to) || !sleepUntil(ctx, at) {
					return
				}
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					cctx, cancel := context.WithTimeout(ctx, s.timeout)
					defer cancel()
					_, err := c.Call(cctx, s.group, s.service, []byte(s.payload))
					mu.Lock()
					if outcomes[s.what] == nil {
						outcomes[s.what] = map[string]int{}
					}
					outcomes[s.what][outcome(err)]++
					mu.Unlock()
				})
			}
		})
	}
	wg.Wait()
	for _, s := range phases {
		fmt.Printf("tpdashboard: %s: %v\n", s.what, outcomes[s.what])
	}
	return ctx.Err()
}

var detail = regexp.MustCompile(`^tpsched: ([a-z ]+)`)

func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	if m := detail.FindStringSubmatch(err.Error()); m != nil {
		return m[1]
	}
	return err.Error()
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}
