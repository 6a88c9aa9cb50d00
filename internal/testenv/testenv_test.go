package testenv

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// recorder stands in for a test: it records a skip or a failure instead
// of ending the goroutine.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper()                     {}
func (r *recorder) Skip(args ...any)            { r.skipped = fmt.Sprint(args...) }
func (r *recorder) Skipf(f string, args ...any) { r.skipped = fmt.Sprintf(f, args...) }
func (r *recorder) Fatalf(f string, args ...any) {
	r.failed = fmt.Sprintf(f, args...)
}

func TestSkipOrFailFollowsCI(t *testing.T) {
	for _, tc := range []struct {
		ci, bpf  string
		wantFail bool
	}{
		{"", "", false},
		{"false", "", false},
		{"true", "", true},
		{"", "1", true},
	} {
		t.Setenv("CI", tc.ci)
		t.Setenv("TPSCHED_REQUIRE_BPF", tc.bpf)
		r := &recorder{TB: t}
		SkipOrFail(r, "needs %s", "x")
		if tc.wantFail && (r.failed == "" || r.skipped != "") {
			t.Errorf("CI=%q TPSCHED_REQUIRE_BPF=%q: skipped %q, failed %q; want a failure", tc.ci, tc.bpf, r.skipped, r.failed)
		}
		if !tc.wantFail && (r.skipped != "needs x" || r.failed != "") {
			t.Errorf("CI=%q TPSCHED_REQUIRE_BPF=%q: skipped %q, failed %q; want the skip %q", tc.ci, tc.bpf, r.skipped, r.failed, "needs x")
		}
	}
}

func TestSlowRunsOnlyInTheFullSuite(t *testing.T) {
	t.Setenv(FullEnv, "")
	r := &recorder{TB: t}
	Slow(r, "minutes")
	if r.skipped == "" {
		t.Errorf("%s unset: Slow did not skip", FullEnv)
	}
	t.Setenv(FullEnv, "1")
	r = &recorder{TB: t}
	Slow(r, "minutes")
	if r.skipped != "" || r.failed != "" {
		t.Errorf("%s=1: Slow skipped %q, failed %q", FullEnv, r.skipped, r.failed)
	}
}

// The controllers this machine reports are where its mounts say; a
// controller appears on one hierarchy only.
func TestCgroupControllersMatchTheMounts(t *testing.T) {
	if _, err := os.Stat("/proc/self/mounts"); err != nil {
		t.Skip("no /proc:", err)
	}
	for c, h := range CgroupControllers() {
		if h.Version != 1 && h.Version != 2 {
			t.Errorf("%s: version %d", c, h.Version)
		}
		if _, err := os.Stat(h.Mount); err != nil {
			t.Errorf("%s on v%d at %s: %v", c, h.Version, h.Mount, err)
		}
		if h.Version == 1 {
			if _, err := os.Stat(h.Mount + "/cgroup.procs"); err != nil {
				t.Errorf("%s: v1 mount %s has no cgroup.procs: %v", c, h.Mount, err)
			}
		}
	}
}

// RequireCgroup skips, even in CI, when the controller sits on the other
// version's hierarchy, and says where.
func TestRequireCgroupOnTheOtherVersion(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("RequireCgroup checks root first; this test runs as root (CI)")
	}
	t.Setenv("CI", "true")
	for c, h := range CgroupControllers() {
		other := 3 - h.Version
		r := &recorder{TB: t}
		RequireCgroup(r, other, c)
		if r.skipped == "" || r.failed != "" {
			t.Errorf("%s is on v%d; RequireCgroup(v%d): skipped %q, failed %q; want a skip", c, h.Version, other, r.skipped, r.failed)
		}
		r = &recorder{TB: t}
		RequireCgroup(r, h.Version, c)
		if r.skipped != "" || r.failed != "" {
			t.Errorf("%s is on v%d; RequireCgroup(v%d): skipped %q, failed %q; want it to pass", c, h.Version, h.Version, r.skipped, r.failed)
		}
	}
	r := &recorder{TB: t}
	RequireCgroup(r, 2, "no-such-controller")
	if r.failed == "" {
		t.Errorf("a controller on no hierarchy with CI=true: skipped %q; want a failure", r.skipped)
	}
}

// TestUAPCFlagsAreTheMakefiles: UAPCFlags is the Makefile's UAP_CFLAGS.
func TestUAPCFlagsAreTheMakefiles(t *testing.T) {
	b, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "UAP_CFLAGS ?="); ok {
			if got := strings.Fields(v); !slices.Equal(got, UAPCFlags) {
				t.Errorf("the Makefile's UAP_CFLAGS are %q, UAPCFlags %q", got, UAPCFlags)
			}
			return
		}
	}
	t.Fatal("no UAP_CFLAGS ?= line in the Makefile")
}
