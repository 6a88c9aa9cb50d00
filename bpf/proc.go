package bpf

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// procMeter is the fallback: on-CPU time from /proc/<pid>/stat (utime +
// stime, every thread that ever lived) and run-queue wait from each live
// thread's /proc/<pid>/task/<tid>/schedstat. A thread that ended is gone
// from task/, so each process keeps its threads' waits as last read and
// adds those of the threads that ended (its total never goes back). It
// has no histogram, and no wait at all when the kernel does not keep
// sched_info.
type procMeter struct {
	mech    Mechanism
	hasWait bool

	mu    sync.Mutex
	procs map[int]*procState // the tracked processes
}

// procState is what the /proc meter keeps of one process.
type procState struct {
	// mu makes the process's reads one at a time: each one takes what it
	// read against what the one before saw.
	mu      sync.Mutex
	last    Usage                 // what Read saw last: all Forget can give once the process is gone
	threads map[int]time.Duration // each thread's wait at the last read, by tid
	ended   time.Duration         // the waits of the threads that ended since Track
}

// clockTick is USER_HZ, the unit of /proc/<pid>/stat times; it is 100 on
// every Linux architecture Go supports.
const clockTick = time.Second / 100

func newProcMeter() *procMeter {
	m := &procMeter{mech: Mechanism{Name: Proc}, procs: map[int]*procState{}}
	// Our own process has surely run: zeros mean sched_info is off.
	if run, _, err := readSchedstat("/proc/self/schedstat"); err == nil && run > 0 {
		m.hasWait, m.mech.Waits = true, true
	} else {
		m.mech.Reason = "no run-queue wait: /proc/<pid>/schedstat is zero (set kernel.task_delayacct=1)"
	}
	return m
}

func (m *procMeter) Mechanism() Mechanism  { return m.mech }
func (m *procMeter) RunQueues() *RunQueues { return nil }
func (m *procMeter) Close() error          { return nil }

func (m *procMeter) Track(pid int) error {
	m.mu.Lock()
	m.procs[pid] = &procState{}
	m.mu.Unlock()
	return nil
}

func (m *procMeter) Read(pid int) Usage {
	m.mu.Lock()
	st := m.procs[pid]
	m.mu.Unlock()
	if st == nil {
		return Usage{}
	}
	return m.readState(pid, st)
}

func (m *procMeter) Forget(pid int) Usage {
	m.mu.Lock()
	st := m.procs[pid]
	m.mu.Unlock()
	if st == nil {
		return Usage{}
	}
	u := m.readState(pid, st)
	m.mu.Lock()
	if m.procs[pid] == st {
		delete(m.procs, pid)
	}
	m.mu.Unlock()
	return u
}

// readState reads pid and takes it into st.
func (m *procMeter) readState(pid int, st *procState) Usage {
	st.mu.Lock()
	defer st.mu.Unlock()
	u, waits, err := m.read(pid)
	if err != nil {
		return st.last // it has just ended: keep what was seen
	}
	if m.hasWait {
		for tid, w := range st.threads {
			// Gone, or its id taken by a new thread whose wait is below
			// the ended one's: what the ended one waited stays counted.
			if now, ok := waits[tid]; !ok || now < w {
				st.ended += w
			}
		}
		st.threads = waits
		u.Wait = st.ended
		for _, w := range waits {
			u.Wait += w
		}
	}
	st.last = u
	return u
}

// read is pid's on-CPU time and its live threads' waits by tid.
func (m *procMeter) read(pid int) (u Usage, waits map[int]time.Duration, err error) {
	dir := "/proc/" + strconv.Itoa(pid)
	stat, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return u, nil, err
	}
	ticks, err := statCPUTicks(stat)
	if err != nil {
		return u, nil, err
	}
	u.OnCPU = time.Duration(ticks) * clockTick
	if !m.hasWait {
		return u, nil, nil
	}
	tasks, err := os.ReadDir(dir + "/task")
	if err != nil {
		return u, nil, err
	}
	waits = make(map[int]time.Duration, len(tasks))
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		_, wait, err := readSchedstat(dir + "/task/" + t.Name() + "/schedstat")
		switch {
		case err == nil:
			waits[tid] = time.Duration(wait)
		case errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH):
			// it has just ended
		default:
			// Not read (out of descriptors): taken for ended, the thread
			// would be counted again once read.
			return u, nil, err
		}
	}
	return u, waits, nil
}

// statFields are the fields of a /proc/<pid>/stat line from field 3 (the
// state) on: the command may hold spaces and parentheses, so they start
// after the last ')'. Field N is [N-3].
func statFields(stat []byte) ([][]byte, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return nil, fmt.Errorf("bad stat %q", stat)
	}
	return bytes.Fields(stat[i+1:]), nil
}

// statCPUTicks is utime + stime (fields 14 and 15) from a /proc/<pid>/stat
// line.
func statCPUTicks(stat []byte) (uint64, error) {
	f, err := statFields(stat)
	if err != nil || len(f) < 13 {
		return 0, fmt.Errorf("bad stat %q", stat)
	}
	utime, err1 := strconv.ParseUint(string(f[11]), 10, 64)
	stime, err2 := strconv.ParseUint(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bad stat %q", stat)
	}
	return utime + stime, nil
}

// readSchedstat reads a schedstat file: ns on CPU, ns waiting to run.
func readSchedstat(path string) (run, wait uint64, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0, 0, fmt.Errorf("%s: bad schedstat %q", path, b)
	}
	if run, err = strconv.ParseUint(string(f[0]), 10, 64); err != nil {
		return 0, 0, err
	}
	wait, err = strconv.ParseUint(string(f[1]), 10, 64)
	return run, wait, err
}

// ProcStarted is when process pid started: its /proc/<pid>/stat's
// starttime (field 22, clock ticks since boot) on the boot clock.
func ProcStarted(pid int) (time.Time, error) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return time.Time{}, err
	}
	f, err := statFields(stat)
	if err != nil || len(f) < 20 {
		return time.Time{}, fmt.Errorf("bad stat %q", stat)
	}
	ticks, err := strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("bad stat %q", stat)
	}
	var boot unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &boot); err != nil {
		return time.Time{}, err
	}
	return time.Now().Add(time.Duration(ticks)*clockTick - time.Duration(boot.Nano())), nil
}
