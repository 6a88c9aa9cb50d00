package names

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"

	"tpsched/scd/loadlevel"
)

// node builds a NodeInfo with address "<id>:7000", announcing its load, one
// group "g" at Level0 unless groups are given.
func node(id string, boot, seq uint64, groups ...GroupInfo) NodeInfo {
	if groups == nil {
		groups = []GroupInfo{{Group: "g"}}
	}
	return NodeInfo{Node: id, Addr: id + ":7000", Announce: true, Boot: boot, Seq: seq, Groups: groups}
}

func TestApplyOrdering(t *testing.T) {
	lvl1 := []GroupInfo{{Group: "g", Level: loadlevel.Level1}}
	lvl2 := []GroupInfo{{Group: "g", Level: loadlevel.Level2}}
	type step struct {
		info        NodeInfo
		changed     bool
		wantVersion uint64 // Version after the step
	}
	cases := []struct {
		name      string
		steps     []step
		wantBoot  uint64
		wantSeq   uint64
		wantLevel loadlevel.Level
	}{
		{"first announce", []step{
			{node("b", 10, 1), true, 1},
		}, 10, 1, loadlevel.Level0},
		{"newer seq wins", []step{
			{node("b", 10, 1), true, 1},
			{node("b", 10, 2, lvl1...), true, 2},
		}, 10, 2, loadlevel.Level1},
		{"older seq ignored", []step{
			{node("b", 10, 5, lvl1...), true, 1},
			{node("b", 10, 4, lvl2...), false, 1},
		}, 10, 5, loadlevel.Level1},
		{"equal seq ignored even when it differs", []step{
			{node("b", 10, 5, lvl1...), true, 1},
			{node("b", 10, 5, lvl2...), false, 1},
		}, 10, 5, loadlevel.Level1},
		{"older boot ignored despite higher seq", []step{
			{node("b", 10, 5, lvl1...), true, 1},
			{node("b", 9, 99, lvl2...), false, 1},
		}, 10, 5, loadlevel.Level1},
		{"restart: higher boot and lower seq wins", []step{
			{node("b", 10, 99, lvl1...), true, 1},
			{node("b", 11, 0, lvl2...), true, 2},
		}, 11, 0, loadlevel.Level2},
		{"restart with the same content is a change", []step{
			{node("b", 10, 99), true, 1},
			{node("b", 11, 0), true, 2},
		}, 11, 0, loadlevel.Level0},
		{"re-announce of the same content: seq kept, no change", []step{
			{node("b", 10, 1, lvl1...), true, 1},
			{node("b", 10, 2, lvl1...), false, 1},
			{node("b", 10, 1, lvl2...), false, 1}, // older than the kept seq 2
		}, 10, 2, loadlevel.Level1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tab := NewTable("a")
			for i, s := range tc.steps {
				changed, err := tab.Apply(s.info)
				if err != nil || changed != s.changed {
					t.Fatalf("step %d: Apply = %v, %v; want %v, nil", i, changed, err, s.changed)
				}
				if v := tab.Version(); v != s.wantVersion {
					t.Fatalf("step %d: Version = %d, want %d", i, v, s.wantVersion)
				}
			}
			got, ok := tab.Get("b")
			if !ok || got.Boot != tc.wantBoot || got.Seq != tc.wantSeq || got.Groups[0].Level != tc.wantLevel {
				t.Fatalf("Get = %+v, %v; want boot %d seq %d %v", got, ok, tc.wantBoot, tc.wantSeq, tc.wantLevel)
			}
			if e := tab.Lookup("g"); len(e) != 1 || e[0].Level != tc.wantLevel {
				t.Fatalf("Lookup = %+v, want one entry at %v", e, tc.wantLevel)
			}
		})
	}
}

func TestLookup(t *testing.T) {
	tab := NewTable("b")
	apply := func(info NodeInfo) {
		t.Helper()
		if _, err := tab.Apply(info); err != nil {
			t.Fatal(err)
		}
	}
	// Applied out of order: Lookup sorts by node.
	apply(NodeInfo{Node: "c", Addr: "10.0.0.3:7000", Announce: true, Boot: 1, Groups: []GroupInfo{
		{Group: "g1", Level: loadlevel.Level2, Held: true},
		{Group: "g2", Socket: true},
	}})
	apply(NodeInfo{Node: "b", Addr: "10.0.0.2:7000", Announce: false, Boot: 1, Groups: []GroupInfo{
		{Group: "g1", Level: loadlevel.Level1},
	}})
	apply(NodeInfo{Node: "a", Addr: "10.0.0.1:7000", Announce: true, Boot: 1, Groups: []GroupInfo{
		{Group: "g0"}, {Group: "g1"},
	}})
	g1 := tab.Lookup("g1")
	cases := []struct {
		group string
		want  []Entry
	}{
		{"g0", []Entry{{Node: "a", Addr: "10.0.0.1:7000", Announce: true}}},
		{"g1", []Entry{
			{Node: "a", Addr: "10.0.0.1:7000", Announce: true},
			{Node: "b", Addr: "10.0.0.2:7000", Level: loadlevel.Level1, Local: true},
			{Node: "c", Addr: "10.0.0.3:7000", Level: loadlevel.Level2, Held: true, Announce: true},
		}},
		{"g2", []Entry{{Node: "c", Addr: "10.0.0.3:7000", Socket: true, Announce: true}}},
		{"nope", nil},
		{"", nil},
	}
	for _, tc := range cases {
		t.Run(tc.group, func(t *testing.T) {
			if got := tab.Lookup(tc.group); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Lookup(%q) =\n%+v\nwant\n%+v", tc.group, got, tc.want)
			}
		})
	}

	// c drops g1 and changes address; a leaves. The slice handed out
	// before stays as it was.
	apply(NodeInfo{Node: "c", Addr: "10.0.0.33:7000", Announce: true, Boot: 1, Seq: 1, Groups: []GroupInfo{{Group: "g2"}}})
	if !tab.Remove("a") || tab.Remove("a") {
		t.Fatal("Remove(a) twice: want true then false")
	}
	if got := tab.Lookup("g1"); len(got) != 1 || got[0].Node != "b" {
		t.Errorf("Lookup(g1) after changes = %+v, want only b", got)
	}
	if got := tab.Lookup("g2"); len(got) != 1 || got[0].Addr != "10.0.0.33:7000" {
		t.Errorf("Lookup(g2) after changes = %+v, want c at its new address", got)
	}
	if got := tab.Lookup("g0"); got != nil {
		t.Errorf("Lookup(g0) after a left = %+v, want nil", got)
	}
	if len(g1) != 3 || g1[0].Node != "a" || g1[2].Addr != "10.0.0.3:7000" {
		t.Errorf("an earlier Lookup result changed: %+v", g1)
	}
}

func TestRemove(t *testing.T) {
	cases := []struct {
		name        string
		apply       []string // nodes applied first
		remove      string
		want        bool
		wantLen     int
		wantVersion uint64
	}{
		{"unknown", []string{"a"}, "b", false, 1, 1},
		{"empty table", nil, "a", false, 0, 0},
		{"peer", []string{"a", "b"}, "b", true, 1, 3},
		{"self", []string{"a", "b"}, "a", true, 1, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tab := NewTable("a")
			for _, n := range tc.apply {
				if _, err := tab.Apply(node(n, 1, 1)); err != nil {
					t.Fatal(err)
				}
			}
			if got := tab.Remove(tc.remove); got != tc.want {
				t.Errorf("Remove = %v, want %v", got, tc.want)
			}
			if tab.Len() != tc.wantLen || tab.Version() != tc.wantVersion {
				t.Errorf("Len, Version = %d, %d; want %d, %d", tab.Len(), tab.Version(), tc.wantLen, tc.wantVersion)
			}
			if _, ok := tab.Get(tc.remove); ok {
				t.Errorf("Get(%q) after Remove: still there", tc.remove)
			}
			for _, e := range tab.Lookup("g") {
				if e.Node == tc.remove {
					t.Errorf("Lookup still lists %q", tc.remove)
				}
			}
			// A removed node comes back with its next announce, even an old one.
			if tc.want {
				if changed, err := tab.Apply(node(tc.remove, 1, 1)); !changed || err != nil {
					t.Errorf("Apply after Remove = %v, %v; want true, nil", changed, err)
				}
			}
		})
	}
}

func TestFull(t *testing.T) {
	tab := NewTable("n000")
	id := func(i int) string { return fmt.Sprintf("n%03d", i) }
	for i := range MaxNodes {
		if _, err := tab.Apply(node(id(i), 1, 1)); err != nil {
			t.Fatalf("node %d of %d: %v", i+1, MaxNodes, err)
		}
	}
	version := tab.Version()
	changed, err := tab.Apply(node(id(MaxNodes), 1, 1))
	if !errors.Is(err, ErrFull) || changed {
		t.Fatalf("129th node: Apply = %v, %v; want ErrFull", changed, err)
	}
	for _, want := range []string{`"n128"`, "at most 128 nodes"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %s", err, want)
		}
	}
	if _, ok := tab.Get(id(MaxNodes)); ok || tab.Len() != MaxNodes || tab.Version() != version || len(tab.Lookup("g")) != MaxNodes {
		t.Fatal("a refused node changed the table")
	}
	// A full table still takes news from the nodes it holds.
	if changed, err := tab.Apply(node(id(5), 1, 2, GroupInfo{Group: "h"})); !changed || err != nil {
		t.Fatalf("update while full: %v, %v", changed, err)
	}
	tab.Remove(id(7))
	if _, err := tab.Apply(node(id(MaxNodes), 1, 1)); err != nil {
		t.Fatalf("129th node after a Remove: %v", err)
	}
	if tab.Len() != MaxNodes {
		t.Fatalf("Len = %d, want %d", tab.Len(), MaxNodes)
	}
}

func TestApplyInvalid(t *testing.T) {
	long := strings.Repeat("x", 256)
	longest := strings.Repeat("x", 255)
	many := make([]GroupInfo, maxGroups+1)
	for i := range many {
		many[i].Group = fmt.Sprintf("g%05d", i)
	}
	cases := []struct {
		name string
		info NodeInfo
		want string // in the error; "" for no error
	}{
		{"empty node id", NodeInfo{Addr: "h:1"}, "empty node id"},
		{"node id too long", NodeInfo{Node: long}, "256 bytes"},
		{"address too long", NodeInfo{Node: "a", Addr: long}, "address is 256 bytes"},
		{"empty group name", node("a", 1, 1, GroupInfo{Group: ""}), "empty name"},
		{"group name too long", node("a", 1, 1, GroupInfo{Group: long}), "256 bytes"},
		{"unsorted", node("a", 1, 1, GroupInfo{Group: "b"}, GroupInfo{Group: "a"}), `"a" after "b"`},
		{"duplicate", node("a", 1, 1, GroupInfo{Group: "b"}, GroupInfo{Group: "b"}), `"b" after "b"`},
		{"level 3", node("a", 1, 1, GroupInfo{Group: "b", Level: 3}), "Level(3) is no load level"},
		{"too many groups", node("a", 1, 1, many...), "4097 service groups"},
		{"longest names fit", NodeInfo{Node: longest, Addr: longest, Groups: []GroupInfo{{Group: longest}}}, ""},
		{"4096 groups fit", node("a", 1, 1, many[:maxGroups]...), ""},
		{"no groups, no address", NodeInfo{Node: "a"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tab := NewTable("a")
			changed, err := tab.Apply(tc.info)
			if tc.want == "" {
				if err != nil || !changed {
					t.Fatalf("Apply = %v, %v; want true, nil", changed, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "names: ") {
				t.Fatalf("Apply error %v, want one saying %q", err, tc.want)
			}
			if changed || tab.Len() != 0 || tab.Version() != 0 {
				t.Fatal("a refused info changed the table")
			}
		})
	}
}

func TestTableCopies(t *testing.T) {
	tab := NewTable("a")
	in := node("b", 1, 1, GroupInfo{Group: "g"}, GroupInfo{Group: "h"})
	if _, err := tab.Apply(in); err != nil {
		t.Fatal(err)
	}
	in.Groups[0].Level = loadlevel.Level2
	got, _ := tab.Get("b")
	got.Groups[1].Held = true
	all := tab.Nodes()
	all[0].Groups[0].Socket = true
	again, _ := tab.Get("b")
	want := node("b", 1, 1, GroupInfo{Group: "g"}, GroupInfo{Group: "h"})
	if !reflect.DeepEqual(again, want) {
		t.Fatalf("the table shares Groups with its callers: %+v", again)
	}
}

func TestNodes(t *testing.T) {
	tab := NewTable("b")
	for _, n := range []string{"c", "a", "b"} {
		if _, err := tab.Apply(node(n, 1, 1)); err != nil {
			t.Fatal(err)
		}
	}
	var ids []string
	for _, n := range tab.Nodes() {
		ids = append(ids, n.Node)
	}
	if strings.Join(ids, ",") != "a,b,c" || tab.Len() != 3 {
		t.Fatalf("Nodes = %v, Len %d; want a,b,c and 3", ids, tab.Len())
	}
	if got := NewTable("x").Nodes(); len(got) != 0 {
		t.Fatalf("empty table: Nodes = %v", got)
	}
}

// TestConcurrent is for -race: writers apply and remove while readers look up.
func TestConcurrent(t *testing.T) {
	tab := NewTable("n0")
	groups := []GroupInfo{{Group: "a"}, {Group: "b"}, {Group: "c"}}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 500 {
				id := fmt.Sprintf("n%d", (w*7+i)%20)
				g := groups[:1+i%3]
				g = append([]GroupInfo(nil), g...)
				g[0].Level = loadlevel.Level(i % 3)
				if _, err := tab.Apply(node(id, 1, uint64(i+1), g...)); err != nil {
					t.Error(err)
					return
				}
				if i%50 == 0 {
					tab.Remove(id)
				}
			}
		})
	}
	for range 4 {
		wg.Go(func() {
			for range 2000 {
				for _, g := range []string{"a", "b", "c"} {
					list := tab.Lookup(g)
					for i := 1; i < len(list); i++ {
						if list[i-1].Node >= list[i].Node {
							t.Errorf("Lookup(%s) not sorted: %+v", g, list)
							return
						}
					}
				}
				tab.Get("n3")
				tab.Len()
				tab.Version()
			}
			tab.Nodes()
		})
	}
	wg.Wait()
}

func BenchmarkLookup(b *testing.B) {
	tab := NewTable("n000")
	for i := range MaxNodes {
		groups := make([]GroupInfo, 20)
		for j := range groups {
			groups[j] = GroupInfo{Group: fmt.Sprintf("group%02d", j), Level: loadlevel.Level(i % 3)}
		}
		if _, err := tab.Apply(node(fmt.Sprintf("n%03d", i), 1, 1, groups...)); err != nil {
			b.Fatal(err)
		}
	}
	if n := len(tab.Lookup("group07")); n != MaxNodes {
		b.Fatalf("%d entries, want %d", n, MaxNodes)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tab.Lookup("group07")
		}
	})
}

// BenchmarkApplyLevelChange is one node's level change in a table of 128
// nodes with 20 groups each, all of them run everywhere.
func BenchmarkApplyLevelChange(b *testing.B) {
	tab := NewTable("n000")
	groups := make([]GroupInfo, 20)
	for j := range groups {
		groups[j] = GroupInfo{Group: fmt.Sprintf("group%02d", j)}
	}
	for i := range MaxNodes {
		if _, err := tab.Apply(node(fmt.Sprintf("n%03d", i), 1, 1, groups...)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	seq := uint64(1)
	for b.Loop() {
		seq++
		groups[3].Level = loadlevel.Level(seq % 3)
		if changed, err := tab.Apply(node("n042", 1, seq, groups...)); !changed || err != nil {
			b.Fatal(changed, err)
		}
	}
}

// TestApplyWLM: the routing manager's part is part of what a node
// announces: a change of spare CPU or of an environment's state is a
// change, a performance index reaches Lookup, and a node without a service
// policy cannot send an index.
func TestApplyWLM(t *testing.T) {
	tb := NewTable("self")
	w := func(spare uint32, envs ...EnvInfo) *WLMInfo {
		return &WLMInfo{Spare: [Importances]uint32{spare, spare, spare, spare, spare}, Envs: envs}
	}
	a := node("a", 1, 1, GroupInfo{Group: "g", PI: 120})
	a.WLM = w(1000, EnvInfo{Env: "e", Epoch: 1, HWM: 1})
	if changed, err := tb.Apply(a); !changed || err != nil {
		t.Fatalf("Apply = %v, %v", changed, err)
	}
	if e := tb.Lookup("g"); len(e) != 1 || e[0].PI != 120 {
		t.Errorf("Lookup = %+v, want PI 120", e)
	}
	steps := []struct {
		name    string
		wlm     *WLMInfo
		changed bool
	}{
		{"same again", w(1000, EnvInfo{Env: "e", Epoch: 1, HWM: 1}), false},
		{"spare CPU", w(500, EnvInfo{Env: "e", Epoch: 1, HWM: 1}), true},
		{"high-water mark", w(500, EnvInfo{Env: "e", Epoch: 1, HWM: 2}), true},
		{"quiesced", w(500, EnvInfo{Env: "e", Epoch: 2, Quiesced: true}), true},
		{"the policy gone", nil, true},
	}
	for i, st := range steps {
		next := node("a", 1, uint64(i+2), GroupInfo{Group: "g", PI: 120})
		if st.wlm == nil {
			next.Groups[0].PI = 0
		}
		next.WLM = st.wlm
		changed, err := tb.Apply(next)
		if err != nil || changed != st.changed {
			t.Errorf("%s: Apply = %v, %v; want changed %v", st.name, changed, err, st.changed)
		}
	}
	// The table keeps its own copy.
	b := node("b", 1, 1)
	b.WLM = w(7, EnvInfo{Env: "e"})
	_, _ = tb.Apply(b)
	b.WLM.Envs[0].Env = "changed"
	if got, _ := tb.Get("b"); got.WLM.Envs[0].Env != "e" {
		t.Error("Apply kept the caller's environments")
	}
	bad := node("c", 1, 1, GroupInfo{Group: "g", PI: 100})
	if _, err := tb.Apply(bad); err == nil || !strings.Contains(err.Error(), "without a service policy") {
		t.Errorf("a PI without a policy: %v", err)
	}
}
