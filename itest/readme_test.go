package itest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"tpsched/internal/freeport"
)

// readmeSection is the text of the section that starts with the heading
// line head, in the README or the docs/ pages its reference moved to
// (issue 31 item 7), up to the next heading of its level or above (of
// level 2 or more: a line "# ..." in a code block is a comment).
func readmeSection(t *testing.T, head string) string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(repoRoot(t), "docs", "*.md"))
	must(t, err)
	var text string
	i := -1
	for _, p := range append([]string{filepath.Join(repoRoot(t), "README.md")}, pages...) {
		b, err := os.ReadFile(p)
		must(t, err)
		if i = strings.Index(string(b), "\n"+head+"\n"); i >= 0 {
			text = string(b)
			break
		}
	}
	if i < 0 {
		t.Fatalf("neither README.md nor docs/*.md has a section %q", head)
	}
	rest := text[i+len(head)+2:]
	level := strings.Repeat("#", strings.Count(strings.Fields(head)[0], "#"))
	if j := regexp.MustCompile(`\n#{2,` + fmt.Sprint(len(level)) + `} `).FindStringIndex(rest); j != nil {
		rest = rest[:j[0]]
	}
	return rest
}

// codeBlocks are the fenced blocks of text, by their language ("" for
// none), in order.
func codeBlocks(text string) (blocks, langs []string) {
	for _, m := range regexp.MustCompile("(?s)```([a-z]*)\n(.*?)```").FindAllStringSubmatch(text, -1) {
		langs = append(langs, m[1])
		blocks = append(blocks, m[2])
	}
	return blocks, langs
}

// TestClusterOnOneHostFromREADME: the README's section "A cluster on one
// host" is enough to run two nodes on one machine (issue 23, item 1: the
// section on clusters never said that each node needs its own
// metrics_address, so the second node stopped). Its definition blocks
// ("# n1/sysconf" ...) are written as they are, but for the ports, which
// the test takes free on both addresses (rpc_port and name_port added,
// 12001 replaced) and each node's control socket in its directory; the
// section's chmod lines run as written, and neither node may warn about
// its definitions (issue 31 item 5); its scdctl commands are then run as
// written: a call through n1 served by n2, status listing both nodes, a
// hold on n2.
func TestClusterOnOneHostFromREADME(t *testing.T) {
	skipShort(t)
	sec := readmeSection(t, "### A cluster on one host")
	ips := []string{"127.0.0.2", "127.0.0.3"}
	ports, err := freeport.Common(ips, 3)
	must(t, err)
	base := t.TempDir()
	blocks, langs := codeBlocks(sec)
	var commands, chmods []string
	nodes := map[string]bool{}
	for i, b := range blocks {
		if langs[i] == "sh" {
			for _, line := range strings.Split(b, "\n") {
				switch {
				case strings.HasPrefix(line, "bin/scdctl "):
					commands = append(commands, line)
				case strings.HasPrefix(line, "chmod "):
					chmods = append(chmods, line)
				}
			}
			continue
		}
		first, body, _ := strings.Cut(b, "\n")
		file, ok := strings.CutPrefix(first, "# ")
		if !ok {
			t.Fatalf("a definition block of the section does not start with '# node/file':\n%s", b)
		}
		node, _, _ := strings.Cut(file, "/")
		nodes[node] = true
		if strings.HasSuffix(file, "/sysconf") {
			if !strings.Contains(body, "set metrics_address = ") {
				t.Errorf("%s sets no metrics_address: two nodes on one host would both take 127.0.0.1:12001", file)
			}
			body = strings.ReplaceAll(body, ":12001", fmt.Sprintf(":%d", ports[2])) +
				fmt.Sprintf("set rpc_port = %d\nset name_port = %d\n", ports[0], ports[1]) + ownControlSocket
		}
		p := filepath.Join(base, filepath.FromSlash(file))
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, []byte(body), 0o644))
	}
	if len(nodes) != 2 || !nodes["n1"] || !nodes["n2"] || len(commands) < 3 {
		t.Fatalf("the section defines nodes %v and scdctl commands %q; want n1, n2 and three commands", nodes, commands)
	}
	// The section's chmod lines, as written but for the directories: the
	// files were written 0644, as an editor would (issue 31 item 5: the
	// recipe warned on its own files).
	for _, line := range chmods {
		line, _, _ = strings.Cut(line, "#")
		args := strings.Fields(line)[1:]
		for j, a := range args {
			if node, _, ok := strings.Cut(a, "/"); ok && nodes[node] {
				args[j] = filepath.Join(base, filepath.FromSlash(a))
			}
		}
		if out, err := exec.Command("chmod", args...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", line, err, out)
		}
	}
	n1 := startNode(t, "-c", filepath.Join(base, "n1"))
	n2 := startNode(t, "-c", filepath.Join(base, "n2"))
	waitFor(t, 20*time.Second, "n1 to know that n2 runs work", func() bool { return knowsGroup(t, n1, "n2", "work") },
		func() string { return n1.stderr.String() + n2.stderr.String() })
	// The definitions' warnings are logged before the node starts, so
	// they are in the log by now.
	for name, n := range map[string]*node{"n1": n1, "n2": n2} {
		for _, l := range strings.Split(n.stderr.String(), "\n") {
			if strings.Contains(l, "level=WARN") && strings.Contains(l, "sysconf:") {
				t.Errorf("%s warns on the recipe's own definitions: %s", name, l)
			}
		}
	}

	want := []string{"hello\n", "n2", "held service group work"}
	for i, line := range commands {
		line, _, _ = strings.Cut(line, "#")
		args := strings.Fields(line)[1:]
		for j, a := range args {
			if a == "n1" || a == "n2" { // -c NODE: the node's directory
				args[j] = filepath.Join(base, a)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, bin("scdctl"), args...)
		cmd.Env = append(os.Environ(), "DCCONFPATH=", "TPSCHED_RPC=", "TPSCHED_HTTP=", "TPSCHED_CONTROL_SOCKET=")
		out, err := cmd.CombinedOutput()
		cancel()
		t.Logf("$ %s\n%s", line, out)
		if err != nil || i < len(want) && !strings.Contains(string(out), want[i]) {
			t.Errorf("%s: %v\n%s", line, err, out)
		}
	}
	if st := groupStatus(t, n2, "work"); !st.Held || st.Processed != 1 {
		t.Errorf("n2's work: held %v, processed %d; want held, the one call", st.Held, st.Processed)
	}
}

// TestPolicyExampleIsTheREADMEs: examples/policy, which make policy-demo
// runs, holds the README's svcpolicy (statement for statement, comments
// aside) and its definitions pass scdd -check (issue 23, item 11).
func TestPolicyExampleIsTheREADMEs(t *testing.T) {
	skipShort(t)
	blocks, _ := codeBlocks(readmeSection(t, "## Goals and application environments (the routing manager)"))
	statements := func(text string) []string {
		var out []string
		for _, line := range strings.Split(text, "\n") {
			line, _, _ = strings.Cut(line, "#")
			if f := strings.Fields(line); len(f) > 0 {
				out = append(out, strings.Join(f, " "))
			}
		}
		return out
	}
	var readme []string
	for _, b := range blocks {
		if strings.HasPrefix(b, "# svcpolicy\n") {
			readme = statements(b)
		}
	}
	file, err := os.ReadFile(filepath.Join(repoRoot(t), "examples", "policy", "svcpolicy"))
	must(t, err)
	if got := statements(string(file)); len(readme) == 0 || strings.Join(got, "\n") != strings.Join(readme, "\n") {
		t.Errorf("examples/policy/svcpolicy:\n%s\nthe README's:\n%s", strings.Join(got, "\n"), strings.Join(readme, "\n"))
	}
	out, err := exec.Command(bin("scdd"), "-check", "-c", filepath.Join(repoRoot(t), "examples", "policy")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "2 user server(s), definitions OK") {
		t.Errorf("scdd -check -c examples/policy: %v\n%s", err, out)
	}
}

// docPages are the README and the docs/ pages, relative to the repository.
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(repoRoot(t), "docs", "*.md"))
	must(t, err)
	out := []string{"README.md"}
	for _, p := range pages {
		out = append(out, filepath.Join("docs", filepath.Base(p)))
	}
	return out
}

// headingAnchors are the anchors GitHub gives the headings of a Markdown
// text (lower case, punctuation but - and _ dropped, spaces as -), code
// blocks left out.
func headingAnchors(text string) map[string]bool {
	out := map[string]bool{}
	drop := regexp.MustCompile(`[^\p{L}\p{N}_\- ]`)
	for _, l := range strings.Split(regexp.MustCompile("(?s)```.*?```").ReplaceAllString(text, ""), "\n") {
		if h, ok := strings.CutPrefix(strings.TrimLeft(l, "#"), " "); ok && strings.HasPrefix(l, "#") {
			out[strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(strings.TrimSpace(h)), ""), " ", "-")] = true
		}
	}
	return out
}

// TestDocLinks: every relative link of the README and the docs/ pages
// names a file of the repository, and an anchor a heading of its page
// (issue 31 item 7 moved the README's reference into docs/: a link moved
// with its text must still land).
func TestDocLinks(t *testing.T) {
	root := repoRoot(t)
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	scheme := regexp.MustCompile(`^[a-z]+:`)
	for _, page := range docPages(t) {
		b, err := os.ReadFile(filepath.Join(root, page))
		must(t, err)
		text := regexp.MustCompile("(?s)```.*?```").ReplaceAllString(string(b), "")
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if scheme.MatchString(target) {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			file := filepath.Join(root, page)
			if path != "" {
				file = filepath.Join(root, filepath.Dir(page), path)
			}
			body, err := os.ReadFile(file)
			if err != nil {
				if _, serr := os.Stat(file); serr != nil {
					t.Errorf("%s: link %s: %v", page, target, serr)
				}
				continue // a directory
			}
			if anchor != "" && strings.HasSuffix(file, ".md") && !headingAnchors(string(body))[anchor] {
				t.Errorf("%s: link %s: no heading with that anchor in %s", page, target, path)
			}
		}
	}
}

// TestREADMEFirstScreen: the README is what tpsched is, the two commands
// and a map (issue 31 item 7): it fits a screen or two, its one command
// block is make demo and make test, each a target of the Makefile, and
// it links every docs/ page.
func TestREADMEFirstScreen(t *testing.T) {
	root := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	must(t, err)
	readme := string(b)
	if n := strings.Count(readme, "\n"); n > 60 {
		t.Errorf("README.md has %d lines: keep it to what tpsched is, the two commands and the map", n)
	}
	blocks, _ := codeBlocks(readme)
	if len(blocks) != 1 {
		t.Fatalf("README.md has %d command blocks, want the one with make demo and make test", len(blocks))
	}
	var cmds []string
	for _, l := range strings.Split(strings.TrimSpace(blocks[0]), "\n") {
		c, _, _ := strings.Cut(l, "#")
		cmds = append(cmds, strings.TrimSpace(c))
	}
	if strings.Join(cmds, "; ") != "make demo; make test" {
		t.Errorf("README.md's commands are %q, want make demo and make test", cmds)
	}
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	must(t, err)
	for _, target := range []string{"demo", "test"} {
		if !regexp.MustCompile(`(?m)^` + target + `: .*## `).Match(mk) {
			t.Errorf("the Makefile has no documented target %s", target)
		}
	}
	for _, page := range docPages(t)[1:] {
		if !strings.Contains(readme, "]("+page+")") {
			t.Errorf("README.md's map does not link %s", page)
		}
	}
}
