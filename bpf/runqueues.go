package bpf

import (
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// RunQueues is the length of each CPU's run queue (rq->nr_running, the
// task running there included) as the scheduler probes last saw it, at a
// switch on that CPU or a wake-up onto it. The kernel writes a mapped
// array, so a look costs a load per CPU and no system call: scdd's reader
// looks before and while it spins, so that it spins only while no task
// waits for a CPU (shm.Doorbells). Requires the tp_btf or raw_tp probes
// and Linux 5.5 (mmapable array maps).
type RunQueues struct {
	mem  []byte
	cpus int // possible CPUs, at most maxCPUs
}

// maxCPUs is the runqueue map's size (MAX_CPUS in sched.c).
const maxCPUs = 1024

func mapRunQueues(m *ebpf.Map) (*RunQueues, error) {
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("runqueue map: %w", err)
	}
	mem, err := unix.Mmap(m.FD(), 0, maxCPUs*4, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("runqueue map: %w (mmapable array maps need Linux 5.5)", os.NewSyscallError("mmap", err))
	}
	return &RunQueues{mem: mem, cpus: min(cpus, maxCPUs)}, nil
}

// Len is CPU cpu's run queue length, as last seen.
func (r *RunQueues) Len(cpu int) int {
	return int((*atomic.Uint32)(unsafe.Pointer(&r.mem[4*cpu])).Load())
}

// Waiting reports whether a task waits for a CPU: some run queue holds
// more than the task running on it.
func (r *RunQueues) Waiting() bool {
	for cpu := range r.cpus {
		if r.Len(cpu) > 1 {
			return true
		}
	}
	return false
}

func (r *RunQueues) unmap() {
	if r != nil && r.mem != nil {
		_ = unix.Munmap(r.mem)
		r.mem = nil
	}
}
