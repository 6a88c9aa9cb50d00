package def

import (
	"bytes"
	"fmt"
	"strings"
)

// Error is a definition error. It prints as "file:line: operand: why", or
// "file: operand: why" when there is no line (an environment variable, or
// a whole-file problem). Syntax errors that name no operand use the operand
// "syntax".
type Error struct {
	File    string // relative to the definition directory: "sysconf", "usr/echo"; "environment" for variables
	Line    int    // 1-based; 0 when there is no line
	Operand string // the operand, the environment variable, "putenv" or "syntax"
	Reason  string
}

func (e *Error) Error() string {
	if e.Line <= 0 {
		return fmt.Sprintf("%s: %s: %s", e.File, e.Operand, e.Reason)
	}
	return fmt.Sprintf("%s:%d: %s: %s", e.File, e.Line, e.Operand, e.Reason)
}

// Stmt kinds.
const (
	StmtSet     = "set"
	StmtPutenv  = "putenv"
	StmtCommand = "command" // a definition command: name -option value ...
)

// Stmt is one statement of a definition file.
type Stmt struct {
	Line   int      // the line the statement starts on
	Kind   string   // StmtSet, StmtPutenv or StmtCommand
	Name   string   // the operand or command (lower case) or the environment variable
	Values []string // set: one per comma-separated value, quotes removed; putenv: exactly one
	Flags  []Flag   // command: its options, in order
}

// Flag is one option of a definition command: -name value.
type Flag struct {
	Name  string // without the '-'
	Value string // quotes removed
}

// Parse splits the text of one definition file into statements. file is the
// name used in errors. The syntax is OpenTP1's:
//
//	set operand = value            # a comment
//	set operand = v1, "v 2", v3    # a list; "..." may hold spaces, commas, # and \"
//	set operand = v1, \            # a trailing \ continues the statement,
//	              v2               # before a comment too
//	putenv NAME value              # value may be quoted
//
//	scdmulti -g heavy -m 2 -p 12010  # a definition command, as OpenTP1 writes some
//
// Operand names and the keywords are case-insensitive; operand names come
// back in lower case. A command is a name followed by options, each a
// '-' and a letter then a value; the same option twice is an error, the
// same command twice is not. The same operand set twice, or the same variable
// given to putenv twice, is an error. Parse knows no operand: Load checks
// names and values.
//
// A statement in error is left out and Parse goes on: it returns the
// statements it could read with every error (one *Error, or Errors). A
// file of more than maxStatements (65536) statements is an error at the
// first past them, and the rest is not read.
func Parse(file string, src []byte) ([]Stmt, error) {
	var errs collector
	// A byte-order mark, which some editors put before UTF-8, is no part
	// of the first statement.
	src = bytes.TrimPrefix(src, []byte("\xef\xbb\xbf"))
	raws := splitStatements(file, src, &errs)
	var out []Stmt
	seenSet := map[string]int{}
	seenEnv := map[string]int{}
	for _, r := range raws {
		st, err := parseStatement(file, r)
		if err == nil {
			err = checkNUL(file, st)
		}
		if errs.add(err) {
			continue
		}
		if st.Kind == StmtCommand {
			out = append(out, st) // a command may be given more than once (one receiver group each)
			continue
		}
		seen := seenSet
		if st.Kind == StmtPutenv {
			seen = seenEnv
		}
		if first, ok := seen[st.Name]; ok {
			op, why := st.Name, fmt.Sprintf("set twice (first at line %d)", first)
			if st.Kind == StmtPutenv {
				op, why = "putenv", fmt.Sprintf("%s given twice (first at line %d)", st.Name, first)
			}
			errs.add(&Error{File: file, Line: st.Line, Operand: op, Reason: why})
			continue
		}
		seen[st.Name] = st.Line
		out = append(out, st)
	}
	return out, errs.err()
}

// checkNUL refuses a value that holds a NUL byte: the kernel ends a path,
// an environment variable or an argument there, so the value would mean
// less than it says (or make every start of the server fail), and a text
// file has none.
func checkNUL(file string, st Stmt) error {
	const why = "a NUL byte in the value (a definition file is text)"
	fail := func(op, why string) error { return &Error{File: file, Line: st.Line, Operand: op, Reason: why} }
	switch st.Kind {
	case StmtSet:
		for _, v := range st.Values {
			if strings.IndexByte(v, 0) >= 0 {
				return fail(st.Name, why)
			}
		}
	case StmtPutenv:
		if strings.IndexByte(st.Values[0], 0) >= 0 {
			return fail("putenv", st.Name+": "+why)
		}
	case StmtCommand:
		for _, f := range st.Flags {
			if strings.IndexByte(f.Value, 0) >= 0 {
				return fail(st.Name, "option -"+f.Name+": "+why)
			}
		}
	}
	return nil
}

// maxStatements is the most statements one definition file may have.
// The longest real one, a svcpolicy of 1024 classes, rules and
// environments each, has some 3000. The bound is there because a
// statement and an error about it take a few hundred bytes each: within
// maxDefinitionSize alone, a file of one-letter lines made 8 M of both,
// gigabytes and a minute of scdd -check.
const maxStatements = 1 << 16

// rawStmt is one logical statement: comments removed, continuation lines
// joined, quotes and escapes still in place.
type rawStmt struct {
	line int
	text string
}

// splitStatements splits src into statements. A string left open at the
// end of its line is an error in errs, and its statement is dropped.
func splitStatements(file string, src []byte, errs *collector) []rawStmt {
	var (
		out       []rawStmt
		buf       strings.Builder
		line      = 1
		stmtLine  = 0 // 0: nothing but blanks so far
		quoteLine = 0 // 0: outside quotes
	)
	flush := func() {
		if stmtLine != 0 {
			out = append(out, rawStmt{line: stmtLine, text: buf.String()})
		}
		buf.Reset()
		stmtLine = 0
	}
	for i := 0; i < len(src); i++ {
		c := src[i]
		if quoteLine != 0 {
			switch c {
			case '\n':
				errs.add(&Error{File: file, Line: quoteLine, Operand: "syntax", Reason: "unterminated string (a closing \" is missing)"})
				buf.Reset()
				stmtLine, quoteLine = 0, 0
				line++
				continue
			case '\\':
				if i+1 < len(src) && src[i+1] != '\n' {
					buf.WriteByte(c)
					buf.WriteByte(src[i+1])
					i++
					continue
				}
			case '"':
				quoteLine = 0
			}
			buf.WriteByte(c)
			continue
		}
		switch c {
		case '\n':
			flush()
			if len(out) > maxStatements {
				return tooMany(file, out, errs)
			}
			line++
			continue
		case '#':
			for i+1 < len(src) && src[i+1] != '\n' {
				i++
			}
			continue
		case '\\':
			// A backslash followed only by blanks, and maybe a comment, up
			// to the end of the line continues the statement on the next
			// line (the backslash is the last of the line once the comment
			// is removed: before a comment it was a value of its own, "\\").
			j := i + 1
			for j < len(src) && (src[j] == ' ' || src[j] == '\t' || src[j] == '\r') {
				j++
			}
			if j < len(src) && src[j] == '#' {
				for j < len(src) && src[j] != '\n' {
					j++
				}
			}
			if j == len(src) || src[j] == '\n' {
				buf.WriteByte(' ')
				if j < len(src) {
					line++
				}
				i = j
				continue
			}
		case '"':
			quoteLine = line
		}
		if stmtLine == 0 && !isBlank(c) {
			stmtLine = line
		}
		buf.WriteByte(c)
	}
	if quoteLine != 0 {
		errs.add(&Error{File: file, Line: quoteLine, Operand: "syntax", Reason: "unterminated string (a closing \" is missing)"})
		return out
	}
	flush()
	if len(out) > maxStatements {
		return tooMany(file, out, errs)
	}
	return out
}

// tooMany adds the error of a file of more than maxStatements statements,
// at the first one past the bound, and returns those within it.
func tooMany(file string, out []rawStmt, errs *collector) []rawStmt {
	errs.add(&Error{File: file, Line: out[maxStatements].line, Operand: "syntax",
		Reason: fmt.Sprintf("more than %d statements in the file: the rest is not read", maxStatements)})
	return out[:maxStatements]
}

func isBlank(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v' }

// scanner reads the tokens of one statement.
type scanner struct {
	s   string
	pos int
}

type tokKind int

const (
	tokEOF tokKind = iota
	tokWord
	tokString
	tokEqual
	tokComma
)

// next returns the next token. In value mode a word may contain '='
// (service = echo=echo); elsewhere '=' is a token of its own.
func (sc *scanner) next(valueMode bool) (tokKind, string, error) {
	for sc.pos < len(sc.s) && isBlank(sc.s[sc.pos]) {
		sc.pos++
	}
	if sc.pos >= len(sc.s) {
		return tokEOF, "", nil
	}
	switch c := sc.s[sc.pos]; {
	case c == ',':
		sc.pos++
		return tokComma, ",", nil
	case c == '=' && !valueMode:
		sc.pos++
		return tokEqual, "=", nil
	case c == '"':
		var b strings.Builder
		for i := sc.pos + 1; i < len(sc.s); i++ {
			switch sc.s[i] {
			case '\\':
				if i+1 < len(sc.s) && (sc.s[i+1] == '"' || sc.s[i+1] == '\\') {
					i++
				}
			case '"':
				sc.pos = i + 1
				if sc.pos < len(sc.s) && !isBlank(sc.s[sc.pos]) && sc.s[sc.pos] != ',' && sc.s[sc.pos] != '=' {
					return 0, "", fmt.Errorf("unexpected %q right after a closing quote", sc.s[sc.pos])
				}
				return tokString, b.String(), nil
			}
			b.WriteByte(sc.s[i])
		}
		return 0, "", fmt.Errorf("unterminated string")
	}
	start := sc.pos
	for sc.pos < len(sc.s) {
		c := sc.s[sc.pos]
		if isBlank(c) || c == ',' || (c == '=' && !valueMode) {
			break
		}
		if c == '"' {
			return 0, "", fmt.Errorf("unexpected quote inside %q", shown(sc.s[start:sc.pos+1]))
		}
		sc.pos++
	}
	return tokWord, sc.s[start:sc.pos], nil
}

func parseStatement(file string, r rawStmt) (Stmt, error) {
	sc := &scanner{s: r.text}
	fail := func(op, format string, args ...any) (Stmt, error) {
		return Stmt{}, &Error{File: file, Line: r.line, Operand: op, Reason: fmt.Sprintf(format, args...)}
	}
	k, kw, err := sc.next(false)
	if err != nil {
		return fail("syntax", "%v", err)
	}
	if k != tokWord {
		return fail("syntax", "statement starts with %q, want set or putenv", shown(kw))
	}
	switch strings.ToLower(kw) {
	case StmtSet:
		k, name, err := sc.next(false)
		if err != nil {
			return fail("syntax", "%v", err)
		}
		if k != tokWord || !isName(name) {
			return fail("syntax", "set: want an operand name, got %q", shown(name))
		}
		name = strings.ToLower(name)
		if k, t, err := sc.next(false); err != nil {
			return fail(name, "%v", err)
		} else if k != tokEqual {
			return fail(name, "want '=' after the operand, got %q", shown(t))
		}
		st := Stmt{Line: r.line, Kind: StmtSet, Name: name}
		for {
			k, v, err := sc.next(true)
			if err != nil {
				return fail(name, "%v", err)
			}
			if k != tokWord && k != tokString {
				if len(st.Values) == 0 {
					return fail(name, "missing value after '='")
				}
				return fail(name, "missing value after ','")
			}
			st.Values = append(st.Values, v)
			k, t, err := sc.next(true)
			if err != nil {
				return fail(name, "%v", err)
			}
			if k == tokEOF {
				return st, nil
			}
			if k != tokComma {
				return fail(name, "unexpected %q after value %q (quote values that hold blanks)", shown(t), shown(v))
			}
		}
	case StmtPutenv:
		k, name, err := sc.next(false)
		if err != nil {
			return fail("putenv", "%v", err)
		}
		if k != tokWord || !isEnvName(name) {
			return fail("putenv", "want an environment variable name, got %q", shown(name))
		}
		k, v, err := sc.next(true)
		if err != nil {
			return fail("putenv", "%s: %v", name, err)
		}
		if k != tokWord && k != tokString {
			return fail("putenv", "%s: missing value (write \"\" for an empty one)", name)
		}
		if k, t, err := sc.next(true); err != nil {
			return fail("putenv", "%s: %v", name, err)
		} else if k != tokEOF {
			return fail("putenv", "%s: unexpected %q after the value (quote values that hold blanks)", name, shown(t))
		}
		return Stmt{Line: r.line, Kind: StmtPutenv, Name: name, Values: []string{v}}, nil
	}
	if st, ok, err := parseCommand(sc, kw, r.line); ok {
		if err != nil {
			return fail(st.Name, "%v", err)
		}
		return st, nil
	}
	return fail("syntax", "unknown statement %q, want set, putenv or a command (name -option value ...)", shown(kw))
}

// parseCommand reads a definition command whose name kw the scanner has
// just read. ok is false when the statement is not command-shaped (a name
// then nothing, or an option).
func parseCommand(sc *scanner, kw string, line int) (st Stmt, ok bool, err error) {
	if !isName(kw) {
		return Stmt{}, false, nil
	}
	st = Stmt{Line: line, Kind: StmtCommand, Name: strings.ToLower(kw)}
	save := sc.pos
	k, t, terr := sc.next(true)
	sc.pos = save
	if terr == nil && k == tokWord && !isOption(t) {
		return Stmt{}, false, nil // "foo a = 1": no command
	}
	seen := map[string]bool{}
	for {
		k, opt, err := sc.next(true)
		if err != nil {
			return st, true, err
		}
		if k == tokEOF {
			return st, true, nil
		}
		if k != tokWord || !isOption(opt) {
			return st, true, fmt.Errorf("want an option (-letter value), got %q", shown(opt))
		}
		name := opt[1:]
		if seen[name] {
			return st, true, fmt.Errorf("option %s given twice", opt)
		}
		seen[name] = true
		k, v, err := sc.next(true)
		if err != nil {
			return st, true, err
		}
		if k != tokWord && k != tokString {
			return st, true, fmt.Errorf("option %s: missing value", opt)
		}
		st.Flags = append(st.Flags, Flag{Name: name, Value: v})
	}
}

// isOption reports whether s is a command option: '-' and one letter.
func isOption(s string) bool {
	return len(s) == 2 && s[0] == '-' && (('a' <= s[1] && s[1] <= 'z') || ('A' <= s[1] && s[1] <= 'Z'))
}

// isName reports whether s is an operand name: a letter or '_', then
// letters, digits and '_'.
func isName(s string) bool { return len(s) <= 64 && isIdent(s) }

// isEnvName reports whether s can name an environment variable.
func isEnvName(s string) bool { return len(s) <= 255 && isIdent(s) }

func isIdent(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z'):
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}
