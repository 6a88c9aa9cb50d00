// Command uap-hostile is a UAP that attacks the node, for the integration
// tests (TestChaosHostileUAP and the other TestChaos* of hostile_test.go).
// In process slot 0 it is hostile; in any other slot it serves echo
// honestly through the shm library, so a group can have an honest process
// beside a hostile one.
//
// The hostile process does not use the library. It reports every attempt
// on a line "HOSTILE: what: result" on its stdout (which scdd copies into
// its log); a "SUCCEEDED" result is an attack that worked. By default
// (TPSCHED_HOSTILE unset) it tries:
//
//   - write the group page: map it writable, mprotect it, pwrite, ftruncate;
//   - reach other processes: open /proc/PID/fd/N of every other process
//     (scdd, the other groups' UAPs), read /proc/PID/mem and environ, ptrace-attach;
//   - signal scdd;
//   - reach what scdd holds: write a forged record into scdd's log (a line
//     that looks like one), seek and truncate its stdout, set O_NONBLOCK on
//     it; read any descriptor it holds beyond 0-6; run with NoNewPrivs 0;
//     run in scdd's working directory;
//   - hold a group through the control socket ($TPSCHED_HOSTILE_CONTROL);
//
// then serves its calls with forgeries, by the call's number: an unknown
// status, a reply longer than its buffer, a completion numbered ahead,
// a reply that says "spoiled by the hostile UAP" (its own callers' replies
// are its to spoil), and rings its doorbell without cause in between.
//
// Other attacks, by TPSCHED_HOSTILE:
//
//   - escape: leave its process group for scdd's, start a child in a
//     session of its own, then break the protocol on every call;
//   - forkbomb: start `sleep` children in sessions of their own until the
//     kernel refuses one (at most 1000), then serve honestly;
//   - initfork: start a `sleep` child in a Go init, before main, then
//     serve honestly;
//   - window: kill its sibling (slot 1, same server, so same user), catch
//     the replacement between its exec and its attach, stop it, and open
//     its area through /proc/PID/fd/3; five times.
//
// Children it starts carry TPSCHED_HOSTILE_TOKEN in their environment, so
// a test can find them after scdd is gone.
//
// With HOSTILE_SQUAT set it makes the squat attack instead (squat.go): it
// binds the node's ports before the node does, if it can.
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
	"os/exec"
	"runtime"
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

// initChild is the child the initfork attack started before main.
var initChild int

func init() {
	if os.Getenv("TPSCHED_HOSTILE") == "initfork" && os.Getenv("TPSCHED_PROC_SLOT") == "0" {
		if c, err := sleeper(); err == nil {
			initChild = c
		}
	}
}

// sleeper starts `sleep 3600` in a session of its own (out of every
// process group procmgr knows), marked with the test's token.
func sleeper() (int, error) {
	cmd := exec.Command("sleep", "3600")
	cmd.Env = []string{"PATH=/usr/bin:/bin", "TPSCHED_HOSTILE_TOKEN=" + os.Getenv("TPSCHED_HOSTILE_TOKEN")}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	// Not waited for: a goroutine blocked in wait4 per child would cost
	// the bomb a thread each, and threads count against pids.max too.
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	return cmd.Process.Pid, nil
}

func main() {
	if t := os.Getenv("HOSTILE_SQUAT"); t != "" {
		if os.Getenv("TPSCHED_PROC_SLOT") == "0" {
			go squat(t) // squat.go
		}
		honest()
		return
	}
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
		return
	case "ringbank":
		ringBank()
		return
	}
	switch os.Getenv("TPSCHED_HOSTILE") {
	case "":
		hostile()
	case "escape":
		escape()
	case "forkbomb":
		forkbomb()
	case "initfork":
		fmt.Printf("HOSTILE: initfork child %d\n", initChild)
		honest()
	case "window":
		window()
	default:
		fmt.Println("uap-hostile: unknown TPSCHED_HOSTILE", os.Getenv("TPSCHED_HOSTILE"))
		os.Exit(2)
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
