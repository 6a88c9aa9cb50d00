package procmgr

// Under systemd with Delegate=yes, scdd's unit owns a cgroup subtree on the
// v2 hierarchy (/sys/fs/cgroup/system.slice/tpsched.service) that systemd
// leaves to it. The UAPs' v2 cgroups then go under it
// (<unit>/tpsched/scdd-<pid>/<server>), not at the hierarchy's top: a
// systemctl stop (KillMode=mixed) reaches every process a UAP left in a
// session of its own, and a limit on the unit covers its UAPs. The v2
// "no internal processes" rule lets a cgroup with processes of its own
// enable no controller for its children, so scdd first moves itself into
// a leaf, <unit>/scdd (systemd's advice for delegated units; with
// DelegateSubgroup=scdd, systemd 254+, it starts there). Elsewhere (no
// systemd, a unit without Delegate=yes, the root cgroup) the UAPs' cgroups
// stay at each hierarchy's top, and the log says which was chosen and why.
// The v1 hierarchies are always used at their top.

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// daemonLeaf is the cgroup under a delegated one that scdd moves itself
// into.
const daemonLeaf = "scdd"

// v2Delegation is scdd's own delegated cgroup on the v2 hierarchy, under
// which the UAPs' v2 cgroups go.
type v2Delegation struct {
	mount string // the v2 hierarchy's mount point
	dir   string // <mount>/<the unit's cgroup>: the base of tpsched/scdd-<pid>
	moved bool   // scdd moved itself into <dir>/scdd (false: it started there)
}

// apply makes the delegated cgroup the v2 hierarchy's base in mounts: the
// detections put tpsched's groups under a cgroup2 mount's point.
func (d *v2Delegation) apply(mounts []cgroupMount) {
	if d == nil {
		return
	}
	for i := range mounts {
		if mounts[i].fstype == "cgroup2" && mounts[i].point == d.mount {
			mounts[i].point = d.dir
		}
	}
}

// delegatedV2 finds whether process pid (scdd) runs in a cgroup v2 that
// was delegated to it and, when it does, moves pid into the leaf <that
// cgroup>/scdd unless it is there already. With nil it says why the UAPs'
// cgroups stay at the hierarchy's top.
func delegatedV2(mountinfo string, pid int) (*v2Delegation, string) {
	mounts, err := cgroupMounts(mountinfo)
	if err != nil {
		return nil, "no cgroup: " + err.Error()
	}
	mount := ""
	for _, m := range mounts {
		if m.fstype == "cgroup2" {
			mount = m.point
			break
		}
	}
	if mount == "" {
		return nil, "no cgroup v2 hierarchy"
	}
	own, err := ownCgroupV2(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return nil, err.Error()
	}
	if own == "/" {
		return nil, "scdd runs in the v2 hierarchy's root cgroup, not in a unit's"
	}
	dir := filepath.Join(mount, own)
	if filepath.Base(own) == daemonLeaf && delegatedTo(filepath.Dir(dir)) {
		// A restart's new scdd (born in the old one's leaf), or a unit
		// with DelegateSubgroup=scdd.
		return &v2Delegation{mount: mount, dir: filepath.Dir(dir)}, ""
	}
	if !delegatedTo(dir) {
		return nil, fmt.Sprintf("scdd's cgroup %s is not delegated to it (no Delegate=yes: neither trusted.delegate nor user.delegate is set, and it is not owned by uid %d)", dir, os.Geteuid())
	}
	leaf := filepath.Join(dir, daemonLeaf)
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Sprintf("delegated cgroup %s: make the leaf for scdd: %v", dir, err)
	}
	if err := writeCgroupFile(filepath.Join(leaf, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
		_ = unix.Rmdir(leaf)
		return nil, fmt.Sprintf("delegated cgroup %s: move scdd into %s: %v", dir, leaf, err)
	}
	return &v2Delegation{mount: mount, dir: dir, moved: true}, ""
}

// ownCgroupV2 reads a process's cgroup on the v2 hierarchy ("0::<path>")
// from its /proc/<pid>/cgroup.
func ownCgroupV2(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "0::"); ok {
			// " (deleted)" follows a cgroup removed under the process.
			return strings.TrimSuffix(p, " (deleted)"), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s has no cgroup v2 line", file)
}

// delegatedTo says whether dir was delegated to this daemon: systemd marks
// a Delegate=yes unit's cgroup with the xattr trusted.delegate (system
// units, systemd 251+) or user.delegate (user units, 252+), and chowns it
// to the unit's User= (so, for a non-root daemon, owning it is delegation
// on any systemd).
func delegatedTo(dir string) bool {
	buf := make([]byte, 8)
	for _, attr := range []string{"trusted.delegate", "user.delegate"} {
		if n, err := unix.Getxattr(dir, attr, buf); err == nil && string(buf[:n]) == "1" {
			return true
		}
	}
	if euid := os.Geteuid(); euid != 0 {
		if fi, err := os.Stat(dir); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) == euid {
				return unix.Access(filepath.Join(dir, "cgroup.procs"), unix.W_OK) == nil
			}
		}
	}
	return false
}
