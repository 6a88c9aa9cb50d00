package def

import (
	"fmt"
	"strings"
)

// Operand tables, one per kind of file. Each entry says how the values of
// one set statement are read and what the operand reference
// (docs/OPERANDS.md, generated from these tables by `go generate`) says
// about it. A handler gets the values and returns the reason a value is
// wrong; the caller adds the file, line and operand. Defaults live in
// defaultSystem, defaultSched, defaultServer and defaultClient; a test
// checks that each operand's documented default is what they hold.

type handler[T any] func(dst *T, v []string) error

// operand is one operand of one kind of file.
type operand[T any] struct {
	set handler[T]
	// value is the default as it would be written in the file; a test sets
	// it on the defaults and expects no change. "" when the default cannot
	// be written: dflt then says it in words.
	value   string
	dflt    string
	values  string // what may be written
	opentp1 string // what the source documents say it means; "" when they do not describe it
	tpsched string // what tpsched adds to that meaning, or the whole meaning
	own     bool   // tpsched's own operand: OpenTP1 has none of this name
}

// command is one definition command of one kind of file: OpenTP1 writes
// some definitions as a command with options (scdmulti -g NAME -m COUNT
// -p PORT) rather than as set statements, and a file may give a command
// more than once.
type command[T any] struct {
	set      func(dst *T, flags map[string]string) error
	synopsis string // how it is written, options in upper case
	dflt     string // what holds without it
	values   string
	opentp1  string
	tpsched  string
}

// options are the letters of the options the command's synopsis names.
func (c command[T]) options() string {
	var out []byte
	for _, w := range strings.Fields(c.synopsis) {
		if isOption(w) {
			out = append(out, w[1])
		}
	}
	return string(out)
}

// flagsOf checks a command's options against the allowed letters and
// returns them by letter.
func flagsOf(st Stmt, allowed string) (map[string]string, error) {
	out := make(map[string]string, len(st.Flags))
	for _, f := range st.Flags {
		if !strings.Contains(allowed, f.Name) {
			opts := make([]string, len(allowed))
			for i := range allowed {
				opts[i] = "-" + allowed[i:i+1]
			}
			return nil, fmt.Errorf("unknown option -%s (it takes %s)", f.Name, strings.Join(opts, ", "))
		}
		out[f.Name] = f.Value
	}
	return out, nil
}

// refusedOperands are operands of OpenTP1's that tpsched refuses in any
// file, with the reason; the reference lists them too.
var refusedOperands = map[string]refusedOperand{}

type refusedOperand struct {
	file    string // where OpenTP1 puts it
	opentp1 string
	why     string
}

// unknownOperand is the reason for an operand that table does not know:
// where it belongs instead, or the operand it was likely meant to be.
func unknownOperand[T any](name string, table map[string]operand[T]) string {
	if w := whereElse(name); w != "" {
		return "unknown operand here (it belongs in " + w + ")"
	}
	here := make([]string, 0, len(table))
	for op := range table {
		here = append(here, op)
	}
	if s := Suggest(name, here); s != "" {
		return "unknown operand (did you mean " + s + "?)"
	}
	if s := Suggest(name, allOperandNames()); s != "" {
		return "unknown operand (did you mean " + s + "? it belongs in " + whereElse(s) + ")"
	}
	return "unknown operand"
}

// allOperandNames lists the operands of every kind of file, and betranrc's
// aliases.
func allOperandNames() []string {
	var all []string
	for op := range systemOperands {
		all = append(all, op)
	}
	for op := range schedOperands {
		all = append(all, op)
	}
	for op := range serverOperands {
		all = append(all, op)
	}
	for op := range clientOperands {
		all = append(all, op)
	}
	for a := range clientAliases {
		all = append(all, a)
	}
	return all
}

// whereElse names the file an operand belongs in, for "unknown operand".
func whereElse(name string) string {
	if _, ok := systemOperands[name]; ok {
		return "sysconf"
	}
	if _, ok := schedOperands[name]; ok {
		return "scdsvcdef"
	}
	if _, ok := serverOperands[name]; ok {
		return "usrrc or usr/<server>"
	}
	if _, ok := clientOperands[name]; ok || clientAliases[name] != "" {
		return "betranrc"
	}
	return ""
}
