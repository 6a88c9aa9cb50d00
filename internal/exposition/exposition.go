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
// It must not write series of its own: it only adds the words.
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

// Write copies the Prometheus text src to w, giving every bare
// "# HELP family" line the text the first table that knows the family
// has for it.
func Write(w io.Writer, src []byte, tables ...map[string]string) error {
	out := make([]byte, 0, len(src)+len(src)/4)
	for len(src) > 0 {
		line := src
		if i := bytes.IndexByte(src, '\n'); i >= 0 {
			line, src = src[:i+1], src[i+1:]
		} else {
			src = nil
		}
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
