// Package scd is the schedule service of a node: it wires the service
// groups' shared-memory schedule queues, the UAP processes that serve them
// and the RPC port together. A call arrives as a frame from netio, is
// checked (group, service, hold, size), put on its group's queue and
// answered when a UAP completes it, when its watch_time passes, or when the
// UAP serving it dies. scd never parses bytes off the wire itself; netio
// hands it frames.
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
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/bpf"
	"tpsched/netio"
	"tpsched/netio/rpcport"
	"tpsched/procmgr"
	"tpsched/scd/def"
	"tpsched/scd/names"
	"tpsched/scd/schedq"
	"tpsched/shm"
	"tpsched/shm/sockmode"
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
	// FastFailureDetection probes peers every 200 ms instead of 1 s, so
	// a dead node leaves the tables within about a second: for tests and
	// single-host clusters.
	FastFailureDetection bool
	// Steering places each receiver group's new connections: "" the
	// SK_REUSEPORT program where it loads (else the kernel's hash, saying
	// why), SteeringOff the hash. scdd takes it from TPSCHED_STEERING.
	Steering string
	// RestartArgs is the command line (after the program) that starts this
	// daemon again, for Restart; scdd passes its own.
	RestartArgs []string
	// Takeover is the hand-over socket from an old scdd whose sockets this
	// node takes over (restart.go); nil for a plain start.
	Takeover *net.UnixConn
}

// Node is one running schedule service.
type Node struct {
	cfg  *def.Config
	opts Options
	log  *slog.Logger

	groups   map[string]*group
	order    []*group       // by name, for status output
	pm       processManager // procmgr, unless a test set it
	meter    bpf.Meter
	cluster  *cluster // nil: no all_node, every call is served here
	rpc      *rpcport.Port
	admin    *http.Server
	adminLn  net.Listener
	metrics  *metrics.Set
	scraped  scrapedSeries // series of n.metrics read at scrape time (metrics.go)
	draining atomic.Bool
	stop     chan struct{}
	wg       sync.WaitGroup
	failed   chan error // the RPC port ended while the node was not draining

	badRequests  *metrics.Counter
	helloRefused *metrics.Counter

	// Sockets bound before the UAPs start (bindPorts), until the parts
	// that serve on them take them.
	bound        *rpcport.Bound
	adminBound   net.Listener
	controlBound *net.UnixListener
	namesBound   *names.Transport

	adminLimit *connLimit // caps metrics_address's connections (httplimit.go)

	restart restartState // restart.go: handing the sockets to a new process, or taking them over
	wlm     *wlmNode     // wlm.go: the routing manager (svcpolicy); nil without a service policy

	uapIDs map[string]int // uid/gid per server when the daemon is root and the definition names none

	requests requestBudget // the bytes of admitted calls' requests (budget.go)
}

// New checks the configuration against the machine (modules exist, groups
// are unique) and builds the node without starting anything.
func New(cfg *def.Config, opts Options) (*Node, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.DrainTimeout == 0 {
		opts.DrainTimeout = 30 * time.Second
	}
	n := &Node{
		cfg: cfg, opts: opts, log: opts.Logger,
		groups:  make(map[string]*group),
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
	n.requests.limit = cfg.System.BufferBudget
	n.exposeMetrics()
	n.metrics.NewGauge(`tpsched_admitted_request_bytes`, func() float64 { return float64(n.requests.held.Load()) })
	n.badRequests = n.metrics.NewCounter(`tpsched_requests_refused_total{reason="protocol"}`)
	n.helloRefused = n.metrics.NewCounter(`tpsched_peer_hellos_refused_total`)
	var bad []error // every server's missing module, not only the first (scdd -check)
	for _, s := range cfg.Servers {
		module, err := n.resolveModule(s.Module)
		if err != nil {
			bad = append(bad, s.Errorf("module", "%v", err))
			continue
		}
		s.Module = module
		// The module must be runnable by the user its processes run as,
		// which is not scdd's (issue 19 item 22): say so now, at -check,
		// rather than as "permission denied" at each start.
		if uid, gid, _ := n.uapCredentials(&s); uid >= 0 || gid >= 0 || os.Geteuid() != 0 {
			if err := procmgr.CheckModule(module, uid, gid); err != nil {
				bad = append(bad, s.Errorf("module", "%v", err))
				continue
			}
		}
		if err := n.checkWorkDir(&s); err != nil {
			bad = append(bad, err)
			continue
		}
		g := &group{
			name:    s.ServiceGroup,
			def:     s,
			entries: make(map[string]string, len(s.Services)),
			watch:   s.WatchTime,
			log:     n.log,
			q: schedq.New[*call](schedq.Config{QueueSize: s.QueueSize, Slots: s.MaxProcesses,
				Resident: s.Resident, Refresh: s.RefreshProcess, Depth: callsPerProcess(&s)}),
			slots: make([]slotState, s.MaxProcesses),
		}
		for _, svc := range s.Services {
			g.entries[svc.Name] = svc.Entry
		}
		n.admitCalls(g)
		n.groups[g.name] = g
		n.order = append(n.order, g)
	}
	switch len(bad) {
	case 0:
	case 1:
		return nil, bad[0]
	default:
		return nil, def.Errors(bad)
	}
	sort.Slice(n.order, func(i, j int) bool { return n.order[i].name < n.order[j].name })
	n.requests.share = n.requests.limit / int64(max(len(n.order), 1))
	if cfg.Policy != nil {
		var err error
		if n.wlm, err = newWLM(n); err != nil {
			return nil, err
		}
		for _, g := range n.order {
			g.envAtStart = n.wlm.envs.isEnv(g.name)
		}
	}
	return n, nil
}

// admitCalls gives g what a call admitted to it uses before its
// processes run. Start starts the groups one after another, and a UAP of
// one may call another at once: every group takes calls from New on, and
// a call to one whose processes have not started waits in its queue.
func (n *Node) admitCalls(g *group) {
	lbl := `{group="` + g.name + `"}`
	g.refused = n.metrics.NewCounter(`tpsched_requests_refused_total{reason="busy",group="` + g.name + `"}`)
	g.overBudget = n.metrics.NewCounter(`tpsched_requests_refused_total{reason="budget",group="` + g.name + `"}`)
	g.bytes.node = &n.requests
	g.timedOut = n.metrics.NewCounter(`tpsched_requests_timed_out_total` + lbl)
	g.terminated = n.metrics.NewCounter(`tpsched_requests_server_terminated_total` + lbl)
	g.misbehaved = n.metrics.NewCounter(`tpsched_uap_protocol_violations_total` + lbl)
	g.localCalls = n.metrics.NewCounter(`tpsched_local_calls_total` + lbl)
	g.stalls = n.metrics.NewCounter(`tpsched_local_call_stalls_total` + lbl)
	g.place = n.placeLocal
	g.latency = newLatencyHistogram(n.metrics.NewPrometheusHistogramExt(`tpsched_request_duration_seconds`+lbl, requestDurationBuckets))
}

// prefetchDepth is how many calls a shared-memory process may hold: its
// current one and those handed over ahead, so that it goes on without
// waiting for the reply reader between short calls (a handoff costs a
// futex wake-up on each side: 28% of scdd's CPU at 64 connections with
// one call ahead). A stuck process gives back what it has not taken.
const prefetchDepth = 8

// callsPerProcess is prefetchDepth, or 1 for a socket-receiving server: a
// call written to a socket cannot be taken back.
func callsPerProcess(s *def.Server) int {
	if s.ReceiveFrom == def.ReceiveSocket {
		return 1
	}
	return prefetchDepth
}

// resolveModule finds a UAP executable: absolute, relative to the
// definition directory, or by bare name in aplib/, ModuleDirs and $PATH.
func (n *Node) resolveModule(m string) (string, error) {
	if filepath.IsAbs(m) {
		return m, checkExecutable(m)
	}
	if filepath.Base(m) != m {
		p := filepath.Join(n.cfg.Dir, m)
		return p, checkExecutable(p)
	}
	var dirs []string
	if n.cfg.Dir != "" {
		dirs = append(dirs, filepath.Join(n.cfg.Dir, "aplib"))
	}
	dirs = append(dirs, n.opts.ModuleDirs...)
	for _, d := range dirs {
		p := filepath.Join(d, m)
		if checkExecutable(p) == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath(m)
	if err != nil {
		return "", fmt.Errorf("%q not found in %v or $PATH", m, dirs)
	}
	return p, nil
}

func checkExecutable(p string) error {
	st, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s does not exist", p)
	}
	if err != nil {
		return err
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", p)
	}
	return nil
}

// Start binds every port the node listens on (bindPorts), creates the
// schedule queues and starts the UAP processes, then serves the RPC port
// and the control/metrics endpoint on what it bound. On error everything
// already started is stopped again.
func (n *Node) Start() (err error) {
	force := n.opts.SchedProbes
	if force == "off" {
		force = bpf.Proc
	}
	n.meter = bpf.Open(bpf.Options{Force: force, Logger: n.log})
	mech := n.meter.Mechanism()
	n.log.Info("uap cpu measurement", "mechanism", mech.Name, "histogram", mech.Histogram, "reason", mech.Reason)
	if n.pm == nil {
		n.pm = procmgrManager{procmgr.New(procmgr.Options{
			Logger:        n.log,
			NodeCap:       n.cfg.System.MaxProcesses,
			SchedBatch:    n.cfg.System.UAPSchedBatch,
			MemoryReserve: n.cfg.System.MemoryReserve,
			Meter:         n.meter,
			LinkDir:       n.uapLinkDir(),
		})}
	}
	n.registerNodeMetrics()
	for _, w := range n.Warnings() {
		n.log.Warn(w)
	}
	n.restart.peer = n.opts.Takeover
	defer func() {
		if err != nil {
			n.takeoverFailed(err)
			n.shutdown()
		}
	}()
	if err := n.bindPorts(); err != nil {
		return err
	}
	for _, g := range n.order {
		if err := n.startGroup(g); err != nil {
			return err
		}
	}
	if err := n.takeOver(); err != nil {
		return err
	}
	if err := n.prepareCluster(); err != nil {
		return err
	}
	opts := n.rpcOptions()
	opts.Inherit, opts.Bound = n.restart.inheritRPC, n.bound
	n.rpc, err = rpcport.Listen(opts, n)
	n.bound, n.restart.inheritRPC = nil, nil // Listen took the sockets, or closed them
	if err != nil {
		return fmt.Errorf("rpc port %s: %w", opts.Addr, err)
	}
	n.wg.Add(1)
	go n.watchRPC()
	if err := n.startAdmin(); err != nil {
		return err
	}
	if err := n.startLoadChecks(); err != nil {
		return err
	}
	if n.wlm != nil {
		n.wlm.start()
	}
	if err := n.takeoverServing(); err != nil {
		return err
	}
	if err := n.joinCluster(); err != nil {
		return err
	}
	n.wg.Add(1)
	go n.expireLoop()
	n.log.Info("scdd started", "node", n.cfg.System.NodeID, "rpc", n.rpc.Addr(), "http", n.adminLn.Addr().String(),
		"control_socket", ControlSocketPath(n.cfg), "groups", len(n.order))
	return nil
}

// rpcOptions are the RPC port's options from the definitions.
func (n *Node) rpcOptions() rpcport.Options {
	return rpcport.Options{
		Addr:  net.JoinHostPort(n.cfg.System.RPCAddress, strconv.Itoa(n.cfg.System.RPCPort)),
		Loops: n.cfg.Sched.Multi,
		// A frame up to the largest max_message_size is read whole, so one
		// over its own group's is answered 'message too big' here; netio
		// answers a larger one itself and skips its bytes unkept.
		MaxPayload:   n.largestMessage(),
		MaxConns:     n.cfg.System.MaxConnections,
		FrameTimeout: n.cfg.System.FrameTimeout,
		BufferBudget: n.cfg.System.BufferBudget,
		Metrics:      n.metrics,
		Logger:       n.log,
		Receivers:    n.receiverGroups(),
		Steer:        steerer{off: n.opts.Steering == SteeringOff},
	}
}

// bindPorts binds every socket the node listens on before the first UAP
// runs: the RPC port and every receiver group's, metrics_address, the
// control socket and the name port. A UAP started first could bind one of
// them itself (the RPC port with SO_REUSEPORT, as a UAP did, answering
// every call) or just hold it so that the node cannot start. Bound sockets
// keep callers in their backlogs until the node serves on them. A new
// process that takes the node over leaves alone what the old one holds
// (a port taken, or port 0): those come from the old process, which keeps
// them open throughout.
func (n *Node) bindPorts() error {
	takingOver := n.restart.peer != nil
	opts := n.rpcOptions()
	b, err := rpcport.Bind(opts, takingOver)
	if err != nil {
		return fmt.Errorf("rpc port %s: %w", opts.Addr, err)
	}
	n.bound = b
	maddr := n.cfg.System.MetricsAddress
	if !takingOver || !portZero(maddr) {
		ln, err := net.Listen("tcp", maddr)
		switch {
		case err == nil:
			n.adminBound = ln
		case !takingOver:
			return fmt.Errorf("metrics_address %s: %w", maddr, err)
		}
	}
	ln, err := listenControl(ControlSocketPath(n.cfg))
	switch {
	case err == nil:
		n.controlBound = ln
	case !takingOver:
		return fmt.Errorf("control socket: %w", err)
	}
	if seeds, err := n.seeds(); err == nil && len(seeds) > 0 {
		sys := n.cfg.System
		if !takingOver || sys.NamePort != 0 {
			t, err := names.ListenTransport(sys.RPCAddress, sys.NamePort)
			switch {
			case err == nil:
				n.namesBound = t
			case !takingOver:
				return err
			}
		}
	}
	return nil
}

// closeUnbound closes the sockets bound ahead that nothing took (a start
// that failed half way).
func (n *Node) closeUnbound() {
	n.bound.Close()
	n.bound = nil
	if n.adminBound != nil {
		_ = n.adminBound.Close()
		n.adminBound = nil
	}
	if n.controlBound != nil {
		_ = n.controlBound.Close()
		n.controlBound = nil
	}
	if n.namesBound != nil {
		n.namesBound.Close()
		n.namesBound = nil
	}
	n.restart.closeInherited()
}

// portZero reports whether host:port asks for a port the kernel picks.
func portZero(addr string) bool {
	_, p, err := net.SplitHostPort(addr)
	return err == nil && (p == "0" || p == "")
}

func (n *Node) startGroup(g *group) error {
	s := &g.def
	env := s.Env
	if s.ReceiveFrom == def.ReceiveSocket {
		tr, err := sockmode.New(g.name, s.MaxMessageSize)
		if err != nil {
			return fmt.Errorf("%s: %w", s.File, err)
		}
		g.tr = transportOf[*sockmode.Proc]{tr}
		env = append(env[:len(env):len(env)], "TPSCHED_RECEIVE=socket")
	} else {
		sg, err := shm.NewGroup(g.name, s.MaxMessageSize, s.MaxProcesses, callsPerProcess(s))
		if err != nil {
			return fmt.Errorf("%s: shared memory: %w", s.File, err)
		}
		g.tr = transportOf[*shm.Proc]{sg}
	}
	lbl := `{group="` + g.name + `"}`
	n.metrics.NewGauge(`tpsched_queue_depth`+lbl, func() float64 { return float64(g.stats().Waiting) })
	n.counterFunc(`tpsched_requests_queued_total`+lbl, func() uint64 { return g.stats().Queued })
	n.counterFunc(`tpsched_requests_processed_total`+lbl, func() uint64 { return g.stats().Processed })
	n.metrics.NewGauge(`tpsched_group_held`+lbl, func() float64 { return b2f(g.held.Load()) })
	n.startLoad(g)
	uid, gid, slotGIDs := n.uapCredentials(s)
	dir, err := n.uapWorkDir(s, uid, gid)
	if err != nil {
		n.log.Warn("the server's working directory could not be prepared; its processes start in /", "server", s.Name, "err", err)
		dir = "/"
	}
	g.workDir = dir
	g.procs, err = n.startProcesses(g, procmgr.Spec{
		Server:       s.Name,
		Group:        g.name,
		Module:       s.Module,
		Env:          env,
		UID:          uid,
		GID:          gid,
		SlotGIDs:     slotGIDs,
		Resident:     s.Resident,
		Max:          s.MaxProcesses,
		BalanceCount: s.BalanceCount,
		Priority:     s.SchedulePriority,
		Refresh:      s.RefreshProcess,
		IdleStop:     s.NonResidentIdle,
		CPUWaitLimit: s.CPUWaitLimit,
		PidsMax:      uapPidsMax(s),
		MemoryMax:    uapMemoryMax(s),
		Dir:          dir,
	})
	if err != nil {
		return fmt.Errorf("%s: %w", s.File, err)
	}
	n.registerUAPMetrics(g)
	g.started.Store(true)
	g.procs.Kick(g.Waiting()) // calls that came before (group.submit)
	n.metrics.NewGauge(`tpsched_processes{group="`+g.name+`",kind="resident"}`, func() float64 {
		res, _ := g.procs.Running()
		return float64(res)
	})
	n.metrics.NewGauge(`tpsched_processes{group="`+g.name+`",kind="nonresident"}`, func() float64 {
		_, nonres := g.procs.Running()
		return float64(nonres)
	})
	n.wg.Add(1)
	go func() { defer n.wg.Done(); g.readReplies(n.stop) }()
	return nil
}

// largestMessage is the frame cap of the RPC port: the largest
// max_message_size of any group here. A node with all_node forwards calls
// for groups only other nodes define, whose sizes it does not know: it
// takes the largest any definition may give.
func (n *Node) largestMessage() int {
	if len(n.cfg.System.AllNodes) > 0 {
		return def.MaxMaxMessageSize
	}
	m := def.DefaultMaxMessageSize
	if len(n.order) > 0 {
		m = 0
	}
	for _, g := range n.order {
		m = max(m, g.def.MaxMessageSize)
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

// registerNodeMetrics exposes what the process manager does node-wide.
func (n *Node) registerNodeMetrics() {
	cpu := n.pm.CPUStatus()
	n.metrics.NewGauge(`tpsched_cpu_priority_mechanism{mechanism="`+string(cpu.Mechanism)+`"}`,
		func() float64 { return 1 })
	cs := n.pm.Containment()
	n.metrics.NewGauge(`tpsched_uap_kill_mechanism{mechanism="`+string(cs.Kill)+`"}`, func() float64 { return 1 })
	n.metrics.NewGauge(`tpsched_uap_limit_mechanism{limit="pids",mechanism="`+string(cs.Pids)+`"}`, func() float64 { return 1 })
	n.metrics.NewGauge(`tpsched_uap_limit_mechanism{limit="memory",mechanism="`+string(cs.Memory)+`"}`, func() float64 { return 1 })
	n.metrics.NewGauge(`tpsched_memory_gate_closed`, func() float64 { return b2f(n.pm.Stats().MemoryGateClosed) })
	n.counterFunc(`tpsched_nonresident_starts_total`, func() uint64 { return n.pm.Stats().NonResidentStarts })
	n.counterFunc(`tpsched_nonresident_stops_total`, func() uint64 { return n.pm.Stats().NonResidentStops })
	n.counterFunc(`tpsched_cpu_guard_holds_total`, func() uint64 { return n.pm.Stats().CPUGuardHolds })
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// expireLoop answers callers whose watch_time has passed.
func (n *Node) expireLoop() {
	defer n.wg.Done()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case now := <-t.C:
			for _, g := range n.order {
				g.expire(now)
				g.checkStall(now)
			}
			if n.cluster != nil {
				n.cluster.fwd.expire(now)
			}
		}
	}
}

// OnFrame takes one frame off a receiving socket. It runs on a gnet event
// loop and must not block: checks, one enqueue, and an immediate answer
// when the call is refused.
func (n *Node) OnFrame(c *rpcport.Conn, f netio.Frame) {
	switch f.Kind {
	case netio.KindCall, netio.KindCallNoReply:
	case netio.KindAnnounce:
		n.acceptHello(c, &f) // a peer's forwarding connection introduces itself
		return
	case netio.KindNameLookup:
		n.answerLookup(c, &f)
		return
	default:
		n.badRequests.Inc()
		c.SendNow(netio.AppendError(nil, f.ID, netio.CodeProtocol, "a node takes calls, not "+f.Kind.String()))
		return
	}
	code, msg := n.schedule(c, &f)
	if code != netio.CodeOK && f.Kind == netio.KindCall {
		c.SendNow(netio.AppendError(nil, f.ID, code, msg))
	}
}

func (n *Node) schedule(c *rpcport.Conn, f *netio.Frame) (netio.Code, string) {
	if n.draining.Load() {
		return netio.CodeShuttingDown, ""
	}
	g := n.groups[string(f.Group)]
	if len(n.cfg.Sched.ReceiverGroups) > 0 {
		if msg, wrong := n.wrongReceiver(c, g, f); wrong {
			return netio.CodeWrongReceiver, msg
		}
	}
	if n.wlm != nil {
		if handled, code, msg := n.wlm.envs.schedule(c, forwardedBy(c, f), f, &g); handled {
			return code, msg
		}
	}
	if n.cluster != nil {
		if transferred, code, msg := n.routeCall(c, forwardedBy(c, f), f, g); transferred {
			return code, msg
		}
	}
	return n.serveLocal(c, f, g)
}

// serveLocal puts a call on this node's schedule queue of g, or says why not.
func (n *Node) serveLocal(c caller, f *netio.Frame, g *group) (netio.Code, string) {
	if g == nil {
		return netio.CodeNoSuchGroup, n.unknown(string(f.Group), n.groupNames)
	}
	entry, ok := g.entries[string(f.Service)]
	if !ok {
		return netio.CodeNoSuchService, g.name + "/" + n.unknown(string(f.Service), g.serviceNames)
	}
	if g.held.Load() {
		return netio.CodeServiceClosed, g.name + " is held"
	}
	if !g.servable() {
		return netio.CodeServiceClosed, g.name + " has no server on node " + n.cfg.System.NodeID
	}
	if len(f.Payload) > g.def.MaxMessageSize {
		return netio.CodeMessageTooBig, fmt.Sprintf("%d bytes, max_message_size %d", len(f.Payload), g.def.MaxMessageSize)
	}
	return g.submit(c, f, entry, time.Now())
}

// unknown names what a call asked for that is not here, with the nearest
// name that is ("demoo (did you mean demo?)"); names is asked only now,
// on the error path.
func (n *Node) unknown(name string, names func() []string) string {
	if s := def.Suggest(name, names()); s != "" {
		return name + " (did you mean " + s + "?)"
	}
	return name
}

func (n *Node) groupNames() []string {
	out := make([]string, 0, len(n.order))
	for _, g := range n.order {
		out = append(out, g.name)
	}
	return out
}

func (g *group) serviceNames() []string {
	out := make([]string, 0, len(g.def.Services))
	for _, s := range g.def.Services {
		out = append(out, s.Name)
	}
	return out
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
// anything; only a change is logged and announced.
func (n *Node) setHeld(name string, held bool) (changed bool, err error) {
	g := n.groups[name]
	if g == nil {
		return false, &netio.Error{Code: netio.CodeNoSuchGroup, Message: name}
	}
	if g.held.Swap(held) == held {
		return false, nil
	}
	n.log.Info("service group "+map[bool]string{true: "held", false: "released"}[held], "group", name)
	n.announce()
	return true, nil
}

// RPCAddr is the address the RPC port listens on.
func (n *Node) RPCAddr() string { return n.rpc.Addr() }

// ControlAddr is the HTTP address: the status page, /status and /metrics
// (control actions are on the control socket).
func (n *Node) ControlAddr() string { return n.adminLn.Addr().String() }

// Drain refuses new calls, waits until every queued call is answered (or
// ctx or DrainTimeout ends), then stops the UAPs and closes the ports.
// After a Restart handed the sockets over it waits for that drain instead.
func (n *Node) Drain(ctx context.Context) error {
	if handed, err := n.drainedByRestart(); handed {
		return err
	}
	return n.drain(ctx)
}

func (n *Node) drain(ctx context.Context) error {
	n.leaveBeforeDrain(ctx) // the other nodes stop sending here first
	n.draining.Store(true)
	n.log.Info("draining: new calls are refused")
	ctx, cancel := context.WithTimeout(ctx, n.opts.DrainTimeout)
	defer cancel()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	var left int
	for {
		left = n.transfersInFlight()
		for _, g := range n.order {
			left += g.inFlight()
		}
		if left == 0 {
			break
		}
		select {
		case <-ctx.Done():
			n.log.Warn("drain timed out", "calls_left", left)
		case <-t.C:
			continue
		}
		break
	}
	err := n.shutdown()
	if left > 0 {
		err = errors.Join(err, fmt.Errorf("drain: %d call(s) were still in flight", left))
	}
	return err
}

// How long each part of a shutdown may take: the UAPs to leave (then they
// are killed), the RPC port to answer what it read and close, the HTTP
// endpoint. Each part has its own, so UAPs that had to be killed do not
// leave the port no time to answer their calls.
const (
	uapStopTime  = 5 * time.Second
	rpcStopTime  = 5 * time.Second
	httpStopTime = 2 * time.Second
)

// shutdown stops whatever has been started, in the reverse order.
func (n *Node) shutdown() error {
	var errs []error
	n.closeUnbound()
	for _, g := range n.order {
		if g.procs != nil {
			g.procs.Stopping() // their exits from here on are not crashes
		}
		// Even a group that never started: a UAP of another may have
		// called it.
		g.close() // the processes leave once they hold no call
		g.flush(netio.CodeShuttingDown, "the node stopped before the call reached a process")
	}
	uapCtx, cancel := context.WithTimeout(context.Background(), uapStopTime)
	for _, g := range n.order {
		if g.procs != nil {
			errs = append(errs, g.procs.Stop(uapCtx))
		}
		if g.tr != nil {
			// A call the last processes were handed and never took went
			// back to the queue when they were reaped: nobody takes it now.
			g.flush(netio.CodeShuttingDown, "the node stopped before the call reached a process")
		}
	}
	cancel()
	n.leaveCluster()
	if n.cluster != nil {
		// Calls transferred to other nodes and not yet answered are
		// answered now, while their callers' connections are still open.
		n.cluster.fwd.close()
	}
	if n.rpc != nil {
		ctx, cancel := context.WithTimeout(context.Background(), rpcStopTime)
		errs = append(errs, n.rpc.Stop(ctx))
		cancel()
		// Every answer owed was written before its connection's FIN,
		// unless the caller left first (reset, or closed and never read)
		// or a limit closed the connection: those are counted.
		n.log.Info("rpc port closed", "answers_undelivered", n.rpc.Stats().Undelivered)
	}
	if n.admin != nil {
		ctx, cancel := context.WithTimeout(context.Background(), httpStopTime)
		errs = append(errs, n.admin.Shutdown(ctx))
		cancel()
	}
	close(n.stop)
	n.wg.Wait()
	for _, g := range n.order {
		if g.tr != nil {
			errs = append(errs, g.tr.Unmap())
		}
	}
	if n.pm != nil {
		n.pm.Close()
	}
	if n.meter != nil {
		errs = append(errs, n.meter.Close()) // after procmgr: no process is read any more
	}
	return errors.Join(errs...)
}
