package bench

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
	"unsafe"
)

// clockTicks is USER_HZ, the unit of the CPU times in /proc/<pid>/stat. It
// is 100 on every Linux architecture Go supports (getconf CLK_TCK).
const clockTicks = 100

// procStat is the part of /proc/<pid>/stat the benchmark uses. Times are
// in clock ticks; CUtime and CStime are of children that ended and were
// waited for.
type procStat struct {
	PID, PPID                    int
	State                        byte // R, S, D, T (stopped), Z, ...
	Utime, Stime, CUtime, CStime uint64
	Start                        uint64 // starttime: clock ticks after boot (0 if the line is cut short)
}

// Ticks is the CPU time of the process and of its ended children.
func (s procStat) Ticks() uint64 { return s.Utime + s.Stime + s.CUtime + s.CStime }

// parseStat parses one /proc/<pid>/stat line. The command name, in
// parentheses, may hold spaces and parentheses, so fields are counted from
// the last ')'.
func parseStat(b []byte) (procStat, error) {
	open := bytes.IndexByte(b, '(')
	end := bytes.LastIndexByte(b, ')')
	if open < 1 || end < open {
		return procStat{}, errors.New("bench: /proc stat: no command name")
	}
	var s procStat
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b[:open])))
	if err != nil {
		return s, fmt.Errorf("bench: /proc stat: pid: %w", err)
	}
	s.PID = pid
	// After ')': state(3) ppid(4) pgrp session tty_nr tpgid flags minflt
	// cminflt majflt cmajflt utime(14) stime(15) cutime(16) cstime(17).
	f := bytes.Fields(b[end+1:])
	if len(f) < 15 {
		return s, fmt.Errorf("bench: /proc stat: %d fields after the name, want 15 or more", len(f))
	}
	field := func(n int) (uint64, error) { return strconv.ParseUint(string(f[n-3]), 10, 64) }
	s.State = f[0][0]
	ppid, err := strconv.Atoi(string(f[4-3]))
	if err != nil {
		return s, fmt.Errorf("bench: /proc stat: ppid: %w", err)
	}
	s.PPID = ppid
	for _, p := range []struct {
		n   int
		dst *uint64
	}{{14, &s.Utime}, {15, &s.Stime}, {16, &s.CUtime}, {17, &s.CStime}} {
		// cutime and cstime are signed in the kernel's format but never negative.
		v, err := field(p.n)
		if err != nil {
			return s, fmt.Errorf("bench: /proc stat: field %d: %w", p.n, err)
		}
		*p.dst = v
	}
	if len(f) >= 22-2 {
		s.Start, _ = field(22)
	}
	return s, nil
}

// parseVmHWM returns the VmHWM line of /proc/<pid>/status (peak resident
// set size) in KiB.
func parseVmHWM(status []byte) (int64, error) {
	for line := range bytes.Lines(status) {
		rest, ok := bytes.CutPrefix(line, []byte("VmHWM:"))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) != 2 || string(f[1]) != "kB" {
			return 0, fmt.Errorf("bench: bad VmHWM line %q", bytes.TrimSpace(line))
		}
		return strconv.ParseInt(string(f[0]), 10, 64)
	}
	return 0, errors.New("bench: no VmHWM in status (a kernel thread or a zombie)")
}

// processTree returns roots and every live descendant of them, from a snapshot of
// parent links (pid -> ppid).
func processTree(parents map[int]int, roots []int) []int {
	children := make(map[int][]int, len(parents))
	for pid, ppid := range parents {
		children[ppid] = append(children[ppid], pid)
	}
	seen := make(map[int]bool)
	var out []int
	var walk func(int)
	walk = func(p int) {
		if seen[p] {
			return
		}
		seen[p] = true
		out = append(out, p)
		for _, c := range children[p] {
			walk(c)
		}
	}
	for _, r := range roots {
		if _, ok := parents[r]; ok {
			walk(r)
		}
	}
	return out
}

// treeIn is processTree over the parent links of stats.
func treeIn(stats map[int]procStat, roots []int) []int {
	parents := make(map[int]int, len(stats))
	for pid, st := range stats {
		parents[pid] = st.PPID
	}
	return processTree(parents, roots)
}

// readStats reads /proc/*/stat of every process.
func readStats() map[int]procStat {
	dirs, _ := filepath.Glob("/proc/[0-9]*/stat")
	out := make(map[int]procStat, len(dirs))
	buf := make([]byte, 4096)
	for _, d := range dirs {
		b, err := readRaw(d, buf)
		if err != nil {
			continue // ended meanwhile
		}
		if s, err := parseStat(b); err == nil {
			out[s.PID] = s
		}
	}
	return out
}

// cpuSample is the CPU ticks of every process at one time (each its own
// and its waited-for children's), with the measured server's process tree
// and the other running systems' trees picked out.
type cpuSample struct {
	from    time.Time      // when its reading of /proc began
	at      time.Time      // and ended
	ticks   map[int]uint64 // own and waited-for children's
	own     map[int]uint64 // own only
	start   map[int]uint64 // starttime of each process
	parents map[int]int    // pid -> ppid
	server  []int
	peers   []int
}

// mid is the middle of the sample's reading of /proc: its time, within
// half of the reading's length.
func (s cpuSample) mid() time.Time { return s.from.Add(s.at.Sub(s.from) / 2) }

// sampleCPU reads every process once.
func sampleCPU(server, peers []int) cpuSample {
	from := time.Now()
	stats := readStats()
	parents := make(map[int]int, len(stats))
	ticks := make(map[int]uint64, len(stats))
	own := make(map[int]uint64, len(stats))
	start := make(map[int]uint64, len(stats))
	for pid, s := range stats {
		parents[pid] = s.PPID
		ticks[pid] = s.Ticks()
		own[pid] = s.Utime + s.Stime
		start[pid] = s.Start
	}
	return cpuSample{from: from, at: time.Now(), ticks: ticks, own: own, start: start, parents: parents,
		server: processTree(parents, server), peers: processTree(parents, peers)}
}

// cpuSplit is how the processes' CPU between two samples was spent, in
// ticks: the server's tree, the other systems' (idle) trees, the load
// generator (self: this process, and the processes that made the load for
// it) and everything else on the machine (other tenants).
type cpuSplit struct {
	server, peers, self, foreign uint64
	elapsed                      time.Duration
}

// cores is ticks as cores busy over the interval.
func (c cpuSplit) cores(ticks uint64) float64 {
	if c.elapsed <= 0 {
		return 0
	}
	return float64(ticks) / clockTicks / c.elapsed.Seconds()
}

// splitCPU attributes by the later sample's trees: the server's, the
// other systems' and this process (the load generator). See splitCPUSets.
func splitCPU(a, b cpuSample) cpuSplit {
	return splitCPUSets(a, b, b.server, []int{os.Getpid()}, b.peers)
}

// splitCPUSets attributes the CPU spent between a and b to the server's
// processes, the load generator's and the idle systems'; every other
// process is another tenant. This process and other tenants count their
// own CPU only: a parent reaping a long-lived child would add that child's
// whole life to the interval (and this process's children are the
// systems, counted apart). A process new since a (its pid unknown to a,
// or known with another start time) counts whole, as all its CPU falls in
// the interval; one that a missed although it had started before the
// newest process a saw (a read race) counts nothing. A pid in two sets
// counts in the first of server, loadgen, peers.
func splitCPUSets(a, b cpuSample, server, loadgen, peers []int) cpuSplit {
	var newest uint64
	for _, st := range a.start {
		newest = max(newest, st)
	}
	out := cpuSplit{elapsed: b.at.Sub(a.at)}
	mine := make(map[int]*uint64, len(server)+len(loadgen)+len(peers))
	for _, set := range []struct {
		pids []int
		dst  *uint64
	}{{peers, &out.peers}, {loadgen, &out.self}, {server, &out.server}} {
		for _, p := range set.pids {
			mine[p] = set.dst // later sets win: server over loadgen over peers
		}
	}
	self := os.Getpid()
	for pid := range b.ticks {
		dst, isMine := mine[pid]
		t, t0 := b.own[pid], a.own[pid]
		if isMine && pid != self {
			t, t0 = b.ticks[pid], a.ticks[pid]
		}
		_, ok := a.ticks[pid]
		var d uint64
		switch {
		case ok && a.start[pid] == b.start[pid] && t0 <= t:
			d = t - t0
		case ok || b.start[pid] >= newest:
			d = t
		}
		if isMine {
			*dst += d
		} else {
			out.foreign += d
		}
	}
	return out
}

// resetPeakRSS resets VmHWM of each process to its current RSS (writing 5
// to clear_refs, Linux 4.0+), so the next PeakRSS covers one run only.
func resetPeakRSS(pids []int) {
	for _, p := range pids {
		os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", p), []byte("5"), 0)
	}
}

// childrenOf returns the pids of pid's live children: from
// /proc/<pid>/task/*/children where the kernel has it, else by reading
// every /proc/<n>/stat.
func childrenOf(pid int) []int {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var out []int
	found := false
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		found = true
		out = append(out, parseChildren(b)...)
	}
	if found {
		return out
	}
	for p, s := range readStats() {
		if s.PPID == pid {
			out = append(out, p)
		}
	}
	return out
}

// parseChildren parses a /proc/<pid>/task/<tid>/children file: pids
// separated by spaces.
func parseChildren(b []byte) []int {
	var out []int
	for _, f := range bytes.Fields(b) {
		if n, err := strconv.Atoi(string(f)); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// taskSwitches is one thread's context switches so far: voluntary (it
// slept: a wait, a blocking call) and involuntary (it was preempted).
type taskSwitches struct {
	pid        int // its process
	vol, invol uint64
}

// parseSwitches reads the voluntary_ctxt_switches and
// nonvoluntary_ctxt_switches lines of a /proc/<pid>/task/<tid>/status.
func parseSwitches(status []byte) (vol, invol uint64, err error) {
	found := 0
	for line := range bytes.Lines(status) {
		var dst *uint64
		rest, ok := bytes.CutPrefix(line, []byte("voluntary_ctxt_switches:"))
		if ok {
			dst = &vol
		} else if rest, ok = bytes.CutPrefix(line, []byte("nonvoluntary_ctxt_switches:")); ok {
			dst = &invol
		} else {
			continue
		}
		v, err := strconv.ParseUint(string(bytes.TrimSpace(rest)), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("bench: bad context switch line %q", bytes.TrimSpace(line))
		}
		*dst = v
		found++
	}
	if found != 2 {
		return 0, 0, errors.New("bench: no context switch counts in status")
	}
	return vol, invol, nil
}

// readSwitches reads the context switches of every thread of pids, by
// thread id. The kernel counts them per thread (/proc/<pid>/status has the
// main thread's only), so a process's are the sum over its threads.
func readSwitches(pids []int) map[int]taskSwitches {
	out := make(map[int]taskSwitches, 8*len(pids))
	buf := make([]byte, 8192)
	for _, pid := range pids {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/[0-9]*", pid))
		for _, t := range tasks {
			tid, err := strconv.Atoi(filepath.Base(t))
			if err != nil {
				continue
			}
			b, err := readRaw(t+"/status", buf)
			if err != nil {
				continue // ended meanwhile
			}
			if vol, invol, err := parseSwitches(b); err == nil {
				out[tid] = taskSwitches{pid: pid, vol: vol, invol: invol}
			}
		}
	}
	return out
}

// switchesBetween sums, per process, the context switches its threads made
// between samples a and b: a thread in both counts its difference, a
// thread new in b all of its switches, a thread that ended between the
// two is lost (the kernel keeps no count of it that /proc shows).
func switchesBetween(a, b map[int]taskSwitches) map[int]taskSwitches {
	out := map[int]taskSwitches{}
	for tid, tb := range b {
		d := tb
		if ta, ok := a[tid]; ok && ta.pid == tb.pid && ta.vol <= tb.vol && ta.invol <= tb.invol {
			d.vol, d.invol = tb.vol-ta.vol, tb.invol-ta.invol
		}
		sum := out[tb.pid]
		sum.pid = tb.pid
		sum.vol += d.vol
		sum.invol += d.invol
		out[tb.pid] = sum
	}
	return out
}

// readRaw reads a /proc file of at most len(buf) bytes into buf with raw
// system calls: the thread keeps its P through them, so a window's sample,
// on the sampler's thread at nice -10, never waits for another thread of
// the harness to be scheduled (through the runtime, each read that
// blocked handed the P over, and getting it back waited behind the
// processes measured).
func readRaw(path string, buf []byte) ([]byte, error) {
	p, err := syscall.BytePtrFromString(path)
	if err != nil {
		return nil, err
	}
	fd, _, e := syscall.RawSyscall6(syscall.SYS_OPENAT, atFDCWD, uintptr(unsafe.Pointer(p)), syscall.O_RDONLY|syscall.O_CLOEXEC, 0, 0, 0)
	if e != 0 {
		return nil, e
	}
	defer syscall.RawSyscall(syscall.SYS_CLOSE, fd, 0, 0)
	n := 0
	for n < len(buf) {
		r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&buf[n])), uintptr(len(buf)-n))
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return nil, e
		}
		if r == 0 {
			break
		}
		n += int(r)
	}
	return buf[:n], nil
}

// atFDCWD is AT_FDCWD (-100), for openat.
const atFDCWD = ^uintptr(99)
