package shm_test

import (
	"os"
	"strings"
	"testing"

	"tpsched/shm"
)

// closeAfterOneC serves one call, closes its tpsched_uap without having
// been told to leave, and lives on.
const closeAfterOneC = `#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <unistd.h>
#include "tpsched_uap.h"

static int echo(tpsched_call *call)
{
	(void)call;
	return TPSCHED_OK;
}

int main(void)
{
	char err[256];
	tpsched_uap *u = tpsched_attach(err, sizeof err);
	if (u == NULL) {
		fprintf(stderr, "%s\n", err);
		return 2;
	}
	tpsched_handle(u, "echo", echo, NULL);
	if (tpsched_serve_one(u) != 1) {
		fprintf(stderr, "serve one: %s\n", tpsched_error(u));
		return 1;
	}
	if (tpsched_close(u) != 0) {
		perror("tpsched_close");
		return 1;
	}
	pause(); /* the node learns that it left from the process, not its exit */
	return 0;
}
`

// TestUAPCloseSaysItLeaves: tpsched_close (and the Go library's Close)
// of a process that serving did not make leave says it leaves, as their
// docs have it, on shared memory (state left) and on a socket (a bye):
// the node hands it nothing more. Without the bye a socket process that
// closed was a ready one to the node, and after eofGrace one that broke
// the protocol.
func TestUAPCloseSaysItLeaves(t *testing.T) {
	prog := shm.CProgram(t, "close-after-one", closeAfterOneC)
	for _, im := range impls {
		t.Run(im.name, func(t *testing.T) {
			im.prog = func(testing.TB) (string, []string, []string) { return prog, nil, nil }
			if strings.HasPrefix(im.name, "go/") {
				im.prog = func(testing.TB) (string, []string, []string) {
					return os.Args[0], []string{"-test.run=^TestHelperUAP$", "-test.count=1"}, []string{shm.HelperUAPEnv + "=closeafterone"}
				}
			}
			n := im.group(t, 64)
			u := im.start(t, n)
			if c := call(t, n, u, "echo", []byte("one"), 0); c.Status != shm.StatusOK || string(c.Reply) != "one" {
				t.Fatalf("the call it serves: %v %q", c.Status, c.Reply)
			}
			until(t, n, "the closed process to say it left", u.Left)
		})
	}
}
