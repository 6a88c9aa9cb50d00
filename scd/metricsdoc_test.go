package scd

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"tpsched/netio/rpcport"
	"tpsched/scd/wlmnode"
)

// registered finds the tpsched_ families the module's code registers: the
// name a metrics constructor (or the node's counter of a value kept
// elsewhere) is given, and the families of the histograms written by hand.
var registered = regexp.MustCompile("\\b(?:New\\w*|GetOrCreate\\w+|CounterFunc|counter)\\(\\s*(?:fmt\\.Sprintf\\()?[`\"](tpsched_[a-z0-9_]+)|const family = \"(tpsched_[a-z0-9_]+)\"")

// TestEveryFamilyHasHelpAndIsDocumented: every tpsched_ family the code
// registers has HELP text, every family with HELP text is in
// docs/METRICS.md, and every family METRICS.md names is one the code has
// (but those of its paragraph on renamed families). Families a test node
// does not expose (a receiver group's, a misdirected call's) escaped the
// checks on a scraped /metrics: nine were missing from METRICS.md, and
// tpsched_receiver_misdirected_total had no HELP text.
func TestEveryFamilyHasHelpAndIsDocumented(t *testing.T) {
	help := map[string]bool{}
	for _, table := range []map[string]string{metricHelp, rpcport.MetricHelp, wlmnode.MetricHelp} {
		for name := range table {
			if strings.HasPrefix(name, "tpsched_") {
				help[name] = true
			}
		}
	}

	var code []string
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != ".." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range registered.FindAllStringSubmatch(string(b), -1) {
			name := m[1] + m[2]
			code = append(code, name)
			if !help[name] {
				t.Errorf("%s registers %s, which no HELP table (metricHelp, rpcport.MetricHelp, wlmnode.MetricHelp) knows", path, name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(code) < 50 {
		t.Fatalf("found only %d registrations: the pattern no longer matches the code", len(code))
	}

	doc, err := os.ReadFile("../docs/METRICS.md")
	if err != nil {
		t.Fatal(err)
	}
	text, _, _ := strings.Cut(string(doc), "Renamed in this version")
	// tpsched_wlm_{a,b}_seconds_total names a family per alternative.
	alternatives := regexp.MustCompile(`(tpsched_[a-z0-9_]*)\{([a-z0-9_,]+)\}([a-z0-9_]*)`)
	text = alternatives.ReplaceAllStringFunc(text, func(s string) string {
		m := alternatives.FindStringSubmatch(s)
		var out []string
		for _, alt := range strings.Split(m[2], ",") {
			out = append(out, m[1]+alt+m[3])
		}
		return strings.Join(out, " ")
	})
	documented := map[string]bool{}
	for _, name := range regexp.MustCompile(`tpsched_[a-z0-9_]+`).FindAllString(text, -1) {
		documented[name] = true
		if !help[name] {
			t.Errorf("docs/METRICS.md names %s, which the code does not have", name)
		}
	}
	var missing []string
	for name := range help {
		if !documented[name] {
			missing = append(missing, name)
		}
	}
	slices.Sort(missing)
	for _, name := range missing {
		t.Errorf("docs/METRICS.md does not name %s", name)
	}
}
