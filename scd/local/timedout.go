package local

import (
	"fmt"
	"time"

	"tpsched/scd/call"
)

// timedOutMessage says after how long a call was given up and whose limit
// that was: the caller's own timeout or the group's watch_time.
func timedOutMessage(limit, watch time.Duration) string {
	whose := "the caller's timeout"
	if limit == watch {
		whose = "watch_time"
	}
	return fmt.Sprintf("no answer within %v (%s)", call.RoundLimit(limit), whose)
}
