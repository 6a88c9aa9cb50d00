package main

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestDropped: the cluster line says how many announces were dropped and
// why, not Go's map[] (issue 23, item 10).
func TestDropped(t *testing.T) {
	for _, c := range []struct {
		in   map[string]uint64
		want string
	}{
		{nil, "none dropped"},
		{map[string]uint64{"full": 0}, "none dropped"},
		{map[string]uint64{"unauthenticated": 2, "full": 1, "invalid": 0}, "3 dropped (full 1, unauthenticated 2)"},
	} {
		if got := dropped(c.in); got != c.want {
			t.Errorf("dropped(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestMisspeltCommand: a misspelt command gets a did-you-mean and a short
// usage, not the 60 lines of -h (issue 31 item 6), and needs no node.
func TestMisspeltCommand(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-c", t.TempDir(), "stauts"}, &stdout, &stderr); code != 2 {
		t.Errorf("scdctl stauts: exit %d, want 2", code)
	}
	out := stderr.String()
	if !strings.Contains(out, `unknown command "stauts" (did you mean status?)`) {
		t.Errorf("scdctl stauts says no did-you-mean:\n%s", out)
	}
	if n := strings.Count(out, "\n"); n > 5 || !strings.Contains(out, "scdctl -h") {
		t.Errorf("scdctl stauts prints %d lines, want at most 5 ending with a pointer to -h:\n%s", n, out)
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout: %q", stdout.String())
	}
}

// TestCommandsAreTheUsages: the short usage's list is every command the
// long usage describes, in its order.
func TestCommandsAreTheUsages(t *testing.T) {
	long := usage[strings.Index(usage, "Commands:"):strings.Index(usage, "\ncall and find")]
	var described []string
	for _, l := range strings.Split(long, "\n") {
		if f := strings.Fields(l); len(l) > 2 && l[2] != ' ' && len(f) > 0 && f[0] != "Commands:" {
			described = append(described, f[0])
		}
	}
	if !slices.Equal(described, commands) {
		t.Errorf("usage describes %v, commands lists %v", described, commands)
	}
}

// fakeControl serves answer to every request on a control socket under a
// new directory of its own (a unix socket's path must be short: not
// t.TempDir's) and returns the socket's path.
func fakeControl(t *testing.T, answer string) string {
	t.Helper()
	return fakeControlOf(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, answer)
	}))
}

// fakeControlOf is fakeControl with h answering.
func fakeControlOf(t *testing.T, h http.Handler) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "scdctl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "control.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// TestEnvActionFailedNodes: quiesce, resume, refresh and policy exit 1
// when a node reports an error, with -json too (it printed the answer and
// exited 0), and text mode prints no success headline for nodes that
// failed: it says which failed and which did it.
func TestEnvActionFailedNodes(t *testing.T) {
	const allFailed = `{"action":"quiesce","env":"e","nodes":[{"node":"n2","error":"unreachable"}]}`
	const oneFailed = `{"action":"quiesce","env":"e","nodes":[{"node":"n1","done":"quiesced"},{"node":"n2","error":"unreachable"}]}`
	const noneFailed = `{"action":"quiesce","env":"e","nodes":[{"node":"n1","done":"quiesced"}]}`
	for _, c := range []struct {
		name, answer string
		json         bool
		code         int
		stdout       []string // each must be in stdout
		notStdout    string
		stderr       string
	}{
		{"json, every node failed", allFailed, true, 1, []string{allFailed}, "", "quiesce failed on node(s) n2"},
		{"json, one node failed", oneFailed, true, 1, []string{oneFailed}, "", "quiesce failed on node(s) n2"},
		{"json, none failed", noneFailed, true, 0, []string{noneFailed}, "", ""},
		{"text, every node failed", allFailed, false, 1, []string{"quiesce e: failed on n2\n", "error: unreachable"}, "quiesced e", "quiesce failed on node(s) n2"},
		{"text, one node failed", oneFailed, false, 1, []string{"quiesce e: failed on n2; done on n1\n"}, "quiesced e", "quiesce failed on node(s) n2"},
		{"text, none failed", noneFailed, false, 0, []string{"quiesced e: its servers"}, "failed", ""},
		{"text, one instance failed", `{"action":"quiesce","env":"e","nodes":[{"node":"n1","env":"e@east","done":"quiesced"},{"node":"n1","env":"e@west","error":"x"}]}`,
			false, 1, []string{"quiesce e: failed on n1 (e@west); done on n1 (e@east)\n", "INSTANCE"}, "quiesced e", "quiesce failed on node(s) n1 (e@west)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			sock := fakeControl(t, c.answer)
			args := []string{"-s", sock, "-H", "127.0.0.1:1", "-a", "127.0.0.1:1", "quiesce", "e"}
			if c.json {
				args = append(args, "-json")
			}
			var stdout, stderr bytes.Buffer
			if code := run(args, &stdout, &stderr); code != c.code {
				t.Errorf("exit %d, want %d", code, c.code)
			}
			for _, s := range c.stdout {
				if !strings.Contains(stdout.String(), s) {
					t.Errorf("stdout lacks %q:\n%s", s, stdout.String())
				}
			}
			if c.notStdout != "" && strings.Contains(stdout.String(), c.notStdout) {
				t.Errorf("stdout has %q:\n%s", c.notStdout, stdout.String())
			}
			if !strings.Contains(stderr.String(), c.stderr) || (c.stderr == "") != (stderr.Len() == 0) {
				t.Errorf("stderr %q, want %q", stderr.String(), c.stderr)
			}
		})
	}
}

// TestProfileSecondsBounded: pprof profile with more seconds than a
// time.Duration holds is a usage error; it overflowed, and scdd stopped
// the profile at once and scdctl printed it, exit 0.
func TestProfileSecondsBounded(t *testing.T) {
	sock := fakeControl(t, "profile")
	for _, secs := range []string{"9999999999", "3601", "0"} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"-s", sock, "pprof", "profile", secs}, &stdout, &stderr); code != 2 {
			t.Errorf("scdctl pprof profile %s: exit %d, want 2 (stderr %q)", secs, code, stderr.String())
		}
		if !strings.Contains(stderr.String(), "1..3600") || stdout.Len() != 0 {
			t.Errorf("scdctl pprof profile %s: stdout %q, stderr %q", secs, stdout.String(), stderr.String())
		}
	}
}

// TestTimeoutAboveZero: -t 0 or below is a usage error; it failed every
// command with 'context deadline exceeded (is scdd running?...)'.
func TestTimeoutAboveZero(t *testing.T) {
	sock := fakeControl(t, `{"group":"g","held":true,"changed":true}`)
	for _, tv := range []string{"0", "-1s"} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"-s", sock, "-t", tv, "hold", "g"}, &stdout, &stderr); code != 2 {
			t.Errorf("scdctl -t %s hold g: exit %d, want 2 (stderr %q)", tv, code, stderr.String())
		}
		if !strings.Contains(stderr.String(), "want a duration above 0") {
			t.Errorf("scdctl -t %s: stderr %q", tv, stderr.String())
		}
	}
}

// TestFlagOfAnotherCommand: a flag that only other commands take is a
// usage error, not left unused: status -node n2 showed this node's
// status, hold -json printed text.
func TestFlagOfAnotherCommand(t *testing.T) {
	sock := fakeControl(t, `{"group":"g","held":true,"changed":true}`)
	for _, args := range [][]string{
		{"status", "-node", "n2"},
		{"hold", "g", "-json"},
		{"-balanced", "prc"},
		{"release", "-no-reply", "g"},
	} {
		var stdout, stderr bytes.Buffer
		all := append([]string{"-s", sock, "-H", "127.0.0.1:1", "-a", "127.0.0.1:1"}, args...)
		if code := run(all, &stdout, &stderr); code != 2 {
			t.Errorf("scdctl %v: exit %d, want 2 (stderr %q)", args, code, stderr.String())
		}
		if !strings.Contains(stderr.String(), " is not for ") || stdout.Len() != 0 {
			t.Errorf("scdctl %v: stdout %q, stderr %q", args, stdout.String(), stderr.String())
		}
	}
	// Given as its default, it changes nothing and is let be.
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-s", sock, "hold", "g", "-json=false"}, &stdout, &stderr); code != 0 {
		t.Errorf("scdctl hold g -json=false: exit %d: %s", code, stderr.String())
	}
}

// TestNoAnswerNamesTheNode: a node that takes the request and never
// answers is named when -t runs out: the control socket's path, or the
// HTTP address. It said only 'context deadline exceeded'.
func TestNoAnswerNamesTheNode(t *testing.T) {
	dir, err := os.MkdirTemp("", "scdctl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "control.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stuck := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-stuck:
		case <-r.Context().Done():
		}
	})}
	go srv.Serve(ul)
	srv2 := &http.Server{Handler: srv.Handler}
	go srv2.Serve(tl)
	t.Cleanup(func() { close(stuck); srv.Close(); srv2.Close() })
	for _, c := range []struct {
		args  []string
		where string
	}{
		{[]string{"hold", "g"}, "no answer from control socket " + sock + " before -t ran out"},
		{[]string{"status"}, "no answer from " + tl.Addr().String() + " before -t ran out"},
	} {
		var stdout, stderr bytes.Buffer
		args := append([]string{"-s", sock, "-a", tl.Addr().String(), "-H", "127.0.0.1:1", "-t", "300ms"}, c.args...)
		if code := run(args, &stdout, &stderr); code != 1 {
			t.Errorf("scdctl %v: exit %d, want 1", c.args, code)
		}
		if !strings.Contains(stderr.String(), c.where) {
			t.Errorf("scdctl %v: stderr %q, want %q", c.args, stderr.String(), c.where)
		}
	}
}

// TestRestartGivenUpSaysUndone: a restart scdctl stops waiting for (-t,
// 30 s by default, where the new process has 60 s to start its groups)
// is undone by the node, which takes the request's end for its caller
// giving up; scdctl must say so, and how to wait longer. It said only
// that no answer came, leaving the operator to guess which process serves.
func TestRestartGivenUpSaysUndone(t *testing.T) {
	sock := fakeControlOf(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // as Node.Restart: the caller gone, the hand-over is undone
		http.Error(w, "restart: context canceled", http.StatusConflict)
	}))
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-s", sock, "-H", "127.0.0.1:1", "-a", "127.0.0.1:1", "-t", "300ms", "restart"}, &stdout, &stderr); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	for _, want := range []string{"before -t ran out", "undoes a restart", "give -t more time"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr %q lacks %q", stderr.String(), want)
		}
	}
}

// TestAddressFlagsChecked: -a without a port, or a URL, and -H without a
// host are usage errors naming the flag. -a 127.0.0.1 asked port 80, and
// -a http://host:port a host named http.
func TestAddressFlagsChecked(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-a", "127.0.0.1", "status"}, `-a (or $TPSCHED_HTTP) "127.0.0.1": missing port`},
		{[]string{"-a", "http://127.0.0.1:12001", "status"}, `-a (or $TPSCHED_HTTP) "http://127.0.0.1:12001": give host:port, not a URL`},
		{[]string{"-H", ":12000", "call", "g", "s"}, `-H (or $TPSCHED_RPC) ":12000": missing host`},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(append([]string{"-t", "2s"}, c.args...), &stdout, &stderr); code != 2 {
			t.Errorf("scdctl %v: exit %d, want 2 (stderr %q)", c.args, code, stderr.String())
		}
		if !strings.Contains(stderr.String(), c.want) {
			t.Errorf("scdctl %v: stderr %q, want %q", c.args, stderr.String(), c.want)
		}
	}
}

// TestRestartSaysWhatIsNotKept: a restart's new process reads the
// definitions afresh, so a group held in the old one takes calls again
// and a chprc is undone; scdctl restart said only the new pid, and an
// operator who had held a group for maintenance found it open.
func TestRestartSaysWhatIsNotKept(t *testing.T) {
	sock := fakeControl(t, `{"old_pid":10,"new_pid":11,"took":"200ms","conns":0,"held":["alpha","gamma"],"chprc_changed":["beta"]}`)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-s", sock, "restart"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	for _, want := range []string{
		"held in pid 10, taking calls again in pid 11 (a restart reads the definitions): alpha, gamma; scdctl hold GROUP holds one again",
		"parallel_count changed by chprc in pid 10, as defined again in pid 11: beta",
	} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout %q lacks %q", stdout.String(), want)
		}
	}
	stdout.Reset()
	sock = fakeControl(t, `{"old_pid":10,"new_pid":11,"took":"200ms","conns":0}`)
	if code := run([]string{"-s", sock, "restart"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	if strings.Contains(stdout.String(), "held") || strings.Contains(stdout.String(), "chprc") {
		t.Errorf("nothing lost, yet stdout %q", stdout.String())
	}
}

// TestNotRunningSaysMinusC: a port or address that refuses the connection
// is met with where scdctl took it from and how to name the right one:
// without -c it is the embedded default's, while a node started on its own
// definitions is elsewhere (and prc, hold... found its socket all the
// same). status said only "-a or sysconf's metrics_address", call nothing.
func TestNotRunningSaysMinusC(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"status"}, "connection refused (is scdd running? -c DIR reads the node's HTTP address from its sysconf's metrics_address, -a names it)"},
		{[]string{"report"}, "connection refused (is scdd running? -c DIR reads the node's HTTP address from its sysconf's metrics_address, -a names it)"},
		{[]string{"call", "g", "s"}, "(is scdd running at 127.0.0.1:1? -c DIR reads the node's address from its sysconf's rpc_address and rpc_port, -H names it)"},
		{[]string{"find", "e"}, "(is scdd running at 127.0.0.1:1? -c DIR reads the node's address from its sysconf's rpc_address and rpc_port, -H names it)"},
	} {
		var stdout, stderr bytes.Buffer
		args := append([]string{"-s", "/nonexistent/ctl.sock", "-a", "127.0.0.1:1", "-H", "127.0.0.1:1", "-t", "5s"}, c.args...)
		if code := run(args, &stdout, &stderr); code != 1 {
			t.Errorf("scdctl %v: exit %d, want 1", c.args, code)
		}
		if !strings.Contains(stderr.String(), c.want) {
			t.Errorf("scdctl %v: stderr %q, want %q", c.args, stderr.String(), c.want)
		}
	}
}

// TestProfileNameChecked: a profile scdd does not serve is a usage error
// that lists those it does; it went to the node and came back as scdd's
// bare "Unknown profile".
func TestProfileNameChecked(t *testing.T) {
	sock := fakeControl(t, "profile")
	for _, name := range []string{"cpu", "goroutines", "Heap"} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"-s", sock, "pprof", name}, &stdout, &stderr); code != 2 {
			t.Errorf("scdctl pprof %s: exit %d, want 2 (stderr %q)", name, code, stderr.String())
		}
		if !strings.Contains(stderr.String(), "PROFILE is heap, goroutine, allocs, block, mutex, threadcreate, profile, trace") || stdout.Len() != 0 {
			t.Errorf("scdctl pprof %s: stdout %q, stderr %q", name, stdout.String(), stderr.String())
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-s", sock, "pprof", "goroutine"}, &stdout, &stderr); code != 0 || stdout.String() != "profile" {
		t.Errorf("scdctl pprof goroutine: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
}

// TestCommandHelp: scdctl help CMD and scdctl CMD -h print that command's
// part of the usage and the flags it takes, not the 60 lines of -h, and
// need no node; a misspelt one gets a did-you-mean.
func TestCommandHelp(t *testing.T) {
	for _, cmd := range commands {
		var byHelp, byFlag, stderr bytes.Buffer
		if code := run([]string{"help", cmd}, &byHelp, &stderr); code != 0 {
			t.Fatalf("scdctl help %s: exit %d: %s", cmd, code, stderr.String())
		}
		if code := run([]string{cmd, "-h"}, &byFlag, &stderr); code != 0 {
			t.Fatalf("scdctl %s -h: exit %d: %s", cmd, code, stderr.String())
		}
		out := byHelp.String()
		if byFlag.String() != out {
			t.Errorf("scdctl %s -h differs from scdctl help %s:\n%s\n---\n%s", cmd, cmd, byFlag.String(), out)
		}
		if !strings.HasPrefix(out, "usage: scdctl [flags] "+cmd) || strings.Count(out, "usage:") != 1 {
			t.Errorf("scdctl help %s does not begin with its own synopsis alone:\n%s", cmd, out)
		}
		if n := strings.Count(out, "\n"); n > 30 {
			t.Errorf("scdctl help %s prints %d lines:\n%s", cmd, n, out)
		}
		for _, c := range []struct {
			flag string
			want bool
		}{
			{"-t duration", true},
			{"-node", cmd == "call"},
			{"-json", slices.Contains(flagCommands["json"], cmd)},
			{"-H", cmd == "call" || cmd == "find"},
			{"-a", cmd == "status" || cmd == "report"},
			{"ENV@NAME", slices.Contains(instanceCommands, cmd)},
		} {
			if got := strings.Contains(out, "\n  "+c.flag) || (c.flag == "ENV@NAME" && strings.Contains(out, c.flag)); got != c.want {
				t.Errorf("scdctl help %s: shows %s %v, want %v:\n%s", cmd, c.flag, got, c.want, out)
			}
		}
	}
	if got := commandUsage("chprc"); !strings.Contains(got, "within the definition's maximum") {
		t.Errorf("chprc's help misses the lines after its synopsis:\n%s", got)
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"help", "help"}, &stdout, &stderr); code != 0 || !strings.HasPrefix(stdout.String(), "usage: scdctl help [COMMAND]") {
		t.Errorf("scdctl help help: exit %d, stdout %q, stderr %q, want its own usage", code, stdout.String(), stderr.String())
	}
	stdout.Reset()
	stderr.Reset()
	if code := run([]string{"stauts", "-h"}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "did you mean status?") || stdout.Len() != 0 {
		t.Errorf("scdctl stauts -h: exit %d, stdout %q, stderr %q, want 2 and a did-you-mean (it printed the whole help, exit 0)", code, stdout.String(), stderr.String())
	}
	stdout.Reset()
	stderr.Reset()
	if code := run([]string{"help", "stauts"}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "did you mean status?") {
		t.Errorf("scdctl help stauts: exit %d, stderr %q, want 2 and a did-you-mean", code, stderr.String())
	}
}

// TestRepeatedFlag: a flag given twice is a usage error naming it; the
// flag package kept the last, so scdctl -c a status -c b read b's sysconf
// with nothing said. A value that looks like a flag, and DATA after --,
// are not flags.
func TestRepeatedFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // "" when no flag is repeated
	}{
		{[]string{"-c", "a", "status", "-c", "b"}, "-c given twice"},
		{[]string{"-t=1s", "status", "-t", "2s"}, "-t given twice"},
		{[]string{"-json", "status", "--json"}, "-json given twice"},
		{[]string{"-H", "127.0.0.1:1", "-t", "1s", "call", "g", "s", "--", "-t"}, ""},
	} {
		var stdout, stderr bytes.Buffer
		code := run(c.args, &stdout, &stderr)
		switch {
		case c.want != "" && (code != 2 || !strings.Contains(stderr.String(), c.want)):
			t.Errorf("scdctl %v: exit %d, %q, want 2 and %q", c.args, code, stderr.String(), c.want)
		case c.want == "" && strings.Contains(stderr.String(), "given twice"):
			t.Errorf("scdctl %v: %q", c.args, stderr.String())
		}
	}
}

// TestRefusalWithoutText: a refusal whose body is empty (a proxy's 502, a
// node's handler that wrote no reason) says who refused and its status.
// scdctl printed "scdctl: " and nothing else.
func TestRefusalWithoutText(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusBadGateway) })
	sock := fakeControlOf(t, h)
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(tl)
	t.Cleanup(func() { srv.Close() })
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"hold", "g"}, "scdctl: control socket " + sock + " answered 502 Bad Gateway, with no reason\n"},
		{[]string{"status"}, "scdctl: " + tl.Addr().String() + " answered 502 Bad Gateway, with no reason\n"},
		{[]string{"report"}, "scdctl: " + tl.Addr().String() + " answered 502 Bad Gateway, with no reason\n"},
	} {
		var stdout, stderr bytes.Buffer
		args := append([]string{"-s", sock, "-a", tl.Addr().String(), "-H", "127.0.0.1:1"}, c.args...)
		if code := run(args, &stdout, &stderr); code != 1 {
			t.Errorf("scdctl %v: exit %d, want 1", c.args, code)
		}
		if stderr.String() != c.want {
			t.Errorf("scdctl %v: stderr %q, want %q", c.args, stderr.String(), c.want)
		}
	}
}
