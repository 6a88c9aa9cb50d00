package wlmnode

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/netio"
	"tpsched/scd/call"
	"tpsched/scd/def"
	"tpsched/scd/names"
)

const instancesPolicy = ordersPolicy + "instance -n east\ninstance -n west\n"

func TestExpandInstances(t *testing.T) {
	orders := def.Server{Name: "orders", ServiceGroup: "orders", Module: "/bin/uap", Resident: 2}
	front := def.Server{Name: "front", ServiceGroup: "front", Module: "/bin/front"}
	zeta := def.Server{Name: "zeta", ServiceGroup: "zeta", Module: "/bin/zeta"}
	servers := []def.Server{front, orders, zeta}
	p := &def.Policy{Environments: []string{"orders"}, Instances: []string{"west", "east"}}
	got := ExpandInstances(servers, p)
	var names []string
	for _, s := range got {
		names = append(names, s.Name+"/"+s.ServiceGroup)
		if strings.HasPrefix(s.Name, "orders@") && (s.Module != "/bin/uap" || s.Resident != 2) {
			t.Errorf("%s is not orders' definition: %+v", s.Name, s)
		}
	}
	if want := []string{"front/front", "orders@east/orders@east", "orders@west/orders@west", "zeta/zeta"}; !slices.Equal(names, want) {
		t.Errorf("expanded %v, want %v (sorted by name)", names, want)
	}
	if got := ExpandInstances(servers, &def.Policy{Environments: []string{"orders"}}); !slices.EqualFunc(got, servers, func(a, b def.Server) bool { return a.Name == b.Name }) {
		t.Errorf("without instances: %v", got)
	}
	if got := ExpandInstances(servers, nil); len(got) != 3 {
		t.Errorf("without a policy: %v", got)
	}
}

// instancesManager is node n0 alone with svcpolicy policy and the groups
// orders@east and orders@west (ExpandInstances's), none serving.
func instancesManager(t *testing.T, policy string) (*Manager, string, *fakeGroup, *fakeGroup) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "svcpolicy"), []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := def.LoadPolicy(dir)
	if err != nil {
		t.Fatal(err)
	}
	var groups []*fakeGroup
	for _, s := range ExpandInstances([]def.Server{{Name: "orders", ServiceGroup: "orders", Services: []def.Service{{Name: "echo", Entry: "echo"}}, SchedulePriority: 8}}, p) {
		groups = append(groups, &fakeGroup{def: s})
	}
	set := metrics.NewSet()
	w, err := New(Options{
		Self: "n0", Dir: dir, Policy: p, Log: slog.New(slog.DiscardHandler), Metrics: set,
		BadRequests: set.NewCounter("bad"), Local: &fakeLocal{groups: groups}, Peers: fakePeers{},
		Names: names.NewTable("n0"), Alone: true,
		Addr: func() string { return "127.0.0.1:1" }, Announce: func() {}, MeasuresWaits: func() bool { return false },
		ProcStat: filepath.Join(dir, "stat"),
	})
	if err != nil {
		t.Fatal(err)
	}
	w.Start()
	t.Cleanup(w.Close)
	return w, dir, groups[0], groups[1]
}

// TestInstancesServedApart: each instance's group is an environment of its
// own: a call for orders@east starts east's server only; a call for
// orders itself is refused, naming the instances; quiesce of orders acts
// on both, of orders@west on west alone; the report names each instance.
func TestInstancesServedApart(t *testing.T) {
	w, dir, east, west := instancesManager(t, instancesPolicy)
	if east.Name() != "orders@east" || west.Name() != "orders@west" {
		t.Fatalf("groups %s, %s", east.Name(), west.Name())
	}
	for _, g := range []string{"orders@east", "orders@west"} {
		if !w.IsEnvironment(g) || w.EnvironmentState(g) != envDormant {
			t.Errorf("%s: environment %v, state %q; want a dormant environment", g, w.IsEnvironment(g), w.EnvironmentState(g))
		}
	}
	a := &answers{got: map[uint64][]netio.Frame{}}
	if handled, code, _ := w.Route(a, call.From{}, callFrame(1, "orders@east")); !handled || code != netio.CodeOK {
		t.Fatalf("a call for orders@east: %v %v, want parked", handled, code)
	}
	if f := a.wait(t, 1); f.Kind != netio.KindReply {
		t.Errorf("orders@east's call: %v %v", f.Kind, f.Code)
	}
	if east.started.Load() != 1 || west.started.Load() != 0 {
		t.Errorf("servers started: east %d, west %d; want east's alone", east.started.Load(), west.started.Load())
	}
	handled, code, msg := w.Route(a, call.From{}, callFrame(2, "orders"))
	if !handled || code != netio.CodeNoSuchGroup || !strings.Contains(msg, "orders@east, orders@west") {
		t.Errorf("a call for orders itself: %v %v %q, want 'no such service group' naming the instances", handled, code, msg)
	}
	var got []string
	for _, e := range w.Report().Environments {
		got = append(got, e.Environment+"/"+e.Instance+"/"+e.Here)
	}
	if want := []string{"orders/east/serving", "orders/west/dormant"}; !slices.Equal(got, want) {
		t.Errorf("report's environments %v, want %v", got, want)
	}
	if keys := w.InstanceGroups("orders"); !slices.Equal(keys, []string{"orders@east", "orders@west"}) {
		t.Errorf("InstanceGroups(orders) = %v", keys)
	}

	res, err := w.Quiesce("orders")
	if err != nil || len(res.Nodes) != 2 || res.Nodes[0].Env != "orders@east" || res.Nodes[1].Env != "orders@west" {
		t.Fatalf("quiesce orders: %+v, %v; want a result per instance", res, err)
	}
	if east.Serving() || east.stopped.Load() != 1 {
		t.Errorf("east after quiesce orders: serving %v, stopped %d", east.Serving(), east.stopped.Load())
	}
	if res, err := w.Resume("orders@west"); err != nil || len(res.Nodes) != 1 || res.Nodes[0].Env != "" {
		t.Errorf("resume orders@west: %+v, %v; want one result", res, err)
	}
	for _, e := range w.Report().Environments {
		if want := e.Instance == "east"; e.Quiesced != want {
			t.Errorf("%s quiesced %v, want %v (only east stays quiesced)", e.Env, e.Quiesced, want)
		}
	}
	if _, err := w.Quiesce("orders@north"); err == nil {
		t.Error("quiesce of an instance the policy does not name succeeded")
	}

	// The instances are fixed at start: a policy read again with others
	// is refused, and the one in force stays.
	if err := os.WriteFile(filepath.Join(dir, "svcpolicy"), []byte(ordersPolicy+"instance -n east\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, _ = w.ReloadPolicy()
	if len(res.Nodes) != 1 || !strings.Contains(res.Nodes[0].Error, "restart it to change them") {
		t.Errorf("policy with other instances: %+v, want refused", res)
	}
	if !w.IsEnvironment("orders@west") {
		t.Error("the refused policy was put in force")
	}
}
