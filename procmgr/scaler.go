package procmgr

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// scaleLoop applies the Multiserver rule: at once when an enqueue kicks it,
// every CheckInterval while a check has something to watch (calls waiting,
// non-resident processes to track for idling, a closed memory gate), and
// every idleCheckInterval otherwise. A quiet node's check decides nothing
// (no start without a waiting call, which kicks; no stop without a
// non-resident process), and at CheckInterval it was the largest part of
// an idle scdd's CPU.
func (m *Manager) scaleLoop() {
	defer m.wg.Done()
	t := time.NewTimer(m.opts.CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-m.done:
			return
		case <-m.kick:
		case <-t.C:
		}
		next := max(idleCheckInterval, m.opts.CheckInterval)
		if m.check(time.Now()) {
			next = m.opts.CheckInterval
		}
		t.Reset(next)
	}
}

// idleCheckInterval is how often the scaler looks while nothing waits and
// no non-resident process runs: the CPU guard's window and the memory
// gate's log are then at most this old when the next call kicks a check.
const idleCheckInterval = time.Second

// check is one pass of the rule over every server of the node. It reports
// whether the next one must come soon: calls wait, a non-resident process
// runs, or the memory gate is closed.
func (m *Manager) check(now time.Time) (watching bool) {
	// One check at a time: a second one must not decide on the memory
	// permits and counts the first is still acting on.
	m.checking.Lock()
	defer m.checking.Unlock()
	m.mu.Lock()
	servers := append([]*Server(nil), m.servers...)
	m.mu.Unlock()
	loads := make([]ServerLoad, len(servers))
	nodeRunning := 0
	for i, s := range servers {
		loads[i] = s.observe(now)
		nodeRunning += loads[i].Running
		watching = watching || loads[i].Queue > 0 || len(loads[i].NonResident) > 0
	}
	lim := Limits{NodeCap: m.opts.NodeCap, NodeRunning: nodeRunning}
	if m.opts.MemoryReserve > 0 {
		avail, err := m.opts.MemAvailable()
		m.mu.Lock()
		m.memErr = err
		low := err == nil && avail < m.opts.MemoryReserve
		changed := low != m.memLow
		if !low {
			m.permits = 0 // permits are owed only while the gate is closed
		}
		m.memLow = low
		lim.MemoryLow, lim.MemoryPermit = low, m.permits
		m.mu.Unlock()
		if changed { // one check at a time (checking): said in order
			m.log.Info("memory gate", "closed", low, "available_mib", avail>>20, "reserve_mib", m.opts.MemoryReserve>>20) // lockcheck: only the scaler takes checking
		}
		watching = watching || low
	}
	decisions := Plan(loads, lim)
	for i, d := range decisions {
		s := servers[i]
		if lim.MemoryLow && Wanted(loads[i]) > d.Start {
			m.gateHolds.Add(1)
		}
		if unguarded := loads[i]; guarded(unguarded) {
			unguarded.CPUWaitLimit = 0
			if Wanted(unguarded) > d.Start {
				m.cpuHolds.Add(1)
			}
		}
		for range d.Start {
			if !s.startNonResident() {
				break
			}
			if lim.MemoryLow {
				m.mu.Lock()
				m.permits--
				m.mu.Unlock()
			}
		}
		if d.Stop >= 0 {
			s.stopNonResident(d.Stop)
		}
	}
	return watching
}

// nonResidentEnded is told of every non-resident exit: while the memory
// gate is closed each one lets one waiting start go ahead.
func (m *Manager) nonResidentEnded() {
	m.mu.Lock()
	if m.memLow {
		m.permits++
	}
	m.mu.Unlock()
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// observe builds the scaler's view of the server and tracks how long each
// non-resident process has been idle.
func (s *Server) observe(now time.Time) ServerLoad {
	ld := ServerLoad{
		Priority:     s.spec.Priority,
		Max:          int(s.maxProcs.Load()),
		BalanceCount: s.spec.BalanceCount,
		IdleStop:     s.spec.IdleStop,
		CPUWaitLimit: s.spec.CPUWaitLimit,
	}
	cpu := s.usage.cpuSample(now)
	ld.CPUWait, ld.CPUBusy = cpu.Wait, cpu.Busy
	if s.spec.Priority == 0 {
		ld.Priority = DefaultPriority
	}
	ld.Queue = s.delegate.Waiting()
	// The delegate is asked without s.mu held (it takes its own locks, and
	// calls into this server under them), then what it said is applied.
	type look struct {
		sl   *slot
		proc *os.Process
		view SlotView
	}
	s.mu.Lock()
	ld.Resident = s.resident
	if s.stopping {
		s.mu.Unlock()
		ld.Max = 0
		return ld
	}
	looks := make([]look, 0, len(s.slots))
	for _, sl := range s.slots {
		if sl.proc != nil && !sl.stopAsked {
			looks = append(looks, look{sl: sl, proc: sl.proc})
		}
	}
	s.mu.Unlock()
	for i := range looks {
		looks[i].view = s.delegate.Slot(looks[i].sl.index)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, lk := range looks {
		sl, v := lk.sl, lk.view
		if sl.proc != lk.proc || sl.stopAsked {
			continue // it ended or was stopped meanwhile
		}
		ld.Running++
		if v.Ready && sl.state == StateStarting {
			sl.state = StateRunning
		}
		if !v.Busy {
			ld.Free++
		}
		if sl.resident {
			continue
		}
		p := NonResidentProc{Slot: sl.index}
		switch {
		case !v.Ready || v.Busy || v.Served != sl.lastServed || sl.idleSince.IsZero():
			sl.lastServed, sl.idleSince = v.Served, now
			if v.Busy || !v.Ready {
				sl.idleSince = time.Time{}
			}
		default:
			p.IdleFor = now.Sub(sl.idleSince)
		}
		ld.NonResident = append(ld.NonResident, p)
	}
	ld.CPUSeen = !cpu.Since.Before(s.lastStart)
	if s.failing && s.resident == 0 && ld.Running == 0 && ld.Queue == 0 {
		// The group refuses calls while the server fails, so none waits,
		// and only a process that attaches ends the failing: with no
		// resident slot to restart, nothing would start one again. One
		// start, as if a call waited, paced by the crash back-off below.
		ld.Queue = 1
	}
	if now.Before(s.crashUntil) {
		ld.Max = ld.Running // a non-resident crash loop: hold starts back
	}
	return ld
}

// startNonResident starts a process in a free non-resident slot. Which
// slots are resident can change (SetParallelCount), so it looks at all;
// the rule's Max bounds how many run.
func (s *Server) startNonResident() bool {
	s.mu.Lock()
	var free *slot
	for _, sl := range s.slots {
		if !sl.resident && !sl.watched && sl.proc == nil {
			free = sl
			free.watched = true // claimed: no one else starts a process here
			break
		}
	}
	s.mu.Unlock()
	if free == nil {
		return false
	}
	if err := s.spawn(free, false); err != nil {
		s.m.log.Error("non-resident uap start failed", "server", s.spec.Server, "slot", free.index, "err", err)
		s.mu.Lock()
		// chprc may have made the slot resident meanwhile, leaving its
		// start to this one (it was watched): then it is restarted as a
		// resident whose start failed, or nothing would start it again.
		promoted := free.resident && !s.stopping
		if !promoted {
			free.watched = false
		}
		s.crashBackoff = min(max(s.crashBackoff*2, minBackoff), maxBackoff)
		s.crashUntil = time.Now().Add(s.crashBackoff)
		s.mu.Unlock()
		if promoted {
			go func() {
				backoff := minBackoff
				if s.restart(free, &backoff) {
					s.watch(free)
				}
			}()
		}
		return false
	}
	s.m.starts.Add(1)
	s.mu.Lock()
	s.lastStart = time.Now()
	s.mu.Unlock()
	go s.watch(free)
	return true
}

// stopNonResident asks the process in slot to stop after its request.
func (s *Server) stopNonResident(slot int) {
	s.mu.Lock()
	sl := s.slots[slot]
	if sl.proc == nil || sl.stopAsked || sl.resident {
		s.mu.Unlock()
		return
	}
	sl.stopAsked, sl.state = true, StateStopping
	s.mu.Unlock()
	s.m.stops.Add(1)
	s.delegate.Stop(slot)
}

// MemAvailable is the memory a new process can have without swapping: the
// host's MemAvailable, or the headroom of this process's memory cgroup
// when that is smaller.
func MemAvailable() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	avail := int64(-1)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "MemAvailable:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/meminfo: MemAvailable: %w", err)
			}
			avail = kb << 10
		}
	}
	if avail < 0 {
		return 0, fmt.Errorf("/proc/meminfo has no MemAvailable (Linux 3.14+)")
	}
	if head, ok := cgroupMemoryHeadroom(); ok && head < avail {
		avail = head
	}
	return avail, nil
}

// cgroupMemoryHeadroom is limit minus usage of this process's memory
// cgroup, v2 (memory.max, memory.current) or v1 (memory.limit_in_bytes,
// memory.usage_in_bytes); false when unlimited or unknown.
func cgroupMemoryHeadroom() (int64, bool) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var limitFile, usageFile string
		switch {
		case parts[0] == "0" && parts[1] == "":
			dir := "/sys/fs/cgroup" + parts[2]
			limitFile, usageFile = dir+"/memory.max", dir+"/memory.current"
		case hasWord(parts[1], "memory"):
			dir := "/sys/fs/cgroup/memory" + parts[2]
			limitFile, usageFile = dir+"/memory.limit_in_bytes", dir+"/memory.usage_in_bytes"
		default:
			continue
		}
		limit, err1 := readInt64(limitFile)
		usage, err2 := readInt64(usageFile)
		if err1 != nil || err2 != nil || limit <= 0 || limit >= 1<<60 {
			continue
		}
		return max(limit-usage, 0), true
	}
	return 0, false
}

func readInt64(file string) (int64, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}
