package bpf

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// HistSlots is the length of the run-queue wait histogram: slot i counts
// waits of [2^i, 2^(i+1)) µs, slot 0 also the shorter ones, the last slot
// the longer ones.
const HistSlots = len(schedProcStats{}.Hist)

// HistBound is the upper bound of histogram slot i.
func HistBound(i int) time.Duration { return time.Duration(1<<(i+1)) * time.Microsecond }

// Usage is what the kernel saw of one process, or of a group's processes
// summed.
type Usage struct {
	OnCPU time.Duration // time its threads ran
	Wait  time.Duration // time its threads were runnable but waited for a CPU
	Waits uint64        // run-queue waits counted in Hist
	Hist  [HistSlots]uint64
}

// Add adds o to u.
func (u *Usage) Add(o Usage) {
	u.OnCPU += o.OnCPU
	u.Wait += o.Wait
	u.Waits += o.Waits
	for i := range u.Hist {
		u.Hist[i] += o.Hist[i]
	}
}

// Mechanism names how a Meter measures and why that one.
type Mechanism struct {
	Name      string `json:"name"`             // tp_btf, raw_tp, tracepoint, or proc
	Waits     bool   `json:"runqueue_wait"`    // run-queue wait is measured
	Histogram bool   `json:"histogram"`        // and its distribution too
	RunQueues bool   `json:"run_queues"`       // the CPUs' run queue lengths too (RunQueues)
	Reason    string `json:"reason,omitempty"` // why not a better one
}

// Mechanism names.
const (
	TPBTF      = "tp_btf"
	RawTP      = "raw_tp"
	Tracepoint = "tracepoint"
	Proc       = "proc"
)

// A Meter measures the processes it is told to track. It is safe for
// concurrent use.
type Meter interface {
	// Track starts measuring pid (a process id, not a thread id).
	Track(pid int) error
	// Read is pid's usage so far.
	Read(pid int) Usage
	// Forget stops measuring pid and returns its last usage.
	Forget(pid int) Usage
	Mechanism() Mechanism
	// RunQueues are the CPUs' run queues as the probes see them, nil where
	// they are not measured (the classic tracepoint, /proc).
	RunQueues() *RunQueues
	Close() error
}

// Options choose how Open measures.
type Options struct {
	// Force names the only mechanism to try (TPBTF, RawTP, Tracepoint or
	// Proc); empty tries them in order. Tests use it to reach each one.
	Force  string
	Logger *slog.Logger
}

// Open returns the best Meter this kernel allows. It never fails: the
// /proc meter is always there, and its Mechanism says why it was chosen.
func Open(opts Options) Meter {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var why []string
	if opts.Force == Proc {
		why = append(why, "eBPF turned off")
	}
	for _, name := range []string{TPBTF, RawTP, Tracepoint} {
		if opts.Force != "" && opts.Force != name {
			continue
		}
		m, err := openProbes(name)
		if err == nil {
			m.mech.Reason = strings.Join(why, "; ")
			return m
		}
		why = addReason(why, name, err.Error())
	}
	m := newProcMeter()
	if m.mech.Reason != "" {
		why = append(why, m.mech.Reason)
	}
	m.mech.Reason = strings.Join(why, "; ")
	if opts.Force != Proc {
		log.Warn("eBPF scheduler probes not loaded; reading /proc instead (docs/WARNINGS.md#ebpf-probes-not-loaded)", "why", m.mech.Reason)
	}
	return m
}

// addReason adds "name: reason" to why, or name to the entry that already
// gives the same reason ("tp_btf, raw_tp: not root"): a node that is not
// root fails every mechanism for the one reason, and the warning repeated
// it three times over 360 characters (issue 31 item 4).
func addReason(why []string, name, reason string) []string {
	for i, w := range why {
		if names, r, ok := strings.Cut(w, ": "); ok && r == reason {
			why[i] = names + ", " + name + ": " + reason
			return why
		}
	}
	return append(why, name+": "+reason)
}

// probeMeter reads the counters the eBPF programs keep.
type probeMeter struct {
	mech  Mechanism
	coll  *ebpf.Collection
	procs *ebpf.Map
	links []link.Link
	rq    *RunQueues // nil with the classic tracepoint
}

// programs are each mechanism's three programs: switch, wakeup, wakeup_new.
var programs = map[string][3]string{
	TPBTF:      {schedProgBtfSwitch, schedProgBtfWakeup, schedProgBtfWakeupNew},
	RawTP:      {schedProgRawSwitch, schedProgRawWakeup, schedProgRawWakeupNew},
	Tracepoint: {schedProgTpSwitch, schedProgTpWakeup, schedProgTpWakeupNew},
}

var events = [3]string{"sched_switch", "sched_wakeup", "sched_wakeup_new"}

// freeProgram drops a thread's entry when its task is freed, for every
// mechanism: a raw_tp, since the classic tracepoint's record of
// sched_process_free differs between kernels (comm inline or __data_loc).
const freeProgram, freeEvent = schedProgRawFree, "sched_process_free"

func openProbes(name string) (m *probeMeter, err error) {
	if err := canTrace(); err != nil {
		return nil, err
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, err
	}
	if name == Tracepoint {
		if err := mountTracefs(); err != nil {
			return nil, err
		}
	}
	spec, err := loadSched()
	if err != nil {
		return nil, err
	}
	keep := programs[name]
	keepOnly(spec, append(keep[:], freeProgram))
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	m = &probeMeter{mech: Mechanism{Name: name, Waits: true, Histogram: true}, coll: coll, procs: coll.Maps[schedMapProcs]}
	defer func() {
		if err != nil {
			m.Close()
		}
	}()
	for i, p := range keep {
		prog := coll.Programs[p]
		var l link.Link
		switch name {
		case TPBTF:
			l, err = link.AttachTracing(link.TracingOptions{Program: prog})
		case RawTP:
			l, err = link.AttachRawTracepoint(link.RawTracepointOptions{Name: events[i], Program: prog})
		case Tracepoint:
			l, err = link.Tracepoint("sched", events[i], prog, nil)
		}
		if err != nil {
			return nil, fmt.Errorf("attach %s: %w", events[i], err)
		}
		m.links = append(m.links, l)
	}
	l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: freeEvent, Program: coll.Programs[freeProgram]})
	if err != nil {
		return nil, fmt.Errorf("attach %s: %w", freeEvent, err)
	}
	m.links = append(m.links, l)
	if name != Tracepoint {
		if m.rq, err = mapRunQueues(coll.Maps[schedMapRunqueue]); err != nil {
			return nil, err
		}
		m.mech.RunQueues = true
	}
	return m, nil
}

// keepOnly leaves in spec the programs named and the maps they use. A
// collection creates every map of its spec, and the run-queue map
// (BPF_F_MMAPABLE, Linux 5.5) failed the load of the classic tracepoint's
// programs, which do not use it, on older kernels: every probe was lost.
func keepOnly(spec *ebpf.CollectionSpec, progs []string) {
	used := map[string]bool{}
	for name, p := range spec.Programs {
		if !slices.Contains(progs, name) {
			delete(spec.Programs, name)
			continue
		}
		for _, ins := range p.Instructions {
			if ins.IsLoadFromMap() {
				used[ins.Reference()] = true
			}
		}
	}
	for name := range spec.Maps {
		if !used[name] {
			delete(spec.Maps, name)
		}
	}
}

// canTrace says whether this process may load and attach the probes: root,
// or CAP_BPF with CAP_PERFMON (Linux 5.8), or CAP_SYS_ADMIN.
func canTrace() error {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return err
	}
	var eff uint64
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			if eff, err = strconv.ParseUint(strings.TrimSpace(v), 16, 64); err != nil {
				return fmt.Errorf("CapEff: %w", err)
			}
		}
	}
	has := func(c uint) bool { return eff&(1<<c) != 0 }
	if has(unix.CAP_SYS_ADMIN) || has(unix.CAP_BPF) && has(unix.CAP_PERFMON) {
		return nil
	}
	return errors.New("neither root nor CAP_BPF with CAP_PERFMON: the scheduler probes cannot load")
}

// tracefsDir is where the classic tracepoint's tracefs is expected.
const tracefsDir = "/sys/kernel/tracing"

// mountTracefs mounts tracefs where it belongs unless it is there already.
func mountTracefs() error {
	var st unix.Statfs_t
	if err := unix.Statfs(tracefsDir, &st); err == nil && st.Type == unix.TRACEFS_MAGIC {
		return nil
	}
	if err := unix.Mount("nodev", tracefsDir, "tracefs", 0, ""); err != nil {
		return fmt.Errorf("mount tracefs on %s: %w", tracefsDir, err)
	}
	return nil
}

func (m *probeMeter) Mechanism() Mechanism { return m.mech }

func (m *probeMeter) Track(pid int) error {
	return m.procs.Update(uint32(pid), schedProcStats{}, ebpf.UpdateAny)
}

func (m *probeMeter) Read(pid int) Usage {
	var st schedProcStats
	if err := m.procs.Lookup(uint32(pid), &st); err != nil {
		return Usage{}
	}
	u := Usage{OnCPU: time.Duration(st.OncpuNs), Wait: time.Duration(st.WaitNs), Waits: st.Waits}
	copy(u.Hist[:], st.Hist[:])
	return u
}

func (m *probeMeter) Forget(pid int) Usage {
	u := m.Read(pid)
	m.procs.Delete(uint32(pid))
	return u
}

func (m *probeMeter) RunQueues() *RunQueues { return m.rq }

func (m *probeMeter) Close() error {
	for _, l := range m.links {
		l.Close()
	}
	m.rq.unmap()
	m.coll.Close()
	return nil
}
