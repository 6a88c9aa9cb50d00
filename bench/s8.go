package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"tpsched/netio"
	"tpsched/netio/rpcport"
)

// S8: where new connections land on a receiver group with skewed
// connections. One tpsched node receives on S8Receivers sockets (scdmulti);
// S8Heavy heavy connections each keep s8Depth echo calls of s8HeavySize in
// flight, then s8Light light connections dial, each making one small echo
// call every s8Think. The kernel's SO_REUSEPORT hash (scdd with
// TPSCHED_STEERING=off) against the SK_REUSEPORT program (bpf/steer.c),
// which gives a new connection to the socket with the least work, each run
// on a node started afresh, the two alternating.

// S8 sizing: the figures of docs/ARCHITECTURE.md's "Steering, measured".
const (
	S8Receivers     = 2
	s8Workers       = 4 // parallel_count: UAPs are not what is measured
	s8Queue         = 4096
	S8Heavy         = 1
	s8Depth         = 8
	s8HeavySize     = 256 << 10
	s8Light         = 20
	s8LightSize     = 16
	s8Think         = 20 * time.Millisecond
	s8Settle        = 500 * time.Millisecond // the heavy calls are in flight before the light connections dial
	s8Warmup        = time.Second
	s8Duration      = 8 * time.Second
	s8QuickDuration = 3 * time.Second
	s8CallLimit     = 10 * time.Second // a call not answered by then fails the run's figures as an error
)

// S8's systems: one node, two ways of placing connections.
const (
	nameSkewHash  = "hash (steering off)"
	nameSkewSteer = "steering (SK_REUSEPORT)"
)

// skewSetup is how S8 was run.
type skewSetup struct {
	Receivers  int           `json:"receivers"`
	Workers    int           `json:"parallel_count"`
	Heavy      int           `json:"heavy_connections"`
	Depth      int           `json:"heavy_depth"`
	HeavyBytes int           `json:"heavy_bytes"`
	Light      int           `json:"light_connections"`
	LightBytes int           `json:"light_bytes"`
	Think      time.Duration `json:"light_think_ns"`
	Settle     time.Duration `json:"settle_ns"`
}

// skewFigures are one S8 run's figures, or the median of the runs.
type skewFigures struct {
	LightPerS   float64 `json:"light_per_s"` // light calls answered per second of the window
	HeavyPerS   float64 `json:"heavy_per_s"`
	LightP50us  float64 `json:"light_p50_us"`
	LightP90us  float64 `json:"light_p90_us"`
	LightP99us  float64 `json:"light_p99_us"`
	LightP999us float64 `json:"light_p999_us"`
	// Light connections placed on a socket that has a heavy one, and the
	// p99 of the light calls on such sockets and on the others (0: none).
	LightOnHeavy   float64 `json:"light_on_heavy"`
	P99WithHeavyUs float64 `json:"light_p99_with_heavy_us"`
	P99ApartUs     float64 `json:"light_p99_apart_us"`
	Errors         float64 `json:"errors"`
	// Placement is the light connections per socket, in the order of the
	// sockets; HeavyAt the heavy ones'.
	Placement []float64 `json:"light_per_socket"`
	HeavyAt   []float64 `json:"heavy_per_socket"`
}

// skewResult is one system's S8 runs.
type skewResult struct {
	System    string `json:"system"`
	Mechanism string `json:"mechanism"` // what the node's status said: bpf or hash, and why
	runSet[skewFigures]
	CDF []cdfPoint `json:"cdf,omitempty"` // of the light calls of the drawn run (median light p99)
}

type s8System struct {
	name    string
	environ []string
	want    string // the steering mechanism the node must report
}

func s8Systems() []s8System {
	return []s8System{
		{nameSkewHash, []string{"TPSCHED_STEERING=off"}, rpcport.SteerHash},
		{nameSkewSteer, nil, "bpf"},
	}
}

// s8Sizing is S8's setup for the session.
func s8Sizing(cfg Config) skewSetup {
	g := skewSetup{Receivers: cfg.S8Receivers, Workers: s8Workers, Heavy: cfg.S8Heavy, Depth: s8Depth, HeavyBytes: s8HeavySize,
		Light: s8Light, LightBytes: s8LightSize, Think: s8Think, Settle: s8Settle}
	if g.Receivers <= 0 {
		g.Receivers = S8Receivers
	}
	if g.Heavy <= 0 {
		g.Heavy = S8Heavy
	}
	return g
}

// s8Timing is each S8 run's warm-up and measured time.
func s8Timing(cfg Config, opts runOptions) runOptions {
	o := opts
	o.Warmup = s8Warmup
	o.Duration = given(0, s8Duration, s8QuickDuration, cfg.Quick)
	return o
}

// s8RunTime is one S8 run's plan: a node started, the heavy connections
// settled, the run.
func s8RunTime(o runOptions) time.Duration { return o.stepTime() + s8Settle + startSlack }

// runS8 runs hash and steering cfg.Runs times each, alternating, each run
// on a node started afresh.
func runS8(ctx context.Context, cfg Config, opts runOptions, newReport newReportFunc) error {
	o := s8Timing(cfg, opts)
	setup := s8Sizing(cfg)
	systems := selected(cfg, "S8", s8Systems(), func(s s8System) string { return s.name })
	if len(systems) == 0 {
		return nil
	}
	cfg.progress.begin(plan("S8", len(systems)*o.Runs, s8RunTime(o)))
	fmt.Fprintf(cfg.Log, "S8: %d receivers; %d heavy connection(s) x %d calls of %d KiB in flight; %d light connections, %d B every %v; %v + %v per run, %d systems x %d runs\n",
		setup.Receivers, setup.Heavy, setup.Depth, setup.HeavyBytes>>10, setup.Light, setup.LightBytes, setup.Think, o.Warmup, o.Duration, len(systems), o.Runs)
	sp := Spec{Workers: setup.Workers, Front: setup.Receivers, Queue: s8Queue}
	lightP99 := func(runs []skewFigures) int {
		return medianRun(runs, func(f skewFigures) float64 { return f.LightP99us })
	}
	type drawn struct {
		cdf       []cdfPoint
		mechanism string
	}
	sr := systemsRun[skewFigures, drawn]{id: "S8", runs: o.Runs, per: s8RunTime(o), alternate: true, drawn: lightP99,
		once: func(r, si int) (skewFigures, drawn, error, error) {
			sys := systems[si]
			s, err := startTpschedWith(cfg.Env, sp, tpschedConf{name: sys.name, module: "uap-echo", parallel: fmt.Sprint(setup.Workers), environ: sys.environ})
			if err != nil {
				return skewFigures{}, drawn{}, err, nil
			}
			defer s.Stop()
			mech, err := steeringOf(s)
			if err != nil {
				return skewFigures{}, drawn{}, nil, err
			}
			if !strings.HasPrefix(mech, sys.want) {
				return skewFigures{}, drawn{}, fmt.Errorf("the node places connections by %s, not %s", mech, sys.want), nil
			}
			f, lat, err := skewRun(ctx, s, setup, o)
			if err != nil {
				return skewFigures{}, drawn{}, nil, err
			}
			fmt.Fprintf(cfg.Log, "  run %d %-24s light %5.0f/s p50 %s p99 %s (with heavy %s, apart %s), on the heavy socket %.0f/%d; heavy %5.0f/s; light per socket %s; errors %.0f\n",
				r+1, sys.name, f.LightPerS, dur(f.LightP50us), dur(f.LightP99us), durOrNone(f.P99WithHeavyUs), durOrNone(f.P99ApartUs),
				f.LightOnHeavy, setup.Light, f.HeavyPerS, joinFloats(f.Placement, "%.0f"), f.Errors)
			return f, drawn{cdfOf(lat, 120), mech}, nil, nil
		}}
	for _, sys := range systems {
		sr.names = append(sr.names, sys.name)
	}
	ms, skipped, err := sr.measure(ctx, cfg)
	if err != nil {
		return err
	}
	var done []skewResult
	for _, m := range ms {
		done = append(done, skewResult{runSet: m.Set, System: m.System, Mechanism: m.Traces[len(m.Traces)-1].mechanism, CDF: m.drawnTrace().cdf})
	}
	title := fmt.Sprintf("skewed connections on %d receiving sockets: the kernel's hash against steering", setup.Receivers)
	return sr.reportOf(cfg, newReport, title, o, ms, skipped, func(rep *report) {
		rep.Skew = &setup
		rep.SkewResults = done
		rep.Setup = s8Setup(setup, o, cfg.Quick)
		rep.Notes = append(rep.Notes, skewVerdict(done, setup))
		rep.addPlot(plotRunCDFs(rep, cfg.Out, gridCell{Service: "echo", Payload: setup.LightBytes, Conns: setup.Light}, done))
	})
}

// steeringOf is how the node places the default receiver group's new
// connections, as its status says ("bpf", or "hash: why").
func steeringOf(s *system) (string, error) {
	st, err := readStatus(s.status)
	if err != nil {
		return "", err
	}
	for _, g := range st.Steering {
		if g.Group == "default" || g.Group == "" {
			if g.Reason != "" {
				return g.Mechanism + ": " + g.Reason, nil
			}
			return g.Mechanism, nil
		}
	}
	return "", errors.New("the node's status names no steering for its receivers")
}

// skewRun dials the heavy connections, lets them settle, dials the light
// ones, and measures for o.Duration after o.Warmup.
func skewRun(ctx context.Context, s *system, setup skewSetup, o runOptions) (skewFigures, []time.Duration, error) {
	var f skewFigures
	ctx, cancel := context.WithTimeout(ctx, setup.Settle+o.Warmup+o.Duration+time.Minute)
	defer cancel()
	var conns []*netio.MuxConn
	defer func() {
		for _, mc := range conns {
			mc.Close(nil)
		}
	}()
	dial := func() (*netio.MuxConn, int, error) {
		nc, err := net.DialTimeout("tcp", s.Addr, 2*time.Second)
		if err != nil {
			return nil, 0, err
		}
		mc := netio.NewMuxConn(nc, netio.MuxOptions{MaxPayload: 2 * setup.HeavyBytes})
		conns = append(conns, mc)
		here, err := socketOf(mc)
		return mc, here, err
	}
	placement := make([]float64, setup.Receivers)
	heavyAt := make([]float64, setup.Receivers)
	var stop atomic.Bool
	var measuring atomic.Bool
	var heavyCalls, errs atomic.Int64
	var wg sync.WaitGroup
	defer func() { stop.Store(true); cancel(); wg.Wait() }()
	heavy := make([]byte, setup.HeavyBytes)
	for range setup.Heavy {
		mc, here, err := dial()
		if err != nil {
			return f, nil, fmt.Errorf("heavy connection: %w", err)
		}
		if here >= 0 && here < len(heavyAt) {
			heavyAt[here]++
		}
		sem := make(chan struct{}, setup.Depth)
		wg.Go(func() {
			for !stop.Load() {
				select {
				case <-ctx.Done():
					return
				case sem <- struct{}{}:
				}
				_, sent, _ := mc.Call(netio.Header{Kind: netio.KindCall, TimeoutMs: uint32(s8CallLimit / time.Millisecond)}, "bench", "echo", heavy,
					time.Time{}, answerFunc(func(fr netio.Frame, err error) {
						<-sem
						switch {
						case err != nil || fr.Kind != netio.KindReply:
							if !stop.Load() {
								errs.Add(1)
							}
						case measuring.Load():
							heavyCalls.Add(1)
						}
					}))
				if !sent {
					<-sem
					if !stop.Load() {
						errs.Add(1)
					}
					return // the connection is gone
				}
			}
		})
	}
	if !sleepUntil(ctx, time.Now().Add(setup.Settle)) {
		return f, nil, ctx.Err()
	}
	type lightConn struct {
		mc        *netio.MuxConn
		withHeavy bool
		lat       []time.Duration
	}
	lights := make([]*lightConn, setup.Light)
	for i := range lights {
		mc, here, err := dial()
		if err != nil {
			return f, nil, fmt.Errorf("light connection: %w", err)
		}
		lc := &lightConn{mc: mc}
		if here >= 0 && here < len(placement) {
			placement[here]++
			lc.withHeavy = heavyAt[here] > 0
		}
		lights[i] = lc
	}
	msg := make([]byte, setup.LightBytes)
	for _, lc := range lights {
		wg.Go(func() {
			for !stop.Load() {
				t0 := time.Now()
				fr, err := callOnce(ctx, lc.mc, netio.Header{Kind: netio.KindCall, TimeoutMs: uint32(s8CallLimit / time.Millisecond)}, "bench", "echo", msg)
				d := time.Since(t0)
				switch {
				case stop.Load():
					return
				case err != nil || fr.Kind != netio.KindReply:
					errs.Add(1)
					if err != nil {
						return
					}
				case measuring.Load():
					lc.lat = append(lc.lat, d)
				}
				time.Sleep(setup.Think)
			}
		})
	}
	if !sleepUntil(ctx, time.Now().Add(o.Warmup)) {
		return f, nil, ctx.Err()
	}
	errs.Store(0)
	measuring.Store(true)
	if !sleepUntil(ctx, time.Now().Add(o.Duration)) {
		return f, nil, ctx.Err()
	}
	measuring.Store(false)
	stop.Store(true)
	for _, mc := range conns {
		mc.Close(nil) // answers what is still in flight; the goroutines end
	}
	wg.Wait()
	var all, with, apart []time.Duration
	for _, lc := range lights {
		all = append(all, lc.lat...)
		if lc.withHeavy {
			with = append(with, lc.lat...)
		} else {
			apart = append(apart, lc.lat...)
		}
	}
	if len(all) == 0 {
		return f, nil, fmt.Errorf("no light call answered (%d errors)", errs.Load())
	}
	light := summarize(all)
	f.LightPerS = float64(len(all)) / o.Duration.Seconds()
	f.HeavyPerS = float64(heavyCalls.Load()) / o.Duration.Seconds()
	f.LightP50us, f.LightP90us, f.LightP99us, f.LightP999us = us(light.P50), us(light.P90), us(light.P99), us(light.P999)
	f.P99WithHeavyUs, f.P99ApartUs = us(summarize(with).P99), us(summarize(apart).P99)
	f.Errors = float64(errs.Load())
	f.Placement, f.HeavyAt = placement, heavyAt
	for i, n := range placement {
		if heavyAt[i] > 0 {
			f.LightOnHeavy += n
		}
	}
	return f, all, nil
}

// answerFunc is a netio.Answerer made of a function.
type answerFunc func(netio.Frame, error)

func (a answerFunc) Answer(f netio.Frame, err error) { a(f, err) }

// callOnce sends one call (or name lookup) on mc and waits for its answer,
// at most s8CallLimit.
func callOnce(ctx context.Context, mc *netio.MuxConn, h netio.Header, group, service string, payload []byte) (netio.Frame, error) {
	type answer struct {
		f   netio.Frame
		err error
	}
	ch := make(chan answer, 1)
	id, sent, err := mc.Call(h, group, service, payload, time.Time{}, answerFunc(func(f netio.Frame, err error) { ch <- answer{f, err} }))
	if !sent {
		if err == nil {
			err = errors.New("call not sent")
		}
		return netio.Frame{}, err
	}
	t := time.NewTimer(s8CallLimit)
	defer t.Stop()
	select {
	case a := <-ch:
		return a.f, a.err
	case <-ctx.Done():
		mc.Forget(id)
		return netio.Frame{}, ctx.Err()
	case <-t.C:
		mc.Forget(id)
		return netio.Frame{}, fmt.Errorf("no answer within %v", s8CallLimit)
	}
}

// socketOf asks the node which of its receiving sockets mc is on.
func socketOf(mc *netio.MuxConn) (int, error) {
	f, err := callOnce(context.Background(), mc, netio.Header{Kind: netio.KindNameLookup}, "bench", netio.LookupReceivers, nil)
	if err != nil {
		return -1, fmt.Errorf("receivers lookup: %w", err)
	}
	if f.Kind != netio.KindReply {
		return -1, fmt.Errorf("receivers lookup: %v %s", f.Kind, strings.TrimSpace(string(f.Payload)))
	}
	r, err := netio.ParseReceivers(f.Payload)
	if err != nil {
		return -1, err
	}
	return r.Here, nil
}

// skewVerdict compares the two placements' medians.
func skewVerdict(results []skewResult, g skewSetup) string {
	var hash, steer *skewResult
	for i := range results {
		switch results[i].System {
		case nameSkewHash:
			hash = &results[i]
		case nameSkewSteer:
			steer = &results[i]
		}
	}
	if hash == nil || steer == nil {
		return "Hash and steering were not both measured, so there is nothing to compare (steering needs CAP_BPF and CAP_NET_ADMIN, Linux 5.5)."
	}
	h, s := hash.Median, steer.Median
	return fmt.Sprintf("**Steering against the hash** (medians): light connections on a socket with a heavy one %.0f against %.0f of %d; "+
		"light p99 %s against %s (%s), p50 %s against %s; light calls %.0f/s against %.0f/s; heavy calls %.0f/s against %.0f/s (%s).",
		s.LightOnHeavy, h.LightOnHeavy, g.Light, dur(s.LightP99us), dur(h.LightP99us), ratio(s.LightP99us, h.LightP99us),
		dur(s.LightP50us), dur(h.LightP50us), s.LightPerS, h.LightPerS, s.HeavyPerS, h.HeavyPerS, ratio(s.HeavyPerS, h.HeavyPerS))
}

func s8Setup(g skewSetup, o runOptions, quick bool) []string {
	out := []string{
		fmt.Sprintf("One scdd receiving on %d sockets of one port (set scdmulti = %d: a gnet event loop each, SO_REUSEPORT), the group \"bench\" "+
			"served by %d resident uap-echo processes (echo), queue_size %d, max_message_size 1 MiB.", g.Receivers, g.Receivers, g.Workers, s8Queue),
		fmt.Sprintf("Load: %d heavy connection(s), each keeping %d echo calls of %d KiB in flight, dial first; %v later %d light connections dial, "+
			"each making one %d-byte echo call, then pausing %v, over and over. Each connection asks the node which socket it landed on "+
			"(a receivers name lookup).", g.Heavy, g.Depth, g.HeavyBytes>>10, g.Settle, g.Light, g.LightBytes, g.Think),
		fmt.Sprintf("%s: scdd with TPSCHED_STEERING=off, so the kernel places each new connection by a hash of its addresses. %s: bpf/steer.c "+
			"attached to the sockets, so a new connection goes to the socket with the least work (calls in flight + connections + one per 4 KiB "+
			"read per second lately).", nameSkewHash, nameSkewSteer),
		fmt.Sprintf("Each figure is the median of %d runs per system, alternating which goes first, each on a node started afresh, with %v of "+
			"warm-up and %v measured. Light p50/p99 are of the light calls answered in the window; 'with heavy' are those of light connections "+
			"on a socket that has a heavy one. Errors are calls answered with an error or not at all in the window.", o.Runs, o.Warmup, o.Duration),
	}
	if quick {
		out = append(out, "Quick mode: shorter runs; for development only.")
	}
	return append(out, "The load generator runs on the same cores as scdd and its UAPs; with more receiving sockets than cores steering "+
		"cannot isolate anything (docs/ARCHITECTURE.md, \"Steering, measured\").")
}

// writeSkew writes S8: the figures of each placement and each run.
func (r *report) writeSkew(b *strings.Builder) {
	b.WriteString("## Figures\n\n")
	b.WriteString("| system | light conns on the heavy socket | light calls/s | light p50 | light p90 | light p99 | light p99.9 | light p99 with heavy / apart | heavy calls/s | light per socket | errors |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, res := range r.SkewResults {
		f := res.Median
		fmt.Fprintf(b, "| %s | %.0f of %d | %.0f | %s | %s | %s | %s | %s / %s | %.0f | %s | %.0f |\n",
			res.System, f.LightOnHeavy, r.Skew.Light, f.LightPerS, dur(f.LightP50us), dur(f.LightP90us), dur(f.LightP99us), dur(f.LightP999us),
			durOrNone(f.P99WithHeavyUs), durOrNone(f.P99ApartUs), f.HeavyPerS, joinFloats(f.Placement, "%.0f"), f.Errors)
	}
	b.WriteString("\n")
	for _, res := range r.SkewResults {
		fmt.Fprintf(b, "%s: the node said %s.\n\n", res.System, res.Mechanism)
	}
	if len(r.SkewResults) > 0 && r.Runs > 1 {
		b.WriteString("### Each run\n\n")
		b.WriteString("| system | run | light on heavy | light calls/s | light p50 | light p99 | with heavy / apart | heavy calls/s | light per socket (heavy) | errors |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, res := range r.SkewResults {
			for i, f := range res.Runs {
				drawn := ""
				if i == res.Drawn {
					drawn = " (plotted)"
				}
				fmt.Fprintf(b, "| %s | %d%s | %.0f | %.0f | %s | %s | %s / %s | %.0f | %s (%s) | %.0f |\n",
					res.System, i+1, drawn, f.LightOnHeavy, f.LightPerS, dur(f.LightP50us), dur(f.LightP99us), durOrNone(f.P99WithHeavyUs),
					durOrNone(f.P99ApartUs), f.HeavyPerS, joinFloats(f.Placement, "%.0f"), joinFloats(f.HeavyAt, "%.0f"), f.Errors)
			}
		}
		b.WriteString("\n")
	}
}

// durOrNone is dur, or "-" for a latency of no call at all.
func durOrNone(us float64) string {
	if us == 0 {
		return "-"
	}
	return dur(us)
}
