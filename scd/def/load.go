package def

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

//go:embed default
var defaultFS embed.FS

// Load reads the definition directory dir: sysconf, scdsvcdef, usrrc and
// svcpolicy (each optional), and every regular file in usr/ (one user
// server each; names starting with '.' or ending with '~' are skipped). At
// least one user server is required. A file that is there but no regular
// file (a named pipe, a directory in place of sysconf) or a link to
// nothing is an error, and so is a file of more than 16 MiB
// (maxDefinitionSize) or 65536 statements (maxStatements). An error in
// one file does not stop the others being read: the error is every one
// found (Errors when there are several).
func Load(dir string) (*Config, error) {
	cfg, err := Check(dir)
	if err != nil {
		return nil, err
	}
	return cfg, nil
}

// Check reads dir as Load does and returns, beside every error found,
// what could be read: sysconf and scdsvcdef as far as they are right, and
// the user servers whose own files and usrrc have no error. scdd -check
// goes on with those to find their modules, so that one run reports every
// error of the directory. Without an error it is Load.
func Check(dir string) (*Config, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("definition directory: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("definition directory %s: not a directory", dir)
	}
	cfg, err := load(os.DirFS(dir), dir, dir)
	cfg.Dir = dir
	return cfg, err
}

// LoadSysconf reads only dir's sysconf: the node's identity and addresses
// (Config.System and Config.Dir; nothing else is filled in, and a
// cluster_key_file is not read). It is for tools that talk to a running
// node (scdctl), which must reach it while another file of the directory
// is being edited or is wrong.
func LoadSysconf(dir string) (*Config, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("definition directory: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("definition directory %s: not a directory", dir)
	}
	var errs collector
	sys, _ := loadSystem(os.DirFS(dir), &errs)
	cfg := &Config{Dir: dir, System: sys, Sched: defaultSched()}
	if err := errs.err(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// LoadDefault returns the embedded one-node definition: the demo user server
// (module uap-echo, services echo, sleep, burn, fail, crash) on
// 127.0.0.1:12000 with metrics on 127.0.0.1:12001.
func LoadDefault() (*Config, error) {
	sub, err := fs.Sub(defaultFS, "default")
	if err != nil {
		return nil, err
	}
	return LoadFS(sub)
}

// LoadFS reads a definition directory laid out as for Load from fsys.
// Config.Dir is left empty.
func LoadFS(fsys fs.FS) (*Config, error) {
	cfg, err := load(fsys, ".", "")
	if err != nil {
		return nil, err
	}
	return cfg, nil
}

// pos is where an operand was given.
type pos struct {
	file string
	line int
}

// loadSystem reads sysconf into the defaults, adding its errors to errs,
// and returns where each operand was given.
func loadSystem(fsys fs.FS, errs *collector) (System, map[string]int) {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	sys := defaultSystem(host)
	stmts, _, err := readOptional(fsys, "sysconf")
	bad := errs.add(err)
	lines, err := apply("sysconf", stmts, systemOperands, nil, &sys, nil)
	bad = errs.add(err) || bad
	if !bad { // all_node against rpc_address, once both read right
		errs.add(checkAllNodes(&sys, lines))
		errs.add(checkPorts(&sys, lines))
	}
	return sys, lines
}

// checkPorts refuses two of the node's listeners on one port of one
// address: the RPC port, the HTTP address and, in a cluster, the name
// port. scdd would stop at the second with 'port taken', naming itself as
// the process that holds it, and scdd -check found nothing.
func checkPorts(s *System, lines map[string]int) error {
	type door struct {
		op, host string
		port     int
	}
	doors := []door{{"rpc_port", s.RPCAddress, s.RPCPort}, {"metrics_address", metricsHost(*s), metricsPort(*s)}}
	if otherNode(s) != "" {
		doors = append(doors, door{"name_port", s.RPCAddress, s.NamePort})
	}
	for i, a := range doors {
		for _, b := range doors[:i] {
			if a.port == 0 || a.port != b.port || !sameAddress(a.host, b.host) {
				continue
			}
			op, other := a.op, b.op
			if lines[b.op] > lines[a.op] {
				op, other = b.op, a.op
			}
			return &Error{File: "sysconf", Line: lines[op], Operand: op,
				Reason: fmt.Sprintf("port %d is %s's too, on the same address: give each its own", a.port, other)}
		}
	}
	return nil
}

// otherNode is an all_node entry that is not this node, or "": with one,
// the node is in a cluster and listens on name_port.
func otherNode(s *System) string {
	for _, n := range s.AllNodes {
		h, p, err := SplitHostPort(n, s.RPCPort)
		if err == nil && !s.IsThisNode(h, p) {
			return n
		}
	}
	return ""
}

// IsThisNode reports whether an all_node entry's host and port name this
// node: its rpc_address and rpc_port, an IP address in any spelling and a
// host name in any case (a name that resolves to this node's address is
// not seen: nothing here resolves names).
func (s *System) IsThisNode(host string, port int) bool {
	return sameHost(host) == sameHost(s.RPCAddress) && port == s.RPCPort
}

// sameAddress reports whether listeners on hosts a and b of one port would
// collide: the same address, or either is every address (0.0.0.0, ::).
func sameAddress(a, b string) bool {
	norm := func(h string) string {
		if h = sameHost(h); h == "localhost" {
			return "127.0.0.1"
		}
		return h
	}
	for _, h := range []string{a, b} {
		if h == "" {
			return true
		}
		if ip := net.ParseIP(h); ip != nil && ip.IsUnspecified() {
			return true
		}
	}
	return norm(a) == norm(b)
}

// load reads the whole directory. It always returns a Config, with what
// could be read, and every error found. label names the directory in
// messages, osDir is it on the file system ("" for LoadFS), for a key file
// outside fsys and for who may read the files.
func load(fsys fs.FS, label, osDir string) (*Config, error) {
	var errs collector
	sys, sysLines := loadSystem(fsys, &errs)
	cfg := &Config{System: sys, Sched: defaultSched()}
	errs.add(loadClusterKey(fsys, osDir, &cfg.System, sysLines))

	stmts, _, err := readOptional(fsys, "scdsvcdef")
	bad := errs.add(err)
	_, err = apply("scdsvcdef", stmts, schedOperands, schedCommands, &cfg.Sched, nil)
	if !(errs.add(err) || bad) {
		errs.add(checkReceiverGroups(cfg, stmts))
	}

	// usrrc: the defaults of every user server.
	rc := &userDef{file: "usrrc", srv: defaultServer(), set: map[string]pos{}}
	rc.srv.WatchTime = cfg.System.WatchTime
	stmts, _, err = readOptional(fsys, "usrrc")
	rcBad := errs.add(err)
	rcBad = errs.add(rc.apply("usrrc", stmts)) || rcBad

	entries, err := fs.ReadDir(fsys, "usr")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs.add(fmt.Errorf("usr: %w", err))
	}
	var users []*userDef
	files := 0
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || strings.HasSuffix(name, "~") {
			continue
		}
		file := path.Join("usr", name)
		fi, err := fs.Stat(fsys, file)
		if err != nil {
			_, err = statFile(fsys, file) // a link to nothing is an error; a file gone since ReadDir is not
			errs.add(err)
			continue
		}
		if !fi.Mode().IsRegular() {
			continue // a directory or the like: no user server
		}
		files++
		src, err := readFS(fsys, file, file)
		if errs.add(err) {
			continue
		}
		stmts, err := Parse(file, src)
		bad := errs.add(err)
		u := rc.clone(file)
		u.srv.Name = name
		u.lines = countLines(src)
		bad = errs.add(u.apply(file, stmts)) || bad
		// The rules between operands only once the server's operands
		// all read: else a wrong value would also be reported missing.
		if bad || rcBad || errs.add(u.check(cfg)) {
			continue
		}
		users = append(users, u)
	}
	if files == 0 {
		errs.add(fmt.Errorf("no user servers in %s", filepath.Join(label, "usr")))
	}
	sort.Slice(users, func(i, j int) bool { return users[i].srv.Name < users[j].srv.Name })
	users = checkServers(cfg, users, sysLines, &errs)
	cfg.Usrrc = rc.srv
	cfg.Policy, err = loadPolicy(fsys)
	errs.add(err)
	for _, u := range users {
		u.srv.given = make(map[string]pos, len(u.set))
		for op, p := range u.set {
			u.srv.given[op] = p
		}
		cfg.Servers = append(cfg.Servers, u.srv)
	}
	return cfg, errs.err()
}

// readOptional parses file if it exists.
func readOptional(fsys fs.FS, file string) ([]Stmt, int, error) {
	if there, err := statFile(fsys, file); !there {
		return nil, 0, err
	}
	src, err := readFS(fsys, file, file)
	if err != nil {
		return nil, 0, err
	}
	stmts, err := Parse(file, src)
	return stmts, countLines(src), err
}

// maxDefinitionSize is the most bytes a definition file (and betranrc, and
// a cluster_key_file) may have. Real ones are far below it: the longest
// this package takes, a svcpolicy with 1024 classes, 1024 rules and 1024
// environments, is a few hundred KB. The bound is there because every file
// is read whole before it is parsed: without one, a sparse file of 2 GiB
// or a log written into the directory by mistake made scdd and scdd -check
// take as much memory, and its statements as much again.
const maxDefinitionSize = 16 << 20

// readFS reads the definition file file of fsys whole, up to
// maxDefinitionSize bytes. Errors name it once, as name.
func readFS(fsys fs.FS, file, name string) ([]byte, error) {
	f, err := fsys.Open(file)
	if err != nil {
		return nil, fileError(name, err)
	}
	defer f.Close()
	return readOpened(name, f)
}

// readOS is readFS for a path of the file system (outside the definition
// directory's fs.FS: betranrc, an absolute cluster_key_file). It opens
// with O_NONBLOCK: a named pipe there is then refused by readOpened at
// once, where a plain open waited for a writer, for ever (nothing looks at
// betranrc before the open, as statFile does for the directory's files).
// O_NONBLOCK changes nothing for a regular file.
func readOS(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fileError(path, err)
	}
	defer f.Close()
	return readOpened(path, f)
}

// readOpened reads f, the opened file name, whole. What is no regular file
// is refused (statFile looked before the open, but the file may have been
// replaced since). A file whose size is past maxDefinitionSize is refused
// before a byte is read; one that grows past it while it is read (a log
// being written) is cut off by the LimitReader and refused too.
func readOpened(name string, f fs.File) ([]byte, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, fileError(name, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%s)", name, fileType(fi.Mode()))
	}
	if fi.Size() > maxDefinitionSize {
		return nil, fmt.Errorf("%s: %d bytes, more than a definition file may have (%d, 16 MiB)", name, fi.Size(), int64(maxDefinitionSize))
	}
	src, err := io.ReadAll(io.LimitReader(f, maxDefinitionSize+1))
	if err != nil {
		return nil, fileError(name, err)
	}
	if len(src) > maxDefinitionSize {
		return nil, fmt.Errorf("%s: grew past %d bytes while it was read, more than a definition file may have (16 MiB)", name, int64(maxDefinitionSize))
	}
	return src, nil
}

// fileError is err about the file name, naming it once: a PathError's own
// path (the same name) and operation are left out.
func fileError(name string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return fmt.Errorf("%s: %w", name, err)
}

// statFile reports whether the definition file is there to be read. It
// refuses, rather than reads, what is no regular file: a named pipe or a
// device would hold the read for ever (or without end). A symbolic link
// to nothing is an error, not a file left out: the operator meant one.
func statFile(fsys fs.FS, file string) (bool, error) {
	fi, err := fs.Stat(fsys, file)
	if errors.Is(err, fs.ErrNotExist) {
		if _, lerr := fs.Lstat(fsys, file); lerr == nil {
			return false, fmt.Errorf("%s: a symbolic link to a file that does not exist", file)
		}
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("%s: %w", file, err)
	}
	if !fi.Mode().IsRegular() {
		return false, fmt.Errorf("%s: not a regular file (%s)", file, fileType(fi.Mode()))
	}
	return true, nil
}

// fileType names what a file that is not a regular one is.
func fileType(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "mode " + m.String()
}

func countLines(src []byte) int {
	n := bytes.Count(src, []byte{'\n'})
	if len(src) > 0 && src[len(src)-1] != '\n' {
		n++
	}
	return n
}

// apply runs the set statements of one file through table and its
// commands through cmds. putenv is handed to env, or is an error when env
// is nil. It returns the line of every operand given, and of every command
// as "name command" (the last, when given more than once). A statement in
// error is left out and the others still apply: the error is every one.
func apply[T any](file string, stmts []Stmt, table map[string]operand[T], cmds map[string]command[T], dst *T, env func(Stmt) error) (map[string]int, error) {
	lines := map[string]int{}
	var errs collector
	for _, st := range stmts {
		if st.Kind == StmtCommand {
			cmd, ok := cmds[st.Name]
			if !ok {
				why := "unknown command"
				if len(cmds) == 0 {
					why += " (this file takes set statements only)"
				} else if s := Suggest(st.Name, slices.Collect(maps.Keys(cmds))); s != "" {
					why += " (did you mean " + s + "?)"
				}
				errs.add(&Error{File: file, Line: st.Line, Operand: st.Name, Reason: why})
				continue
			}
			flags, err := flagsOf(st, cmd.options())
			if err == nil {
				err = cmd.set(dst, flags)
			}
			if err != nil {
				errs.add(&Error{File: file, Line: st.Line, Operand: st.Name, Reason: err.Error()})
				continue
			}
			lines[st.Name+" command"] = st.Line
			continue
		}
		if st.Kind == StmtPutenv {
			if env == nil {
				errs.add(&Error{File: file, Line: st.Line, Operand: "putenv", Reason: "only allowed in usrrc and usr files"})
				continue
			}
			errs.add(env(st))
			continue
		}
		if r, ok := refusedOperands[st.Name]; ok {
			errs.add(&Error{File: file, Line: st.Line, Operand: st.Name, Reason: r.why})
			continue
		}
		op, ok := table[st.Name]
		if !ok {
			errs.add(&Error{File: file, Line: st.Line, Operand: st.Name, Reason: unknownOperand(st.Name, table)})
			continue
		}
		if err := op.set(dst, st.Values); err != nil {
			errs.add(&Error{File: file, Line: st.Line, Operand: st.Name, Reason: err.Error()})
			continue
		}
		lines[st.Name] = st.Line
	}
	return lines, errs.err()
}

func checkAllNodes(s *System, lines map[string]int) error {
	seen := map[string]string{}
	for _, n := range s.AllNodes {
		h, p, _ := SplitHostPort(n, s.RPCPort)
		key := fmt.Sprintf("%s:%d", sameHost(h), p)
		if prev, ok := seen[key]; ok {
			return &Error{File: "sysconf", Line: lines["all_node"], Operand: "all_node",
				Reason: fmt.Sprintf("%q and %q are the same node", shown(prev), shown(n))}
		}
		seen[key] = n
		// A node listening on loopback cannot be reached from another
		// host (and memberlist bound there cannot reach one). Host names
		// are not resolved here: only addresses can be judged.
		if ip := net.ParseIP(h); ip != nil && !ip.IsLoopback() && isLoopbackHost(s.RPCAddress) {
			addr := "rpc_address " + s.RPCAddress
			if _, given := lines["rpc_address"]; !given {
				addr += " (the default)"
			}
			return &Error{File: "sysconf", Line: lines["all_node"], Operand: "all_node",
				Reason: fmt.Sprintf("%q is on another host, but this node listens on %s, which no other host can reach: set rpc_address to this node's address", shown(n), addr)}
		}
	}
	return nil
}

// sameHost is h spelt as every spelling of the same host is: an address
// in its shortest form (::1 for 0:0::1), a host name in lower case (host
// names are not told apart by case).
func sameHost(h string) string {
	if ip := net.ParseIP(h); ip != nil {
		return ip.String()
	}
	return strings.ToLower(h)
}

// isLoopbackHost reports whether h is a loopback address or names one by
// convention (localhost). Other host names count as not loopback.
func isLoopbackHost(h string) bool {
	if ip := net.ParseIP(h); ip != nil {
		return ip.IsLoopback()
	}
	h = strings.ToLower(strings.TrimSuffix(h, "."))
	return h == "localhost" || strings.HasSuffix(h, ".localhost")
}

// loadClusterKey reads cluster_key_file into ClusterKey and checks who can
// read the key where it is kept, as ssh does for a private key: every UAP
// runs as a user of its own, and one that can read the key can pose as a
// node. A key file others can read is refused; one its group can read, or
// a sysconf with cluster_key that others can read, is a warning.
func loadClusterKey(fsys fs.FS, osDir string, s *System, lines map[string]int) error {
	fail := func(format string, args ...any) error {
		return &Error{File: "sysconf", Line: lines["cluster_key_file"], Operand: "cluster_key_file", Reason: fmt.Sprintf(format, args...)}
	}
	if s.clusterKeyFile == "" {
		if s.ClusterKey == "" || osDir == "" {
			return nil
		}
		if fi, err := fs.Stat(fsys, "sysconf"); err == nil && fi.Mode().Perm()&0o044 != 0 {
			s.keyWarning = fmt.Sprintf("sysconf: it holds cluster_key and users other than its owner can read it (mode %04o): "+
				"chmod 600 %s, or use cluster_key_file (docs/WARNINGS.md#cluster_key-readable)", fi.Mode().Perm(), filepath.Join(osDir, "sysconf"))
		}
		return nil
	}
	if s.ClusterKey != "" {
		return fail("cluster_key is given too: give the key in one place")
	}
	path := s.clusterKeyFile
	var fi fs.FileInfo
	var key []byte
	var err error
	switch {
	case filepath.IsAbs(path) || (osDir != "" && !fs.ValidPath(path)):
		if !filepath.IsAbs(path) {
			path = filepath.Join(osDir, path)
		}
		if fi, err = os.Stat(path); err == nil && fi.Mode().IsRegular() {
			key, err = readOS(path)
		}
	default:
		if osDir != "" {
			path = filepath.Join(osDir, path)
		}
		if fi, err = fs.Stat(fsys, s.clusterKeyFile); err == nil && fi.Mode().IsRegular() {
			key, err = readFS(fsys, s.clusterKeyFile, path)
		}
	}
	if err != nil {
		return fail("%v", err)
	}
	if !fi.Mode().IsRegular() { // not read: a named pipe would hold the read for ever
		return fail("%s is not a regular file (%s)", path, fileType(fi.Mode()))
	}
	if perm := fi.Mode().Perm(); perm&0o004 != 0 {
		return fail("%s is readable by every user (mode %04o), so every UAP can read the key: chmod 600 it", path, perm)
	} else if perm&0o040 != 0 {
		s.keyWarning = fmt.Sprintf("sysconf: cluster_key_file %s is readable by its group (mode %04o): chmod 600 it unless that group is meant to hold the key "+
			"(docs/WARNINGS.md#cluster_key-readable)", path, perm)
	}
	s.ClusterKey = strings.TrimRight(string(key), "\r\n")
	if n := len(s.ClusterKey); n < 16 || n > 1024 {
		return fail("%s: the key has %d bytes, want 16..1024", path, n)
	}
	return nil
}

// Warnings are what an operator should hear when the node starts (scdd
// logs them, scdd -check prints them): definitions that are valid but
// open the node more than they may mean to.
func (s *System) Warnings() []string {
	var w []string
	if s.keyWarning != "" {
		w = append(w, s.keyWarning)
	}
	if !isLoopbackHost(s.RPCAddress) && s.ClusterKey == "" {
		// The name port is listened on only in a cluster.
		ports := fmt.Sprintf("port %d", s.RPCPort)
		if otherNode(s) != "" {
			ports = fmt.Sprintf("ports %d and %d", s.RPCPort, s.NamePort)
		}
		w = append(w, fmt.Sprintf("sysconf: rpc_address %s is not loopback and there is no cluster_key: "+
			"anyone who reaches %s can pose as a node; set cluster_key (docs/WARNINGS.md#no-cluster_key-off-loopback)",
			s.RPCAddress, ports))
	}
	return w
}

// Errorf is an error about operand of s found after loading (by the node,
// say a module that does not exist), at the file and line where the
// operand was given: the server's file or usrrc, or the end of the
// server's file when the operand kept its default.
func (s *Server) Errorf(operand, format string, args ...any) error {
	p, ok := s.given[operand]
	if !ok {
		p, ok = s.given[operand+" command"]
	}
	if !ok {
		p = pos{file: s.File}
	}
	return &Error{File: p.file, Line: p.line, Operand: operand, Reason: fmt.Sprintf(format, args...)}
}

// userDef is a user server being read: usrrc's values overlaid by its file.
type userDef struct {
	file  string // usr/<name>, or usrrc for the template
	lines int    // lines in file, for operands that are missing
	srv   Server
	set   map[string]pos // operands given, and where
}

func (u *userDef) clone(file string) *userDef {
	c := &userDef{file: file, srv: u.srv, set: make(map[string]pos, len(u.set))}
	c.srv.File = file
	c.srv.Services = append([]Service(nil), u.srv.Services...)
	c.srv.Env = append([]string(nil), u.srv.Env...)
	for k, v := range u.set {
		c.set[k] = v
	}
	return c
}

func (u *userDef) apply(file string, stmts []Stmt) error {
	// Where each variable is in Env: looking through Env for each putenv
	// made a file of many of them take time in the square of their number.
	at := make(map[string]int, len(u.srv.Env))
	for i, e := range u.srv.Env {
		name, _, _ := strings.Cut(e, "=")
		at[name] = i
	}
	putenv := func(st Stmt) error {
		kv := st.Name + "=" + st.Values[0]
		if i, ok := at[st.Name]; ok { // usrrc's value, overridden
			u.srv.Env[i] = kv
			return nil
		}
		at[st.Name] = len(u.srv.Env)
		u.srv.Env = append(u.srv.Env, kv)
		return nil
	}
	var errs collector
	cmdLine := 0
	for i := 0; i < len(stmts); i++ {
		st := stmts[i]
		if st.Kind == StmtCommand && st.Name == "scdmulti" {
			if cmdLine != 0 {
				errs.add(&Error{File: file, Line: st.Line, Operand: st.Name, Reason: fmt.Sprintf("given twice (first at line %d): a server is bound to one receiver group", cmdLine)})
				stmts = append(stmts[:i:i], stmts[i+1:]...)
				i--
				continue
			}
			cmdLine = st.Line
		}
	}
	lines, err := apply(file, stmts, serverOperands, serverCommands, &u.srv, putenv)
	for op, l := range lines {
		u.set[op] = pos{file, l}
	}
	errs.add(err)
	return errs.err()
}

// blame returns where the latest of ops was given: the server's own file
// before usrrc, then the higher line. An operand nobody gave is blamed on
// the end of the server's file.
func (u *userDef) blame(ops ...string) (pos, string) {
	best, bestOp, found := pos{}, ops[0], false
	for _, op := range ops {
		p, ok := u.set[op]
		if !ok {
			continue
		}
		if !found || (p.file == u.file && best.file != u.file) || (p.file == best.file && p.line > best.line) {
			best, bestOp, found = p, op, true
		}
	}
	if !found {
		best = pos{u.file, max(u.lines, 1)}
	}
	return best, bestOp
}

// fail returns an error at the latest of ops.
func (u *userDef) fail(ops []string, format string, args ...any) error {
	p, op := u.blame(ops...)
	op = strings.TrimSuffix(op, " command") // a command is named like an operand
	why := fmt.Sprintf(format, args...)
	if p.file != u.file {
		why += " (for " + u.file + ")"
	}
	return &Error{File: p.file, Line: p.line, Operand: op, Reason: why}
}

func ops(o ...string) []string { return o }

// check applies the rules between one server's operands.
//
// Table 3-14 thresholds: the documents give the table, not the rule between
// U1,U2 and D0,D1. This package requires
//
//	U1 <= U2 and D0 <= D1     (otherwise a row of the table is empty)
//	D0 < U1                   (else a queue length moves LEVEL0 up to LEVEL1 and straight back)
//	D1 < U2                   (else a queue length moves LEVEL2 down to LEVEL1 and straight back)
//	U2 <= queue_size          (else LEVEL2 can never be reached by queue length)
//
// so 0 <= D0 < U1 <= U2 <= queue_size and D0 <= D1 < U2.
func (u *userDef) check(cfg *Config) error {
	s := &u.srv
	var errs collector
	for _, op := range []string{"service_group", "service", "module"} {
		if _, ok := u.set[op]; !ok {
			errs.add(&Error{File: u.file, Line: max(u.lines, 1), Operand: op, Reason: "required (set it in this file or in usrrc)"})
		}
	}
	if err := errs.err(); err != nil {
		return err
	}
	if _, ok := u.set["watch_time"]; !ok {
		s.WatchTime = cfg.System.WatchTime
	}
	if _, ok := u.set["uap_pids_max"]; !ok {
		s.PidsMax = cfg.System.uapPidsMax
	}
	if _, ok := u.set["uap_memory_max"]; !ok {
		s.MemoryMax = cfg.System.uapMemoryMax
	}
	if s.ReceiveFrom == ReceiveSocket && (s.Resident != 1 || s.MaxProcesses != 1) {
		errs.add(u.fail(ops("receive_from", "parallel_count"),
			"a socket-receiving server runs exactly one resident process (parallel_count = 1), got %d,%d", s.Resident, s.MaxProcesses))
	}
	if s.RefreshProcess {
		if s.Resident > 0 {
			errs.add(u.fail(ops("scd_refresh_process", "parallel_count"),
				"refresh needs no resident process (parallel_count = 0,max), got resident %d", s.Resident))
		}
		if s.BalanceCount > 0 {
			errs.add(u.fail(ops("scd_refresh_process", "balance_count"),
				"refresh needs balance_count 0, got %d", s.BalanceCount))
		}
	}
	errs.add(u.checkThresholds())
	gidOfUID := s.UID >= 0 && s.GID < 0
	if gidOfUID {
		s.GID = primaryGID(s.UID)
	}
	if !cfg.System.uapAllowRoot {
		switch {
		case s.UID == 0:
			errs.add(u.fail(ops("uid"), "root would run the server's processes; set uap_allow_root = Y in sysconf to allow it"))
		case s.GID == 0 && gidOfUID:
			errs.add(u.fail(ops("uid"), "user %d's primary group is root (gid 0), which would run the server's processes; "+
				"name a gid, or set uap_allow_root = Y in sysconf to allow it", s.UID))
		case s.GID == 0:
			errs.add(u.fail(ops("gid"), "group root (gid 0) would run the server's processes; set uap_allow_root = Y in sysconf to allow it"))
		}
	}
	errs.add(u.checkReceiverGroup(cfg))
	return errs.err()
}

// checkReceiverGroup checks the server's receiver group (usr scdmulti)
// against scdsvcdef's.
func (u *userDef) checkReceiverGroup(cfg *Config) error {
	s := &u.srv
	if _, bound := u.set["scdmulti command"]; bound {
		found := false
		for _, g := range cfg.Sched.ReceiverGroups {
			found = found || g.Name == s.ReceiverGroup
		}
		if !found {
			var names []string
			for _, g := range cfg.Sched.ReceiverGroups {
				names = append(names, g.Name)
			}
			why := fmt.Sprintf("receiver group %q is not defined in scdsvcdef (scdmulti -g %s -m COUNT -p PORT)", shown(s.ReceiverGroup), shown(s.ReceiverGroup))
			if sug := Suggest(s.ReceiverGroup, names); sug != "" {
				why += " (did you mean " + sug + "?)"
			}
			return u.fail(ops("scdmulti command"), "%s", why)
		}
		if s.ReceiveFrom == ReceiveSocket {
			return u.fail(ops("scdmulti command", "receive_from"), "receiver groups are for servers that receive from a queue (000: multi-scheduler daemons are grouped by queue-receiving servers); this one has receive_from = socket")
		}
		if _, given := u.set["scdmulti"]; given && !s.multi {
			return u.fail(ops("scdmulti", "scdmulti command"), "set scdmulti = N contradicts scdmulti -g %s, which binds the server to a receiver group: remove one",
				shown(s.ReceiverGroup))
		}
	} else if _, given := u.set["scdmulti"]; given {
		if s.multi && cfg.Sched.Multi < 2 {
			return u.fail(ops("scdmulti"), "needs scdmulti of 2 or more in scdsvcdef, which has %d", cfg.Sched.Multi)
		}
		if !s.multi && cfg.Sched.Multi >= 2 {
			return u.fail(ops("scdmulti"), "N is not supported: all %d receiving sockets of scdsvcdef's scdmulti take every group's calls; remove it",
				cfg.Sched.Multi)
		}
	}
	return nil
}

// checkThresholds checks Table 3-14's thresholds against each other and
// queue_size (see check).
func (u *userDef) checkThresholds() error {
	s := &u.srv
	_, up := u.set["levelup_queue_count"]
	_, down := u.set["leveldown_queue_count"]
	switch {
	case up && !down:
		return u.fail(ops("levelup_queue_count"), "given without leveldown_queue_count (Table 3-14 needs both)")
	case down && !up:
		return u.fail(ops("leveldown_queue_count"), "given without levelup_queue_count (Table 3-14 needs both)")
	case up && down:
		U1, U2, D0, D1 := s.LevelUp[0], s.LevelUp[1], s.LevelDown[0], s.LevelDown[1]
		if D0 >= U1 {
			return u.fail(ops("levelup_queue_count", "leveldown_queue_count"),
				"D0 %d must be below U1 %d (Table 3-14: 0 <= D0 < U1 <= U2)", D0, U1)
		}
		if D1 >= U2 {
			return u.fail(ops("levelup_queue_count", "leveldown_queue_count"),
				"D1 %d must be below U2 %d (Table 3-14: D0 <= D1 < U2)", D1, U2)
		}
		if U2 > s.QueueSize {
			return u.fail(ops("levelup_queue_count", "queue_size"),
				"U2 %d exceeds queue_size %d, so LEVEL2 could never be reached", U2, s.QueueSize)
		}
		s.LevelThresholds = true
	}
	return nil
}

// checkReceiverGroups checks the named receiver groups against sysconf's
// ports and netio's limit on receiving sockets.
func checkReceiverGroups(cfg *Config, stmts []Stmt) error {
	line := func(name string) int {
		for _, st := range stmts {
			if st.Kind == StmtCommand && st.Name == "scdmulti" {
				for _, f := range st.Flags {
					if f.Name == "g" && f.Value == name {
						return st.Line
					}
				}
			}
		}
		return 0
	}
	var errs collector
	total := cfg.Sched.Multi
	for _, g := range cfg.Sched.ReceiverGroups {
		fail := func(format string, args ...any) {
			errs.add(&Error{File: "scdsvcdef", Line: line(g.Name), Operand: "scdmulti", Reason: fmt.Sprintf(format, args...)})
		}
		switch {
		case g.Port != 0 && g.Port == cfg.System.RPCPort:
			fail("receiver group %s: port %d is rpc_port, the default group's", shown(g.Name), g.Port)
		case g.Port != 0 && g.Port == cfg.System.NamePort:
			fail("receiver group %s: port %d is name_port", shown(g.Name), g.Port)
		case g.Port != 0 && g.Port == metricsPort(cfg.System) && sameAddress(cfg.System.RPCAddress, metricsHost(cfg.System)):
			fail("receiver group %s: port %d is metrics_address's", shown(g.Name), g.Port)
		}
		total += g.Count
		if total > maxReceivingSockets {
			fail("receiver group %s: %d receiving sockets in all, at most %d", shown(g.Name), total, maxReceivingSockets)
			break
		}
	}
	return errs.err()
}

// metricsHost and metricsPort are metrics_address's host and port (0 when
// it has none).
func metricsHost(s System) string {
	h, _, _ := net.SplitHostPort(s.MetricsAddress)
	return h
}

func metricsPort(s System) int {
	_, p, _ := net.SplitHostPort(s.MetricsAddress)
	n, _ := strconv.Atoi(p)
	return n
}

// maxReceivingSockets is the most receiving sockets of all groups together
// (an event loop each; netio's and the steering program's limit).
const maxReceivingSockets = 256

// checkServers applies the rules between servers, adding what breaks them
// to errs, and returns the servers that may run (a second server of a
// group is not one).
func checkServers(cfg *Config, users []*userDef, sysLines map[string]int, errs *collector) []*userDef {
	byGroup := map[string]*userDef{}
	resident := 0
	var ok []*userDef
	for _, u := range users {
		prev, dup := byGroup[u.srv.ServiceGroup]
		if !dup {
			byGroup[u.srv.ServiceGroup] = u
			resident += u.srv.Resident
			ok = append(ok, u)
			continue
		}
		// A service group is one user server's: its schedule queue, its
		// processes and their CPU priority are the server's.
		errs.add(u.fail(ops("service_group"), "service group %q is served by %s already (one user server per group)",
			shown(u.srv.ServiceGroup), prev.file))
	}
	if m := cfg.System.MaxProcesses; m > 0 && resident > m {
		errs.add(&Error{File: "sysconf", Line: sysLines["max_processes"], Operand: "max_processes",
			Reason: fmt.Sprintf("%d is below the %d resident processes of the user servers", m, resident)})
	}
	return ok
}
