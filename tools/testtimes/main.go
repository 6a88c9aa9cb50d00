// Command testtimes reads `go test -json` and says which tests were
// slowest. make test and make check pipe each module's run through it:
//
//	go test -json ./... | go run ./tools/testtimes -o .testtimes/test-root.json
//
// It copies the JSON to the -o file (under the gitignored .testtimes/),
// prints what plain `go test` would (each package's result line, and the
// whole output of a test that failed), and at the end the -n slowest tests
// and packages. Given files instead of a pipe it prints the slowest of
// them: go run ./tools/testtimes .testtimes/*.json
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

type timing struct {
	name    string // package, or package.Test
	sub     bool   // a subtest
	result  string
	elapsed float64
}

type collector struct {
	echo    io.Writer // nil: quiet (reading files)
	output  map[string][]string
	tests   []timing
	pkgs    []timing
	failed  []string
	skipped int
}

func main() {
	out := flag.String("o", "", "copy the JSON read from standard input to this file")
	n := flag.Int("n", 15, "how many of the slowest tests to print")
	flag.Parse()
	c := &collector{output: map[string][]string{}}
	if flag.NArg() == 0 {
		c.echo = os.Stdout
		var in io.Reader = os.Stdin
		if *out != "" {
			if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
				fmt.Fprintln(os.Stderr, "testtimes:", err)
				os.Exit(1)
			}
			f, err := os.Create(*out)
			if err != nil {
				fmt.Fprintln(os.Stderr, "testtimes:", err)
				os.Exit(1)
			}
			defer f.Close()
			in = io.TeeReader(os.Stdin, f)
		}
		c.read(in)
	} else {
		for _, name := range flag.Args() {
			f, err := os.Open(name)
			if err != nil {
				fmt.Fprintln(os.Stderr, "testtimes:", err)
				os.Exit(1)
			}
			c.read(f)
			f.Close()
		}
	}
	c.report(os.Stdout, *n, *out)
}

func (c *collector) read(r io.Reader) {
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 1<<20), 64<<20)
	for s.Scan() {
		line := s.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			// Not an event (a build failure's text): pass it on.
			if c.echo != nil {
				fmt.Fprintln(c.echo, string(line))
			}
			continue
		}
		key := e.Package + " " + e.Test
		switch e.Action {
		case "output", "build-output":
			if e.Test == "" {
				// The package's own lines: ok/FAIL, a panic, TestMain's.
				if c.echo != nil && !strings.HasPrefix(e.Output, "=== ") && e.Output != "PASS\n" {
					fmt.Fprint(c.echo, e.Output)
				}
				continue
			}
			c.output[key] = append(c.output[key], e.Output)
		case "pass", "fail", "skip":
			if e.Test == "" {
				c.pkgs = append(c.pkgs, timing{name: e.Package, result: e.Action, elapsed: e.Elapsed})
				continue
			}
			if e.Action == "skip" {
				c.skipped++
			} else {
				c.tests = append(c.tests, timing{name: e.Package + "." + e.Test, sub: strings.Contains(e.Test, "/"), result: e.Action, elapsed: e.Elapsed})
			}
			if e.Action == "fail" {
				c.failed = append(c.failed, e.Package+"."+e.Test)
				// A subtest's output is its parent's too: print it once,
				// at the top-level test.
				if c.echo != nil && !strings.Contains(e.Test, "/") {
					fmt.Fprint(c.echo, strings.Join(c.output[key], ""))
				}
			}
			if !strings.Contains(e.Test, "/") {
				for k := range c.output {
					if k == key || strings.HasPrefix(k, key+"/") {
						delete(c.output, k)
					}
				}
			}
		}
	}
}

func (c *collector) report(w io.Writer, n int, saved string) {
	top := c.tests[:0:0]
	for _, t := range c.tests {
		if !t.sub {
			top = append(top, t)
		}
	}
	sort.SliceStable(top, func(i, j int) bool { return top[i].elapsed > top[j].elapsed })
	sort.SliceStable(c.pkgs, func(i, j int) bool { return c.pkgs[i].elapsed > c.pkgs[j].elapsed })
	var total float64
	for _, t := range top {
		total += t.elapsed
	}
	fmt.Fprintf(w, "\ntesttimes: %d tests run (%d skipped), %d failed", len(top), c.skipped, len(c.failed))
	if saved != "" {
		fmt.Fprintf(w, "; the JSON is in %s", saved)
	}
	fmt.Fprintf(w, "\ntesttimes: the %d slowest tests (%.0f s of tests in all; parallel tests overlap):\n", min(n, len(top)), total)
	for _, t := range top[:min(n, len(top))] {
		fmt.Fprintf(w, "  %7.1fs  %-4s  %s\n", t.elapsed, t.result, t.name)
	}
	fmt.Fprintf(w, "testtimes: the slowest packages:\n")
	for _, p := range c.pkgs[:min(5, len(c.pkgs))] {
		fmt.Fprintf(w, "  %7.1fs  %-4s  %s\n", p.elapsed, p.result, p.name)
	}
	for _, f := range c.failed {
		fmt.Fprintf(w, "testtimes: FAIL %s\n", f)
	}
}
