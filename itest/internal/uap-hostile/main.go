// Command uap-hostile is a UAP that attacks the node, for the integration
// tests (TestChaosHostileUAP). In process slot 0 it is hostile; in any other
// slot it serves echo honestly through the shm library, so a group can have
// an honest process beside a hostile one.
//
// The hostile process does not use the library. It reports every attempt
// on a line "HOSTILE: what: result" (its stdout goes to scdd's log):
//
//   - write the group page: map it writable, mprotect it, pwrite, ftruncate;
//   - reach other processes: open /proc/PID/fd/N of every other process
//     (scdd, the other UAPs), read /proc/PID/mem, ptrace-attach;
//   - signal scdd;
//
// then serves its calls with forgeries, by the call's number: an unknown
// status, a reply longer than its buffer, a completion numbered ahead,
// a reply that says "spoiled by the hostile UAP" (its own callers' replies
// are its to spoil), and rings its doorbell without cause in between.
//
// With HOSTILE_SQUAT set it makes the squat attack instead (squat.go): it
// binds the node's ports before the node does, if it can.
package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"tpsched/shm"
)

// Offsets of docs/SHM.md (layout version 5), as an attacker would read them.
const (
	pageSize    = 4096
	gClosed     = 0x10
	pDispatchNo = 0x18
	pMailboxes  = 0x20
	pState      = 0x40
	pDoneNo     = 0x48
	pMailbox    = 0x80
	mailboxSize = 0x40
	mClaim      = 0x00
	mStatus     = 0x18
	mReplyLen   = 0x1C
	pBuffer     = 2 * pageSize
	stateReady  = 1
)

func main() {
	if t := os.Getenv("HOSTILE_SQUAT"); t != "" {
		if os.Getenv("TPSCHED_PROC_SLOT") == "0" {
			go squat(t) // squat.go
		}
		honest()
		return
	}
	if os.Getenv("TPSCHED_PROC_SLOT") != "0" {
		honest()
		return
	}
	hostile()
}

func honest() {
	u, err := shm.Attach()
	if err != nil {
		fmt.Fprintln(os.Stderr, "uap-hostile (honest):", err)
		os.Exit(2)
	}
	u.Handle("echo", func(req []byte) ([]byte, error) { return req, nil })
	if err := u.Serve(); err != nil {
		os.Exit(1)
	}
}

func report(what string, err error) {
	res := "refused: " + fmt.Sprint(err)
	if err == nil {
		res = "SUCCEEDED"
	}
	fmt.Printf("HOSTILE: %s: %s\n", what, res)
}

func hostile() {
	const area, group, bell = 3, 4, 5
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
	self, node := os.Getpid(), os.Getppid()
	pids, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range pids {
		pid, _ := strconv.Atoi(filepath.Base(p))
		if pid == self || pid == 1 || (pid != node && parentOf(p) != node) {
			continue
		}
		comm, _ := os.ReadFile(p + "/comm")
		name := string(comm[:max(0, len(comm)-1)])
		if name != "scdd" && name != "uap-echo" && name != "uap-hostile" {
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
		report(fmt.Sprintf("ptrace-attach %s (pid %d)", name, pid), syscall.PtraceAttach(pid))
		if name == "scdd" {
			report("SIGKILL scdd", syscall.Kill(pid, syscall.SIGKILL))
		}
	}
	fmt.Println("HOSTILE: probes done")

	size := int64(0)
	if fi, err := os.NewFile(area, "area").Stat(); err == nil {
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
		switch no % 4 {
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
