// Command scdd is the tpsched node daemon: it reads a definition directory
// (or runs the embedded one-node demo), starts the UAP processes of every
// user server, and schedules the calls that arrive on its RPC port onto
// their shared-memory queues. SIGTERM or SIGINT drains: new calls are
// refused, queued ones finish, the UAPs stop. SIGUSR2 (or scdctl restart)
// starts a new scdd with the same command line that takes the listening
// sockets over, while this one lets its callers go and drains. SIGHUP does
// nothing but log that it came, and a log write to a stderr nobody reads
// any more fails without ending scdd (SIGPIPE is caught).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"tpsched/internal/version"
	"tpsched/procmgr"
	"tpsched/scd"
	"tpsched/scd/def"
	"tpsched/scd/names"
)

// memoryHeadroom is what scdd's Go heap may hold beyond rpc_buffer_budget
// before its garbage collector works harder: the node's own state, the
// metrics, the forwarder's calls in flight.
const memoryHeadroom = 128 << 20

func main() {
	os.Exit(run())
}

// harden runs first in main: what scdd inherited stays its own, and its
// UAPs cannot read it.
//
//   - Every descriptor from 3 up is marked close-on-exec: one scdd was
//     given without it (a file an init system or shell left open) would
//     otherwise reach every UAP. The restart hand-off's TPSCHED_TAKEOVER_FD
//     is read in this process and never passed on, so it is not affected.
//   - scdd is made non-dumpable: no process of its user (a UAP of a node
//     that does not run as root) can ptrace it or read its memory,
//     environment or descriptors through /proc. It writes no core dump.
func harden() []error {
	var errs []error
	if err := procmgr.CloseOnExec(); err != nil {
		errs = append(errs, err)
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		errs = append(errs, os.NewSyscallError("prctl PR_SET_DUMPABLE", err))
	}
	return errs
}

func run() int {
	hardenErrs := harden()
	dir := flag.String("c", os.Getenv("DCCONFPATH"), "definition directory (sysconf, scdsvcdef, usrrc, usr/); default $DCCONFPATH, else the embedded demo")
	logLevel := flag.String("log-level", "info", "debug, info, warn or error")
	drain := flag.Duration("drain-timeout", 30*time.Second, "how long SIGTERM waits for queued calls before stopping the UAPs")
	check := flag.Bool("check", false, "read and validate the definitions (modules too), print warnings, then exit")
	entries := flag.Bool("entries", false, "with -check: also start one process of each server and check that it registers the entry of every service (runs the modules)")
	probes := flag.String("cpu-probes", os.Getenv("TPSCHED_BPF"),
		"how UAP CPU time and run-queue wait are measured: empty = eBPF if it loads, else /proc; off = /proc; tp_btf, raw_tp or tracepoint to insist on one (default $TPSCHED_BPF)")
	cpuLoad := flag.String("cpu-load-file", os.Getenv("TPSCHED_PROC_STAT"),
		"the file the routing manager reads the CPUs' load from, in /proc/stat's format (default $TPSCHED_PROC_STAT, else /proc/stat): for tests that give nodes of one machine loads of their own")
	steering := flag.String("steering", os.Getenv("TPSCHED_STEERING"),
		"how receiver groups' new connections are placed: empty = the SK_REUSEPORT program (least work) if it loads, else the kernel's hash; off = the hash (default $TPSCHED_STEERING)")
	fastDetect := flag.Bool("fast-failure-detection", false,
		"-failure-detection fast: probe peer nodes every 500 ms instead of 1 s, so a dead node leaves the tables within 2 to 4 s (tests, one-host clusters)")
	detection := flag.String("failure-detection", "",
		"failure detection's timing: lan (the default: probes every 1 s, 500 ms timeout, suspicion 4 probes), fast, or PROBE/TIMEOUT/SUSPICION such as 1s/500ms/4; "+
			"shorter timeouts declare live nodes dead on a loaded host (docs/RELIABILITY.md, Failure detection)")
	showVersion := flag.Bool("version", false, "print scdd's version and exit")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: scdd [-c DIR] [flags]\n\n"+
			"Runs a tpsched node. With no definition directory it serves the embedded\n"+
			"demo: service group 'demo' from uap-echo on 127.0.0.1:12000.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		// The whole usage alone did not say what was wrong: `scdd /etc/tpsched`.
		fmt.Fprintf(os.Stderr, "scdd: unexpected argument %q: scdd takes flags only (the definition directory is -c DIR; scdd -h lists the flags)\n", flag.Arg(0))
		return 2
	}
	if *steering != "" && *steering != scd.SteeringOff {
		fmt.Fprintf(os.Stderr, "scdd: -steering %q: want off, or nothing for the steering program where it loads\n", *steering)
		return 2
	}
	if *showVersion {
		fmt.Println(version.Line("scdd"))
		return 0
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintln(os.Stderr, "scdd: -log-level:", err)
		return 2
	}
	tag := &pidTag{Handler: slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}), on: new(atomic.Bool), pid: os.Getpid()}
	log := slog.New(tag)
	for _, err := range hardenErrs {
		log.Warn("scdd could not harden itself", "err", err)
	}

	takeover, err := scd.TakeoverConn() // set when an old scdd started this one to take its sockets over
	if err != nil {
		fmt.Fprintln(os.Stderr, "scdd:", err)
		return 1
	}
	tag.on.Store(takeover != nil)
	if *entries && !*check {
		fmt.Fprintln(os.Stderr, "scdd: -entries goes with -check")
		return 2
	}
	var moduleDirs []string
	if exe, err := os.Executable(); err == nil {
		moduleDirs = append(moduleDirs, filepath.Dir(exe))
	}
	if *check {
		return checkDefinitions(*dir, *entries, scd.Options{Logger: log, ModuleDirs: moduleDirs, SchedProbes: *probes, Steering: *steering})
	}
	keepOnHangup(log)
	var cfg *def.Config
	if *dir == "" {
		cfg, err = def.LoadDefault()
	} else {
		cfg, err = def.Load(*dir)
	}
	if err != nil {
		scd.RefuseTakeover(takeover, err)
		printErrors(err)
		return 1
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		// rpc_buffer_budget bounds what the RPC port holds; a soft limit a
		// little above it keeps the garbage of an attack (connections closed
		// with their buffers) from growing the heap to twice that.
		debug.SetMemoryLimit(cfg.System.BufferBudget + memoryHeadroom)
	}
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + blockingThreads(cfg))
	}
	det, err := names.ParseDetector(*detection)
	if *detection == "" && *fastDetect {
		det = names.FastDetector
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "scdd: -failure-detection: %v\n", err)
		return 2
	}
	// New checks the definitions against the machine (modules found and
	// executable) without starting anything, as -check does.
	node, err := scd.New(cfg, scd.Options{Logger: log, ModuleDirs: moduleDirs, DrainTimeout: *drain, SchedProbes: *probes,
		FastFailureDetection: *fastDetect, Detector: det, Steering: *steering, RestartArgs: os.Args[1:], RestartProgram: startedAs(), Takeover: takeover,
		Restarting: func() { tag.on.Store(true) }, ProcStat: *cpuLoad})
	if err != nil {
		scd.RefuseTakeover(takeover, err)
		printErrors(err)
		return 1
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	restarts := make(chan os.Signal, 1)
	signal.Notify(restarts, syscall.SIGUSR2)
	if err := node.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "scdd:", err)
		return 1
	}
	sdNotify(log, fmt.Sprintf("READY=1\nMAINPID=%d", os.Getpid())) // a new process after a restart becomes systemd's main one
	go func() {
		for range restarts {
			log.Info("SIGUSR2: restarting")
			if res, err := node.Restart(context.Background()); err == nil {
				log.Info("restart: handed over", "new_pid", res.NewPID, "took", res.Took)
			}
		}
	}()
	var sig os.Signal
	passedOn := false
	select {
	case <-node.Retired():
		signal.Stop(restarts)
		log.Info("scdd stopped: a new process serves the node")
		return 0
	case sig = <-sigs:
	case <-node.StopAsked():
		// The old process of the restart that started this one got the
		// stop: it is for the node. The same stop may reach this process
		// too (a signal to the process group): that is not a second one.
		passedOn = true
	case err := <-node.Failed():
		// The port takes no calls: exit non-zero so that a supervisor
		// restarts the node, after a short drain of what is in flight.
		log.Error("rpc port ended; stopping so that a supervisor restarts scdd", "err", err)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := node.Drain(ctx); err != nil {
			log.Error("drain", "err", err)
		}
		fmt.Fprintln(os.Stderr, "scdd:", err)
		return 1
	}
	// An operator at a terminal waits on this line: it says how long, and
	// how not to (issue 31 item 6).
	what, second := "signal received", "a second Ctrl-C (SIGINT or SIGTERM)"
	if passedOn {
		what, sig = "the old process passed a stop on", syscall.SIGTERM
		second = fmt.Sprintf("a Ctrl-C (SIGINT or SIGTERM) from %v after this line on", passedOnEcho)
	}
	log.Info(fmt.Sprintf("%s; draining: new calls are refused, queued calls are answered (at most %v, and scdd is down within %v); "+
		"%s exits at once without draining", what, node.DrainBound(), node.StopBound(), second), "signal", sig.String())
	go func() { // a second signal stops at once
		if passedOn {
			// A signal to the process group reached this process at the
			// moment it reached the old one: the same stop. A later one
			// is the operator's second (the stop may have reached the
			// old process alone: kill PID).
			select {
			case <-sigs:
			case <-time.After(passedOnEcho):
			}
		}
		<-sigs
		log.Warn("second signal: exiting without draining")
		os.Exit(1)
	}()
	if err := node.Drain(context.Background()); err != nil {
		log.Error("drain", "err", err)
		return 1
	}
	log.Info("scdd stopped")
	return 0
}

// passedOnEcho is how long after a stop the old process passed on a
// signal is taken for that stop's echo, not a second one: both processes
// of a restart are in one process group (a terminal's Ctrl-C, kill -PGID),
// and the pass-on takes a message over a socket.
const passedOnEcho = time.Second

// keepOnHangup keeps scdd serving through the two signals whose default
// action would end it without a drain (the UAPs killed by Pdeathsig, the
// calls in flight reset):
//
//   - SIGHUP, which a shell sends its background jobs when the operator's
//     ssh session drops (scdd started with `bin/scdd ... &`, as
//     docs/CLUSTER.md shows). It only logs: reloading is SIGUSR2 or scdctl
//     restart, stopping SIGTERM.
//   - SIGPIPE, which a write to stderr raises once the pipe's reader (that
//     same session, a `| tee`) is gone: Go's runtime ends a program on
//     SIGPIPE from a write to fd 1 or 2 unless the program asked for the
//     signal (os/signal, "SIGPIPE"). Asked for, the write fails with EPIPE
//     and the log line is lost. It is never logged: that write would raise
//     it again.
//
// Notify, not signal.Ignore: an ignored signal stays ignored across exec,
// so every UAP (and the scdd of a restart) would inherit SIG_IGN, and a C
// UAP writing to a closed pipe would no longer die as it expects; a caught
// one goes back to the default in the child.
func keepOnHangup(log *slog.Logger) {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE) // never read: delivery does not block
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	go func() {
		for range hups {
			log.Info("SIGHUP ignored: scdd goes on serving (reload with scdctl restart or SIGUSR2, stop with SIGTERM)")
		}
	}()
}

// blockingThreads is how many of the node's goroutines sleep in a system
// call holding a P: the gnet event loops (scdmulti's on the RPC port and
// every receiver group's), which block in epoll_wait outside the
// netpoller, and the dispatcher of the shared-memory groups, whose short
// waits keep their P on purpose (shm.Doorbells.Wait). scdd adds as many Ps
// to the CPUs' count: otherwise an idle node's loops hold every P, a
// goroutine woken by the netpoller (a timer, a connection of the HTTP
// server) waits until sysmon takes a P back (up to 10 ms), and sysmon,
// taking Ps back from syscalls again and again, polls every 20 us.
// Measured on 2 CPUs with 2 loops, 4 Ps against 2: scdd's CPU at 300
// calls/s a third, p99 0.3 ms against 16 ms, S1 at 64 connections the
// same or better.
func blockingThreads(cfg *def.Config) int {
	n := cfg.Sched.Multi + 1 // the loops of the RPC port, the dispatcher
	for _, rg := range cfg.Sched.ReceiverGroups {
		n += rg.Count
	}
	return n
}

// checkDefinitions is scdd -check: it reads the definitions and checks
// them against the machine as start-up would (modules found and
// executable), printing every error of the directory, not only the first:
// the servers that read without error still have their modules checked.
// With entries it also starts one process of each server to see that it
// registers its services' entries.
func checkDefinitions(dir string, entries bool, opts scd.Options) int {
	var cfg *def.Config
	var loadErr error
	if dir == "" {
		cfg, loadErr = def.LoadDefault()
	} else {
		cfg, loadErr = def.Check(dir)
	}
	errs := def.List(loadErr)
	var node *scd.Node
	if cfg != nil {
		var err error
		node, err = scd.New(cfg, opts)
		errs = append(errs, def.List(err)...)
		warnings := cfg.System.Warnings()
		if node != nil {
			warnings = node.Warnings() // the system's and the node's own (a scdd that is not root)
		}
		for _, w := range warnings {
			fmt.Fprintln(os.Stderr, "scdd: warning:", w)
		}
	}
	if len(errs) > 0 {
		for _, err := range errs {
			fmt.Fprintln(os.Stderr, "scdd:", err)
		}
		fmt.Fprintf(os.Stderr, "scdd: %d error(s) in the definitions\n", len(errs))
		return 1
	}
	if entries {
		if errs := node.CheckEntries(10 * time.Second); len(errs) > 0 {
			for _, err := range errs {
				fmt.Fprintln(os.Stderr, "scdd:", err)
			}
			return 1
		}
		fmt.Printf("scdd: every module registers its services' entries\n")
	}
	fmt.Printf("scdd: %d user server(s), definitions OK\n", len(cfg.Servers))
	return 0
}

// printErrors prints each error of err on a line of its own.
func printErrors(err error) {
	for _, e := range def.List(err) {
		fmt.Fprintln(os.Stderr, "scdd:", e)
	}
}

// startedAs is the path scdd was started by (its argv[0], looked up in
// PATH when it names no directory), made absolute: a restart starts the
// binary at that path then. os.Executable resolves symbolic links, so an
// upgrade that switched a link (scdd -> scdd-1.2) restarted the old
// binary. Empty when it cannot be told: Restart uses os.Executable.
func startedAs() string {
	p := os.Args[0]
	if !strings.Contains(p, "/") {
		var err error
		if p, err = exec.LookPath(p); err != nil {
			return ""
		}
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return ""
	}
	return abs
}
