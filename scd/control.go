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
	"strconv"
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

// doors are the node's operator doors: the control socket (this file),
// the read-only HTTP endpoint on metrics_address with the status page,
// /status (status.go), /metrics (metrics.go) and /report (node_wlm.go). The
// restart hands their listeners over (handOff) or takes them back
// (resume).
type doors struct {
	n *Node

	http      *http.Server // on metrics_address
	httpLn    net.Listener
	httpLimit *connLimit   // caps http's connections (httplimit.go)
	ctl       *http.Server // on the control socket
	ctlLn     *net.UnixListener
	ctlLimit  *connLimit
}

// start serves the doors until the node stops: on the listeners bound
// before the UAPs started (ports.go) or a restart handed over (httpLn,
// ctlLn; nil: listen anew).
func (d *doors) start(httpLn net.Listener, ctlLn *net.UnixListener) error {
	if err := d.startControl(ctlLn); err != nil {
		return err
	}
	return d.startHTTP(httpLn)
}

// run serves srv on ln until it is shut down or ln closed (both on
// purpose: the node stops, or a restart hands ln over); anything else is
// logged.
func (d *doors) run(srv *http.Server, ln net.Listener, what string) {
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
		d.n.log.Error(what+" stopped", "addr", ln.Addr().String(), "err", err)
	}
}

// controlActions are the control socket's routes. Everything here has
// passed the peer check.
func (d *doors) controlActions(mux *http.ServeMux) {
	mux.HandleFunc("POST /hold", func(w http.ResponseWriter, r *http.Request) { d.answerHold(w, r, true) })
	mux.HandleFunc("POST /release", func(w http.ResponseWriter, r *http.Request) { d.answerHold(w, r, false) })
	mux.HandleFunc("GET /prc", d.answerPrc)
	mux.HandleFunc("POST /chprc", d.answerChprc)
	mux.HandleFunc("POST /restart", d.answerRestart)
	d.wlmControl(mux) // node_wlm.go: quiesce, resume, refresh, policy
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
// connection that fails there, or the first it may not look at (a root
// scdd's /run/tpsched, 0700, to another user): the connection there
// fails with 'permission denied', not 'no control socket'.
func FindControlSocket(cfg *def.Config) (string, error) {
	return findControlSocket(ControlSocketCandidates(cfg), cfg.Dir == "" && cfg.System.ControlSocket == "")
}

func findControlSocket(candidates []string, scan bool) (string, error) {
	first := ""
	for _, p := range candidates {
		ok, err := isSocket(p)
		if ok {
			return p, nil
		}
		if first == "" && errors.Is(err, os.ErrPermission) {
			first = p
		}
	}
	if first == "" {
		first = candidates[0]
	}
	if !scan {
		return first, nil
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
			if ok, _ := isSocket(p); ok && answers(p) {
				live = append(live, p)
			}
		}
	}
	switch len(live) {
	case 0:
		return first, nil
	case 1:
		return live[0], nil
	}
	return "", fmt.Errorf("no control socket for node_id %s, but the sockets of %d other nodes: %s (-s names one, or -c the definition directory of its node)",
		strings.TrimSuffix(filepath.Base(candidates[0]), ".sock"), len(live), strings.Join(live, ", "))
}

// isSocket reports whether p is a socket; err is Stat's (a directory the
// caller may not look in says so: os.ErrPermission).
func isSocket(p string) (bool, error) {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().Type() == os.ModeSocket, err
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

// startControl serves controlActions on the control socket until the node
// stops: on ln, the old process's on a restart, or a socket of its own.
func (d *doors) startControl(ln *net.UnixListener) error {
	n := d.n
	path := ControlSocketPath(n.cfg)
	var err error
	if ln == nil {
		ln, err = listenControl(path)
	}
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	refused := n.metrics.NewCounter("tpsched_control_refused_total")
	mux := http.NewServeMux()
	d.controlActions(mux)
	srv, lim := newHTTPServer(d.controlAllowed(mux, refused), controlMaxConns, 0) // httplimit.go
	srv.ConnContext = withControlPeer
	d.ctlLn, d.ctl, d.ctlLimit = ln, srv, lim
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		<-n.stop
		// An answer being written gets a moment (scdctl restart's: the old
		// process stops as soon as the new one serves); a profile being
		// taken is cut short, not waited for.
		ctx, cancel := context.WithTimeout(context.Background(), controlStopTime)
		_ = srv.Shutdown(ctx)
		cancel()
		_ = srv.Close()
	}()
	go d.run(srv, lim.listener(ln), "control socket")
	n.log.Info("control socket listening", "path", path, "allowed_uids", allowedUIDs())
	return nil
}

// listenControl binds the unix socket at path, replacing a socket that
// nobody answers on (left by a node that was killed) but never a live one
// or a file that is not a socket. Its directory must be private
// (checkControlDir), whoever made it.
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
	// Checked after MkdirAll too: another user may have made dir between
	// the Stat and it, and MkdirAll takes a directory that is there.
	if err := checkControlDir(dir, os.Geteuid()); err != nil {
		return nil, err
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

// checkControlDir refuses a control socket directory that another user
// could change: one whose owner is neither euid (scdd's) nor root, or that
// group or others may write (even with the sticky bit: another user could
// still put a socket of their own at the path while no scdd runs, and
// scdctl would talk to it). In such a directory its owner or writers could
// replace the socket, or swap a symlink in for it between the bind and the
// chmod, and have scdctl's actions or scdd's chmod go where they choose.
// The embedded default's $TMPDIR/tpsched-<uid> is the case to fear: any
// user can make it first. Root's own directory is trusted as root can do
// all this anyway. A link to a directory is judged by the directory and by
// who owns the link.
func checkControlDir(dir string, euid int) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("control socket directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("control socket directory %s is not a directory (set control_socket in sysconf to a path in a directory of scdd's user, mode 0700)", dir)
	}
	owner := func(fi os.FileInfo) int {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			return int(st.Uid)
		}
		return -1
	}
	refuse := func(what string, uid int, fi os.FileInfo) error {
		mode := uint32(fi.Mode().Perm()) // with the sticky bit where it is set, as ls and chmod write it
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			mode = st.Mode & 0o7777
		}
		return fmt.Errorf("control socket directory %s %s (owner uid %d, mode %04o): another user could replace the socket; "+
			"remove it so that scdd makes it (mode 0700), make it scdd's uid %d and not writable by group or others (chmod go-w), "+
			"or set control_socket in sysconf to a path in a directory of scdd's user",
			dir, what, uid, mode, euid)
	}
	if uid := owner(fi); uid != euid && uid != 0 {
		return refuse("belongs to another user", uid, fi)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return refuse("is writable by group or others", owner(fi), fi)
	}
	if li, err := os.Lstat(dir); err == nil && li.Mode().Type() == os.ModeSymlink {
		if uid := owner(li); uid != euid && uid != 0 {
			return refuse("is a link that belongs to another user", uid, li)
		}
	}
	return nil
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
func (d *doors) controlAllowed(next http.Handler, refused *metrics.Counter) http.Handler {
	n := d.n
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
			if r.Method == http.MethodPost && !strings.HasPrefix(r.URL.Path, "/debug/") {
				// Who changed the node: every action, whatever it logs of
				// its outcome (hold's "service group held" has no asker).
				n.log.Info("control request", "path", r.URL.Path, "query", r.URL.RawQuery,
					"uid", p.cred.Uid, "pid", p.cred.Pid)
			}
			next.ServeHTTP(w, r)
			return
		}
		refused.Inc()
		attrs := []any{"path", r.URL.Path, "why", why}
		if p.cred != nil {
			attrs = append(attrs, "uid", p.cred.Uid, "pid", p.cred.Pid)
		}
		n.log.Warn("control request refused", attrs...)
		// Its connection is closed after the answer: kept alive, a
		// caller that sends requests without reading the refusals holds
		// it for ever (these answers have no write timeout), and
		// controlMaxConns of them the whole socket.
		w.Header().Set("Connection", "close")
		http.Error(w, why, http.StatusForbidden)
	})
}

func (d *doors) answerHold(w http.ResponseWriter, r *http.Request, hold bool) {
	n := d.n
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
	g, _ := n.local.Group(name)
	res.InFlight = g.InFlight()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(res)
}

// answerRestart hands the node's sockets to a new scdd (restart.go) and
// says how it went.
func (d *doors) answerRestart(w http.ResponseWriter, r *http.Request) {
	n := d.n
	res, err := n.Restart(r.Context())
	if err != nil {
		http.Error(w, err.Error(), http.StatusConflict)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(res)
}

// answerPrc serves GET /prc?group= on the control socket. An application
// environment served per subsystem instance (svcpolicy) lists the groups
// of all its instances.
func (d *doors) answerPrc(w http.ResponseWriter, r *http.Request) {
	n := d.n
	groups := []string{r.URL.Query().Get("group")}
	if n.wlm != nil {
		if inst := n.wlm.InstanceGroups(groups[0]); inst != nil {
			groups = inst
		}
	}
	var list []GroupProcesses
	for _, g := range groups {
		l, err := n.local.Processes(g)
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		list = append(list, l...)
	}
	writeJSON(w, list)
}

// answerChprc serves POST /chprc?group=&resident=[&max=] on the control
// socket.
func (d *doors) answerChprc(w http.ResponseWriter, r *http.Request) {
	n := d.n
	q := r.URL.Query()
	resident, err := strconv.Atoi(q.Get("resident"))
	if err != nil {
		http.Error(w, fmt.Sprintf("chprc: resident %q: want a whole number", q.Get("resident")), http.StatusBadRequest)
		return
	}
	maxProcs := -1
	if v := q.Get("max"); v != "" {
		if maxProcs, err = strconv.Atoi(v); err != nil || maxProcs < 0 {
			http.Error(w, fmt.Sprintf("chprc: max %q: want a whole number", v), http.StatusBadRequest)
			return
		}
	}
	res, err := n.local.ChangeProcesses(q.Get("group"), resident, maxProcs)
	var te *netio.Error
	switch {
	case errors.As(err, &te):
		http.Error(w, err.Error(), http.StatusNotFound)
	case err != nil:
		http.Error(w, err.Error(), http.StatusBadRequest)
	default:
		writeJSON(w, res)
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// handOff duplicates the metrics and control listeners (for a new
// process) and stops serving on them (connections open stay served).
func (d *doors) handOff() (metricsF, controlF *os.File, err error) {
	if tl, ok := d.httpLn.(*net.TCPListener); ok {
		if metricsF, err = tl.File(); err != nil {
			return nil, nil, fmt.Errorf("metrics listener: %w", err)
		}
	}
	if ln := d.ctlLn; ln != nil {
		if controlF, err = ln.File(); err != nil {
			if metricsF != nil {
				metricsF.Close()
			}
			return nil, nil, fmt.Errorf("control socket: %w", err)
		}
		ln.SetUnlinkOnClose(false) // the path is the new process's now
		_ = ln.Close()
	}
	if metricsF != nil {
		_ = d.httpLn.Close()
	}
	return metricsF, controlF, nil
}

// letGo is the doors' go-away once a new process serves the node:
// connections kept alive between requests (Go's client, Prometheus, a
// browser) would read this process's status and metrics while it drains,
// its cluster table as it stood at the hand-over, and a control client
// reusing its connection would hold or release groups of a process on its
// way out. The idle ones are closed and the busy ones after their answer,
// so the next request connects, to the new process.
func (d *doors) letGo() {
	for _, srv := range []*http.Server{d.http, d.ctl} {
		if srv != nil {
			srv.SetKeepAlivesEnabled(false)
		}
	}
}

// resume serves the metrics and control listeners again after a failed
// hand-over.
func (d *doors) resume(metricsF, controlF *os.File) {
	// FileListener works on duplicates: the files themselves are closed
	// here, not left to the garbage collector (two descriptors for each
	// restart undone).
	defer closeFiles([]*os.File{metricsF, controlF})
	if metricsF != nil {
		if ln, err := net.FileListener(metricsF); err == nil {
			d.httpLn = ln
			go d.run(d.http, d.httpLimit.listener(ln), "metrics and status endpoint")
		} else {
			d.n.log.Error("restart: the metrics endpoint could not be taken back", "err", err)
		}
	}
	if controlF != nil {
		ln, err := net.FileListener(controlF)
		if ul, ok := ln.(*net.UnixListener); err == nil && ok {
			ul.SetUnlinkOnClose(true)
			d.ctlLn = ul
			go d.run(d.ctl, d.ctlLimit.listener(ul), "control socket")
		} else {
			d.n.log.Error("restart: the control socket could not be taken back", "err", err)
		}
	}
}
