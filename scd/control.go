package scd

// The control socket: every action that changes the node or reads its
// insides (hold, release, prc, chprc, pprof) is served over HTTP on a unix socket, and
// only to scdd's own user and root. The kernel tells who connected
// (SO_PEERCRED, read once per connection in ConnContext); controlAllowed
// checks it before any handler runs, so a new action is one line in
// controlActions. The HTTP address (metrics_address) keeps only the
// read-only /metrics and /status.
//
// Three layers keep other users out: the directory scdd makes for the
// socket is 0700, the socket itself 0600, and the peer check. The first two
// depend on where the operator put the socket; the last does not.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"golang.org/x/sys/unix"

	"tpsched/netio"
	"tpsched/scd/def"
)

// HoldResult answers a hold or release on the control socket.
type HoldResult struct {
	Group    string `json:"group"`
	Held     bool   `json:"held"`      // the group's state now
	Changed  bool   `json:"changed"`   // false: it was in that state already
	InFlight int    `json:"in_flight"` // calls queued or running: a hold lets them finish
}

// controlActions are the control socket's routes. Everything here has
// passed the peer check.
func (n *Node) controlActions(mux *http.ServeMux) {
	mux.HandleFunc("POST /hold", func(w http.ResponseWriter, r *http.Request) { n.answerHold(w, r, true) })
	mux.HandleFunc("POST /release", func(w http.ResponseWriter, r *http.Request) { n.answerHold(w, r, false) })
	mux.HandleFunc("GET /prc", n.answerPrc)
	mux.HandleFunc("POST /chprc", n.answerChprc)
	mux.HandleFunc("POST /restart", n.answerRestart)
	n.wlmControl(mux) // wlm_control.go: quiesce, resume, refresh, policy
	// Profiles for performance engineers: they show the node's insides.
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}

// ControlSocketPath is where the node's control socket is: sysconf's
// control_socket (relative to the definition directory), else
// /run/tpsched/<node_id>.sock when scdd runs as root, else
// $XDG_RUNTIME_DIR/tpsched/<node_id>.sock, else <definition
// directory>/<node_id>.sock, else $TMPDIR/tpsched-<uid>/<node_id>.sock for
// the embedded default. scdctl computes the same from the same definitions.
func ControlSocketPath(cfg *def.Config) string {
	return ControlSocketCandidates(cfg)[0]
}

// ControlSocketCandidates lists where a node of cfg may have put its
// control socket, ControlSocketPath's answer first and then what scdd
// would have chosen as another user or with another environment: for
// scdctl, which may run as root beside a non-root node or without
// $XDG_RUNTIME_DIR.
func ControlSocketCandidates(cfg *def.Config) []string {
	return controlSocketCandidates(cfg, os.Geteuid(), os.Getenv("XDG_RUNTIME_DIR"))
}

func controlSocketCandidates(cfg *def.Config, euid int, runtimeDir string) []string {
	if p := cfg.System.ControlSocket; p != "" {
		if !filepath.IsAbs(p) && cfg.Dir != "" {
			p = filepath.Join(cfg.Dir, p)
		}
		return []string{p}
	}
	name := strings.ReplaceAll(cfg.System.NodeID, "/", "_") + ".sock"
	root := filepath.Join("/run/tpsched", name)
	var out []string
	if euid == 0 {
		out = append(out, root)
	}
	if runtimeDir != "" {
		out = append(out, filepath.Join(runtimeDir, "tpsched", name))
	}
	if cfg.Dir != "" {
		out = append(out, filepath.Join(cfg.Dir, name))
	} else {
		out = append(out, filepath.Join(os.TempDir(), fmt.Sprintf("tpsched-%d", euid), name))
	}
	if euid != 0 {
		out = append(out, root)
	}
	return out
}

// FindControlSocket is where scdctl reaches a running node of cfg: the
// first of ControlSocketCandidates that is a socket. When none is and cfg
// is the embedded default (scdctl was given no definition directory, so
// it cannot know the node_id of a node started with one), it looks for
// the sockets of other node ids in the candidates' directories: the one
// that answers is used; with several, the error lists them (-s picks one).
// With nothing found it returns the first candidate, for the error of the
// connection that fails there.
func FindControlSocket(cfg *def.Config) (string, error) {
	return findControlSocket(ControlSocketCandidates(cfg), cfg.Dir == "" && cfg.System.ControlSocket == "")
}

func findControlSocket(candidates []string, scan bool) (string, error) {
	for _, p := range candidates {
		if isSocket(p) {
			return p, nil
		}
	}
	if !scan {
		return candidates[0], nil
	}
	var live []string
	seen := map[string]bool{}
	for _, c := range candidates {
		dir := filepath.Dir(c)
		if seen[dir] {
			continue
		}
		seen[dir] = true
		found, _ := filepath.Glob(filepath.Join(dir, "*.sock"))
		for _, p := range found {
			if isSocket(p) && answers(p) {
				live = append(live, p)
			}
		}
	}
	switch len(live) {
	case 0:
		return candidates[0], nil
	case 1:
		return live[0], nil
	}
	return "", fmt.Errorf("no control socket for node_id %s, but the sockets of %d other nodes: %s (-s names one, or -c the definition directory of its node)",
		strings.TrimSuffix(filepath.Base(candidates[0]), ".sock"), len(live), strings.Join(live, ", "))
}

func isSocket(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().Type() == os.ModeSocket
}

// answers reports whether a node listens on the unix socket p: one that a
// killed node left behind refuses the connection.
func answers(p string) bool {
	c, err := net.DialTimeout("unix", p, time.Second)
	if err != nil {
		return !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ENOENT)
	}
	c.Close()
	return true
}

// ControlSocket is the path of the node's control socket.
func (n *Node) ControlSocket() string { return ControlSocketPath(n.cfg) }

// startControl serves controlActions on the control socket until the node
// stops.
func (n *Node) startControl() error {
	path := ControlSocketPath(n.cfg)
	// Bound before the UAPs started (bindPorts), else the old process's
	// on a restart.
	ln, err := n.controlBound, error(nil)
	n.controlBound = nil
	if inh := n.restart.inheritControl; inh != nil {
		n.restart.inheritControl = nil
		if ln == nil {
			ln = inh
		} else {
			_ = inh.Close()
		}
	}
	if ln == nil {
		ln, err = listenControl(path)
	}
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	refused := n.metrics.NewCounter("tpsched_control_refused_total")
	mux := http.NewServeMux()
	n.controlActions(mux)
	srv, lim := newHTTPServer(n.controlAllowed(mux, refused), controlMaxConns, 0) // httplimit.go
	srv.ConnContext = withControlPeer
	n.restart.controlLn, n.restart.controlSrv, n.restart.controlLimit = ln, srv, lim
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		<-n.stop
		// An answer being written gets a moment (scdctl restart's: the old
		// process stops as soon as the new one serves); a profile being
		// taken is cut short, not waited for.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = srv.Shutdown(ctx)
		cancel()
		_ = srv.Close()
	}()
	go func() {
		if err := srv.Serve(lim.listener(ln)); err != nil && !errors.Is(err, http.ErrServerClosed) && !n.restart.handedOver.Load() && !n.restart.running.Load() {
			n.log.Error("control socket stopped", "path", path, "err", err)
		}
	}()
	n.log.Info("control socket listening", "path", path, "allowed_uids", allowedUIDs())
	return nil
}

// listenControl binds the unix socket at path, replacing a socket that
// nobody answers on (left by a node that was killed) but never a live one
// or a file that is not a socket.
func listenControl(path string) (*net.UnixListener, error) {
	if len(path) > def.MaxSocketPath {
		return nil, fmt.Errorf("%s: %d bytes, a unix socket path has at most %d (set a shorter control_socket in sysconf)",
			path, len(path), def.MaxSocketPath)
	}
	dir := filepath.Dir(path)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("make its directory: %w (set control_socket in sysconf to a writable place)", err)
		}
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		switch {
		case err == nil:
			c.Close()
			return nil, fmt.Errorf("%s: another process answers there (another scdd with node_id the same? set control_socket in sysconf)", path)
		case errors.Is(err, syscall.ECONNREFUSED):
			if err := os.Remove(path); err != nil {
				return nil, fmt.Errorf("remove the stale socket: %w", err)
			}
		default:
			return nil, fmt.Errorf("%s exists and cannot be checked: %w", path, err)
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod 0600 %s: %w", path, err)
	}
	return ln, nil
}

// controlPeer is who is at the other end of a control connection, as the kernel
// saw it at connect(2).
type controlPeer struct {
	cred *unix.Ucred
	err  error
}

type controlPeerKey struct{}

func withControlPeer(ctx context.Context, c net.Conn) context.Context {
	p := controlPeer{err: errors.New("not a unix socket")}
	if uc, ok := c.(*net.UnixConn); ok {
		p = controlPeerOf(uc)
	}
	return context.WithValue(ctx, controlPeerKey{}, p)
}

func controlPeerOf(c *net.UnixConn) controlPeer {
	raw, err := c.SyscallConn()
	if err != nil {
		return controlPeer{err: err}
	}
	var p controlPeer
	if err := raw.Control(func(fd uintptr) {
		p.cred, p.err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return controlPeer{err: err}
	}
	if p.err != nil {
		p.err = os.NewSyscallError("getsockopt SO_PEERCRED", p.err)
	}
	return p
}

// sameUserNamespace reports whether pid runs in scdd's user namespace;
// false when that cannot be read.
func sameUserNamespace(pid int) bool {
	own, err := os.Readlink("/proc/self/ns/user")
	if err != nil {
		return false
	}
	peer, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/user", pid))
	return err == nil && peer == own
}

func allowedUIDs() []int {
	if uid := os.Geteuid(); uid != 0 {
		return []int{0, uid}
	}
	return []int{0}
}

// controlAllowed lets a request through only from scdd's own effective uid
// or root.
func (n *Node) controlAllowed(next http.Handler, refused *metrics.Counter) http.Handler {
	own := uint32(os.Geteuid())
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, _ := r.Context().Value(controlPeerKey{}).(controlPeer)
		var why string
		switch {
		case p.err != nil:
			why = fmt.Sprintf("control socket: cannot tell who is calling (%v)", p.err)
		case p.cred == nil:
			why = "control socket: cannot tell who is calling"
		case p.cred.Uid != 0 && p.cred.Uid != own:
			why = fmt.Sprintf("control socket: uid %d may not use it: only scdd's own user (uid %d) and root", p.cred.Uid, own)
		case own != 0 && p.cred.Uid == own && !sameUserNamespace(int(p.cred.Pid)):
			// A non-root node's UAPs run as its user, each in a user
			// namespace of its own (procmgr): that is how they are told
			// from the operator.
			why = "control socket: the caller runs in another user namespace (a UAP of this node?): only scdd's own user and root, outside"
		default:
			next.ServeHTTP(w, r)
			return
		}
		refused.Inc()
		attrs := []any{"path", r.URL.Path, "why", why}
		if p.cred != nil {
			attrs = append(attrs, "uid", p.cred.Uid, "pid", p.cred.Pid)
		}
		n.log.Warn("control request refused", attrs...)
		http.Error(w, why, http.StatusForbidden)
	})
}

func (n *Node) answerHold(w http.ResponseWriter, r *http.Request, hold bool) {
	name := r.URL.Query().Get("group")
	res := HoldResult{Group: name, Held: hold}
	var err error
	res.Changed, err = n.setHeld(name, hold)
	if err != nil {
		var te *netio.Error
		if errors.As(err, &te) && te.Code == netio.CodeNoSuchGroup {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	res.InFlight = n.groups[name].inFlight()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(res)
}

// answerRestart hands the node's sockets to a new scdd (restart.go) and
// says how it went.
func (n *Node) answerRestart(w http.ResponseWriter, r *http.Request) {
	res, err := n.Restart(r.Context())
	if err != nil {
		http.Error(w, err.Error(), http.StatusConflict)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(res)
}
