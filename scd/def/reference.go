package def

import (
	"maps"
	"slices"
	"sort"
	"strings"
)

//go:generate go run ./gendoc -o ../../docs/OPERANDS.md

// The kinds of definition file, as OperandDoc.File names them.
const (
	FileSysconf   = "sysconf"             // system common definition
	FileScdsvcdef = "scdsvcdef"           // schedule service definition
	FileUsr       = "usrrc, usr/<server>" // user service (default) definition
	FileBetranrc  = "betranrc"            // client environment definition (and its environment variables)
)

// FilePolicy (svcpolicy, the service policy definition) is in policy.go.

// OperandDoc is one operand as the operand reference (docs/OPERANDS.md)
// shows it.
type OperandDoc struct {
	Name        string   // as written in the file
	File        string   // FileSysconf, FileScdsvcdef, FileUsr, FilePolicy or FileBetranrc
	Env         string   // betranrc operands: the environment variable that overrides the file
	Aliases     []string // other names the file accepts
	Default     string   // the default as written in a file; "" when it cannot be written
	DefaultNote string   // the default in words, when Default is ""
	Values      string   // what may be written
	OpenTP1     string   // what the source documents say it means; "" when they do not describe it
	Tpsched     string   // what tpsched adds to that meaning, or the whole meaning
	Own         bool     // tpsched's own operand: OpenTP1 has none of this name
	Refused     string   // not "": tpsched refuses the operand in any file, for this reason
	Command     string   // not "": a definition command, written as this synopsis (scdmulti -g GROUP ...)
}

// Operands lists every operand: sysconf's, scdsvcdef's, the user
// servers' and betranrc's, each file's by name (its commands after its set
// operands), then the refused ones.
func Operands() []OperandDoc {
	var out []OperandDoc
	out = appendDocs(out, FileSysconf, systemOperands)
	out = appendDocs(out, FileScdsvcdef, schedOperands)
	out = appendCommandDocs(out, FileScdsvcdef, schedCommands)
	out = appendDocs(out, FileUsr, serverOperands)
	out = appendCommandDocs(out, FileUsr, serverCommands)
	out = appendDocs(out, FilePolicy, policyOperands)
	out = appendCommandDocs(out, FilePolicy, policyCommands)
	start := len(out)
	out = appendDocs(out, FileBetranrc, clientOperands)
	for i := start; i < len(out); i++ {
		d := &out[i]
		d.Env = strings.ToUpper(d.Name)
		for alias, name := range clientAliases {
			if name == d.Name {
				d.Aliases = append(d.Aliases, alias)
			}
		}
		sort.Strings(d.Aliases)
	}
	return appendByName(out, refusedOperands, func(name string, r refusedOperand) OperandDoc {
		return OperandDoc{Name: name, File: r.file, OpenTP1: r.opentp1, Refused: r.why}
	})
}

func appendDocs[T any](out []OperandDoc, file string, table map[string]operand[T]) []OperandDoc {
	return appendByName(out, table, func(name string, op operand[T]) OperandDoc {
		return OperandDoc{Name: name, File: file, Default: op.value, DefaultNote: op.dflt,
			Values: op.values, OpenTP1: op.opentp1, Tpsched: op.tpsched, Own: op.own}
	})
}

func appendCommandDocs[T any](out []OperandDoc, file string, cmds map[string]command[T]) []OperandDoc {
	return appendByName(out, cmds, func(name string, c command[T]) OperandDoc {
		return OperandDoc{Name: name, File: file, Command: c.synopsis, DefaultNote: c.dflt,
			Values: c.values, OpenTP1: c.opentp1, Tpsched: c.tpsched}
	})
}

// appendByName appends doc(name, v) for every entry of table, by name.
func appendByName[V any](out []OperandDoc, table map[string]V, doc func(string, V) OperandDoc) []OperandDoc {
	for _, name := range slices.Sorted(maps.Keys(table)) {
		out = append(out, doc(name, table[name]))
	}
	return out
}
