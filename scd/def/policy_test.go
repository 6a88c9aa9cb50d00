package def

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"
	"time"
)

// policyFS is a definition directory with one user server and svcpolicy.
func policyFS(policy string) fstest.MapFS {
	return fstest.MapFS{
		"usr/orders": {Data: []byte("set service_group = orders\nset service = add\nset module = /bin/true\n")},
		"svcpolicy":  {Data: []byte(policy)},
	}
}

func TestPolicyLoads(t *testing.T) {
	cfg, err := LoadFS(policyFS(`# the worked example of the README
set policy_interval = 2
set default_class = BATCH
class -n ONLINE -i 1 -t 200 -p 90
class -n BATCH -i 3 -t 5000
classify -g orders -s add* -c ONLINE
classify -g "report*" -c BATCH
classify -s "*" -c BATCH
environment -g orders
environment -g reports
`))
	if err != nil {
		t.Fatal(err)
	}
	want := &Policy{
		File: "svcpolicy", Interval: 2 * time.Second, DefaultClass: "BATCH",
		Classes: []ServiceClass{
			{Name: "ONLINE", Importance: 1, ResponseTime: 200 * time.Millisecond, Percent: 90},
			{Name: "BATCH", Importance: 3, ResponseTime: 5 * time.Second},
		},
		Rules:        []ClassRule{{Group: "orders", Service: "add*", Class: "ONLINE"}, {Group: "report*", Class: "BATCH"}, {Service: "*", Class: "BATCH"}},
		Environments: []string{"orders", "reports"}, Manage: true,
	}
	if !reflect.DeepEqual(cfg.Policy, want) {
		t.Errorf("policy\n got %+v\nwant %+v", cfg.Policy, want)
	}
	inst, err := LoadFS(policyFS("set default_class = A\nclass -n A -i 1 -t 100\nenvironment -g orders\ninstance -n east\ninstance -n west\n"))
	if err != nil || !reflect.DeepEqual(inst.Policy.Instances, []string{"east", "west"}) {
		t.Errorf("instances: %+v, %v; want east, west", inst.Policy, err)
	}
	off, err := LoadFS(policyFS("set goal_management = N\nset default_class = A\nclass -n A -i 1 -t 100\n"))
	if err != nil || off.Policy.Manage {
		t.Errorf("goal_management = N: %+v, %v; want Manage false", off.Policy, err)
	}
	cfg, err = LoadFS(fstest.MapFS{"usr/orders": policyFS("")["usr/orders"]})
	if err != nil || cfg.Policy != nil {
		t.Errorf("no svcpolicy: %+v, %v; want no policy", cfg.Policy, err)
	}
	if p, err := LoadPolicy(""); p != nil || err != nil {
		t.Errorf("LoadPolicy of the embedded default: %v, %v", p, err)
	}
}

func TestPolicyErrors(t *testing.T) {
	const base = "set default_class = A\nclass -n A -i 1 -t 100\n"
	cases := []struct{ name, src, want string }{
		{"empty file", "", "svcpolicy:1: class: at least one service class is required"},
		{"no default", "class -n A -i 1 -t 100\n", "svcpolicy:1: default_class: required"},
		{"unknown default", "set default_class = B\nclass -n A -i 1 -t 100\n", `svcpolicy:1: default_class: class "B" is not defined in this file`},
		{"misspelt default", "set default_class = ONLNE\nclass -n ONLINE -i 1 -t 100\n", "(did you mean ONLINE?)"},
		{"importance 0", base + "class -n B -i 0 -t 100\n", "svcpolicy:3: class: -i: 0 out of range 1..5"},
		{"importance 6", base + "class -n B -i 6 -t 100\n", "svcpolicy:3: class: -i: 6 out of range 1..5"},
		{"no importance", base + "class -n B -t 100\n", "svcpolicy:3: class: -i IMPORTANCE is required"},
		{"no time", base + "class -n B -i 2\n", "svcpolicy:3: class: -t MILLISECONDS is required"},
		{"time 0", base + "class -n B -i 2 -t 0\n", "svcpolicy:3: class: -t: 0 out of range"},
		{"percent 100", base + "class -n B -i 2 -t 10 -p 100\n", "svcpolicy:3: class: -p: 100 out of range 1..99"},
		{"class twice", base + "class -n A -i 2 -t 10\n", "svcpolicy:3: class: class A defined twice"},
		{"no name", base + "class -i 2 -t 10\n", "svcpolicy:3: class: -n NAME is required"},
		{"bad name", base + "class -n a/b -i 2 -t 10\n", "svcpolicy:3: class: -n: class \"a/b\""},
		{"unknown option", base + "class -n B -i 2 -t 10 -x 1\n", "svcpolicy:3: class: unknown option -x"},
		{"rule to unknown class", base + "classify -g g -c B\n", `svcpolicy:3: classify: -c: class "B" is not defined`},
		{"rule to a class name too long", base + "classify -g g -c " + strings.Repeat("x", 1000) + "\n",
			`svcpolicy:3: classify: -c: class "` + strings.Repeat("x", 64) + `"… (1000 bytes), at most 31`},
		{"rule to a malformed class", base + "classify -g g -c a/b\n", `svcpolicy:3: classify: -c: class "a/b": '/' not allowed`},
		{"rule with an empty group", base + "classify -g \"\" -c A\n", `svcpolicy:3: classify: -g: empty pattern (leave -g out to match every one, or write "*")`},
		{"rule with an empty service", base + "classify -g g -s \"\" -c A\n", `svcpolicy:3: classify: -s: empty pattern`},
		{"rule without class", base + "classify -g g\n", "svcpolicy:3: classify: -c CLASS is required"},
		{"bad pattern", base + "classify -g \"[\" -c A\n", `svcpolicy:3: classify: -g: "[" is not a pattern`},
		{"environment twice", base + "environment -g e\nenvironment -g e\n", "svcpolicy:4: environment: environment e named twice"},
		{"environment without group", base + "environment\n", "svcpolicy:3: environment: -g GROUP is required"},
		{"interval 0", base + "set policy_interval = 0\n", "svcpolicy:3: policy_interval: 0 out of range 1..3600"},
		{"unknown operand", base + "set policy_intervall = 3\n", "svcpolicy:3: policy_intervall: unknown operand"},
		{"misspelt command", base + "clasify -g g -c A\n", "svcpolicy:3: clasify: unknown command (did you mean classify?)"},
		{"putenv", base + "putenv A b\n", "svcpolicy:3: putenv: only allowed in usrrc and usr files"},
		{"goal_management not Y or N", base + "set goal_management = off\n", "svcpolicy:3: goal_management:"},
		{"instance without name", base + "environment -g e\ninstance\n", "svcpolicy:4: instance: -n NAME is required"},
		{"instance twice", base + "environment -g e\ninstance -n a\ninstance -n a\n", "svcpolicy:5: instance: instance a named twice"},
		{"instance with @", base + "environment -g e\ninstance -n a@b\n", `svcpolicy:4: instance: -n: instance "a@b": '@' not allowed`},
		{"instance name too long", base + "environment -g e\ninstance -n " + strings.Repeat("x", 32) + "\n", "svcpolicy:4: instance: -n: instance"},
		{"instance option", base + "environment -g e\ninstance -n a -g e\n", "svcpolicy:4: instance: unknown option -g (it takes -n)"},
		{"instances without environment", base + "instance -n a\n\ninstance -n b\n", "svcpolicy:5: instance: no application environment for the instances to serve"},
	}
	for _, tc := range cases {
		_, err := LoadFS(policyFS(tc.src))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.name, err, tc.want)
		}
	}
	// A class name refused for its form is not also looked up among the
	// classes (a did-you-mean over a name of any length).
	if _, err := LoadFS(policyFS(base + "classify -c a/b\n")); len(List(err)) != 1 {
		t.Errorf("classify -c a/b: want one error, got %v", err)
	}
}

// TestLoadPolicyDir reads svcpolicy from a directory as `scdctl policy`
// does: none is no policy, a bad one is an error with its line, and the
// rest of the directory is not read.
func TestLoadPolicyDir(t *testing.T) {
	dir := t.TempDir()
	if p, err := LoadPolicy(dir); p != nil || err != nil {
		t.Fatalf("no svcpolicy: %v, %v; want nil, nil", p, err)
	}
	write := func(src string) {
		if err := os.WriteFile(filepath.Join(dir, FilePolicy), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("set default_class = A\nclass -n A -i 2 -t 50 -p 95\nenvironment -g orders\n")
	p, err := LoadPolicy(dir)
	if err != nil || p == nil || len(p.Classes) != 1 || p.Classes[0].Percent != 95 || p.Environments[0] != "orders" {
		t.Fatalf("LoadPolicy = %+v, %v", p, err)
	}
	write("set default_class = A\nclass -n A -i 2 -t 50\n\nclassify -s x -c Z\n")
	if _, err := LoadPolicy(dir); err == nil || !strings.Contains(err.Error(), "svcpolicy:4: classify") {
		t.Errorf("bad rule: %v, want svcpolicy:4", err)
	}
}
