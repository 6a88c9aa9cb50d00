// Package spin is the CPU work of uap-echo's burn service and of the
// bench's Go peers (the gRPC server and the HTTP workers behind HAProxy),
// one loop for all, so that every system the bench compares does the same
// work for a burn call.
package spin

import "time"

// Wall keeps the CPU busy for d of wall time, checking the clock rarely so
// the loop itself is the work.
func Wall(d time.Duration) {
	end := time.Now().Add(d)
	x := uint64(1)
	for time.Now().Before(end) {
		for range 1000 {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	sink = x
}

// sink keeps the compiler from dropping the loop.
var sink uint64
