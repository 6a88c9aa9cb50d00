package scd

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tpsched/internal/testenv"
	"tpsched/scd/def"
	"tpsched/scd/wlm"
	"tpsched/scd/wlmnode"
)

// TestTakeoverCommitsOnlyOnLeft: the new process of a restart takes the
// old one's sockets, says it serves, and waits for "left", the old
// process's commit. The old process undoes the hand-over when its wait
// for "serving" runs out or its caller gives up: it closes the hand-over
// socket without "left" and serves on its own sockets. Then the new
// process must not serve, and must leave the control socket's path in
// place (it unlinked it as it closed its copy, so the old process, serving
// again, could no longer be reached by scdctl). A commit, or an old
// process that died, leaves the sockets and the path to the new process.
func TestTakeoverCommitsOnlyOnLeft(t *testing.T) {
	cases := []struct {
		name     string
		left     bool // the old process commits
		oldAlive bool // the old process runs (it is this one's parent)
		wantErr  bool
		keepPath bool // the path outlives the new process's listener
	}{
		{"undone", false, true, true, true},
		{"committed", true, true, false, false},
		{"old process gone", false, false, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "ctl.sock")
			old, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			old.SetUnlinkOnClose(false) // as the old process's hand-off leaves it
			defer old.Close()
			f, err := old.File()
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()

			newEnd, oldEnd := handOverPair(t)
			defer oldEnd.Close()
			cfg := &def.Config{Dir: dir, System: def.System{NodeID: "n1", ControlSocket: path}}
			r := &restarter{n: &Node{cfg: cfg, log: slog.New(slog.DiscardHandler)}, peer: newEnd, oldPID: os.Getppid()}
			if !tc.oldAlive {
				r.oldPID = os.Getppid() + 1 // not this process's parent: it died
			}
			// The old process's side of the first steps: "ready", then
			// the listeners (here the control socket only).
			go func() {
				if _, _, err := recvMsg(oldEnd, time.Now().Add(testWait)); err == nil {
					_ = sendMsg(oldEnd, takeoverMsg{Step: "listeners", Control: path}, []*os.File{f})
				}
			}()
			if err := r.takeOver(); err != nil {
				t.Fatal(err)
			}
			r.n.ports.takeInherited(r)
			taken := r.n.ports.control // the control server's listener from here on
			if taken == nil {
				t.Fatal("takeOver took no control socket")
			}
			if tc.left {
				if err := sendMsg(oldEnd, takeoverMsg{Step: "left"}, nil); err != nil {
					t.Fatal(err)
				}
			} else {
				oldEnd.Close()
			}
			err = r.takeoverServing()
			if (err != nil) != tc.wantErr {
				t.Errorf("takeoverServing = %v, want an error: %v", err, tc.wantErr)
			}
			taken.Close() // the new process ends, or later stops
			_, statErr := os.Stat(path)
			if kept := statErr == nil; kept != tc.keepPath {
				t.Errorf("control socket path kept: %v, want %v", kept, tc.keepPath)
			}
		})
	}
}

// handOverPair is a hand-over socket's two ends.
func handOverPair(t *testing.T) (a, b *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "hand-over")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// pipeEnds opens n pipes and returns their reading ends (each a file of
// its own inode, to be told apart when received).
func pipeEnds(t *testing.T, n int) []*os.File {
	t.Helper()
	var ends []*os.File
	for range n {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		w.Close()
		ends = append(ends, r)
	}
	return ends
}

// TestHandOverCarriesMoreDescriptorsThanOneMessage: a hand-over's
// descriptors go over in as many messages as they need. A node with 256
// receiving sockets hands over 260; one message carries at most 253 (the
// kernel's SCM_MAX_FD), so the restart failed with 'invalid argument'.
func TestHandOverCarriesMoreDescriptorsThanOneMessage(t *testing.T) {
	old, new := handOverPair(t)
	defer old.Close()
	defer new.Close()
	for _, n := range []int{1, scmMaxFD, scmMaxFD + 1, 260, 2*scmMaxFD + 1} {
		sent := pipeEnds(t, n)
		errc := make(chan error, 1)
		go func() { errc <- sendMsg(old, takeoverMsg{Step: "listeners", PID: n}, sent) }()
		m, got, err := recvMsg(new, time.Now().Add(5*time.Second))
		if serr := <-errc; serr != nil || err != nil {
			t.Fatalf("%d descriptors: send %v, receive %v", n, serr, err)
		}
		if m.Step != "listeners" || m.PID != n || len(got) != n {
			t.Fatalf("%d descriptors: got %q (pid %d) with %d", n, m.Step, m.PID, len(got))
		}
		for i := range sent { // each is the pipe sent in its place
			var a, b unix.Stat_t
			if unix.Fstat(int(sent[i].Fd()), &a) != nil || unix.Fstat(int(got[i].Fd()), &b) != nil || a.Ino != b.Ino {
				t.Fatalf("%d descriptors: the %dth received is not the %dth sent (inode %d, want %d)", n, i, i, b.Ino, a.Ino)
			}
		}
		closeFiles(sent)
		closeFiles(got)
	}
}

// TestHandOverClosesTheDescriptorsOfAMessageItRefuses: a message whose
// control part came cut (MSG_CTRUNC: here the receiver's credentials
// take part of the buffer; in earnest, a new process at its open files
// limit) is refused at once, and no descriptor that came with it, nor
// with a message carrying another control message before its own, stays
// open. recvOne took the credentials for a bad SCM_RIGHTS and returned
// leaving every descriptor of the message open, and took a cut message
// for fewer descriptors (recvMsg then waited for the rest to its
// deadline).
func TestHandOverClosesTheDescriptorsOfAMessageItRefuses(t *testing.T) {
	open := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skip(err)
		}
		return len(ents)
	}
	for _, n := range []int{3, scmMaxFD} {
		old, new := handOverPair(t)
		raw, err := new.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		_ = raw.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1) })
		if err != nil {
			t.Fatal(err)
		}
		sent := pipeEnds(t, n)
		before := open()
		if err := sendMsg(old, takeoverMsg{Step: "listeners"}, sent); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, got, err := recvMsg(new, time.Now().Add(5*time.Second))
		switch {
		case n <= 3 && (err != nil || len(got) != n):
			t.Errorf("%d descriptors with credentials: got %d, %v; want them all", n, len(got), err)
		case n > 3 && err == nil:
			t.Errorf("%d descriptors cut short: got %d and no error", n, len(got))
		case n > 3 && time.Since(start) > 2*time.Second:
			t.Errorf("%d descriptors cut short: refused only after %v", n, time.Since(start))
		}
		closeFiles(got)
		if leaked := open() - before; leaked > 2 {
			t.Errorf("%d descriptors sent with credentials: %d left open", n, leaked)
		}
		closeFiles(sent)
		old.Close()
		new.Close()
	}
}

// TestARestartOfAProcessThatHandedOverSaysWhom: a restart asked of a
// process that has handed the node over (a SIGUSR2 that reached the old
// pid after the commit: a shell's $!, a reload before the new process
// named itself systemd's main one) is refused saying which process serves,
// and the refusal is logged: scdd's SIGUSR2 has no one else to tell, and
// it was lost without a word.
func TestARestartOfAProcessThatHandedOverSaysWhom(t *testing.T) {
	var log strings.Builder
	n := &Node{log: slog.New(slog.NewTextHandler(&log, nil))}
	r := &restarter{n: n}
	r.running.Store(true)
	r.handedOver.Store(true)
	r.newPID.Store(4242)
	_, err := r.restart(context.Background())
	if err == nil || !strings.Contains(err.Error(), "handed the node to pid 4242") {
		t.Errorf("a restart after the hand-over: %v; want it to name pid 4242", err)
	}
	if !strings.Contains(log.String(), "restart refused") || !strings.Contains(log.String(), "4242") {
		t.Errorf("the refusal was not logged: %q", log.String())
	}
}

// TestWatchOldHearsAStopWhateverItSaysOfDescriptors: the new process
// watches the hand-over socket, with no deadline, for a stop the old one
// passes on. A message saying descriptors follow (Files) had it wait for
// them, so the stop went unheard while the old process lived.
func TestWatchOldHearsAStopWhateverItSaysOfDescriptors(t *testing.T) {
	newEnd, oldEnd := handOverPair(t)
	defer oldEnd.Close()
	defer newEnd.Close()
	r := &restarter{}
	go r.watchOld(newEnd)
	if err := sendOne(oldEnd, takeoverMsg{Step: "stop", Files: 1}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.stopAskedCh():
	case <-time.After(5 * time.Second):
		t.Fatal("the stop passed on was not heard within 5 s")
	}
}

// TestHandOverRefusesDescriptorsCutAtTheOpenFilesLimit: a new process
// with no room for every descriptor of a message gets those it has room
// for, and MSG_CTRUNC: recvMsg took them for all that came and waited
// for the rest until its deadline (the restart undone half a minute
// later, for "the other process closed the hand-over socket").
func TestHandOverRefusesDescriptorsCutAtTheOpenFilesLimit(t *testing.T) {
	old, new := handOverPair(t)
	defer old.Close()
	defer new.Close()
	sent := pipeEnds(t, 20)
	defer closeFiles(sent)
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip(err)
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if err := sendMsg(old, takeoverMsg{Step: "listeners"}, sent); err != nil {
		t.Fatal(err)
	}
	low := lim
	low.Cur = uint64(len(ents) + 5) // room for a few of the 20
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Skip(err)
	}
	start := time.Now()
	_, got, err := recvMsg(new, time.Now().Add(3*time.Second))
	took := time.Since(start)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	closeFiles(got)
	if err == nil || !strings.Contains(err.Error(), "cut short") || took > 2*time.Second {
		t.Errorf("20 descriptors, room for fewer: got %d, %v after %v; want a cut short refused at once", len(got), err, took)
	}
}

// TestRetireSaysWhatItsDrainLeft: the old process of a restart drains
// once its callers have gone (retire), and what the drain could not do
// (a call still running at the drain timeout) is logged. It went nowhere:
// scdd exits on Retired, and only a Drain called after it returned the
// error, so the old process ended as if all went well.
func TestRetireSaysWhatItsDrainLeft(t *testing.T) {
	var logged testenv.SyncBuffer
	n := inProcNodeWith(t, "", map[string]string{
		"g": "set service_group = g\nset service = sleep\nset module = MODULE\nset parallel_count = 1\n",
	}, func(n *Node) {
		n.log = slog.New(slog.NewTextHandler(&logged, nil))
		n.opts.DrainTimeout = 300 * time.Millisecond
	})
	c := inProcClient(t, n)
	answered := make(chan error, 1)
	go func() {
		_, err := c.Call(context.Background(), "g", "sleep", []byte("1500ms"))
		answered <- err
	}()
	waitInFlight(t, n, "g", 1)
	n.restart.handedOver.Store(true) // as a restart's commit: the Drain at the test's end waits for this one
	go n.restart.retire()
	select {
	case <-n.Retired():
	case <-time.After(testWait):
		t.Fatal("not retired")
	}
	<-answered
	if err := n.restart.retireErr; err == nil || !strings.Contains(err.Error(), "still in flight") {
		t.Fatalf("retire's drain: %v, want the call still in flight", err)
	}
	if !strings.Contains(logged.String(), "still in flight") {
		t.Errorf("the drain's error was not logged:\n%s", logged.String())
	}
	n.restart.retireErr = nil // seen: the test's Drain at the end returns it again
}

// TestRestartRefusedUntilStartReturns: the control socket serves before
// Start has joined the cluster (in a new process, before the old one has
// left it), and a restart asked then would hand over a node half started:
// it is refused until Start returns. The node's state is set back by hand,
// as the window in Start is too short to hit.
func TestRestartRefusedUntilStartReturns(t *testing.T) {
	n := inProcNode(t, "", map[string]string{
		"g": "set service_group = g\nset service = echo\nset module = MODULE\nset parallel_count = 1\n",
	})
	n.started.Store(false)
	_, err := n.Restart(context.Background())
	if err == nil || !strings.Contains(err.Error(), "has not finished starting") {
		t.Fatalf("a restart before Start returned: %v, want refused as not finished starting", err)
	}
	if n.restart.running.Load() {
		t.Error("a refused restart left the node marked as restarting: a later one would be refused as under way")
	}
}

// TestWhileOldWaitsEndsWhenTheOldProcessGivesUp: while a new process
// starts the old one's environment servers, before it says "serving", the
// old process may undo the hand-over (a stop, its caller gone) and close
// the socket: the starts end then, not at their own deadline (the old
// process kills the new one 5 s after). Without that, the watch ends with
// nothing read: the old process's next message is takeoverServing's.
func TestWhileOldWaitsEndsWhenTheOldProcessGivesUp(t *testing.T) {
	newEnd, oldEnd := handOverPair(t)
	defer newEnd.Close()
	r := &restarter{peer: newEnd}
	ctx, done := r.whileOldWaits()
	select {
	case <-ctx.Done():
		t.Fatal("the watch ended with the old process waiting")
	case <-time.After(100 * time.Millisecond):
	}
	done()
	if err := sendMsg(oldEnd, takeoverMsg{Step: "left"}, nil); err != nil {
		t.Fatal(err)
	}
	if m, _, err := recvMsg(newEnd, time.Now().Add(time.Second)); err != nil || m.Step != "left" {
		t.Fatalf("after the watch: %q, %v; want the old process's message unread until then", m.Step, err)
	}

	ctx, done = r.whileOldWaits()
	defer done()
	oldEnd.Close()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the old process closed the socket and the watch went on")
	}

	// A close before the watch began (while the new process set up its
	// doors) is seen too: the netpoller does not tell it again.
	newEnd2, oldEnd2 := handOverPair(t)
	defer newEnd2.Close()
	oldEnd2.Close()
	time.Sleep(50 * time.Millisecond)
	ctx, done2 := (&restarter{peer: newEnd2}).whileOldWaits()
	defer done2()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the old process had closed the socket before the watch, and the watch went on")
	}
}

// TestFitEnvsKeepsTheHandOverReadable: the application environments'
// states go over in the "listeners" message, which the new process reads
// into 64 KiB: a policy with thousands of environments (and instances)
// would cut it, and every restart of the node would fail. What does not
// fit is left to the cluster, the quiesces last.
func TestFitEnvsKeepsTheHandOverReadable(t *testing.T) {
	r := &restarter{n: &Node{log: slog.New(slog.DiscardHandler)}}
	msg := takeoverMsg{Step: "listeners"}
	small := wlmnode.Handover{Serving: []string{"orders"}, States: map[string]wlm.EnvState{"orders": {Epoch: 2, HWM: 1}}}
	if got := r.fitEnvs(msg, small); got == nil || len(got.States) != 1 || len(got.Serving) != 1 {
		t.Errorf("a small hand-over: %+v, want it whole", got)
	}
	big := wlmnode.Handover{Serving: []string{"orders"}, States: map[string]wlm.EnvState{}}
	for i := range 5000 {
		big.States[fmt.Sprintf("environment-%04d@instance-%02d", i, i%64)] = wlm.EnvState{Epoch: 3, HWM: 2, Quiesced: i%1000 == 0}
	}
	got := r.fitEnvs(msg, big)
	if got == nil {
		t.Fatal("5,000 states: nothing passed, want the quiesced ones and the one serving")
	}
	if len(got.States) != 5 || len(got.Serving) != 1 {
		t.Fatalf("5,000 states: %d passed, serving %v; want the 5 quiesced and the one serving", len(got.States), got.Serving)
	}
	msg.Envs = got
	if b, err := json.Marshal(msg); err != nil || len(b) > maxMsgBytes {
		t.Errorf("the message: %d bytes (%v), want at most %d", len(b), err, maxMsgBytes)
	}
}
