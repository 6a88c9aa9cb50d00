// Command uap-torture is the UAP of the torture test (itest/torture_test.go,
// issue 27 item 7). It serves through the shm library like any honest UAP,
// and it records every execution of every call, so that the test can tell
// a call run twice from a call run once and answered twice.
//
// Every request starts "<id> <flag> <ms>" (the call's unique id, one flag
// letter, milliseconds to sleep), maybe followed by more. Before it runs a
// call, the process appends the line "<id> <pid> <flag>\n" to the file
// $TORTURE_EXECLOG (O_APPEND, one write per line: lines of concurrent
// processes never mix), so a call that ran has its line even if the
// process dies at once after.
//
// Services:
//
//	work  sleeps ms, replies with the request
//	call  the request is "<id> <flag> <ms> <inner flag>": makes a local
//	      call (shm.UAP.Call) to $TORTURE_CALL_TARGET (group/service) with
//	      the request "<id>.in <inner flag> <ms>" and replies
//	      "<its request> | <that call's reply>", or fails with its error
//	burst the request is "<id> <flag> <ms> <inner flag> <k> [<each ms>]":
//	      makes k local calls one after the other to
//	      $TORTURE_BURST_TARGET, the j-th with the request
//	      "<id>.in<j> <f> <m>" (f the inner flag and m ms for the last, n
//	      and each ms, or 0, for the others: a caller's calls in a row,
//	      which the node may put on a lane, for long enough, with each ms,
//	      that other callers wait for their turn on the node's lanes),
//	      and replies "<its request> | <the first call's reply>", or fails
//	      with the first error
//
// Flags (the first process to run such a call does it; another process
// that runs the same call again, which must never happen, serves it
// honestly so that the run twice is seen, not hidden by a second exit):
//
//	n  nothing special
//	x  exit (status 3) in the middle of the call: it holds the call taken,
//	   and perhaps more handed over behind it
//	b  complete the call with a bad status (7: above 3, a protocol
//	   violation), store done_no and exit at once, before the node's
//	   reader looks (issue 27 break 4: the node must answer the call
//	   'server terminated', docs/SHM.md "Die", never hand it to a sibling)
//	c  (socket mode) close the socket to the node and live on without
//	   answering: the node must rule the process as breaking the protocol
//	   (kill it, answer the call 'server terminated')
//
// "The first process" is decided with a marker file created O_EXCL in
// $TORTURE_DIR, so the test needs no state in the UAP.
package main

import (
	"bytes"
	"context"
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

// Offsets of docs/SHM.md (layout version 5) that the bad completion needs.
const (
	pMailboxes  = 0x20
	pDoneNo     = 0x48
	pMailbox    = 0x80
	mailboxSize = 0x40
	mClaim      = 0x00
	mStatus     = 0x18
	mReplyLen   = 0x1C
	badStatus   = 7
)

var (
	execLog *os.File
	dir     string
	area    []byte // this process's area, mapped before shm.Attach closes its fd
)

func main() {
	var err error
	dir = os.Getenv("TORTURE_DIR")
	execLog, err = os.OpenFile(os.Getenv("TORTURE_EXECLOG"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "uap-torture:", err)
		os.Exit(2)
	}
	base := 3
	if v := os.Getenv("TPSCHED_SHM_FD"); v != "" {
		base, _ = strconv.Atoi(v)
	}
	var st syscall.Stat_t
	if syscall.Fstat(base, &st) == nil && st.Size > 0 {
		area, err = syscall.Mmap(base, 0, int(st.Size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
		if err != nil {
			area = nil
		}
	}
	u, err := shm.Attach()
	if err != nil {
		fmt.Fprintln(os.Stderr, "uap-torture:", err)
		os.Exit(2)
	}
	u.Handle("work", func(req []byte) ([]byte, error) {
		flag, ms := run(req)
		special(flag, req)
		time.Sleep(time.Duration(ms) * time.Millisecond)
		return req, nil
	})
	target := os.Getenv("TORTURE_CALL_TARGET")
	group, service, _ := strings.Cut(target, "/")
	u.Handle("call", func(req []byte) ([]byte, error) {
		flag, ms := run(req)
		special(flag, req)
		f := strings.Fields(string(req))
		if len(f) < 3 {
			return nil, fmt.Errorf("want \"<id> <flag> <ms> <inner flag>\", got %.40q", req)
		}
		innerFlag := "n"
		if len(f) > 3 {
			innerFlag = f[3]
		}
		inner := []byte(fmt.Sprintf("%s.in %s %d", f[0], innerFlag, ms))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		reply, err := u.Call(ctx, group, service, inner)
		if err != nil {
			return nil, fmt.Errorf("local call %s: %w", target, err)
		}
		time.Sleep(time.Duration(ms) * time.Millisecond)
		return append(append(append([]byte{}, req...), " | "...), reply...), nil
	})
	burstGroup, burstService, _ := strings.Cut(os.Getenv("TORTURE_BURST_TARGET"), "/")
	u.Handle("burst", func(req []byte) ([]byte, error) {
		flag, ms := run(req)
		special(flag, req)
		f := strings.Fields(string(req))
		k, each := 0, 0
		if len(f) == 5 || len(f) == 6 {
			k, _ = strconv.Atoi(f[4])
		}
		if len(f) == 6 {
			each, _ = strconv.Atoi(f[5])
		}
		if k < 1 {
			return nil, fmt.Errorf("want \"<id> <flag> <ms> <inner flag> <k> [<each ms>]\", got %.40q", req)
		}
		var first []byte
		for j := 1; j <= k; j++ {
			innerFlag, innerMs := "n", each
			if j == k {
				innerFlag, innerMs = f[3], ms
			}
			inner := fmt.Appendf(nil, "%s.in%d %s %d", f[0], j, innerFlag, innerMs)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			reply, err := u.Call(ctx, burstGroup, burstService, inner)
			cancel()
			if err != nil {
				return nil, fmt.Errorf("local call %d of %d: %w", j, k, err)
			}
			if j == 1 {
				first = reply
			}
		}
		return append(append(append([]byte{}, req...), " | "...), first...), nil
	})
	if err := u.Serve(); err != nil {
		fmt.Fprintln(os.Stderr, "uap-torture:", err)
		os.Exit(1)
	}
}

// run records this execution of the call and returns its flag and sleep.
func run(req []byte) (flag string, ms int) {
	f := strings.Fields(string(req))
	if len(f) < 3 {
		return "n", 0
	}
	ms, _ = strconv.Atoi(f[2])
	if _, err := fmt.Fprintf(execLog, "%s %d %s %d\n", f[0], os.Getpid(), f[1], time.Now().UnixMilli()); err != nil {
		fmt.Fprintln(os.Stderr, "uap-torture: recording an execution:", err)
		os.Exit(2)
	}
	return f[1], ms
}

// first reports whether this process is the first to do the special part
// of call id.
func first(req []byte) bool {
	id, _, _ := bytes.Cut(req, []byte(" "))
	fd, err := syscall.Open(filepath.Join(dir, "mark."+string(id)), syscall.O_CREAT|syscall.O_EXCL|syscall.O_WRONLY, 0o666)
	if err != nil {
		return false
	}
	syscall.Close(fd)
	return true
}

func special(flag string, req []byte) {
	switch flag {
	case "x":
		if first(req) {
			os.Exit(3)
		}
	case "b":
		if first(req) {
			badCompletion()
		}
	case "c":
		if first(req) {
			closeSockets()
			for {
				time.Sleep(time.Hour) // alive, never answering; a select{} would be a deadlock the runtime ends
			}
		}
	}
}

// closeSockets closes every socket this process holds: in socket mode the
// one to the node (the process has no other).
func closeSockets() {
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		if target, _ := os.Readlink("/proc/self/fd/" + e.Name()); strings.HasPrefix(target, "socket:") {
			if fd, err := strconv.Atoi(e.Name()); err == nil {
				syscall.Close(fd)
			}
		}
	}
}

// badCompletion completes the call this process holds taken (the one
// mailbox whose claim says taken with a number above done_no) with a bad
// status, stores done_no and exits without a ring.
func badCompletion() {
	if area == nil {
		os.Exit(4)
	}
	u32 := func(off int) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Pointer(&area[off])) }
	u64 := func(off int) *atomic.Uint64 { return (*atomic.Uint64)(unsafe.Pointer(&area[off])) }
	done := u64(pDoneNo).Load()
	k := int(u32(pMailboxes).Load())
	for i := range k {
		mb := pMailbox + i*mailboxSize
		claim := u64(mb + mClaim).Load()
		if no := claim >> 2; claim&3 == 1 && no > done {
			u32(mb + mStatus).Store(badStatus)
			u32(mb + mReplyLen).Store(0)
			u64(pDoneNo).Store(no)
			os.Exit(5)
		}
	}
	os.Exit(6)
}
