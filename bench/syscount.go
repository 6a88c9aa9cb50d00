package bench

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
)

// syscallCounter counts the system calls of every process of the machine
// in the kernel: an eBPF program on the raw_syscalls:sys_enter tracepoint
// adds one to the count of the calling process (its tgid) in an LRU hash
// map, which the harness reads at the two ends of a run's window.
//
// Why not perf stat: per-task perf counters (perf stat -p) are switched in
// and out at every context switch of the tasks they watch, a cost that
// lands exactly on what S10 measures (wake-ups); this program costs one
// map update per system call of any process (about 0.1-0.3 us), the same
// for every system measured, and nothing on a context switch. It is
// written in eBPF assembly (cilium/ebpf/asm), so building the bench needs
// no clang.
type syscallCounter struct {
	counts *ebpf.Map
	prog   *ebpf.Program
	link   link.Link
}

// syscallSlots bounds the processes counted at once: the least recently
// counted make room for new ones, so a long session on a machine that
// starts many processes keeps counting the live ones.
const syscallSlots = 1 << 16

// newSyscallCounter loads and attaches the counter (root, or CAP_BPF and
// CAP_PERFMON, and tracefs).
func newSyscallCounter() (*syscallCounter, error) {
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("bench: syscall counter: memlock: %w", err)
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "tpbench_sysc", Type: ebpf.LRUHash, KeySize: 4, ValueSize: 8, MaxEntries: syscallSlots})
	if err != nil {
		return nil, fmt.Errorf("bench: syscall counter: map: %w", err)
	}
	const (
		keyOff  = -4  // u32 tgid on the stack
		oneOff  = -16 // u64 1 on the stack, for the first count of a tgid
		noExist = 1   // BPF_NOEXIST
	)
	insns := asm.Instructions{
		asm.FnGetCurrentPidTgid.Call(),
		asm.RSh.Imm(asm.R0, 32), // the tgid: the process, whatever its thread
		asm.StoreMem(asm.RFP, keyOff, asm.R0, asm.Word),
		asm.LoadMapPtr(asm.R1, m.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, keyOff),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "first"),
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreXAdd(asm.R0, asm.R1, asm.DWord), // threads of one process on two CPUs
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
		// The process's first count. Two of its threads may race here;
		// the loser's one call is lost.
		asm.Mov.Imm(asm.R1, 1).WithSymbol("first"),
		asm.StoreMem(asm.RFP, oneOff, asm.R1, asm.DWord),
		asm.LoadMapPtr(asm.R1, m.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, keyOff),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, oneOff),
		asm.Mov.Imm(asm.R4, noExist),
		asm.FnMapUpdateElem.Call(),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "tpbench_sysc", Type: ebpf.RawTracepoint, Instructions: insns, License: "GPL"})
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("bench: syscall counter: program: %w", err)
	}
	// A raw tracepoint: the classic one (perf's) fills a trace record
	// for every call first, which doubled the program's cost here.
	l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: "sys_enter", Program: prog})
	if err != nil {
		prog.Close()
		m.Close()
		return nil, fmt.Errorf("bench: syscall counter: attach to raw_syscalls:sys_enter: %w", err)
	}
	return &syscallCounter{counts: m, prog: prog, link: l}, nil
}

// snapshot is every counted process's system calls so far, by pid. A nil
// counter gives nil.
func (c *syscallCounter) snapshot() (map[int]uint64, error) {
	if c == nil {
		return nil, nil
	}
	out := make(map[int]uint64, 512)
	keys := make([]uint32, 4096)
	vals := make([]uint64, 4096)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := c.counts.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			out[int(keys[i])] = vals[i]
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("bench: syscall counter: read: %w", err)
		}
	}
}

// Close detaches the counter.
func (c *syscallCounter) Close() {
	if c == nil {
		return
	}
	c.link.Close()
	c.prog.Close()
	c.counts.Close()
}
