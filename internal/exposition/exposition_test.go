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

// TestWriteRenamesTheLibrarysFamilies: the library's families that break
// Prometheus' naming rules leave under their new names and types, their
// HELP, TYPE and sample lines alike; other lines, and names that only
// start like them, are left as they are (issue 23, item 8).
func TestWriteRenamesTheLibrarysFamilies(t *testing.T) {
	src := "# HELP go_cgo_calls_count\n# TYPE go_cgo_calls_count counter\ngo_cgo_calls_count 7\n" +
		"# HELP go_cpu_count\n# TYPE go_cpu_count gauge\ngo_cpu_count 2\n" +
		"# HELP process_io_read_bytes_total\n# TYPE process_io_read_bytes_total gauge\nprocess_io_read_bytes_total 123\n" +
		"# HELP go_cpu_count_x\n# TYPE go_cpu_count_x gauge\ngo_cpu_count_x{a=\"go_cpu_count\"} 1\n" +
		"# TYPE go_gc_forced_count counter\ngo_gc_forced_count{x=\"y\"} 3"
	var out bytes.Buffer
	if err := Write(&out, []byte(src), Runtime); err != nil {
		t.Fatal(err)
	}
	want := "# HELP go_cgo_calls_total " + Runtime["go_cgo_calls_total"] + "\n# TYPE go_cgo_calls_total counter\ngo_cgo_calls_total 7\n" +
		"# HELP go_cpus " + Runtime["go_cpus"] + "\n# TYPE go_cpus gauge\ngo_cpus 2\n" +
		"# HELP process_io_read_bytes_total " + Runtime["process_io_read_bytes_total"] + "\n# TYPE process_io_read_bytes_total counter\nprocess_io_read_bytes_total 123\n" +
		"# HELP go_cpu_count_x\n# TYPE go_cpu_count_x gauge\ngo_cpu_count_x{a=\"go_cpu_count\"} 1\n" +
		"# TYPE go_gc_forced_total counter\ngo_gc_forced_total{x=\"y\"} 3"
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
	for old, r := range Renamed {
		if Runtime[r.Name] == "" {
			t.Errorf("%s becomes %s, which Runtime has no HELP text for", old, r.Name)
		}
		if old != r.Name && Runtime[old] != "" {
			t.Errorf("Runtime still has HELP text for the old name %s", old)
		}
	}
}
