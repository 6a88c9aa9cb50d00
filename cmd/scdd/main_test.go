package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tpsched/internal/testenv"
)

// buildScdd builds this command into a temporary directory.
func buildScdd(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "scdd")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestCheck: scdd -check refuses what start-up refuses, a module that
// cannot be found or run among it, with the file and line, and prints the
// start-up warnings. Nothing is started.
func TestCheck(t *testing.T) {
	bin := buildScdd(t)
	write := func(dir, name, text string, mode os.FileMode) {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), mode); err != nil {
			t.Fatal(err)
		}
	}
	const usr = "set service_group = g\nset service = s\nset module = %s\n"
	elf, err := os.ReadFile("/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	const key = "set cluster_key = \"0123456789abcdef\"\n"
	for _, tc := range []struct {
		name   string
		files  map[string]string // name -> text; a name ending in * is written executable (without the *), in + 0700
		code   int
		stderr string // what stderr must hold; DIR stands for the definition directory
		stdout string
		closed bool // the definition directory is under a 0700 directory (root only)
	}{
		{name: "module in aplib",
			files: map[string]string{"aplib/uap*": "#!/bin/sh\n", "usr/x": strings.Replace(usr, "%s", "uap", 1)},
			code:  0, stdout: "scdd: 1 user server(s), definitions OK"},
		{name: "module by bare name nowhere",
			files: map[string]string{"usr/x": strings.Replace(usr, "%s", "no-such-uap-tpsched", 1)},
			code:  1, stderr: `scdd: usr/x:3: module: "no-such-uap-tpsched" not found in [DIR/aplib `},
		{name: "module not executable",
			files: map[string]string{"bin/uap": "#!/bin/sh\n", "usr/x": strings.Replace(usr, "%s", "bin/uap", 1)},
			code:  1, stderr: "scdd: usr/x:3: module: DIR/bin/uap is not an executable file"},
		{name: "absolute module missing, set in usrrc",
			files: map[string]string{"usrrc": "\nset module = /nonexistent/tpsched/uap\n", "usr/x": "set service_group = g\nset service = s\n"},
			code:  1, stderr: "scdd: usrrc:2: module: /nonexistent/tpsched/uap does not exist"},
		{name: "warning",
			files: map[string]string{"sysconf": "set rpc_address = \"0.0.0.0\"\n", "aplib/uap*": "#!/bin/sh\n", "usr/x": strings.Replace(usr, "%s", "uap", 1)},
			code:  0, stderr: "scdd: warning: sysconf: rpc_address 0.0.0.0 is not loopback and there is no cluster_key", stdout: "definitions OK"},
		{name: "definition error",
			files: map[string]string{"usr/x": strings.Replace(usr, "%s", "uap", 1) + "set paralel_count = 2\n"},
			code:  1, stderr: "scdd: usr/x:4: paralel_count: unknown operand (did you mean parallel_count?)"},
		// Every error of the directory in one run (issue 23, item 5): two
		// definition errors in two files and the module of a third
		// server, which read without error; the count after them.
		{name: "every error",
			files: map[string]string{
				"sysconf": "set node_id = n\nset metrics_adress = \"127.0.0.1:1\"\n",
				"usr/x":   strings.Replace(usr, "%s", "uap", 1) + "set paralel_count = 2\nset queue_size = 0\n",
				"usr/y":   "set service_group = h\nset service = s\nset module = no-such-uap-tpsched\n",
			},
			code: 1, stderr: "scdd: sysconf:2: metrics_adress: unknown operand (did you mean metrics_address?)\n" +
				"scdd: usr/x:4: paralel_count: unknown operand (did you mean parallel_count?)\n" +
				"scdd: usr/x:5: queue_size: 0 out of range 1..65536\n" +
				"scdd: usr/y:3: module: \"no-such-uap-tpsched\" not found in [DIR/aplib ",
		},
		// Issue 19 item 12: cluster_key where every UAP can read it.
		{name: "cluster key in a readable sysconf",
			files: map[string]string{"sysconf": key, "aplib/uap*": "#!/bin/sh\n", "usr/x": strings.Replace(usr, "%s", "uap", 1)},
			code:  0, stderr: "scdd: warning: sysconf: it holds cluster_key and users other than its owner can read it (mode 0644)", stdout: "definitions OK"},
		{name: "cluster key file readable by all",
			files: map[string]string{"sysconf": "set cluster_key_file = key\n", "key": "0123456789abcdef", "aplib/uap*": "#!/bin/sh\n",
				"usr/x": strings.Replace(usr, "%s", "uap", 1)},
			code: 1, stderr: "scdd: sysconf:1: cluster_key_file: DIR/key is readable by every user (mode 0644), so every UAP can read the key: chmod 600 it"},
		// Issue 19 item 22 (root: the UAPs run as users of their own): a
		// binary under a directory they cannot enter runs (through scdd's
		// descriptor), a script there does not, and -check says why.
		{name: "binary under a closed directory", closed: true,
			files: map[string]string{"aplib/uap*": string(elf), "usr/x": strings.Replace(usr, "%s", "uap", 1)},
			code:  0, stdout: "definitions OK"},
		{name: "script under a closed directory", closed: true,
			files: map[string]string{"aplib/uap*": "#!/bin/sh\n", "usr/x": strings.Replace(usr, "%s", "uap", 1)},
			code:  1, stderr: "scdd: usr/x:3: module: DIR/aplib/uap is a script, run by its path, and uid "},
		{name: "binary its user cannot execute", closed: true,
			files: map[string]string{"aplib/uap+": string(elf), "usr/x": strings.Replace(usr, "%s", "uap", 1)},
			code:  1, stderr: "is not executable by uid "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.closed {
				testenv.RequireRoot(t, "the UAPs run as users of their own only under a root scdd")
			}
			// A directory the UAPs' users can reach, or one under a
			// closed one (as a clone in /root is).
			top, err := os.MkdirTemp("", "scdd-check-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(top) })
			mode := os.FileMode(0o755)
			if tc.closed {
				mode = 0o700
			}
			if err := os.Chmod(top, mode); err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(top, "defs")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			for name, text := range tc.files {
				mode := os.FileMode(0o644)
				if strings.HasSuffix(name, "*") {
					name, mode = strings.TrimSuffix(name, "*"), 0o755
				}
				if strings.HasSuffix(name, "+") {
					name, mode = strings.TrimSuffix(name, "+"), 0o700
				}
				write(dir, name, text, mode)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "-check", "-c", dir)
			cmd.Env = append(os.Environ(), "PATH=/nonexistent") // the module must not come from the caller's PATH
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err = cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			want := strings.ReplaceAll(tc.stderr, "DIR", dir)
			if code != tc.code || !strings.Contains(stderr.String(), want) || !strings.Contains(stdout.String(), tc.stdout) {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s\nwant in stderr: %s\nwant in stdout: %s",
					code, tc.code, stdout.String(), stderr.String(), want, tc.stdout)
			}
		})
	}
}

// TestArgumentNotAFlag: `scdd /etc/tpsched` (the directory without -c)
// says what is wrong and what to give instead, and exits 2. It printed the
// whole usage and nothing about the argument.
func TestArgumentNotAFlag(t *testing.T) {
	bin := buildScdd(t)
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "-check", "/etc/tpsched")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("exit %v, want 2 (stderr %q)", err, stderr.String())
	}
	want := `scdd: unexpected argument "/etc/tpsched": scdd takes flags only (the definition directory is -c DIR; scdd -h lists the flags)` + "\n"
	if stderr.String() != want || stdout.Len() != 0 {
		t.Errorf("stderr %q, stdout %q; want stderr %q", stderr.String(), stdout.String(), want)
	}
}
