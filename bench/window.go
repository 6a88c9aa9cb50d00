package bench

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"syscall"
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
func (w *window) begin(loadgen ...int) { onSampler(func() { w.sampleBegin(loadgen) }) }

// end samples the window's end, in the reverse order of begin.
func (w *window) end() { onSampler(w.sampleEnd) }

// span is when the window's two CPU samples were taken (each the middle
// of its reading of /proc); zero times if either is missing.
func (w *window) span() (time.Time, time.Time) {
	if !w.begun || !w.ended {
		return time.Time{}, time.Time{}
	}
	return w.first.cpu.mid(), w.last.cpu.mid()
}

// The window's samples are taken on one thread of the harness that runs at
// nice -10 (when the harness may raise it): each reads a few hundred /proc
// files, and at normal priority a sample taken while the system measured
// keeps both CPUs busy with ten processes waited behind them read after
// read, and took up to 0.9 s of a 0.8 s window (S10's callers on lanes,
// 2026-12-06). Threads the runtime makes while it runs come from its
// template thread (it is locked), so nothing else of the harness, and no
// process it starts, inherits the priority.
var samplerThread = sync.OnceValue(func() chan func() {
	ch := make(chan func())
	go func() {
		runtime.LockOSThread()
		_ = syscall.Setpriority(syscall.PRIO_PROCESS, syscall.Gettid(), -10) // not root: as it is
		for f := range ch {
			f()
		}
	}()
	return ch
})

// onSampler runs f on the sampler's thread and waits for it.
func onSampler(f func()) {
	done := make(chan struct{})
	samplerThread() <- func() { f(); close(done) }
	<-done
}

func (w *window) sampleBegin(loadgen []int) {
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

func (w *window) sampleEnd() {
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
// system calls divided by the calls answered in the sampled window.
func (f *Figures) perCall(acc accounting, answered int, sampled float64) {
	calls := sampledCalls(answered, sampled)
	div := func(n uint64) float64 {
		if calls <= 0 {
			return 0
		}
		return float64(n) / calls
	}
	f.ServerVolCS, f.ServerInvolCS = div(acc.server.vol), div(acc.server.invol)
	f.LoadgenVolCS, f.LoadgenInvolCS = div(acc.loadgen.vol), div(acc.loadgen.invol)
	f.ServerSyscalls, f.LoadgenSyscalls = -1, -1
	if acc.syscalls {
		f.ServerSyscalls, f.LoadgenSyscalls = div(acc.server.syscalls), div(acc.loadgen.syscalls)
	}
}

// sampledCalls is the calls answered in the part of the window the
// samples covered (sampled, 0: all of it), the calls coming at an even
// rate through the window.
func sampledCalls(answered int, sampled float64) float64 {
	if sampled <= 0 {
		return float64(answered)
	}
	return float64(answered) * sampled
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
