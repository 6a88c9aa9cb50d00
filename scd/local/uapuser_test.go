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
	ids := derivedUAPIDs(servers)
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
	again := derivedUAPIDs(servers[:10])
	for _, s := range servers[:10] {
		if again[s.Name] != ids[s.Name] {
			t.Errorf("%s: id %d with 2000 servers, %d with 10", s.Name, ids[s.Name], again[s.Name])
		}
	}
}
