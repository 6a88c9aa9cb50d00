// Command purev2 is the init (PID 1) of the virtual machine that
// tools/purev2.sh boots to run procmgr's tests on a host with cgroup v2
// alone (cgroup_no_v1=all: every controller on the unified hierarchy, as
// on today's distributions), which a hybrid development or CI host cannot
// give. It mounts what the tests need, enables the cpu, pids and memory
// controllers for the cgroups below the root, runs /procmgr.test with the
// arguments the kernel command line gives (PUREV2_RUN, PUREV2_SKIP), says
// how it ended on the console ("purev2: exit N") and powers the machine
// off.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
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
	cmd := exec.Command("/procmgr.test", "-test.v", "-test.timeout", "10m",
		"-test.run", os.Getenv("PUREV2_RUN"), "-test.skip", os.Getenv("PUREV2_SKIP"))
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
	cmd.Env = []string{"PATH=/bin", "TMPDIR=/tmp", "HOME=/tmp"}
	// A process group and session of its own, as under a shell: the
	// tests' UAPs join their parent's group, which PID 1's is not.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Run(); err != nil {
		fmt.Println("purev2: procmgr.test:", err)
		return 1
	}
	return 0
}
