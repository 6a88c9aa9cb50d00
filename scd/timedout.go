package scd

import (
	"fmt"
	"time"
)

// timedOutMessage says after how long a call was given up and whose limit
// that was: the caller's own timeout or the group's watch_time.
func timedOutMessage(limit, watch time.Duration) string {
	whose := "the caller's timeout"
	if limit == watch {
		whose = "watch_time"
	}
	return fmt.Sprintf("no answer within %v (%s)", roundLimit(limit), whose)
}

// roundLimit shows a limit as people set it: a client adds 1 ms to the time its
// caller has left, so 250 ms arrive as 251.
func roundLimit(d time.Duration) time.Duration {
	if d >= 50*time.Millisecond {
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}
