package scd

import (
	"context"
	"testing"
	"time"

	"tpsched/procmgr"
	"tpsched/scd/local"
	"tpsched/shm"
)

// callAtStart is inProcess, but each process of group "a" calls b/echo
// between its attach and its Serve (an honest UAP that needs another
// service as it starts), and group "b"'s processes start only once such a
// call waits for them: the groups start in name order, so "a" runs while
// "b" has no process yet.
type callAtStart struct {
	inProcess
	n       *Node
	replies chan string
}

func (m *callAtStart) Start(spec procmgr.Spec, d procmgr.Delegate) (local.Processes, error) {
	switch spec.Group {
	case "a":
		s := &inProcServer{spec: spec, d: d, beforeServe: func(u *shm.UAP) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			reply, err := u.Call(ctx, "b", "echo", []byte("at start"))
			if err != nil {
				m.replies <- "error: " + err.Error()
				return
			}
			m.replies <- string(reply)
		}}
		for slot := range spec.Resident {
			if err := s.run(slot); err != nil {
				return nil, err
			}
		}
		return s, nil
	case "b":
		b, _ := m.n.local.Group("b")
		for end := time.Now().Add(5 * time.Second); b.InFlight() == 0 && time.Now().Before(end); {
			time.Sleep(time.Millisecond)
		}
	}
	return m.inProcess.Start(spec, d)
}

// TestLocalCallAtStart: a UAP that calls a group whose processes have not
// started yet (its name sorts later) gets its answer once they run; the
// node does not crash (issue 19 item 1: a nil pointer in group.submit's
// Kick) and both groups serve afterwards.
func TestLocalCallAtStart(t *testing.T) {
	const server = "set service = echo\nset module = MODULE\nset parallel_count = 2\n"
	pm := &callAtStart{replies: make(chan string, 2)}
	n := inProcNodeWith(t, "", map[string]string{
		"a": "set service_group = a\n" + server,
		"b": "set service_group = b\n" + server,
	}, func(n *Node) { pm.n, n.pm = n, pm })
	for range 2 {
		select {
		case r := <-pm.replies:
			if r != "at start" {
				t.Errorf("a UAP's call at start: %q", r)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a UAP's call at start was not answered in 10 s")
		}
	}
	c := inProcClient(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, g := range []string{"a", "b"} {
		if out, err := c.Call(ctx, g, "echo", []byte(g)); err != nil || string(out) != g {
			t.Errorf("%s/echo after the start: %q, %v", g, out, err)
		}
	}
}
