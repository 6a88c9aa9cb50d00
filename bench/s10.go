package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"tpsched/bench/uapcall"
	"tpsched/netio"
)

// S10 compares local calls, a service calling a service on the same node,
// in one run: tpsched's caller UAPs (tpsched local call) against Enduro/X's
// exbenchcl/exbenchsv, beside the same echo reached over TCP directly
// (tpsched) and through a front UAP's local call (tpsched nested call).

const (
	// s10Front is the processes of the nested call's front group: a
	// process waits for its local call, so it is as many callers as
	// Enduro/X's 5x5 figure has client processes.
	s10Front = 5
	// callersGroup is the group of the caller UAPs.
	callersGroup = "callers"
	// runSetup is the time the harness gives its run calls to reach the
	// callers before their warm-up counts.
	runSetup = 100 * time.Millisecond
)

// startTpschedNested is startTpsched with the calls made by a second
// group's UAPs (front, s10Front processes) through their shared memory.
func startTpschedNested(env Env, sp Spec) (*system, error) {
	return startTpschedWith(env, sp, tpschedConf{name: nameTpschedNested, module: "uap-echo", parallel: fmt.Sprint(sp.Workers), front: true})
}

// startTpschedLocal is startTpsched plus a group of sp.Callers caller
// UAPs, which make the cell's calls (driveLocal).
func startTpschedLocal(env Env, sp Spec) (*system, error) {
	return startLocalCalls(env, sp, tpschedConf{name: nameTpschedLocal, module: "uap-echo"})
}

// startTpschedLocalC is startTpschedLocal with C UAPs on both sides:
// uap-caller-c calling uap-echo-c.
func startTpschedLocalC(env Env, sp Spec) (*system, error) {
	return startLocalCalls(env, sp, tpschedConf{name: nameTpschedLocalC, module: "uap-echo-c", callerModule: "uap-caller-c"})
}

// startLocalCalls starts tc with sp.Workers bench processes and sp.Callers
// callers, and drives its cells through the callers.
func startLocalCalls(env Env, sp Spec, tc tpschedConf) (*system, error) {
	callers := max(sp.Callers, 1)
	tc.parallel, tc.callers = fmt.Sprint(sp.Workers), callers
	s, err := startTpschedWith(env, sp, tc)
	if err != nil {
		return nil, err
	}
	// Every caller attached before any run: a run call that waits for a
	// process to start would lose its warm-up.
	deadline := time.Now().Add(60 * time.Second)
	for {
		pids, err := tpschedRunning(s.status, callersGroup)
		if err == nil && len(pids) == callers {
			break
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("%d of %d caller UAPs running after 60 s (%v)\n%s", len(pids), callers, err, s.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.drive = func(ctx context.Context, o runOptions, c *gridCell, w *window) (result, error) {
		return driveLocal(ctx, s, callers, o, c, w)
	}
	return s, nil
}

// tpschedRunning is the pids of group's processes that attached.
func tpschedRunning(url, group string) ([]int, error) {
	var st struct {
		Groups []statusGroup `json:"groups"`
	}
	if err := getJSON(url, &st); err != nil {
		return nil, err
	}
	var out []int
	for _, g := range st.Groups {
		if g.Group != group {
			continue
		}
		for _, p := range g.Processes {
			if p.PID != 0 && p.State == "running" {
				out = append(out, p.PID)
			}
		}
	}
	return out, nil
}

// driveLocal runs one cell of local calls: the harness sends a run call to
// c.Conns of the callers (each on a connection of its own, so each lands
// on a process of its own, the others being busy with theirs), samples
// the window while they call bench/echo, and merges their summaries.
func driveLocal(ctx context.Context, s *system, callers int, o runOptions, c *gridCell, w *window) (result, error) {
	n := c.Conns
	if n > callers {
		return result{}, fmt.Errorf("a cell of %d callers, the group has %d (Spec.Callers)", n, callers)
	}
	all, err := tpschedRunning(s.status, callersGroup)
	if err != nil {
		return result{}, err
	}
	start := time.Now().Add(runSetup + o.Warmup)
	end := start.Add(o.Duration)
	req := uapcall.Run{Group: "bench", Service: c.Service, Payload: c.Payload, Start: start, End: end}.Encode()
	type answer struct {
		sum uapcall.Summary
		err error
	}
	answers := make(chan answer, n)
	for range n {
		go func() {
			reply, err := runCall(s.Addr, callersGroup, "run", req, end.Add(30*time.Second))
			if err != nil {
				answers <- answer{err: err}
				return
			}
			sum, err := uapcall.ParseSummary(reply)
			answers <- answer{sum, err}
		}()
	}
	if sleepUntil(ctx, start) {
		w.begin()
		if sleepUntil(ctx, end) {
			w.end()
		}
	}
	var sums []uapcall.Summary
	var errs []error
	for range n {
		a := <-answers
		if a.err != nil {
			errs = append(errs, a.err)
			continue
		}
		sums = append(sums, a.sum)
	}
	if err := errors.Join(errs...); err != nil {
		return result{}, fmt.Errorf("run calls: %w", err)
	}
	if ctx.Err() != nil {
		return result{}, ctx.Err()
	}
	res, err := mergeSummaries(sums, o.Duration)
	if err != nil {
		return result{}, err
	}
	res.Idle = slices.DeleteFunc(all, func(p int) bool { return slices.Contains(res.Loadgen, p) })
	began, ended := w.span()
	res.Sampled = sampledShare(start, end, began, ended)
	return res, nil
}

// sampledShare is the part of the callers' window [start, end) that the
// harness's samples, taken at began and ended, cover: a sample late by
// the time the harness waited for a CPU leaves that much of the window
// out.
func sampledShare(start, end, began, ended time.Time) float64 {
	if began.IsZero() || ended.IsZero() || !end.After(start) {
		return 0
	}
	from, to := start, end
	if began.After(from) {
		from = began
	}
	if ended.Before(to) {
		to = ended
	}
	if !to.After(from) {
		return 1e-9 // nothing of the window sampled
	}
	return float64(to.Sub(from)) / float64(end.Sub(start))
}

// mergeSummaries is the run's result from the callers' summaries: their
// counts summed, throughput as the calls answered in the window per
// second, latency from the merged histograms. Each summary must come from
// a process of its own, and every reply must have echoed its request.
func mergeSummaries(sums []uapcall.Summary, window time.Duration) (result, error) {
	var r result
	var hist uapcall.Histogram
	inWindow, bad := 0, 0
	for _, s := range sums {
		if slices.Contains(r.Loadgen, s.PID) {
			return result{}, fmt.Errorf("bench: two run calls went to caller %d: the callers were not all free", s.PID)
		}
		r.Loadgen = append(r.Loadgen, s.PID)
		r.Calls += s.OK
		r.Refused += s.Refused
		r.Failed += s.Failed
		r.TimedOut += s.TimedOut
		r.Offered += s.Sent()
		inWindow += s.InWindow
		bad += s.Bad
		hist.Merge(s.Hist)
	}
	if bad > 0 {
		return result{}, fmt.Errorf("bench: %d local calls answered with a reply that does not echo the request", bad)
	}
	if r.Calls == 0 && r.Refused == 0 {
		return result{}, fmt.Errorf("bench: no local call answered (%d failed, %d timed out)", r.Failed, r.TimedOut)
	}
	r.Throughput = float64(inWindow) / window.Seconds()
	lat := hist.Durations()
	r.Latency = summarize(lat)
	r.CDF = cdfOf(lat, 120)
	return r, nil
}

// runCall makes one call over a connection of its own and returns the
// reply; an error answer is an error.
func runCall(addr, group, service string, req []byte, deadline time.Time) ([]byte, error) {
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	mc := netio.NewMuxConn(nc, netio.MuxOptions{MaxPayload: 64 << 20, CallerReads: true})
	defer mc.Close(nil)
	timeout := uint32(max(time.Until(deadline)/time.Millisecond, 1))
	f, _, err := mc.RoundTrip(netio.Header{Kind: netio.KindCall, TimeoutMs: timeout}, group, service, req, deadline, make([]byte, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("%s/%s: %w", group, service, err)
	}
	if f.Kind != netio.KindReply {
		return nil, fmt.Errorf("%s/%s: error answer %d: %s", group, service, f.Code, f.Payload)
	}
	return f.Payload, nil
}

// enduroxChoice says how Enduro/X is set up.
func enduroxChoice(sp Spec) string {
	servers := "as many exbenchsv server processes as the cell has callers (1x1 and 5x5, as Enduro/X's own published benchmark runs them)"
	if sp.EnduroXServers > 0 {
		servers = fmt.Sprintf("%d exbenchsv server processes in every cell", sp.EnduroXServers)
	}
	return fmt.Sprintf("Enduro/X: its own benchmark pair, built from source (-O2, release build, epoll over POSIX queues, logging at errors only), "+
		"under its daemon ndrxd with the sample configuration's timers; exbenchcl -n N (N client threads, each with its own XATMI context and reply queue, calling "+
		"EXBENCH in a loop with tpcall; its -F, N processes, sums their calls/s into an uninitialised variable in this version and reports garbage) "+
		"against %s. The request is a UBF buffer with one field of the cell's payload size (-S: exbenchcl allocates it and does not fill it, so its content is whatever malloc returned; the size, not the content, is what is chosen), plus 64 bytes of UBF. NDRX_MSGMAX=%d, "+
		"NDRX_MSGSIZEMAX=%d: this VM caps POSIX queues at 10 messages of 8 KiB and 800 KiB of queues per user, without the privilege to raise "+
		"them, and no queue holds more than 5 messages in a closed loop of 5 callers. exbenchcl reports calls/s over its whole -t (whole seconds, "+
		"set to hold the warm-up and the window): that is the calls/s shown; the per-call figures are over a window inside its run, which "+
		"starts a warm-up after the servers first wake; the mean latency is callers / calls/s (Little's law), percentiles are not measured.",
		servers, enduroxQueueDepth, enduroxMsgSize)
}

// s10Cell is the report's cell of payload and conns, nil if none.
func s10Cell(r *report, payload, conns int) *gridCell {
	for i := range r.Cells {
		if c := &r.Cells[i]; c.Payload == payload && c.Conns == conns {
			return c
		}
	}
	return nil
}

// s10Notes sets the local calls beside Enduro/X's and the direct call
// against the issues' targets: one caller >= Enduro/X 1x1 calls/s with p50
// <= its mean latency, five >= Enduro/X 5x5, 64 and 128 >= 0.8x the direct
// path at as many connections and (issue 28) >= 0.9x the local calls of 5
// callers with p99 <= 5 ms, a nested call no dearer than a direct call
// plus a local call.
func s10Notes(r *report) string {
	var b strings.Builder
	b.WriteString("**Targets** (issues 20 and 28: local calls alone against Enduro/X in the same run, and callers that outnumber the cores).")
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	get := func(c *gridCell, name string) *Figures {
		if m := c.Result(name); m != nil && len(m.Runs) > 0 {
			return &m.Median
		}
		return nil
	}
	// vsEnduroX sets who's calls/s (l) against Enduro/X's NxN (ex).
	vsEnduroX := func(w *strings.Builder, who string, l, ex *Figures, n int) {
		fmt.Fprintf(w, " %s %.1fk calls/s vs Enduro/X %dx%d %.1fk (%.2fx, %s)",
			who, l.Throughput/1e3, n, n, ex.Throughput/1e3, l.Throughput/ex.Throughput, verdict(l.Throughput >= ex.Throughput))
	}
	// vsFive is issue 28's: callers that outnumber the cores degrade
	// gracefully, no cliff, against the same system's 5 callers.
	vsFive := func(w *strings.Builder, who, system string, c *gridCell, l *Figures) {
		five := s10Cell(r, c.Payload, 5)
		if five == nil {
			return
		}
		if l5 := get(five, system); l5 != nil && l5.Throughput > 0 {
			fmt.Fprintf(w, " %s vs 5 callers %.1fk (%.2fx, target 0.9x: %s), p99 %s (target 5 ms: %s);",
				who, l5.Throughput/1e3, l.Throughput/l5.Throughput, verdict(l.Throughput >= 0.9*l5.Throughput),
				dur(l.P99us), verdict(l.P99us <= 5000))
		}
	}
	for i := range r.Cells {
		c := &r.Cells[i]
		local, ex, direct, nested := get(c, nameTpschedLocal), get(c, nameEnduroX), get(c, nameTpsched), get(c, nameTpschedNested)
		if local == nil {
			continue
		}
		fmt.Fprintf(&b, " %s x %d:", payloadName(*c), c.Conns)
		switch {
		case c.Conns == 1 && ex != nil:
			vsEnduroX(&b, "local", local, ex, 1)
			fmt.Fprintf(&b, ", p50 %s vs Enduro/X mean %s (%s);", dur(local.P50us), dur(ex.MeanUs), verdict(local.P50us <= ex.MeanUs))
		case c.Conns == 5 && ex != nil:
			vsEnduroX(&b, "local", local, ex, 5)
			b.WriteString(";")
		case c.Conns >= 64 && direct != nil:
			fmt.Fprintf(&b, " local %.1fk calls/s vs direct %.1fk (%.2fx, target 0.8x: %s);",
				local.Throughput/1e3, direct.Throughput/1e3, local.Throughput/direct.Throughput, verdict(local.Throughput >= 0.8*direct.Throughput))
		default:
			b.WriteString(" Enduro/X not measured;")
		}
		if c.Conns >= 64 {
			vsFive(&b, "local", nameTpschedLocal, c, local)
		}
		if nested != nil && direct != nil {
			// The nested call's server includes its front UAP, the caller:
			// its bound counts the local caller's CPU too.
			bound, cpu := direct.P50us+local.P50us, direct.CPUus+local.CPUus+local.LoadgenCPUus
			fmt.Fprintf(&b, " nested p50 %s vs direct + local %s (%s), CPU %.1f vs %.1f us/call (%s);",
				dur(nested.P50us), dur(bound), verdict(nested.P50us <= bound), nested.CPUus, cpu, verdict(nested.CPUus <= cpu))
		}
	}
	// The same targets for the C UAPs, whose two sides run without a
	// language runtime as Enduro/X's do.
	var cb strings.Builder
	for i := range r.Cells {
		c := &r.Cells[i]
		lc, ex := get(c, nameTpschedLocalC), get(c, nameEnduroX)
		if lc == nil {
			continue
		}
		fmt.Fprintf(&cb, " %s x %d:", payloadName(*c), c.Conns)
		switch {
		case (c.Conns == 1 || c.Conns == 5) && ex != nil:
			vsEnduroX(&cb, "C", lc, ex, c.Conns)
			cb.WriteString(";")
		case c.Conns >= 64:
			fmt.Fprintf(&cb, " C %.1fk calls/s;", lc.Throughput/1e3)
			vsFive(&cb, "C", nameTpschedLocalC, c, lc)
		default:
			cb.WriteString(" Enduro/X not measured;")
		}
	}
	out := strings.TrimSuffix(b.String(), ";") + "."
	if cb.Len() > 0 {
		out += " With C UAPs (" + nameTpschedLocalC + "):" + strings.TrimSuffix(cb.String(), ";") + "."
	}
	return out
}
