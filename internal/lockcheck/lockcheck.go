// Package lockcheck finds a lock held across a wait on another goroutine:
// a channel send or receive, a select with no default, a Wait or Sleep, a
// log write (slog's Error, Warn, Info, Debug..., which wait for the log's
// output), a call of a function value (a callback that may wait), or a call of a
// function of the same package that does one of these, between a mutex's
// Lock and its Unlock. Break 1 of issue 27 was such a place: the accept
// loop held the descriptor reserve's lock while it waited for an event
// loop, and the loop waited for the lock.
//
// The check is syntactic and local to a package (no type information), so
// it is conservative: it names every suspect site, and a site that cannot
// block says why in a comment on its line, starting "lockcheck:". The
// test beside it runs the check over netio, scd/local, shm and procmgr.
package lockcheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// A Finding is one suspect site: a wait at Pos while Lock is held.
type Finding struct {
	Pos  token.Position
	Lock string // the held lock's expression, as written
	Wait string // what may wait
}

func (f Finding) String() string {
	return fmt.Sprintf("%s: %s held across %s", f.Pos, f.Lock, f.Wait)
}

// Dir checks the non-test Go files of one package directory, log writes
// not counted as waits.
func Dir(dir string) ([]Finding, error) { return Config{}.Dir(dir) }

// Config says what counts as a wait beyond the channel operations, Wait,
// Sleep and callbacks that always do.
type Config struct {
	// Logs counts a log write as a wait (logMethods): it waits for the
	// log's output, a stderr that may not be read.
	Logs bool
}

// Dir checks the non-test Go files of one package directory.
func (cfg Config) Dir(dir string) ([]Finding, error) {
	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	var files []*ast.File
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		src, err := os.ReadFile(n)
		if err != nil {
			return nil, err
		}
		f, err := parser.ParseFile(fset, n, src, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	c := &checker{logs: cfg.Logs, fset: fset, funcs: map[string][]*ast.FuncDecl{}, blocks: map[string]string{}, fields: map[string]map[string]string{}}
	for _, f := range files {
		for _, d := range f.Decls {
			if gd, ok := d.(*ast.GenDecl); ok {
				c.structs(gd)
			}
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
				k := funcKey(fd)
				c.funcs[k] = append(c.funcs[k], fd)
			}
		}
	}
	c.summarise()
	for _, f := range files {
		c.excused = excusedLines(fset, f)
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
				held := map[string]bool{}
				if strings.HasSuffix(fd.Name.Name, "Locked") {
					held["(the caller's lock: "+fd.Name.Name+")"] = true
				}
				c.block(fd.Body.List, held, newScope(fd))
			}
		}
	}
	sort.Slice(c.found, func(i, j int) bool {
		a, b := c.found[i].Pos, c.found[j].Pos
		return a.Filename < b.Filename || a.Filename == b.Filename && a.Line < b.Line
	})
	return c.found, nil
}

type checker struct {
	logs    bool // Config.Logs
	fset    *token.FileSet
	funcs   map[string][]*ast.FuncDecl   // the package's functions and methods, by funcKey
	blocks  map[string]string            // a function that may wait, by funcKey: what it waits on
	fields  map[string]map[string]string // the package's struct types: field name to the field's type, where it is the package's own
	excused map[int]bool                 // lines of the current file with a "lockcheck:" comment
	found   []Finding
}

// structs notes the fields of the package's struct types whose type is a
// type of the package, so that s.m.start() can be followed to the method.
func (c *checker) structs(gd *ast.GenDecl) {
	for _, sp := range gd.Specs {
		ts, ok := sp.(*ast.TypeSpec)
		if !ok {
			continue
		}
		st, ok := ts.Type.(*ast.StructType)
		if !ok {
			continue
		}
		m := map[string]string{}
		for _, f := range st.Fields.List {
			t := recvTypeName(f.Type)
			for _, n := range f.Names {
				m[n.Name] = t
			}
		}
		c.fields[ts.Name.Name] = m
	}
}

// typeOf is the package's own type of a selector chain rooted at the
// receiver (g, g.srv, g.srv.m), or "".
func (c *checker) typeOf(e ast.Expr, sc *scope) string {
	switch x := e.(type) {
	case *ast.Ident:
		if sc.recv != "" && x.Name == sc.recv {
			return sc.recvType
		}
	case *ast.SelectorExpr:
		if t := c.typeOf(x.X, sc); t != "" {
			return c.fields[t][x.Sel.Name]
		}
	}
	return ""
}

// excusedLines are the lines that carry a "lockcheck:" comment, the
// author's word that the site cannot block.
func excusedLines(fset *token.FileSet, f *ast.File) map[int]bool {
	m := map[int]bool{}
	for _, g := range f.Comments {
		for _, c := range g.List {
			if strings.Contains(c.Text, "lockcheck:") {
				m[fset.Position(c.Slash).Line] = true
			}
		}
	}
	return m
}

// A scope is what the check knows of the function it is in: its
// parameters of function type (calling one runs the caller's code, which
// may wait) and its receiver. With no types, a method call is followed
// into the package's own code only on the function's own receiver
// (g.close() in a method of g): a call on any other value may be of
// another type with a method of the same name.
type scope struct {
	callbacks map[string]bool
	recv      string // the receiver's name, "" for a function
	recvType  string
}

func newScope(fd *ast.FuncDecl) *scope {
	sc := &scope{callbacks: map[string]bool{}}
	if fd.Type.Params != nil {
		for _, p := range fd.Type.Params.List {
			if _, ok := p.Type.(*ast.FuncType); ok {
				for _, n := range p.Names {
					sc.callbacks[n.Name] = true
				}
			}
		}
	}
	if fd.Recv != nil && len(fd.Recv.List) == 1 && len(fd.Recv.List[0].Names) == 1 {
		sc.recv = fd.Recv.List[0].Names[0].Name
		sc.recvType = recvTypeName(fd.Recv.List[0].Type)
	}
	return sc
}

// funcKey names a function "name" and a method "Type.name".
func funcKey(fd *ast.FuncDecl) string {
	if fd.Recv != nil && len(fd.Recv.List) == 1 {
		return recvTypeName(fd.Recv.List[0].Type) + "." + fd.Name.Name
	}
	return fd.Name.Name
}

func recvTypeName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return recvTypeName(x.X)
	case *ast.IndexExpr:
		return recvTypeName(x.X)
	case *ast.Ident:
		return x.Name
	}
	return "?"
}

// summarise finds, to a fixed point, the package's functions that may wait
// anywhere in their bodies (under a lock or not).
func (c *checker) summarise() {
	for changed := true; changed; {
		changed = false
		for name, decls := range c.funcs {
			if _, done := c.blocks[name]; done {
				continue
			}
			for _, fd := range decls {
				if w := c.waitIn(fd.Body, newScope(fd), true); w != "" {
					c.blocks[name] = w
					changed = true
					break
				}
			}
		}
	}
}

// waitIn returns what in n may wait, or "". Function literals are not
// entered: a goroutine's or a callback's body runs elsewhere.
func (c *checker) waitIn(n ast.Node, sc *scope, deep bool) string {
	var w string
	ast.Inspect(n, func(n ast.Node) bool {
		if w != "" {
			return false
		}
		switch x := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.GoStmt:
			return false // starting a goroutine does not wait for it
		case *ast.SendStmt:
			w = "a channel send"
		case *ast.UnaryExpr:
			if x.Op == token.ARROW {
				w = "a channel receive"
			}
		case *ast.SelectStmt:
			if !hasDefault(x) {
				w = "a select with no default"
				return false
			}
			for _, cl := range x.Body.List { // a default: its cases' sends and receives do not wait
				for _, s := range cl.(*ast.CommClause).Body {
					if w == "" {
						w = c.waitIn(s, sc, deep)
					}
				}
			}
			return false
		case *ast.CallExpr:
			w = c.callWait(x, sc, deep)
		}
		return true
	})
	return w
}

func hasDefault(s *ast.SelectStmt) bool {
	for _, cl := range s.Body.List {
		if cc, ok := cl.(*ast.CommClause); ok && cc.Comm == nil {
			return true
		}
	}
	return false
}

// callWait says whether a call may wait: Wait and Sleep by name (a
// sync.Cond's Wait gives its lock up and is not one), a call of a
// function-typed parameter, and a call of the package's own functions that
// may wait.
func (c *checker) callWait(call *ast.CallExpr, sc *scope, deep bool) string {
	switch fn := call.Fun.(type) {
	case *ast.Ident:
		if sc.callbacks[fn.Name] {
			return "a call of the callback " + fn.Name
		}
		if deep {
			if w, ok := c.blocks[fn.Name]; ok {
				return fn.Name + " (" + w + ")"
			}
		}
	case *ast.SelectorExpr:
		name := fn.Sel.Name
		recv := exprString(fn.X)
		switch {
		case name == "Wait" && !strings.Contains(strings.ToLower(recv), "cond"):
			return recv + ".Wait"
		case name == "Sleep" && recv == "time":
			return "time.Sleep"
		case strings.HasSuffix(name, "Context") && strings.HasPrefix(name, "Enroll"):
			return recv + "." + name + " (waits for an event loop)"
		case c.logs && logMethods[name] && isLogger(recv):
			return recv + "." + name + " (a log write, which waits for its output)"
		}
		if t := c.typeOf(fn.X, sc); deep && t != "" {
			if w, ok := c.blocks[t+"."+name]; ok {
				return recv + "." + name + " (" + w + ")"
			}
		}
	}
	return ""
}

// logMethods are slog's (and the log package's) calls that write a
// record: each waits for the handler's writer, and a stderr that nobody
// reads (a full pipe, a stopped terminal) blocks it for good, and with it
// every goroutine that wants the lock held (issue 29 item 7).
var logMethods = map[string]bool{
	"Debug": true, "Info": true, "Warn": true, "Error": true, "Log": true, "LogAttrs": true,
	"DebugContext": true, "InfoContext": true, "WarnContext": true, "ErrorContext": true,
	"Print": true, "Printf": true, "Println": true,
}

// isLogger reports whether a call's receiver, as written, names a logger:
// the slog and log packages, or a value or field called log or logger.
func isLogger(recv string) bool {
	last := recv[strings.LastIndex(recv, ".")+1:]
	return recv == "slog" || last == "log" || last == "logger" || last == "Logger"
}

// block walks a statement list in order with the locks held on entry.
// Nested blocks get a copy: a branch that unlocks and returns leaves the
// lock held on the path that goes on.
func (c *checker) block(list []ast.Stmt, held map[string]bool, sc *scope) {
	for _, s := range list {
		c.stmt(s, held, sc)
	}
}

func copyHeld(h map[string]bool) map[string]bool {
	m := make(map[string]bool, len(h))
	for k, v := range h {
		m[k] = v
	}
	return m
}

func (c *checker) stmt(s ast.Stmt, held map[string]bool, sc *scope) {
	if lock, op := lockOp(s); op != "" {
		switch op {
		case "lock":
			held[lock] = true
		case "unlock":
			delete(held, lock)
		}
		return
	}
	switch x := s.(type) {
	case *ast.BlockStmt:
		c.block(x.List, copyHeld(held), sc)
		return
	case *ast.IfStmt:
		if x.Init != nil {
			c.stmt(x.Init, held, sc)
		}
		c.check(x.Cond, held, sc)
		c.block(x.Body.List, copyHeld(held), sc)
		if x.Else != nil {
			c.stmt(x.Else, copyHeld(held), sc)
		}
		return
	case *ast.ForStmt:
		if x.Init != nil {
			c.stmt(x.Init, held, sc)
		}
		if x.Cond != nil {
			c.check(x.Cond, held, sc)
		}
		c.block(x.Body.List, copyHeld(held), sc)
		return
	case *ast.RangeStmt:
		c.check(x.X, held, sc)
		c.block(x.Body.List, copyHeld(held), sc)
		return
	case *ast.SwitchStmt:
		if x.Init != nil {
			c.stmt(x.Init, held, sc)
		}
		if x.Tag != nil {
			c.check(x.Tag, held, sc)
		}
		for _, cl := range x.Body.List {
			cc := cl.(*ast.CaseClause)
			c.block(cc.Body, copyHeld(held), sc)
		}
		return
	case *ast.TypeSwitchStmt:
		for _, cl := range x.Body.List {
			cc := cl.(*ast.CaseClause)
			c.block(cc.Body, copyHeld(held), sc)
		}
		return
	case *ast.SelectStmt:
		if len(held) > 0 && !hasDefault(x) {
			c.report(x.Pos(), held, "a select with no default")
		}
		for _, cl := range x.Body.List {
			cc := cl.(*ast.CommClause)
			c.block(cc.Body, copyHeld(held), sc)
		}
		return
	case *ast.LabeledStmt:
		c.stmt(x.Stmt, held, sc)
		return
	case *ast.DeferStmt:
		return // runs at return, when the function's own locks are let go by their deferred unlocks
	case *ast.GoStmt:
		return
	}
	c.check(s, held, sc)
}

// check reports what in n may wait while a lock is held.
func (c *checker) check(n ast.Node, held map[string]bool, sc *scope) {
	if len(held) == 0 || n == nil {
		return
	}
	ast.Inspect(n, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.SendStmt:
			c.report(x.Pos(), held, "a channel send")
		case *ast.UnaryExpr:
			if x.Op == token.ARROW {
				c.report(x.Pos(), held, "a channel receive")
			}
		case *ast.SelectStmt:
			if !hasDefault(x) {
				c.report(x.Pos(), held, "a select with no default")
			}
			for _, cl := range x.Body.List {
				for _, s := range cl.(*ast.CommClause).Body {
					c.check(s, held, sc)
				}
			}
			return false
		case *ast.CallExpr:
			if w := c.callWait(x, sc, true); w != "" {
				c.report(x.Pos(), held, w)
			}
		}
		return true
	})
}

func (c *checker) report(pos token.Pos, held map[string]bool, wait string) {
	p := c.fset.Position(pos)
	if c.excused[p.Line] || c.excused[p.Line-1] {
		return
	}
	var locks []string
	for l := range held {
		locks = append(locks, l)
	}
	sort.Strings(locks)
	c.found = append(c.found, Finding{Pos: p, Lock: strings.Join(locks, ", "), Wait: wait})
}

// lockOp recognises X.Lock(), X.RLock(), X.Unlock() and X.RUnlock() as
// statements; a deferred unlock is not one (the lock stays held to the
// function's end).
func lockOp(s ast.Stmt) (string, string) {
	es, ok := s.(*ast.ExprStmt)
	if !ok {
		return "", ""
	}
	call, ok := es.X.(*ast.CallExpr)
	if !ok || len(call.Args) != 0 {
		return "", ""
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return "", ""
	}
	switch sel.Sel.Name {
	case "Lock", "RLock":
		return exprString(sel.X), "lock"
	case "Unlock", "RUnlock":
		return exprString(sel.X), "unlock"
	}
	return "", ""
}

func exprString(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.SelectorExpr:
		return exprString(x.X) + "." + x.Sel.Name
	case *ast.StarExpr:
		return "*" + exprString(x.X)
	case *ast.IndexExpr:
		return exprString(x.X) + "[...]"
	case *ast.CallExpr:
		return exprString(x.Fun) + "()"
	case *ast.ParenExpr:
		return exprString(x.X)
	}
	return "?"
}
