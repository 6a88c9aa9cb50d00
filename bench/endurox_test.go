package bench

import (
	"os/exec"
	"slices"
	"strconv"
	"testing"
)

// TestEnduroXIPCKeys: NDRX_IPCKEY is hexadecimal, as Enduro/X reads it,
// and two domains' keys are at least 0x100 apart (their semaphores take
// keys just past them).
func TestEnduroXIPCKeys(t *testing.T) {
	seen := map[int64]bool{}
	for _, pid := range []int{1, 2, 1000, 2047} { // distinct modulo 0x800
		for seq := int32(1); seq <= 5; seq++ {
			k, err := strconv.ParseInt(enduroxIPCKey(pid, seq), 16, 64)
			if err != nil {
				t.Fatalf("key %q does not read as hexadecimal: %v", enduroxIPCKey(pid, seq), err)
			}
			if k <= 0 || k > 1<<31-1 {
				t.Fatalf("key %#x is not a positive 32-bit key", k)
			}
			for o := range seen {
				if d := k - o; d != 0 && d > -0x100 && d < 0x100 {
					t.Errorf("keys %#x and %#x are closer than 0x100", k, o)
				}
			}
			seen[k] = true
		}
	}
}

// TestDomainPIDsFindsOnlyTheMarked: the bench stops an Enduro/X domain by
// the mark in its processes' environment, never by their names.
func TestDomainPIDsFindsOnlyTheMarked(t *testing.T) {
	marked := exec.Command("sleep", "30")
	marked.Env = []string{"NDRX_RNDK=tpbx_test_mark"}
	other := exec.Command("sleep", "30")
	other.Env = []string{"NDRX_RNDK=tpbx_test_other"}
	for _, c := range []*exec.Cmd{marked, other} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	}
	got := domainPIDs("NDRX_RNDK=tpbx_test_mark")
	if !slices.Contains(got, marked.Process.Pid) || slices.Contains(got, other.Process.Pid) {
		t.Errorf("domainPIDs = %v; want %d and not %d", got, marked.Process.Pid, other.Process.Pid)
	}
}
