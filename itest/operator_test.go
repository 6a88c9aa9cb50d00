package itest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"tpsched/internal/testenv"
	"tpsched/netio"
	"tpsched/scd/client"
)

// nobody is the unprivileged user the control socket tests call as.
const nobody = 65534

// TestChaosControlFromOtherUser: hold, release and pprof are no
// longer on the HTTP address, and on the control socket they answer scdd's
// own user (root here) but not another user: not when the socket's mode
// keeps them out, and not when an operator opened the mode by mistake (the
// SO_PEERCRED check).
func TestChaosControlFromOtherUser(t *testing.T) {
	skipShort(t)
	testenv.RequireRoot(t, "the test runs scdctl as another user (nobody) to be refused")
	// nobody must reach the socket's directory and the scdctl binary for
	// the peer check to be what refuses it.
	sockDir, err := os.MkdirTemp("", "tpctl")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	must(t, os.Chmod(sockDir, 0o755))
	must(t, os.Chmod(binDir, 0o755))
	sock := filepath.Join(sockDir, "n.sock")
	dir := defDir(t, fmt.Sprintf("set control_socket = %q\n", sock), map[string]string{"g": echoDef("g", 1, 16, 1<<20)})
	n := startNode(t, "-c", dir)
	if n.sock != sock {
		t.Fatalf("node logged control socket %q, want %q", n.sock, sock)
	}
	c := n.client()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	held := func() bool { return groupStatus(t, n, "g").Held }
	asNobody := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin("scdctl"), append([]string{"-s", sock}, args...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{}}}
		cmd.Dir = "/"
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	t.Run("the HTTP address serves no control action", func(t *testing.T) {
		for _, r := range []struct{ method, path string }{
			{http.MethodPost, "/hold?group=g"}, {http.MethodPost, "/release?group=g"},
			{http.MethodGet, "/debug/pprof/"}, {http.MethodGet, "/debug/pprof/goroutine"},
		} {
			req, err := http.NewRequestWithContext(ctx, r.method, "http://"+n.ctl+r.path, nil)
			must(t, err)
			resp, err := http.DefaultClient.Do(req)
			must(t, err)
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed {
				t.Errorf("%s %s on the HTTP address: %s, want 404 or 405", r.method, r.path, resp.Status)
			}
		}
		if held() {
			t.Fatal("a POST to the HTTP address held the group")
		}
	})
	t.Run("the socket is 0600", func(t *testing.T) {
		fi, err := os.Stat(sock)
		must(t, err)
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("control socket mode %v, want 0600", fi.Mode())
		}
	})
	t.Run("another user is kept out by the socket's mode", func(t *testing.T) {
		out, err := asNobody("hold", "g")
		if err == nil || !strings.Contains(out, "permission denied") || !strings.Contains(out, "admits only scdd's own user and root") {
			t.Errorf("scdctl hold as nobody: %v: %s", err, out)
		}
		if held() {
			t.Fatal("nobody held the group")
		}
	})
	t.Run("another user is refused by the peer check when the mode lets it in", func(t *testing.T) {
		must(t, os.Chmod(sock, 0o666))
		defer os.Chmod(sock, 0o600)
		for _, args := range [][]string{{"hold", "g"}, {"release", "g"}, {"pprof", "goroutine"}} {
			out, err := asNobody(args...)
			want := fmt.Sprintf("uid %d may not use it: only scdd's own user (uid 0) and root", nobody)
			if err == nil || !strings.Contains(out, want) {
				t.Errorf("scdctl %s as nobody: %v: %q, want %q", strings.Join(args, " "), err, out, want)
			}
		}
		if held() {
			t.Fatal("nobody held the group")
		}
		m := n.metrics()
		if !strings.Contains(m, "tpsched_control_refused_total 3") {
			t.Errorf("refusals not counted:\n%s", grep(m, "control_refused"))
		}
		chaosFigures(t, "control API from another user (nobody): hold, release and pprof refused %.0f of 3, group held %v",
			metricSum(m, "tpsched_control_refused_total"), held())
		if !strings.Contains(n.stderr.String(), "control request refused") {
			t.Error("refusals not logged")
		}
	})
	t.Run("scdd's own user holds, releases and profiles", func(t *testing.T) {
		out, err := n.scdctl("hold", "g")
		if err != nil || !strings.Contains(out, "held service group g") {
			t.Fatalf("scdctl hold: %v: %s", err, out)
		}
		if !held() {
			t.Fatal("hold over the socket did not hold")
		}
		if _, err := c.Call(ctx, "g", "echo", []byte("x")); codeOf(err) != netio.CodeServiceClosed {
			t.Errorf("call to the held group: %v", err)
		}
		if out, err := n.scdctl("release", "g"); err != nil || !strings.Contains(out, "released service group g") {
			t.Fatalf("scdctl release: %v: %s", err, out)
		}
		if _, err := c.Call(ctx, "g", "echo", []byte("x")); err != nil {
			t.Errorf("call after release: %v", err)
		}
		prof, err := exec.CommandContext(ctx, bin("scdctl"), "-s", sock, "pprof", "goroutine").Output()
		if err != nil || !bytes.HasPrefix(prof, []byte{0x1f, 0x8b}) {
			t.Errorf("scdctl pprof goroutine: %v, %d bytes, want a gzipped profile", err, len(prof))
		}
		// Who asked is logged for each action, not for a look.
		log := n.stderr.String()
		for _, path := range []string{"/hold", "/release"} {
			if !strings.Contains(log, `msg="control request" path=`+path+` query="group=g" uid=0 pid=`) {
				t.Errorf("%s not logged with its asker:\n%s", path, grep(log, "control request"))
			}
		}
		if strings.Contains(log, `msg="control request" path=/debug`) {
			t.Errorf("a profile logged as a control action:\n%s", grep(log, "control request"))
		}
	})
}

// TestControlSocketOfANonRootNode: a node running as nobody lets nobody
// (its own user) and root use its control socket, and refuses a third
// user: "own uid" is the daemon's, not root's.
func TestControlSocketOfANonRootNode(t *testing.T) {
	skipShort(t)
	testenv.RequireRoot(t, "runs scdd as nobody and scdctl as a third user")
	testenv.RequireTool(t, "setpriv", "util-linux")
	const other = 65533 // no name needed: the kernel only compares numbers
	// Everything the node and the callers read must be theirs to read.
	base, err := os.MkdirTemp("", "tpctl")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(base) })
	must(t, os.Chmod(base, 0o755))
	must(t, os.Chmod(binDir, 0o755))
	sockDir := filepath.Join(base, "run")
	must(t, os.Mkdir(sockDir, 0o755))
	must(t, os.Chown(sockDir, nobody, nobody))
	sock := filepath.Join(sockDir, "n.sock")
	src := defDir(t, fmt.Sprintf("set control_socket = %q\n", sock), map[string]string{"g": echoDef("g", 1, 16, 1<<20)})
	defs := filepath.Join(base, "defs")
	must(t, os.CopyFS(defs, os.DirFS(src)))
	must(t, filepath.Walk(defs, func(p string, fi os.FileInfo, err error) error {
		switch {
		case err != nil:
			return err
		case fi.IsDir():
			return os.Chmod(p, 0o755)
		}
		return os.Chmod(p, 0o644)
	}))
	n := startCommand(t, "setpriv", "--reuid", strconv.Itoa(nobody), "--regid", strconv.Itoa(nobody), "--clear-groups",
		bin("scdd"), "-c", defs, "-cpu-probes", "off")
	held := func() bool { return groupStatus(t, n, "g").Held }
	as := func(uid int, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin("scdctl"), append([]string{"-s", sock}, args...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid), Groups: []uint32{}}}
		cmd.Dir = "/"
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := as(nobody, "hold", "g"); err != nil || !held() {
		t.Fatalf("the node's own user (nobody) could not hold: %v: %s", err, out)
	}
	if out, err := as(0, "release", "g"); err != nil || held() {
		t.Fatalf("root could not release: %v: %s", err, out)
	}
	must(t, os.Chmod(sock, 0o666))
	out, err := as(other, "hold", "g")
	want := fmt.Sprintf("uid %d may not use it: only scdd's own user (uid %d) and root", other, nobody)
	if err == nil || !strings.Contains(out, want) || held() {
		t.Errorf("uid %d: %v: %q, want %q", other, err, out, want)
	}
}

// TestScdctlFlagForms: flags before and after the command, "--", -h, help,
// -version on every binary, usage errors, and what hold and release say.
func TestScdctlFlagForms(t *testing.T) {
	testenv.Slow(t, "runs for seconds; 8 s without -race on a busy 2-core machine")
	skipShort(t)
	dir := defDir(t, "", map[string]string{"g": echoDef("g", 1, 16, 1<<20)})
	n := startNode(t, "-c", dir)
	// The node's addresses come from the environment, so each form below
	// is exactly what a person types.
	env := append(os.Environ(), "DCCONFPATH=", "TPSCHED_RPC="+n.rpc, "TPSCHED_HTTP="+n.ctl, "TPSCHED_CONTROL_SOCKET="+n.sock)
	run := func(prog string, args ...string) (stdout, stderr string, code int) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin(prog), args...)
		cmd.Env = env
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		checkRace(t, prog, e.String())
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("%s %v: %v", prog, args, err)
		}
		return o.String(), e.String(), code
	}
	cases := []struct {
		name   string
		prog   string
		args   []string
		code   int
		stdout string // a substring; "" = nothing
		stderr string
	}{
		{"flag after the command", "scdctl", []string{"call", "-t", "5s", "g", "echo", "hi"}, 0, "hi\n", ""},
		{"flag before the command", "scdctl", []string{"-t", "5s", "call", "g", "echo", "hi"}, 0, "hi\n", ""},
		{"flag between the arguments", "scdctl", []string{"call", "g", "-t=5s", "echo", "hi"}, 0, "hi\n", ""},
		{"-- ends the flags", "scdctl", []string{"call", "-t", "5s", "g", "echo", "--", "-5"}, 0, "-5\n", ""},
		{"status -json", "scdctl", []string{"status", "-json"}, 0, `"group":"g"`, ""},
		{"status --json", "scdctl", []string{"status", "--json"}, 0, `"group":"g"`, ""},
		{"status table", "scdctl", []string{"status"}, 0, "RESTARTS", ""},
		{"-h", "scdctl", []string{"-h"}, 0, "usage: scdctl", ""},
		{"--help", "scdctl", []string{"--help"}, 0, "Commands:", ""},
		{"help", "scdctl", []string{"help"}, 0, "usage: scdctl", ""},
		{"call -h", "scdctl", []string{"call", "-h"}, 0, "usage: scdctl", ""},
		{"no command", "scdctl", nil, 2, "", "usage: scdctl"},
		{"unknown command", "scdctl", []string{"frobnicate"}, 2, "", `unknown command "frobnicate"`},
		{"unknown flag", "scdctl", []string{"status", "-frob"}, 2, "", "flag provided but not defined: -frob"},
		{"call without a service", "scdctl", []string{"call", "g"}, 2, "", "usage: scdctl call GROUP SERVICE [DATA]"},
		// The node's limit is what is left of the caller's 300ms when the
		// call reaches it (290ms after a busy moment between scdctl's start
		// of the clock and its send), and on a busy machine scdctl's own
		// deadline may pass before the node's answer arrives: either way
		// the caller's limit, about 300ms.
		{"timed out says after how long", "scdctl", []string{"call", "-t", "300ms", "g", "sleep", "3000"}, 1, "",
			`re:timed out: no answer within (2[0-9]0|300)ms \(the caller's (timeout|deadline)\)`},
		{"hold", "scdctl", []string{"hold", "g"}, 0, "held service group g: new calls get 'service closed'", ""},
		{"hold again", "scdctl", []string{"hold", "g"}, 0, "service group g was already held; nothing changed", ""},
		{"release", "scdctl", []string{"release", "g"}, 0, "released service group g: it takes calls again", ""},
		{"release again", "scdctl", []string{"release", "g"}, 0, "service group g was not held; nothing changed", ""},
		{"hold an unknown group", "scdctl", []string{"hold", "nosuch"}, 1, "", "no such service group"},
		{"pprof with seconds it does not take", "scdctl", []string{"pprof", "heap", "5"}, 2, "", "SECONDS only for profile and trace"},
		{"scdctl -version", "scdctl", []string{"-version"}, 0, "scdctl ", ""},
		{"scdd -version", "scdd", []string{"-version"}, 0, "scdd ", ""},
		{"uap-echo -version", "uap-echo", []string{"-version"}, 0, "uap-echo ", ""},
	}
	defer func() {
		// A hold or release that changes nothing is not logged again
		// (issue 23, item 10): one line each for the two that did.
		log := n.stderr.String()
		if h, r := strings.Count(log, `msg="service group held"`), strings.Count(log, `msg="service group released"`); h != 1 || r != 1 {
			t.Errorf("the log says held %d times and released %d, want once each:\n%s", h, r, grep(log, "service group"))
		}
	}()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := run(tc.prog, tc.args...)
			if code != tc.code {
				t.Errorf("%s %s: exit %d, want %d\nstdout: %s\nstderr: %s", tc.prog, strings.Join(tc.args, " "), code, tc.code, stdout, stderr)
			}
			if (tc.stdout == "") != (stdout == "") || !strings.Contains(stdout, tc.stdout) {
				t.Errorf("%s %s: stdout %q, want %q", tc.prog, strings.Join(tc.args, " "), stdout, tc.stdout)
			}
			if re, ok := strings.CutPrefix(tc.stderr, "re:"); ok {
				if !regexp.MustCompile(re).MatchString(stderr) {
					t.Errorf("%s %s: stderr %q, want it to match %q", tc.prog, strings.Join(tc.args, " "), stderr, re)
				}
			} else if !strings.Contains(stderr, tc.stderr) {
				t.Errorf("%s %s: stderr %q, want %q", tc.prog, strings.Join(tc.args, " "), stderr, tc.stderr)
			}
		})
	}
}

// TestTimedOutSaysAfterHowLong: the node's 'timed out' names the limit and
// whose it was, the caller's timeout or the group's watch_time.
func TestTimedOutSaysAfterHowLong(t *testing.T) {
	testenv.Slow(t, "runs for seconds; 5 s without -race on a busy 2-core machine")
	skipShort(t)
	dir := defDir(t, "", map[string]string{"g": echoDef("g", 2, 16, 1<<20) + "set watch_time = 1\n"})
	n := startNode(t, "-c", dir)
	// With no deadline and no watch time of its own the client sends no
	// timeout, so the node's watch_time is the limit and the node's answer
	// what we see.
	forever := n.client(func(o *client.Options) { o.WatchTime = -1 })
	_, err := forever.Call(context.Background(), "g", "sleep", []byte("3000"))
	if want := "tpsched: timed out: no answer within 1s (watch_time)"; err == nil || err.Error() != want {
		t.Errorf("watch_time: got %v, want %q", err, want)
	}
	// A caller's own timeout, the node answering before the client gives up.
	caller := n.client(func(o *client.Options) { o.WatchTime = 400 * time.Millisecond })
	_, err = caller.Call(context.Background(), "g", "sleep", []byte("3000"))
	if want := "tpsched: timed out: no answer within 400ms (the caller's timeout)"; err == nil || err.Error() != want {
		t.Errorf("caller's timeout: got %v, want %q", err, want)
	}
}

// statusRow returns the columns of group's row in scdctl status's first
// table, by header name.
func statusRow(t *testing.T, out, group string) map[string]string {
	t.Helper()
	var header []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == "GROUP" && header == nil {
			header = f
			continue
		}
		if header != nil && len(f) == len(header) && f[0] == group {
			row := map[string]string{}
			for i, h := range header {
				row[h] = f[i]
			}
			return row
		}
	}
	t.Fatalf("no row for %s in:\n%s", group, out)
	return nil
}

// TestCtrlCSaysBoundAndSecondForces: the first SIGINT's log line states
// how long the drain may take and that a second one exits at once, and a
// second one does, while a call still runs (issue 31 item 6: an operator
// at a terminal saw "draining" and nothing about either).
func TestCtrlCSaysBoundAndSecondForces(t *testing.T) {
	skipShort(t)
	dir := defDir(t, "", map[string]string{"g": echoDef("g", 1, 16, 1<<20)})
	n := startNode(t, "-c", dir, "-drain-timeout", "20s")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	called := make(chan error, 1)
	go func() { _, err := n.client().Call(ctx, "g", "sleep", []byte("15000")); called <- err }()
	waitFor(t, 10*time.Second, "the sleep to run", func() bool { return groupStatus(t, n, "g").InFlight == 1 }, n.stderr.String)

	n.signal(syscall.SIGINT)
	waitFor(t, 10*time.Second, "the drain's log line", func() bool {
		return strings.Contains(n.stderr.String(), "signal received; draining")
	}, n.stderr.String)
	line := ""
	for _, l := range strings.Split(n.stderr.String(), "\n") {
		if strings.Contains(l, "signal received; draining") {
			line = l
		}
	}
	if !strings.Contains(line, "at most 20s") || !strings.Contains(line, "a second Ctrl-C") {
		t.Errorf("the first signal's line does not state the bound (20s) and the second Ctrl-C: %s", line)
	}
	// The drain waits for the 15 s sleep; a second signal must not.
	start := time.Now()
	n.signal(syscall.SIGINT)
	select {
	case <-n.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("scdd still runs 10 s after the second SIGINT")
	}
	if took := time.Since(start); took > 8*time.Second {
		t.Errorf("the second SIGINT took %v to end scdd", took)
	}
	var ee *exec.ExitError
	if !errors.As(n.err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("scdd after the second SIGINT: %v, want exit status 1", n.err)
	}
	if !strings.Contains(n.stderr.String(), "second signal: exiting without draining") {
		t.Errorf("no log line for the second signal")
	}
	cancel()
	<-called
}
