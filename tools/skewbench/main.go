// Command skewbench measures what steering new connections does for a
// receiver group with skewed connections: a few heavy connections (many
// large calls in flight) among many light ones (one small call at a time),
// the kernel's SO_REUSEPORT hash against the SK_REUSEPORT program
// (bpf/steer.c), in the same run, alternating.
//
// It stands in for a bench scenario until bench/ (being rewritten
// elsewhere) can take it; docs/ARCHITECTURE.md ("Steering, measured")
// gives the figures and what the scenario needs.
//
//	go build -o bin/ ./cmd/... && go run ./tools/skewbench -bin bin
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"tpsched/netio"
	"tpsched/scd"
)

func main() {
	bin := flag.String("bin", "bin", "directory with scdd and uap-echo")
	receivers := flag.Int("receivers", 4, "receiving sockets (scdmulti)")
	heavy := flag.Int("heavy", 2, "heavy connections")
	depth := flag.Int("depth", 32, "calls each heavy connection keeps in flight")
	heavySize := flag.Int("heavy-size", 64<<10, "payload of a heavy call, bytes")
	light := flag.Int("light", 40, "light connections")
	think := flag.Duration("think", 5*time.Millisecond, "pause between a light connection's calls")
	dur := flag.Duration("d", 8*time.Second, "measured time of one run")
	pairs := flag.Int("pairs", 3, "hash/steering pairs, alternating")
	flag.Parse()
	if err := run(*bin, *receivers, *heavy, *depth, *heavySize, *light, *think, *dur, *pairs); err != nil {
		fmt.Fprintln(os.Stderr, "skewbench:", err)
		os.Exit(1)
	}
}

type result struct {
	mode                   string
	lightCalls, heavyCalls int
	lightP50, lightP99     time.Duration
	lightP999              time.Duration
	lightOnHeavy           int           // light connections that landed on a receiver with a heavy one
	p99WithHeavy           time.Duration // light calls on a receiver with a heavy connection
	p99Apart               time.Duration // light calls on a receiver without one
	placement              []string
	errors                 int64
}

func run(bin string, receivers, heavy, depth, heavySize, light int, think, dur time.Duration, pairs int) error {
	fmt.Printf("receivers %d; %d heavy connections x %d calls of %d KiB in flight; %d light connections, one 16-byte call each %v apart; %v per run\n",
		receivers, heavy, depth, heavySize>>10, light, think, dur)
	var all []result
	for p := range pairs {
		for _, mode := range []string{"hash", "steer"} {
			r, err := once(bin, mode, receivers, heavy, depth, heavySize, light, think, dur)
			if err != nil {
				return err
			}
			fmt.Printf("pair %d %-5s light: %6d calls (%5.0f/s) p50 %7v p99 %7v p99.9 %7v; heavy: %6d calls (%5.0f/s); light conns on a heavy receiver %2d/%d (their p99 %v, the others' %v); placement %v; errors %d\n",
				p+1, r.mode, r.lightCalls, float64(r.lightCalls)/dur.Seconds(), r.lightP50, r.lightP99, r.lightP999,
				r.heavyCalls, float64(r.heavyCalls)/dur.Seconds(), r.lightOnHeavy, light, r.p99WithHeavy, r.p99Apart, r.placement, r.errors)
			all = append(all, r)
		}
	}
	for _, mode := range []string{"hash", "steer"} {
		var p99s, p50s []time.Duration
		var lc, hc []int
		for _, r := range all {
			if r.mode == mode {
				p99s, p50s = append(p99s, r.lightP99), append(p50s, r.lightP50)
				lc, hc = append(lc, r.lightCalls), append(hc, r.heavyCalls)
			}
		}
		slices.Sort(p99s)
		slices.Sort(p50s)
		slices.Sort(lc)
		slices.Sort(hc)
		fmt.Printf("median %-5s light p50 %v p99 %v, light %.0f/s, heavy %.0f/s\n", mode, p50s[len(p50s)/2], p99s[len(p99s)/2],
			float64(lc[len(lc)/2])/dur.Seconds(), float64(hc[len(hc)/2])/dur.Seconds())
	}
	return nil
}

var started = regexp.MustCompile(`msg="scdd started" .*rpc=(\S+) control=(\S+)`)

// once runs one node and one load.
func once(bin, mode string, receivers, heavy, depth, heavySize, light int, think, dur time.Duration) (result, error) {
	res := result{mode: mode}
	dir, err := os.MkdirTemp("", "skewbench-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	uap, _ := filepath.Abs(filepath.Join(bin, "uap-echo"))
	files := map[string]string{
		"sysconf":   "set node_id = \"skew\"\nset rpc_port = 0\nset metrics_address = \"127.0.0.1:0\"\nset control_socket = \"ctl.sock\"\n",
		"scdsvcdef": fmt.Sprintf("set scdmulti = %d\n", receivers),
		"usr/echo":  fmt.Sprintf("set service_group = \"echo\"\nset service = \"echo\"\nset module = %q\nset parallel_count = 4\nset queue_size = 4096\n", uap),
	}
	for name, body := range files {
		_ = os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return res, err
		}
	}
	cmd := exec.Command(filepath.Join(bin, "scdd"), "-c", dir)
	cmd.Env = append(os.Environ(), "DCCONFPATH=")
	if mode == "hash" {
		cmd.Env = append(cmd.Env, "TPSCHED_STEERING=off")
	}
	stderr, _ := cmd.StderrPipe()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return res, err
	}
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	addrs := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := started.FindStringSubmatch(sc.Text()); m != nil {
				addrs <- [2]string{m[1], m[2]}
			}
		}
	}()
	var rpc, httpAddr string
	select {
	case a := <-addrs:
		rpc, httpAddr = a[0], a[1]
	case <-time.After(15 * time.Second):
		return res, fmt.Errorf("scdd did not start")
	}
	st, err := status(httpAddr)
	if err != nil {
		return res, err
	}
	if want := map[string]string{"hash": netio.SteerHash, "steer": "bpf"}[mode]; st.Steering[0].Mechanism != want {
		return res, fmt.Errorf("%s run: steering is %s (%s)", mode, st.Steering[0].Mechanism, st.Steering[0].Reason)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var heavyCalls, errs atomic.Int64
	var lmu sync.Mutex
	var lat, latWith, latApart []time.Duration
	measuring := atomic.Bool{}
	receiverOf := func(mc *netio.MuxConn) int {
		r, err := lookupReceivers(mc)
		if err != nil {
			return -1
		}
		return r.Here
	}
	heavyOn := map[int]bool{}
	payload := make([]byte, heavySize)
	for range heavy {
		nc, err := net.Dial("tcp", rpc)
		if err != nil {
			return res, err
		}
		mc := netio.NewMuxConn(nc, netio.MuxOptions{MaxPayload: 2 << 20})
		defer mc.Close(nil)
		heavyOn[receiverOf(mc)] = true
		sem := make(chan struct{}, depth)
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case sem <- struct{}{}:
				}
				_, sent, _ := mc.Call(netio.Header{Kind: netio.KindCall, TimeoutMs: 30000}, "echo", "echo", payload, time.Time{},
					answer(func(f netio.Frame, err error) {
						<-sem
						if err != nil || f.Kind != netio.KindReply {
							errs.Add(1)
						} else if measuring.Load() {
							heavyCalls.Add(1)
						}
					}))
				if !sent {
					errs.Add(1)
					<-sem
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	time.Sleep(500 * time.Millisecond) // the heavy connections have their calls in flight
	placement := make([]int, receivers)
	for range light {
		nc, err := net.Dial("tcp", rpc)
		if err != nil {
			return res, err
		}
		mc := netio.NewMuxConn(nc, netio.MuxOptions{})
		defer mc.Close(nil)
		here := receiverOf(mc)
		if here >= 0 {
			placement[here]++
		}
		withHeavy := heavyOn[here]
		if withHeavy {
			res.lightOnHeavy++
		}
		wg.Go(func() {
			msg := []byte("0123456789abcdef")
			for {
				select {
				case <-stop:
					return
				default:
				}
				done := make(chan error, 1)
				t0 := time.Now()
				_, sent, err := mc.Call(netio.Header{Kind: netio.KindCall, TimeoutMs: 30000}, "echo", "echo", msg, time.Time{},
					answer(func(f netio.Frame, err error) {
						if err == nil && f.Kind != netio.KindReply {
							err = fmt.Errorf("%v", f.Kind)
						}
						done <- err
					}))
				if sent {
					err = <-done
				}
				d := time.Since(t0)
				if err != nil {
					errs.Add(1)
				} else if measuring.Load() {
					lmu.Lock()
					lat = append(lat, d)
					if withHeavy {
						latWith = append(latWith, d)
					} else {
						latApart = append(latApart, d)
					}
					lmu.Unlock()
				}
				time.Sleep(think)
			}
		})
	}
	time.Sleep(time.Second) // warm-up
	measuring.Store(true)
	time.Sleep(dur)
	measuring.Store(false)
	close(stop)
	wg.Wait()
	slices.Sort(lat)
	slices.Sort(latWith)
	slices.Sort(latApart)
	qOf := func(lat []time.Duration, p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))].Round(10 * time.Microsecond)
	}
	q := func(p float64) time.Duration { return qOf(lat, p) }
	res.p99WithHeavy, res.p99Apart = qOf(latWith, 0.99), qOf(latApart, 0.99)
	res.lightCalls, res.heavyCalls = len(lat), int(heavyCalls.Load())
	res.lightP50, res.lightP99, res.lightP999 = q(0.50), q(0.99), q(0.999)
	res.errors = errs.Load()
	for i, k := range placement {
		mark := ""
		if heavyOn[i] {
			mark = "H"
		}
		res.placement = append(res.placement, fmt.Sprintf("%d%s", k, mark))
	}
	return res, nil
}

func status(addr string) (scd.Status, error) {
	var st scd.Status
	resp, err := http.Get("http://" + addr + "/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// lookupReceivers asks which receiving socket mc is on.
func lookupReceivers(mc *netio.MuxConn) (netio.Receivers, error) {
	ch := make(chan netio.Receivers, 1)
	errc := make(chan error, 1)
	_, sent, err := mc.Call(netio.Header{Kind: netio.KindNameLookup}, "echo", netio.LookupReceivers, nil, time.Time{},
		answer(func(f netio.Frame, err error) {
			if err != nil || f.Kind != netio.KindReply {
				errc <- fmt.Errorf("lookup: %v %v", err, strings.TrimSpace(string(f.Payload)))
				return
			}
			r, err := netio.ParseReceivers(f.Payload)
			if err != nil {
				errc <- err
				return
			}
			ch <- r
		}))
	if !sent {
		return netio.Receivers{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	select {
	case r := <-ch:
		return r, nil
	case err := <-errc:
		return netio.Receivers{}, err
	case <-ctx.Done():
		return netio.Receivers{}, ctx.Err()
	}
}

type answer func(netio.Frame, error)

func (a answer) Answer(f netio.Frame, err error) { a(f, err) }
