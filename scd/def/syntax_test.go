package def

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

var syntaxCases = []struct {
	name string
	src  string
	want []Stmt
	err  string // the whole error, when not ""
}{
	{name: "empty", src: ""},
	{name: "blank and comments", src: "\n   \n# only a comment\n\t# another\n"},
	{name: "one set", src: "set a = 1\n",
		want: []Stmt{{1, StmtSet, "a", []string{"1"}, nil}}},
	{name: "no final newline, no blanks", src: "set a=1",
		want: []Stmt{{1, StmtSet, "a", []string{"1"}, nil}}},
	{name: "comment after value", src: "set a = 1 # one\n",
		want: []Stmt{{1, StmtSet, "a", []string{"1"}, nil}}},
	{name: "hash inside quotes", src: `set a = "x # y" # z` + "\n",
		want: []Stmt{{1, StmtSet, "a", []string{"x # y"}, nil}}},
	{name: "escaped quote", src: `set a = "say \"hi\" \\ ok"`,
		want: []Stmt{{1, StmtSet, "a", []string{`say "hi" \ ok`}, nil}}},
	{name: "list", src: "set a = 1,2 , 3\n",
		want: []Stmt{{1, StmtSet, "a", []string{"1", "2", "3"}, nil}}},
	{name: "quoted list with commas", src: `set a = "x,y", "z"`,
		want: []Stmt{{1, StmtSet, "a", []string{"x,y", "z"}, nil}}},
	{name: "equals inside value", src: "set service = echo=echo, b=c\n",
		want: []Stmt{{1, StmtSet, "service", []string{"echo=echo", "b=c"}, nil}}},
	{name: "continuation", src: "# c\nset a = 1, \\\n  2, \\  \n  3\nset b = 4\n",
		want: []Stmt{{2, StmtSet, "a", []string{"1", "2", "3"}, nil}, {5, StmtSet, "b", []string{"4"}, nil}}},
	{name: "continuation before a comment", src: "set a = 1, \\ # more below\n  2 \\\t#\n , 3\nset b = 4\n",
		want: []Stmt{{1, StmtSet, "a", []string{"1", "2", "3"}, nil}, {4, StmtSet, "b", []string{"4"}, nil}}},
	{name: "continuation right before a comment", src: "set a = 1,\\# more\n2\n",
		want: []Stmt{{1, StmtSet, "a", []string{"1", "2"}, nil}}},
	{name: "putenv continued before a comment", src: "putenv A \\ # the value:\n \"x y\"\n",
		want: []Stmt{{1, StmtPutenv, "A", []string{"x y"}, nil}}},
	{name: "continuation at end of file", src: "set a = 1 \\",
		want: []Stmt{{1, StmtSet, "a", []string{"1"}, nil}}},
	{name: "CRLF", src: "set a = 1\r\nset b = \"x\"\r\n",
		want: []Stmt{{1, StmtSet, "a", []string{"1"}, nil}, {2, StmtSet, "b", []string{"x"}, nil}}},
	{name: "byte-order mark", src: "\xef\xbb\xbfset a = 1\r\n",
		want: []Stmt{{1, StmtSet, "a", []string{"1"}, nil}}},
	{name: "byte-order mark only at the start", src: "set a = 1\n\xef\xbb\xbfset b = 2\n", err: `x:2: syntax: unknown statement "\ufeffset", want set, putenv or a command (name -option value ...)`},
	{name: "case of keyword and name", src: "SET Scd_This_Node_First = y\n",
		want: []Stmt{{1, StmtSet, "scd_this_node_first", []string{"y"}, nil}}},
	{name: "putenv", src: "putenv LANG C\nputenv MSG \"a b # c\"\nputenv EMPTY \"\"\n",
		want: []Stmt{{1, StmtPutenv, "LANG", []string{"C"}, nil}, {2, StmtPutenv, "MSG", []string{"a b # c"}, nil}, {3, StmtPutenv, "EMPTY", []string{""}, nil}}},
	{name: "empty quoted value", src: `set a = ""`,
		want: []Stmt{{1, StmtSet, "a", []string{""}, nil}}},

	{name: "command", src: "scdmulti -g heavy -m 2 -p \"12010\" # a group\nSCDMULTI -g b -p 1\nscdmulti\n",
		want: []Stmt{{1, StmtCommand, "scdmulti", nil, []Flag{{"g", "heavy"}, {"m", "2"}, {"p", "12010"}}},
			{2, StmtCommand, "scdmulti", nil, []Flag{{"g", "b"}, {"p", "1"}}},
			{3, StmtCommand, "scdmulti", nil, nil}}},
	{name: "command option twice", src: "scdmulti -g a -g b\n", err: `x:1: scdmulti: option -g given twice`},
	{name: "command option without value", src: "scdmulti -g\n", err: `x:1: scdmulti: option -g: missing value`},
	{name: "command value without option", src: "scdmulti -g a b\n", err: `x:1: scdmulti: want an option (-letter value), got "b"`},
	{name: "command long option", src: "scdmulti --group a\n", err: `x:1: syntax: unknown statement "scdmulti", want set, putenv or a command (name -option value ...)`},
	{name: "unknown statement", src: "\nfoo a = 1\n", err: `x:2: syntax: unknown statement "foo", want set, putenv or a command (name -option value ...)`},
	{name: "starts with =", src: "= 1\n", err: `x:1: syntax: statement starts with "=", want set or putenv`},
	{name: "set without name", src: "set = 1\n", err: `x:1: syntax: set: want an operand name, got "="`},
	{name: "bad name", src: "set 9a = 1\n", err: `x:1: syntax: set: want an operand name, got "9a"`},
	{name: "missing equals", src: "set a 1\n", err: `x:1: a: want '=' after the operand, got "1"`},
	{name: "missing value", src: "set a =\n", err: `x:1: a: missing value after '='`},
	{name: "missing value after comma", src: "set a = 1,\n", err: `x:1: a: missing value after ','`},
	{name: "double comma", src: "set a = 1,,2\n", err: `x:1: a: missing value after ','`},
	{name: "blank in value", src: "set a = b c\n", err: `x:1: a: unexpected "c" after value "b" (quote values that hold blanks)`},
	{name: "unterminated string", src: "\n\nset a = \"abc\nset b = 1\n", err: `x:3: syntax: unterminated string (a closing " is missing)`},
	{name: "unterminated at eof", src: `set a = "abc`, err: `x:1: syntax: unterminated string (a closing " is missing)`},
	{name: "text after quote", src: `set a = "abc"d`, err: `x:1: a: unexpected 'd' right after a closing quote`},
	{name: "quote inside word", src: `set a = ab"c"`, err: `x:1: a: unexpected quote inside "ab\""`},
	{name: "duplicate set", src: "set a = 1\n\nset A = 2\n", err: `x:3: a: set twice (first at line 1)`},
	{name: "duplicate putenv", src: "putenv A 1\nputenv A 2\n", err: `x:2: putenv: A given twice (first at line 1)`},
	{name: "putenv without value", src: "putenv A\n", err: `x:1: putenv: A: missing value (write "" for an empty one)`},
	{name: "putenv bad name", src: "putenv 1A b\n", err: `x:1: putenv: want an environment variable name, got "1A"`},
	{name: "putenv two values", src: "putenv A b c\n", err: `x:1: putenv: A: unexpected "c" after the value (quote values that hold blanks)`},
	{name: "NUL in a value", src: "set a = \"x\x00y\"\n", err: `x:1: a: a NUL byte in the value (a definition file is text)`},
	{name: "NUL in a list", src: "set a = b,\\\n c\x00\n", err: `x:1: a: a NUL byte in the value (a definition file is text)`},
	{name: "NUL in putenv", src: "putenv A \"x\x00\"\n", err: `x:1: putenv: A: a NUL byte in the value (a definition file is text)`},
	{name: "NUL in a command", src: "scdmulti -g a\x00 -p 1\n", err: `x:1: scdmulti: option -g: a NUL byte in the value (a definition file is text)`},
	{name: "error line after continuation", src: "set a = 1, \\\n 2\nset b = \n", err: `x:3: b: missing value after '='`},
}

func TestParse(t *testing.T) {
	for _, tc := range syntaxCases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse("x", []byte(tc.src))
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("error = %v, want %s", err, tc.err)
				}
				var e *Error
				if !errors.As(err, &e) || e.File != "x" || e.Line < 1 {
					t.Fatalf("error %#v is not a *Error for x with a line", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("error = %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got  %#v\nwant %#v", got, tc.want)
			}
		})
	}
}

func TestErrorFormat(t *testing.T) {
	for _, tc := range []struct {
		e    Error
		want string
	}{
		{Error{"usr/echo", 7, "parallel_count", "resident 3 exceeds max 2"}, "usr/echo:7: parallel_count: resident 3 exceeds max 2"},
		{Error{"environment", 0, "DCHOST", "bad host"}, "environment: DCHOST: bad host"},
	} {
		if got := tc.e.Error(); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
}

func TestSplitHostPort(t *testing.T) {
	for _, tc := range []struct {
		in   string
		def  int
		host string
		port int
		err  bool
	}{
		{"host1", 12000, "host1", 12000, false},
		{"host1:80", 12000, "host1", 80, false},
		{"10.0.0.1:65535", 1, "10.0.0.1", 65535, false},
		{"[::1]:9", 1, "::1", 9, false},
		{"[::1]", 5, "::1", 5, false},
		{"::1", 5, "::1", 5, false},
		{"a.b-c_d.example", 5, "a.b-c_d.example", 5, false},
		{"host", 0, "", 0, true},
		{"", 5, "", 0, true},
		{":80", 5, "", 0, true},
		{"h:", 5, "", 0, true},
		{"h:0", 5, "", 0, true},
		{"h:65536", 5, "", 0, true},
		{"h:x", 5, "", 0, true},
		{"h:-1", 5, "", 0, true},
		{"[::1", 5, "", 0, true},
		{"[::1]x", 5, "", 0, true},
		{"[host]:1", 5, "", 0, true},
		{"a::b::c", 5, "", 0, true},
		{"bad host", 5, "", 0, true},
		{"a..b", 5, "", 0, true},
	} {
		h, p, err := SplitHostPort(tc.in, tc.def)
		if (err != nil) != tc.err || h != tc.host || p != tc.port {
			t.Errorf("SplitHostPort(%q, %d) = %q, %d, %v", tc.in, tc.def, h, p, err)
		}
	}
}

// TestParseBoundsStatements: a file may have maxStatements statements; at
// the next one Parse stops with an error at its line. Without the bound a
// file of 16 MiB of one-letter lines (8 M statements, each a command
// without options) made Load take 3.3 GB and 38 s, and an error message
// of 284 MB: a bound on bytes alone let each two bytes become a statement
// and an error of a few hundred.
func TestParseBoundsStatements(t *testing.T) {
	for _, tc := range []struct {
		name string
		src  string
		n    int    // statements returned
		err  string // the whole error, when not ""
	}{
		{"at the bound", strings.Repeat("x\n", maxStatements), maxStatements, ""},
		{"at the bound, no final newline", strings.Repeat("x\n", maxStatements-1) + "x", maxStatements, ""},
		{"blank lines and comments are none", strings.Repeat("x\n\n# c\n", maxStatements), maxStatements, ""},
		{"one past", strings.Repeat("x\n", maxStatements+1), maxStatements,
			"x:65537: syntax: more than 65536 statements in the file: the rest is not read"},
		{"one past, no final newline", strings.Repeat("x\n", maxStatements) + "x", maxStatements,
			"x:65537: syntax: more than 65536 statements in the file: the rest is not read"},
		{"continued", strings.Repeat("x -a 1 \\\n -b 2\n", maxStatements) + "x\n" + strings.Repeat("x\n", 1000), maxStatements,
			"x:131073: syntax: more than 65536 statements in the file: the rest is not read"},
		{"16 MiB of them", strings.Repeat("x\n", maxDefinitionSize/2), maxStatements,
			"x:65537: syntax: more than 65536 statements in the file: the rest is not read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse("x", []byte(tc.src))
			if (err == nil) != (tc.err == "") || (err != nil && err.Error() != tc.err) {
				t.Fatalf("error = %.300v, want %q", err, tc.err)
			}
			if len(got) != tc.n {
				t.Fatalf("%d statements, want %d", len(got), tc.n)
			}
		})
	}
}
