// Command tpgoals runs the routing manager's bench scenario (source
// document 004, issue 13): tpsched nodes, each pinned to a CPU of its own
// (the load generator keeps the first CPU to itself, so a 2-CPU machine
// runs one node, a 3-CPU one two), each serving two service classes: ONLINE (importance 1, 90% of its
// calls within 6 ms; each call needs 4 ms of CPU) and BATCH (importance 3,
// three processes burning the CPU with 50 ms calls, closed loop). The same
// load runs twice: with goal management (svcpolicy goal_management = Y)
// and without (N: OpenTP1's rules alone, equal CPU weights). Every 500 ms
// it reads each node's /report; it writes the performance index of ONLINE
// over time as a plot, and a report with both runs' figures, to
// -out/<date>-goals.{md,json,png}.
//
//	tpgoals [-bin bin] [-out bench/results] [-duration 20s] [-warmup 3s] [-goal-ms 6] [-version]
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"tpsched/internal/version"
	"tpsched/scd/client"
)

const (
	onlineCPUus = 4000 // CPU per ONLINE call
	onlinePause = 10 * time.Millisecond
	batchCPUus  = 50000 // CPU per BATCH call
	batchProcs  = 3
	batchCalls  = 6 // BATCH callers per node (closed loop)
	sampleEvery = 500 * time.Millisecond
	maxNodes    = 2
	cpusEnv     = "TPGOALS_CPUS" // the CPUs before the generator pinned itself
)

// nodes is how many nodes run: one per CPU beyond the generator's.
var nodes int

// goalMs is ONLINE's goal: 90% of its calls within it.
var goalMs = 6

// sample is one reading of one node's report.
type sample struct {
	T         float64 `json:"t_s"` // since the load began
	Node      int     `json:"node"`
	PI        float64 `json:"pi"` // ONLINE's, over the last three intervals; -1: no calls
	Online    int     `json:"online_weight"`
	Batch     int     `json:"batch_weight"`
	OtherCPUs float64 `json:"other_cpus"`
}

// runResult is one run: goal management on or off.
type runResult struct {
	Managed bool     `json:"goal_management"`
	Samples []sample `json:"samples"`
	// Over the measured time (after the warm-up), both nodes.
	OnlinePerS   float64 `json:"online_calls_per_s"`
	BatchPerS    float64 `json:"batch_calls_per_s"`
	MedianPI     float64 `json:"median_pi"`
	MeetShare    float64 `json:"share_of_samples_pi_le_1"`
	WithinGoal   float64 `json:"online_within_goal"` // share of ONLINE calls within the goal, whole run, all nodes
	MeanOtherCPU float64 `json:"mean_other_cpus"`
	Failed       int64   `json:"failed_calls"`
}

func main() {
	binDir := flag.String("bin", "bin", "directory with scdd and uap-echo (make build)")
	out := flag.String("out", "bench/results", "directory for the report")
	duration := flag.Duration("duration", 20*time.Second, "measured time per run")
	warmup := flag.Duration("warmup", 3*time.Second, "time before the measured time (goal management acts in it)")
	showVersion := flag.Bool("version", false, "print tpgoals's version and exit")
	flag.IntVar(&goalMs, "goal-ms", goalMs, "ONLINE's goal: 90% of its calls within this many ms (below 5 it cannot be met: the weights go to their bound)")
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Line("tpgoals"))
		return
	}
	if err := run(*binDir, *out, *warmup, *duration); err != nil {
		fmt.Fprintln(os.Stderr, "tpgoals:", err)
		os.Exit(1)
	}
}

func run(binDir, out string, warmup, duration time.Duration) error {
	var cpus []string
	if v := os.Getenv(cpusEnv); v != "" {
		cpus = strings.Split(v, ",")
	} else {
		all, err := cpuList()
		if err != nil {
			return err
		}
		if len(all) < 2 {
			return fmt.Errorf("needs 2 CPUs (the load generator's and a node's), this process may use %v", all)
		}
		// Run again pinned to the first CPU: the generator's calls must
		// not take the nodes' CPUs.
		self, err := os.Executable()
		if err != nil {
			return err
		}
		taskset, err := exec.LookPath("taskset")
		if err != nil {
			return err
		}
		env := append(os.Environ(), cpusEnv+"="+strings.Join(all, ","))
		return syscall.Exec(taskset, append([]string{"taskset", "-c", all[0], self}, os.Args[1:]...), env)
	}
	nodes = min(len(cpus)-1, maxNodes)
	cpus = cpus[1:]
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	var results []runResult
	for _, managed := range []bool{true, false} {
		fmt.Fprintf(os.Stderr, "goal management %v: %v warm-up, %v measured\n", yn(managed), warmup, duration)
		r, err := runOnce(binDir, cpus, managed, warmup, duration)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "  median PI %.2f, PI <= 1 in %.0f%% of samples, ONLINE %.1f/s, BATCH %.1f/s, other programs %.2f CPUs\n",
			r.MedianPI, 100*r.MeetShare, r.OnlinePerS, r.BatchPerS, r.MeanOtherCPU)
		results = append(results, r)
	}
	date := time.Now().UTC().Format("2006-01-02")
	base := filepath.Join(out, date+"-goals")
	b, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(base+".json", b, 0o644); err != nil {
		return err
	}
	if err := plotPI(results, base+".png", warmup); err != nil {
		return err
	}
	return os.WriteFile(base+".md", []byte(markdown(results, date, warmup, duration)), 0o644)
}

func yn(b bool) string {
	if b {
		return "Y"
	}
	return "N"
}

// runOnce starts the nodes, runs the load and samples the reports.
func runOnce(binDir string, cpus []string, managed bool, warmup, duration time.Duration) (runResult, error) {
	r := runResult{Managed: managed}
	var ns []*scddNode
	defer func() {
		for _, n := range ns {
			n.stop()
		}
	}()
	for i := range nodes {
		n, err := startNode(binDir, i, cpus[i], managed)
		if err != nil {
			return r, err
		}
		ns = append(ns, n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var online, batch, failed atomic.Int64
	var measuring atomic.Bool
	for _, n := range ns {
		c, err := client.New(client.Options{Hosts: []string{n.rpc}})
		if err != nil {
			return r, err
		}
		defer c.Close()
		call := func(group string, us int, count *atomic.Int64, pause time.Duration) {
			defer wg.Done()
			for ctx.Err() == nil {
				cctx, cc := context.WithTimeout(ctx, 30*time.Second)
				_, err := c.Call(cctx, group, "cpu", []byte(strconv.Itoa(us)))
				cc()
				switch {
				case err != nil && ctx.Err() == nil:
					failed.Add(1)
				case err == nil && measuring.Load():
					count.Add(1)
				}
				if pause > 0 {
					time.Sleep(pause)
				}
			}
		}
		for range batchCalls {
			wg.Add(1)
			go call("batch", batchCPUus, &batch, 0)
		}
		wg.Add(1)
		go call("online", onlineCPUus, &online, onlinePause)
	}
	start := time.Now()
	end := start.Add(warmup + duration)
	for now := time.Now(); now.Before(end); now = time.Now() {
		if !measuring.Load() && now.Sub(start) >= warmup {
			measuring.Store(true)
		}
		for i, n := range ns {
			rep, err := n.report()
			if err != nil {
				return r, fmt.Errorf("node %d: %w", i, err)
			}
			s := sample{T: now.Sub(start).Seconds(), Node: i, PI: -1, OtherCPUs: rep.OtherCPUs}
			for _, c := range rep.Classes {
				if c.Class == "ONLINE" && c.PI != nil {
					s.PI = *c.PI
				}
			}
			for _, g := range rep.Groups {
				switch g.Group {
				case "online":
					s.Online = g.Weight
				case "batch":
					s.Batch = g.Weight
				}
			}
			r.Samples = append(r.Samples, s)
		}
		time.Sleep(sampleEvery)
	}
	measuring.Store(false)
	var within, calls float64
	for _, n := range ns {
		rep, err := n.report()
		if err != nil {
			return r, err
		}
		for _, c := range rep.Classes {
			if c.Class == "ONLINE" {
				within += c.WithinGoal * float64(c.Calls)
				calls += float64(c.Calls)
			}
		}
	}
	cancel()
	wg.Wait()
	r.OnlinePerS = float64(online.Load()) / duration.Seconds()
	r.BatchPerS = float64(batch.Load()) / duration.Seconds()
	r.Failed = failed.Load()
	if calls > 0 {
		r.WithinGoal = within / calls
	}
	var pis []float64
	var other float64
	var measured int
	meet := 0
	for _, s := range r.Samples {
		if s.T < warmup.Seconds() {
			continue
		}
		measured++
		other += s.OtherCPUs
		if s.PI >= 0 {
			pis = append(pis, s.PI)
			if s.PI <= 1 {
				meet++
			}
		}
	}
	if len(pis) > 0 {
		slices.Sort(pis)
		r.MedianPI = pis[len(pis)/2]
		r.MeetShare = float64(meet) / float64(len(pis))
	}
	if measured > 0 {
		r.MeanOtherCPU = other / float64(measured)
	}
	return r, nil
}

// scddNode is one scdd process of the scenario.
type scddNode struct {
	cmd      *exec.Cmd
	rpc, ctl string
	dir      string
	done     chan struct{}
}

var startedLine = regexp.MustCompile(`msg="scdd started" .*rpc=(\S+) http=(\S+)`)

func startNode(binDir string, i int, cpu string, managed bool) (*scddNode, error) {
	dir, err := os.MkdirTemp("", "tpgoals-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	module, err := filepath.Abs(filepath.Join(binDir, "uap-echo"))
	if err != nil {
		return nil, err
	}
	ip := fmt.Sprintf("127.0.0.%d", 2+i)
	files := map[string]string{
		"sysconf":    fmt.Sprintf("set node_id = \"g%d\"\nset rpc_address = %q\nset rpc_port = 0\nset metrics_address = \"%s:0\"\nset control_socket = \"ctl.sock\"\n", i, ip, ip),
		"usr/online": fmt.Sprintf("set service_group = \"online\"\nset service = \"cpu=cpu\"\nset module = %q\nset parallel_count = 1\n", module),
		"usr/batch": fmt.Sprintf("set service_group = \"batch\"\nset service = \"cpu=cpu\"\nset module = %q\nset parallel_count = %d\nset queue_size = 64\n",
			module, batchProcs),
		"svcpolicy": fmt.Sprintf("set policy_interval = 1\nset goal_management = %s\nset default_class = BATCH\n"+
			"class -n ONLINE -i 1 -t %d -p 90\nclass -n BATCH -i 3 -t 60000\nclassify -g online -c ONLINE\n", yn(managed), goalMs),
	}
	if err := os.MkdirAll(filepath.Join(dir, "usr"), 0o755); err != nil {
		return nil, err
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return nil, err
		}
	}
	n := &scddNode{dir: dir, done: make(chan struct{})}
	n.cmd = exec.Command("taskset", "-c", cpu, filepath.Join(binDir, "scdd"), "-c", dir)
	n.cmd.Env = append(os.Environ(), "DCCONFPATH=")
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stderr, err := n.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := n.cmd.Start(); err != nil {
		return nil, err
	}
	found := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := startedLine.FindStringSubmatch(sc.Text()); m != nil {
				found <- [2]string{m[1], m[2]}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	go func() { _ = n.cmd.Wait(); close(n.done) }()
	select {
	case a := <-found:
		n.rpc, n.ctl = a[0], a[1]
	case <-n.done:
		return nil, fmt.Errorf("scdd of node %d exited at start", i)
	case <-time.After(15 * time.Second):
		n.stop()
		return nil, fmt.Errorf("scdd of node %d did not start in 15 s", i)
	}
	return n, nil
}

// nodeReport is the part of scd.Report (GET /report) this command reads;
// the bench module does not link scd itself.
type nodeReport struct {
	OtherCPUs float64 `json:"other_cpus"`
	Classes   []struct {
		Class      string   `json:"class"`
		PI         *float64 `json:"pi"`
		Calls      uint64   `json:"calls"`
		WithinGoal float64  `json:"within_goal"`
	} `json:"classes"`
	Groups []struct {
		Group  string `json:"group"`
		Weight int    `json:"cpu_weight"`
	} `json:"groups"`
}

func (n *scddNode) report() (nodeReport, error) {
	var r nodeReport
	resp, err := http.Get("http://" + n.ctl + "/report")
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return r, errors.New("report: " + resp.Status)
	}
	return r, json.NewDecoder(resp.Body).Decode(&r)
}

func (n *scddNode) stop() {
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
		<-n.done
	}
	_ = os.RemoveAll(n.dir)
}

// cpuList is the CPUs this process may run on.
func cpuList() ([]string, error) {
	out, err := exec.Command("taskset", "-pc", strconv.Itoa(os.Getpid())).Output()
	if err != nil {
		return nil, fmt.Errorf("taskset: %w", err)
	}
	_, list, _ := strings.Cut(strings.TrimSpace(string(out)), ": ")
	var cpus []string
	for part := range strings.SplitSeq(list, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("taskset said %q", out)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				return nil, fmt.Errorf("taskset said %q", out)
			}
		}
		for c := a; c <= b; c++ {
			cpus = append(cpus, strconv.Itoa(c))
		}
	}
	return cpus, nil
}

// plotPI draws ONLINE's performance index over time, one line per run and
// node, with the goal (PI 1) and the end of the warm-up marked.
func plotPI(results []runResult, file string, warmup time.Duration) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("ONLINE's performance index (90%% within %d ms) beside BATCH burning the CPU", goalMs)
	p.X.Label.Text = "seconds since the load began"
	p.Y.Label.Text = "performance index (above 1: goal missed)"
	p.Legend.Left = true // the lines stay near 1, the legend below them
	var lines []any
	maxT := 0.0
	for _, r := range results {
		for n := range nodes {
			var xys plotter.XYs
			for _, s := range r.Samples {
				if s.Node == n && s.PI >= 0 {
					xys = append(xys, plotter.XY{X: s.T, Y: s.PI})
					maxT = max(maxT, s.T)
				}
			}
			lines = append(lines, fmt.Sprintf("goal_management=%s, node g%d", yn(r.Managed), n), xys)
		}
	}
	if err := plotutil.AddLines(p, lines...); err != nil {
		return err
	}
	goal, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 1}, {X: maxT, Y: 1}})
	if err != nil {
		return err
	}
	goal.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
	p.Add(goal)
	p.Legend.Add("goal (PI 1)", goal)
	warm, err := plotter.NewLine(plotter.XYs{{X: warmup.Seconds(), Y: 0}, {X: warmup.Seconds(), Y: 1}})
	if err != nil {
		return err
	}
	warm.Dashes = []vg.Length{vg.Points(1), vg.Points(3)}
	p.Add(warm)
	p.Y.Min = 0
	return p.Save(18*vg.Centimeter, 11*vg.Centimeter, file)
}

func markdown(results []runResult, date string, warmup, duration time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Goal management on and off (issue 13, source document 004), %s\n\n", date)
	fmt.Fprintf(&b, "%d tpsched node(s) (g0 ...; one per CPU beyond the load generator's, at most two; not a cluster: each is judged on its own), "+
		"each pinned to a CPU of its own, each serving ONLINE (importance 1: 90%% of its calls "+
		"within %d ms; one process; each call needs %d ms of CPU, one caller per node with %v between calls) and BATCH "+
		"(importance 3: an average of 60 s; %d processes; %d callers per node in a closed loop, each call %d ms of CPU). "+
		"The same load ran twice, %v warm-up then %v measured: with goal management (svcpolicy goal_management = Y: a missed goal "+
		"moves CPU weight, cgroup cpu.shares here) and without (N: OpenTP1's rules, equal weights). Each node's /report was read every %v; "+
		"PI is ONLINE's performance index over the node's last three 1 s intervals.\n\n",
		nodes, goalMs, onlineCPUus/1000, onlinePause, batchProcs, batchCalls, batchCPUus/1000, warmup, duration, sampleEvery)
	fmt.Fprintf(&b, "| goal_management | median PI | samples with PI <= 1 | ONLINE within %d ms | ONLINE calls/s", goalMs)
	b.WriteString(" | BATCH calls/s | other programs (CPUs) | failed calls |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %.2f | %.0f%% | %.1f%% | %.1f | %.1f | %.2f | %d |\n", yn(r.Managed), r.MedianPI, 100*r.MeetShare,
			100*r.WithinGoal, r.OnlinePerS, r.BatchPerS, r.MeanOtherCPU, r.Failed)
	}
	fmt.Fprintf(&b, "\n![ONLINE's performance index over time](%s-goals.png)\n\n", date)
	b.WriteString("Weights at the end of each run (online/batch, cgroup v2 scale, 100 is schedule_priority 8's): ")
	for _, r := range results {
		for n := range nodes {
			for i := len(r.Samples) - 1; i >= 0; i-- {
				if s := r.Samples[i]; s.Node == n {
					fmt.Fprintf(&b, "%s g%d %d/%d; ", yn(r.Managed), n, s.Online, s.Batch)
					break
				}
			}
		}
	}
	b.WriteString("\n\nThe machine is shared: 'other programs' is the CPU the nodes' CPUs gave to programs that are not their UAPs " +
		"(scdd itself, the load generator, other tenants), which goal management cannot take from.\n")
	return b.String()
}
