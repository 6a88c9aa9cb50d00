package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/internal/pace"
	"tpsched/netio"
	"tpsched/procmgr"
	"tpsched/scd/call"
	"tpsched/scd/def"
	"tpsched/scd/schedq"
	"tpsched/scd/wlm"
	"tpsched/shm"
	"tpsched/shm/sockmode"
)

// UAPStopTime is how long the UAPs may take to leave when they are
// stopped (the node's shutdown, a server the routing manager stops); then
// they are killed.
const UAPStopTime = 5 * time.Second

// Options are what a Scheduler needs from its node beyond the
// definitions.
type Options struct {
	Logger  *slog.Logger
	Metrics *metrics.Set
	// CounterFunc registers a counter the node's /metrics reads at each
	// scrape (the queue's counters).
	CounterFunc func(name string, get func() uint64)
	// ModuleDirs are searched for a module given by bare name, after the
	// definition directory's aplib/ and before $PATH.
	ModuleDirs []string
	// Place is where a call a group's process makes goes (the node's line
	// for UAP calls, which ends at this scheduler's Route). It is called
	// on the dispatcher (or a socket group's reader) without the group's
	// lock and must not block.
	Place func(c call.Caller, f *netio.Frame) (netio.Code, string)
	// LevelChanged is told that a group's load level changed (the node
	// announces it); on the load loop, it must not block for long.
	LevelChanged func(g *Group)
	// Lanes reports whether the node routes a call a UAP makes to a group
	// served here to this node's queue whenever the group is at LEVEL0
	// (no service policy, and no cluster or scd_this_node_first = Y):
	// only then may a caller be granted a lane (lanes.go), which skips the
	// routing. nil: never.
	Lanes func() bool
	// OnDemand reports whether a group's server starts only when asked
	// (Group.StartServer: an application environment of the routing
	// manager), and every group's server may be stopped and started again;
	// nil: every server starts with the node and runs until it stops. It
	// is asked in Start.
	OnDemand func(group string) bool
}

// Scheduler is this node's service groups (see the package comment).
type Scheduler struct {
	cfg    *def.Config
	opts   Options
	log    *slog.Logger
	groups map[string]*Group
	order  []*Group // by name
	pm     ProcessManager
	uapIDs map[string]int // uid/gid per server when the daemon is root and the definition names none

	requests requestBudget // the bytes of admitted calls' requests (budget.go)

	// bells are the doorbells of every shared-memory group's processes,
	// where the dispatcher (reader.go) waits; nil before Start.
	bells    *shm.Doorbells
	readers  atomic.Pointer[[]*reader] // the groups the dispatcher reads; startGroup adds
	spinFree func() bool               // SpinWhile's
	// lastLook is when the dispatcher last finished its looks and went
	// back to wait (unix nanoseconds): its liveness, read by /metrics and
	// by the expiry loop's watchdog (checkDispatcher), whose stalled says
	// it warned.
	lastLook atomic.Int64
	stalled  bool
	// expiry paces expireLoop: every expireEvery while calls are in
	// flight or lanes are open, every expireIdle on a quiet node; a
	// submit wakes it.
	expiry *pace.Loop

	lanes laneRules

	stop chan struct{}
	wg   sync.WaitGroup // the readers, the load loop, the expiry loop
}

// New checks the definitions against the machine (modules exist) and
// makes the groups, starting nothing.
func New(cfg *def.Config, opts Options) (*Scheduler, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.LevelChanged == nil {
		opts.LevelChanged = func(*Group) {}
	}
	s := &Scheduler{cfg: cfg, opts: opts, log: opts.Logger, groups: make(map[string]*Group), stop: make(chan struct{}),
		expiry: pace.New(expireEvery, expireIdle)}
	s.lanes = laneRules{on: lanesFromEnv(), max: maxLanes(runtime.NumCPU()), gen: new(atomic.Uint32),
		open: new(atomic.Int64), granted: new(atomic.Int64), wanted: new(atomic.Int64), regroups: new(atomic.Uint32)}
	s.requests.limit = cfg.System.BufferBudget
	var bad []error // every server's missing module, not only the first (scdd -check)
	for _, srv := range cfg.Servers {
		module, err := s.resolveModule(srv.Module)
		if err != nil {
			bad = append(bad, srv.Errorf("module", "%v", err))
			continue
		}
		srv.Module = module
		// The module must be runnable by the user its processes run as,
		// which is not scdd's (issue 19 item 22): say so now, at -check,
		// rather than as "permission denied" at each start.
		if uid, gid, _ := s.uapCredentials(&srv); uid >= 0 || gid >= 0 || os.Geteuid() != 0 {
			if err := procmgr.CheckModule(module, uid, gid); err != nil {
				bad = append(bad, srv.Errorf("module", "%v", err))
				continue
			}
		}
		if err := checkWorkDir(cfg, &srv); err != nil {
			bad = append(bad, err)
			continue
		}
		g := &Group{
			name:    srv.ServiceGroup,
			def:     srv,
			entries: make(map[string]string, len(srv.Services)),
			watch:   srv.WatchTime,
			log:     s.log,
			place:   opts.Place,
			expiry:  s.expiry,
			q: schedq.New[*request](schedq.Config{QueueSize: srv.QueueSize, Slots: srv.MaxProcesses,
				Resident: srv.Resident, Refresh: srv.RefreshProcess, Depth: callsPerProcess(&srv)}),
			slots: make([]slotState, srv.MaxProcesses),
		}
		g.rd.g = g
		g.classes.Store(wlm.NoClasses())
		g.serving.Store(opts.OnDemand == nil) // else from Start on
		for _, svc := range srv.Services {
			g.entries[svc.Name] = svc.Entry
		}
		s.admitCalls(g)
		s.groups[g.name] = g
		s.order = append(s.order, g)
	}
	switch len(bad) {
	case 0:
	case 1:
		return nil, bad[0]
	default:
		return nil, def.Errors(bad)
	}
	sort.Slice(s.order, func(i, j int) bool { return s.order[i].name < s.order[j].name })
	s.requests.share = s.requests.limit / int64(max(len(s.order), 1))
	opts.Metrics.NewGauge(`tpsched_admitted_request_bytes`, func() float64 { return float64(s.requests.held.Load()) })
	return s, nil
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
func (s *Scheduler) resolveModule(m string) (string, error) {
	if filepath.IsAbs(m) {
		return m, checkExecutable(m)
	}
	if filepath.Base(m) != m {
		p := filepath.Join(s.cfg.Dir, m)
		return p, checkExecutable(p)
	}
	var dirs []string
	if s.cfg.Dir != "" {
		dirs = append(dirs, filepath.Join(s.cfg.Dir, "aplib"))
	}
	dirs = append(dirs, s.opts.ModuleDirs...)
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

// SpinWhile makes the dispatcher spin for its processes only while free
// reports true (shm.Doorbells.SpinWhile): the node passes whether no task
// waits for a CPU, from the eBPF run queues. Call it before Start.
func (s *Scheduler) SpinWhile(free func() bool) { s.spinFree = free }

// Start makes every group's schedule queue and transport, starts its
// processes with pm and its reply reader, then the load checks and the
// expiry of calls. On error the caller stops what was started (Stop,
// Close).
func (s *Scheduler) Start(pm ProcessManager) error {
	s.pm = pm
	if s.opts.OnDemand != nil {
		// Start starts the groups one after another, and a UAP of one may
		// call another at once: a group that is not an application
		// environment takes calls from now on, which wait in its queue
		// until its processes run.
		for _, g := range s.order {
			g.serving.Store(!s.opts.OnDemand(g.name))
		}
	}
	if err := s.startDispatcher(); err != nil {
		return err
	}
	for _, g := range s.order {
		if err := s.startGroup(g); err != nil {
			return err
		}
	}
	if err := s.startLoadChecks(); err != nil {
		return err
	}
	s.wg.Add(1)
	go s.expireLoop()
	return nil
}

// startDispatcher makes the doorbells of the shared-memory groups and
// starts the one goroutine that reads them all (reader.go); startGroup
// gives it each group as the group starts.
func (s *Scheduler) startDispatcher() error {
	bells, err := shm.NewDoorbells()
	if err != nil {
		return err
	}
	s.bells = bells
	if s.spinFree != nil {
		bells.SpinWhile(s.spinFree)
	}
	s.readers.Store(new([]*reader))
	s.lastLook.Store(time.Now().UnixNano())
	s.opts.Metrics.NewGauge(`tpsched_dispatcher_last_look_age_seconds`, func() float64 {
		return s.lookAge(time.Now()).Seconds()
	})
	s.wg.Add(1)
	go func() { defer s.wg.Done(); s.dispatch() }()
	return nil
}

func (s *Scheduler) startGroup(g *Group) error {
	srv := &g.def
	env := srv.Env
	if srv.ReceiveFrom == def.ReceiveSocket {
		tr, err := sockmode.New(g.name, srv.MaxMessageSize)
		if err != nil {
			return fmt.Errorf("%s: %w", srv.File, err)
		}
		g.tr = transportOf[*sockmode.Proc]{tr}
		env = append(env[:len(env):len(env)], "TPSCHED_RECEIVE=socket")
	} else {
		sg, err := s.bells.NewGroup(g.name, srv.MaxMessageSize, srv.MaxProcesses, callsPerProcess(srv))
		if err != nil {
			return fmt.Errorf("%s: shared memory: %w", srv.File, err)
		}
		g.tr = transportOf[*shm.Proc]{sg}
	}
	set := s.opts.Metrics
	lbl := `{group="` + g.name + `"}`
	set.NewGauge(`tpsched_queue_depth`+lbl, func() float64 { return float64(g.stats().Waiting) })
	s.opts.CounterFunc(`tpsched_requests_queued_total`+lbl, func() uint64 { return g.stats().Queued })
	s.opts.CounterFunc(`tpsched_requests_processed_total`+lbl, func() uint64 { return g.stats().Processed })
	set.NewGauge(`tpsched_group_held`+lbl, func() float64 { return b2f(g.held.Load()) })
	s.startLoad(g)
	uid, gid, slotGIDs := s.uapCredentials(srv)
	dir, err := uapWorkDir(s.cfg, srv, uid, gid)
	if err != nil {
		s.log.Warn("the server's working directory could not be prepared; its processes start in /", "server", srv.Name, "err", err)
		dir = "/"
	}
	g.workDir = dir
	g.procs, err = s.startProcesses(g, procmgr.Spec{
		Server:       srv.Name,
		Group:        g.name,
		Module:       srv.Module,
		Env:          env,
		UID:          uid,
		GID:          gid,
		SlotGIDs:     slotGIDs,
		Resident:     srv.Resident,
		Max:          srv.MaxProcesses,
		BalanceCount: srv.BalanceCount,
		Priority:     srv.SchedulePriority,
		SharedCPU:    s.cfg.System.UAPCPUGroups == def.CPUGroupsPriority && srv.SchedulePriority == procmgr.DefaultPriority,
		Refresh:      srv.RefreshProcess,
		IdleStop:     srv.NonResidentIdle,
		CPUWaitLimit: srv.CPUWaitLimit,
		PidsMax:      uapPidsMax(srv),
		MemoryMax:    uapMemoryMax(srv),
		Dir:          dir,
	})
	if err != nil {
		return fmt.Errorf("%s: %w", srv.File, err)
	}
	// What the server's cgroups and output pipes saw, read at each scrape.
	set.NewGauge(`tpsched_uap_tasks`+lbl, func() float64 { return float64(g.procs.Limits().Pids) })
	s.opts.CounterFunc(`tpsched_uap_pids_limit_hits_total`+lbl, func() uint64 { return g.procs.Limits().PidsHits })
	set.NewGauge(`tpsched_uap_memory_bytes`+lbl, func() float64 { return float64(g.procs.Limits().Memory) })
	s.opts.CounterFunc(`tpsched_uap_oom_kills_total`+lbl, func() uint64 { return g.procs.Limits().OOMKills })
	s.opts.CounterFunc(`tpsched_uap_output_lines_total`+lbl, func() uint64 { return g.procs.Output().Lines })
	s.opts.CounterFunc(`tpsched_uap_output_dropped_lines_total`+lbl, func() uint64 { return g.procs.Output().Dropped })
	set.NewGauge(`tpsched_processes{group="`+g.name+`",kind="resident"}`, func() float64 {
		res, _ := g.procs.Running()
		return float64(res)
	})
	set.NewGauge(`tpsched_processes{group="`+g.name+`",kind="nonresident"}`, func() float64 {
		_, nonres := g.procs.Running()
		return float64(nonres)
	})
	g.started.Store(true)
	g.procs.Kick((*delegate)(g).Waiting()) // calls that came before (Group.submit)
	if srv.ReceiveFrom == def.ReceiveSocket {
		// A socket transport has a wait of its own.
		s.wg.Add(1)
		go func() { defer s.wg.Done(); g.rd.run(s.stop) }()
		return nil
	}
	// The dispatcher reads the group from its next look on. Not before
	// g.procs is set: what it finds goes to procmgr (deliver).
	g.rd.batches = make(map[call.Caller][]byte)
	rs := *s.readers.Load()
	rs = append(rs[:len(rs):len(rs)], &g.rd)
	s.readers.Store(&rs)
	// Its wait may be a quiet node's long one, begun before the group's
	// page was there to say that the reader sleeps: end it, so the next
	// says so on this page too and the look after it reads the group.
	s.bells.Interrupt()
	return nil
}

// admitCalls gives g what a call admitted to it uses before its
// processes run. Start starts the groups one after another, and a UAP of
// one may call another at once: every group takes calls from New on, and
// a call to one whose processes have not started waits in its queue.
func (s *Scheduler) admitCalls(g *Group) {
	set := s.opts.Metrics
	lbl := `{group="` + g.name + `"}`
	g.refused = set.NewCounter(`tpsched_requests_refused_total{reason="busy",group="` + g.name + `"}`)
	g.overBudget = set.NewCounter(`tpsched_requests_refused_total{reason="budget",group="` + g.name + `"}`)
	g.bytes.node = &s.requests
	g.timedOut = set.NewCounter(`tpsched_requests_timed_out_total` + lbl)
	g.terminated = set.NewCounter(`tpsched_requests_server_terminated_total` + lbl)
	g.misbehaved = set.NewCounter(`tpsched_uap_protocol_violations_total` + lbl)
	g.localCalls = set.NewCounter(`tpsched_local_calls_total` + lbl)
	g.stalls = set.NewCounter(`tpsched_local_call_stalls_total` + lbl)
	g.latency = newLatencyHistogram(set.NewPrometheusHistogramExt(`tpsched_request_duration_seconds`+lbl, requestDurationBuckets))
	g.lanes = newGroupLanes(&s.lanes, set, g.name)
}

// startProcesses starts g's processes: procmgr's; on a node whose servers
// may come and go (a service policy), a server that has its processes now
// or, for an application environment, none until StartServer.
func (s *Scheduler) startProcesses(g *Group, spec procmgr.Spec) (Processes, error) {
	if s.opts.OnDemand == nil {
		return s.pm.Start(spec, (*delegate)(g))
	}
	g.server = &server{g: g, pm: s.pm, spec: spec}
	if s.opts.OnDemand(g.name) {
		return g.server, nil
	}
	if err := g.server.start(); err != nil {
		return nil, err
	}
	g.serving.Store(true)
	return g.server, nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// expireLoop answers callers whose watch_time has passed, and watches for
// call cycles with too few processes and for a stalled dispatcher. On a
// quiet node it looks once every expireIdle: with no call in flight there
// is nothing to expire or to stall, and the first call's submit wakes it.
func (s *Scheduler) expireLoop() {
	defer s.wg.Done()
	s.expiry.Run(s.stop, func(now time.Time) {
		for _, g := range s.order {
			g.expire(now)
			g.checkStall(now)
		}
		s.checkDispatcher(now)
	}, func() bool { return s.InFlight() > 0 || s.lanes.open.Load() > 0 })
}

// expireEvery is how often expireLoop looks while calls are in flight, and
// so how late a call's timeout may be answered.
const expireEvery = 50 * time.Millisecond

// expireIdle is how often expireLoop looks on a quiet node (a variable for
// the test that makes it an hour).
var expireIdle = time.Second

// Route is the scheduler as the last stage of the node's lines: it takes
// every call, putting it on this node's queue of its group or answering
// why not.
func (s *Scheduler) Route(c call.Caller, _ call.From, f *netio.Frame) (bool, netio.Code, string) {
	code, msg := s.Serve(c, f)
	return true, code, msg
}

// Serve puts a call on this node's schedule queue of its group, or says
// why not (no such group here, no such service, held, no server here, too
// big, server busy). It runs on an event loop or a reply reader and never
// blocks.
func (s *Scheduler) Serve(c call.Caller, f *netio.Frame) (netio.Code, string) {
	g := s.groups[string(f.Group)]
	if g == nil {
		return netio.CodeNoSuchGroup, s.UnknownGroup(string(f.Group))
	}
	code, msg := g.admit(c, f, s.cfg.System.NodeID)
	if u, ok := c.(*uapCaller); ok && code == netio.CodeOK && s.opts.Lanes != nil && s.opts.Lanes() {
		g.offerLane(u, string(f.Service), time.Now())
	}
	return code, msg
}

// UnknownGroup names a group that is not here, with the nearest that is
// ("demoo (did you mean demo?)").
func (s *Scheduler) UnknownGroup(name string) string {
	return unknown(name, func() []string {
		out := make([]string, 0, len(s.order))
		for _, g := range s.order {
			out = append(out, g.name)
		}
		return out
	})
}

// unknown names what a call asked for that is not here, with the nearest
// name that is; names is asked only now, on the error path.
func unknown(name string, names func() []string) string {
	if s := def.Suggest(name, names()); s != "" {
		return name + " (did you mean " + s + "?)"
	}
	return name
}

// Hold stops a group from taking new calls ('service closed'); queued calls
// are still served. It reports whether that changed anything: only a
// change is logged.
func (s *Scheduler) Hold(name string) (changed bool, err error) { return s.setHeld(name, true) }

// Release lets a held group take calls again; it reports whether the
// group was held.
func (s *Scheduler) Release(name string) (changed bool, err error) { return s.setHeld(name, false) }

func (s *Scheduler) setHeld(name string, held bool) (bool, error) {
	g := s.groups[name]
	if g == nil {
		return false, &netio.Error{Code: netio.CodeNoSuchGroup, Message: name}
	}
	if g.held.Swap(held) == held {
		return false, nil
	}
	if held {
		g.mu.Lock()
		g.revokeLanes(time.Now(), revokeClosed) // a held group takes no call, on a lane neither
		g.mu.Unlock()
	}
	s.log.Info("service group "+map[bool]string{true: "held", false: "released"}[held], "group", name)
	return true, nil
}

// Groups are the groups defined here, by name.
func (s *Scheduler) Groups() []*Group { return s.order }

// Group is the group named name, if it is defined here.
func (s *Scheduler) Group(name string) (*Group, bool) {
	g, ok := s.groups[name]
	return g, ok
}

// InFlight counts the calls of every group waiting or held by a process.
func (s *Scheduler) InFlight() int {
	n := 0
	for _, g := range s.order {
		n += g.InFlight()
	}
	return n
}

// Stop stops taking calls and stops the processes: each group's queue
// closes (its processes leave once they hold no call) and the calls still
// waiting are answered 'node shutting down'; the processes are waited for
// until ctx ends (then killed, and waited for procmgr.KillWait more), and
// calls their exits put back in the queue are answered the same. The
// readers go on until Close, so the processes' last answers are delivered.
func (s *Scheduler) Stop(ctx context.Context) error {
	const why = "the node stopped before the call reached a process"
	for _, g := range s.order {
		if g.procs != nil {
			g.procs.Stopping() // their exits from here on are not crashes
		}
		// Even a group that never started: a UAP of another may have
		// called it.
		g.close() // the processes leave once they hold no call
		g.flush(netio.CodeShuttingDown, why)
	}
	// The servers stop side by side: each may wait procmgr.KillWait past
	// ctx for processes it killed, and one after another those waits
	// would add up past any stop bound the node gives.
	errs := make([]error, len(s.order))
	var wg sync.WaitGroup
	for i, g := range s.order {
		wg.Go(func() {
			if g.procs != nil {
				errs[i] = g.procs.Stop(ctx)
			}
			// A call the last processes were handed and never took went
			// back to the queue when they were reaped: nobody takes it now.
			g.flush(netio.CodeShuttingDown, why)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Close ends the scheduler's goroutines (readers, load and expiry loops)
// and unmaps the groups' shared memory; after Stop.
func (s *Scheduler) Close() error {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	if s.bells != nil {
		s.bells.Interrupt() // the dispatcher sees stop now, not at its wait's end
	}
	s.wg.Wait()
	var errs []error
	for _, g := range s.order {
		g.forgetProcesses()
		if g.tr != nil {
			errs = append(errs, g.tr.Unmap())
		}
	}
	if s.bells != nil {
		errs = append(errs, s.bells.Close())
		s.bells = nil
	}
	return errors.Join(errs...)
}
