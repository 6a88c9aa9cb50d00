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
//     (scdd, the other groups' UAPs), read /proc/PID/mem, ptrace-attach;
//   - signal scdd;
//
// then serves its calls with forgeries, by the call's number: an unknown
// status, a reply longer than its buffer, a completion numbered ahead,
// a reply that says "spoiled by the hostile UAP" (its own callers' replies
// are its to spoil), and rings its doorbell without cause in between.
//
// UAP_HOSTILE (a putenv of its server) gives slot 0 another attack:
//
//   - rewrite: it takes none of the calls handed to it, writes its own
//     request ("FORGED by the hostile UAP") over each one's buffer and
//     req_len, then exits, so that the node hands them to another process
//     (issue 19 item 9);
//   - ringbank: it serves its calls and makes local calls while the
//     node's reader is awake (no ring needed, each a cause the node
//     credits), then rings its doorbell without cause as many times as it
//     served and called, never more (issue 19 item 8);
//
// and startcall=GROUP/SERVICE makes every process an honest one that
// calls GROUP/SERVICE between its attach and its Serve (issue 19 item 1).
package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
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
	pageSize       = 4096
	gClosed        = 0x10
	gSleeping      = 0x40
	pMaxMessage    = 0x0C
	pDispatchNo    = 0x18
	pMailboxes     = 0x20
	pState         = 0x40
	pDoneNo        = 0x48
	pMailbox       = 0x80
	mailboxSize    = 0x40
	mClaim         = 0x00
	mReqLen        = 0x10
	mStatus        = 0x18
	mReplyLen      = 0x1C
	pOutNo         = 0xF80
	pOutGroupLen   = 0xF8C
	pOutServiceLen = 0xF90
	pOutReqLen     = 0xF94
	pOutDone       = 0xFC0
	pBuffer        = 2 * pageSize
	stateReady     = 1
)

// The descriptors scdd starts a UAP with.
const areaFD, groupFD, bellFD = 3, 4, 5

func main() {
	mode := os.Getenv("UAP_HOSTILE")
	if call, ok := strings.CutPrefix(mode, "startcall="); ok {
		callAtStart(call)
		return
	}
	if os.Getenv("TPSCHED_PROC_SLOT") != "0" {
		honest()
		return
	}
	switch mode {
	case "rewrite":
		rewrite()
	case "ringbank":
		ringBank()
	default:
		hostile()
	}
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

// callAtStart is an honest UAP that calls group/service as it starts,
// before it serves, and says what it got ("STARTCALL: ...").
func callAtStart(target string) {
	group, service, _ := strings.Cut(target, "/")
	u, err := shm.Attach()
	if err != nil {
		fmt.Fprintln(os.Stderr, "uap-hostile (startcall):", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	reply, err := u.Call(ctx, group, service, []byte("called at start"))
	cancel()
	fmt.Printf("STARTCALL: reply %q, error %v\n", reply, err)
	u.Handle("echo", func(req []byte) ([]byte, error) { return req, nil })
	if err := u.Serve(); err != nil {
		os.Exit(1)
	}
}

// area is a process area mapped as an attacker maps it.
type area struct {
	mem    []byte
	k      int // mailboxes
	stride int // of a mailbox's buffer
}

func mapArea() area {
	size := int64(0)
	if fi, err := os.NewFile(areaFD, "area").Stat(); err == nil {
		size = fi.Size()
	}
	mem, err := syscall.Mmap(areaFD, 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		fmt.Println("HOSTILE: cannot map its own area:", err)
		os.Exit(4)
	}
	a := area{mem: mem}
	a.k = int(a.u32(pMailboxes).Load())
	a.stride = (int(a.u32(pMaxMessage).Load()) + pageSize - 1) &^ (pageSize - 1)
	return a
}

func (a area) u32(off int) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Pointer(&a.mem[off])) }
func (a area) u64(off int) *atomic.Uint64 { return (*atomic.Uint64)(unsafe.Pointer(&a.mem[off])) }
func (a area) buffer(i int) []byte        { return a.mem[pBuffer+i*a.stride:][:a.stride] }

func ringBell() {
	var one [8]byte
	binary.LittleEndian.PutUint64(one[:], 1)
	syscall.Write(bellFD, one[:])
}

// rewrite takes none of its calls: it writes its own request over each
// one handed to it (buffer and req_len), and once it has held calls for a
// while it exits, for the node to give them to another process.
func rewrite() {
	a := mapArea()
	a.u32(pState).Store(stateReady)
	ringBell()
	forged := []byte("FORGED by the hostile UAP")
	done := map[uint64]bool{} // call numbers rewritten
	var first time.Time
	for {
		for i := range a.k {
			mb := pMailbox + i*mailboxSize
			claim := a.u64(mb + mClaim).Load()
			if no := claim >> 2; no != 0 && claim&3 == 0 && !done[no] {
				copy(a.buffer(i), forged)
				a.u32(mb + mReqLen).Store(uint32(len(forged)))
				done[no] = true
			}
		}
		if len(done) > 0 && first.IsZero() {
			first = time.Now()
		}
		if !first.IsZero() && time.Since(first) > 50*time.Millisecond {
			fmt.Printf("HOSTILE: rewrote %d requests it never took, and exits\n", len(done))
			os.Exit(3)
		}
		time.Sleep(time.Millisecond)
	}
}

// ringBank serves the calls handed to it (echo, never ringing) and makes
// local calls while the node's reader is awake (no ring needed): each is a
// cause the node credits. Once it holds 1,000 such credits it spends them
// on rings without cause, each while the reader sleeps (so each wakes it),
// down to 100, and never rings more often than it completed and called.
func ringBank() {
	a := mapArea()
	gp, err := syscall.Mmap(groupFD, 0, pageSize, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		fmt.Println("HOSTILE: cannot map the group page:", err)
		os.Exit(4)
	}
	readerSleeps := func() bool { return (*atomic.Uint32)(unsafe.Pointer(&gp[gSleeping])).Load() != 0 }
	a.u32(pState).Store(stateReady)
	ringBell() // its attach's
	out := a.mem[pBuffer+a.k*a.stride:]
	copy(out, "nosuch"+"echo")
	a.u32(pOutGroupLen).Store(6)
	a.u32(pOutServiceLen).Store(4)
	a.u32(pOutReqLen).Store(0)
	var last, served, called, rings, no uint64
	calling, spending := false, false
	reported := time.Now()
	for {
		busy := false
		for d := a.u64(pDispatchNo).Load(); last < d; { // serve echo, in order
			last++
			for i := range a.k {
				mb := pMailbox + i*mailboxSize
				if a.u64(mb+mClaim).CompareAndSwap(last<<2, last<<2|1) {
					a.u32(mb + mStatus).Store(0)
					a.u32(mb + mReplyLen).Store(a.u32(mb + mReqLen).Load())
					a.u64(pDoneNo).Store(last)
					served++
					busy = true
					break
				}
			}
		}
		if calling && a.u64(pOutDone).Load() == no {
			calling = false
			called++
		}
		credit := served + called - rings
		switch {
		case spending && credit <= 100:
			spending = false
		case !spending && credit >= 1000:
			spending = true
		}
		if !spending && !calling && !readerSleeps() {
			no++
			a.u64(pOutNo).Store(no)
			calling, busy = true, true
		}
		if spending && readerSleeps() {
			ringBell()
			rings++
			busy = true
		}
		if time.Since(reported) >= 500*time.Millisecond {
			reported = time.Now()
			fmt.Printf("HOSTILE: %d calls served and %d made without a ring, %d rings without cause\n", served, called, rings)
		}
		if !busy {
			runtime.Gosched()
		}
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
	// Not its siblings (the other processes of its server, uap-hostile
	// too): they share its user, and one that has not attached yet is
	// open to it (docs/RELIABILITY.md, "not defended"); the window is
	// wide when they start slowly, as under the race detector.
	self, node := os.Getpid(), os.Getppid()
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
