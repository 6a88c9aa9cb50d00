package def

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
)

// FuzzParse: no input panics, and every error from Parse, and from loading
// the input as a user server (each one of several), says "usr/x:LINE: "
// with LINE inside the file.
func FuzzParse(f *testing.F) {
	for _, tc := range syntaxCases {
		f.Add([]byte(tc.src))
	}
	for _, tc := range operandCases {
		if tc.file == "usr/x" {
			f.Add([]byte(tc.text + "\n" + baseUsr))
		}
	}
	for _, tc := range contradictionCases {
		if s, ok := tc.files["usr/x"]; ok {
			f.Add([]byte(s))
		}
	}
	f.Add([]byte("set a = \"\\\n\""))
	f.Add([]byte("\\\n\\\n\\"))
	f.Fuzz(func(t *testing.T, src []byte) {
		lines := countLines(src)
		check := func(what string, all error) {
			for _, err := range List(all) { // every error, not only the first
				var e *Error
				if !errors.As(err, &e) {
					t.Fatalf("%s: error %T %q is not a *Error", what, err, err)
				}
				if e.File != "usr/x" || e.Line < 1 || e.Line > max(lines, 1) {
					t.Fatalf("%s: error %q: line %d outside 1..%d", what, err, e.Line, max(lines, 1))
				}
				if !strings.HasPrefix(err.Error(), "usr/x:"+strconv.Itoa(e.Line)+": ") {
					t.Fatalf("%s: error %q lacks its file:line prefix", what, err)
				}
			}
		}
		_, err := Parse("usr/x", src)
		check("Parse", err)
		_, err = LoadFS(fstest.MapFS{"usr/x": {Data: src}})
		check("LoadFS", err)
	})
}
