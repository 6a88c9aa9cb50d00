// Package itest holds the integration tests: they build the real scdd,
// scdctl and uap-echo binaries, start real nodes on loopback with real UAP
// processes, and talk to them over real sockets.
package itest

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"tpsched/internal/testenv"
	"tpsched/scd"
	"tpsched/scd/client"
)

var binDir string // where TestMain built the binaries

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		// make test-short: every test here builds and starts scdd.
		fmt.Println("itest: not run with -short (the integration tests build and start scdd)")
		os.Exit(0)
	}
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "tpsched-itest-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		// A root scdd runs UAPs as users of their own: they must reach uap-echo.
		if err := os.Chmod(dir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		binDir = dir
		args := []string{"build", "-o", dir + "/"}
		if raceBuild {
			// go test -race (make test): the daemon and the UAPs run under
			// the race detector too, and the first race ends the process
			// that found it (exit status 66); checkRace fails the test.
			args = append(args, "-race")
			must0(os.Setenv("GORACE", strings.TrimSpace("halt_on_error=1 "+os.Getenv("GORACE"))))
		}
		args = append(args, "tpsched/cmd/scdd", "tpsched/cmd/scdctl", "tpsched/cmd/uap-echo", "tpsched/itest/internal/uap-hostile")
		build := exec.Command("go", args...)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "itest: building the binaries:", err)
			return 1
		}
		return m.Run()
	}())
}

func bin(name string) string { return filepath.Join(binDir, name) }

func must0(err error) {
	if err != nil {
		panic(err)
	}
}

// raceReport is how the race detector starts a report, in the daemon's
// output or a UAP's (which scdd's log carries).
const raceReport = "WARNING: DATA RACE"

// checkRace fails the test if output, what a process of the node wrote,
// holds a race detector's report.
func checkRace(t *testing.T, what, output string) {
	t.Helper()
	if report := firstRaceReport(output); report != "" {
		t.Errorf("%s reported a data race:\n%s", what, report)
	}
}

// firstRaceReport is the first race detector's report in output, or "".
func firstRaceReport(output string) string {
	i := strings.Index(output, raceReport)
	if i < 0 {
		return ""
	}
	report := output[i:]
	if end := strings.Index(report, "\n==================\n"); end > 0 {
		report = report[:end]
	}
	return report
}

// linesMatching is the last limit lines of log that re matches.
func linesMatching(log string, re *regexp.Regexp, limit int) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if re.MatchString(l) {
			out = append(out, l)
		}
	}
	return strings.Join(out[len(out)-min(len(out), limit):], "\n")
}

// grepLines is the lines of text that contain sub, each with its newline.
func grepLines(text, sub string) string {
	if lines := linesMatching(text, regexp.MustCompile(regexp.QuoteMeta(sub)), math.MaxInt); lines != "" {
		return lines + "\n"
	}
	return ""
}

// defDir writes a definition directory: a sysconf whose ports are 0 (scdd
// picks free ones and logs them, so parallel tests never race for a port),
// then one usr file per entry of servers (name -> body; "MODULE" in a body
// becomes the path of uap-echo).
func defDir(t *testing.T, sysconf string, servers map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	sys := "set node_id = \"itest\"\nset rpc_address = \"127.0.0.1\"\nset rpc_port = 0\n" +
		"set metrics_address = \"127.0.0.1:0\"\n" + sysconf
	if !strings.Contains(sysconf, "control_socket") {
		sys += ownControlSocket
	}
	must(t, os.WriteFile(filepath.Join(dir, "sysconf"), []byte(sys), 0o644))
	must(t, os.MkdirAll(filepath.Join(dir, "usr"), 0o755))
	for name, body := range servers {
		body = strings.ReplaceAll(body, "MODULE", fmt.Sprintf("%q", bin("uap-echo")))
		must(t, os.WriteFile(filepath.Join(dir, "usr", name), []byte(body), 0o644))
	}
	return dir
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// ownControlSocket puts a node's control socket in its definition
// directory, so that nodes of parallel tests (all "itest") never meet at
// /run/tpsched/itest.sock.
const ownControlSocket = "set control_socket = \"ctl.sock\"\n"

// node is a running scdd process.
type node struct {
	t      *testing.T
	cmd    *exec.Cmd
	rpc    string
	ctl    string // the HTTP address of /status and /metrics
	sock   string // the control socket
	stderr *testenv.SyncBuffer
	done   chan struct{}
	err    error // exit status, once done is closed
}

// startedLine is scdd's log line with the addresses it listens on.
var startedLine = regexp.MustCompile(`msg="scdd started" .*rpc=(\S+) http=(\S+)`)

// controlLine is scdd's log line with its control socket.
var controlLine = regexp.MustCompile(`msg="control socket listening" path=(\S+)`)

// startNode starts scdd with args, learns its addresses from its log and
// waits until its control API answers. The node is stopped (SIGTERM, then
// SIGKILL of its process group) when the test ends, whatever happened.
func startNode(t *testing.T, args ...string) *node {
	t.Helper()
	return startCommand(t, bin("scdd"), args...)
}

// startCommand is startNode for a command that runs scdd (setpriv, say).
func startCommand(t *testing.T, prog string, args ...string) *node {
	t.Helper()
	return startCommandWith(t, nil, prog, args...)
}

// startCommandEnv is startCommand with env added to the command's
// environment.
func startCommandEnv(t *testing.T, env []string, prog string, args ...string) *node {
	t.Helper()
	return startCommandWith(t, func(c *exec.Cmd) { c.Env = append(c.Env, env...) }, prog, args...)
}

// startCommandWith is startCommand with setup run on the command before
// it starts (to give scdd extra descriptors, say).
func startCommandWith(t *testing.T, setup func(*exec.Cmd), prog string, args ...string) *node {
	t.Helper()
	n, err := tryStartCommand(t, setup, prog, args...)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// tryStartCommand is startCommandWith that returns, rather than fails the
// test with, a node that exits or does not start within 15 s; the node is
// stopped at the test's end either way.
func tryStartCommand(t *testing.T, setup func(*exec.Cmd), prog string, args ...string) (*node, error) {
	t.Helper()
	n := &node{t: t, stderr: &testenv.SyncBuffer{}, done: make(chan struct{})}
	n.cmd = exec.Command(prog, args...)
	n.cmd.Env = append(os.Environ(), "DCCONFPATH=")
	n.cmd.Stderr = n.stderr
	// Killed with the test process too: a test binary killed at its
	// -timeout (or by hand) runs no cleanup, and its nodes stayed, one
	// of them stopped, holding their ports and CPU.
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if setup != nil {
		setup(n.cmd)
	}
	must(t, n.cmd.Start())
	go func() { n.err = n.cmd.Wait(); close(n.done) }()
	t.Cleanup(func() {
		n.signal(syscall.SIGTERM)
		select {
		case <-n.done:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
			<-n.done
		}
		checkRace(t, "scdd or one of its UAPs", n.stderr.String())
		if t.Failed() {
			t.Logf("scdd stderr:\n%s", n.stderr.String())
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		if m := startedLine.FindStringSubmatch(n.stderr.String()); m != nil {
			n.rpc, n.ctl = m[1], m[2]
			if m := controlLine.FindStringSubmatch(n.stderr.String()); m != nil {
				n.sock = m[1]
			}
			if _, err := n.status(); err == nil {
				return n, nil
			}
		}
		select {
		case <-n.done:
			return n, fmt.Errorf("scdd exited at start: %v\n%s", n.err, n.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			return n, fmt.Errorf("scdd did not start within 15 s\n%s", n.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (n *node) signal(sig syscall.Signal) { _ = n.cmd.Process.Signal(sig) }

func (n *node) status() (scd.Status, error) {
	var st scd.Status
	resp, err := http.Get("http://" + n.ctl + "/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("status: %s", resp.Status)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

func (n *node) metrics() string {
	n.t.Helper()
	resp, err := http.Get("http://" + n.ctl + "/metrics")
	must(n.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must(n.t, err)
	return string(b)
}

// callWithoutPause starts n goroutines on wg that call group/service with
// payload through c, each call bounded by limit, one after another until
// ctx ends: load, whose answers nobody looks at.
func callWithoutPause(ctx context.Context, wg *sync.WaitGroup, c *client.Client, n int, group, service, payload string, limit time.Duration) {
	for range n {
		wg.Go(func() {
			for ctx.Err() == nil {
				cctx, cancel := context.WithTimeout(ctx, limit)
				_, _ = c.Call(cctx, group, service, []byte(payload))
				cancel()
			}
		})
	}
}

func (n *node) client(opts ...func(*client.Options)) *client.Client {
	n.t.Helper()
	o := client.Options{Hosts: []string{n.rpc}, MaxMessageSize: 8 << 20}
	for _, f := range opts {
		f(&o)
	}
	c, err := client.New(o)
	must(n.t, err)
	n.t.Cleanup(func() { c.Close() })
	return c
}

// scdctl runs the real scdctl against the node and returns its output.
func (n *node) scdctl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin("scdctl"), append([]string{"-H", n.rpc, "-a", n.ctl, "-s", n.sock}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// waitExit waits for scdd to exit and returns its status.
func (n *node) waitExit(d time.Duration) error {
	n.t.Helper()
	select {
	case <-n.done:
		return n.err
	case <-time.After(d):
		n.t.Fatalf("scdd did not exit within %v", d)
		return nil
	}
}

func groupStatus(t *testing.T, n *node, group string) scd.GroupStatus {
	t.Helper()
	st, err := n.status()
	must(t, err)
	for _, g := range st.Groups {
		if g.Group == group {
			return g
		}
	}
	t.Fatalf("group %s not in status %+v", group, st)
	return scd.GroupStatus{}
}

func pidAlive(pid int) bool { return syscall.Kill(pid, 0) == nil }
