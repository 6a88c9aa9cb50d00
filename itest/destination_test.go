package itest

import (
	"context"
	"strings"
	"testing"
	"time"

	"tpsched/internal/testenv"
	"tpsched/netio"
	"tpsched/scd/client"
)

// TestClusterExplicitDestination: a call to an explicit destination
// (client.CallTo, scdctl call -node) is served by the named node and no
// other, although that node's rule would spread plain calls over all
// three; when the group is held there it is refused 'service closed', not
// transferred (a balanced call in the same state moves on).
func TestClusterExplicitDestination(t *testing.T) {
	testenv.Slow(t, "nodes started and stopped; 5 s without -race on a busy 2-core machine")
	skipShort(t)
	nodes := startCluster(t, clusterOpts{})
	owners := uapOwners(t, nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Every call goes through a client whose dchost is n0.
	c := nodes[0].client()
	const calls = 30
	for i, dest := range nodes {
		for range calls {
			out, err := c.CallTo(ctx, dest.rpc, "work", "pid", nil)
			if err != nil {
				t.Fatalf("CallTo n%d: %v", i, err)
			}
			if owner, ok := owners[string(out)]; !ok || owner != i {
				t.Fatalf("CallTo n%d answered by pid %s of node %d (known %v): the call was moved", i, out, owner, ok)
			}
		}
	}
	// The contrast: plain calls through n0 do spread (so the rule would
	// have moved the calls above).
	var plain [3]int
	for range 3 * calls {
		out, err := c.Call(ctx, "work", "pid", nil)
		must(t, err)
		plain[owners[string(out)]]++
	}
	t.Logf("plain calls through n0 served per node: %v; explicit destinations: %d each, all on the named node", plain, calls)
	if plain[1]+plain[2] == 0 {
		t.Fatalf("plain calls through n0 never left it %v: the test cannot tell a destination from a plain call", plain)
	}

	t.Run("scdctl call -node by node id and by address", func(t *testing.T) {
		for _, target := range []string{"n2", nodes[2].rpc} {
			for range 5 {
				out, err := nodes[0].scdctl("call", "-node", target, "work", "pid")
				if err != nil {
					t.Fatalf("scdctl call -node %s: %v: %s", target, err, out)
				}
				if owner := owners[strings.TrimSpace(out)]; owner != 2 {
					t.Fatalf("scdctl call -node %s answered by pid %q of n%d", target, out, owner)
				}
			}
		}
		out, err := nodes[0].scdctl("call", "-node", "n9", "work", "pid")
		if err == nil || !strings.Contains(out, "knows no node of that id") {
			t.Errorf("scdctl call -node n9 (no such node): %v: %s", err, out)
		}
		out, err = nodes[0].scdctl("call", "-node", "n1", "-balanced", "work", "pid")
		if err == nil || !strings.Contains(out, "never balanced") {
			t.Errorf("scdctl call -node with -balanced: %v: %s", err, out)
		}
	})

	t.Run("held at the destination: refused, not transferred", func(t *testing.T) {
		if out, err := nodes[1].scdctl("hold", "work"); err != nil {
			t.Fatalf("scdctl hold: %v: %s", err, out)
		}
		t.Cleanup(func() { _, _ = nodes[1].scdctl("release", "work") })
		_, err := c.CallTo(ctx, nodes[1].rpc, "work", "pid", nil)
		if code := codeOf(err); code != netio.CodeServiceClosed {
			t.Fatalf("CallTo the node where work is held: %v (code %v), want 'service closed'", err, code)
		}
		// A balanced call to n1 leaves it for a node where work is open.
		bal := nodes[1].client(func(o *client.Options) { o.Balanced = true })
		out2, err := bal.Call(ctx, "work", "pid", nil)
		must(t, err)
		if owner := owners[string(out2)]; owner == 1 {
			t.Errorf("a balanced call to the held node was served there (pid %s)", out2)
		}
		if _, err := nodes[0].scdctl("call", "-node", "n1", "work", "pid"); err == nil {
			t.Error("scdctl call -node n1 succeeded while work is held on n1")
		}
	})

	t.Run("a group the destination does not define: refused", func(t *testing.T) {
		_, err := c.CallTo(ctx, nodes[2].rpc, "nowhere", "pid", nil)
		if code := codeOf(err); code != netio.CodeNoSuchGroup {
			t.Fatalf("CallTo a group n2 lacks: %v, want 'no such service group'", err)
		}
	})
}
