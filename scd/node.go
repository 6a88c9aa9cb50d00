// Package scd is the schedule service of a node: it wires its parts
// together and serves the operator's doors. The parts are packages of
// their own, each behind the contract its package comment states: the
// local scheduler (scd/local: the service groups, their queues and
// processes), the other nodes (scd/cluster: the name table, node choice,
// receiver groups; scd/peers: the connections to them) and the routing
// manager (scd/wlmnode). A call arrives as a frame from the RPC port
// (netio/rpcport) and goes along the node's line of stages (scd/call,
// frames.go) until one takes it; scd never parses bytes off the wire
// itself. The doors: the control socket (control.go), /status and the
// status page (status.go), /metrics (metrics.go), restart without dropping
// a call (restart.go), drain.
//
// # Usage
//
//	cfg, _ := def.Load(dir)
//	n, err := scd.New(cfg, scd.Options{})
//	err = n.Start()       // ports bound, processes, queues, RPC port, control API
//	...
//	err = n.Drain(ctx)    // refuse new calls, finish queued ones, stop UAPs
package scd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/bpf"
	"tpsched/netio"
	"tpsched/netio/rpcport"
	"tpsched/procmgr"
	"tpsched/scd/call"
	"tpsched/scd/cluster"
	"tpsched/scd/def"
	"tpsched/scd/local"
	"tpsched/scd/names"
	"tpsched/scd/peers"
	"tpsched/scd/wlmnode"
)

// Options are the parts of a node that do not come from the definitions.
type Options struct {
	Logger *slog.Logger
	// ModuleDirs are searched for a module given by bare name, after the
	// definition directory's aplib/ and before $PATH. scdd passes its own
	// directory, so the demo finds uap-echo beside it.
	ModuleDirs []string
	// DrainTimeout bounds how long Drain waits for queued calls; default 30 s.
	DrainTimeout time.Duration
	// SchedProbes chooses how UAP processes' CPU time and run-queue wait are
	// measured: "" the best the kernel allows (eBPF tp_btf, raw_tp,
	// tracepoint, else /proc), "off" /proc only, or one of bpf's mechanism
	// names to insist on it (it still falls back, saying why). scdd takes it
	// from TPSCHED_BPF.
	SchedProbes string
	// FastFailureDetection is names.FastDetector: probes every 500 ms
	// instead of 1 s, so a dead node leaves the tables in 2 to 4 s: for
	// tests and single-host clusters.
	FastFailureDetection bool
	// Detector is the failure detection's timing (scdd -failure-detection);
	// zero: names.LANDetector, or names.FastDetector with
	// FastFailureDetection.
	Detector names.Detector
	// Steering places each receiver group's new connections: "" the
	// SK_REUSEPORT program where it loads (else the kernel's hash, saying
	// why), SteeringOff the hash. scdd takes it from TPSCHED_STEERING.
	Steering string
	// RestartArgs is the command line (after the program) that starts this
	// daemon again, for Restart; scdd passes its own.
	RestartArgs []string
	// RestartProgram is the program Restart starts: scdd passes the path
	// it was started by, so that an upgrade that switched a symbolic link
	// starts the binary the link names now. Empty: os.Executable (the
	// binary this process runs, links resolved).
	RestartProgram string
	// Restarting, if set, is called as Restart starts the new process:
	// from then on two processes write to one stderr (scdd tags its lines
	// with its pid).
	Restarting func()
	// Takeover is the hand-over socket from an old scdd whose sockets this
	// node takes over (restart.go); nil for a plain start.
	Takeover *net.UnixConn
	// ProcStat is the file the routing manager reads the CPUs' load from
	// (its spare CPU): "" /proc/stat. scdd takes it from
	// TPSCHED_PROC_STAT, which tests use to give each node of one machine
	// a load of its own.
	ProcStat string
}

// Node is one running schedule service.
type Node struct {
	cfg  *def.Config
	opts Options
	log  *slog.Logger

	local *local.Scheduler     // this node's groups, queues and processes
	pm    local.ProcessManager // procmgr, unless a test set it
	meter bpf.Meter
	// router is the node's part in the cluster, receivers its receiver
	// groups (scd/cluster); inCluster says all_node names another node,
	// which puts the router in the node's lines.
	router    *cluster.Router
	receivers *cluster.Receivers
	inCluster bool
	rpc       *rpcport.Port
	doors     *doors // control socket, status, /metrics, /report
	metrics   *metrics.Set
	scraped   scrapedSeries // series of n.metrics read at scrape time (metrics.go)
	draining  atomic.Bool
	started   atomic.Bool // Start returned without error
	stop      chan struct{}
	wg        sync.WaitGroup
	failed    chan error // the RPC port ended while the node was not draining

	badRequests *metrics.Counter
	// pool is the node's connections to the other nodes (calls it
	// transfers, the routing manager's requests); hello the node's side of
	// the peer hello on its RPC port.
	pool  *peers.Pool
	hello *peers.Acceptor

	// ports are the sockets bound before the UAPs start, until the parts
	// that serve on them take them (ports.go).
	ports ports

	restart *restarter       // restart.go: handing the sockets to a new process, or taking them over
	wlm     *wlmnode.Manager // the routing manager (svcpolicy, scd/wlmnode); nil without a service policy

	// line is the stages a call from a client or a peer passes, uapLine
	// those of a call a UAP makes (frames.go); control takes every other
	// frame.
	line, uapLine call.Line
	control       controlFrames
}

// New checks the configuration against the machine (modules exist, groups
// are unique) and builds the node without starting anything.
func New(cfg *def.Config, opts Options) (*Node, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if cfg.Policy != nil && len(cfg.Policy.Instances) > 0 {
		// Subsystem instances: a server of each application environment
		// per instance (ENV@INSTANCE), made like any other.
		expanded := *cfg
		expanded.Servers = wlmnode.ExpandInstances(cfg.Servers, cfg.Policy)
		cfg = &expanded
	}
	if opts.DrainTimeout == 0 {
		opts.DrainTimeout = 30 * time.Second
	}
	n := &Node{
		cfg: cfg, opts: opts, log: opts.Logger,
		metrics: metrics.NewSet(),
		stop:    make(chan struct{}),
		failed:  make(chan error, 1),
	}
	switch opts.SchedProbes {
	case "", "off", bpf.Proc, bpf.TPBTF, bpf.RawTP, bpf.Tracepoint:
	default:
		return nil, fmt.Errorf("cpu probes %q (scdd -cpu-probes or TPSCHED_BPF): want off, proc, %s, %s or %s (empty: the best that loads)",
			opts.SchedProbes, bpf.TPBTF, bpf.RawTP, bpf.Tracepoint)
	}
	n.doors = &doors{n: n}
	n.restart = &restarter{n: n}
	metrics.ExposeMetadata(true) // HELP and TYPE lines, a library-wide switch
	n.metrics.RegisterMetricsWriter(n.doors.writeScraped)
	n.badRequests = n.metrics.NewCounter(`tpsched_requests_refused_total{reason="protocol"}`)
	n.hello = peers.NewAcceptor(cfg.System.NodeID, clusterKey(cfg), n.metrics.NewCounter(`tpsched_peer_hellos_refused_total`), n.log)
	n.pool = peers.New(peers.Options{Self: cfg.System.NodeID, Key: clusterKey(cfg), Log: n.log, Metrics: n.metrics})
	lopts := local.Options{
		Logger:      n.log,
		Metrics:     n.metrics,
		CounterFunc: n.scraped.counter,
		ModuleDirs:  opts.ModuleDirs,
		Place: func(c call.Caller, f *netio.Frame) (netio.Code, string) {
			return n.uapLine.Route(c, call.From{}, f) // a UAP's own call: the line without the drain and receivers
		},
		// A lane skips the routing: only where a UAP's call to a group
		// served here stays here while the group is at LEVEL0.
		Lanes: func() bool { return n.wlm == nil && (!n.inCluster || cfg.Sched.ThisNodeFirst) },
		LevelChanged: func(*local.Group) {
			if cfg.Sched.AnnounceServerStatus {
				n.announce()
			}
		},
	}
	if cfg.Policy != nil {
		lopts.OnDemand = func(group string) bool { return n.wlm.IsEnvironment(group) }
	}
	var err error
	if n.local, err = local.New(cfg, lopts); err != nil {
		return nil, err
	}
	others, err := seeds(cfg)
	if err != nil {
		return nil, err
	}
	if err := n.prepareCluster(len(others) > 0); err != nil {
		return nil, err
	}
	if cfg.Policy != nil {
		if err := n.prepareWLM(); err != nil {
			return nil, err
		}
	}
	n.buildFrames()
	return n, nil
}

// Start binds every port the node listens on (bindPorts), creates the
// schedule queues and starts the UAP processes, then serves the RPC port
// and the control/metrics endpoint on what it bound. On error everything
// already started is stopped again.
func (n *Node) Start() (err error) {
	for _, w := range n.Warnings() {
		n.log.Warn(w)
	}
	n.restart.peer = n.opts.Takeover
	if n.restart.peer != nil {
		n.restart.oldPID = os.Getppid() // the old process started this one
	}
	defer func() {
		if err != nil {
			n.restart.takeoverFailed(err)
			n.shutdown(time.Time{})
		}
	}()
	if n.ports, err = bindPorts(n.cfg, rpcOptions(n.cfg, n.opts, n.metrics, n.log), n.restart.peer != nil); err != nil {
		return err
	}
	// The UAPs' measurement and cgroups are set up once the ports are
	// bound: a node that cannot have its ports says so and nothing else.
	force := n.opts.SchedProbes
	if force == "off" {
		force = bpf.Proc
	}
	n.meter = bpf.Open(bpf.Options{Force: force, Logger: n.log})
	mech := n.meter.Mechanism()
	n.log.Info("uap cpu measurement", "mechanism", mech.Name, "histogram", mech.Histogram, "run_queues", mech.RunQueues, "reason", mech.Reason)
	if rq := n.meter.RunQueues(); rq != nil {
		// The dispatcher spins for its processes only while no task
		// waits for a CPU; without the probes, its budget alone bounds it.
		n.local.SpinWhile(func() bool { return !rq.Waiting() })
	}
	if n.pm == nil {
		n.pm = local.Procmgr(procmgr.New(procmgr.Options{
			Logger:        n.log,
			NodeCap:       n.cfg.System.MaxProcesses,
			SchedBatch:    n.cfg.System.UAPSchedBatch,
			MemoryReserve: n.cfg.System.MemoryReserve,
			Meter:         n.meter,
			LinkDir:       local.LinkDir(n.cfg.System.NodeID, n.log),
		}))
	}
	registerProcMetrics(n.metrics, &n.scraped, n.pm)
	if err := n.local.Start(n.pm); err != nil {
		return err
	}
	if err := n.restart.takeOver(); err != nil {
		return err
	}
	n.ports.takeInherited(n.restart)
	if err := n.ports.claimNames(n.cfg, n.restart.oldPID); err != nil {
		return err
	}
	opts := rpcOptions(n.cfg, n.opts, n.metrics, n.log)
	opts.Inherit, opts.Bound = n.restart.inheritRPC, n.ports.rpc
	n.rpc, err = rpcport.Listen(opts, n)
	n.ports.rpc, n.restart.inheritRPC = nil, nil // Listen took the sockets, or closed them
	if err != nil {
		return fmt.Errorf("rpc port %s: %w", opts.Addr, err)
	}
	n.wg.Add(1)
	go n.watchRPC()
	httpLn, controlLn := n.ports.http, n.ports.control
	n.ports.http, n.ports.control = nil, nil
	if err := n.doors.start(httpLn, controlLn); err != nil {
		return err
	}
	if n.wlm != nil {
		n.wlm.Start()
		if h := n.restart.inheritEnvs; h != nil {
			ctx, done := n.restart.whileOldWaits()
			n.wlm.StartHere(ctx, *h, time.Now().Add(takeoverEnvsTime))
			done()
		}
	}
	if err := n.restart.takeoverServing(); err != nil {
		return err
	}
	if err := n.joinCluster(); err != nil {
		return err
	}
	n.wg.Add(1)
	go n.expireLoop()
	n.started.Store(true)
	n.log.Info("scdd started", "node", n.cfg.System.NodeID, "rpc", n.rpc.Addr(), "http", n.doors.httpLn.Addr().String(),
		"control_socket", ControlSocketPath(n.cfg), "groups", len(n.local.Groups()))
	return nil
}

// CheckEntries is scdd -check -entries: it starts one process of every
// server that receives from its queue, waits until it registered its
// entries (or died, or timeout passed), stops it, and returns an error,
// naming the definition's file and line, for each service whose entry the
// module does not register and each module that did not start
// (local.Scheduler.CheckEntries). It runs the modules, as start-up would,
// so it is asked for: plain -check starts nothing. The node is not
// started, and cannot be after.
func (n *Node) CheckEntries(timeout time.Duration) []error {
	quiet := local.ErrorsOnly(n.log)                               // what the check finds it returns
	meter := bpf.Open(bpf.Options{Force: bpf.Proc, Logger: quiet}) // a check measures nothing
	defer meter.Close()
	pm := n.pm
	if pm == nil {
		pm = local.Procmgr(procmgr.New(procmgr.Options{Logger: quiet, Meter: meter, SchedBatch: n.cfg.System.UAPSchedBatch}))
	}
	defer pm.Close()
	return n.local.CheckEntries(pm, timeout)
}

// Warnings are what the operator should hear when the node starts (scdd
// logs them) and at scdd -check (printed): the definitions' (def), and a
// node that runs as another user than root.
func (n *Node) Warnings() []string {
	w := n.cfg.System.Warnings()
	if uid := os.Geteuid(); uid != 0 {
		// One short line: the detail is in the doc it names, so that the
		// warning is read where it shows (make demo), not skipped.
		w = append(w, fmt.Sprintf("scdd runs as uid %d, not as root: its UAPs run as that user and could take the node's calls; "+
			"run scdd as root (docs/WARNINGS.md#not-root)", uid))
	}
	return w
}

// rpcOptions are the RPC port's options from the definitions.
func rpcOptions(cfg *def.Config, opts Options, set *metrics.Set, log *slog.Logger) rpcport.Options {
	return rpcport.Options{
		Addr:  net.JoinHostPort(cfg.System.RPCAddress, strconv.Itoa(cfg.System.RPCPort)),
		Loops: cfg.Sched.Multi,
		// A frame up to the largest max_message_size is read whole, so one
		// over its own group's is answered 'message too big' here; netio
		// answers a larger one itself and skips its bytes unkept.
		MaxPayload:   largestMessage(cfg),
		MaxConns:     cfg.System.MaxConnections,
		FrameTimeout: cfg.System.FrameTimeout,
		BufferBudget: cfg.System.BufferBudget,
		Metrics:      set,
		Logger:       log,
		Receivers:    receiverGroups(cfg),
		Steer:        steerer{off: opts.Steering == SteeringOff},
	}
}

// largestMessage is the frame cap of the RPC port: the largest
// max_message_size of any group here. A node with all_node forwards calls
// for groups only other nodes define, whose sizes it does not know: it
// takes the largest any definition may give.
func largestMessage(cfg *def.Config) int {
	if len(cfg.System.AllNodes) > 0 {
		return def.MaxMaxMessageSize
	}
	m := def.DefaultMaxMessageSize
	if len(cfg.Servers) > 0 {
		m = 0
	}
	for _, s := range cfg.Servers {
		m = max(m, s.MaxMessageSize)
	}
	return m
}

// watchRPC reports the RPC port's end on Failed unless the node is
// draining or stopping: a node that cannot take calls must not look alive.
func (n *Node) watchRPC() {
	defer n.wg.Done()
	select {
	case <-n.rpc.Done():
		if err := n.rpc.Err(); err != nil && !n.draining.Load() {
			n.failed <- fmt.Errorf("rpc port %s ended: %w", n.rpc.Addr(), err)
		}
	case <-n.stop:
	}
}

// Failed delivers an error when the RPC port ends on its own while the node
// is not draining; scdd then exits non-zero for its supervisor to restart it.
func (n *Node) Failed() <-chan error { return n.failed }

// registerProcMetrics exposes what the process manager pm does node-wide.
func registerProcMetrics(set *metrics.Set, scraped *scrapedSeries, pm local.ProcessManager) {
	cpu := pm.CPUStatus()
	set.NewGauge(`tpsched_cpu_priority_mechanism{mechanism="`+string(cpu.Mechanism)+`"}`,
		func() float64 { return 1 })
	cs := pm.Containment()
	set.NewGauge(`tpsched_uap_kill_mechanism{mechanism="`+string(cs.Kill)+`"}`, func() float64 { return 1 })
	set.NewGauge(`tpsched_uap_limit_mechanism{limit="pids",mechanism="`+string(cs.Pids)+`"}`, func() float64 { return 1 })
	set.NewGauge(`tpsched_uap_limit_mechanism{limit="memory",mechanism="`+string(cs.Memory)+`"}`, func() float64 { return 1 })
	set.NewGauge(`tpsched_memory_gate_closed`, func() float64 { return b2f(pm.Stats().MemoryGateClosed) })
	scraped.counter(`tpsched_nonresident_starts_total`, func() uint64 { return pm.Stats().NonResidentStarts })
	scraped.counter(`tpsched_nonresident_stops_total`, func() uint64 { return pm.Stats().NonResidentStops })
	scraped.counter(`tpsched_cpu_guard_holds_total`, func() uint64 { return pm.Stats().CPUGuardHolds })
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// expireLoop answers the transferred calls and requests whose deadline has
// passed (the local scheduler expires its own).
func (n *Node) expireLoop() {
	defer n.wg.Done()
	n.pool.RunExpiry(n.stop)
}

// OnClose is called when a caller's connection closes. Calls in flight for
// it still run; their answers are dropped by netio.
func (n *Node) OnClose(c *rpcport.Conn) {}

// Hold stops a group from taking new calls ('service closed'); queued calls
// are still served.
func (n *Node) Hold(name string) error { _, err := n.setHeld(name, true); return err }

// Release lets a held group take calls again.
func (n *Node) Release(name string) error { _, err := n.setHeld(name, false); return err }

// setHeld holds or releases the group and reports whether that changed
// anything; only a change is logged (by the local scheduler) and
// announced.
func (n *Node) setHeld(name string, held bool) (changed bool, err error) {
	set := n.local.Release
	if held {
		set = n.local.Hold
	}
	if changed, err = set(name); err != nil || !changed {
		return false, err
	}
	n.announce()
	return true, nil
}

// RPCAddr is the address the RPC port listens on.
func (n *Node) RPCAddr() string { return n.rpc.Addr() }

// ControlAddr is the HTTP address: the status page, /status and /metrics
// (control actions are on the control socket).
func (n *Node) ControlAddr() string { return n.doors.httpLn.Addr().String() }

// DrainBound is the longest Drain takes: DrainTimeout, and before it, in
// a cluster, up to cluster.LeaveGrace serving while the others stop
// sending here (scdd says it when a signal starts the drain).
func (n *Node) DrainBound() time.Duration {
	if n.inCluster {
		return cluster.LeaveGrace + n.opts.DrainTimeout
	}
	return n.opts.DrainTimeout
}

// StopBound is the longest a stop (Drain) takes: DrainBound, then the
// shutdown's parts, each bounded on its own (shutdownBound). A supervisor
// that kills scdd sooner (systemd's TimeoutStopSec) cuts the port's last
// answers short.
func (n *Node) StopBound() time.Duration { return n.DrainBound() + shutdownBound }

// Drain refuses new calls, waits until every queued call is answered (or
// ctx or DrainTimeout ends), then stops the UAPs and closes the ports.
// After a Restart handed the sockets over it waits for that drain instead.
func (n *Node) Drain(ctx context.Context) error {
	if handed, err := n.restart.drainedByRestart(); handed {
		return err
	}
	return n.drain(ctx)
}

func (n *Node) drain(ctx context.Context) error {
	stopBy := time.Now().Add(n.StopBound())
	n.router.LeaveAndWait(ctx) // the other nodes stop sending here first
	n.draining.Store(true)
	n.log.Info("draining: new calls are refused")
	ctx, cancel := context.WithTimeout(ctx, n.opts.DrainTimeout)
	defer cancel()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	var left int
	for quiet := false; ; {
		left = n.callsOwed()
		if left == 0 && quiet {
			break
		}
		quiet = left == 0
		select {
		case <-ctx.Done():
			n.log.Warn("drain timed out", "calls_left", left)
		case <-t.C:
			continue
		}
		break
	}
	err := n.shutdown(stopBy)
	if left > 0 {
		err = errors.Join(err, fmt.Errorf("drain: %d call(s) were still in flight", left))
	}
	return err
}

// callsOwed is the calls the node has taken and not yet answered: waiting
// for the cluster's table, parked for a server that is starting (the
// drain timeout is theirs too, else shutdown answers them 'node shutting
// down' at once: wlm.Close), transferred to other nodes, queued here.
//
// A call that moves from one of these to another is counted where it goes
// before it is counted off where it was, so reading them in the order calls
// flow (the table's wait, then the routing manager, the peer pool, the
// local queues) never misses one that moves between reads. A call moving
// against that order (rerouted from one node's peer to another's) can be
// missed by one reading, not by two: the drain ends on two readings of
// none in a row.
func (n *Node) callsOwed() int {
	left := n.router.Waiting()
	if n.wlm != nil {
		left += n.wlm.Parked()
	}
	left += n.pool.TotalInFlight()
	return left + n.local.InFlight()
}

// How long each part of a shutdown may take: the UAPs to leave (then they
// are killed), the RPC port to answer what it read and close, the HTTP
// endpoint. Each part has its own, so UAPs that had to be killed do not
// leave the port no time to answer their calls.
const (
	uapStopTime     = local.UAPStopTime
	rpcStopTime     = 5 * time.Second
	httpStopTime    = 2 * time.Second
	controlStopTime = time.Second

	// shutdownBound: the UAPs, the wait for those killed (the servers
	// stop side by side), the port, the HTTP endpoint and the control
	// socket, one after another.
	shutdownBound = uapStopTime + procmgr.KillWait + rpcStopTime + httpStopTime + controlStopTime
)

// shutdown stops whatever has been started, in the reverse order; a
// process a restart started waits, until oldBy at the most, for the old
// process to end its drain (restarter.waitOld).
func (n *Node) shutdown(oldBy time.Time) error {
	var errs []error
	n.ports.close()
	n.restart.closeInherited()
	uapCtx, cancel := context.WithTimeout(context.Background(), uapStopTime)
	errs = append(errs, n.local.Stop(uapCtx))
	cancel()
	n.router.Leave()
	if n.wlm != nil {
		n.wlm.Close() // its waits end and its goroutines with them; what waits for it is answered
	}
	// Calls transferred to other nodes and not yet answered are answered
	// now, while their callers' connections are still open.
	n.pool.Close()
	if n.rpc != nil {
		ctx, cancel := context.WithTimeout(context.Background(), rpcStopTime)
		errs = append(errs, n.rpc.Stop(ctx))
		cancel()
		// Every answer owed was written before its connection's FIN,
		// unless the caller left first (reset, or closed and never read)
		// or a limit closed the connection: those are counted.
		n.log.Info("rpc port closed", "answers_undelivered", n.rpc.Stats().Undelivered)
	}
	if n.doors.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), httpStopTime)
		errs = append(errs, n.doors.http.Shutdown(ctx))
		cancel()
	}
	close(n.stop)
	n.wg.Wait()
	errs = append(errs, n.local.Close())
	if n.pm != nil {
		n.pm.Close()
	}
	if n.meter != nil {
		errs = append(errs, n.meter.Close()) // after procmgr: no process is read any more
	}
	n.restart.waitOld(oldBy)
	// Last: while it is open, an old process that passes a stop on does
	// not fall back to a signal, which this one would take for a second.
	n.restart.closeOld()
	return errors.Join(errs...)
}
