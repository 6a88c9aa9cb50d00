package bench

import (
	"strconv"
	"strings"
	"time"

	"tpsched/internal/spin"
)

// burn keeps the CPU busy for d of wall time with the loop of uap-echo's
// burn service, so the Go peers do the same work as tpsched's UAP.
func burn(d time.Duration) { spin.Wall(d) }

// parseMicros reads the burn payload: decimal microseconds. Anything else
// burns nothing.
func parseMicros(b []byte) time.Duration {
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(n) * time.Microsecond
}
