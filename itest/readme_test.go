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

// readmeSection is the text of the README section that starts with the
// heading line head, up to the next heading of its level or above (of
// level 2 or more: a line "# ..." in a code block is a comment).
func readmeSection(t *testing.T, head string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	must(t, err)
	text := string(b)
	i := strings.Index(text, "\n"+head+"\n")
	if i < 0 {
		t.Fatalf("README.md has no section %q", head)
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
