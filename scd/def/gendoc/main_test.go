package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tpsched/scd/def"
)

// TestReferenceInSync fails when docs/OPERANDS.md is not what the operand
// tables generate: change the tables, then run `go generate ./scd/def`.
func TestReferenceInSync(t *testing.T) {
	path := filepath.Join("..", "..", "..", "docs", "OPERANDS.md")
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := render(def.Operands())
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := range max(len(gl), len(wl)) {
			var g, w string
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				t.Fatalf("%s differs from the operand tables at line %d (run go generate ./scd/def):\n file:  %q\n table: %q", path, i+1, g, w)
			}
		}
	}
}

// TestReferenceNamesEveryOperand: each operand has its section and its row.
func TestReferenceNamesEveryOperand(t *testing.T) {
	text := string(render(def.Operands()))
	for _, d := range def.Operands() {
		key := map[string]string{def.FileSysconf: "sysconf", def.FileScdsvcdef: "scdsvcdef", def.FileUsr: "usr", def.FileBetranrc: "betranrc", def.FilePolicy: "svcpolicy"}[d.File]
		if key == "" {
			t.Fatalf("%s: file %q has no section", d.Name, d.File)
		}
		if d.Refused != "" {
			if !strings.Contains(text, "\n### refused: "+d.Name+"\n") {
				t.Errorf("refused %s: no section", d.Name)
			}
			continue
		}
		if !strings.Contains(text, "\n### "+key+": "+title(d)+"\n") || !strings.Contains(text, "| ["+title(d)+"](#"+anchor(key, d)+") |") {
			t.Errorf("%s %s: no section or no row", d.File, d.Name)
		}
	}
}
