package names

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"tpsched/internal/testenv"
)

// TestCheckAdvertiseSaysWhenNoAddressIsLeft: a name port bound to every
// address, on a host with no address to advertise (a network namespace
// with only its loopback), is refused as Join would refuse it (Join
// itself, too); one bound to an address advertises that address.
func TestCheckAdvertiseSaysWhenNoAddressIsLeft(t *testing.T) {
	if err := CheckAdvertise("127.0.0.1"); err != nil {
		t.Errorf("bound to 127.0.0.1: %v", err)
	}

	testenv.RequireRoot(t, "a network namespace of its own")
	type result struct{ check, join error }
	got := make(chan result, 1)
	go func() {
		// Never unlocked: the thread ends with the goroutine, and its
		// namespace with it.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			got <- result{check: fmt.Errorf("unshare: %w", err)}
			return
		}
		var r result
		r.check = CheckAdvertise("0.0.0.0")
		if tr, err := ListenTransport("0.0.0.0", 0); err != nil {
			r.join = fmt.Errorf("bind: %w", err)
		} else {
			g, err := Join(GossipConfig{Self: "n0", BindAddr: "0.0.0.0", Transport: tr}, NewTable("n0"), NodeInfo{})
			if err == nil {
				_ = g.Stop()
			}
			r.join = err
		}
		got <- r
	}()
	r := <-got
	if errors.Is(r.check, unix.EPERM) {
		testenv.SkipOrFail(t, "no network namespace for this process: %v", r.check)
	}
	if r.check == nil || !strings.Contains(r.check.Error(), "none to advertise") {
		t.Errorf("CheckAdvertise bound to every address with none to advertise: %v, want an error that says so", r.check)
	}
	if r.join == nil || !strings.Contains(r.join.Error(), "none to advertise") {
		t.Errorf("Join bound to every address with none to advertise: %v; want the error CheckAdvertise foretold", r.join)
	}
}
