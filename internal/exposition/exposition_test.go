package exposition

import (
	"bytes"
	"testing"
)

func TestWriteFillsBareHelpLines(t *testing.T) {
	src := "# HELP a_total\n# TYPE a_total counter\na_total 1\n" +
		"# HELP b has its own text\n# TYPE b gauge\nb 2\n" +
		"# HELP c\n# TYPE c gauge\nc{x=\"# HELP d\"} 3\n" +
		"# HELP e_seconds\n# TYPE e_seconds histogram\ne_seconds_bucket{le=\"+Inf\"} 0"
	var out bytes.Buffer
	err := Write(&out, []byte(src),
		map[string]string{"a_total": "A counter \\ with a\nline feed.", "b": "not used: b has text"},
		map[string]string{"a_total": "not used: the first table has it", "e_seconds": "E."})
	if err != nil {
		t.Fatal(err)
	}
	want := "# HELP a_total A counter \\\\ with a\\nline feed.\n# TYPE a_total counter\na_total 1\n" +
		"# HELP b has its own text\n# TYPE b gauge\nb 2\n" +
		"# HELP c\n# TYPE c gauge\nc{x=\"# HELP d\"} 3\n" + // no table knows c: left bare for the tests to find
		"# HELP e_seconds E.\n# TYPE e_seconds histogram\ne_seconds_bucket{le=\"+Inf\"} 0"
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
}
