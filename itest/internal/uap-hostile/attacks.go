package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The attacks on scdd, the other UAPs and the node's processes (hostile,
// escape, forkbomb, window), and what they report.

func report(what string, err error) {
	res := "refused: " + fmt.Sprint(err)
	if err == nil {
		res = "SUCCEEDED"
	}
	fmt.Printf("HOSTILE: %s: %s\n", what, res)
}

// scddPID is the pid of the scdd that started this process, as the host
// sees it: /proc/self/status (getppid says 0 in a pid namespace of its own).
func scddPID() int {
	if p := parentOf("/proc/self"); p > 0 {
		return p
	}
	return os.Getppid()
}

// reachScdd tries what scdd's descriptors and environment offered a UAP
// before issue 19: its log file, descriptors it inherited, its working
// directory, privileges a setuid program would give.
func reachScdd() {
	// A forged record: in scdd's own log file it would be one; through
	// the output pipe it is a line of this process's output, quoted.
	fmt.Println(`time=2026-01-01T00:00:00Z level=ERROR msg="scdd forged by the hostile UAP"`)
	_, err := syscall.Seek(1, 0, 0)
	report("seek scdd's log to its start", err)
	report("truncate scdd's log", syscall.Ftruncate(1, 0))
	// O_NONBLOCK on a shared file description made scdd's own writes fail
	// with EAGAIN; on the UAP's own pipe end it is the UAP's business.
	if fl, err := unix.FcntlInt(2, unix.F_GETFL, 0); err == nil {
		_, err = unix.FcntlInt(2, unix.F_SETFL, fl|unix.O_NONBLOCK)
		var st unix.Stat_t
		if err == nil && unix.Fstat(2, &st) == nil && st.Mode&unix.S_IFMT != unix.S_IFIFO {
			report("set O_NONBLOCK on scdd's log", nil)
		} else {
			report("set O_NONBLOCK on scdd's log", fmt.Errorf("stderr is a pipe of its own (%v)", err))
		}
		_, _ = unix.FcntlInt(2, unix.F_SETFL, fl)
	}
	leaked := 0
	for fd := 7; fd < 1024; fd++ { // 3 to 6 are its own: area, group page, doorbell, control line
		target, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
		if err != nil || strings.HasPrefix(target, "/sys/fs/cgroup/") || strings.HasPrefix(target, "anon_inode:") {
			continue // none, or the Go runtime's own (GOMAXPROCS's cgroup files, the netpoller)
		}
		buf := make([]byte, 64)
		_ = syscall.SetNonblock(fd, true) // a socket or pipe with nothing to read must not hold the probe
		if n, err := syscall.Read(fd, buf); err == nil || n > 0 {
			report(fmt.Sprintf("read descriptor %d it inherited (%s)", fd, target), nil)
			leaked++
		}
	}
	if leaked == 0 {
		report("read a descriptor it inherited beyond 0-6", errors.New("none is open"))
	}
	wd, _ := os.Getwd()
	fmt.Printf("HOSTILE-INFO: working directory %s\n", wd)
	if scddWD, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", scddPID())); err == nil && scddWD == wd {
		report("run in scdd's working directory", nil)
	} else {
		report("run in scdd's working directory", fmt.Errorf("its own %s", wd))
	}
	nnp := ""
	if st, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(line, "NoNewPrivs:"); ok {
				nnp = strings.TrimSpace(v)
			}
		}
	}
	if nnp == "0" {
		report("run without no_new_privs (a setuid program would gain privileges)", nil)
	} else {
		report("run without no_new_privs (a setuid program would gain privileges)", fmt.Errorf("NoNewPrivs %s", nnp))
	}
	if path := os.Getenv("TPSCHED_HOSTILE_CONTROL"); path != "" {
		report("hold group b through the control socket", controlHold(path))
	}
}

// controlHold asks scdd's control socket to hold group b.
func controlHold(path string) error {
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("POST /hold?group=b HTTP/1.0\r\nHost: scdd\r\n\r\n")); err != nil {
		return err
	}
	b, _ := io.ReadAll(c)
	status, _, _ := strings.Cut(string(b), "\r\n")
	if strings.Contains(status, " 200 ") {
		return nil
	}
	return errors.New(status)
}

func hostile() {
	const area, group, bell = areaFD, groupFD, bellFD
	// The group page.
	_, err := syscall.Mmap(group, 0, pageSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	report("mmap the group page writable", err)
	if ro, err := syscall.Mmap(group, 0, pageSize, syscall.PROT_READ, syscall.MAP_SHARED); err == nil {
		report("mprotect the group page writable", syscall.Mprotect(ro, syscall.PROT_READ|syscall.PROT_WRITE))
	}
	_, err = syscall.Pwrite(group, []byte{1}, gClosed)
	report("pwrite the group page's closed flag", err)
	report("ftruncate the group page", syscall.Ftruncate(group, 0))
	// Other processes: its scdd and every other UAP of that node. (Nodes
	// on one host give servers of the same name the same user, as
	// processes of one server share theirs; another test's node running
	// this same server beside us is not what is tested.)
	// Not its siblings (uap-hostile too, skipped by name below): the
	// window experiment (TPSCHED_HOSTILE=window) is theirs.
	self, node := selfPID(), scddPID()
	pids, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range pids {
		pid, _ := strconv.Atoi(filepath.Base(p))
		if pid == self || pid == 1 || (pid != node && parentOf(p) != node) {
			continue
		}
		comm, _ := os.ReadFile(p + "/comm")
		name := string(comm[:max(0, len(comm)-1)])
		if name != "scdd" && name != "uap-echo" {
			continue
		}
		for _, fd := range []string{"3", "4", "5"} {
			f, err := os.OpenFile(p+"/fd/"+fd, os.O_RDWR, 0)
			if err == nil {
				f.Close()
			}
			report(fmt.Sprintf("open %s's (pid %d) fd %s", name, pid, fd), err)
		}
		f, err := os.Open(p + "/mem")
		if err == nil {
			f.Close()
		}
		report(fmt.Sprintf("open %s's (pid %d) memory", name, pid), err)
		_, err = os.ReadFile(p + "/environ")
		report(fmt.Sprintf("read %s's (pid %d) environment", name, pid), err)
		report(fmt.Sprintf("ptrace-attach %s (pid %d)", name, pid), syscall.PtraceAttach(pid))
		if name == "scdd" {
			report("SIGKILL scdd", syscall.Kill(pid, syscall.SIGKILL))
		}
	}
	reachScdd()
	fmt.Println("HOSTILE: probes done")
	serveForged(area, bell, false)
}

// serveForged answers its calls with forgeries (see the package comment).
// With allBad every completion has an unknown status.
func serveForged(area, bell int, allBad bool) {
	size := int64(0)
	if fi, err := os.NewFile(uintptr(area), "area").Stat(); err == nil {
		size = fi.Size()
	}
	mem, err := syscall.Mmap(area, 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		fmt.Println("HOSTILE: cannot map its own area:", err)
		os.Exit(4)
	}
	base := unsafe.Pointer(&mem[0])
	u32 := func(off int) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Add(base, off)) }
	u64 := func(off int) *atomic.Uint64 { return (*atomic.Uint64)(unsafe.Add(base, off)) }
	k := uint64(u32(pMailboxes).Load())
	stride := (len(mem) - pBuffer) / int(k)
	ring := func() {
		var one [8]byte
		binary.LittleEndian.PutUint64(one[:], 1)
		syscall.Write(bell, one[:])
	}
	u32(pState).Store(stateReady)
	ring()
	seen := uint64(0)
	for {
		no := u64(pDispatchNo).Load()
		if no == seen {
			for range 100 {
				ring() // without cause
			}
			time.Sleep(time.Millisecond)
			continue
		}
		seen = no
		i := int(no % k)
		mb := pMailbox + i*mailboxSize
		u64(mb + mClaim).Store(no<<2 | 1)
		kind := no % 4
		if allBad {
			kind = 1
		}
		switch kind {
		case 1: // an unknown status
			u32(mb + mStatus).Store(99)
			u64(pDoneNo).Store(no)
		case 2: // a reply longer than its buffer
			u32(mb + mStatus).Store(0)
			u32(mb + mReplyLen).Store(1 << 30)
			u64(pDoneNo).Store(no)
		case 3: // completed ahead, with its own spoiled reply
			n := copy(mem[pBuffer+i*stride:], "spoiled by the hostile UAP")
			u32(mb + mStatus).Store(0)
			u32(mb + mReplyLen).Store(uint32(n))
			u64(pDoneNo).Store(no + 1000)
		default: // what the request said, but spoiled
			n := copy(mem[pBuffer+i*stride:], "spoiled by the hostile UAP")
			u32(mb + mStatus).Store(0)
			u32(mb + mReplyLen).Store(uint32(n))
			u64(pDoneNo).Store(no)
		}
		ring()
	}
}

// parentOf is the parent pid of the process at /proc/PID, 0 if unknown.
func parentOf(proc string) int {
	status, _ := os.ReadFile(proc + "/status")
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			ppid, _ := strconv.Atoi(strings.TrimSpace(v))
			return ppid
		}
	}
	return 0
}

// selfPID is this process's pid as the host sees it (1 in a pid
// namespace of its own).
func selfPID() int {
	if s, err := os.Readlink("/proc/self"); err == nil {
		if pid, err := strconv.Atoi(s); err == nil {
			return pid
		}
	}
	return os.Getpid()
}

// escape leaves its process group for scdd's, starts a child in a session
// of its own, and breaks the protocol on every call: it is killed, and
// killed again after every restart, and every process it left behind must
// die with the server.
func escape() {
	pg, err := syscall.Getpgid(scddPID())
	if err == nil {
		err = syscall.Setpgid(0, pg)
	}
	child, cerr := sleeper()
	fmt.Printf("HOSTILE: escape: joined scdd's process group %d: %v; child %d in a session of its own: %v\n", pg, err, child, cerr)
	serveForged(3, 5, true)
}

// forkbomb starts children until the kernel refuses one, then serves.
func forkbomb() {
	n := 0
	var err error
	for n < 1000 {
		if _, err = sleeper(); err != nil {
			break
		}
		n++
	}
	fmt.Printf("HOSTILE: forkbomb: %d children, then %v\n", n, err)
	honest()
}

// window kills its sibling five times and each time tries to open the
// replacement's area between its exec and its attach (before the shm
// library makes it non-dumpable), holding it stopped there.
func window() {
	self, node := selfPID(), scddPID()
	sibling := func() int {
		pids, _ := filepath.Glob("/proc/[0-9]*")
		for _, p := range pids {
			pid, _ := strconv.Atoi(filepath.Base(p))
			comm, _ := os.ReadFile(p + "/comm")
			if pid != self && parentOf(p) == node && strings.TrimSpace(string(comm)) == "uap-hostile" {
				return pid
			}
		}
		return 0
	}
	for round := range 5 {
		var victim int
		for range 500 {
			if victim = sibling(); victim != 0 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if victim == 0 {
			fmt.Println("HOSTILE-INFO: window: no sibling found")
			break
		}
		time.Sleep(200 * time.Millisecond) // it attached
		checked := lastPID()
		_ = syscall.Kill(victim, syscall.SIGKILL)
		// The replacement is one of the pids allocated from now on: the
		// first process among them this process may signal is of its
		// user, so of its server. Every new pid is looked at once, however
		// many other processes and threads the host makes meanwhile.
		// A new pid may not be in /proc yet, and a new process is root
		// until scdd's child has switched users: each is tried again
		// until it is this user's, a thread, or a while has passed.
		caught := 0
		tries := map[int]int{}
		deadline := time.Now().Add(10 * time.Second)
		for caught == 0 && time.Now().Before(deadline) {
			last := lastPID()
			for cand := checked + 1; cand <= last; cand++ {
				if cand != self {
					tries[cand] = 0
				}
			}
			if last >= checked {
				checked = last
			} else {
				checked = 0 // pids wrapped
			}
			for cand := range tries {
				// A process, not a thread (kill takes thread ids too).
				if tg := tgidOf(cand); tg != 0 && tg != cand || tries[cand] > 2000 {
					delete(tries, cand)
					continue
				}
				tries[cand]++
				if tgidOf(cand) == cand && syscall.Kill(cand, syscall.SIGSTOP) == nil {
					caught = cand
					break
				}
			}
		}
		if caught == 0 {
			fmt.Println("HOSTILE-INFO: window: the replacement was not caught")
			continue
		}
		// Stopped maybe before its exec (still scdd's image): let it
		// run in steps until it is the module.
		for range 20000 {
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", caught))
			if strings.TrimSpace(string(comm)) == "uap-hostile" {
				break
			}
			_ = syscall.Kill(caught, syscall.SIGCONT)
			time.Sleep(20 * time.Microsecond)
			_ = syscall.Kill(caught, syscall.SIGSTOP)
		}
		f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/3", caught), os.O_RDWR, 0)
		if err == nil {
			f.Close()
		}
		report(fmt.Sprintf("window %d: open its sibling's area (pid %d) between its exec and its attach", round, caught), err)
		_ = syscall.Kill(caught, syscall.SIGCONT)
	}
	fmt.Println("HOSTILE: window done")
	honest()
}

// tgidOf is the thread group (process) of task id tid, 0 if unknown.
func tgidOf(tid int) int {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", tid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "Tgid:"); ok {
			tgid, _ := strconv.Atoi(strings.TrimSpace(v))
			return tgid
		}
	}
	return 0
}

// lastPID is the last pid the kernel allocated (ns_last_pid).
func lastPID() int {
	b, err := os.ReadFile("/proc/sys/kernel/ns_last_pid")
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}
