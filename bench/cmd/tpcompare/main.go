// Command tpcompare compares two builds of tpsched from the grid reports
// of a session that alternated between them (tools/bench-ab.sh makes
// one): every run of a cell pooled per build, and the throughput ratios
// to the peers (the bare echo, Enduro/X, the direct call) taken within
// each report, then their median. It prints Markdown.
//
//	tpcompare -before 'ab/before-*' -after 'ab/after-*'
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"tpsched/bench"
)

func main() {
	before := flag.String("before", "", "a glob of the before build's report directories")
	after := flag.String("after", "", "a glob of the after build's report directories")
	flag.Parse()
	if *before == "" || *after == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: tpcompare -before GLOB -after GLOB")
		os.Exit(2)
	}
	dirs := func(glob string) []string {
		d, err := filepath.Glob(glob)
		if err != nil || len(d) == 0 {
			fmt.Fprintf(os.Stderr, "tpcompare: no report directory matches %q\n", glob)
			os.Exit(1)
		}
		return d
	}
	out, err := bench.Compare(dirs(*before), dirs(*after), bench.CompareRatios)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tpcompare:", err)
		os.Exit(1)
	}
	fmt.Print(out)
}
