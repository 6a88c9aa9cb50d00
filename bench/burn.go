package bench

import (
	"strconv"
	"strings"
	"time"
)

// burn keeps the CPU busy for d of wall time, as uap-echo's burn service
// does, checking the clock rarely so the loop itself is the work.
func burn(d time.Duration) {
	end := time.Now().Add(d)
	x := uint64(1)
	for time.Now().Before(end) {
		for range 1000 {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	burnSink = x
}

var burnSink uint64

// parseMicros reads the burn payload: decimal microseconds. Anything else
// burns nothing.
func parseMicros(b []byte) time.Duration {
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(n) * time.Microsecond
}
