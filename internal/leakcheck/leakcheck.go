// Package leakcheck fails a test binary whose tests leave goroutines of
// tpsched's own code running: a package that promises every goroutine it
// starts ends at its Close (wlmnode, scd/local, rpcport, procmgr) holds
// itself to it in TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(leakcheck.Main(m)) }
package leakcheck

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// grace is how long goroutines that are ending get to end.
const grace = 5 * time.Second

// Main runs the tests and then, if they passed, waits up to grace for every
// goroutine running tpsched's code (other than the test runner's) to end;
// those left are printed and the binary fails.
func Main(m *testing.M) int {
	code := m.Run()
	if code != 0 {
		return code
	}
	var left []string
	for deadline := time.Now().Add(grace); ; time.Sleep(50 * time.Millisecond) {
		left = Leaked()
		if len(left) == 0 {
			return code
		}
		if time.Now().After(deadline) {
			break
		}
	}
	fmt.Fprintf(os.Stderr, "leakcheck: %d goroutines of tpsched's code outlived the tests:\n\n%s\n", len(left), strings.Join(left, "\n\n"))
	return 1
}

// Leaked lists the stacks of the goroutines that run tpsched's code now,
// but for the caller's and the test runner's.
func Leaked() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for i, g := range strings.Split(string(buf), "\n\n") {
		if i == 0 { // the caller's own
			continue
		}
		if strings.Contains(g, "tpsched/") && !strings.Contains(g, "testing.(*M).") {
			out = append(out, g)
		}
	}
	return out
}
