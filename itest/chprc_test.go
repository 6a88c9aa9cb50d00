package itest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"tpsched/internal/testenv"
	"tpsched/scd"
)

// prcOf runs scdctl prc GROUP -json and returns the group's processes.
func prcOf(t *testing.T, n *node, group string) scd.GroupProcesses {
	t.Helper()
	out, err := n.scdctl("prc", group, "-json")
	if err != nil {
		t.Fatalf("scdctl prc %s -json: %v: %s", group, err, out)
	}
	var gs []scd.GroupProcesses
	if err := json.Unmarshal([]byte(out), &gs); err != nil || len(gs) != 1 || gs[0].Group != group {
		t.Fatalf("scdctl prc %s -json: %v: %s", group, err, out)
	}
	return gs[0]
}

// residentPIDs is the pids of the group's resident processes that are
// running (attached), or nil while one is missing or not yet running.
func residentPIDs(t *testing.T, n *node, group string, want int) []int {
	g := prcOf(t, n, group)
	var pids []int
	for _, p := range g.Processes {
		if p.Kind != "resident" {
			continue
		}
		if p.PID == 0 || p.State != "running" {
			return nil
		}
		pids = append(pids, p.PID)
	}
	if len(pids) != want {
		return nil
	}
	return pids
}

// TestChprcOnline: scdctl prc shows what each process does and has used;
// scdctl chprc starts extra residents at once and stops surplus ones after
// their current call, failing no call, and refuses counts over the
// definition's maximum, the node's max_processes, and for a socket server.
func TestChprcOnline(t *testing.T) {
	testenv.Slow(t, "runs for seconds; 8 s without -race on a busy 2-core machine")
	skipShort(t)
	dir := defDir(t, "set max_processes = 5\n", map[string]string{
		"g": fmt.Sprintf(multiServer, "g", "1,3", 100, 200, 8, ""),
		"h": fmt.Sprintf(multiServer, "h", "1,2", 100, 200, 8, ""),
		"s": "set service_group = \"s\"\nset service = \"echo=echo\"\nset module = MODULE\n" +
			"set receive_from = socket\nset parallel_count = 1\n",
	})
	n := startNode(t, "-c", dir)
	c := n.client()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	first := residentPIDs(t, n, "g", 1)
	if first == nil {
		waitFor(t, 10*time.Second, "g's resident process", func() bool { first = residentPIDs(t, n, "g", 1); return first != nil })
	}
	for range 5 {
		if _, err := c.Call(ctx, "g", "echo", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("prc shows pid, kind, state, calls held and served, CPU time, since", func(t *testing.T) {
		held := make(chan error, 1)
		go func() { _, err := c.Call(ctx, "g", "sleep", []byte("1500")); held <- err }()
		waitFor(t, 5*time.Second, "the sleep to be held", func() bool { return prcOf(t, n, "g").Processes[0].Calls == 1 })
		g := prcOf(t, n, "g")
		p := g.Processes[0]
		if len(g.Processes) != 1 || p.PID != first[0] || p.Kind != "resident" || p.State != "running" ||
			p.Served != 5 || p.Started.IsZero() || time.Since(p.Started) > time.Minute || p.CPUSeconds <= 0 {
			t.Errorf("prc g: %+v; want pid %d, resident, running, 1 call held, 5 served, a start time and some CPU", g, first[0])
		}
		if g.Count != (scd.ParallelCount{Resident: 1, Max: 3}) || g.Def != g.Count {
			t.Errorf("prc g: parallel_count %v (defined %v), want 1,3", g.Count, g.Def)
		}
		out, err := n.scdctl("prc")
		if err != nil || !strings.Contains(out, strconv.Itoa(first[0])) || !strings.Contains(out, "g: server g, parallel_count 1,3") ||
			!strings.Contains(out, "h: server h, parallel_count 1,2") || !strings.Contains(out, "CPU-S") {
			t.Errorf("scdctl prc: %v\n%s", err, out)
		}
		t.Logf("scdctl prc:\n%s", out)
		if err := <-held; err != nil {
			t.Errorf("the sleep call: %v", err)
		}
	})

	t.Run("more residents start at once; a call in flight goes on", func(t *testing.T) {
		held := make(chan error, 1)
		go func() { _, err := c.Call(ctx, "g", "sleep", []byte("1500")); held <- err }()
		waitFor(t, 5*time.Second, "the sleep to be held", func() bool { return prcOf(t, n, "g").Processes[0].Calls == 1 })
		out, err := n.scdctl("chprc", "g", "3")
		if err != nil || !strings.Contains(out, "parallel_count 1,3 -> 3,3") || !strings.Contains(out, "2 more resident process(es) start") {
			t.Fatalf("scdctl chprc g 3: %v\n%s", err, out)
		}
		t.Logf("scdctl chprc g 3:\n%s", out)
		// One line says the change, one who asked it; a chprc that changes
		// nothing says nothing changed.
		if log := n.stderr.String(); strings.Count(log, "parallel_count changed") != 1 ||
			!strings.Contains(log, `msg="control request" path=/chprc query="group=g&resident=3" uid=`+strconv.Itoa(os.Getuid())+` `) {
			t.Errorf("scdd's log of chprc g 3: want one change line and the asker's:\n%s", grep(log, "parallel_count")+"\n"+grep(log, "control request"))
		}
		if out, err := n.scdctl("chprc", "g", "3"); err != nil || !strings.Contains(out, "nothing changed") {
			t.Errorf("scdctl chprc g 3 again: %v\n%s", err, out)
		}
		if log := n.stderr.String(); strings.Count(log, "parallel_count changed") != 1 {
			t.Errorf("a chprc that changed nothing was logged as a change:\n%s", grep(log, "parallel_count"))
		}
		var pids []int
		waitFor(t, 10*time.Second, "three resident processes running", func() bool { pids = residentPIDs(t, n, "g", 3); return pids != nil })
		if pids[0] != first[0] {
			t.Errorf("the first resident changed: %d -> %d", first[0], pids[0])
		}
		if err := <-held; err != nil {
			t.Errorf("the call held across the change: %v", err)
		}
		// The three serve at once: three sleeps are held one by each.
		done := make(chan chan error, 1)
		go func() { done <- sleeps(ctx, c, "g", 3, "1500") }()
		waitFor(t, 5*time.Second, "each resident to hold one of three calls", func() bool {
			for _, p := range prcOf(t, n, "g").Processes {
				if p.Calls != 1 {
					return false
				}
			}
			return true
		})
		for err := range <-done {
			t.Errorf("sleep: %v", err)
		}
		g := groupStatus(t, n, "g")
		if g.Resident != 3 || g.Max != 3 || countKind(g, "resident") != 3 {
			t.Errorf("status after chprc: resident %d max %d, processes %+v", g.Resident, g.Max, g.Processes)
		}
		if m := n.metrics(); !strings.Contains(m, `tpsched_processes{group="g",kind="resident"} 3`) {
			t.Errorf("/metrics: %s", grep(m, `tpsched_processes{group="g"`))
		}
	})

	t.Run("refused over the limits, nothing changed", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"g", "4"}, "above 3, the maximum of parallel_count in its definition"},
			{[]string{"g", "3,5"}, "above 3, the maximum of parallel_count in its definition"},
			{[]string{"g", "2,1"}, "more resident processes than the maximum"},
			{[]string{"h", "2"}, "the node's max_processes is 5 and its other servers keep 4 resident processes"},
			{[]string{"s", "0"}, "a socket-receiving server runs exactly one process"},
			{[]string{"nope", "1"}, "no such service group"},
			{[]string{"g", "two"}, "RESIDENT is a whole number"},
		} {
			out, err := n.scdctl(append([]string{"chprc"}, tc.args...)...)
			if err == nil || !strings.Contains(out, tc.want) {
				t.Errorf("scdctl chprc %s: %v: %q, want an error saying %q", strings.Join(tc.args, " "), err, out, tc.want)
			}
		}
		if g := prcOf(t, n, "g"); g.Count != (scd.ParallelCount{Resident: 3, Max: 3}) {
			t.Errorf("g after refusals: %v, want 3,3", g.Count)
		}
		if g := prcOf(t, n, "h"); g.Count != (scd.ParallelCount{Resident: 1, Max: 2}) {
			t.Errorf("h after refusals: %v, want 1,2", g.Count)
		}
	})

	t.Run("fewer residents: the surplus finish their calls, then stop and are not replaced", func(t *testing.T) {
		pids := residentPIDs(t, n, "g", 3)
		if pids == nil {
			t.Fatal("g does not run three residents")
		}
		var wg sync.WaitGroup
		var failed []error
		var mu sync.Mutex
		// Long enough to outlast the chprc below, also when scdd and
		// scdctl run under the race detector.
		sleep := "1500"
		if raceBuild {
			sleep = "4000"
		}
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := c.Call(ctx, "g", "sleep", []byte(sleep)); err != nil {
					mu.Lock()
					failed = append(failed, err)
					mu.Unlock()
				}
			}()
		}
		waitFor(t, 5*time.Second, "each resident to hold a call", func() bool {
			for _, p := range prcOf(t, n, "g").Processes {
				if p.Calls != 1 {
					return false
				}
			}
			return true
		})
		out, err := n.scdctl("chprc", "g", "1", "-json")
		if err != nil {
			t.Fatalf("scdctl chprc g 1 -json: %v: %s", err, out)
		}
		var res scd.ChprcResult
		must(t, json.Unmarshal([]byte(out), &res))
		if res.Before != (scd.ParallelCount{Resident: 3, Max: 3}) || res.Count != (scd.ParallelCount{Resident: 1, Max: 3}) {
			t.Errorf("chprc -json: %+v", res)
		}
		// Still alive: they finish their call first.
		for _, pid := range pids[1:] {
			if !pidAlive(pid) {
				t.Errorf("process %d stopped before its call ended", pid)
			}
		}
		wg.Wait()
		if len(failed) > 0 {
			t.Fatalf("%d calls failed across the stop: %v", len(failed), failed)
		}
		waitFor(t, 10*time.Second, "the surplus processes to exit", func() bool { return !pidAlive(pids[1]) && !pidAlive(pids[2]) })
		time.Sleep(300 * time.Millisecond) // longer than a restart back-off
		g := prcOf(t, n, "g")
		if len(g.Processes) != 1 || g.Processes[0].PID != pids[0] || g.Processes[0].Restarts != 0 {
			t.Errorf("after chprc g 1: %+v; want the first resident alone, never restarted", g.Processes)
		}
		if _, err := c.Call(ctx, "g", "echo", []byte("still")); err != nil {
			t.Errorf("a call after the change: %v", err)
		}
	})

	t.Run("a lower maximum holds non-resident processes back", func(t *testing.T) {
		out, err := n.scdctl("chprc", "g", "1,1")
		if err != nil || !strings.Contains(out, "parallel_count 1,3 -> 1,1") {
			t.Fatalf("scdctl chprc g 1,1: %v\n%s", err, out)
		}
		errs := sleeps(ctx, c, "g", 4, "100") // balance_count 100: no start anyway; max 1: none at all
		for err := range errs {
			t.Errorf("sleep: %v", err)
		}
		if g := groupStatus(t, n, "g"); len(g.Processes) != 1 || g.Max != 1 {
			t.Errorf("status with max 1: %+v", g)
		}
	})
}

// sleeps makes k concurrent sleep calls of ms and returns their errors once
// all are answered.
func sleeps(ctx context.Context, c interface {
	Call(context.Context, string, string, []byte) ([]byte, error)
}, group string, k int, ms string) chan error {
	errs := make(chan error, k)
	var wg sync.WaitGroup
	for range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Call(ctx, group, "sleep", []byte(ms)); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	return errs
}
