// Package exposition finishes the Prometheus text a tpsched daemon serves.
//
// The series themselves are the VictoriaMetrics/metrics library's: with
// metrics.ExposeMetadata(true) it writes a TYPE line and a HELP line for
// every family, but the HELP line carries no text (the library has no
// place to give one). Write fills each one in from tables kept beside the
// code that registers the families (scd's, rpcport.MetricHelp, and Runtime
// here for the library's own go_* and process_* families). A family no
// table knows keeps its bare HELP line; the tests of the packages that
// serve /metrics fail on that.
//
// It also owns the names of the library's go_* and process_* families:
// the few that break Prometheus' naming rules (a counter without _total, a
// gauge named like a histogram's _count, counters typed as gauges) are
// renamed or retyped as they pass (Renamed), so that `promtool check
// metrics` passes on the whole endpoint.
//
// It must not write series of its own: it only adds the words and fixes
// those names.
//
// # Usage
//
//	metrics.ExposeMetadata(true) // once, before the first scrape
//	var b bytes.Buffer
//	set.WritePrometheus(&b)
//	metrics.WriteProcessMetrics(&b)
//	err := exposition.Write(w, b.Bytes(), myHelp, rpcport.MetricHelp, exposition.Runtime)
package exposition

import (
	"bytes"
	"io"
	"strings"
)

// Rename is what becomes of one of the library's families: its new
// name, and its type when that changes ("" keeps it).
type Rename struct {
	Name string
	Type string
}

// Renamed are the library's (VictoriaMetrics/metrics v1.45) go_* and
// process_* families whose names or types break Prometheus' conventions,
// as promtool's linter says: counters must end in _total and only
// counters may; _count is a histogram's or summary's. The process_io_*
// series are cumulative counts from /proc/self/io that the library types
// as gauges: they become the counters they are. A dashboard that
// queries these families uses the new names.
var Renamed = map[string]Rename{
	"go_cgo_calls_count":                     {Name: "go_cgo_calls_total"},
	"go_gc_forced_count":                     {Name: "go_gc_forced_total"},
	"go_cpu_count":                           {Name: "go_cpus"},
	"process_io_read_bytes_total":            {Name: "process_io_read_bytes_total", Type: "counter"},
	"process_io_written_bytes_total":         {Name: "process_io_written_bytes_total", Type: "counter"},
	"process_io_read_syscalls_total":         {Name: "process_io_read_syscalls_total", Type: "counter"},
	"process_io_write_syscalls_total":        {Name: "process_io_write_syscalls_total", Type: "counter"},
	"process_io_storage_read_bytes_total":    {Name: "process_io_storage_read_bytes_total", Type: "counter"},
	"process_io_storage_written_bytes_total": {Name: "process_io_storage_written_bytes_total", Type: "counter"},
}

// Write copies the Prometheus text src to w, renaming the families of
// Renamed and giving every bare "# HELP family" line the text the first
// table that knows the family has for it.
func Write(w io.Writer, src []byte, tables ...map[string]string) error {
	out := make([]byte, 0, len(src)+len(src)/4)
	for len(src) > 0 {
		line := src
		if i := bytes.IndexByte(src, '\n'); i >= 0 {
			line, src = src[:i+1], src[i+1:]
		} else {
			src = nil
		}
		line = rename(line)
		out = append(out, line...)
		family, ok := bytes.CutPrefix(bytes.TrimSuffix(line, []byte("\n")), []byte("# HELP "))
		if !ok || bytes.IndexByte(family, ' ') >= 0 {
			continue // not a HELP line, or one that has its text
		}
		if text := Lookup(string(family), tables...); text != "" {
			out = out[:len(out)-len(line)]
			out = append(out, "# HELP "...)
			out = append(out, family...)
			out = append(out, ' ')
			out = append(out, escapeHelp(text)...)
			out = append(out, '\n')
		}
	}
	_, err := w.Write(out)
	return err
}

// Lookup is the HELP text of family in the first table that has one.
func Lookup(family string, tables ...map[string]string) string {
	for _, t := range tables {
		if text := t[family]; text != "" {
			return text
		}
	}
	return ""
}

// escapeHelp escapes what the text format reserves in HELP text: a
// backslash and a line feed.
func escapeHelp(s string) string {
	if !strings.ContainsAny(s, "\\\n") {
		return s
	}
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`).Replace(s)
}

// rename gives a line of a family in Renamed (its HELP, its TYPE or a
// sample) the family's new name and type; other lines come back as they
// are.
func rename(line []byte) []byte {
	prefix, rest := []byte(nil), line
	for _, p := range [][]byte{[]byte("# HELP "), []byte("# TYPE ")} {
		if r, ok := bytes.CutPrefix(line, p); ok {
			prefix, rest = p, r
		}
	}
	if prefix == nil && bytes.HasPrefix(line, []byte("#")) {
		return line
	}
	end := bytes.IndexAny(rest, " {\n")
	if end < 0 {
		end = len(rest)
	}
	r, ok := Renamed[string(rest[:end])]
	if !ok {
		return line
	}
	after := rest[end:]
	out := make([]byte, 0, len(line)+8)
	out = append(out, prefix...)
	out = append(out, r.Name...)
	if r.Type != "" && bytes.Equal(prefix, []byte("# TYPE ")) {
		out = append(out, ' ')
		out = append(out, r.Type...)
		if bytes.HasSuffix(after, []byte("\n")) {
			out = append(out, '\n')
		}
		return out
	}
	return append(out, after...)
}
