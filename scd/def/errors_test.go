package def

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// TestParseGoesOnAfterAnError: a statement in error is left out, the
// statements after it are read, and every error is reported (issue 23,
// item 5).
func TestParseGoesOnAfterAnError(t *testing.T) {
	src := "set a = 1\nset b = \"open\nset c = 3\nset d = x y\nset e = 5\nset a = 6\n"
	got, err := Parse("x", []byte(src))
	want := []Stmt{{1, StmtSet, "a", []string{"1"}, nil}, {3, StmtSet, "c", []string{"3"}, nil}, {5, StmtSet, "e", []string{"5"}, nil}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("statements %#v\nwant %#v", got, want)
	}
	wantErr := "x:2: syntax: unterminated string (a closing \" is missing)\n" +
		"x:4: d: unexpected \"y\" after value \"x\" (quote values that hold blanks)\n" +
		"x:6: a: set twice (first at line 1)"
	if err == nil || err.Error() != wantErr {
		t.Fatalf("error:\n%v\nwant:\n%s", err, wantErr)
	}
	if n := len(List(err)); n != 3 {
		t.Errorf("List: %d errors, want 3", n)
	}
	var e *Error
	if !errors.As(err, &e) || e.Line != 2 {
		t.Errorf("errors.As finds %v, want the first *Error (line 2)", e)
	}
}

// TestCheckReportsEveryError: one load of a directory with errors in
// every kind of file reports each of them, file by file in reading order
// and by line, each as file:line: operand: why with its "did you mean";
// Check also returns what could be read: the server without an error
// (issue 23, item 5: scdd -check stopped at the first).
func TestCheckReportsEveryError(t *testing.T) {
	dir := writeDir(t, map[string]string{
		"sysconf":   "set node_id = n1\nset rpc_prot = 12000\nset watch_time = -1\n",
		"scdsvcdef": "set scdmulti = 2\nset schedule_rate = 10\n",
		"usrrc":     "set balance_count = 2\n",
		"usr/a":     "set service_group = a\nset service = \"a=a\nset module = uap\nset parallel_cont = 2\n",
		"usr/b":     baseUsr + "set queue_size = 0\nset levelup_queue_count = 1\n",
		"usr/good":  "set service_group = good\nset service = echo\nset module = uap\n",
		"usr/twin":  "set service_group = good\nset service = echo\nset module = uap\n",
		"svcpolicy": "set default_class = ONLNE\nclass -n ONLINE -i 1 -t 100\nclassify -g a -c BATCH\n",
	})
	cfg, err := Check(dir)
	want := []string{
		"sysconf:2: rpc_prot: unknown operand (did you mean rpc_port?)",
		"sysconf:3: watch_time: ",
		"scdsvcdef:2: schedule_rate: ",
		"usr/a:2: syntax: unterminated string",
		"usr/a:4: parallel_cont: unknown operand (did you mean parallel_count?)",
		"usr/b:4: queue_size: ",
		"usr/b:5: levelup_queue_count: ",
		"usr/twin:1: service_group: service group \"good\" is served by usr/good already",
		"svcpolicy:1: default_class: class \"ONLNE\" is not defined in this file (did you mean ONLINE?)",
		"svcpolicy:3: classify: -c: class \"BATCH\" is not defined in this file",
	}
	got := List(err)
	if len(got) != len(want) {
		t.Fatalf("%d errors, want %d:\n%v", len(got), len(want), err)
	}
	for i, e := range got {
		if !strings.HasPrefix(e.Error(), want[i]) {
			t.Errorf("error %d: %q, want it to start %q", i, e, want[i])
		}
		var de *Error
		if !errors.As(e, &de) {
			t.Errorf("error %d %q is not a *Error", i, e)
		}
	}
	if cfg == nil || len(cfg.Servers) != 1 || cfg.Servers[0].Name != "good" {
		t.Errorf("Check's config: %+v, want the one server without an error (good)", cfg)
	}
	if c, err := Load(dir); c != nil || err == nil || err.Error() != Errors(got).Error() {
		t.Errorf("Load: %v, %v; want no config and the same errors", c, err)
	}
}

// TestLoadSysconfReadsOnlySysconf: scdctl's reading of a definition
// directory: a broken usr file, scdsvcdef or svcpolicy does not keep it
// from the node's addresses; a broken sysconf does (issue 23, item 2).
func TestLoadSysconfReadsOnlySysconf(t *testing.T) {
	dir := writeDir(t, map[string]string{
		"sysconf":   "set node_id = n1\nset rpc_port = 12345\nset metrics_address = \"127.0.0.1:12346\"\nset control_socket = ctl.sock\n",
		"scdsvcdef": "set nonsense = 1\n",
		"usr/x":     "set parallel_cont = 2\n",
		"svcpolicy": "class -n A\n",
	})
	if _, err := Load(dir); err == nil {
		t.Fatal("Load of the broken directory: no error")
	}
	cfg, err := LoadSysconf(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s := cfg.System; s.NodeID != "n1" || s.RPCPort != 12345 || s.MetricsAddress != "127.0.0.1:12346" || s.ControlSocket != "ctl.sock" || cfg.Dir != dir {
		t.Errorf("LoadSysconf: %+v (dir %q)", s, cfg.Dir)
	}
	bad := writeDir(t, map[string]string{"sysconf": "set rpc_prot = 1\n"})
	if _, err := LoadSysconf(bad); err == nil || err.Error() != "sysconf:1: rpc_prot: unknown operand (did you mean rpc_port?)" {
		t.Errorf("LoadSysconf of a broken sysconf: %v", err)
	}
	if _, err := LoadSysconf(t.TempDir() + "/none"); err == nil {
		t.Error("LoadSysconf of a missing directory: no error")
	}
}
