package leakcheck

import (
	"strings"
	"testing"
	"time"
)

func parked(stop <-chan struct{}) { <-stop }

// TestLeakedNamesARunningGoroutine: a goroutine of tpsched's code is
// listed while it runs and not once it ended.
func TestLeakedNamesARunningGoroutine(t *testing.T) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { parked(stop); close(done) }()
	time.Sleep(10 * time.Millisecond)
	if !listed("leakcheck.parked") {
		t.Fatal("a running goroutine is not listed")
	}
	close(stop)
	<-done
	time.Sleep(10 * time.Millisecond)
	if listed("leakcheck.parked") {
		t.Fatal("an ended goroutine is listed")
	}
}

func listed(fn string) bool {
	for _, g := range Leaked() {
		if strings.Contains(g, fn) {
			return true
		}
	}
	return false
}
