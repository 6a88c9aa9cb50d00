package sockmode

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"tpsched/shm"
	"tpsched/shm/internal/sockwire"
)

const helperEnv = "TPSCHED_SOCKMODE_TEST_UAP"

// TestHelperUAP is not a test: it is the UAP the tests start by
// re-executing the test binary, in socket mode.
func TestHelperUAP(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("helper process for the cross-process tests")
	}
	u, err := shm.Attach()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	u.Handle("echo", func(req []byte) ([]byte, error) { return req, nil })
	u.Handle("fail", func(req []byte) ([]byte, error) { return nil, errors.New("failed: " + string(req)) })
	u.Handle("pid", func(req []byte) ([]byte, error) { return strconv.AppendInt(req[:0], int64(os.Getpid()), 10), nil })
	u.Handle("sleep", func(req []byte) ([]byte, error) {
		d, err := time.ParseDuration(string(req))
		if err != nil {
			return nil, err
		}
		time.Sleep(d)
		return req, nil
	})
	if err := u.Serve(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	os.Exit(0)
}

type uap struct {
	*Proc
	cmd  *exec.Cmd
	done chan error
}

func newTransport(tb testing.TB, maxMsg int) *Transport {
	tb.Helper()
	tr, err := New("test", maxMsg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { tr.Unmap() })
	return tr
}

func startUAP(tb testing.TB, tr *Transport, env ...string) *uap {
	tb.Helper()
	p, err := tr.NewProc(0)
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperUAP$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=1", "TPSCHED_SHM_FD=3", "TPSCHED_RECEIVE=socket")
	cmd.Env = append(cmd.Env, env...)
	cmd.ExtraFiles = p.Files()
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	u := &uap{Proc: p, cmd: cmd, done: make(chan error, 1)}
	go func() { u.done <- cmd.Wait() }()
	tb.Cleanup(func() {
		cmd.Process.Kill()
		<-u.done
	})
	return u
}

func (u *uap) wait(tb testing.TB) error {
	tb.Helper()
	select {
	case err := <-u.done:
		u.done <- err
		return err
	case <-time.After(10 * time.Second):
		tb.Fatalf("UAP pid %d still running", u.cmd.Process.Pid)
		return nil
	}
}

func until(tb testing.TB, tr *Transport, what string, cond func() bool) {
	tb.Helper()
	end := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(end) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		tr.Wait(10 * time.Millisecond)
	}
}

func call(tb testing.TB, tr *Transport, p *Proc, entry string, req []byte) shm.Completion {
	tb.Helper()
	if err := p.Dispatch(entry, req, 0); err != nil {
		tb.Fatal(err)
	}
	var c shm.Completion
	until(tb, tr, "a reply", func() bool {
		var ok bool
		var err error
		c, ok, err = p.Completion()
		if err != nil {
			tb.Fatal(err)
		}
		return ok
	})
	return c
}

func TestSocketEcho(t *testing.T) {
	tr := newTransport(t, 1<<20)
	u := startUAP(t, tr)
	until(t, tr, "hello", u.Attach)
	if u.PID() != u.cmd.Process.Pid {
		t.Errorf("pid %d, the process is %d", u.PID(), u.cmd.Process.Pid)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	src := make([]byte, 1<<20)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	for i := range 1000 {
		size := []int{0, 1 << 20, 1}[i%3]
		if i > 3 {
			size = rng.IntN(64 << 10)
		}
		c := call(t, tr, u.Proc, "echo", src[:size])
		if c.Status != shm.StatusOK || !bytes.Equal(c.Reply, src[:size]) {
			t.Fatalf("call %d: %v, %d bytes back of %d", i, c.Status, len(c.Reply), size)
		}
	}
}

func TestSocketStatuses(t *testing.T) {
	tr := newTransport(t, 64)
	u := startUAP(t, tr)
	until(t, tr, "hello", u.Attach)
	for _, c := range []struct {
		entry, req string
		status     shm.Status
		reply      string
	}{
		{"echo", "hi", shm.StatusOK, "hi"},
		{"fail", "x", shm.StatusAppError, "failed: x"},
		{"nope", "x", shm.StatusNoSuchService, "nope"},
	} {
		got := call(t, tr, u.Proc, c.entry, []byte(c.req))
		if got.Status != c.status || string(got.Reply) != c.reply {
			t.Errorf("%s: %v %q, want %v %q", c.entry, got.Status, got.Reply, c.status, c.reply)
		}
	}
	if err := u.Dispatch("echo", make([]byte, 65), 0); err != shm.ErrTooBig {
		t.Errorf("65 bytes over a 64-byte max: %v", err)
	}
}

func TestSocketStopAndClose(t *testing.T) {
	tr := newTransport(t, 64)
	u := startUAP(t, tr)
	until(t, tr, "hello", u.Attach)
	if err := u.Dispatch("sleep", []byte("30ms"), 0); err != nil {
		t.Fatal(err)
	}
	u.Stop()
	until(t, tr, "the reply before the stop", func() bool {
		c, ok, _ := u.Completion()
		return ok && c.Status == shm.StatusOK
	})
	if err := u.wait(t); err != nil {
		t.Fatalf("stopped process: %v", err)
	}
	v := startUAP(t, tr)
	until(t, tr, "hello", v.Attach)
	tr.Close()
	if err := v.wait(t); err != nil {
		t.Fatalf("closed process: %v", err)
	}
}

func TestSocketKill(t *testing.T) {
	tr := newTransport(t, 64)
	u := startUAP(t, tr)
	until(t, tr, "hello", u.Attach)
	if err := u.Dispatch("sleep", []byte("1h"), 0); err != nil {
		t.Fatal(err)
	}
	until(t, tr, "the request written", func() bool { return u.Taken() == 1 })
	u.cmd.Process.Kill()
	u.wait(t)
	if u.Holding() != 1 || u.Taken() != 1 {
		t.Fatalf("killed holding a call: holding %d taken %d", u.Holding(), u.Taken())
	}
	v := startUAP(t, tr)
	until(t, tr, "hello", v.Attach)
	if c := call(t, tr, v.Proc, "echo", []byte("after")); string(c.Reply) != "after" {
		t.Fatalf("reply %q", c.Reply)
	}
}

func TestSocketRefresh(t *testing.T) {
	tr := newTransport(t, 64)
	for i := range 2 {
		u := startUAP(t, tr, "TPSCHED_REFRESH=1")
		until(t, tr, "hello", u.Attach)
		if c := call(t, tr, u.Proc, "pid", nil); string(c.Reply) != strconv.Itoa(u.cmd.Process.Pid) {
			t.Fatalf("refresh %d: %q", i, c.Reply)
		}
		if err := u.wait(t); err != nil {
			t.Fatalf("refresh process %d: %v", i, err)
		}
	}
}

// A reply over max_message_size, or to a call the process was not given,
// is a protocol error: the node closes the socket and takes no reply.
func TestSocketProtocolErrorFromUAP(t *testing.T) {
	for _, bad := range []sockwire.Msg{
		{Kind: sockwire.KindReply, PayLen: 65, A: 1},
		{Kind: sockwire.KindReply, A: 7},
		{Kind: sockwire.KindReply, Status: 9, A: 1},
	} {
		tr := newTransport(t, 64)
		p, err := tr.NewProc(0)
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.FileConn(p.Files()[0])
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		h := make([]byte, sockwire.HeaderSize+sockwire.MaxName+64)
		sockwire.Put(h, sockwire.Msg{Kind: sockwire.KindHello, A: 4242, B: sockwire.Version})
		c.Write(h[:sockwire.HeaderSize])
		m, err := sockwire.Read(c, h, 0, statusEnd)
		if err != nil || m.Kind != sockwire.KindWelcome || m.A != 64 {
			t.Fatalf("welcome: %+v %v", m, err)
		}
		until(t, tr, "hello", p.Attach)
		if err := p.Dispatch("echo", []byte("abc"), 0); err != nil {
			t.Fatal(err)
		}
		m, err = sockwire.Read(c, h, 64, statusEnd)
		if err != nil || m.Kind != sockwire.KindRequest || m.A != 1 || m.NameLen != 4 || m.PayLen != 3 {
			t.Fatalf("request: %+v %v", m, err)
		}
		io.ReadFull(c, h[:7])
		sockwire.Put(h, bad)
		c.Write(h[:sockwire.HeaderSize])
		if _, err := c.Read(h); err != io.EOF {
			t.Fatalf("%+v: read after the protocol error: %v, want EOF", bad, err)
		}
		if _, ok, _ := p.Completion(); ok {
			t.Fatalf("%+v: the node took a bad reply", bad)
		}
		c.Close()
	}
}
