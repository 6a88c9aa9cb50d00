package bench

import (
	"fmt"
	"os"
	"slices"
	"time"
)

// window is the accounting of one run's measured window: the CPU of every
// process (/proc/<pid>/stat), the context switches of each thread of the
// processes that may be the server's or the load generator's
// (/proc/<pid>/task/*/status), the system calls of every process (the
// eBPF counter, when it runs) and the server's peak RSS, each read at the
// window's two ends. Which processes made the load may be known only after
// the run (S10's caller UAPs are children of the node they call), so
// attribute splits the figures once the run says.
type window struct {
	server, peers []int // root pids: the measured system's trees, the idle systems'
	sys           *syscallCounter
	// loadgen are the roots of processes other than this one that make the
	// load (Enduro/X's exbenchcl), given to begin.
	loadgen      []int
	first, last  windowSample
	begun, ended bool
	sysErr       error
}

// windowSample is one end of the window.
type windowSample struct {
	cpu      cpuSample
	switches map[int]taskSwitches // by thread id
	sys      map[int]uint64       // system calls by pid; nil when not counted
	steal    float64              // the machine's stolen CPU so far, in seconds
	rss      map[int]int64        // VmHWM by pid (the last sample only)
}

// begin samples the window's start. loadgen are the roots of the processes
// other than this one that make the load, if any are known now.
func (w *window) begin(loadgen ...int) {
	w.loadgen = loadgen
	w.first.cpu = sampleCPU(w.server, w.peers)
	resetPeakRSS(w.first.cpu.server)
	_, w.first.steal = machineCPU()
	w.first.switches = readSwitches(w.candidates(w.first.cpu))
	// The system calls last: the reading of /proc above is the harness's
	// own and stays out of the window's count.
	w.first.sys, w.sysErr = w.sys.snapshot()
	w.begun = true
}

// end samples the window's end, in the reverse order of begin.
func (w *window) end() {
	var err error
	w.last.sys, err = w.sys.snapshot()
	if w.sysErr == nil {
		w.sysErr = err
	}
	w.last.cpu = sampleCPU(w.server, w.peers)
	w.last.switches = readSwitches(w.candidates(w.last.cpu))
	_, w.last.steal = machineCPU()
	w.last.rss = make(map[int]int64, len(w.last.cpu.server))
	for _, p := range w.last.cpu.server {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p)); err == nil {
			if kb, err := parseVmHWM(b); err == nil {
				w.last.rss[p] = kb
			}
		}
	}
	w.ended = true
}

// candidates are the processes whose threads' context switches are read:
// the server's tree, the load generator's trees and this process.
func (w *window) candidates(s cpuSample) []int {
	return append(append(slices.Clone(s.server), processTree(s.parents, w.loadgen)...), os.Getpid())
}

// accounting is what the processes did in the window, by part: the server
// (the measured system's processes), the load generator (this process and
// the processes that made the load for it) and the rest.
type accounting struct {
	elapsed                time.Duration
	server, loadgen        usage
	peersTicks, otherTicks uint64  // CPU of the idle systems and of other tenants
	stealSeconds           float64 // stolen by the hypervisor
	syscalls               bool    // whether usage.syscalls was counted
	rssKiB                 int64   // the server's peak RSS, summed
}

// usage is one part's CPU (clock ticks), context switches and system calls.
type usage struct {
	ticks, vol, invol, syscalls uint64
}

// attribute splits the window's figures. extraLoadgen are processes of the
// server's tree that made the load (S10's caller UAPs); idle are processes
// of its tree that did neither (callers not used in this cell), counted
// with the idle systems.
func (w *window) attribute(extraLoadgen, idle []int) (accounting, error) {
	if !w.begun || !w.ended {
		return accounting{}, fmt.Errorf("bench: the run did not sample both ends of its window")
	}
	a, b := w.first, w.last
	loadgen := append(append([]int{os.Getpid()}, processTree(b.cpu.parents, w.loadgen)...), extraLoadgen...)
	server := slices.DeleteFunc(slices.Clone(b.cpu.server), func(p int) bool {
		return slices.Contains(loadgen, p) || slices.Contains(idle, p)
	})
	peers := append(slices.Clone(b.cpu.peers), idle...)
	cpu := splitCPUSets(a.cpu, b.cpu, server, loadgen, peers)
	acc := accounting{
		elapsed:      cpu.elapsed,
		server:       usage{ticks: cpu.server},
		loadgen:      usage{ticks: cpu.self},
		peersTicks:   cpu.peers,
		otherTicks:   cpu.foreign,
		stealSeconds: b.steal - a.steal,
		syscalls:     a.sys != nil && b.sys != nil && w.sysErr == nil,
	}
	sw := switchesBetween(a.switches, b.switches)
	for part, pids := range map[*usage][]int{&acc.server: server, &acc.loadgen: loadgen} {
		for _, p := range pids {
			part.vol += sw[p].vol
			part.invol += sw[p].invol
			if acc.syscalls {
				part.syscalls += countBetween(a.sys, b.sys, p)
			}
		}
	}
	for _, p := range server {
		acc.rssKiB += b.rss[p]
	}
	return acc, nil
}

// countBetween is pid's count in b less its count in a; all of b's if a
// has none (a process new in the window) or more (its entry was evicted
// and counted anew).
func countBetween(a, b map[int]uint64, pid int) uint64 {
	if b[pid] >= a[pid] {
		return b[pid] - a[pid]
	}
	return b[pid]
}

// perCall sets the figures' wake-ups: each part's context switches and
// system calls divided by the calls answered in the window.
func (f *Figures) perCall(acc accounting, answered int) {
	div := func(n uint64) float64 {
		if answered <= 0 {
			return 0
		}
		return float64(n) / float64(answered)
	}
	f.ServerVolCS, f.ServerInvolCS = div(acc.server.vol), div(acc.server.invol)
	f.LoadgenVolCS, f.LoadgenInvolCS = div(acc.loadgen.vol), div(acc.loadgen.invol)
	f.ServerSyscalls, f.LoadgenSyscalls = -1, -1
	if acc.syscalls {
		f.ServerSyscalls, f.LoadgenSyscalls = div(acc.server.syscalls), div(acc.loadgen.syscalls)
	}
}

// wakeupsMethod says in a report how the wake-ups were counted; off is why
// system calls were not ("" if they were).
func wakeupsMethod(off string) string {
	m := "Wake-ups per call: context switches are the kernel's counts per thread (/proc/<pid>/task/*/status; voluntary: the thread slept, " +
		"waiting for a call, a reply or a lock; involuntary: it was preempted), summed over the server's processes and over the load " +
		"generator's over the measured window and divided by the calls answered; system calls likewise, counted in the kernel by an eBPF " +
		"program on the raw sys_enter tracepoint (about 0.15 us more per system call of any process, measured on this VM; per-task perf " +
		"counters would instead tax every context switch of the processes they watch)."
	if off != "" {
		m += " System calls were not counted: " + off + "."
	}
	return m
}
