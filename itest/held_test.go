package itest

import (
	"context"
	"strings"
	"testing"
	"time"

	"tpsched/netio"
)

// soloServer is a group only n1 of a cluster defines.
const soloServer = `set service_group = "solo"
set service = "pid=pid"
set module = MODULE
set parallel_count = 1
`

// TestClusterHeldGroupSaysWhere: a call through n0 for a group only n1
// runs, held on n1, is refused 'service closed' naming n1, by the client
// and by scdctl call; before this n0 answered 'no such service group'
// (issue 31 item 2), although its status showed the group held.
func TestClusterHeldGroupSaysWhere(t *testing.T) {
	skipShort(t)
	nodes := startCluster(t, clusterOpts{extra: func(i int) map[string]string {
		if i == 1 {
			return map[string]string{"solo": soloServer}
		}
		return nil
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	waitFor(t, 15*time.Second, "n0 to know that n1 runs solo", func() bool {
		return knowsGroup(t, nodes[0], "n1", "solo")
	}, nodes[0].stderr.String)
	c := nodes[0].client()
	if _, err := c.Call(ctx, "solo", "pid", nil); err != nil {
		t.Fatalf("solo through n0 before the hold: %v", err)
	}

	if out, err := nodes[1].scdctl("hold", "solo"); err != nil {
		t.Fatalf("scdctl hold solo on n1: %v: %s", err, out)
	}
	waitFor(t, 15*time.Second, "n0 to see solo held on n1", func() bool {
		return heldOn(t, nodes[0], "n1", "solo")
	}, nodes[0].stderr.String)

	_, err := c.Call(ctx, "solo", "pid", nil)
	if code := codeOf(err); code != netio.CodeServiceClosed || !strings.Contains(err.Error(), "solo is held on n1") {
		t.Errorf("solo through n0 while held on n1: %v (code %v), want 'service closed: solo is held on n1'", err, code)
	}
	out, err := nodes[0].scdctl("call", "solo", "pid")
	if err == nil || !strings.Contains(out, "service closed") || !strings.Contains(out, "held on n1") {
		t.Errorf("scdctl call solo through n0 while held on n1: %v: %s", err, out)
	}
	// A group no node defines is still 'no such service group'.
	if _, err := c.Call(ctx, "nowhere", "pid", nil); codeOf(err) != netio.CodeNoSuchGroup {
		t.Errorf("a group no node defines: %v, want 'no such service group'", err)
	}

	// Released, the same call is served: the hold was the refusal's cause.
	if out, err := nodes[1].scdctl("release", "solo"); err != nil {
		t.Fatalf("scdctl release solo on n1: %v: %s", err, out)
	}
	waitFor(t, 15*time.Second, "n0 to see solo released on n1", func() bool {
		return !heldOn(t, nodes[0], "n1", "solo")
	}, nodes[0].stderr.String)
	if _, err := c.Call(ctx, "solo", "pid", nil); err != nil {
		t.Errorf("solo through n0 after the release: %v", err)
	}
}

// heldOn reports whether n's name table says group is held on node.
func heldOn(t *testing.T, n *node, node, group string) bool {
	t.Helper()
	st, err := n.status()
	if err != nil || st.Cluster == nil {
		return false
	}
	for _, ns := range st.Cluster.Nodes {
		for _, g := range ns.Groups {
			if ns.Node == node && g.Group == group {
				return g.Held
			}
		}
	}
	return false
}
