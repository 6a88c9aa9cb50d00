package scd

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"golang.org/x/sys/unix"

	"tpsched/scd/def"
)

func TestControlSocketCandidates(t *testing.T) {
	tmp := os.TempDir()
	cfg := func(dir, node, sock string) *def.Config {
		return &def.Config{Dir: dir, System: def.System{NodeID: node, ControlSocket: sock}}
	}
	cases := []struct {
		name       string
		cfg        *def.Config
		euid       int
		runtimeDir string
		want       []string
	}{
		{"sysconf names it", cfg("/etc/tp", "n1", "/srv/n1.sock"), 0, "/run/user/0", []string{"/srv/n1.sock"}},
		{"relative to the definition directory", cfg("/etc/tp", "n1", "ctl.sock"), 1000, "", []string{"/etc/tp/ctl.sock"}},
		{"root", cfg("/etc/tp", "n1", ""), 0, "", []string{"/run/tpsched/n1.sock", "/etc/tp/n1.sock"}},
		{"root with a runtime dir", cfg("/etc/tp", "n1", ""), 0, "/run/user/0",
			[]string{"/run/tpsched/n1.sock", "/run/user/0/tpsched/n1.sock", "/etc/tp/n1.sock"}},
		{"user with a runtime dir", cfg("/etc/tp", "n1", ""), 1000, "/run/user/1000",
			[]string{"/run/user/1000/tpsched/n1.sock", "/etc/tp/n1.sock", "/run/tpsched/n1.sock"}},
		{"user without one", cfg("/home/u/defs", "n1", ""), 1000, "", []string{"/home/u/defs/n1.sock", "/run/tpsched/n1.sock"}},
		{"embedded default", cfg("", "host", ""), 1000, "",
			[]string{filepath.Join(tmp, "tpsched-1000", "host.sock"), "/run/tpsched/host.sock"}},
		{"a slash in node_id", cfg("", "a/b", ""), 0, "", []string{"/run/tpsched/a_b.sock", filepath.Join(tmp, "tpsched-0", "a_b.sock")}},
	}
	for _, tc := range cases {
		if got := controlSocketCandidates(tc.cfg, tc.euid, tc.runtimeDir); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}

// shortTemp is a directory whose paths fit a unix socket address (t.TempDir
// can be long).
func shortTemp(t *testing.T) string {
	dir, err := os.MkdirTemp("", "tpctl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func TestListenControl(t *testing.T) {
	t.Run("makes a private directory and a 0600 socket", func(t *testing.T) {
		path := filepath.Join(shortTemp(t), "sub", "n.sock")
		ln, err := listenControl(path)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		di, err := os.Stat(filepath.Dir(path))
		if err != nil || di.Mode().Perm() != 0o700 {
			t.Errorf("directory: %v, %v; want 0700", di.Mode(), err)
		}
		si, err := os.Stat(path)
		if err != nil || si.Mode().Perm() != 0o600 || si.Mode().Type() != os.ModeSocket {
			t.Errorf("socket: %v, %v; want a 0600 socket", si.Mode(), err)
		}
	})
	t.Run("replaces a socket nobody answers on", func(t *testing.T) {
		path := filepath.Join(shortTemp(t), "n.sock")
		old, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		old.SetUnlinkOnClose(false) // as a killed node leaves it
		old.Close()
		ln, err := listenControl(path)
		if err != nil {
			t.Fatalf("stale socket not replaced: %v", err)
		}
		ln.Close()
	})
	t.Run("never takes a live socket", func(t *testing.T) {
		path := filepath.Join(shortTemp(t), "n.sock")
		live, err := listenControl(path)
		if err != nil {
			t.Fatal(err)
		}
		defer live.Close()
		if _, err := listenControl(path); err == nil || !strings.Contains(err.Error(), "another process answers there") {
			t.Fatalf("second listen: %v", err)
		}
	})
	t.Run("never removes a file that is not a socket", func(t *testing.T) {
		path := filepath.Join(shortTemp(t), "n.sock")
		if err := os.WriteFile(path, []byte("keep"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := listenControl(path); err == nil || !strings.Contains(err.Error(), "is not a socket") {
			t.Fatalf("listen over a file: %v", err)
		}
		if b, _ := os.ReadFile(path); string(b) != "keep" {
			t.Error("the file was touched")
		}
	})
	t.Run("refuses a directory others can write", func(t *testing.T) {
		// As another user's $TMPDIR/tpsched-<uid> would be: it could
		// replace the socket or race a link in before the chmod.
		dir := shortTemp(t)
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		ln, err := listenControl(filepath.Join(dir, "n.sock"))
		if err == nil {
			ln.Close()
			t.Fatal("listened in a directory of mode 0777")
		}
		for _, want := range []string{dir, "writable by group or others", "mode 0777", "chmod go-w"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
	})
	t.Run("refuses a directory of another user", func(t *testing.T) {
		dir := shortTemp(t)
		var err error
		if os.Geteuid() == 0 {
			// root gives it away (to nobody) and listens for real.
			if err := os.Chown(dir, 65534, -1); err != nil {
				t.Fatal(err)
			}
			var ln *net.UnixListener
			if ln, err = listenControl(filepath.Join(dir, "n.sock")); err == nil {
				ln.Close()
			}
		} else {
			err = checkControlDir(dir, os.Geteuid()+1) // as seen by a daemon of the next uid
		}
		if err == nil || !strings.Contains(err.Error(), "belongs to another user") {
			t.Errorf("got %v, want 'belongs to another user'", err)
		}
	})
	t.Run("a path too long for a unix socket", func(t *testing.T) {
		path := "/tmp/" + strings.Repeat("x", 110) + ".sock"
		if _, err := listenControl(path); err == nil || !strings.Contains(err.Error(), "at most 107") {
			t.Fatalf("long path: %v", err)
		}
	})
}

// TestFindControlSocket: scdctl without definitions looks for the node's
// socket where its node_id would put it; when a node runs with another
// node_id, the one socket found beside it that answers is used, and with
// several the error lists them (issue 23, item 3). A socket left by a
// killed node is not one that answers.
func TestFindControlSocket(t *testing.T) {
	d1, d2 := t.TempDir(), t.TempDir()
	candidates := []string{filepath.Join(d1, "host.sock"), filepath.Join(d2, "host.sock")}
	listen := func(p string) *net.UnixListener {
		t.Helper()
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		return ln
	}
	if got, err := findControlSocket(candidates, true); err != nil || got != candidates[0] {
		t.Errorf("nothing there: %q, %v; want the first candidate and no error", got, err)
	}
	stale := listen(filepath.Join(d1, "killed.sock"))
	stale.SetUnlinkOnClose(false)
	stale.Close()
	mine := filepath.Join(d2, "mynode.sock")
	listen(mine)
	if got, err := findControlSocket(candidates, true); err != nil || got != mine {
		t.Errorf("one other node's socket (and a stale one): %q, %v; want %s", got, err, mine)
	}
	if got, err := findControlSocket(candidates, false); err != nil || got != candidates[0] {
		t.Errorf("with definitions (no scan): %q, %v; want the first candidate", got, err)
	}
	other := filepath.Join(d1, "other.sock")
	listen(other)
	got, err := findControlSocket(candidates, true)
	if err == nil || !strings.Contains(err.Error(), other) || !strings.Contains(err.Error(), mine) || !strings.Contains(err.Error(), "-s names one") {
		t.Errorf("two other nodes' sockets: %q, %v; want an error that lists both", got, err)
	}
	listen(candidates[1])
	if got, err := findControlSocket(candidates, true); err != nil || got != candidates[1] {
		t.Errorf("the node_id's own socket: %q, %v; want %s", got, err, candidates[1])
	}
}

// TestFindControlSocketNotSearchable: a candidate scdctl may not look at
// (a root scdd's /run/tpsched, 0700, to another user) is the one chosen
// when no socket is found, so that the connection's error says
// 'permission denied' and who the socket admits. scdctl run as another
// user said "no control socket at DIR/NODE.sock (is scdd running?)" of a
// node that ran. As root the test looks as another user on a thread of its
// own (fsuid): root may look everywhere.
func TestFindControlSocketNotSearchable(t *testing.T) {
	var dirs []string
	for range 2 {
		d, err := os.MkdirTemp("", "ctl") // t.TempDir's parent is 0700: another user could not look in either
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		dirs = append(dirs, d)
	}
	mine, closed := dirs[0], dirs[1]
	candidates := []string{filepath.Join(mine, "n.sock"), filepath.Join(closed, "n.sock")}
	asOther := os.Geteuid() == 0
	if asOther {
		if err := os.Chown(mine, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	} else if err := os.Chmod(closed, 0); err != nil {
		t.Fatal(err)
	} else {
		t.Cleanup(func() { os.Chmod(closed, 0o700) })
	}
	for _, scan := range []bool{false, true} {
		var got string
		var err error
		done := make(chan struct{})
		go func() {
			defer close(done)
			if asOther {
				runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
				unix.Setfsuid(65534)
				unix.Setfsgid(65534)
			}
			got, err = findControlSocket(candidates, scan)
		}()
		<-done
		if err != nil || got != candidates[1] {
			t.Errorf("scan %v: %q, %v; want %s, which may not be looked at", scan, got, err, candidates[1])
		}
	}
}

// TestControlRefusalCannotHoldTheSocket: a caller the peer check refuses
// (another uid, a UAP in a user namespace of its own) is answered 403
// and its connection closed. It was kept alive: such a caller sent its
// requests one after another without reading the answers, the server's
// write of a refusal blocked once the socket's buffer was full (the
// control socket's answers have no write timeout), and with
// controlMaxConns such connections, none ever idle, scdctl's connection
// waited in the backlog for ever.
func TestControlRefusalCannotHoldTheSocket(t *testing.T) {
	d := &doors{n: &Node{log: slog.New(slog.DiscardHandler)}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /prc", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, "ok") })
	srv, lim := newHTTPServer(d.controlAllowed(mux, metrics.NewSet().NewCounter("refused")), controlMaxConns, 0)
	var accepted atomic.Int32
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if accepted.Add(1) <= controlMaxConns { // the hostile callers, as the kernel would name another user
			return context.WithValue(ctx, controlPeerKey{}, controlPeer{cred: &unix.Ucred{Uid: 65534, Pid: 1}})
		}
		return withControlPeer(ctx, c)
	}
	path := filepath.Join(shortTemp(t), "n.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(lim.listener(ln)) }()
	defer func() { srv.Close(); <-served }()

	var wg sync.WaitGroup
	defer wg.Wait()
	req := []byte(strings.Repeat("GET /prc HTTP/1.1\r\nHost: x\r\n\r\n", 4000))
	for range controlMaxConns {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = c.Write(req) }() // and never reads
	}
	time.Sleep(time.Second) // the server's writes fill the sockets

	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		},
	}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://control/prc")
	if err != nil {
		t.Fatalf("the operator's request, after %d refused callers that do not read: %v", controlMaxConns, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the operator's request: %s", resp.Status)
	}
}
