package itest

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"tpsched/bpf"
	"tpsched/internal/testenv"
	"tpsched/procmgr"
	"tpsched/scd/loadlevel"
)

// One process serving 100 ms sleeps takes 10 calls/s.
const loadServer = `set service_group = %q
set service = "sleep=sleep", "burn=burn", "cpu=cpu", "echo=echo"
set module = MODULE
set parallel_count = 1
set queue_size = 256
set loadcheck_interval = 1
set loadlevel_message = Y
%s`

// changeLine is the log line of a load level change.
var changeLine = regexp.MustCompile(`msg="load level changed" group=(\S+) from=(LEVEL\d) to=(LEVEL\d) Q=(\d+) q=(\d+) processed=(\d+)`)

// TestLoadLevelsFollowTheQueue offers two groups twice what they serve,
// then stops. The group on Table 3-12 must climb through LEVEL1 to LEVEL2,
// the one on Table 3-14 must reach LEVEL2; both return to LEVEL0 once their
// queues are empty. Every change the node logs must be the one the tables
// give for the Q, q and processed it logged with it.
func TestLoadLevelsFollowTheQueue(t *testing.T) {
	testenv.Slow(t, "runs for seconds; 8 s without -race on a busy 2-core machine")
	skipShort(t)
	th := &loadlevel.Thresholds{U1: 5, U2: 15, D0: 2, D1: 8}
	dir := defDir(t, "", map[string]string{
		"rate": fmt.Sprintf(loadServer, "rate", ""),
		"thr": fmt.Sprintf(loadServer, "thr", fmt.Sprintf("set levelup_queue_count = %d,%d\nset leveldown_queue_count = %d,%d\n",
			th.U1, th.U2, th.D0, th.D1)),
	})
	n := startNode(t, "-c", dir)
	c := n.client()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// 20 calls/s for 3 s to each group: twice what one process serves.
	tick := time.NewTicker(50 * time.Millisecond)
	sawLevel2 := map[string]bool{}
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); <-tick.C {
		for _, g := range []string{"rate", "thr"} {
			must(t, c.CallNoReply(ctx, g, "sleep", []byte("100")))
		}
		for _, g := range []string{"rate", "thr"} {
			if ls := groupStatus(t, n, g).Load; ls.Level == "LEVEL2" && !sawLevel2[g] {
				sawLevel2[g] = true
				if ls.Remaining == 0 || ls.Checked.IsZero() {
					t.Errorf("%s at LEVEL2 shows no queue: %+v", g, ls)
				}
				if g == "rate" && (ls.Rate == nil || *ls.Rate >= 50) {
					t.Errorf("rate at LEVEL2 with processing rate %v; Table 3-12 needs X < 50", ls.Rate)
				}
			}
		}
	}
	tick.Stop()
	// Empty as the last check saw them, too: thr's table lets it down to
	// LEVEL0 with up to D0 calls still queued, and the load gauges below
	// show that check until the next one.
	waitFor(t, 20*time.Second, "both groups back at LEVEL0 with empty queues", func() bool {
		r, h := groupStatus(t, n, "rate").Load, groupStatus(t, n, "thr").Load
		return r.Level == "LEVEL0" && h.Level == "LEVEL0" && r.Remaining == 0 && h.Remaining == 0
	}, n.stderr.String)

	path := map[string][]string{}
	for _, m := range changeLine.FindAllStringSubmatch(n.stderr.String(), -1) {
		group, from, to := m[1], m[2], m[3]
		Q, _ := strconv.ParseUint(m[4], 10, 64)
		q, _ := strconv.Atoi(m[5])
		done, _ := strconv.ParseUint(m[6], 10, 64)
		var rule *loadlevel.Thresholds
		if group == "thr" {
			rule = th
		}
		s := loadlevel.Sample{Queued: Q, Remaining: q, Processed: done}
		if want := loadlevel.Next(parseLevel(t, from), s, rule); want.String() != to {
			t.Errorf("%s: logged %s -> %s for %+v; the table gives %s", group, from, to, s, want)
		}
		if len(path[group]) == 0 {
			path[group] = append(path[group], from)
		}
		path[group] = append(path[group], to)
	}
	t.Logf("levels: %v", path)
	for group, want := range map[string]string{"rate": "LEVEL0 LEVEL1 LEVEL2", "thr": "LEVEL0"} {
		got := strings.Join(path[group], " ")
		if !strings.HasPrefix(got, want) || !strings.Contains(got, "LEVEL2") || !strings.HasSuffix(got, "LEVEL0") {
			t.Errorf("%s went %q; want it to start %q, reach LEVEL2 and end at LEVEL0", group, got, want)
		}
		if !sawLevel2[group] && !strings.Contains(got, "LEVEL2") {
			t.Errorf("%s never reached LEVEL2", group)
		}
	}
	m := n.metrics()
	for _, want := range []string{`tpsched_load_level{group="rate"} 0`, `tpsched_load_level_changes_total{group="rate"} `,
		`tpsched_load_remaining{group="thr"} 0`, `tpsched_load_processing_ratio{group="rate"} `} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	out, err := n.scdctl("status")
	must(t, err)
	if !strings.Contains(out, "LEVEL0") || !strings.Contains(out, "LOAD") {
		t.Errorf("scdctl status shows no load level:\n%s", out)
	}
}

func parseLevel(t *testing.T, s string) loadlevel.Level {
	for l := loadlevel.Level0; l <= loadlevel.Level2; l++ {
		if l.String() == s {
			return l
		}
	}
	t.Fatalf("bad level %q", s)
	return 0
}

// TestGroupCPUFromProbes burns CPU in a group's process and compares the
// CPU time the node reports for the group with /proc's for that process.
func TestGroupCPUFromProbes(t *testing.T) {
	skipShort(t)
	testenv.RequireBPF(t)
	dir := defDir(t, "", map[string]string{"hot": fmt.Sprintf(loadServer, "hot", "")})
	n := startNode(t, "-c", dir)
	c := n.client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 5 {
		// cpu spins for thread CPU time, so a busy machine delays it but
		// cannot give it less.
		_, err := c.Call(ctx, "hot", "cpu", []byte("100000")) // 100 ms each
		must(t, err)
	}
	st, err := n.status()
	must(t, err)
	if st.Probes.Name != bpf.TPBTF || !st.Probes.Histogram {
		t.Fatalf("cpu measurement %+v; want tp_btf on this kernel", st.Probes)
	}
	g := groupStatus(t, n, "hot")
	proc := procCPUSeconds(t, g.Processes[0].PID)
	// stat counts whole clock ticks and truncates utime and stime each, so
	// 500 ms of CPU may read as 0.49 or 0.48.
	if proc < 0.48 {
		t.Fatalf("/proc says %.2f s for 500 ms of CPU", proc)
	}
	if d := g.Usage.Seconds - proc; d < -proc/10 || d > proc/10 {
		t.Errorf("node reports %.3f s of CPU for the group, /proc %.3f s: more than 10%% apart", g.Usage.Seconds, proc)
	}
	if len(g.Usage.Waits) == 0 {
		t.Errorf("no run-queue wait histogram: %+v", g.Usage)
	}
	m := n.metrics()
	for _, want := range []string{`tpsched_cpu_measurement{mechanism="tp_btf"} 1`, `tpsched_group_cpu_seconds_total{group="hot"} `,
		`tpsched_group_runqueue_wait_duration_seconds_bucket{group="hot",le="+Inf"} `} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestCPUMeasurementFallback runs the node with eBPF turned off: it must
// say so, and still measure CPU time from /proc.
func TestCPUMeasurementFallback(t *testing.T) {
	skipShort(t)
	dir := defDir(t, "", map[string]string{"cool": fmt.Sprintf(loadServer, "cool", "")})
	n := startNode(t, "-c", dir, "-cpu-probes", "off")
	c := n.client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := c.Call(ctx, "cool", "burn", []byte("200000"))
	must(t, err)
	st, err := n.status()
	must(t, err)
	if st.Probes.Name != bpf.Proc || st.Probes.Histogram {
		t.Errorf("cpu measurement %+v; want proc without histogram", st.Probes)
	}
	g := groupStatus(t, n, "cool")
	proc := procCPUSeconds(t, g.Processes[0].PID)
	if d := g.Usage.Seconds - proc; proc < 0.05 || d < -0.02 || d > 0.02 || len(g.Usage.Waits) != 0 {
		t.Errorf("group cpu %+v after a 200 ms burn; /proc says %.2f s", g.Usage, proc)
	}
	if m := n.metrics(); !strings.Contains(m, `tpsched_cpu_measurement{mechanism="proc"} 1`) ||
		strings.Contains(m, "runqueue_wait_duration_seconds_bucket") {
		t.Errorf("/metrics does not show the /proc fallback:\n%s", grep(m, "cpu_measurement"))
	}
	out, err := n.scdctl("status")
	must(t, err)
	if !strings.Contains(out, "cpu measurement: proc") {
		t.Errorf("scdctl status does not name the fallback:\n%s", out)
	}
}

// procCPUSeconds is utime + stime of pid from /proc/<pid>/stat.
func procCPUSeconds(t *testing.T, pid int) float64 {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	must(t, err)
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	utime, _ := strconv.Atoi(f[11])
	stime, _ := strconv.Atoi(f[12])
	return float64(utime+stime) / 100
}

// guardServer may grow to 16 processes: balance_count 1 asks for one per
// waiting call beyond the running ones.
const guardServer = `set service_group = %q
set service = "cpu=cpu"
set module = MODULE
set parallel_count = 1,16
set balance_count = 1
set queue_size = 64
set cpu_wait_limit = %d
`

// TestCPUGuardHoldsProcessesNearTheCores floods a CPU-bound group that may
// grow to 16 processes. With the guard its processes stay near the cores
// (they already wait for a CPU, so more cannot help); with cpu_wait_limit 0
// the rule alone takes all 16. Alone on two cores the guard stops at 4 or
// 5; with two CPU hogs beside the test, at 4 to 7: the upper bound is half
// of 16. The lower bound is the guard's other half: it holds starts only
// while the processes wait for a CPU, so a group it kept at its one
// resident process must have waited at least cpu_wait_limit percent of its
// runnable time in the windows it was judged by (how much the machine's
// other work leaves it decides how far it grows, not whether).
func TestCPUGuardHoldsProcessesNearTheCores(t *testing.T) {
	testenv.Slow(t, "runs for seconds; 4 s without -race on a busy 2-core machine")
	skipShort(t)
	testenv.RequireBPF(t) // the guard needs run-queue waits from eBPF
	for _, tc := range []struct {
		limit   int
		atLeast int
		atMost  int
	}{{50, 1, 8}, {0, 16, 16}} { // the limit's lower bound is the waits' (below)
		t.Run(fmt.Sprintf("cpu_wait_limit=%d", tc.limit), func(t *testing.T) {
			dir := defDir(t, "", map[string]string{"hot": fmt.Sprintf(guardServer, "hot", tc.limit)})
			n := startNode(t, "-c", dir)
			c := n.client()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			stop := time.Now().Add(2 * time.Second)
			var wg sync.WaitGroup
			for range 32 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for time.Now().Before(stop) {
						_, _ = c.Call(ctx, "hot", "cpu", []byte("2000"))
					}
				}()
			}
			most := 0
			var waits []int // the guard's windows while one process ran and was busy
			for time.Now().Before(stop) {
				gs := groupStatus(t, n, "hot")
				most = max(most, len(gs.Processes))
				if len(gs.Processes) == 1 && gs.Usage.WaitPercent >= 0 && gs.Usage.BusyPercent >= procmgr.CPUBusyFloor {
					waits = append(waits, gs.Usage.WaitPercent)
				}
				time.Sleep(50 * time.Millisecond)
			}
			wg.Wait()
			st, err := n.status()
			must(t, err)
			slices.Sort(waits)
			t.Logf("most processes %d, guard holds %d, wait %d%%; waits of one busy process %v", most, st.Scaling.CPUGuardHolds,
				groupStatus(t, n, "hot").Usage.WaitPercent, waits)
			if most < tc.atLeast || most > tc.atMost {
				t.Errorf("at most %d processes ran; want %d..%d", most, tc.atLeast, tc.atMost)
			}
			if tc.limit > 0 && most == 1 && len(waits) > 0 && waits[len(waits)/2] < tc.limit {
				t.Errorf("the guard kept the group at one process, which waited for a CPU %d%% of its runnable time (median of %v): below cpu_wait_limit %d, it should have let one more start",
					waits[len(waits)/2], waits, tc.limit)
			}
			if (tc.limit > 0) != (st.Scaling.CPUGuardHolds > 0) {
				t.Errorf("cpu guard holds %d with cpu_wait_limit %d", st.Scaling.CPUGuardHolds, tc.limit)
			}
		})
	}
}
