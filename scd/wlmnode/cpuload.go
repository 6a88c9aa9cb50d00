package wlmnode

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// cpuSampler measures how busy the CPUs this node may run on are: those of
// scdd's affinity mask (taskset, a cpuset cgroup, a container), from
// /proc/stat's per-CPU lines. So nodes that share a machine but not CPUs
// see each other's work as theirs only where the CPUs are shared; nodes on
// machines of their own see everything that runs there, which tpsched
// cannot take from (another program's CPU is not spare).
type cpuSampler struct {
	path string
	cpus map[int]bool // the affinity mask; nil: every CPU
	prev map[int]cpuTimes
}

// cpuTimes are one CPU's /proc/stat counters (clock ticks).
type cpuTimes struct{ busy, total uint64 }

// newCPUSampler samples the per-CPU lines of path (/proc/stat, or a file
// that stands for it).
func newCPUSampler(path string) *cpuSampler {
	s := &cpuSampler{path: path}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err == nil && set.Count() > 0 {
		s.cpus = map[int]bool{}
		for i := range len(unix.CPUSet{}) * 64 {
			if set.IsSet(i) {
				s.cpus[i] = true
			}
		}
	}
	return s
}

// sample returns the CPUs of the mask and how many of them were busy
// (summed over the CPUs, 0..cpus) since the last sample; the first sample
// only sets the base and returns busy 0.
func (s *cpuSampler) sample() (cpus, busy float64, err error) {
	b, err := os.ReadFile(s.path)
	if err != nil {
		return 0, 0, fmt.Errorf("cpu load: %w", err)
	}
	now, err := parseProcStat(b, s.cpus)
	if err != nil {
		return 0, 0, fmt.Errorf("cpu load: %s: %w", s.path, err)
	}
	for cpu, t := range now {
		cpus++
		p, ok := s.prev[cpu]
		if !ok || t.total <= p.total || t.busy < p.busy {
			continue
		}
		busy += min(float64(t.busy-p.busy)/float64(t.total-p.total), 1)
	}
	s.prev = now
	return cpus, busy, nil
}

// parseProcStat reads the per-CPU lines ("cpuN user nice system idle
// iowait irq softirq steal ...") of the CPUs in mask (all when nil). Busy
// is everything but idle and iowait: steal too, since a stolen CPU is not
// spare.
func parseProcStat(b []byte, mask map[int]bool) (map[int]cpuTimes, error) {
	out := map[int]cpuTimes{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		cpu, err := strconv.Atoi(f[0][3:])
		if err != nil {
			continue
		}
		if mask != nil && !mask[cpu] {
			continue
		}
		var t cpuTimes
		for i, v := range f[1:min(len(f), 9)] {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%s: field %d: %w", f[0], i+1, err)
			}
			t.total += n
			if i != 3 && i != 4 { // idle, iowait
				t.busy += n
			}
		}
		out[cpu] = t
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no per-CPU line for the CPUs of the affinity mask")
	}
	return out, nil
}
