package ratelog

import (
	"testing"
	"time"
)

// The first event goes out; those within the period are held back and
// counted into the next line that goes out.
func TestAllowCountsWhatItHeldBack(t *testing.T) {
	r := Limiter{Every: 50 * time.Millisecond}
	if n, ok := r.Allow(); !ok || n != 1 {
		t.Fatalf("first Allow = %d, %v; want 1, true", n, ok)
	}
	for range 3 {
		if _, ok := r.Allow(); ok {
			t.Fatal("an event within the period went out")
		}
	}
	time.Sleep(60 * time.Millisecond)
	if n, ok := r.Allow(); !ok || n != 4 {
		t.Fatalf("Allow after the period = %d, %v; want 4 (3 held back and this one), true", n, ok)
	}
}
