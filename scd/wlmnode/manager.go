package wlmnode

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/bpf"
	"tpsched/netio"
	"tpsched/netio/rpcport"
	"tpsched/procmgr"
	"tpsched/scd/call"
	"tpsched/scd/def"
	"tpsched/scd/loadlevel"
	"tpsched/scd/names"
	"tpsched/scd/peers"
	"tpsched/scd/route"
	"tpsched/scd/wlm"
)

// Local is the node's groups as the routing manager sees them (scd/local's
// Scheduler, through the node).
type Local interface {
	Groups() []Group // every group defined here, by name
	Group(name string) (Group, bool)
	// Serve puts a call on this node's queue of its group (a parked call
	// whose server is here now); it never blocks.
	Serve(c call.Caller, f *netio.Frame) (netio.Code, string)
}

// Group is one group defined on this node (scd/local's Group): what the
// routing manager measures and changes of it.
type Group interface {
	Name() string
	Def() *def.Server
	Held() bool
	Serving() bool // it takes calls here: it has a server
	Level() loadlevel.Level
	InFlight() int
	Failure() error // why its processes cannot start now, if they cannot
	Usage() bpf.Usage
	SetCPUWeight(weight int) error
	// SetClasses makes classes the group's; TakeSamples returns their
	// figures since the last time (nil when they are not the group's).
	SetClasses(classes *wlm.Classes)
	TakeSamples(classes *wlm.Classes) []wlm.Sample
	// The server of an application environment: started when the cluster
	// chooses this node, stopped on quiesce, its processes replaced on
	// refresh. They block: the manager calls them from goroutines of its
	// own, with a ctx that ends when it closes.
	StartServer(ctx context.Context, deadline time.Time) error
	StopServer(ctx context.Context, quiesce time.Duration, flushMsg string) error
	SetServing(on bool)
	ReplaceProcesses(ctx context.Context, deadline time.Time) (int, error)
}

// Peers are the node's connections to the other nodes (scd/peers' Pool).
type Peers interface {
	Request(ctx context.Context, node, addr, service, group string, payload []byte, deadline time.Time) ([]byte, error)
	Send(node, addr string, c *peers.Call) (netio.Code, string)
}

// Options are what the manager needs of its node.
type Options struct {
	Self   string      // this node's id
	Dir    string      // the definition directory: svcpolicy is read again there
	Policy *def.Policy // svcpolicy as the node read it
	Log    *slog.Logger
	// Metrics is the node's /metrics; the manager's series read at scrape
	// time are WriteMetrics, which the node registers.
	Metrics     *metrics.Set
	BadRequests *metrics.Counter // tpsched_requests_refused_total{reason="protocol"}
	Local       Local
	Peers       Peers
	// Names is the cluster's name table (scd/cluster's Router.Names);
	// Alone says the node is in no cluster (the table stays empty).
	Names *names.Table
	Alone bool
	// Settled is closed once the name table has settled after the node
	// started (scd/cluster's Router.Settled); nil: settled from the start.
	// Until then the table may lack every node, this one too, and the
	// manager decides no start and answers no decide request on it.
	Settled <-chan struct{}
	// Addr is this node's advertised RPC address; Announce has the node
	// announce its state (its groups, and the manager's part: Announced).
	// Neither blocks for long.
	Addr     func() string
	Announce func()
	// MeasuresWaits reports whether the node's CPU meter sees run-queue
	// waits (eBPF).
	MeasuresWaits func() bool
	// Retries is scd_retry_of_comm_error; WatchTime sysconf's watch_time
	// (a parked call's deadline when neither it nor its group gives one).
	Retries   int
	WatchTime time.Duration
	// ProcStat is the file the CPUs' load is read from; "" /proc/stat.
	ProcStat string
}

// Manager is a node's routing manager (see the package comment).
type Manager struct {
	opts   Options
	log    *slog.Logger
	local  Local
	policy atomic.Pointer[activePolicy]
	load   *cpuSampler

	// measuring holds a token while a policy interval ends (interval,
	// measureNow): the CPU sampler and the groups' figures are one
	// interval's at a time. A channel, not a mutex, so that measureNow
	// waits for it no longer than its context allows.
	measuring chan struct{} // capacity 1

	mu        sync.Mutex // guards what follows, read by reports and /metrics
	classes   []classFigures
	groups    map[string]*groupFigures
	spare     [wlm.LeastImportant + 1]float64
	other     float64 // CPUs other programs used over the last interval (not the UAPs)
	loadErr   string  // why spare CPU is not measured, if it is not
	lastTick  time.Time
	decision  wlm.Decision
	lastGrow  GrowReport // the last ask for one more server, for the report
	intervals uint64
	last      wlmAnnounced // what the node announced last (report.go)
	// installed are the policy's classes of each group, as installed in
	// it; the interval takes its figures from the group with them.
	installed map[string]*wlm.Classes

	envs *envs

	// ctx ends when the manager closes: every goroutine of the manager
	// (wg) watches it, and every wait it makes. closing (under goMu)
	// starts no goroutine any more.
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	goMu    sync.Mutex
	closing bool
}

// New makes the routing manager of a node whose definitions have a
// service policy, and installs the policy's classes in every group.
func New(opts Options) (*Manager, error) {
	p, err := compilePolicy(opts.Policy)
	if err != nil {
		return nil, err
	}
	if opts.ProcStat == "" {
		opts.ProcStat = "/proc/stat"
	}
	w := &Manager{opts: opts, log: opts.Log, local: opts.Local, load: newCPUSampler(opts.ProcStat), groups: map[string]*groupFigures{},
		measuring: make(chan struct{}, 1)}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	w.install(&activePolicy{def: opts.Policy, p: p, since: time.Now()})
	w.envs = newEnvs(w)
	return w, nil
}

// IsEnvironment reports whether group is an application environment of
// the policy in force: its server starts only when the cluster chooses
// this node.
func (w *Manager) IsEnvironment(group string) bool { return w.envs.isEnv(group) }

// EnvironmentState is, for an application environment, this node's server
// of it: dormant, starting, serving, quiescing or dropped; "" for any other
// group (scdctl status).
func (w *Manager) EnvironmentState(group string) string {
	if !w.envs.isEnv(group) {
		return ""
	}
	return w.envs.localState(group)
}

// Start runs the policy interval and the environments' loop until Close.
func (w *Manager) Start() {
	if _, _, err := w.load.sample(); err != nil {
		w.log.Warn("spare cpu is not measured; other programs' use counts as none", "err", err)
	}
	w.mu.Lock()
	w.lastTick = time.Now()
	w.mu.Unlock()
	w.goTracked(func(ctx context.Context) {
		for {
			ap := w.policy.Load()
			t := time.NewTimer(ap.p.Interval)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case now := <-t.C:
				w.interval(now)
			}
		}
	})
	w.goTracked(w.envs.run)
}

// goTracked runs f on a goroutine of the manager, which Close waits for;
// f must return soon after ctx ends. Once Close began it runs nothing and
// returns false: a caller whose f would have answered someone answers
// 'node shutting down' itself (the entry points' closed check comes
// before and Close may begin in between).
func (w *Manager) goTracked(f func(ctx context.Context)) bool {
	w.goMu.Lock()
	defer w.goMu.Unlock()
	if w.closing {
		return false
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		f(w.ctx)
	}()
	return true
}

// conn is where the manager answers a lookup or request: the rpcport.Conn
// it came on (an interface, so tests can record the answers).
type conn interface {
	Send(b []byte) error // from any goroutine
	SendNow(b []byte)    // on the event loop
}

// Close ends the manager: its waits end, the calls still waiting for a
// server and the finds waiting for one are answered 'node shutting down',
// and every goroutine of it has returned when Close does. The node closes
// it as it stops, before its RPC port, so that those answers go out.
func (w *Manager) Close() {
	w.goMu.Lock()
	w.closing = true
	w.goMu.Unlock()
	w.cancel()
	w.envs.park.close()
	w.wg.Wait()
}

// closed reports whether Close began.
func (w *Manager) closed() bool {
	w.goMu.Lock()
	defer w.goMu.Unlock()
	return w.closing
}

// Route is the manager as a stage of the node's line: it takes the calls
// for groups that have no server here (parked.go).
func (w *Manager) Route(c call.Caller, from call.From, f *netio.Frame) (bool, netio.Code, string) {
	return w.envs.park.schedule(c, from, f)
}

// Parked is how many calls wait for a server of an application
// environment to start (or are being handed to it): the node's drain
// waits for them as for its queued calls, since Close answers them
// 'node shutting down'.
func (w *Manager) Parked() int { return w.envs.park.held() }

// AnswerFind answers a find server lookup (netio.LookupFind), on the
// event loop (find.go).
func (w *Manager) AnswerFind(c *rpcport.Conn, f *netio.Frame) {
	if w.closed() {
		c.SendNow(netio.AppendError(nil, f.ID, netio.CodeShuttingDown, ""))
		return
	}
	w.envs.answerFind(c, f)
}

// ServeRequest answers another node's request (one of Requests), on the
// event loop (requests.go).
func (w *Manager) ServeRequest(c *rpcport.Conn, f *netio.Frame) {
	if w.closed() {
		c.SendNow(netio.AppendError(nil, f.ID, netio.CodeShuttingDown, ""))
		return
	}
	if peers.Hop(c, f) == "" {
		w.opts.BadRequests.Inc()
		c.SendNow(netio.AppendError(nil, f.ID, netio.CodeProtocol, "routing manager requests are taken only from a node that proved the cluster key (peer hello)"))
		return
	}
	w.envs.serveRequest(c, f)
}

// NamesChanged tells the manager a peer changed the name table: it counts
// the servers it shows at once. It never blocks (the gossip calls it).
func (w *Manager) NamesChanged() { w.envs.poke() }

// piWindow is how many policy intervals a performance index is judged
// over: one quiet or noisy interval does not decide alone.
const piWindow = 3

// activePolicy is the service policy in force.
type activePolicy struct {
	def   *def.Policy
	p     *wlm.Policy
	since time.Time
}

// compilePolicy turns the definition into scd/wlm's policy.
func compilePolicy(d *def.Policy) (*wlm.Policy, error) {
	classes := make([]wlm.Class, len(d.Classes))
	for i, c := range d.Classes {
		g := wlm.Goal{Kind: wlm.GoalAverage, Target: c.ResponseTime}
		if c.Percent > 0 {
			g = wlm.Goal{Kind: wlm.GoalPercentile, Target: c.ResponseTime, Percent: c.Percent}
		}
		classes[i] = wlm.Class{Name: c.Name, Importance: c.Importance, Goal: g}
	}
	rules := make([]wlm.Rule, len(d.Rules))
	for i, r := range d.Rules {
		rules[i] = wlm.Rule{Group: r.Group, Service: r.Service, Class: r.Class}
	}
	p, err := wlm.NewPolicy(classes, d.DefaultClass, rules, d.Environments, d.Instances, d.Interval)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", d.File, err)
	}
	return p, nil
}

// classFigures are one class's figures on this node.
type classFigures struct {
	total   wlm.Sample  // since the policy came into force
	last    wlm.Sample  // the last interval
	window  *wlm.Window // the last piWindow intervals
	pi      float64     // over the window
	piKnown bool
}

// groupFigures are what the routing manager keeps of one group between
// intervals.
type groupFigures struct {
	windows           []*wlm.Window // by class
	lastCPU, lastWait time.Duration // the processes' usage at the last interval (it never goes back)
	base, weight      int           // CPU weight: from schedule_priority, and now
	delay             float64       // CPU delay over the last interval; -1 unknown
	pi                uint16        // announced: performance index x 100 over the window, 0 unknown
}

// install makes ap the policy in force: new classes for every group,
// figures from zero.
func (w *Manager) install(ap *activePolicy) {
	w.mu.Lock()
	w.classes = make([]classFigures, len(ap.p.Classes))
	for i := range w.classes {
		w.classes[i].window = wlm.NewWindow(piWindow)
	}
	for _, g := range w.local.Groups() {
		gf := w.groups[g.Name()]
		if gf == nil {
			base := procmgr.Weight(g.Def().SchedulePriority)
			gf = &groupFigures{base: base, weight: base, delay: -1}
			w.groups[g.Name()] = gf
		}
		gf.windows = make([]*wlm.Window, len(ap.p.Classes))
		for i := range gf.windows {
			gf.windows[i] = wlm.NewWindow(piWindow)
		}
		gf.pi = 0
	}
	classes := make(map[string]*wlm.Classes, len(w.local.Groups()))
	for _, g := range w.local.Groups() {
		classes[g.Name()] = wlm.NewClasses(ap.p, g.Name(), serviceNames(g))
	}
	w.installed = classes
	w.mu.Unlock()
	w.policy.Store(ap)
	for _, g := range w.local.Groups() {
		g.SetClasses(classes[g.Name()])
	}
}

// Steer drops from cands the nodes where group's calls are known to miss
// their goals while another candidate is known to meet them (wlm.Steer),
// so calls go towards the nodes that meet the goal. It keeps the order and
// works in place; with one candidate or none it does nothing. It is the
// cluster's steering (scd/cluster's Options.Steer), on the event loop.
func (w *Manager) Steer(group string, cands []route.Candidate) []route.Candidate {
	if len(cands) < 2 || len(cands) > 64 || !w.policy.Load().def.Manage {
		return cands
	}
	entries := w.opts.Names.Lookup(group)
	var goals [64]wlm.NodeGoal
	var keep [64]bool
	anyKnown := false
	for i, c := range cands {
		goals[i] = wlm.NodeGoal{}
		for _, e := range entries {
			if e.Node == c.Node {
				goals[i] = wlm.NodeGoal{PI: float64(e.PI) / 100, Known: e.PI > 0}
				anyKnown = anyKnown || e.PI > 0
				break
			}
		}
	}
	if !anyKnown {
		return cands
	}
	wlm.Steer(goals[:len(cands)], keep[:len(cands)])
	out := cands[:0]
	for i, c := range cands {
		if keep[i] {
			out = append(out, c)
		}
	}
	return out
}
