package local

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"tpsched/procmgr"
	"tpsched/scd/def"
)

// A UAP's working directory is its server's own, not scdd's: usr
// working_directory when the definition gives one, else a directory the
// node prepares and gives to the server's user (mode 0700), under
// uapDirBase: /var/lib/tpsched/<node_id>/<server> as root (the unit file's
// StateDirectory), else $TMPDIR/tpsched-<uid>/<node_id>/<server>. The
// levels above are root's (mode 0711: each server's user can pass, none can
// list or write them), or the non-root daemon's own (0700).

// rootUAPDirBase is where a root node prepares its servers' directories.
var rootUAPDirBase = "/var/lib/tpsched"

// uapDirBase is the directory under which the node prepares
// <node_id>/<server>.
func uapDirBase() string {
	if os.Geteuid() == 0 {
		return rootUAPDirBase
	}
	return filepath.Join(os.TempDir(), "tpsched-"+strconv.Itoa(os.Geteuid()))
}

// safeName makes a node id or server name one path component.
func safeName(s string) string {
	s = strings.ReplaceAll(s, "/", "_")
	if s == "." || s == ".." || s == "" {
		s = "_" + s
	}
	return s
}

// givenWorkDir is s's working_directory as a path, "" when it gives none.
func givenWorkDir(cfg *def.Config, s *def.Server) string {
	d := s.WorkingDirectory
	if d == "" {
		return ""
	}
	if !filepath.IsAbs(d) && cfg.Dir != "" {
		d = filepath.Join(cfg.Dir, d)
	}
	return d
}

// checkWorkDir: a working_directory the definition gives must be a
// directory (New, so that scdd -check says so).
func checkWorkDir(cfg *def.Config, s *def.Server) error {
	d := givenWorkDir(cfg, s)
	if d == "" {
		return nil
	}
	fi, err := os.Stat(d)
	if err != nil {
		return s.Errorf("working_directory", "%v", err)
	}
	if !fi.IsDir() {
		return s.Errorf("working_directory", "%s is not a directory", d)
	}
	return nil
}

// uapWorkDir is the working directory of s's processes, which run as uid
// and gid (-1: the daemon's): working_directory, or the one the node
// prepares. An error says why the node could not prepare it.
func uapWorkDir(cfg *def.Config, s *def.Server, uid, gid int) (string, error) {
	if d := givenWorkDir(cfg, s); d != "" {
		return d, nil
	}
	return prepareUAPDir(uapDirBase(), safeName(cfg.System.NodeID), safeName(s.Name), uid, gid)
}

// prepareUAPDir makes base/node/server, the last owned by uid:gid (-1: the
// daemon's) with mode 0700, the ones above owned by the daemon with mode
// 0711 (0700 when it is not root). A level that is there already must be a
// directory, not a link, owned by the daemon and writable by no one else:
// otherwise another user could have put it there (base may be in /tmp).
func prepareUAPDir(base, node, server string, uid, gid int) (string, error) {
	dir, err := ownDirs(base, node)
	if err != nil {
		return "", err
	}
	dir = filepath.Join(dir, server)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return "", err
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("%s is not a directory", dir)
	}
	// Mode first, while it may still be scdd's: under the unit scdd has
	// CAP_CHOWN but not CAP_FOWNER, so it cannot chmod its user's
	// directory. One left by an earlier run is taken back for the change.
	if fi.Mode().Perm() != 0o700 {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
			if err := os.Lchown(dir, os.Geteuid(), -1); err != nil {
				return "", err
			}
		}
		if err := os.Chmod(dir, 0o700); err != nil {
			return "", err
		}
	}
	if os.Geteuid() == 0 && (uid >= 0 || gid >= 0) {
		if err := os.Lchown(dir, uid, gid); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// ownDirs makes base/levels... (base's parent must exist or is made 0755),
// each the daemon's with mode 0711 (every user can pass, none list or
// write; 0700 when the daemon is not root), and checks the ones that were
// there (checkOwnDir). It returns the last.
func ownDirs(base string, levels ...string) (string, error) {
	mode := os.FileMode(0o711)
	if os.Geteuid() != 0 {
		mode = 0o700
	}
	if err := os.MkdirAll(filepath.Dir(base), 0o755); err != nil {
		return "", err
	}
	dir := base
	for i := -1; i < len(levels); i++ {
		if i >= 0 {
			dir = filepath.Join(dir, levels[i])
		}
		if err := os.Mkdir(dir, mode); err != nil && !errors.Is(err, fs.ErrExist) {
			return "", err
		}
		if err := checkOwnDir(dir); err != nil {
			return "", err
		}
		if err := os.Chmod(dir, mode); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// LinkDir is procmgr's LinkDir (the links through which modules are
// executed, named as they are): /var/lib/tpsched/<node_id>/exec, root's,
// mode 0711. "" when scdd is not root (it runs modules by their path) or
// the directory cannot be made (said in the log).
func LinkDir(nodeID string, log *slog.Logger) string {
	if os.Geteuid() != 0 {
		return ""
	}
	dir, err := ownDirs(uapDirBase(), safeName(nodeID), "exec")
	if err != nil {
		log.Warn("no directory for the modules' links: UAP processes show a number as their name", "err", err)
		return ""
	}
	return dir
}

// checkOwnDir: dir is a directory (not a link to one) of the daemon's
// user that no one else can write.
func checkOwnDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("%s is not a directory (a link?)", dir)
	case ok && int(st.Uid) != os.Geteuid():
		return fmt.Errorf("%s belongs to uid %d, not to scdd's %d", dir, st.Uid, os.Geteuid())
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("%s is writable by others (mode %04o)", dir, fi.Mode().Perm())
	}
	return nil
}

// uapPidsMax is s's pids limit for procmgr: its uap_pids_max, or with none
// given PidsMaxAuto of its parallel_count maximum.
func uapPidsMax(s *def.Server) int {
	if s.PidsMax == def.AutoLimit {
		return def.PidsMaxAuto(s.MaxProcesses)
	}
	return s.PidsMax
}

// uapMemoryMax is s's memory limit for procmgr: its uap_memory_max, or
// with none given half of the host's memory (0, no limit, if that cannot
// be read).
func uapMemoryMax(s *def.Server) int64 {
	if s.MemoryMax == def.AutoLimit {
		total, err := procmgr.MemTotal()
		if err != nil {
			return 0
		}
		return total / 2
	}
	return s.MemoryMax
}
