package names

import (
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"tpsched/internal/testenv"
)

// TestAdvertisableSaysWhenNoAddressIsLeft: a name port bound to every
// address, on a host with no address to advertise (a network namespace
// with only its loopback), is refused as Join would refuse it; one bound
// to an address advertises that address.
func TestAdvertisableSaysWhenNoAddressIsLeft(t *testing.T) {
	tr, err := ListenTransport("127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if err := tr.Advertisable("127.0.0.1"); err != nil {
		t.Errorf("bound to 127.0.0.1: %v", err)
	}

	testenv.RequireRoot(t, "a network namespace of its own")
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with the goroutine, and its
		// namespace with it.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			t.Errorf("unshare: %v", err)
			errc <- nil
			return
		}
		tr, err := ListenTransport("0.0.0.0", 0)
		if err != nil {
			t.Errorf("bind in the new namespace: %v", err)
			errc <- nil
			return
		}
		defer tr.Close()
		errc <- tr.Advertisable("0.0.0.0")
	}()
	if err := <-errc; err == nil || !strings.Contains(err.Error(), "none to advertise") {
		t.Errorf("bound to every address with none to advertise: %v, want an error that says so", err)
	}
}
