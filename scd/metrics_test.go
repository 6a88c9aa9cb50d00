package scd

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"tpsched/bpf"
	"tpsched/internal/exposition"
	"tpsched/internal/exposition/promcheck"
	"tpsched/internal/testenv"
	"tpsched/netio"
)

// metricsNode is an in-process node running group g (echo, fail, sleep;
// one process, one place in the queue, load checked every second) after
// the calls that make every per-call series move: replies, application
// errors, calls refused 'server busy' and one that timed out.
func metricsNode(t *testing.T) *Node {
	t.Helper()
	n := inProcNode(t, "", map[string]string{"g": "set service_group = g\nset service = echo, fail, sleep\n" +
		"set module = MODULE\nset parallel_count = 1\nset queue_size = 1\nset loadcheck_interval = 1\n"})
	c := inProcClient(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 40 {
		if _, err := c.Call(ctx, "g", "echo", []byte(strconv.Itoa(i))); err != nil {
			t.Fatalf("echo: %v", err)
		}
		if _, err := c.Call(ctx, "g", "fail", nil); !errors.Is(err, &netio.Error{Code: netio.CodeApplication}) {
			t.Fatalf("fail: %v, want an application error", err)
		}
	}
	// One call running, one waiting: of four slow calls at once at least
	// two are refused 'server busy'.
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { _, _ = c.Call(ctx, "g", "sleep", []byte("200ms")) })
	}
	wg.Wait()
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	if _, err := c.Call(short, "g", "sleep", []byte("300ms")); !errors.Is(err, &netio.Error{Code: netio.CodeTimedOut}) {
		t.Errorf("a call that outlives its timeout: %v", err)
	}
	waitInFlight(t, n, "g", 0)
	return n
}

// scrape reads n's /metrics over HTTP, as Prometheus does.
func scrape(t testing.TB, n *Node) string {
	t.Helper()
	resp, err := http.Get("http://" + n.doors.httpLn.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("/metrics Content-Type %q, want the text format's", ct)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// checkExposition parses text as Prometheus does (promcheck) and fails t
// on every problem.
func checkExposition(t testing.TB, text string) promcheck.Families {
	t.Helper()
	fams, errs := promcheck.Check(text)
	for _, err := range errs {
		t.Error(err)
	}
	if len(errs) > 0 {
		t.Logf("/metrics:\n%s", text)
	}
	return fams
}

// TestMetricsExposition parses a node's /metrics with Prometheus' own text
// parser and checks what Prometheus and Grafana rely on: every line
// parses, every family has HELP text and a TYPE, its lines together;
// histograms have le buckets up to +Inf that match their _count; counters
// and only counters end in _total. The figures match the calls made.
func TestMetricsExposition(t *testing.T) {
	n := metricsNode(t)
	fams := checkExposition(t, scrape(t, n))
	// The latency histogram counts every completed call, as the queue's
	// counter does.
	processed := fams.Value("tpsched_requests_processed_total", "group", "g")
	h := fams.Histogram("tpsched_request_duration_seconds", "group", "g")
	if h == nil || float64(h.GetSampleCount()) != processed || processed < 81 {
		t.Errorf("tpsched_request_duration_seconds{group=\"g\"} %v; processed %v, want >= 81", h, processed)
	}
	for _, c := range []struct {
		family, label, value string
		min                  float64
	}{
		{"tpsched_requests_queued_total", "group", "g", 81},
		{"tpsched_requests_refused_total", "reason", "busy", 2},
		{"tpsched_requests_timed_out_total", "group", "g", 1},
		// Error answers are counted process-wide: other tests add to them.
		{"tpsched_error_answers_total", "code", "application error", 40},
		{"tpsched_error_answers_total", "code", "server busy", 2},
		{"tpsched_error_answers_total", "code", "timed out", 1},
		{"tpsched_cpu_measurement", "mechanism", bpf.Proc, 1},
		{"tpsched_processes", "kind", "resident", 1},
	} {
		if v := fams.Value(c.family, c.label, c.value); !(v >= c.min) {
			t.Errorf("%s{%s=%q} = %v, want >= %v", c.family, c.label, c.value, v, c.min)
		}
	}
}

// TestRunqueueWaitHistogram: the eBPF run-queue wait histogram, whose slots
// the kernel counts, is written as a Prometheus histogram: le buckets of
// the slots' bounds, cumulative, +Inf equal to _count. (The in-process
// node measures no UAP, so its /metrics has no such histogram.)
func TestRunqueueWaitHistogram(t *testing.T) {
	var u bpf.Usage
	for i := range u.Hist {
		u.Hist[i] = uint64(i % 3)
		u.Waits += u.Hist[i]
	}
	u.Wait = 1500 * time.Microsecond
	var b bytes.Buffer
	const family = "tpsched_group_runqueue_wait_duration_seconds"
	b.WriteString("# HELP " + family + "\n# TYPE " + family + " histogram\n")
	writeWaitHistogram(&b, family, `group="a"`, u)
	writeWaitHistogram(&b, family, `group="b"`, bpf.Usage{})
	var out bytes.Buffer
	if err := exposition.Write(&out, b.Bytes(), metricHelp); err != nil {
		t.Fatal(err)
	}
	fams := checkExposition(t, out.String())
	h := fams.Histogram(family, "group", "a")
	if h == nil || h.GetSampleCount() != u.Waits || h.GetSampleSum() != u.Wait.Seconds() {
		t.Fatalf("group a: %v, want count %d, sum %v", h, u.Waits, u.Wait.Seconds())
	}
	var cum uint64
	for i, bk := range h.GetBucket()[:len(u.Hist)-1] {
		cum += u.Hist[i]
		if bk.GetUpperBound() != bpf.HistBound(i).Seconds() || bk.GetCumulativeCount() != cum {
			t.Errorf("bucket %d: %v, want le %v count %d", i, bk, bpf.HistBound(i).Seconds(), cum)
		}
	}
}

// TestRunqueueWaitHistogramOfATornRead: a read of the kernel's counters
// while a wait is being counted holds it in its slot but not yet in Waits.
// The +Inf bucket and _count were Waits, below the last finite bucket: a
// histogram whose buckets fall, which promcheck (and Prometheus'
// histogram_quantile) refuse.
func TestRunqueueWaitHistogramOfATornRead(t *testing.T) {
	var u bpf.Usage
	u.Hist[3], u.Hist[5] = 2, 1
	u.Waits = 2 // the third wait is in its slot, not yet in Waits
	u.Wait = 300 * time.Microsecond
	var b bytes.Buffer
	const family = "tpsched_group_runqueue_wait_duration_seconds"
	b.WriteString("# HELP " + family + "\n# TYPE " + family + " histogram\n")
	writeWaitHistogram(&b, family, `group="a"`, u)
	var out bytes.Buffer
	if err := exposition.Write(&out, b.Bytes(), metricHelp); err != nil {
		t.Fatal(err)
	}
	if h := checkExposition(t, out.String()).Histogram(family, "group", "a"); h == nil || h.GetSampleCount() != 3 {
		t.Fatalf("histogram %v, want a count of 3", h)
	}
}

// TestPromtoolCheckMetrics runs Prometheus' own linter (promtool check
// metrics) on a node's /metrics: the whole endpoint passes, the library's
// go_* and process_* families included (issue 23, item 8).
func TestPromtoolCheckMetrics(t *testing.T) {
	promtool := testenv.RequireTool(t, "promtool", "Debian: apt-get install prometheus; .ci/run installs it")
	text := scrape(t, metricsNode(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}
