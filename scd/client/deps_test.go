package client

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestClientLinksNoServerCode: a program that only calls links neither the
// node's server (gnet and its logging) nor its metrics. go list says what
// the package pulls in.
func TestClientLinksNoServerCode(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("needs the go command: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, goBin, "list", "-deps", "tpsched/scd/client").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"github.com/panjf2000/gnet", "go.uber.org/zap", "gopkg.in/natefinch/lumberjack",
			"github.com/VictoriaMetrics/metrics", "tpsched/netio/rpcport", "tpsched/shm", "tpsched/procmgr"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("scd/client depends on %s", dep)
			}
		}
	}
}
