package bench

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"tpsched/bench/uapcall"
)

// The C caller (cmd/uap-caller-c) under a real scdd, as S10's "tpsched
// local call, C UAPs" runs it: a run it is sent makes echo calls through
// the node, and its summary reads by uapcall's rules (ParseSummary checks
// the histogram holds a latency per call answered OK); a request it cannot
// read is an application error naming the form.
func TestCCallerAnswersARun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds scdd and the C UAPs and starts a node")
	}
	for _, tool := range []string{"make", "gcc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the C caller needs %s: %v", tool, err)
		}
	}
	bin := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"build", filepath.Join(bin, "uap-caller-c")} {
		out, err := exec.CommandContext(ctx, "make", "-C", root, "--no-print-directory", "BIN="+bin, target).CombinedOutput()
		if err != nil {
			t.Fatalf("make %s: %v\n%s", target, err, out)
		}
	}

	s, err := startTpschedLocalC(Env{Bin: bin}, Spec{Workers: 1, Front: 1, Queue: 64, Callers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	pids, err := tpschedRunning(s.status, callersGroup)
	if err != nil || len(pids) != 1 {
		t.Fatalf("caller processes %v (%v), want one", pids, err)
	}

	start := time.Now().Add(100 * time.Millisecond)
	end := start.Add(300 * time.Millisecond)
	req := uapcall.Run{Group: "bench", Service: "echo", Payload: 128, Start: start, End: end}.Encode()
	reply, err := runCall(s.Addr, callersGroup, "run", req, end.Add(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	sum, err := uapcall.ParseSummary(reply)
	if err != nil {
		t.Fatal(err)
	}
	if sum.OK == 0 || sum.InWindow == 0 || sum.Sent() != sum.OK {
		t.Errorf("summary %q: want echoed calls only, some in the window", reply)
	}
	if !slices.Contains(pids, sum.PID) {
		t.Errorf("summary's pid %d, the caller is %v", sum.PID, pids)
	}
	// One caller makes its calls one after the other, so the mean of its
	// histogram is the window over the calls answered in it (Little's
	// law; about 0.998 of it here, as the buckets are 1/64 wide): a
	// bucket function that is not uapcall's misplaces the latencies.
	var total time.Duration
	d := sum.Hist.Durations()
	for _, l := range d {
		total += l
	}
	mean, want := total/time.Duration(max(len(d), 1)), end.Sub(start)/time.Duration(max(sum.InWindow, 1))
	if r := float64(mean) / float64(want); r < 0.8 || r > 1.25 {
		t.Errorf("the histogram's mean latency %v, the window gives %v a call (%.2fx)", mean, want, r)
	}

	_, err = runCall(s.Addr, callersGroup, "run", []byte("run2 bench echo"), time.Now().Add(10*time.Second))
	if err == nil || !strings.Contains(err.Error(), "run1 group service payload start end") {
		t.Errorf("a bad run request: %v, want an application error naming the form", err)
	}
}
