// Command purev2 is the init (PID 1) of the virtual machine that
// tools/purev2.sh boots to run procmgr's tests on a host with cgroup v2
// alone (cgroup_no_v1=all: every controller on the unified hierarchy, as
// on today's distributions), which a hybrid development or CI host cannot
// give. It mounts what the tests need, enables the cpu, pids and memory
// controllers for the cgroups below the root, runs /procmgr.test with the
// arguments the kernel command line gives (PUREV2_RUN, PUREV2_SKIP), then
// starts the real scdd on its embedded default and calls it (smoke), says
// how it all ended on the console ("purev2: exit N") and powers the
// machine off.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	code := run()
	fmt.Printf("purev2: exit %d\n", code)
	syscall.Sync()
	_ = syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF)
}

func run() int {
	fmt.Println() // the firmware's screen codes end the line before
	for _, m := range []struct{ dir, fs string }{
		{"/proc", "proc"}, {"/sys", "sysfs"}, {"/dev", "devtmpfs"}, {"/tmp", "tmpfs"}, {"/sys/fs/cgroup", "cgroup2"},
	} {
		if err := os.MkdirAll(m.dir, 0o755); err != nil {
			fmt.Println("purev2:", err)
			return 2
		}
		if err := syscall.Mount(m.fs, m.dir, m.fs, 0, ""); err != nil {
			fmt.Printf("purev2: mount %s on %s: %v\n", m.fs, m.dir, err)
			return 2
		}
	}
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		fmt.Printf("purev2: controllers on cgroup v2: %s", b)
	}
	if err := os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte("+cpu +pids +memory"), 0); err != nil {
		fmt.Println("purev2: enable cpu, pids and memory below the root:", err)
		return 2
	}
	cmd := exec.Command("/procmgr.test", "-test.v", "-test.timeout", "4m",
		"-test.run", os.Getenv("PUREV2_RUN"), "-test.skip", os.Getenv("PUREV2_SKIP"))
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
	cmd.Env = []string{"PATH=/bin", "TMPDIR=/tmp", "HOME=/tmp"}
	// A process group and session of its own, as under a shell: the
	// tests' UAPs join their parent's group, which PID 1's is not.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	code := 0
	if err := cmd.Run(); err != nil {
		fmt.Println("purev2: procmgr.test:", err)
		code = 1
	}
	if err := smoke(); err != nil {
		fmt.Println("purev2: scdd:", err)
		code = 1
	}
	return code
}

// smoke starts the real scdd on its embedded default (the demo group of
// uap-echo), calls it with scdctl, reads how the node says it contains
// its UAPs and where the UAP runs, and stops it: the node as a whole on
// cgroup v2 alone.
func smoke() error {
	_ = syscall.Sethostname([]byte("purev2")) // the node id; the kernel's "(none)" is none
	if err := loopbackUp(); err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	for _, d := range []string{"/run", "/var/lib"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	logf, err := os.Create("/tmp/scdd.log")
	if err != nil {
		return err
	}
	defer logf.Close()
	scdd := exec.Command("/bin/scdd")
	scdd.Stdout, scdd.Stderr = logf, logf
	scdd.Env = []string{"PATH=/bin", "TMPDIR=/tmp", "HOME=/tmp"}
	scdd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := scdd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- scdd.Wait() }()
	defer func() {
		b, _ := os.ReadFile("/tmp/scdd.log")
		fmt.Printf("purev2: scdd's log:\n%s", b)
	}()
	started := false
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline) && !started; time.Sleep(100 * time.Millisecond) {
		b, _ := os.ReadFile("/tmp/scdd.log")
		started = strings.Contains(string(b), `msg="scdd started"`)
		select {
		case err := <-exited:
			return fmt.Errorf("exited at its start: %v", err)
		default:
		}
	}
	if !started {
		_ = scdd.Process.Kill()
		return errors.New("not started within 60 s")
	}
	var errs []error
	scdctl := func(args ...string) string {
		out, err := exec.Command("/bin/scdctl", append([]string{"-t", "30s"}, args...)...).CombinedOutput()
		fmt.Printf("purev2: scdctl %s:\n%s", strings.Join(args, " "), out)
		if err != nil {
			errs = append(errs, fmt.Errorf("scdctl %s: %v", strings.Join(args, " "), err))
		}
		return string(out)
	}
	if out := scdctl("call", "demo", "echo", "hello"); strings.TrimSpace(out) != "hello" {
		errs = append(errs, fmt.Errorf("the demo's echo answered %q, want hello", out))
	}
	st := scdctl("status")
	for _, want := range []string{"cpu priority: cgroup2", "killed by cgroup.kill; pids limit cgroup2, memory limit cgroup2"} {
		if !strings.Contains(st, want) {
			errs = append(errs, fmt.Errorf("status does not say %q", want))
		}
	}
	// The UAP runs in its server's cgroup: /proc/PID/cgroup is "0::/tpsched/scdd-<pid>/demo".
	want := fmt.Sprintf("0::/tpsched/scdd-%d/demo\n", scdd.Process.Pid)
	uaps := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if exe, _ := os.Readlink("/proc/" + e.Name() + "/exe"); exe == "/bin/uap-echo" {
			uaps++
			if cg, _ := os.ReadFile("/proc/" + e.Name() + "/cgroup"); string(cg) != want {
				errs = append(errs, fmt.Errorf("uap-echo pid %s is in cgroup %q, want %q", e.Name(), cg, want))
			}
		}
	}
	if uaps == 0 {
		errs = append(errs, errors.New("no uap-echo process found"))
	}
	fmt.Printf("purev2: %d uap-echo processes checked, each in %s", uaps, want)
	_ = scdd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			errs = append(errs, fmt.Errorf("stopped: %v", err))
		}
	case <-time.After(60 * time.Second):
		_ = scdd.Process.Kill()
		errs = append(errs, errors.New("not stopped 60 s after SIGTERM"))
	}
	return errors.Join(errs...)
}

// loopbackUp brings lo up: a machine's init starts with it down.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}
