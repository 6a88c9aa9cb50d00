package local

import (
	"fmt"
	"testing"

	"tpsched/scd/def"
)

// TestDerivedUAPIDs: every server gets an id of its own in the range, and
// a server's id does not move when servers without a collision come or go.
func TestDerivedUAPIDs(t *testing.T) {
	var servers []def.Server
	for i := range 2000 {
		servers = append(servers, def.Server{Name: fmt.Sprintf("srv%04d", i)})
	}
	ids := derivedUAPIDs("n1", servers)
	seen := map[int]string{}
	for _, s := range servers {
		id := ids[s.Name]
		if id < uapUIDBase || id >= uapUIDBase+uapUIDRange {
			t.Fatalf("%s: id %d outside [%d, %d)", s.Name, id, uapUIDBase, uapUIDBase+uapUIDRange)
		}
		if other, dup := seen[id]; dup {
			t.Fatalf("%s and %s share id %d", s.Name, other, id)
		}
		seen[id] = s.Name
	}
	again := derivedUAPIDs("n1", servers[:10])
	for _, s := range servers[:10] {
		if again[s.Name] != ids[s.Name] {
			t.Errorf("%s: id %d with 2000 servers, %d with 10", s.Name, ids[s.Name], again[s.Name])
		}
	}
}

// TestDerivedUAPIDsDifferByNode (issue 19 item 10): servers of the same
// name on two nodes of one host get different users.
func TestDerivedUAPIDsDifferByNode(t *testing.T) {
	servers := []def.Server{{Name: "echo"}, {Name: "demo"}}
	a, b := derivedUAPIDs("node1", servers), derivedUAPIDs("node2", servers)
	for _, s := range servers {
		if a[s.Name] == b[s.Name] {
			t.Errorf("server %s has id %d on node1 and node2", s.Name, a[s.Name])
		}
	}
	if again := derivedUAPIDs("node1", servers); again["echo"] != a["echo"] {
		t.Errorf("node1's echo: %d, then %d", a["echo"], again["echo"])
	}
}
