package def

import (
	"reflect"
	"testing"
)

// checkDefaults: for every operand whose default can be written, setting
// it to that value changes nothing in the defaults, so the reference
// cannot claim a default the code does not have. Every operand says what
// it takes and what it means.
func checkDefaults[T any](t *testing.T, file string, table map[string]operand[T], defaults T) {
	t.Helper()
	for name, op := range table {
		if (op.value == "") == (op.dflt == "") {
			t.Errorf("%s %s: want exactly one of value (%q) and dflt (%q)", file, name, op.value, op.dflt)
		}
		if op.values == "" || (op.opentp1 == "" && op.tpsched == "") {
			t.Errorf("%s %s: values, and the OpenTP1 or tpsched meaning, must be written", file, name)
		}
		if op.value == "" {
			continue
		}
		stmts, err := Parse(file, []byte("set "+name+" = "+op.value))
		if err != nil {
			t.Errorf("%s %s: default %q does not parse: %v", file, name, op.value, err)
			continue
		}
		got := defaults
		if err := op.set(&got, stmts[0].Values); err != nil {
			t.Errorf("%s %s: default %q refused: %v", file, name, op.value, err)
			continue
		}
		if !reflect.DeepEqual(got, defaults) {
			t.Errorf("%s %s: the documented default %q is not the default:\n set %+v\n default %+v", file, name, op.value, got, defaults)
		}
	}
}

func TestDocumentedDefaults(t *testing.T) {
	checkDefaults(t, "sysconf", systemOperands, defaultSystem("host"))
	checkDefaults(t, "scdsvcdef", schedOperands, defaultSched())
	checkDefaults(t, "usr/x", serverOperands, defaultServer())
	checkDefaults(t, "betranrc", clientOperands, defaultClient())
	checkDefaults(t, "svcpolicy", policyOperands, defaultPolicy())
}

func TestOperandsListsEveryOperand(t *testing.T) {
	docs := Operands()
	n := len(systemOperands) + len(schedOperands) + len(serverOperands) + len(clientOperands) + len(refusedOperands) +
		len(schedCommands) + len(serverCommands) + len(policyOperands) + len(policyCommands)
	if len(docs) != n {
		t.Fatalf("%d operands listed, want %d", len(docs), n)
	}
	seen := map[string]bool{}
	for _, d := range docs {
		key := d.File + " " + d.Name + " " + d.Command
		if seen[key] {
			t.Errorf("%s %s listed twice", d.File, d.Name)
		}
		seen[key] = true
	}
	var w, ms OperandDoc
	for _, d := range docs {
		switch d.Name {
		case "dcwatchtim":
			w = d
		case "multi_schedule":
			ms = d
		case "scdmulti":
			if d.Command != "" && d.File == FileScdsvcdef && (d.Values == "" || d.OpenTP1 == "" || d.DefaultNote == "") {
				t.Errorf("the scdmulti command = %+v", d)
			}
		}
	}
	if ms.File != FileUsr || ms.Refused != "" || ms.OpenTP1 == "" || ms.Default != "N" {
		t.Errorf("multi_schedule = %+v", ms)
	}
	if w.File != FileBetranrc || w.Env != "DCWATCHTIM" || !reflect.DeepEqual(w.Aliases, []string{"watch_time"}) || w.Default != "180" {
		t.Errorf("dcwatchtim = %+v", w)
	}
}
