package names

import (
	"testing"
	"time"
)

func TestParseDetector(t *testing.T) {
	for in, want := range map[string]Detector{
		"":            LANDetector,
		"lan":         LANDetector,
		"fast":        FastDetector,
		"2s/1s/5":     {ProbeInterval: 2 * time.Second, ProbeTimeout: time.Second, SuspicionMult: 5},
		"500ms/1ms/1": {ProbeInterval: 500 * time.Millisecond, ProbeTimeout: time.Millisecond, SuspicionMult: 1},
	} {
		got, err := ParseDetector(in)
		if err != nil || got != want {
			t.Errorf("ParseDetector(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"slow", "1s/500ms", "1s/2s/4", "1s/500ms/0", "5ms/1ms/4", "1s/0s/4", "x/500ms/4", "1s/500ms/x"} {
		if d, err := ParseDetector(in); err == nil {
			t.Errorf("ParseDetector(%q) = %v, want an error", in, d)
		}
	}
}
