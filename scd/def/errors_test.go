package def

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
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

// TestLongValuesAreShortInErrors: an error about a value of 200 KB is a
// line of a few hundred bytes that starts the value and gives its length
// (it repeated the value whole). Every operand and every command option of
// every kind of file gets such values, of a few shapes, and so do the
// statements Parse refuses.
func TestLongValuesAreShortInErrors(t *testing.T) {
	cutShort := regexp.MustCompile(`…( \(\d+ bytes\))`)
	const size = 200000
	x, nine := strings.Repeat("x", size), strings.Repeat("9", size)
	longs := []string{x, nine, "x:" + nine, "[" + x, "[::1]" + x, x + ":1", "a:b:" + x, "é" + x[2:], x + "/", "-" + x}
	const policyBase = "set default_class = A\nclass -n A -i 1 -t 100\n"
	check := func(t *testing.T, what string, err error) {
		t.Helper()
		if err == nil {
			return // the value is taken (a path, say): nothing repeats it
		}
		for _, line := range strings.Split(err.Error(), "\n") {
			if len(line) > 400 {
				t.Errorf("%s: an error line of %d bytes: %.200s...", what, len(line), line)
			} else if strings.Count(line, "…") != len(cutShort.FindAllString(line, -1)) {
				t.Errorf("%s: a value cut short without its length: %s", what, line)
			}
		}
	}
	load := func(file, text string) error {
		files := map[string]string{"usr/x": baseUsr}
		if file == "usr/x" {
			text += baseUsr
		}
		if file == FilePolicy {
			text = policyBase + text
		}
		files[file] = text
		dir := writeDir(t, files)
		_, err := Check(dir)
		return err
	}
	sets := map[string][]string{}
	for op := range systemOperands {
		sets["sysconf"] = append(sets["sysconf"], op)
	}
	for op := range schedOperands {
		sets["scdsvcdef"] = append(sets["scdsvcdef"], op)
	}
	for op := range serverOperands {
		sets["usr/x"] = append(sets["usr/x"], op)
	}
	for op := range policyOperands {
		sets[FilePolicy] = append(sets[FilePolicy], op)
	}
	for file, ops := range sets {
		for _, op := range ops {
			for _, v := range longs {
				check(t, file+" "+op, load(file, "set "+op+" = \""+v+"\"\n"))
			}
		}
	}
	cmds := map[string]map[string]string{ // file: command: its options' letters
		"scdsvcdef": {}, "usr/x": {}, FilePolicy: {},
	}
	for name, c := range schedCommands {
		cmds["scdsvcdef"][name] = c.options()
	}
	for name, c := range serverCommands {
		cmds["usr/x"][name] = c.options()
	}
	for name, c := range policyCommands {
		cmds[FilePolicy][name] = c.options()
	}
	for file, byName := range cmds {
		for name, letters := range byName {
			for i := range letters {
				for _, v := range longs {
					stmt := name
					for j := range letters {
						val := "1"
						if i == j {
							val = "\"" + v + "\""
						}
						stmt += " -" + letters[j:j+1] + " " + val
					}
					check(t, file+" "+name+" -"+letters[i:i+1], load(file, stmt+"\n"))
				}
			}
		}
	}
	for _, op := range []string{"dchost", "dcscddirect", "dccache", "dcwatchtim", "watch_time"} {
		for _, v := range longs {
			clearClientEnv(t)
			_, err := LoadClient(writeFile(t, "set "+op+" = \""+v+"\"\n"))
			check(t, "betranrc "+op, err)
			t.Setenv(strings.ToUpper(op), v)
			_, err = LoadClient("")
			check(t, "environment "+op, err)
		}
	}
	for _, src := range []string{
		x + " = 1", "set " + x + " = 1", "set a " + x, "set a = b " + x, "set a = " + x + " b",
		"putenv " + x + " 1", "putenv A b " + x, "cmd -g 1 " + x, "set a = " + x + `"b"`, "=" + x,
	} {
		_, err := Parse("f", []byte(src+"\n"))
		check(t, "parse "+src[:12], err)
	}
}

// TestShown: a value of up to maxShown runes is shown whole, a longer one
// cut after maxShown runes (not bytes, and not inside a rune) with its
// length in bytes.
func TestShown(t *testing.T) {
	a64, e64 := strings.Repeat("a", 64), strings.Repeat("é", 64)
	for _, c := range []struct{ in, q, s string }{
		{"", `""`, ""},
		{"yes", `"yes"`, "yes"},
		{a64, `"` + a64 + `"`, a64},
		{a64 + "b", `"` + a64 + `"… (65 bytes)`, a64 + "… (65 bytes)"},
		{e64, `"` + e64 + `"`, e64},
		{e64 + "é", `"` + e64 + `"… (130 bytes)`, e64 + "… (130 bytes)"},
		{strings.Repeat("\xff", 100), `"` + strings.Repeat(`\xff`, 64) + `"… (100 bytes)`, strings.Repeat("\xff", 64) + "… (100 bytes)"},
	} {
		if got := fmt.Sprintf("%q", shown(c.in)); got != c.q {
			t.Errorf("%%q of %d bytes: %s, want %s", len(c.in), got, c.q)
		}
		if got := fmt.Sprintf("%s", shown(c.in)); got != c.s {
			t.Errorf("%%s of %d bytes: %s, want %s", len(c.in), got, c.s)
		}
	}
}
