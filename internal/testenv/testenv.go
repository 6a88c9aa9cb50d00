// Package testenv is the tests' one skip policy. A test that needs what a
// machine may lack (root, eBPF, a cgroup controller, a tool) calls one of
// the Require functions first: on a laptop it skips with the reason; where
// the run must be complete it fails with the same reason instead. A run
// must be complete when CI=true or TPSCHED_REQUIRE_BPF=1 (.ci/run sets
// both; the second is older and kept).
//
// Slow marks a test that only the full suite runs (make check sets
// TPSCHED_TEST_FULL=1); make test, the README's command, skips it and says
// so.
//
// It is imported by tests, and by internal/netlab for its New (a test's
// lab), which links it into tpbench: nothing here runs there.
package testenv

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// FullEnv is the variable that makes Slow tests run (make check).
const FullEnv = "TPSCHED_TEST_FULL"

// Required says why every test must run here, or "" when a missing
// prerequisite may skip.
func Required() string {
	switch {
	case os.Getenv("TPSCHED_REQUIRE_BPF") == "1":
		return "TPSCHED_REQUIRE_BPF=1"
	case os.Getenv("CI") == "true":
		return "CI=true"
	}
	return ""
}

// SkipOrFail skips t with the reason, or fails it when the run must be
// complete (Required).
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if req := Required(); req != "" {
		t.Fatalf("%s (%s: this test must run here, not skip)", why, req)
		return
	}
	t.Skip(why)
}

// RequireRoot: what needs root (creating users' processes, cgroups,
// namespaces) is why.
func RequireRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		SkipOrFail(t, "needs root: %s", why)
	}
}

// RequireBPF: loading the eBPF programs needs root here (CAP_BPF and
// CAP_PERFMON, which root has).
func RequireBPF(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		SkipOrFail(t, "eBPF needs root (CAP_BPF, CAP_PERFMON)")
	}
}

// RequireTool: name must be on the PATH; hint says where it comes from
// (a Debian package).
func RequireTool(t testing.TB, name, hint string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		SkipOrFail(t, "needs %s (%s): %v", name, hint, err)
	}
	return p
}

// RequireCgroup needs root and the controller (cpu, memory, pids, ...) on
// the cgroup hierarchy of version 1 or 2. A controller sits on one
// hierarchy at a time: when it is on the other version's, the test skips
// even where the run must be complete, and says where it is (this is how
// a machine with every controller on v1 runs the v1 tests and skips the
// v2 ones, and the other way round); only a controller on neither fails.
func RequireCgroup(t testing.TB, version int, controller string) {
	t.Helper()
	RequireRoot(t, fmt.Sprintf("creating cgroups (v%d, %s)", version, controller))
	on := CgroupControllers()
	where, ok := on[controller]
	switch {
	case ok && where.Version == version:
		return
	case ok:
		t.Skipf("the %s controller is on cgroup v%d here (%s), not v%d: a controller is on one hierarchy at a time; this test runs where %s is on v%d",
			controller, where.Version, where.Mount, version, controller, version)
	default:
		SkipOrFail(t, "no cgroup hierarchy here has the %s controller (cgroup v%d wanted)", controller, version)
	}
}

// A Hierarchy is where a controller is mounted.
type Hierarchy struct {
	Version int    // 1 or 2
	Mount   string // its mount point
}

// CgroupControllers maps each controller this machine has to its
// hierarchy: v1 mounts by their options, v2 by its root's
// cgroup.controllers (empty while every controller is bound to v1).
func CgroupControllers() map[string]Hierarchy {
	out := map[string]Hierarchy{}
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return out
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 4 {
			continue
		}
		switch fields[2] {
		case "cgroup":
			for _, opt := range strings.Split(fields[3], ",") {
				switch {
				case opt == "rw", opt == "ro", strings.Contains(opt, "="), strings.HasPrefix(opt, "no"), opt == "relatime":
				default:
					if _, dup := out[opt]; !dup {
						out[opt] = Hierarchy{1, fields[1]}
					}
				}
			}
		case "cgroup2":
			b, err := os.ReadFile(filepath.Join(fields[1], "cgroup.controllers"))
			if err != nil {
				continue
			}
			for _, c := range strings.Fields(string(b)) {
				if _, dup := out[c]; !dup {
					out[c] = Hierarchy{2, fields[1]}
				}
			}
		}
	}
	return out
}

// Slow skips t unless the full suite runs (TPSCHED_TEST_FULL=1, make
// check): a test of minutes, or one whose point is scale or duration,
// stays out of make test. why says what makes it slow.
func Slow(t testing.TB, why string) {
	t.Helper()
	if os.Getenv(FullEnv) != "1" {
		t.Skipf("slow (%s): make check runs it (%s=1)", why, FullEnv)
	}
}

// Full reports whether the full suite runs (TPSCHED_TEST_FULL=1).
func Full() bool { return os.Getenv(FullEnv) == "1" }

// SyncBuffer is text written by any goroutine (a logger's output) that a
// test reads while the writers go on.
type SyncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// UAPCFlags are the Makefile's UAP_CFLAGS, the flags the C UAP library and
// its example UAP are built with: the tests that compile C UAPs use them,
// so a warning fails their build as it fails make's
// (TestUAPCFlagsAreTheMakefiles holds the two together).
var UAPCFlags = []string{"-O2", "-Wall", "-Wextra", "-Werror", "-std=c11"}
