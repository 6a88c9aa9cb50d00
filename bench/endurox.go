package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// Enduro/X (github.com/endurox-dev/endurox, C, AGPL) is the nearest peer
// of tpsched's local calls: a Tuxedo-style TP monitor whose services call
// each other over POSIX message queues on the node. Its own benchmark pair
// is measured: exbenchcl (N client threads, each with its own XATMI context
// and reply queue, calling in a loop) against exbenchsv (an echo service),
// under its daemon ndrxd. Not exbenchcl -F (N client processes): in the
// version measured its parent adds the children's calls/s to an
// uninitialised double and prints garbage about one run in three. The bench
// never builds or ships it: TPSCHED_ENDUROX names an install prefix built
// by hand (README, "Make targets"), and without it the report says "not
// measured".

const (
	nameEnduroX = "Enduro/X"
	// enduroxEnv names the install prefix (bin/, lib/, share/endurox/ubftab).
	enduroxEnv = "TPSCHED_ENDUROX"
	// enduroxMaxCallers is the most callers measured: every client thread
	// takes a POSIX queue of its own (its replies), every server two, and
	// this VM's quota (800 KiB of queues per user, no CAP_SYS_RESOURCE to
	// raise it) holds the queues of five clients and five servers at 8 KiB
	// x 5 messages, not those of 64 clients.
	enduroxMaxCallers = 5
	// enduroxSrvID is the first exbenchsv's server id; the others follow.
	enduroxSrvID = 100
	// enduroxQueueDepth and enduroxMsgSize are NDRX_MSGMAX and
	// NDRX_MSGSIZEMAX: no queue holds more than 5 messages in a closed loop
	// of 5 callers, and 8 KiB (the VM's msgsize_max) holds a 4 KiB request.
	enduroxQueueDepth = 5
	enduroxMsgSize    = 8192
)

// enduroxInstall is the install prefix TPSCHED_ENDUROX names, checked for
// what the bench runs.
func enduroxInstall() (string, error) {
	prefix := os.Getenv(enduroxEnv)
	if prefix == "" {
		return "", fmt.Errorf("%s is not set: build Enduro/X by hand (docs/TESTING.md, Make targets) and set it to the install prefix", enduroxEnv)
	}
	for _, f := range []string{"bin/ndrxd", "bin/xadmin", "bin/exbenchcl", "bin/exbenchsv", "share/endurox/ubftab/Exfields"} {
		if _, err := os.Stat(filepath.Join(prefix, f)); err != nil {
			return "", fmt.Errorf("%s=%s: %w", enduroxEnv, prefix, err)
		}
	}
	mounts, err := os.ReadFile("/proc/mounts")
	if err != nil || !bytes.Contains(mounts, []byte(" /dev/mqueue mqueue ")) {
		return "", errors.New("/dev/mqueue is not mounted (Enduro/X lists its POSIX queues there): mkdir -p /dev/mqueue && mount -t mqueue none /dev/mqueue")
	}
	return prefix, nil
}

// enduroxVersion is the installed version, from its build configuration.
func enduroxVersion() (string, error) {
	prefix := os.Getenv(enduroxEnv)
	if prefix == "" {
		return "", errors.New("not installed")
	}
	b, err := os.ReadFile(filepath.Join(prefix, "include", "ndrx_config.h"))
	if err != nil {
		return "", err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "#define NDRX_VERSION "); ok {
			return strings.Trim(strings.TrimSpace(v), `"`), nil
		}
	}
	return "", errors.New("no NDRX_VERSION")
}

// endurox is one running Enduro/X application domain.
type endurox struct {
	s       *system
	prefix  string
	env     []string
	fixed   int    // exbenchsv processes in every cell (0: as many as the cell's callers)
	servers int    // exbenchsv processes running now
	runs    int    // exbenchcl runs so far, for their file names
	tag     string // NDRX_QPREFIX (less its /) and NDRX_RNDK: marks the domain's queues and processes
}

// enduroxSeq makes each domain's queue prefix and IPC key its own.
var enduroxSeq atomic.Int32

// startEnduroX starts an Enduro/X domain with enduroxMaxCallers exbenchsv
// servers (sp.EnduroXServers if set), each cell then running as many as
// it has callers unless sp.EnduroXServers fixes them.
func startEnduroX(env Env, sp Spec) (*system, error) {
	prefix, err := enduroxInstall()
	if err != nil {
		return nil, err
	}
	s, err := newSystem(nameEnduroX)
	if err != nil {
		return nil, err
	}
	e := &endurox{s: s, prefix: prefix, fixed: sp.EnduroXServers}
	e.servers = enduroxMaxCallers
	if e.fixed > 0 {
		e.servers = e.fixed
	}
	tag := fmt.Sprintf("tpbx%d_%d", os.Getpid()%100000, enduroxSeq.Add(1))
	e.tag = tag
	d := s.dir
	e.env = []string{
		"PATH=" + filepath.Join(prefix, "bin") + ":" + os.Getenv("PATH"),
		"LD_LIBRARY_PATH=" + filepath.Join(prefix, "lib"),
		"NDRX_NODEID=1", "NDRX_CLUSTERISED=0", "NDRX_LDBAL=0", "NDRX_TOUT=60",
		"NDRX_QPREFIX=/" + tag, "NDRX_RNDK=" + tag,
		"NDRX_IPCKEY=" + enduroxIPCKey(os.Getpid(), enduroxSeq.Load()),
		"NDRX_SVCMAX=1000", "NDRX_SRVMAX=1000",
		"NDRX_QPATH=/dev/mqueue", "NDRX_SHMPATH=/dev/shm", "NDRX_CMDWAIT=1",
		"NDRX_MSGMAX=" + strconv.Itoa(enduroxQueueDepth), "NDRX_DQMAX=" + strconv.Itoa(enduroxQueueDepth),
		"NDRX_MSGSIZEMAX=" + strconv.Itoa(enduroxMsgSize),
		"NDRX_APPHOME=" + d, "NDRX_ULOG=" + d, "NDRX_DPID=" + filepath.Join(d, "ndrxd.pid"),
		"NDRX_CONFIG=" + filepath.Join(d, "ndrxconfig.xml"), "NDRX_DMNLOG=" + filepath.Join(d, "ndrxd.log"),
		"NDRX_LOG=" + filepath.Join(d, "ndrx.log"), "NDRX_DEBUG_CONF=" + filepath.Join(d, "debug.conf"),
		"FIELDTBLS=Exfields", "FLDTBLDIR=" + filepath.Join(prefix, "share", "endurox", "ubftab"),
	}
	s.stop = e.down
	return launch(s, "", func() error {
		if err := writeFiles(d, map[string]string{
			"ndrxconfig.xml": enduroxConfig(d, e.servers),
			// Errors only: nothing is logged per call.
			"debug.conf": fmt.Sprintf("* ndrx=2 ubf=1 tp=2 file=%s\n", filepath.Join(d, "ndrx.log")),
		}); err != nil {
			return err
		}
		if out, err := e.xadmin(60*time.Second, "start", "-y"); err != nil {
			return fmt.Errorf("xadmin start: %w\n%s", err, out)
		}
		b, err := os.ReadFile(filepath.Join(d, "ndrxd.pid"))
		if err != nil {
			return fmt.Errorf("ndrxd's pid: %w", err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return fmt.Errorf("ndrxd's pid file: %w", err)
		}
		s.pids = []int{pid}
		s.drive = e.drive
		s.skip = func(c gridCell) string {
			if c.Service != "echo" {
				return "exbenchsv serves echo only"
			}
			if c.Conns > enduroxMaxCallers {
				return fmt.Sprintf("more than %d callers: a POSIX queue per client, over this VM's quota of queues", enduroxMaxCallers)
			}
			return ""
		}
		// The whole path works: one short exbenchcl run.
		tps, err := e.exbench(context.Background(), 1, 1, 128, nil)
		if err != nil {
			return fmt.Errorf("Enduro/X did not answer: %w\n%s", err, s.Log())
		}
		if tps <= 0 {
			return fmt.Errorf("exbenchcl made no call\n%s", s.Log())
		}
		return nil
	})
}

// enduroxConfig is ndrxconfig.xml: the sample configuration's timers, and
// servers exbenchsv processes (server ids enduroxSrvID on).
func enduroxConfig(dir string, servers int) string {
	return fmt.Sprintf(`<?xml version="1.0" ?>
<endurox>
	<appconfig>
		<sanity>1</sanity>
		<brrefresh>6</brrefresh>
		<restart_min>1</restart_min>
		<restart_step>1</restart_step>
		<restart_max>5</restart_max>
		<restart_to_check>20</restart_to_check>
	</appconfig>
	<defaults>
		<min>1</min>
		<max>1</max>
		<autokill>1</autokill>
		<start_max>10</start_max>
		<pingtime>10</pingtime>
		<ping_max>60</ping_max>
		<end_max>10</end_max>
		<killtime>1</killtime>
	</defaults>
	<servers>
		<server name="exbenchsv">
			<srvid>%d</srvid>
			<min>%d</min>
			<max>%d</max>
			<sysopt>-e %s/exbenchsv.log</sysopt>
		</server>
	</servers>
</endurox>
`, enduroxSrvID, servers, servers, dir)
}

// xadmin runs one xadmin command in the domain.
func (e *endurox) xadmin(timeout time.Duration, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c := exec.CommandContext(ctx, filepath.Join(e.prefix, "bin", "xadmin"), args...)
	c.Dir = e.s.dir
	c.Env = append(os.Environ(), e.env...)
	return c.CombinedOutput()
}

// down stops the domain and removes its queues and shared memory, also
// after a start that failed half way. Not with xadmin down: in the version
// measured it kills every process of the user whose command line holds
// "xadmin" (as root, anyone's) and removes every queue of the user. The
// domain's own processes are found by the NDRX_RNDK each of them carries
// in its environment, its queues and shared memory by NDRX_QPREFIX.
func (e *endurox) down() {
	if len(e.s.pids) > 0 {
		e.xadmin(60*time.Second, "stop", "-y")
	}
	for _, p := range append(e.s.pids, domainPIDs("NDRX_RNDK="+e.tag)...) {
		syscall.Kill(p, syscall.SIGKILL) // gone already, unless the stop failed
	}
	for _, dir := range []string{"/dev/mqueue", "/dev/shm"} {
		names, _ := filepath.Glob(filepath.Join(dir, e.tag+",*"))
		for _, n := range names {
			os.Remove(n)
		}
	}
}

// domainPIDs lists the processes whose environment holds mark (one
// NAME=value): those of one Enduro/X domain, started by this bench.
func domainPIDs(mark string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "environ"))
		if err != nil {
			continue
		}
		for v := range bytes.SplitSeq(env, []byte{0}) {
			if string(v) == mark {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// enduroxIPCKey is a domain's NDRX_IPCKEY, written in hexadecimal as
// Enduro/X reads it (the decimal keys given before were read as other
// numbers, in other ranges). Its System V resources take keys just past
// it, so a domain has 0x100 keys of its own: one per bench process (pid)
// and domain of that process (seq), in a range of their own.
func enduroxIPCKey(pid int, seq int32) string {
	return fmt.Sprintf("%x", 0x7b000000+((pid%0x800)<<4+int(seq)%0x10)<<8)
}

// setServers runs n exbenchsv processes: those past n stopped, those
// missing started (xadmin stop/start -i).
func (e *endurox) setServers(n int) error {
	for ; e.servers > n; e.servers-- {
		if out, err := e.xadmin(30*time.Second, "stop", "-i", strconv.Itoa(enduroxSrvID+e.servers-1)); err != nil {
			return fmt.Errorf("xadmin stop: %w\n%s", err, out)
		}
	}
	for ; e.servers < n; e.servers++ {
		if out, err := e.xadmin(30*time.Second, "start", "-i", strconv.Itoa(enduroxSrvID+e.servers)); err != nil {
			return fmt.Errorf("xadmin start: %w\n%s", err, out)
		}
	}
	return nil
}

// exbenchTime is exbenchcl's -t: its callers call for that many whole
// seconds, which must hold the warm-up and the window with room to spare.
func exbenchTime(warmup, window time.Duration) int {
	return max(1, int(math.Ceil((warmup + window + 500*time.Millisecond).Seconds())))
}

// drive runs one cell: c.Conns exbenchcl client threads calling EXBENCH
// with a c.Payload-byte field for exbenchTime seconds (exbenchcl -S: a
// buffer it allocates and does not fill, so its bytes are whatever malloc
// returned; only the size is chosen). The window
// starts a warm-up after the first calls reach the servers and ends well
// before the clients stop; its calls/s is exbenchcl's own over its run
// (it reports no other figure), and its mean latency follows from it.
func (e *endurox) drive(ctx context.Context, o runOptions, c *gridCell, w *window) (result, error) {
	servers := c.Conns
	if e.fixed > 0 {
		servers = e.fixed
	}
	if err := e.setServers(servers); err != nil {
		return result{}, err
	}
	tps, err := e.exbench(ctx, c.Conns, exbenchTime(o.Warmup, o.Duration), c.Payload, func(client int) error {
		if !sleepUntil(ctx, time.Now().Add(o.Warmup)) {
			return ctx.Err()
		}
		w.begin(client)
		if !sleepUntil(ctx, time.Now().Add(o.Duration)) {
			return ctx.Err()
		}
		w.end()
		return nil
	})
	if err != nil {
		return result{}, err
	}
	return exbenchResult(tps, c.Conns, o.Duration), nil
}

// exbenchResult is the run's result from exbenchcl's calls/s: the calls of
// the window at that rate, and the mean latency of callers closed loops
// at that rate (Little's law). It measures no percentile.
func exbenchResult(tps float64, callers int, window time.Duration) result {
	n := int(math.Round(tps * window.Seconds()))
	r := result{Offered: n, Calls: n, Throughput: tps}
	if tps > 0 {
		r.Latency.Mean = time.Duration(float64(callers) / tps * float64(time.Second))
	}
	return r
}

// exbench runs exbenchcl with callers client threads for secs seconds
// and returns its calls/s. measure, if set, runs once the servers see the
// first calls, with exbenchcl's pid, and must return before the clients
// stop.
func (e *endurox) exbench(ctx context.Context, callers, secs, payload int, measure func(client int) error) (float64, error) {
	e.runs++
	out := filepath.Join(e.s.dir, fmt.Sprintf("exbench-%d.txt", e.runs))
	log, err := os.Create(filepath.Join(e.s.dir, "exbenchcl.log"))
	if err != nil {
		return 0, err
	}
	defer log.Close()
	servers := e.serverPIDs()
	base := sumSwitches(readSwitches(servers))
	c := exec.Command(filepath.Join(e.prefix, "bin", "exbenchcl"), "-n", strconv.Itoa(callers), "-P",
		"-t", strconv.Itoa(secs), "-b", "{}", "-f", "EX_DATA", "-S", strconv.Itoa(payload))
	c.Dir = e.s.dir
	c.Env = append(os.Environ(), append(e.env, "NDRX_BENCH_FILE="+out, "NDRX_BENCH_CONFIGNAME=run")...)
	c.Stdout, c.Stderr = log, log
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := c.Start(); err != nil {
		return 0, fmt.Errorf("exbenchcl: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	kill := func() { syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
	if measure != nil {
		// The client threads attach, then wait 2 s for each other: the run
		// begins when the servers wake for calls.
		if err := waitCalls(ctx, servers, base, done); err != nil {
			kill()
			return 0, err
		}
		if err := measure(c.Process.Pid); err != nil {
			kill()
			return 0, err
		}
		select {
		case err := <-done:
			return 0, fmt.Errorf("exbenchcl ended before the window did (%v): raise its -t", err)
		default:
		}
	}
	select {
	case err := <-done:
		if err != nil {
			return 0, fmt.Errorf("exbenchcl: %w\n%s", err, e.s.Log())
		}
	case <-time.After(time.Duration(secs)*time.Second + 30*time.Second):
		kill()
		return 0, errors.New("exbenchcl did not end")
	case <-ctx.Done():
		kill()
		return 0, ctx.Err()
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return 0, fmt.Errorf("exbenchcl wrote no result: %w", err)
	}
	_, tps, err := parseExbench(b)
	return tps, err
}

// serverPIDs are the exbenchsv processes: ndrxd's children.
func (e *endurox) serverPIDs() []int {
	var out []int
	for _, p := range e.s.pids {
		out = append(out, childrenOf(p)...)
	}
	return out
}

// waitCalls waits until the servers' threads switched context
// callsStarted times since base: calls are flowing (an idle exbenchsv
// sleeps in epoll_wait, woken only by a call or ndrxd's ping every 10 s).
func waitCalls(ctx context.Context, servers []int, base uint64, done <-chan error) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		if sumSwitches(readSwitches(servers)) >= base+callsStarted {
			return nil
		}
		select {
		case err := <-done:
			return fmt.Errorf("exbenchcl ended before its calls reached the servers: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.New("exbenchcl's calls did not reach the servers within 20 s")
		}
	}
}

// callsStarted is how many context switches of the servers mean calls
// are flowing: a ping or two costs a few.
const callsStarted = 20

func sumSwitches(m map[int]taskSwitches) uint64 {
	var n uint64
	for _, t := range m {
		n += t.vol + t.invol
	}
	return n
}

// parseExbench reads exbenchcl's result file (NDRX_BENCH_FILE): a header
// line, then "<config>" <message bytes> <calls/s> per run; the last counts.
func parseExbench(b []byte) (msgSize, tps float64, err error) {
	found := false
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) != 3 || strings.HasPrefix(f[0], `"Configuration"`) {
			continue
		}
		m, err1 := strconv.ParseFloat(f[1], 64)
		t, err2 := strconv.ParseFloat(f[2], 64)
		if err1 != nil || err2 != nil {
			return 0, 0, fmt.Errorf("bench: exbenchcl result line %q", strings.TrimSpace(line))
		}
		msgSize, tps, found = m, t, true
	}
	if !found {
		return 0, 0, fmt.Errorf("bench: no result in exbenchcl's file (%d bytes)", len(b))
	}
	return msgSize, tps, nil
}
