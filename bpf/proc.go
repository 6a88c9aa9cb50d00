package bpf

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// procMeter is the fallback: on-CPU time from /proc/<pid>/stat (utime +
// stime, every thread that ever lived) and run-queue wait from each live
// thread's /proc/<pid>/task/<tid>/schedstat. It has no histogram, and no
// wait at all when the kernel does not keep sched_info.
type procMeter struct {
	mech    Mechanism
	hasWait bool

	mu   sync.Mutex
	last map[int]Usage // what Read saw last: all Forget can give once the process is gone
}

// clockTick is USER_HZ, the unit of /proc/<pid>/stat times; it is 100 on
// every Linux architecture Go supports.
const clockTick = time.Second / 100

func newProcMeter() *procMeter {
	m := &procMeter{mech: Mechanism{Name: Proc}, last: map[int]Usage{}}
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
	m.last[pid] = Usage{}
	m.mu.Unlock()
	return nil
}

func (m *procMeter) Read(pid int) Usage {
	u, err := m.read(pid)
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, tracked := m.last[pid]; !tracked {
		return Usage{}
	}
	if err != nil {
		return m.last[pid] // it has just ended: keep what was seen
	}
	m.last[pid] = u
	return u
}

func (m *procMeter) Forget(pid int) Usage {
	u := m.Read(pid)
	m.mu.Lock()
	delete(m.last, pid)
	m.mu.Unlock()
	return u
}

func (m *procMeter) read(pid int) (Usage, error) {
	var u Usage
	dir := "/proc/" + strconv.Itoa(pid)
	stat, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return u, err
	}
	ticks, err := statCPUTicks(stat)
	if err != nil {
		return u, err
	}
	u.OnCPU = time.Duration(ticks) * clockTick
	if !m.hasWait {
		return u, nil
	}
	tasks, _ := filepath.Glob(dir + "/task/*/schedstat")
	for _, t := range tasks {
		if _, wait, err := readSchedstat(t); err == nil {
			u.Wait += time.Duration(wait)
		}
	}
	return u, nil
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
