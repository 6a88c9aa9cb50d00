package def

import (
	"bytes"
	"encoding/json"
	"errors"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"testing"
)

// pendingReaders are fields that nothing outside scd/def reads yet because
// the code that acts on them is being written elsewhere. Each names where.
// An entry whose field is read already fails the test, so the list cannot
// go stale.
var pendingReaders = map[string]string{}

// reflectReaders are fields read only through reflection (no selector
// names them), each with the reason. None today.
var reflectReaders = map[string]string{}

// TestEveryFieldIsRead: every field of Config and Client (recursively) is
// read by some package outside scd/def. A field that is parsed and never
// read is an operand that does nothing: it must do what the documents say
// or be refused (see refusedOperands).
func TestEveryFieldIsRead(t *testing.T) {
	if testing.Short() {
		t.Skip("type-checks the whole module (go list -export): not in -short")
	}
	fields := map[string]bool{}
	for _, v := range []any{Config{}, Client{}} {
		collectFields(reflect.TypeOf(v), fields)
	}
	read := readFields(t)
	var unread []string
	for f := range fields {
		_, pending := pendingReaders[f]
		_, byReflect := reflectReaders[f]
		switch {
		case pending && read[f]:
			t.Errorf("%s is read now: remove it from pendingReaders", f)
		case !read[f] && !pending && !byReflect:
			unread = append(unread, f)
		}
	}
	for f := range pendingReaders {
		if !fields[f] {
			t.Errorf("pendingReaders names %s, which is no field", f)
		}
	}
	for f := range reflectReaders {
		if !fields[f] {
			t.Errorf("reflectReaders names %s, which is no field", f)
		}
	}
	sort.Strings(unread)
	for _, f := range unread {
		t.Errorf("%s is read by no package outside scd/def: make its operand work or refuse it", f)
	}
}

// collectFields adds "Type.Field" for every exported field of t and of the
// package's struct types it holds.
func collectFields(t reflect.Type, out map[string]bool) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t.PkgPath() != reflect.TypeOf(Config{}).PkgPath() {
		return
	}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		key := t.Name() + "." + f.Name
		if out[key] {
			continue
		}
		out[key] = true
		collectFields(f.Type, out)
	}
}

// readFields type-checks every package of the module but this one and
// returns "Type.Field" for each field of this package that a selector
// reads (the target of a plain assignment is not a read). Types matter:
// a selector named Env or Name is not a read of Server.Env unless its
// operand is a Server.
func readFields(t *testing.T) map[string]bool {
	self := reflect.TypeOf(Config{}).PkgPath()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go command to list the module's packages:", err)
	}
	cmd := exec.Command("go", "list", "-e", "-export", "-deps", "-json=ImportPath,Dir,GoFiles,Export,Module,Error", "./...")
	cmd.Dir = moduleRoot(t)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	type pkg struct {
		ImportPath, Dir, Export string
		GoFiles                 []string
		Module                  *struct{ Path string }
		Error                   *struct{ Err string }
	}
	exports := map[string]string{}
	var mine []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		if p.Error != nil {
			t.Fatalf("go list: %s: %s", p.ImportPath, p.Error.Err)
		}
		exports[p.ImportPath] = p.Export
		if p.Module != nil && p.Module.Path == "tpsched" && p.ImportPath != self && len(p.GoFiles) > 0 {
			mine = append(mine, p)
		}
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok || f == "" {
			return nil, errors.New("no export data for " + path)
		}
		return os.Open(f)
	})
	read := map[string]bool{}
	for _, p := range mine {
		var files []*ast.File
		for _, name := range p.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
		info := &types.Info{Selections: map[*ast.SelectorExpr]*types.Selection{}}
		conf := types.Config{Importer: imp}
		if _, err := conf.Check(p.ImportPath, fset, files, info); err != nil {
			t.Fatalf("type-check %s: %v", p.ImportPath, err)
		}
		written := map[*ast.SelectorExpr]bool{}
		for _, f := range files {
			ast.Inspect(f, func(n ast.Node) bool {
				if as, ok := n.(*ast.AssignStmt); ok && (as.Tok == token.ASSIGN || as.Tok == token.DEFINE) {
					for _, lhs := range as.Lhs {
						if sel, ok := lhs.(*ast.SelectorExpr); ok {
							written[sel] = true
						}
					}
				}
				return true
			})
		}
		for expr, sel := range info.Selections {
			if sel.Kind() != types.FieldVal || written[expr] {
				continue
			}
			field := sel.Obj()
			if field.Pkg() == nil || field.Pkg().Path() != self {
				continue
			}
			recv := sel.Recv()
			if ptr, ok := recv.(*types.Pointer); ok {
				recv = ptr.Elem()
			}
			named, ok := recv.(*types.Named)
			if !ok {
				continue
			}
			read[named.Obj().Name()+"."+field.Name()] = true
		}
	}
	return read
}

func moduleRoot(t *testing.T) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}
