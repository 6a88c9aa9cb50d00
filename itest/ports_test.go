package itest

// A node's ports are its own: no UAP may bind one of them first (the node
// binds every listening socket before it starts a UAP), and a second scdd
// may not share them (SO_REUSEPORT would let it, both being root).

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"tpsched/internal/freeport"
	"tpsched/internal/testenv"
	"tpsched/netio"
)

// TestChaosPortSquat: a UAP that tries, from its first instant, to bind
// every port of its node (the RPC port and a receiver group's with
// SO_REUSEPORT, metrics_address, the name port's TCP and UDP, the control
// socket) gets none of them, and every call is answered by the node. (The
// UAPs used to start before the RPC port was bound: the UAP took the port
// and answered 61,010 of 61,010 calls itself.)
func TestChaosPortSquat(t *testing.T) {
	testenv.Slow(t, "a fault experiment; 5 s without -race on a busy 2-core machine")
	skipShort(t)
	ports, err := freeport.Common([]string{"127.0.0.1"}, 4)
	if err != nil {
		t.Skip(err)
	}
	rpc, rg, metricsPort, namePort := ports[0], ports[1], ports[2], ports[3]
	dir := t.TempDir()
	ctl := filepath.Join(dir, "ctl.sock")
	sysconf := fmt.Sprintf("set node_id = \"squat\"\nset rpc_address = \"127.0.0.1\"\nset rpc_port = %d\n"+
		"set metrics_address = \"127.0.0.1:%d\"\nset name_port = %d\nset all_node = \"127.0.0.1\", \"127.0.0.2\"\n"+
		"set control_socket = %q\n", rpc, metricsPort, namePort, ctl)
	targets := []string{
		fmt.Sprintf("tcp:127.0.0.1:%d", rpc), fmt.Sprintf("tcp:127.0.0.1:%d", rg),
		fmt.Sprintf("tcp:127.0.0.1:%d", metricsPort), fmt.Sprintf("tcp:127.0.0.1:%d", namePort),
		fmt.Sprintf("udp:127.0.0.1:%d", namePort), "unix:" + ctl,
	}
	hostile := fmt.Sprintf("set service_group = \"a\"\nset service = \"echo\"\nset module = %q\nset parallel_count = 2\n"+
		"putenv HOSTILE_SQUAT %q\n", bin("uap-hostile"), strings.Join(targets, ","))
	must(t, os.MkdirAll(filepath.Join(dir, "usr"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "sysconf"), []byte(sysconf), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "scdsvcdef"), []byte(fmt.Sprintf("scdmulti -g rg -m 1 -p %d\n", rg)), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "usr", "a"), []byte(hostile), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "usr", "b"), []byte(fmt.Sprintf(
		"set service_group = \"b\"\nset service = \"echo\"\nset module = %q\nset parallel_count = 1\nscdmulti -g rg\n", bin("uap-echo"))), 0o644))
	n := startNode(t, "-c", dir)
	waitFor(t, 15*time.Second, "the squat attempts", func() bool { return strings.Contains(n.stderr.String(), "HOSTILE: squat done") },
		n.stderr.String)

	ctx, cancel := context.WithTimeout(context.Background(), chaosDuration(2*time.Second, 10*time.Second))
	defer cancel()
	var oa, ob atomic.Int64
	ta := rawCallers(ctx, t, n.rpc, 4, "a", "echo", "", 2_000, &oa)
	tb := rawCallers(ctx, t, fmt.Sprintf("127.0.0.1:%d", rg), 4, "b", "echo", "", 2_000, &ob)
	<-ctx.Done()
	time.Sleep(300 * time.Millisecond)

	var attempts, succeeded []string
	for _, line := range strings.Split(n.stderr.String(), "\n") {
		if i := strings.Index(line, "HOSTILE: squat "); i >= 0 && !strings.Contains(line, "squat done") {
			attempts = append(attempts, line[i:])
			if strings.HasSuffix(line, "SUCCEEDED") {
				succeeded = append(succeeded, line[i:])
			}
		}
	}
	chaosFigures(t, "port squat: a UAP tried to bind %d sockets of its node (RPC port, receiver group, metrics, name port TCP and UDP, control socket) for 2 s from its start; %d succeeded; the RPC port's callers: %s; the receiver group's: %s",
		len(attempts), len(succeeded), ta, tb)
	if len(attempts) != len(targets) {
		t.Errorf("%d squat attempts reported, want %d:\n%s", len(attempts), len(targets), strings.Join(attempts, "\n"))
	}
	for _, s := range succeeded {
		t.Errorf("the UAP took a port of the node: %s", s)
	}
	for name, tl := range map[string]*tally{"a (RPC port)": ta, "b (receiver group)": tb} {
		tl.mu.Lock()
		bad := tl.lost+tl.dup+tl.wrong+tl.stray+tl.spoiled+len(tl.byCode) > 0 || tl.ok == 0
		tl.mu.Unlock()
		if bad {
			t.Errorf("group %s: %s", name, tl)
		}
	}
}

// TestChaosSecondScddOnPort: a second scdd given a running node's
// RPC port (or a receiver group's port) refuses to start, saying which port
// and which process holds it; the running node serves on, and every
// connection made meanwhile reaches it. (Both root, SO_REUSEPORT let the
// second share the port: the kernel gave it half of the callers, who got
// 'no such service group'.)
func TestChaosSecondScddOnPort(t *testing.T) {
	skipShort(t)
	ports, err := freeport.Common([]string{"127.0.0.1"}, 2)
	if err != nil {
		t.Skip(err)
	}
	rpc, rg := ports[0], ports[1]
	first := defDir(t, "", map[string]string{"a": echoDef("a", 1, 64, 1<<20)})
	setRPCPort(t, first, rpc)
	must(t, os.WriteFile(filepath.Join(first, "scdsvcdef"), []byte(fmt.Sprintf("scdmulti -g rg -m 1 -p %d\n", rg)), 0o644))
	a := startNode(t, "-c", first)
	if a.rpc != fmt.Sprintf("127.0.0.1:%d", rpc) {
		t.Fatalf("the first node serves on %s, want port %d", a.rpc, rpc)
	}
	pid := a.cmd.Process.Pid
	for _, tc := range []struct {
		name      string
		rpcPort   int
		scdsvcdef string
		port      int
	}{
		{"rpc-port", rpc, "", rpc},
		{"receiver-group", 0, fmt.Sprintf("scdmulti -g rg -m 1 -p %d\n", rg), rg},
	} {
		t.Run(tc.name, func(t *testing.T) {
			second := defDir(t, "", map[string]string{"other": echoDef("other", 1, 64, 1<<20)})
			setRPCPort(t, second, tc.rpcPort)
			if tc.scdsvcdef != "" {
				must(t, os.WriteFile(filepath.Join(second, "scdsvcdef"), []byte(tc.scdsvcdef), 0o644))
			}
			var stderr bytes.Buffer
			cmd := exec.Command(bin("scdd"), "-c", second)
			cmd.Env = append(os.Environ(), "DCCONFPATH=")
			cmd.Stderr = &stderr
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			must(t, cmd.Start())
			began := time.Now()
			done := make(chan struct{})
			var exitErr error
			go func() { exitErr = cmd.Wait(); close(done) }()
			t.Cleanup(func() {
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				select {
				case <-done:
				case <-time.After(10 * time.Second):
				}
			})
			// Callers of the running node meanwhile: every one must reach it.
			stop := make(chan struct{})
			var served, strays atomic.Int64
			calling := make(chan struct{})
			go func() {
				defer close(calling)
				for i := uint64(0); ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					c, err := net.DialTimeout("tcp", a.rpc, 2*time.Second)
					if err != nil {
						strays.Add(1)
						continue
					}
					f, err := rawCall(c, bufio.NewReader(c), i, "a", []byte("x"))
					c.Close()
					if err == nil && f.Kind == netio.KindReply && string(f.Payload) == "x" {
						served.Add(1)
					} else {
						strays.Add(1)
					}
				}
			}()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				close(stop)
				<-calling
				t.Fatalf("the second scdd still runs 20 s after its start beside a node on port %d\n%s", tc.port, stderr.String())
			}
			took := time.Since(began)
			close(stop)
			<-calling
			var ee *exec.ExitError
			if !errors.As(exitErr, &ee) || ee.ExitCode() == 0 {
				t.Errorf("the second scdd exited with %v, want a non-zero status", exitErr)
			}
			msg := stderr.String()
			want := regexp.MustCompile(fmt.Sprintf(`port %d taken by another socket: process %d \(scdd`, tc.port, pid))
			if !want.MatchString(msg) {
				t.Errorf("the second scdd did not say which port and process:\n%s", msg)
			}
			if strings.Contains(msg, "cgroup") {
				t.Errorf("the second scdd set up its UAPs' cgroups before it found its port taken:\n%s", msg)
			}
			if st, err := a.status(); err != nil || st.Draining {
				t.Fatalf("the first node after the refusal: %v draining=%v", err, st.Draining)
			}
			c, err := net.DialTimeout("tcp", a.rpc, 2*time.Second)
			must(t, err)
			f, err := rawCall(c, bufio.NewReader(c), 1, "a", []byte("after"))
			c.Close()
			if err != nil || f.Kind != netio.KindReply {
				t.Fatalf("the first node after the refusal: %+v %v", f.Header, err)
			}
			line := msg
			if i := strings.LastIndex(strings.TrimSpace(msg), "\n"); i >= 0 {
				line = strings.TrimSpace(msg)[i+1:]
			}
			chaosFigures(t, "%s: the second scdd exited (%v) %v after its start: %q; the first served %d new connections meanwhile, %d went astray",
				tc.name, exitErr, took.Round(time.Millisecond), line, served.Load(), strays.Load())
			if strays.Load() > 0 {
				t.Errorf("%d connections to the running node were not served by it", strays.Load())
			}
		})
	}
}

// setRPCPort replaces defDir's rpc_port = 0 with port.
func setRPCPort(t *testing.T, dir string, port int) {
	t.Helper()
	p := filepath.Join(dir, "sysconf")
	b, err := os.ReadFile(p)
	must(t, err)
	must(t, os.WriteFile(p, bytes.Replace(b, []byte("set rpc_port = 0\n"), []byte(fmt.Sprintf("set rpc_port = %d\n", port)), 1), 0o644))
}

// TestMetricsPortTakenNamesHolder: scdd refuses to start when another
// process listens on its metrics_address, and names the port and that
// process as the RPC port's refusal does (issue 31 item 6: it said only
// "bind: address already in use").
func TestMetricsPortTakenNamesHolder(t *testing.T) {
	skipShort(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0") // this test's process holds it
	must(t, err)
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	dir := defDir(t, "", map[string]string{"a": echoDef("a", 1, 16, 1<<20)})
	p := filepath.Join(dir, "sysconf")
	b, err := os.ReadFile(p)
	must(t, err)
	old := []byte("set metrics_address = \"127.0.0.1:0\"\n")
	if !bytes.Contains(b, old) {
		t.Fatalf("defDir's sysconf has no %q:\n%s", old, b)
	}
	must(t, os.WriteFile(p, bytes.Replace(b, old, []byte(fmt.Sprintf("set metrics_address = \"127.0.0.1:%d\"\n", port)), 1), 0o644))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin("scdd"), "-c", dir)
	cmd.Env = append(os.Environ(), "DCCONFPATH=")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("scdd with its metrics_address taken: %v, want a non-zero exit\n%s", err, out)
	}
	want := regexp.MustCompile(fmt.Sprintf(`metrics_address 127\.0\.0\.1:%d: port %d taken by another socket: process %d \(`,
		port, port, os.Getpid()))
	if !want.Match(out) {
		t.Errorf("scdd does not name the port and this process (%d):\n%s", os.Getpid(), out)
	}
}
