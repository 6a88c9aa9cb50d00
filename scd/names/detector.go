package names

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
)

// Detector is membership's failure detection: memberlist probes one member
// every ProbeInterval and waits ProbeTimeout for its ack (then asks others
// to probe it, which take as long again); a member none of them reaches
// is suspect, and declared dead after SuspicionMult probe intervals
// (scaled by log10 of the members, at least 1; fewer when others confirm
// the suspicion). A suspect that hears of it refutes and stays.
//
// What holds where (issue 30 item 3; figures in docs/RELIABILITY.md,
// "Failure detection"): the probe timeout must exceed the longest moment a
// busy host leaves a node's name port unread, and the suspicion must last
// long enough for a refutation to cross a lossy link. On the 2-core
// development machine at load 20-40, LANDetector never declared a live
// node dead, with and without 5% loss; the old fast timing (200 ms probes,
// 100 ms timeout, suspicion 3) did, so FastDetector is slower than it was.
type Detector struct {
	ProbeInterval time.Duration
	ProbeTimeout  time.Duration
	SuspicionMult int
}

// LANDetector is the default: memberlist's LAN timing, probes every 1 s,
// 500 ms timeout, suspicion 4 probe intervals. A silent node leaves the
// tables of a three-node cluster 5 to 7 s after it went silent.
var LANDetector = Detector{ProbeInterval: time.Second, ProbeTimeout: 500 * time.Millisecond, SuspicionMult: 4}

// FastDetector is scdd -fast-failure-detection, for tests and one-host
// clusters: a silent node leaves the tables in 2 to 4 s.
var FastDetector = Detector{ProbeInterval: 500 * time.Millisecond, ProbeTimeout: 400 * time.Millisecond, SuspicionMult: 4}

// ParseDetector reads scdd's -failure-detection: "lan", "fast", or
// PROBE/TIMEOUT/SUSPICION ("1s/500ms/4").
func ParseDetector(s string) (Detector, error) {
	switch s {
	case "", "lan":
		return LANDetector, nil
	case "fast":
		return FastDetector, nil
	}
	parts := strings.Split(s, "/")
	if len(parts) != 3 {
		return Detector{}, fmt.Errorf("failure detection %q: want lan, fast or PROBE/TIMEOUT/SUSPICION (1s/500ms/4)", s)
	}
	var d Detector
	var err error
	if d.ProbeInterval, err = time.ParseDuration(parts[0]); err != nil {
		return Detector{}, fmt.Errorf("failure detection %q: probe interval: %w", s, err)
	}
	if d.ProbeTimeout, err = time.ParseDuration(parts[1]); err != nil {
		return Detector{}, fmt.Errorf("failure detection %q: probe timeout: %w", s, err)
	}
	if d.SuspicionMult, err = strconv.Atoi(parts[2]); err != nil {
		return Detector{}, fmt.Errorf("failure detection %q: suspicion: %w", s, err)
	}
	if d.ProbeInterval < 10*time.Millisecond || d.ProbeTimeout <= 0 || d.ProbeTimeout > d.ProbeInterval || d.SuspicionMult < 1 {
		return Detector{}, fmt.Errorf("failure detection %q: want a probe interval of at least 10ms, a timeout above 0 and at most the interval, a suspicion of at least 1", s)
	}
	return d, nil
}

func (d Detector) String() string {
	return fmt.Sprintf("%v/%v/%d", d.ProbeInterval, d.ProbeTimeout, d.SuspicionMult)
}

func (d Detector) apply(mc *memberlist.Config) {
	mc.ProbeInterval, mc.ProbeTimeout, mc.SuspicionMult = d.ProbeInterval, d.ProbeTimeout, d.SuspicionMult
}
