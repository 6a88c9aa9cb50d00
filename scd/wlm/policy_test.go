package wlm

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func pct(p, target int) Goal { return Goal{Kind: GoalPercentile, Percent: p, Target: ms(target)} }
func avg(target int) Goal    { return Goal{Kind: GoalAverage, Target: ms(target)} }

var testClasses = []Class{
	{Name: "ONLINE", Importance: 1, Goal: pct(90, 200)},
	{Name: "QUERY", Importance: 2, Goal: avg(150)},
	{Name: "BATCH", Importance: 3, Goal: avg(5000)},
}

func testPolicy(t *testing.T) *Policy {
	t.Helper()
	p, err := NewPolicy(testClasses, "BATCH", []Rule{
		{Group: "orders", Service: "add", Class: "ONLINE"},
		{Group: "orders", Service: "list*", Class: "QUERY"},
		{Group: "orders", Class: "ONLINE"},
		{Group: "report?", Service: "", Class: "QUERY"},
		{Group: "[xy]*", Service: "*", Class: "ONLINE"},
	}, []string{"orders", "reports"}, nil, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestClassify(t *testing.T) {
	p := testPolicy(t)
	cases := []struct {
		group, service, want string
	}{
		{"orders", "add", "ONLINE"},      // the first rule
		{"orders", "list", "QUERY"},      // a wildcard service, before the group-wide rule
		{"orders", "listall", "QUERY"},   // '*' matches several characters
		{"orders", "delete", "ONLINE"},   // the group-wide rule (service "")
		{"reports", "x", "QUERY"},        // '?' matches one character
		{"reportss", "x", "BATCH"},       // ...and only one: the default class
		{"xray", "scan", "ONLINE"},       // a character class
		{"zebra", "scan", "BATCH"},       // nothing matches: the default
		{"", "", "BATCH"},                // nothing at all: the default
		{"Orders", "add", "BATCH"},       // names are case-sensitive
		{"orders/x", "add", "BATCH"},     // '*' in a group does not cross '/', and "orders" is no prefix
		{"report1", "anything", "QUERY"}, // '?' matches a digit
	}
	for _, tc := range cases {
		got := p.Classes[p.Classify(tc.group, tc.service)].Name
		if got != tc.want {
			t.Errorf("Classify(%q, %q) = %s, want %s", tc.group, tc.service, got, tc.want)
		}
	}
	if !p.IsEnvironment("orders") || p.IsEnvironment("order") {
		t.Error("IsEnvironment: orders is one, order is not")
	}
	if i, ok := p.ClassIndex("QUERY"); !ok || i != 1 {
		t.Errorf("ClassIndex(QUERY) = %d, %v", i, ok)
	}
}

func TestImportance(t *testing.T) {
	p := testPolicy(t)
	cases := []struct {
		group    string
		services []string
		want     int
	}{
		{"orders", []string{"list"}, 2},         // QUERY only
		{"orders", []string{"list", "add"}, 1},  // the most important of its services' classes
		{"batchy", []string{"run"}, 3},          // the default class
		{"batchy", nil, 3},                      // no services: the default class
		{"reports", []string{"a", "b", "c"}, 2}, // QUERY
	}
	for _, tc := range cases {
		if got := p.Importance(tc.group, tc.services); got != tc.want {
			t.Errorf("Importance(%s, %v) = %d, want %d", tc.group, tc.services, got, tc.want)
		}
	}
}

func TestNewPolicyRefuses(t *testing.T) {
	ok := []Class{{Name: "A", Importance: 1, Goal: avg(10)}}
	cases := []struct {
		name     string
		classes  []Class
		def      string
		rules    []Rule
		envs     []string
		interval time.Duration
		want     string
	}{
		{"no class", nil, "A", nil, nil, time.Second, "no service class"},
		{"no interval", ok, "A", nil, nil, 0, "interval"},
		{"unnamed class", []Class{{Importance: 1, Goal: avg(1)}}, "", nil, nil, time.Second, "has no name"},
		{"class twice", []Class{ok[0], ok[0]}, "A", nil, nil, time.Second, "defined twice"},
		{"importance 0", []Class{{Name: "A", Importance: 0, Goal: avg(1)}}, "A", nil, nil, time.Second, "importance 0"},
		{"importance 6", []Class{{Name: "A", Importance: 6, Goal: avg(1)}}, "A", nil, nil, time.Second, "importance 6"},
		{"no target", []Class{{Name: "A", Importance: 1, Goal: Goal{Kind: GoalAverage}}}, "A", nil, nil, time.Second, "response time"},
		{"percentile 100", []Class{{Name: "A", Importance: 1, Goal: Goal{Kind: GoalPercentile, Percent: 100, Target: 1}}}, "A", nil, nil, time.Second, "percentile 100"},
		{"percentile 0", []Class{{Name: "A", Importance: 1, Goal: Goal{Kind: GoalPercentile, Target: 1}}}, "A", nil, nil, time.Second, "percentile 0"},
		{"no goal kind", []Class{{Name: "A", Importance: 1, Goal: Goal{Target: 1}}}, "A", nil, nil, time.Second, "goal kind"},
		{"unknown default", ok, "B", nil, nil, time.Second, `default class "B"`},
		{"rule to unknown class", ok, "A", []Rule{{Group: "g", Class: "B"}}, nil, time.Second, `rule 1: class "B"`},
		{"bad pattern", ok, "A", []Rule{{Group: "[", Class: "A"}}, nil, time.Second, `pattern "["`},
		{"unnamed environment", ok, "A", nil, []string{""}, time.Second, `application environment ""`},
		{"environment twice", ok, "A", nil, []string{"e", "e"}, time.Second, "named twice"},
	}
	for _, tc := range cases {
		_, err := NewPolicy(tc.classes, tc.def, tc.rules, tc.envs, nil, tc.interval)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want one with %q", tc.name, err, tc.want)
		}
	}
}

// TestInstances: with subsystem instances every application environment
// is served per instance, as the group ENV@INSTANCE; the environment's
// own name is then no group started on demand. Rules for the environment
// classify its instances' calls; a rule may name one instance.
func TestInstances(t *testing.T) {
	p, err := NewPolicy(testClasses, "BATCH", []Rule{
		{Group: "orders@west", Class: "QUERY"},
		{Group: "orders", Class: "ONLINE"},
	}, []string{"orders", "reports"}, []string{"east", "west"}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"orders@east", "orders@west", "reports@east", "reports@west"}
	if !slices.Equal(p.Environments, want) || !slices.Equal(p.Instances, []string{"east", "west"}) {
		t.Errorf("environments %v, instances %v; want %v, [east west]", p.Environments, p.Instances, want)
	}
	for _, g := range want {
		if !p.IsEnvironment(g) {
			t.Errorf("%s is not an environment", g)
		}
	}
	if p.IsEnvironment("orders") || p.IsEnvironment("orders@north") {
		t.Error("orders itself, or an instance the policy does not name, is an environment")
	}
	if got := p.InstanceGroups("orders"); !slices.Equal(got, want[:2]) {
		t.Errorf("InstanceGroups(orders) = %v", got)
	}
	if p.InstanceGroups("orders@east") != nil || p.InstanceGroups("front") != nil {
		t.Error("InstanceGroups of a group that is no environment as named")
	}
	for _, tc := range []struct{ group, want string }{
		{"orders@east", "ONLINE"}, {"orders@west", "QUERY"}, {"orders", "ONLINE"}, {"reports@east", "BATCH"},
	} {
		if got := p.Classes[p.Classify(tc.group, "x")].Name; got != tc.want {
			t.Errorf("Classify(%s) = %s, want %s", tc.group, got, tc.want)
		}
	}
	if env, in := SplitInstance("orders@east"); env != "orders" || in != "east" || InstanceGroup(env, in) != "orders@east" {
		t.Errorf("SplitInstance(orders@east) = %q, %q", env, in)
	}
	if env, in := SplitInstance("orders"); env != "orders" || in != "" || InstanceGroup("orders", "") != "orders" {
		t.Errorf("SplitInstance(orders) = %q, %q", env, in)
	}
	for _, tc := range []struct {
		envs, instances []string
		want            string
	}{
		{[]string{"e"}, []string{"a", "a"}, "instance a named twice"},
		{[]string{"e"}, []string{"a@b"}, "instance"},
		{[]string{"e"}, []string{""}, "instance"},
		{[]string{"e@a"}, nil, "application environment"},
	} {
		if _, err := NewPolicy(testClasses, "BATCH", nil, tc.envs, tc.instances, time.Second); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("envs %v instances %v: %v, want %q", tc.envs, tc.instances, err, tc.want)
		}
	}
}

func TestGoalString(t *testing.T) {
	if got := pct(90, 200).String(); got != "90% within 200ms" {
		t.Error(got)
	}
	if got := avg(1500).String(); got != "average 1.5s" {
		t.Error(got)
	}
}
