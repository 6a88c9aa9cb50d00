package itest

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"tpsched/internal/testenv"
)

// repoRoot is the checkout the tests run in (itest's parent).
func repoRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	must(t, err)
	return filepath.Dir(wd)
}

// unitOptions reads a systemd unit file's [Service] settings: name to the
// values given, in order.
func unitOptions(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	must(t, err)
	defer f.Close()
	opts := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = line
		case section == "[Service]":
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("%s: %q is not key=value", path, line)
			}
			opts[k] = append(opts[k], v)
		}
	}
	must(t, sc.Err())
	return opts
}

// setprivCaps turns CapabilityBoundingSet's "CAP_BPF CAP_KILL" into
// setpriv's "-all,+bpf,+kill".
func setprivCaps(set string) string {
	out := "-all"
	for _, c := range strings.Fields(set) {
		out += ",+" + strings.ToLower(strings.TrimPrefix(c, "CAP_"))
	}
	return out
}

// emulatedSandbox is a shell script that builds, in a new mount and UTS
// namespace, the file system systemd builds for the unit's ProtectSystem=
// strict, ProtectHome=yes, PrivateTmp=yes, PrivateDevices=yes,
// RuntimeDirectory= and UMask=, checks that it took, then runs "$@".
const emulatedSandbox = `set -eu
rt=/run/$RUNTIME_DIRECTORY
mkdir -p "$rt" && chmod "$RUNTIME_DIRECTORY_MODE" "$rt"
mount --make-rprivate /
# PrivateTmp=yes
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=1777 tmpfs /var/tmp
# ProtectHome=yes
for d in /home /root /run/user; do [ -d "$d" ] && mount -t tmpfs -o mode=000 tmpfs "$d"; done
# PrivateDevices=yes: a /dev with the pseudo devices only
dev=$(mktemp -d /tmp/dev.XXXXXX)
for n in null zero full random urandom tty; do touch "$dev/$n"; mount --bind "/dev/$n" "$dev/$n"; done
mkdir "$dev/shm" "$dev/pts"
mount --rbind "$dev" /dev
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
# StateDirectory=
sd=/var/lib/$STATE_DIRECTORY
mkdir -p "$sd" && chmod "$STATE_DIRECTORY_MODE" "$sd"
# ProtectSystem=strict: all read-only but /dev, /proc, /sys and the runtime and state directories
mount --bind "$rt" "$rt"
mount --bind "$sd" "$sd"
awk '{print $5}' /proc/self/mountinfo | sort -u | while read -r m; do
	case "$m" in /dev|/dev/*|/proc|/proc/*|/sys|/sys/*|/tmp|/var/tmp|"$rt"|"$sd") continue;; esac
	mount -o remount,bind,ro "$m" 2>/dev/null || true
done
for probe in /etc /usr /run /var; do
	if touch "$probe/.tpsched-rw-probe" 2>/dev/null; then rm -f "$probe/.tpsched-rw-probe"; echo "emulation: $probe is writable" >&2; exit 3; fi
done
[ -e /dev/sda ] || [ -e /dev/vda ] || [ -e /dev/mem ] && { echo "emulation: a physical device is visible" >&2; exit 3; }
[ -z "$(ls -A /root)" ] || { echo "emulation: /root shows its files" >&2; exit 3; }
umask "$UMASK"
exec "$@"
`

// TestUnitFileUnderEmulation runs scdd as dist/tpsched.service would: uid
// 0 with only the unit's capabilities and no_new_privs (setpriv), in a
// file system made as systemd makes it for the unit's sandboxing options
// (unshare). CPU priority by cgroup, the eBPF probes, the UAPs, the control
// socket in the runtime directory and the drain must all still work. The
// options this cannot emulate are listed in the unit file as not verified.
func TestUnitFileUnderEmulation(t *testing.T) {
	skipShort(t)
	testenv.RequireRoot(t, "runs scdd with the unit's capability set and mount namespace")
	for _, tool := range []string{"setpriv", "unshare"} {
		testenv.RequireTool(t, tool, "util-linux")
	}
	unit := unitOptions(t, filepath.Join(repoRoot(t), "dist", "tpsched.service"))
	want := map[string]string{"ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes", "PrivateDevices": "yes",
		"PrivateMounts": "yes", "ProtectHostname": "yes", "NoNewPrivileges": "yes", "RuntimeDirectory": "tpsched"}
	for k, v := range want {
		if got := unit[k]; len(got) != 1 || got[0] != v {
			t.Fatalf("unit %s=%v: the emulation here is for %s=%s; change both together", k, got, k, v)
		}
	}
	one := func(k string) string {
		if len(unit[k]) != 1 {
			t.Fatalf("unit %s=%v, want one line", k, unit[k])
		}
		return unit[k][0]
	}
	caps := one("CapabilityBoundingSet")

	// What an install puts outside /tmp (PrivateTmp hides it): the
	// binaries and a definition directory, here under /run.
	stage, err := os.MkdirTemp("/run", "tpsched-itest-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(stage) })
	// As under /usr/local/bin: the UAPs' own user must reach the module.
	must(t, os.Chmod(stage, 0o755))
	for _, b := range []string{"scdd", "uap-echo"} {
		data, err := os.ReadFile(bin(b))
		must(t, err)
		must(t, os.WriteFile(filepath.Join(stage, b), data, 0o755))
	}
	nodeID := fmt.Sprintf("itest-unit-%d", os.Getpid())
	defs := filepath.Join(stage, "defs")
	must(t, os.MkdirAll(filepath.Join(defs, "usr"), 0o755))
	must(t, os.WriteFile(filepath.Join(defs, "sysconf"), []byte(fmt.Sprintf(
		"set node_id = %q\nset rpc_address = \"127.0.0.1\"\nset rpc_port = 0\nset metrics_address = \"127.0.0.1:0\"\n", nodeID)), 0o644))
	must(t, os.WriteFile(filepath.Join(defs, "usr", "g"), []byte(
		"set service_group = \"g\"\nset service = \"echo=echo\", \"pid=pid\"\nset module = \"uap-echo\"\nset parallel_count = 1\nset schedule_priority = 2\n"), 0o644))

	runUnit := func(t *testing.T, capSet string) *node {
		args := []string{"-m", "-u", "--propagation", "private", "sh", "-c", emulatedSandbox, "sandbox",
			"setpriv", "--bounding-set=" + setprivCaps(capSet), "--inh-caps=-all", "--no-new-privs",
			filepath.Join(stage, "scdd"), "-c", defs, "-drain-timeout", "5s"}
		t.Setenv("RUNTIME_DIRECTORY", one("RuntimeDirectory"))
		t.Setenv("RUNTIME_DIRECTORY_MODE", one("RuntimeDirectoryMode"))
		t.Setenv("STATE_DIRECTORY", one("StateDirectory"))
		t.Setenv("STATE_DIRECTORY_MODE", one("StateDirectoryMode"))
		t.Setenv("UMASK", one("UMask"))
		return startCommand(t, "unshare", args...)
	}

	t.Run("with the unit's capabilities", func(t *testing.T) {
		n := runUnit(t, caps)
		st, err := n.status()
		must(t, err)
		if !strings.HasPrefix(string(st.CPU.Mechanism), "cgroup") {
			t.Errorf("cpu priority: %s (%s), want a cgroup", st.CPU.Mechanism, st.CPU.Reason)
		}
		if !st.Probes.Histogram {
			t.Errorf("cpu measurement: %s (%s), want the eBPF probes", st.Probes.Name, st.Probes.Reason)
		}
		sock := filepath.Join("/run", one("RuntimeDirectory"), nodeID+".sock")
		if n.sock != sock {
			t.Errorf("control socket %q, want %q in the runtime directory", n.sock, sock)
		}
		c := n.client()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if reply, err := c.Call(ctx, "g", "echo", []byte("sandboxed")); err != nil || string(reply) != "sandboxed" {
			t.Fatalf("call in the sandbox: %q, %v", reply, err)
		}
		if out, err := n.scdctl("hold", "g"); err != nil || !strings.Contains(out, "held service group g") {
			t.Errorf("hold over the socket in the runtime directory: %v: %s", err, out)
		}
		pid := groupStatus(t, n, "g").Processes[0].PID
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		must(t, err)
		if !strings.Contains(string(status), "NoNewPrivs:\t1") {
			t.Errorf("the UAP runs without no_new_privs:\n%s", status)
		}
		// Issue 19: its working directory is its server's own in the state
		// directory, its user's; it is contained by cgroup; it is named as
		// its module (run through a link in the state directory).
		wd := filepath.Join("/var/lib", one("StateDirectory"), nodeID, "g")
		if g := groupStatus(t, n, "g"); g.WorkDir != wd {
			t.Errorf("working directory %q, want %q", g.WorkDir, wd)
		} else if fi, err := os.Stat(wd); err != nil || int(fi.Sys().(*syscall.Stat_t).Uid) != procUID(t, pid) {
			t.Errorf("%s is not the UAP's user's: %v", wd, err)
		}
		if st.Contain.Kill != "cgroup.kill" && st.Contain.Kill != "freezer" && st.Contain.Kill != "cgroup.freeze" {
			t.Errorf("uap containment: %+v", st.Contain)
		}
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) != "uap-echo" {
			t.Errorf("the UAP is named %q", comm)
		}
		t.Cleanup(func() { os.RemoveAll(filepath.Join("/var/lib", one("StateDirectory"), nodeID)) })
		n.signal(15)
		if err := n.waitExit(20 * time.Second); err != nil {
			t.Errorf("drain in the sandbox: %v\n%s", err, n.stderr.String())
		}
		if _, err := os.Stat(sock); err == nil {
			t.Error("the control socket outlived the node")
		}
	})
	// The control case: the same sandbox without CAP_BPF has no probes, so
	// the check above does see the capabilities.
	t.Run("without CAP_BPF the probes do not load", func(t *testing.T) {
		n := runUnit(t, strings.ReplaceAll(caps, "CAP_BPF", ""))
		st, err := n.status()
		must(t, err)
		if st.Probes.Histogram {
			t.Errorf("cpu measurement %s without CAP_BPF: the capability set is not applied", st.Probes.Name)
		}
	})
}
