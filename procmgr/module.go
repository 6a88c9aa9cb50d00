package procmgr

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// CheckModule says whether a process running as uid and gid (-1: the
// caller's), with no supplementary group, can run module the way a Server
// starts it, and if not, what to do. A root daemon that starts the process
// as another user executes a binary through a descriptor it opened itself,
// so only the file's own permission counts (a module under a 0700
// directory such as /root runs); a script (#!) is run by its path, so the
// user must reach and read it, and reach its interpreter. The kernel
// answers, on a thread of its own that takes the user's file-system
// credentials and ends with them: ACLs and the like count too.
func CheckModule(module string, uid, gid int) error {
	fd, err := unix.Open(module, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", module, err)
	}
	defer unix.Close(fd)
	head := make([]byte, 256)
	n, _ := unix.Pread(fd, head, 0)
	head = head[:n]
	script := bytes.HasPrefix(head, []byte("#!"))
	var st unix.Stat_t
	_ = unix.Fstat(fd, &st)
	other := uid >= 0 || gid >= 0
	who := "scdd's user"
	if other {
		who = fmt.Sprintf("uid %d gid %d, the user the server's processes run as", uid, gid)
	}
	if os.Geteuid() != 0 {
		other = false // a non-root daemon cannot take another user's credentials (nor start one's processes)
	}
	check := func() error {
		if !script {
			if !other {
				return unix.Faccessat(unix.AT_FDCWD, module, unix.X_OK, unix.AT_EACCESS)
			}
			return unix.Faccessat2(fd, "", unix.X_OK, unix.AT_EMPTY_PATH|unix.AT_EACCESS)
		}
		if err := unix.Faccessat(unix.AT_FDCWD, module, unix.R_OK|unix.X_OK, unix.AT_EACCESS); err != nil {
			return fmt.Errorf("script: %w", err)
		}
		interp := scriptInterpreter(head)
		if interp == "" {
			return nil // the kernel says ENOEXEC at the start
		}
		if err := unix.Faccessat(unix.AT_FDCWD, interp, unix.X_OK, unix.AT_EACCESS); err != nil {
			return fmt.Errorf("interpreter %s: %w", interp, err)
		}
		return nil
	}
	if other {
		err = asUser(uid, gid, check)
	} else {
		err = check()
	}
	if err == nil {
		return nil
	}
	mode := fmt.Sprintf("mode %04o, owner %d:%d", st.Mode&0o7777, st.Uid, st.Gid)
	remedy := "or give the server a user that can (usr uid, gid)"
	switch {
	case script && strings.HasPrefix(err.Error(), "interpreter "):
		return fmt.Errorf("%s cannot be run by %s: its %v; install the interpreter where that user can reach it, %s",
			module, who, err, remedy)
	case script:
		return fmt.Errorf("%s is a script, run by its path, and %s cannot read and run it there (%s; %v): "+
			"make it and every directory above it readable and searchable by that user, %s", module, who, mode, errors.Unwrap(err), remedy)
	}
	return fmt.Errorf("%s is not executable by %s (%s; %v): chmod a+x it, %s", module, who, mode, err, remedy)
}

// scriptInterpreter is the interpreter a #! line names ("" if none).
func scriptInterpreter(head []byte) string {
	line, _, _ := bytes.Cut(head[2:], []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// asUser runs f on a thread whose file-system credentials are uid and gid
// (-1: unchanged) with no supplementary group: access checks it makes are
// the user's. The thread is never given back to the Go scheduler: it ends
// when f returns, and its credentials with it. setgroups, setfsuid and
// setfsgid are made as raw system calls, which change the calling thread
// alone (Go's syscall.Setgroups changes every thread of the process).
func asUser(uid, gid int, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked, see above
		if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
			errc <- fmt.Errorf("setgroups: %w", e)
			return
		}
		if gid >= 0 {
			unix.RawSyscall(unix.SYS_SETFSGID, uintptr(gid), 0, 0)
			if cur, _, _ := unix.RawSyscall(unix.SYS_SETFSGID, ^uintptr(0), 0, 0); int(cur) != gid {
				errc <- fmt.Errorf("setfsgid %d: still %d", gid, cur)
				return
			}
		}
		if uid >= 0 {
			unix.RawSyscall(unix.SYS_SETFSUID, uintptr(uid), 0, 0)
			if cur, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, ^uintptr(0), 0, 0); int(cur) != uid {
				errc <- fmt.Errorf("setfsuid %d: still %d", uid, cur)
				return
			}
		}
		errc <- f()
	}()
	return <-errc
}
