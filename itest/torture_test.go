package itest

// The torture test (issue 27 item 7): a seeded, randomized generator of
// what callers, UAPs and the machine do to a node, with every call
// accounted. One real scdd, real UAPs (itest/internal/uap-torture, which
// records every execution of every call in a file), raw callers on real
// sockets. The run, and the checks, are described at TestTorture; the
// knobs are environment variables:
//
//	TPSCHED_TORTURE_SEED      the seed (default: random, printed)
//	TPSCHED_TORTURE_DURATION  how long to attack (default 20s; CI 10m)
//	TPSCHED_TORTURE_ATTACKS   comma-separated attack classes (default all):
//	                          callers, uapkill, uapstop, uapexit, badexit,
//	                          localcalls, fdpressure, restart; on one node
//	                          (TestTorture) also sockclose, lanes and
//	                          clanes (lanes with the C UAP library: needs
//	                          gcc, left out with a logged reason without);
//	                          across a cluster (TestTortureCluster) also
//	                          peerkill, peerstop, peerrestart, peercut,
//	                          peerloss, envs
//	TPSCHED_TORTURE_CALLERS   callers at once (default 6)
//	TPSCHED_TORTURE_STALL     how long the probe may go unanswered before
//	                          the watchdog dumps scdd's goroutines and
//	                          fails (default 1s), plus a 1s margin for a
//	                          busy machine
//
// make torture DURATION=10m SEED=42 runs it alone, verbose (and then
// TestTortureCluster for CLUSTER_DURATION).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tpsched/internal/testenv"
	"tpsched/netio"
	"tpsched/scd/client"
)

// tortureAttacks are the attack classes, each switchable.
var tortureAttacks = []string{"callers", "uapkill", "uapstop", "uapexit", "badexit", "localcalls", "fdpressure", "restart"}

// nodeTortureAttacks are TestTorture's: those and "sockclose", on the
// socket-mode group only TestTorture has, and the attacks of
// tortureBurstGroups: "lanes" and "clanes".
var nodeTortureAttacks = append(append([]string(nil), tortureAttacks...), "sockclose", "lanes", "clanes")

// burstGroup is a pair of groups for lanes: front's service burst makes
// runs of local calls to back's service work, a group nothing else calls,
// so that the node grants lanes from front's processes to back's and they
// are granted, held and revoked while every attack on UAPs goes on.
type burstGroup struct {
	attack string // the attack class whose calls front gets
	front  string // calls back (burst=burst)
	back   string // called by front only (work=work), three processes
	c      bool   // both served by uap-torture-c (the C UAP library), which has no flags b and c
	// priority is back's schedule_priority: at the default 8 its processes
	// share scdd's cpu cgroup (on cgroup v1) and the lanes to it are not
	// capped; at another they have a cgroup of their own and take the
	// node's cap (scd/local/lanes.go, maxLanes).
	priority int
}

// tortureBurstGroups are TestTorture's burst groups: the Go UAP library's
// lanes (front, which also serves the other attacks, to lback) and the C
// library's (cfront to clback), the one uncapped and the other capped, so
// that both kinds of lane are granted and revoked beside each other.
var tortureBurstGroups = []burstGroup{
	{attack: "lanes", front: "front", back: "lback", priority: 8},
	{attack: "clanes", front: "cfront", back: "clback", c: true, priority: 7},
}

var buildTortureUAP = sync.OnceValue(func() error {
	args := []string{"build", "-o", bin("uap-torture")}
	if raceBuild {
		args = append(args, "-race")
	}
	out, err := exec.Command("go", append(args, "tpsched/itest/internal/uap-torture")...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("building uap-torture: %v\n%s", err, out)
	}
	return nil
})

// buildTortureCUAP compiles uap-torture-c into the binaries' directory
// with the C UAP library from source (uap-c/tpsched_uap.c, not a built
// libtpsched_uap.a), so that the run always attacks the library as it is
// in the checkout. Without gcc it builds nothing and says why in leftOut.
var buildTortureCUAP = sync.OnceValues(func() (leftOut string, err error) {
	cc, err := exec.LookPath("gcc")
	if err != nil {
		return fmt.Sprintf("no C compiler to build uap-torture-c: %v", err), nil
	}
	wd, err := os.Getwd() // the package's directory, itest
	if err != nil {
		return "", err
	}
	root := filepath.Dir(wd)
	args := append(append([]string(nil), testenv.UAPCFlags...), "-I", filepath.Join(root, "uap-c"), "-o", bin("uap-torture-c"),
		filepath.Join(root, "itest", "internal", "uap-torture-c", "uap_torture.c"), filepath.Join(root, "uap-c", "tpsched_uap.c"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cc, args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("building uap-torture-c: %s %s: %v\n%s", cc, strings.Join(args, " "), err, out)
	}
	return "", nil
})

const tortureServer = `set service_group = %q
set service = "work=work", "call=call", "burst=burst"
set module = %q
set parallel_count = 2,3
set balance_count = 4
set queue_size = 256
set watch_time = 8
putenv TORTURE_DIR %q
putenv TORTURE_EXECLOG %q
putenv TORTURE_CALL_TARGET "back/work"
putenv TORTURE_BURST_TARGET "lback/work"
`

// tortureLaneBack is a burst group's back, which only its front's burst
// calls: three processes, so that lanes to it are granted and held.
const tortureLaneBack = `set service_group = %q
set service = "work=work"
set module = %q
set parallel_count = 3
set schedule_priority = %d
set queue_size = 256
set watch_time = 8
putenv TORTURE_DIR %q
putenv TORTURE_EXECLOG %q
`

// tortureCFront is a C burst group's front (uap-torture-c): front's
// watch_time and queue size, two processes. Its arguments: the group, the
// module, the UAPs' directory and execution log, and the back its burst
// calls.
const tortureCFront = `set service_group = %q
set service = "burst=burst"
set module = %q
set parallel_count = 2
set queue_size = 256
set watch_time = 8
putenv TORTURE_DIR %q
putenv TORTURE_EXECLOG %q
putenv TORTURE_BURST_TARGET "%s/work"
`

// tortureSocketServer is the socket-mode group (receive_from = socket:
// one process, each call over a socketpair).
const tortureSocketServer = `set service_group = "sock"
set service = "work=work"
set module = %q
set parallel_count = 1
set receive_from = socket
set queue_size = 256
set watch_time = 8
putenv TORTURE_DIR %q
putenv TORTURE_EXECLOG %q
`

// tortureEnvPolicy makes env (TestTortureCluster's, with "envs") an
// application environment of the routing manager: its server starts on
// n1 or n2 at its first call, and is quiesced, resumed and refreshed at
// random. Every node has it: a node with a service policy grants no
// lanes, so TestTorture, whose lanes are attacked, has none.
const tortureEnvPolicy = `set policy_interval = 1
set default_class = BATCH
class -n BATCH -i 3 -t 5000
environment -g env
`

const tortureProbe = `set service_group = "probe"
set service = "echo=echo"
set module = MODULE
set parallel_count = 1
set queue_size = 64
set watch_time = 8
`

// tcall is one call a caller sent, and what became of it.
type tcall struct {
	id      uint64
	group   string
	service string
	flag    string // n, x (UAP exits holding it), b (bad completion, then exit), c (socket closed, process lives on)
	burst   int    // a burst group's front/burst: its local calls (<id>.in1 to .in<burst>)
	each    int    // a burst group's front/burst: ms each of its local calls but the last sleeps
	req     []byte
	sentAt  time.Duration // since the run's start

	answeredAt time.Duration // since the run's start, when answered

	// Set by the caller goroutine that owns the connection, read after.
	sent      bool // the whole frame was written
	answers   int  // answer frames addressed to it
	kind      netio.Kind
	code      netio.Code
	msg       string
	wrong     string // what was wrong with its answer, if anything
	abandoned string // "close" or "reset": its caller left before the answer
	connEnd   string // unanswered and the connection ended: how (EOF, reset, timeout, ...)
}

type torture struct {
	t        *testing.T
	seed     uint64
	dur      time.Duration
	stall    time.Duration
	attacks  map[string]bool
	callersN int
	start    time.Time
	dir      string // the UAPs' marker files and the execution log (mode 0777: a root scdd runs UAPs as users of their own)
	execLog  string
	n        *restartingNode // the node the callers and the probes call
	uapNodes func() []string // the HTTP addresses of the nodes whose UAPs are attacked
	sock     bool            // the node has the socket-mode group "sock" (TestTorture's)
	env      bool            // the serving nodes have the application environment "env" (TestTortureCluster's, with "envs")
	bursts   []burstGroup    // the node's burst groups (TestTorture's)
	// explain names what an answered call says beyond its outcome (an
	// outcome "of which ..."), or ""; nil: nothing. Called after the run.
	explain func(c *tcall) string

	pid        atomic.Int64 // the scdd that serves now (a restart changes it)
	restarting atomic.Bool  // a hand-over is under way: the old pid may exit
	fdPressure atomic.Bool  // scdd's fd table is full on purpose: new connections wait
	graceUntil atomic.Int64 // unix ns: the watchdog waits until then after a pause
	quit       atomic.Bool  // the watchdog sent scdd SIGQUIT
	restartAt  atomic.Int64 // unix ns: when the hand-over under way began

	ctx    context.Context // ends the attacks and the callers
	cancel context.CancelFunc
	nextID atomic.Uint64

	mu       sync.Mutex
	calls    []*tcall
	found    []string // breaks found during the run (each ends it)
	broken   []string // calls that broke a promise, found after the run (the first 30)
	brokenN  int      // how many did
	logs     []string // the nodes' log files, for the summary of a failed run
	conns    map[net.Conn]bool
	stopped  map[int]bool // UAP pids stopped and not yet continued
	figures  map[string]int
	firstHit time.Duration

	scanned struct { // the UAPs' execution log, as read so far
		sync.Mutex
		off   int64
		execs map[string][]string // id -> "pid flag" of each execution
		rest  string
	}
}

func (tt *torture) count(what string, k int) {
	tt.mu.Lock()
	tt.figures[what] += k
	tt.mu.Unlock()
}

// fail records a break found during the run and ends the run: the first
// one's time is the figure of how long the test takes to find it.
func (tt *torture) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	at := time.Since(tt.start)
	tt.mu.Lock()
	if len(tt.found) == 0 {
		tt.firstHit = at
	}
	tt.found = append(tt.found, fmt.Sprintf("after %.1f s: %s", at.Seconds(), msg))
	conns := make([]net.Conn, 0, len(tt.conns))
	for c := range tt.conns {
		conns = append(conns, c)
	}
	tt.mu.Unlock()
	tt.t.Errorf("torture (seed %d): BREAK FOUND after %.1f s: %s", tt.seed, at.Seconds(), msg)
	tt.cancel()
	for _, c := range conns { // callers blocked on a wedged node
		c.Close()
	}
}

// summarize repeats, after the nodes' logs, why a failed run failed: a
// run's logs are long, and a reader who sees only the end of the output
// (as CI shows it) sees the cause and the seed that repeats it.
func (tt *torture) summarize() {
	t := tt.t
	if !t.Failed() {
		return
	}
	tt.mu.Lock()
	found, broken, brokenN, logs := tt.found, tt.broken, tt.brokenN, tt.logs
	tt.mu.Unlock()
	var why []string
	for _, f := range found {
		why = append(why, "break found "+f)
	}
	if len(broken) > 0 {
		why = append(why, fmt.Sprintf("%d calls broke a promise, the first ones:", brokenN))
		why = append(why, broken[:min(len(broken), 5)]...)
	}
	for _, name := range logs {
		b, _ := os.ReadFile(name)
		if report := firstRaceReport(string(b)); report != "" {
			lines := strings.SplitN(report, "\n", 25)
			why = append(why, "a data race in "+name+", its report begins:")
			why = append(why, lines[:min(len(lines), 24)]...)
		}
	}
	if len(why) == 0 {
		why = append(why, "no break recorded: the failure is told above (the setup, or a node's own check)")
	}
	t.Logf("torture (seed %d) failed; TPSCHED_TORTURE_SEED=%d repeats the attacks. Why, in short:\n%s",
		tt.seed, tt.seed, strings.Join(why, "\n"))
}

func (tt *torture) aborted() bool {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	return len(tt.found) > 0
}

func (tt *torture) track(c net.Conn) {
	tt.mu.Lock()
	tt.conns[c] = true
	tt.mu.Unlock()
}

func (tt *torture) untrack(c net.Conn) {
	tt.mu.Lock()
	delete(tt.conns, c)
	tt.mu.Unlock()
}

func (tt *torture) grace(d time.Duration) {
	tt.graceUntil.Store(time.Now().Add(d).UnixNano())
}

// sleep waits d or until the run ends; false if it ended.
func (tt *torture) sleep(d time.Duration) bool {
	select {
	case <-tt.ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return d
}

// TestTorture attacks one node at random for TPSCHED_TORTURE_DURATION and
// accounts for every call. Groups: front and back (uap-torture, 2 to 3
// processes each; front/call makes a local call to back/work) take every
// attack; lback (uap-torture, 3 processes) is called by front/burst only;
// cfront (uap-torture-c, 2 processes) and clback (3), with "clanes" and
// gcc only, are their twins in C: cfront/burst calls clback/work, and
// they take every attack on UAPs but badexit and sockclose; sock
// (uap-torture in socket mode, 1 process, 6% of the calls) every attack
// on UAPs but badexit; probe (uap-echo, 1 process) is never attacked and
// is the watchdog's.
//
// Callers (TPSCHED_TORTURE_CALLERS at once, each on connections of its
// own, in a loop): one call or 2 to 8 pipelined, then read every answer,
// or half-close and read every answer then the node's FIN; with
// "callers": close, or reset (SO_LINGER 0), at a random moment while
// calls are in flight. The machine, each at random moments: "uapkill"
// SIGKILL of a front, back or sock process; "uapstop" SIGSTOP of one for
// up to 0.8 s; "uapexit" calls (flag x) whose process exits holding them
// (and what was handed over behind them); "badexit" calls (flag b)
// completed with status 7 and done_no stored by a process that exits at
// once (break 4); "sockclose" sock calls (flag c) whose process closes
// its socket and lives on (ruled after 2 s: 'server terminated', never
// 'timed out'); "localcalls" front/call; "lanes" front/burst, runs of 2
// to 41 local calls to lback, a quarter of them long (50 to 149 calls of
// 5 to 14 ms); "clanes" the same runs of cfront/burst to clback, in C;
// "fdpressure" RLIMIT_NOFILE of scdd
// lowered to its open descriptors + 40 with 100 idle connections and a
// UAP killed (break 2), for 1.5 s; "restart" a hand-over (SIGUSR2).
//
// Found during the run, each ending it at once with the time it took:
// scdd dead (not by a hand-over we asked for), with its log; the probe
// unanswered for longer than TPSCHED_TORTURE_STALL + 1 s outside a
// hand-over (fresh connections) or fd pressure (a connection opened
// before) — the watchdog sends scdd SIGQUIT, whose goroutine dump is in
// the log the test prints; a call executed twice (the UAPs' log, read
// every 200 ms); an answer to no call outstanding on its connection, a
// second answer, or a reply that is not its call's.
//
// At the end, what the checker accepts, call by call (docs/RELIABILITY.md
// promise 1 and "Not defended"; docs/SHM.md "Die"):
//   - executed at most once, always (the outer id and a local call's inner
//     id each);
//   - answered ok: executed exactly once, the reply its own (a local
//     call's reply carries its inner call's);
//   - answered 'server busy', 'service closed', 'node shutting down', 'no
//     such group/service', 'message too big': never executed;
//   - answered any other clear error ('server terminated', 'timed out', an
//     application error carrying a local call's error, 'network down'):
//     executed at most once; a b-flagged call's answer can only be an
//     error (its process broke the protocol: 'server terminated');
//   - answered 'server terminated' because the process serving it died
//     or broke the protocol: executed, unless a SIGKILL came between the
//     process's take and its log line (counted); the other deaths (x and
//     b) come after the line, so a call handed over behind the one a
//     process died holding, which it never took, must not be answered so
//     (it goes to another process);
//   - not answered, its caller having closed or reset mid-call: executed
//     at most once, no answer owed (its answers are the node's to drop);
//   - not answered, its caller still reading, the node having closed the
//     connection with a FIN: never executed (a clean close owes no answer
//     only for calls never read, which the caller may send again);
//   - anything else unanswered (a reset by the node, or no answer within
//     watch_time and 15 s) is lost: a failure. A connection that could not be opened
//     (fd pressure) is counted, not failed: the watchdog judges the node.
func TestTorture(t *testing.T) {
	skipShort(t)
	if err := buildTortureUAP(); err != nil {
		t.Fatal(err)
	}
	tt := newTorture(t, nodeTortureAttacks)
	servers := map[string]string{
		"probe": tortureProbe,
		"front": fmt.Sprintf(tortureServer, "front", bin("uap-torture"), tt.dir, tt.execLog),
		"back":  fmt.Sprintf(tortureServer, "back", bin("uap-torture"), tt.dir, tt.execLog),
		"sock":  fmt.Sprintf(tortureSocketServer, bin("uap-torture"), tt.dir, tt.execLog),
	}
	tt.sock = true
	for _, b := range tortureBurstGroups {
		if !b.c {
			// front is defined above; lback is there whether "lanes"
			// is on or not, as before the C groups came.
			servers[b.back] = fmt.Sprintf(tortureLaneBack, b.back, bin("uap-torture"), b.priority, tt.dir, tt.execLog)
			tt.bursts = append(tt.bursts, b)
			continue
		}
		// The C groups are there for their attack only: nothing else
		// calls them, and the attacks on UAPs would spend their picks
		// on idle processes.
		if !tt.attacks[b.attack] {
			continue
		}
		leftOut, err := buildTortureCUAP()
		if err != nil {
			t.Fatal(err)
		}
		if leftOut != "" {
			t.Logf("torture: %s and %s (attack %s) left out: %s", b.front, b.back, b.attack, leftOut)
			tt.attacks[b.attack] = false
			continue
		}
		servers[b.front] = fmt.Sprintf(tortureCFront, b.front, bin("uap-torture-c"), tt.dir, tt.execLog, b.back)
		servers[b.back] = fmt.Sprintf(tortureLaneBack, b.back, bin("uap-torture-c"), b.priority, tt.dir, tt.execLog)
		tt.bursts = append(tt.bursts, b)
	}
	dir := defDir(t, "", servers)
	t.Setenv("GOTRACEBACK", "all") // SIGQUIT from the watchdog: every goroutine
	tt.n = startRestartingNode(t, dir, "-drain-timeout", "5s")
	tt.logs = []string{tt.n.log}
	tt.pid.Store(int64(tt.n.cmd.Process.Pid))
	tt.uapNodes = func() []string { return []string{tt.n.http} }
	waitFor(t, 15*time.Second, "the groups' processes to start", func() bool { return len(tt.uapPIDsOf()) >= 4 }, tt.n.logText)
	tt.run(nil)
}

// envActions quiesces env (and resumes it 0.2 to 1.5 s later) or
// refreshes its processes, at random moments, beside every other attack:
// its server stops, starts again at the next call, and is handed over by
// each restart.
func (tt *torture) envActions(rng *rand.Rand) {
	do := func(args ...string) {
		tt.count("env actions: "+args[0], 1)
		if out, err := tt.n.scdctl(args...); err != nil {
			tt.count(fmt.Sprintf("env actions: %s failed (%s)", args[0], firstLine(out)), 1)
		}
	}
	for tt.sleep(time.Duration(1000+rng.IntN(3000)) * time.Millisecond) {
		if rng.IntN(3) == 0 {
			do("refresh", "env")
			continue
		}
		do("quiesce", "env")
		tt.sleep(time.Duration(200+rng.IntN(1300)) * time.Millisecond)
		do("resume", "env") // also when the run ended meanwhile: env takes calls again
	}
}

// firstLine is out's first line, trimmed: a failed command's reason.
func firstLine(out string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	return line
}

// envServesAfter checks, after the run, that env was left serving: a
// resume (the run may have ended with it quiesced) and a call, answered
// ok within 45 s. Both are tried again meanwhile: the last attacks may
// have left a serving node out of n0's table for a few seconds (a resume
// fails on a node it cannot reach, which learns it from the announces,
// and a call finds no node that defines env).
func (tt *torture) envServesAfter() {
	t := tt.t
	deadline := time.Now().Add(45 * time.Second)
	var last string
	for resumed := false; time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if !resumed {
			out, err := tt.n.scdctl("resume", "env")
			if resumed = err == nil; !resumed {
				last = fmt.Sprintf("scdctl resume env: %v: %s", err, firstLine(out))
				continue
			}
		}
		if last = tt.callEnvOnce(); last == "" {
			return
		}
	}
	t.Errorf("torture: env was not served after the run within 45 s; the last try: %s", last)
}

// callEnvOnce calls env/work through n0 with the shipped client: ""
// when served, else what came instead.
func (tt *torture) callEnvOnce() string {
	c, err := client.New(client.Options{Hosts: []string{tt.n.rpc}})
	if err != nil {
		return err.Error()
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	if _, err := c.Call(ctx, "env", "work", fmt.Appendf(nil, "%d n 0", tt.nextID.Add(1))); err != nil {
		return err.Error()
	}
	return ""
}

// newTorture reads the knobs (the seed, the duration, the attacks among
// known, the callers) and makes the UAPs' directory and execution log.
func newTorture(t *testing.T, known []string) *torture {
	tt := &torture{t: t, figures: map[string]int{}, conns: map[net.Conn]bool{}, stopped: map[int]bool{}}
	// Cleanups run last first: summarize runs after every node's log is
	// dumped, and before the test's temporary directory (made here first,
	// where the nodes' logs are) is removed.
	_ = t.TempDir()
	t.Cleanup(tt.summarize)
	tt.seed = rand.Uint64() >> 1
	if v := os.Getenv("TPSCHED_TORTURE_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("TPSCHED_TORTURE_SEED=%q: %v", v, err)
		}
		tt.seed = s
	}
	tt.dur = envDuration(t, "TPSCHED_TORTURE_DURATION", 20*time.Second)
	tt.stall = envDuration(t, "TPSCHED_TORTURE_STALL", time.Second)
	tt.callersN = 6
	if v := os.Getenv("TPSCHED_TORTURE_CALLERS"); v != "" {
		k, err := strconv.Atoi(v)
		if err != nil || k < 1 {
			t.Fatalf("TPSCHED_TORTURE_CALLERS=%q: want a whole number >= 1", v)
		}
		tt.callersN = k
	}
	// TPSCHED_TORTURE_ATTACKS names the classes of both torture tests;
	// each takes those it knows.
	tt.attacks = map[string]bool{}
	if v := os.Getenv("TPSCHED_TORTURE_ATTACKS"); v != "" && v != "all" {
		for _, a := range strings.Split(v, ",") {
			a = strings.TrimSpace(a)
			if !contains(nodeTortureAttacks, a) && !contains(clusterTortureAttacks, a) {
				t.Fatalf("TPSCHED_TORTURE_ATTACKS: unknown attack %q (known: %s; on one node also %s; across a cluster also %s)", a,
					strings.Join(tortureAttacks, ","), strings.Join(nodeTortureAttacks[len(tortureAttacks):], ","),
					strings.Join(clusterTortureAttacks[len(tortureAttacks):], ","))
			}
			tt.attacks[a] = contains(known, a)
		}
	} else {
		for _, a := range known {
			tt.attacks[a] = true
		}
	}
	var on []string
	for _, a := range known {
		if tt.attacks[a] {
			on = append(on, a)
		}
	}
	t.Logf("torture: seed %d (TPSCHED_TORTURE_SEED=%d repeats it), duration %v, attacks %s, %d callers",
		tt.seed, tt.seed, tt.dur, strings.Join(on, ","), tt.callersN)

	// The UAPs' directory: writable by every user (a root scdd runs each
	// server's UAPs as a user of its own).
	var err error
	tt.dir, err = os.MkdirTemp("", "tpsched-torture-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(tt.dir) })
	must(t, os.Chmod(tt.dir, 0o777))
	tt.execLog = filepath.Join(tt.dir, "exec.log")
	must(t, os.WriteFile(tt.execLog, nil, 0o666))
	must(t, os.Chmod(tt.execLog, 0o666))
	return tt
}

// run attacks the node (and with more, the cluster's other nodes) for the
// run's duration, then checks every call.
func (tt *torture) run(more func(spawn func(func()), rng func(uint64) *rand.Rand)) {
	t := tt.t
	tt.ctx, tt.cancel = context.WithCancel(context.Background())
	defer tt.cancel()
	t.Cleanup(func() { // never leave a UAP stopped
		tt.mu.Lock()
		defer tt.mu.Unlock()
		for pid := range tt.stopped {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	})
	tt.start = time.Now()

	var wg sync.WaitGroup
	spawn := func(f func()) {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	// Background: watchdog (probes), crash monitor, execution log scanner.
	var bg sync.WaitGroup
	bgCtx, bgCancel := context.WithCancel(context.Background())
	for _, f := range []func(context.Context){tt.probeFresh, tt.probeKept, tt.watchdog, tt.monitor, tt.scanExecLog, tt.countLanes} {
		bg.Add(1)
		go func() { defer bg.Done(); f(bgCtx) }()
	}

	for i := range tt.callersN {
		spawn(func() { tt.caller(rand.New(rand.NewPCG(tt.seed, uint64(i)+1))) })
	}
	rng := func(k uint64) *rand.Rand { return rand.New(rand.NewPCG(tt.seed, 1000+k)) }
	if tt.attacks["uapkill"] {
		spawn(func() { tt.uapKiller(rng(1)) })
	}
	if tt.attacks["uapstop"] {
		spawn(func() { tt.uapStopper(rng(2)) })
	}
	if tt.attacks["fdpressure"] || tt.attacks["restart"] {
		spawn(func() { tt.machine(rng(3)) })
	}
	if more != nil {
		more(spawn, rng)
	}

	select {
	case <-tt.ctx.Done():
	case <-time.After(tt.dur):
	}
	tt.cancel()
	wg.Wait() // callers finish their connections: every answer read
	// The UAPs have written their lines before they answered; a last look.
	tt.scanOnce()
	bgCancel()
	bg.Wait()
	tt.check()
}

// laneFigures are the lane counters countLanes follows, by the figure
// each gives: those of the back of each burst group whose attack is on,
// the group its lanes go to.
func (tt *torture) laneFigures() map[string]string {
	figures := map[string]string{}
	for _, b := range tt.bursts {
		if !tt.attacks[b.attack] {
			continue
		}
		figures[`tpsched_lane_grants_total{group="`+b.back+`"}`] = "lanes granted to " + b.back
		figures[`tpsched_lane_calls_total{group="`+b.back+`"}`] = "calls on lanes to " + b.back
		figures[`tpsched_lane_revokes_total{group="`+b.back+`",reason="turn"}`] = "lanes to " + b.back + " revoked for another caller's turn"
		figures[`tpsched_lane_revokes_total{group="`+b.back+`",reason="timed_out"}`] = "lanes to " + b.back + " revoked at a call ruled 'timed out'"
	}
	return figures
}

// countLanes follows the nodes' lane counters through the run (a
// hand-over starts them again from zero), for the figures: the lanes the
// local calls took, so that a run says whether it attacked them.
func (tt *torture) countLanes(ctx context.Context) {
	laneFigures := tt.laneFigures()
	if len(laneFigures) == 0 {
		return // no burst groups (TestTortureCluster): no lanes
	}
	type counter struct{ banked, last float64 }
	seen := map[string]*counter{}
	hc := &http.Client{Timeout: time.Second}
	look := func() {
		for _, addr := range tt.uapNodes() {
			resp, err := hc.Get("http://" + addr + "/metrics")
			if err != nil {
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for name := range laneFigures {
				v := sumMetric(string(b), name)
				c := seen[addr+" "+name]
				if c == nil {
					c = &counter{}
					seen[addr+" "+name] = c
				}
				if v < c.last {
					c.banked += c.last
				}
				c.last = v
			}
		}
	}
	for tick := time.NewTicker(250 * time.Millisecond); ; {
		select {
		case <-ctx.Done():
			tick.Stop()
			look()
			for k, c := range seen {
				_, name, _ := strings.Cut(k, " ")
				tt.count(laneFigures[name], int(c.banked+c.last))
			}
			return
		case <-tick.C:
			look()
		}
	}
}

// sumMetric adds the values of every series of a family in a /metrics
// text.
func sumMetric(metrics, family string) float64 {
	sum := 0.0
	for _, line := range strings.Split(metrics, "\n") {
		rest, ok := strings.CutPrefix(line, family)
		if !ok || rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		if i := strings.LastIndexByte(rest, ' '); i >= 0 {
			if v, err := strconv.ParseFloat(rest[i+1:], 64); err == nil {
				sum += v
			}
		}
	}
	return sum
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// dial opens a connection to the node's RPC port, tracked so that a
// failed run can close it.
func (tt *torture) dial(timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", tt.n.rpc, timeout)
	if err != nil {
		return nil, err
	}
	tt.track(c)
	return c, nil
}

// newCall makes a call for rng's caller: its group, service, flag and
// request.
func (tt *torture) newCall(rng *rand.Rand) *tcall {
	c := &tcall{id: tt.nextID.Add(1), flag: "n", sentAt: time.Since(tt.start)}
	p := rng.IntN(100)
	switch b := tt.burstGroupAt(p); {
	case p < 20 && tt.attacks["localcalls"]:
		c.group, c.service = "front", "call"
	case b != nil:
		c.group, c.service, c.burst = b.front, "burst", 2+rng.IntN(40)
		if rng.IntN(4) == 0 {
			// A long run, about a second: a lane held while other
			// callers' runs are kept from one by the node's cap, so
			// lanes are revoked for their turns.
			c.burst, c.each = 50+rng.IntN(100), 5+rng.IntN(10)
		}
	case p < 60:
		c.group, c.service = "front", "work"
	case p >= 94 && tt.sock:
		c.group, c.service = "sock", "work"
	case p >= 80 && tt.env:
		c.group, c.service = "env", "work"
	default:
		c.group, c.service = "back", "work"
	}
	switch p := rng.IntN(1000); {
	case p < 15 && tt.attacks["uapexit"]:
		c.flag = "x"
	case p >= 15 && p < 35 && tt.attacks["badexit"] && c.group != "sock" && !tt.inC(c.group): // its bad completion is in a shared-memory area, written by uap-torture
		c.flag = "b"
	case p >= 35 && p < 65 && tt.attacks["sockclose"] && c.group == "sock":
		c.flag = "c"
	}
	ms := rng.IntN(30)
	if rng.IntN(4) == 0 {
		ms = 0
	}
	if c.service == "call" || c.service == "burst" {
		inner := "n"
		if c.flag == "n" && rng.IntN(40) == 0 && tt.attacks["uapexit"] {
			inner = "x" // the called process dies instead
		}
		c.req = fmt.Appendf(nil, "%d %s %d %s", c.id, c.flag, ms, inner)
		if c.burst > 0 {
			c.req = fmt.Appendf(c.req, " %d %d", c.burst, c.each)
		}
	} else {
		c.req = fmt.Appendf(nil, "%d %s %d", c.id, c.flag, ms)
	}
	return c
}

// longCall is a call to back/work that sleeps 5 to 7.5 s (its watch_time
// is 8): made as a hand-over begins, it keeps its connection open past the
// old process's wait for its callers to leave (-drain-timeout 5s), so the
// old process drains with calls in flight and answers the last of them
// while it looks for none left.
func (tt *torture) longCall(rng *rand.Rand) *tcall {
	c := &tcall{id: tt.nextID.Add(1), flag: "n", sentAt: time.Since(tt.start), group: "back", service: "work"}
	c.req = fmt.Appendf(nil, "%d n %d", c.id, 5000+rng.IntN(2500))
	return c
}

// burstGroupAt is the burst group whose calls a draw p (0 to 99) of
// newCall makes, or nil: each burst group whose attack is on takes 10 in
// turn from 20 up, the first of them also what is below 20 when
// "localcalls" is off.
func (tt *torture) burstGroupAt(p int) *burstGroup {
	upTo := 30
	for i := range tt.bursts {
		if !tt.attacks[tt.bursts[i].attack] {
			continue
		}
		if p < upTo {
			return &tt.bursts[i]
		}
		upTo += 10
	}
	return nil
}

// inC reports whether group is served by uap-torture-c.
func (tt *torture) inC(group string) bool {
	for _, b := range tt.bursts {
		if b.c && (group == b.front || group == b.back) {
			return true
		}
	}
	return false
}

// caller is one caller, connection after connection, until the run ends.
func (tt *torture) caller(rng *rand.Rand) {
	for tt.ctx.Err() == nil {
		tt.connection(rng, false)
		if rng.IntN(3) == 0 {
			time.Sleep(time.Duration(rng.IntN(5)) * time.Millisecond)
		}
	}
}

// connection is one connection of a caller: its calls, pipelined, and
// their answers. A lingering one (restartOnce's) reads every answer of its
// one or two long calls.
func (tt *torture) connection(rng *rand.Rand, lingering bool) {
	mode := "read" // read every answer, then close
	switch p := rng.IntN(100); {
	case lingering:
	case p < 15 && tt.attacks["callers"]:
		mode = "halfclose"
	case p < 40 && tt.attacks["callers"]:
		mode = "close"
	case p < 55 && tt.attacks["callers"]:
		mode = "reset"
	}
	k := 1
	if rng.IntN(2) == 0 {
		k = 2 + rng.IntN(7)
	}
	if lingering {
		k = 1 + rng.IntN(2)
	}
	nc, err := tt.dial(3 * time.Second)
	if err != nil {
		tt.count("connections not opened (dial failed)", 1)
		time.Sleep(50 * time.Millisecond)
		return
	}
	defer func() { nc.Close(); tt.untrack(nc) }()
	calls := make([]*tcall, k)
	byID := map[uint64]*tcall{}
	for i := range calls {
		if lingering {
			calls[i] = tt.longCall(rng)
		} else {
			calls[i] = tt.newCall(rng)
		}
		byID[calls[i].id] = calls[i]
	}
	tt.mu.Lock()
	tt.calls = append(tt.calls, calls...)
	tt.mu.Unlock()
	// Pipelined: every frame at once, or one by one with small gaps.
	gaps := rng.IntN(2) == 0
	// Now and then an answer frame among the calls, which no node asks
	// for: its 'protocol error' must settle none of the real calls (a
	// half-close after it would then end the connection with one owed).
	stray, strayID := -1, uint64(0)
	if tt.attacks["callers"] && !lingering && rng.IntN(10) == 0 {
		stray, strayID = rng.IntN(k), tt.nextID.Add(1)
	}
	strayAnswered := false
	var out []byte
	for i, c := range calls {
		out = out[:0]
		if i == stray {
			kind := []netio.Kind{netio.KindReply, netio.KindError}[rng.IntN(2)]
			out = netio.AppendFrame(out, netio.Header{Kind: kind, ID: strayID}, "", "", []byte("stray"))
			tt.count("stray answer frames sent", 1)
		}
		out = netio.AppendFrame(out, netio.Header{Kind: netio.KindCall, ID: c.id}, c.group, c.service, c.req)
		if _, err := nc.Write(out); err != nil {
			tt.count("writes failed", 1)
			break
		}
		c.sent = true
		if gaps && rng.IntN(2) == 0 {
			time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
		}
	}
	var leaveAt time.Time
	switch mode {
	case "halfclose":
		_ = nc.(*net.TCPConn).CloseWrite()
	case "close", "reset":
		leaveAt = time.Now().Add(time.Duration(rng.IntN(40)) * time.Millisecond)
	}
	fr := netio.NewFrameReader(nc, 1<<20)
	var buf []byte
	pending := 0
	for _, c := range calls {
		if c.sent {
			pending++
		}
	}
	deadline := time.Now().Add(8*time.Second + 15*time.Second)
	for pending > 0 || mode == "halfclose" {
		d := deadline
		if !leaveAt.IsZero() {
			d = leaveAt
		}
		_ = nc.SetReadDeadline(d)
		var f netio.Frame
		f, buf, err = fr.Read(buf)
		if err != nil {
			if !leaveAt.IsZero() && isTimeout(err) {
				break // the caller gives up mid-call
			}
			if pending == 0 && errors.Is(err, io.EOF) {
				break // half-closed: every answer, then the node's FIN
			}
			end := connEnd(err)
			if tt.aborted() {
				end = "run aborted"
			}
			for _, c := range calls {
				if c.sent && c.answers == 0 {
					c.connEnd = end
				}
			}
			if pending == 0 {
				tt.fail("half-closed connection: after every answer, %s instead of the node's FIN", end)
			}
			return
		}
		if f.Kind == netio.KindGoAway {
			tt.count("go-away frames", 1)
			continue
		}
		c := byID[f.ID]
		switch {
		case strayID != 0 && f.ID == strayID && f.Kind == netio.KindError && !strayAnswered:
			strayAnswered = true // the node's refusal of the stray frame
			continue
		case c == nil || !c.sent:
			tt.fail("a frame (kind %v, id %d) answering no call of its connection", f.Kind, f.ID)
			return
		case c.answers > 0:
			c.answers++
			tt.fail("call %d answered twice (second: kind %v code %v)", c.id, f.Kind, f.Code)
			return
		}
		c.answers, c.answeredAt = 1, time.Since(tt.start)
		pending--
		c.kind, c.code = f.Kind, f.Code
		switch f.Kind {
		case netio.KindReply:
			want := string(c.req)
			got := string(f.Payload)
			if c.service == "call" || c.service == "burst" {
				inner := fmt.Sprintf("%d.in ", c.id)
				if c.burst > 0 {
					inner = fmt.Sprintf("%d.in1 ", c.id)
				}
				if !strings.HasPrefix(got, want+" | "+inner) {
					c.wrong = fmt.Sprintf("reply %.80q, want %q | %q...", got, want, inner)
				}
			} else if got != want {
				c.wrong = fmt.Sprintf("reply %.80q, want %q", got, want)
			}
			if c.wrong != "" {
				tt.fail("call %d: %s", c.id, c.wrong)
				return
			}
		case netio.KindError:
			c.msg = string(f.Payload)
		default:
			tt.fail("call %d answered with a frame of kind %v", c.id, f.Kind)
			return
		}
	}
	if !leaveAt.IsZero() {
		for _, c := range calls {
			if c.sent && c.answers == 0 {
				c.abandoned = mode
			}
		}
		if mode == "reset" {
			_ = nc.(*net.TCPConn).SetLinger(0)
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func connEnd(err error) string {
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "FIN"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset by the node"
	case isTimeout(err):
		return "no answer within watch_time + 15 s"
	case errors.Is(err, net.ErrClosed):
		return "closed by the test"
	}
	return err.Error()
}

// probe makes one echo call to the probe group on c.
func probe(c net.Conn, r *netio.FrameReader, id uint64, timeout time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(timeout))
	payload := fmt.Appendf(nil, "probe %d", id)
	if _, err := c.Write(netio.AppendFrame(nil, netio.Header{Kind: netio.KindCall, ID: id}, "probe", "echo", payload)); err != nil {
		return err
	}
	for {
		f, _, err := r.Read(nil)
		if err != nil {
			return err
		}
		if f.Kind == netio.KindGoAway {
			continue
		}
		if f.ID != id || f.Kind != netio.KindReply || string(f.Payload) != string(payload) {
			return fmt.Errorf("probe %d answered kind %v id %d %q", id, f.Kind, f.ID, f.Payload)
		}
		return nil
	}
}

var (
	freshOK atomic.Int64 // unix ns of the last probe answered on a new connection
	keptOK  atomic.Int64 // and on the kept one
)

// probeFresh calls the probe group on a new connection every 100 ms: a
// wedged accept loop or event loop stops these.
func (tt *torture) probeFresh(ctx context.Context) {
	freshOK.Store(time.Now().UnixNano())
	for id := uint64(1); ctx.Err() == nil; id++ {
		c, err := net.DialTimeout("tcp", tt.n.rpc, 2*time.Second)
		if err == nil {
			if probe(c, netio.NewFrameReader(c, 1<<16), id, 10*time.Second) == nil {
				freshOK.Store(time.Now().UnixNano())
			}
			c.Close()
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// probeKept calls the probe group every 100 ms on a connection opened
// before (again after a hand-over closes it): it is answered while the fd
// table is full.
func (tt *torture) probeKept(ctx context.Context) {
	keptOK.Store(time.Now().UnixNano())
	var c net.Conn
	var r *netio.FrameReader
	for id := uint64(1); ctx.Err() == nil; id++ {
		if c == nil {
			var err error
			if c, err = net.DialTimeout("tcp", tt.n.rpc, 2*time.Second); err != nil {
				c = nil
			} else {
				r = netio.NewFrameReader(c, 1<<16)
			}
		}
		if c != nil {
			if probe(c, r, id, 10*time.Second) == nil {
				keptOK.Store(time.Now().UnixNano())
			} else {
				c.Close()
				c = nil
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	if c != nil {
		c.Close()
	}
}

// watchdog: the probe unanswered for stall + 1 s (on a new connection,
// outside a hand-over and fd pressure; on the kept one, outside a
// hand-over) is a node that stopped answering: SIGQUIT to scdd, whose
// goroutine dump goes to its log, and the run fails.
func (tt *torture) watchdog(ctx context.Context) {
	limit := tt.stall + time.Second
	for ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		if tt.aborted() {
			continue
		}
		// A hand-over pauses the probes' verdict, for 10 s at most: a node
		// wedged as a restart begins does not hand over either.
		if at := tt.restartAt.Load(); tt.restarting.Load() && time.Since(time.Unix(0, at)) < 10*time.Second {
			continue
		}
		now := time.Now().UnixNano()
		grace := tt.graceUntil.Load()
		since := func(last int64) time.Duration { return time.Duration(now - max(last, grace)) }
		var stale string
		if d := since(keptOK.Load()); d > limit {
			stale = fmt.Sprintf("a connection opened before: no probe answered for %v", d.Round(time.Millisecond))
		} else if d := since(freshOK.Load()); d > limit && !tt.fdPressure.Load() {
			stale = fmt.Sprintf("new connections: no probe answered for %v", d.Round(time.Millisecond))
		}
		if stale == "" {
			continue
		}
		if tt.restarting.Load() {
			stale += ", during a hand-over begun 10 s before"
		}
		pid := int(tt.pid.Load())
		tt.quit.Store(true)
		tt.fail("the node stopped answering the probe group, which no attack touches (%s); "+
			"SIGQUIT sent to scdd pid %d: its goroutines are in the scdd log below", stale, pid)
		_ = syscall.Kill(pid, syscall.SIGQUIT)
		time.Sleep(2 * time.Second) // the dump reaches the log
		return
	}
}

var newPIDLine = regexp.MustCompile(`restart: the new process serves.* new_pid=(\d+)`)

// monitor: scdd dying when no hand-over asked it to is a break (a SIGSEGV
// or a panic: its log has the reason).
func (tt *torture) monitor(ctx context.Context) {
	for ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		if tt.restarting.Load() || tt.aborted() || tt.quit.Load() {
			continue
		}
		pid := int(tt.pid.Load())
		if pidAliveInt(pid) {
			continue
		}
		log := tt.n.logText()
		why := "exited"
		for _, s := range []string{"SIGSEGV", "fatal error:", "panic:", "WARNING: DATA RACE"} {
			if i := strings.Index(log, s); i >= 0 {
				why = strings.SplitN(log[i:], "\n", 2)[0]
				break
			}
		}
		tt.fail("scdd pid %d died (%s): its log is below", pid, why)
		return
	}
}

// scanExecLog reads the UAPs' execution log every 200 ms: an id executed
// twice ends the run at once (the figure of how long break 4 takes).
func (tt *torture) scanExecLog(ctx context.Context) {
	for ctx.Err() == nil {
		tt.scanOnce()
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// execAt is when (since the run's start) the first execution of a call
// recorded in execs ("pid flag unixms", as uap-torture writes them) began.
func (tt *torture) execAt(execs []string) (time.Duration, bool) {
	if len(execs) == 0 {
		return 0, false
	}
	f := strings.Fields(execs[0])
	if len(f) < 3 {
		return 0, false
	}
	ms, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil {
		return 0, false
	}
	return time.UnixMilli(ms).Sub(tt.start), true
}

// sockRuling bounds how long after its process got a call the node rules
// that process, which closed its socket and lives on: eofGrace (2 s) and
// a second for a busy machine.
const sockRuling = 3 * time.Second

func (tt *torture) scanOnce() {
	tt.scanned.Lock()
	defer tt.scanned.Unlock()
	if tt.scanned.execs == nil {
		tt.scanned.execs = map[string][]string{}
	}
	f, err := os.Open(tt.execLog)
	if err != nil {
		return
	}
	defer f.Close()
	if _, err := f.Seek(tt.scanned.off, io.SeekStart); err != nil {
		return
	}
	b, _ := io.ReadAll(f)
	tt.scanned.off += int64(len(b))
	text := tt.scanned.rest + string(b)
	lines := strings.Split(text, "\n")
	tt.scanned.rest = lines[len(lines)-1]
	for _, line := range lines[:len(lines)-1] {
		id, rest, _ := strings.Cut(line, " ")
		tt.scanned.execs[id] = append(tt.scanned.execs[id], rest)
		if len(tt.scanned.execs[id]) == 2 && !tt.aborted() {
			tt.fail("call %s executed twice (pid flag: %v)", id, tt.scanned.execs[id])
		}
	}
}

// attacked reports whether the attacks on UAPs (uapkill, uapstop,
// fdpressure's kill) pick group's processes: every group but probe.
func (tt *torture) attacked(group string) bool {
	if group == "front" || group == "back" || group == "sock" || group == "env" {
		return true
	}
	for _, b := range tt.bursts {
		if group == b.front || group == b.back {
			return true
		}
	}
	return false
}

// uapPIDsOf are the pids of the attacked groups' processes now.
func (tt *torture) uapPIDsOf() []int {
	var pids []int
	for _, addr := range tt.uapNodes() {
		st, err := statusOf(addr)
		if err != nil {
			continue
		}
		for _, g := range st.Groups {
			if !tt.attacked(g.Group) {
				continue
			}
			for _, p := range g.Processes {
				if p.PID > 0 {
					pids = append(pids, p.PID)
				}
			}
		}
	}
	sort.Ints(pids)
	return pids
}

func (tt *torture) uapKiller(rng *rand.Rand) {
	for tt.sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond) {
		if pids := tt.uapPIDsOf(); len(pids) > 0 {
			pid := pids[rng.IntN(len(pids))]
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				tt.count("UAPs killed", 1)
			}
		}
	}
}

func (tt *torture) uapStopper(rng *rand.Rand) {
	for tt.sleep(time.Duration(500+rng.IntN(1500)) * time.Millisecond) {
		pids := tt.uapPIDsOf()
		if len(pids) == 0 {
			continue
		}
		pid := pids[rng.IntN(len(pids))]
		tt.mu.Lock()
		tt.stopped[pid] = true
		tt.mu.Unlock()
		if syscall.Kill(pid, syscall.SIGSTOP) == nil {
			tt.count("UAPs stopped", 1)
		}
		time.Sleep(time.Duration(100+rng.IntN(700)) * time.Millisecond)
		_ = syscall.Kill(pid, syscall.SIGCONT)
		tt.mu.Lock()
		delete(tt.stopped, pid)
		tt.mu.Unlock()
	}
}

// machine does what needs scdd's pid, one at a time: a full descriptor
// table with a UAP killed, and the restart hand-over.
func (tt *torture) machine(rng *rand.Rand) {
	var acts []func(*rand.Rand)
	if tt.attacks["fdpressure"] {
		acts = append(acts, tt.fdPressureOnce)
	}
	if tt.attacks["restart"] {
		acts = append(acts, tt.restartOnce)
	}
	for tt.sleep(time.Duration(1000+rng.IntN(3000)) * time.Millisecond) {
		acts[rng.IntN(len(acts))](rng)
	}
}

func (tt *torture) fdPressureOnce(rng *rand.Rand) {
	pid := int(tt.pid.Load())
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return
	}
	var old unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &old); err != nil {
		return
	}
	limit := uint64(len(ents) + 40)
	tt.fdPressure.Store(true)
	defer func() {
		_ = unix.Prlimit(pid, unix.RLIMIT_NOFILE, &old, nil)
		tt.grace(2 * time.Second)
		tt.fdPressure.Store(false)
	}()
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: old.Max}, nil); err != nil {
		tt.t.Logf("prlimit: %v", err)
		return
	}
	tt.count("fd pressure windows", 1)
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
			tt.untrack(c)
		}
	}()
	for range 100 {
		if tt.ctx.Err() != nil {
			return
		}
		c, err := tt.dial(300 * time.Millisecond)
		if err != nil {
			break
		}
		idle = append(idle, c)
	}
	tt.count("idle connections under fd pressure", len(idle))
	if pids := tt.uapPIDsOf(); len(pids) > 0 {
		if syscall.Kill(pids[rng.IntN(len(pids))], syscall.SIGKILL) == nil {
			tt.count("UAPs killed under fd pressure", 1)
		}
	}
	tt.sleep(1500 * time.Millisecond)
}

func (tt *torture) restartOnce(rng *rand.Rand) { tt.handOver(rng, rng.IntN(4) == 0) }

// handOver is one hand-over, waited for; again hands the new process over
// as well as soon as it serves, while it may still be learning the
// cluster's table (its calls for the other nodes' groups wait for it) and
// its predecessor drains.
func (tt *torture) handOver(rng *rand.Rand, again bool) {
	old := int(tt.pid.Load())
	before := len(newPIDLine.FindAllStringSubmatch(tt.n.logText(), -1))
	if rng.IntN(2) == 0 { // calls still in flight when the old process drains
		lingered := make(chan struct{})
		go func() { defer close(lingered); tt.connection(rand.New(rand.NewPCG(rng.Uint64(), 0)), true) }()
		defer func() { <-lingered }()
		tt.count("hand-overs with a long call on the old process", 1)
		time.Sleep(50 * time.Millisecond) // its calls reach the old process
	}
	tt.restartAt.Store(time.Now().UnixNano())
	tt.restarting.Store(true)
	defer func() {
		tt.grace(2 * time.Second)
		tt.restarting.Store(false)
	}()
	if err := syscall.Kill(old, syscall.SIGUSR2); err != nil {
		return
	}
	tt.count("restart hand-overs", 1)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if m := newPIDLine.FindAllStringSubmatch(tt.n.logText(), -1); len(m) > before {
			p, _ := strconv.Atoi(m[len(m)-1][1])
			tt.pid.Store(int64(p))
			if again && tt.sleep(time.Duration(max(0, rng.IntN(1000)-500))*time.Millisecond) {
				tt.count("hand-overs soon after a start", 1)
				tt.handOver(rng, false)
			}
			// The old process drains (-drain-timeout 5s) and exits.
			for time.Now().Before(deadline) && pidAliveInt(old) {
				time.Sleep(20 * time.Millisecond)
			}
			if pidAliveInt(old) && !tt.aborted() {
				tt.quit.Store(true)
				tt.fail("the old scdd (pid %d) still runs 30 s after SIGUSR2; SIGQUIT sent: its goroutines are in the log below", old)
				_ = syscall.Kill(old, syscall.SIGQUIT)
				time.Sleep(2 * time.Second)
			}
			return
		}
		if !pidAliveInt(old) {
			if !tt.quit.Load() {
				tt.fail("scdd pid %d died during a hand-over with no new process serving", old)
			}
			return
		}
		if tt.ctx.Err() != nil && tt.aborted() {
			return // the watchdog found the node wedged
		}
		time.Sleep(20 * time.Millisecond)
	}
	tt.fail("no new process took over within 30 s of SIGUSR2 to pid %d", old)
}

// diedServing reports whether a 'server terminated' message says that the
// call's process died or broke the protocol holding it (scd/local), not
// that the server could not start or the call could not be handed over.
func diedServing(msg string) bool { return strings.HasPrefix(msg, "the UAP process serving the call ") }

// check accounts for every call at the end (see TestTorture for what it
// accepts).
func (tt *torture) check() {
	t := tt.t
	tt.scanned.Lock()
	execs := tt.scanned.execs
	tt.scanned.Unlock()
	aborted := tt.aborted()
	tt.mu.Lock()
	calls := tt.calls
	tt.mu.Unlock()
	outcomes := map[string]int{}
	var bad []string
	report := func(c *tcall, format string, args ...any) {
		if len(bad) < 30 {
			bad = append(bad, fmt.Sprintf("call %d (%s/%s flag %s, req %q, sent at %.1fs): ", c.id, c.group, c.service, c.flag, c.req, c.sentAt.Seconds())+
				fmt.Sprintf(format, args...))
		}
		outcomes["FAILED"]++
	}
	seen := map[string]bool{}
	// What each group/service got, for the figures: so that a run says
	// how much each burst group, Go's and C's, was attacked.
	type served struct{ calls, ok, localRuns int }
	byService := map[string]*served{}
	for _, c := range calls {
		id := strconv.FormatUint(c.id, 10)
		seen[id], seen[id+".in"] = true, true
		ex, inner := len(execs[id]), len(execs[id+".in"])
		sv := byService[c.group+"/"+c.service]
		if sv == nil {
			sv = &served{}
			byService[c.group+"/"+c.service] = sv
		}
		sv.calls++
		if ex > 1 {
			report(c, "executed %d times: %v", ex, execs[id])
			continue
		}
		if inner > 1 {
			report(c, "its local call executed %d times: %v", inner, execs[id+".in"])
			continue
		}
		if c.burst > 0 { // each of its local calls at most once; all of them once if it answered ok
			twice, missing := "", 0
			for j := 1; j <= c.burst; j++ {
				in := id + ".in" + strconv.Itoa(j)
				seen[in] = true
				sv.localRuns += len(execs[in])
				switch n := len(execs[in]); {
				case n > 1 && twice == "":
					twice = fmt.Sprintf("its local call %d of %d executed %d times: %v", j, c.burst, n, execs[in])
				case n == 0:
					missing++
				}
			}
			if twice != "" {
				report(c, "%s", twice)
				continue
			}
			inner = 1
			if missing > 0 {
				inner = 0
			}
		}
		if c.flag == "c" {
			outcomes["sock calls whose process closed its socket (flag c)"]++
		}
		switch {
		case !c.sent:
			outcomes["not sent (write failed)"]++
			if ex > 0 {
				report(c, "never fully sent, yet executed")
			}
		case c.answers == 1 && c.kind == netio.KindReply:
			outcomes["ok"]++
			sv.ok++
			if ex != 1 || ((c.service == "call" || c.burst > 0) && inner != 1) {
				report(c, "answered ok, executed %d times (its local call %d)", ex, inner)
			}
			if c.flag == "b" {
				report(c, "answered ok, though its first process completed it with status 7 and exited")
			}
			if c.flag == "c" {
				report(c, "answered ok, though its first process closed its socket holding it")
			}
		case c.answers == 1:
			key := fmt.Sprintf("error %q", c.code.String())
			outcomes[key]++
			if tt.explain != nil {
				if more := tt.explain(c); more != "" {
					outcomes[more]++
				}
			}
			switch c.code {
			case netio.CodeServerBusy, netio.CodeServiceClosed, netio.CodeShuttingDown, netio.CodeNoSuchGroup,
				netio.CodeNoSuchService, netio.CodeMessageTooBig:
				if ex > 0 {
					report(c, "answered %q (%s), yet executed", c.code.String(), c.msg)
				}
			case netio.CodeTimedOut:
				// The process closed its socket and lives on: the node
				// rules it 2 s later (eofGrace), unless the call's
				// deadline comes first (it waited in the queue for a
				// process: one killed and restarted after a back-off).
				if at, ok := tt.execAt(execs[id]); c.flag == "c" && ok && c.answeredAt-at > sockRuling {
					report(c, "answered %q (%s) %v after its process got it (%v): its process closed its socket holding it, which the node must rule 'server terminated' within %v",
						c.code.String(), c.msg, (c.answeredAt - at).Round(time.Millisecond), execs[id], sockRuling)
				}
			case netio.CodeServerTerminated:
				if diedServing(c.msg) && ex == 0 {
					if strings.Contains(c.msg, "(signal: killed)") {
						outcomes["of which killed before its log line"]++
					} else {
						report(c, "answered %q (%s), yet its process never ran it", c.code.String(), c.msg)
					}
				}
			}
		case c.abandoned != "":
			outcomes["unanswered: the caller left mid-call ("+c.abandoned+")"]++
		case aborted:
			outcomes["unanswered: run aborted"]++
		case c.connEnd == "FIN":
			outcomes["unanswered: clean close by the node"]++
			if ex > 0 {
				report(c, "unanswered at the node's clean close, yet executed (a clean close owes answers to every call it read)")
			}
		default:
			report(c, "lost: no answer (%s), executed %d times", c.connEnd, ex)
		}
	}
	for id, e := range execs {
		if !seen[id] {
			bad = append(bad, fmt.Sprintf("id %q executed (%v) but no caller sent it", id, e))
			outcomes["FAILED"]++
		}
	}
	var keys []string
	for k, v := range outcomes {
		keys = append(keys, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(keys)
	tt.mu.Lock()
	var figs []string
	for k, v := range tt.figures {
		figs = append(figs, fmt.Sprintf("%s %d", k, v))
	}
	found := tt.found
	tt.mu.Unlock()
	sort.Strings(figs)
	var services []string
	for name, sv := range byService {
		s := fmt.Sprintf("%s %d calls, %d ok", name, sv.calls, sv.ok)
		if sv.localRuns > 0 {
			s += fmt.Sprintf(", %d local calls run", sv.localRuns)
		}
		services = append(services, s)
	}
	sort.Strings(services)
	chaosFigures(t, "torture seed %d, %v of attacks: %d calls: %s; %s; by service: %s", tt.seed, time.Since(tt.start).Round(time.Second),
		len(calls), strings.Join(keys, ", "), strings.Join(figs, ", "), strings.Join(services, "; "))
	if len(bad) > 0 {
		t.Errorf("torture (seed %d): %d calls broke a promise:\n%s", tt.seed, outcomes["FAILED"], strings.Join(bad, "\n"))
		tt.mu.Lock()
		tt.broken, tt.brokenN = bad, outcomes["FAILED"]
		tt.mu.Unlock()
	}
	if len(found) > 0 {
		t.Logf("torture (seed %d): found during the run:\n%s", tt.seed, strings.Join(found, "\n"))
	}
	if outcomes["ok"] == 0 && !aborted {
		t.Errorf("torture: no call answered ok: the run tested nothing")
	}
}
