package rpcport

import (
	"fmt"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/panjf2000/gnet/v2"
)

// Receiver groups (OpenTP1's multi-scheduler groups): a Port runs one or
// more groups of receiving sockets. The default group is Options.Addr with
// Options.Loops sockets; Options.Receivers adds named groups, each on a port
// of its own. Every socket of a group shares its port through SO_REUSEPORT
// and has its own accept goroutine and gnet event loop; the Handler learns
// on which group a connection arrived from Conn.ReceiverGroup and decides
// what that group may take. Connections, the buffer budget and
// max_connections are the Port's, over every group.

// MaxReceivingSockets is the most receiving sockets a Port runs, all
// groups together (gnet's limit on event loops).
const MaxReceivingSockets = maxLoops

// ReceiverGroup is one named group of receiving sockets.
type ReceiverGroup struct {
	Name  string // not empty; the default group has the empty name
	Addr  string // host:port; port 0 picks a free port shared by the group's sockets
	Count int    // receiving sockets (event loops), 1..256 in all groups together
}

// Steerer places a receiver group's new connections among its sockets, in
// place of the kernel's 4-tuple hash (bpf.ReuseportSteering is one, an
// SK_REUSEPORT program). netio calls it once per group with two or more
// sockets, before any connection is accepted.
type Steerer interface {
	// Steer takes over choosing among fds, the group's listening sockets
	// in receiver order, and returns the load cells the event loops keep
	// up to date. An error leaves the kernel's hash in place; its text says
	// why (status and a metric show it).
	Steer(group string, fds []int) (Steered, error)
}

// Steered is a group under a Steerer.
type Steered interface {
	// Load returns receiver i's cells: calls in flight (read, not yet
	// answered), connections open, and bytes read per second lately.
	// netio keeps them.
	Load(i int) (inFlight, conns, readRate *atomic.Int64)
	// Release lets the sockets go, for another process's Steerer to take
	// (HandOff); until one does, the kernel's hash places connections.
	Release() error
	// Reattach steers the sockets again after another process had them (a
	// hand-off that was taken back: Resume).
	Reattach(fds []int) error
	// Close releases what the steering holds. The Load cells must stay
	// readable after it, with their last values: /metrics and /status
	// read them after the port stopped. The sockets keep whatever program
	// is attached until they close (another process's, after a hand-off).
	Close() error
	// Mechanism names what steers ("bpf").
	Mechanism() string
}

// Steering mechanisms as status shows them.
const (
	SteerHash = "hash" // the kernel's 4-tuple hash (SO_REUSEPORT without a program)
	SteerNone = "none" // a group of one socket: nothing to choose
)

// receiverGroup is a group of receiving sockets as the Port runs it.
type receiverGroup struct {
	name      string
	addr      string // host:port every socket listens on
	receivers []*receiver
	steered   Steered // nil: the kernel's hash
	mechanism string
	reason    string // why not a better mechanism; "" when the best is live
}

// receiver is one receiving socket with its accept goroutine and event loop.
type receiver struct {
	group *receiverGroup
	index int // within its group
	pos   int // within the Port (s.listeners, s.loops, s.lastTick)

	// inFlight, conns and readRate point at the Steerer's cells when one
	// steers the group, else at own*: the loops (and, for readRate, the
	// janitor) keep them either way.
	inFlight, conns, readRate          *atomic.Int64
	ownInFlight, ownConns, ownReadRate atomic.Int64
	accepted, calls, bytesRead         atomic.Uint64
	lastRead                           uint64 // janitor only: bytesRead at its last tick
}

func newReceiver(g *receiverGroup, index, pos int) *receiver {
	r := &receiver{group: g, index: index, pos: pos}
	r.inFlight, r.conns, r.readRate = &r.ownInFlight, &r.ownConns, &r.ownReadRate
	return r
}

// updateReadRates sets each receiver's read rate to the mean of what it was
// and what was read since the last call, dt ago: a rate that follows the
// load within a few janitor ticks. Janitor only.
func (s *Port) updateReadRates(dt time.Duration) {
	if dt <= 0 {
		return
	}
	for _, r := range s.rcv {
		total := r.bytesRead.Load()
		now := int64(float64(total-r.lastRead) / dt.Seconds())
		r.lastRead = total
		r.readRate.Store((r.readRate.Load() + now) / 2)
	}
}

// ReceiverGroup is the name of the receiver group the connection arrived
// on; "" for the default group.
func (c *Conn) ReceiverGroup() string { return c.rcv.group.name }

// Receiver is the index of the receiving socket (event loop) the
// connection arrived on, within its group.
func (c *Conn) Receiver() int { return c.rcv.index }

// ReceiverStats are one receiving socket's figures.
type ReceiverStats struct {
	Group    string `json:"receiver_group"` // "" for the default group
	Index    int    `json:"receiver"`
	Addr     string `json:"addr"`
	Conns    int64  `json:"connections"`
	Accepted uint64 `json:"accepted"`  // connections handed to it since Listen
	Calls    uint64 `json:"calls"`     // calls and name lookups read
	InFlight int64  `json:"in_flight"` // of them, not yet answered
	ReadRate int64  `json:"read_bytes_per_second"`
}

// SteeringStatus says how one receiver group's new connections are
// placed, and why not better.
type SteeringStatus struct {
	Group     string `json:"receiver_group"`
	Addr      string `json:"addr"`
	Receivers int    `json:"receivers"`
	Mechanism string `json:"mechanism"`        // "bpf", "hash" or "none"
	Reason    string `json:"reason,omitempty"` // why the better mechanism is not live
}

// Receivers returns every receiving socket's figures, group by group.
func (s *Port) Receivers() []ReceiverStats {
	out := make([]ReceiverStats, 0, len(s.rcv))
	for _, r := range s.rcv {
		out = append(out, ReceiverStats{
			Group: r.group.name, Index: r.index, Addr: r.group.addr,
			Conns: r.conns.Load(), Accepted: r.accepted.Load(), Calls: r.calls.Load(), InFlight: max(r.inFlight.Load(), 0),
			ReadRate: r.readRate.Load(),
		})
	}
	return out
}

// Steering says, per receiver group, how new connections are placed.
func (s *Port) Steering() []SteeringStatus {
	out := make([]SteeringStatus, 0, len(s.groups))
	for _, g := range s.groups {
		out = append(out, SteeringStatus{Group: g.name, Addr: g.addr, Receivers: len(g.receivers), Mechanism: g.mechanism, Reason: g.reason})
	}
	return out
}

// GroupAddr is the host:port of the named receiver group ("" is the
// default group); false when the Port has no such group.
func (s *Port) GroupAddr(name string) (string, bool) {
	for _, g := range s.groups {
		if g.name == name {
			return g.addr, true
		}
	}
	return "", false
}

// GroupSize is how many receiving sockets the named group has (0: none).
func (s *Port) GroupSize(name string) int {
	for _, g := range s.groups {
		if g.name == name {
			return len(g.receivers)
		}
	}
	return 0
}

// groupSpecs is every receiver group the options ask for, the default first.
func groupSpecs(opts Options) ([]ReceiverGroup, error) {
	loops := opts.Loops
	if loops <= 0 {
		loops = 1
	}
	specs := []ReceiverGroup{{Name: "", Addr: opts.Addr, Count: loops}}
	total := loops
	seen := map[string]bool{"": true}
	for _, g := range opts.Receivers {
		if g.Name == "" {
			return nil, fmt.Errorf("netio: listen: a receiver group on %s has no name", g.Addr)
		}
		if seen[g.Name] {
			return nil, fmt.Errorf("netio: listen: receiver group %q given twice", g.Name)
		}
		seen[g.Name] = true
		if g.Count <= 0 {
			return nil, fmt.Errorf("netio: listen: receiver group %q: %d receivers", g.Name, g.Count)
		}
		total += g.Count
		specs = append(specs, g)
	}
	if total > maxLoops {
		return nil, fmt.Errorf("netio: listen %s: %d receiving sockets in all, at most %d", opts.Addr, total, maxLoops)
	}
	return specs, nil
}

// steer puts the group under s's Steerer, or says why the hash stays.
func (s *Port) steer(g *receiverGroup, st Steerer) {
	if len(g.receivers) < 2 {
		g.mechanism = SteerNone
		return
	}
	g.mechanism = SteerHash
	if st == nil {
		g.reason = "no steering program was asked for"
		return
	}
	fds, err := s.groupFDs(g)
	if err != nil {
		g.reason = err.Error()
		return
	}
	steered, err := st.Steer(g.name, fds)
	if err != nil {
		g.reason = err.Error()
		s.log.Warn("netio: new connections are placed by the kernel's hash", "receiver_group", groupLabel(g.name), "addr", g.addr, "why", err)
		return
	}
	g.steered, g.mechanism = steered, steered.Mechanism()
	for i, r := range g.receivers {
		r.inFlight, r.conns, r.readRate = steered.Load(i) // before any accept: all 0 on either side
	}
}

// groupFDs are the descriptors of g's listening sockets, in receiver order.
func (s *Port) groupFDs(g *receiverGroup) ([]int, error) {
	fds := make([]int, len(g.receivers))
	for i, r := range g.receivers {
		raw, err := s.listeners[r.pos].SyscallConn()
		if err == nil {
			err = raw.Control(func(fd uintptr) { fds[i] = int(fd) })
		}
		if err != nil {
			return nil, fmt.Errorf("listening socket %d: %w", i, err)
		}
	}
	return fds, nil
}

// groupLabel is a receiver group's name in logs and metric labels.
func groupLabel(name string) string {
	if name == "" {
		return "default"
	}
	return name
}

// registerReceiverMetrics adds the per-receiver series to set. The
// counters live in the receivers' atomics (Stats reads them too), so they
// are written at each scrape through a Set of their own: a counter read
// from elsewhere stays a counter, not a gauge.
func (s *Port) registerReceiverMetrics(set *metrics.Set) {
	for _, r := range s.rcv {
		lbl := receiverLabels(r)
		set.GetOrCreateGauge(`tpsched_receiver_connections`+lbl, func() float64 { return float64(r.conns.Load()) })
		set.GetOrCreateGauge(`tpsched_receiver_in_flight`+lbl, func() float64 { return float64(max(r.inFlight.Load(), 0)) })
		set.GetOrCreateGauge(`tpsched_receiver_read_bytes_per_second`+lbl, func() float64 { return float64(r.readRate.Load()) })
	}
	for _, g := range s.groups {
		set.GetOrCreateGauge(`tpsched_receiver_steering{receiver_group="`+groupLabel(g.name)+`",mechanism="`+g.mechanism+`"}`,
			func() float64 { return 1 })
	}
	if len(s.rcv) == 0 {
		return
	}
	set.RegisterMetricsWriter(func(w io.Writer) {
		scraped := metrics.NewSet()
		for _, r := range s.rcv {
			lbl := receiverLabels(r)
			scraped.NewCounter(`tpsched_receiver_accepted_total` + lbl).Set(r.accepted.Load())
			scraped.NewCounter(`tpsched_receiver_calls_total` + lbl).Set(r.calls.Load())
		}
		scraped.WritePrometheus(w)
	})
}

func receiverLabels(r *receiver) string {
	return `{receiver_group="` + groupLabel(r.group.name) + `",receiver="` + strconv.Itoa(r.index) + `"}`
}

// engineOf makes the gnet client of receiver r.
func (s *Port) engineOf(r *receiver) (*gnet.Client, error) {
	cli, err := gnet.NewClient(&engineHandler{s: s, r: r},
		gnet.WithNumEventLoop(1),
		gnet.WithTCPNoDelay(gnet.TCPNoDelay),
		gnet.WithTicker(true), // the heartbeat that says the loop's engine still runs
		gnet.WithLogger(gnetLogger{s.log}),
	)
	if err == nil {
		err = cli.Start()
	}
	return cli, err
}

// listenerPort is the port a listener is bound to.
func listenerPort(ln *net.TCPListener) int { return ln.Addr().(*net.TCPAddr).Port }
