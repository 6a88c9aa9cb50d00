package itest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestCheckEntries: scdd -check -entries starts one process of each
// server and reports, with the definition's file and line, a service
// whose entry the module does not register and a module that never
// attaches; definitions whose modules register every entry pass, and
// plain -check starts nothing (issue 10: "echo=ecoh" passed -check).
func TestCheckEntries(t *testing.T) {
	skipShort(t)
	broken := bin("uap-broken-check")
	must(t, os.WriteFile(broken, []byte("#!/bin/sh\nexit 3\n"), 0o755))
	scdd := func(args ...string) (string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, bin("scdd"), args...)
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		checkRace(t, "scdd -check", out.String())
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			return out.String(), ee.ExitCode()
		case err != nil:
			t.Fatalf("scdd %v: %v", args, err)
		}
		return out.String(), 0
	}
	good := defDir(t, ownControlSocket, map[string]string{"alpha": echoDef("alpha", 2, 16, 4096), "beta": echoDef("beta", 1, 16, 4096)})
	if out, code := scdd("-check", "-entries", "-c", good); code != 0 || !strings.Contains(out, "every module registers its services' entries") {
		t.Errorf("good definitions: exit %d\n%s", code, out)
	}
	bad := defDir(t, ownControlSocket, map[string]string{
		"typo":   "set service_group = \"typo\"\nset service = \"echo=ecoh\", \"pid\"\nset module = MODULE\n",
		"broken": "set service_group = \"broken\"\nset service = \"echo\"\nset module = \"" + broken + "\"\n",
	})
	out, code := scdd("-check", "-entries", "-c", bad)
	if code != 1 || !strings.Contains(out, `usr/typo:2: service: entry "ecoh" of service echo is not registered by module`) ||
		!strings.Contains(out, "usr/broken:3: module: "+broken+": ") || strings.Contains(out, "pid\" of service pid") {
		t.Errorf("bad definitions: exit %d\n%s", code, out)
	}
	if out, code := scdd("-check", "-c", bad); code != 0 || strings.Contains(out, "ecoh") {
		t.Errorf("plain -check ran the modules or failed: exit %d\n%s", code, out)
	}
	if out, code := scdd("-entries", "-c", bad); code != 2 || !strings.Contains(out, "-entries goes with -check") {
		t.Errorf("-entries alone: exit %d\n%s", code, out)
	}
}
