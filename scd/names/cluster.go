package names

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// This file joins the table to the other nodes: membership and failure
// detection come from memberlist; announces travel as memberlist user
// messages (piggybacked on its gossip) and in its push/pull state syncs.
//
// Every node relays an announce it had not seen yet, so one reaches all
// nodes in a few gossip rounds instead of only the originator's
// retransmits. An announce is applied only while memberlist counts its
// node alive: a stale one relayed after the node died cannot bring it back.

// ClusterConfig says how to join the other nodes.
type ClusterConfig struct {
	Self     string   // this node's node_id: its memberlist name
	BindAddr string   // address for the name port; "0.0.0.0" lets memberlist choose what to advertise
	Port     int      // name_port; 0 picks a free one
	Seeds    []string // host:port of the other nodes' name ports (all_node)
	Key      []byte   // cluster_key; nil: announces are not authenticated
	// Refresh is how often this node announces even without a change;
	// default 20 s (the documents ask for at least every 30 s).
	Refresh time.Duration
	// Fast tunes failure detection for one host or a quiet LAN: probes
	// every 200 ms instead of 1 s. Tests use it.
	Fast   bool
	Logger *slog.Logger
	// OnChange is called after the table changed because of a peer; it
	// must not block (memberlist's receive loop is waiting).
	OnChange func()
}

// ClusterStats are the announce counters for status and /metrics.
type ClusterStats struct {
	Members   int               `json:"members"`
	Sent      uint64            `json:"announces_sent"`      // own announces queued
	Received  uint64            `json:"announces_received"`  // announces applied, relays included
	BytesSent uint64            `json:"announce_bytes_sent"` // user-message bytes handed to gossip
	Dropped   map[string]uint64 `json:"announces_dropped"`   // by reason
	Trusted   bool              `json:"peers_trusted_blindly"`
}

// Cluster is this node's membership and announcer.
type Cluster struct {
	cfg   ClusterConfig
	log   *slog.Logger
	table *Table
	codec *Codec
	ml    *memberlist.Memberlist
	queue *memberlist.TransmitLimitedQueue

	announceMu sync.Mutex // orders Announce calls; never taken in memberlist's callbacks
	mu         sync.Mutex // guards self, alive, addrs, latest; never held while calling memberlist
	self       NodeInfo
	alive      map[string]bool // memberlist's view
	// addrs are the members' addresses as memberlist's callbacks gave
	// them, under its node lock: the nodes Members returns are its own,
	// rewritten in place when an alive message comes, so reading their
	// addresses later races with it (hashicorp/memberlist#306).
	addrs  map[string]string
	latest map[string][]byte // the newest authenticated announce of each node, as received
	port   int               // the name port, as memberlist bound it

	sent, received, bytesSent atomic.Uint64
	dropMu                    sync.Mutex
	dropped                   map[string]uint64
	warnedFull                map[string]bool

	stop      chan struct{}
	wg        sync.WaitGroup
	leaveOnce sync.Once
}

// Drop reasons.
const (
	DropAuth      = "unauthenticated"
	DropMalformed = "malformed"
	DropFull      = "table_full"
	DropInvalid   = "invalid"
)

// Join starts membership on the name port and keeps trying the seeds in
// the background: nodes may start in any order.
func Join(cfg ClusterConfig, table *Table, self NodeInfo) (*Cluster, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Refresh == 0 {
		cfg.Refresh = 20 * time.Second
	}
	c := &Cluster{
		cfg: cfg, log: cfg.Logger, table: table, codec: NewCodec(cfg.Key),
		alive: map[string]bool{cfg.Self: true}, addrs: map[string]string{}, latest: map[string][]byte{},
		dropped: map[string]uint64{}, warnedFull: map[string]bool{},
		stop: make(chan struct{}),
	}
	self.Node, self.Boot, self.Seq = cfg.Self, uint64(time.Now().UnixNano()), 0
	c.self = self

	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.Self
	mc.BindAddr, mc.BindPort = cfg.BindAddr, cfg.Port
	mc.AdvertisePort = cfg.Port
	if ip := net.ParseIP(cfg.BindAddr); ip != nil && !ip.IsUnspecified() {
		mc.AdvertiseAddr = cfg.BindAddr
	}
	mc.Delegate, mc.Events = (*delegate)(c), (*events)(c)
	mc.Logger = log.New(&logAdapter{c: c}, "", 0)
	if len(cfg.Key) > 0 {
		// memberlist's own gossip (membership: alive, suspect, dead) is
		// encrypted and authenticated with a key derived from cluster_key,
		// so a node without it can neither join nor declare others dead.
		k := sha256.Sum256(append([]byte("tpsched memberlist\x00"), cfg.Key...))
		mc.SecretKey = k[:]
	}
	mc.GossipInterval, mc.GossipNodes = 100*time.Millisecond, 4
	mc.PushPullInterval = 15 * time.Second
	// Probes keep memberlist's LAN timing (every 1 s, 500 ms timeout): a
	// shorter timeout made busy nodes declare each other dead (seen with
	// 128 members on two cores).
	if cfg.Fast {
		mc.ProbeInterval, mc.ProbeTimeout, mc.SuspicionMult = 200*time.Millisecond, 100*time.Millisecond, 3
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("name port %s: %w", net.JoinHostPort(cfg.BindAddr, strconv.Itoa(cfg.Port)), err)
	}
	c.ml, c.port = ml, int(ml.LocalNode().Port)
	c.queue = &memberlist.TransmitLimitedQueue{NumNodes: ml.NumMembers, RetransmitMult: mc.RetransmitMult}
	c.Announce(self)
	c.wg.Add(1)
	go c.run()
	return c, nil
}

// Port is the name port memberlist listens on.
func (c *Cluster) Port() int { return c.port }

// Trusted reports whether peers are trusted blindly (no cluster_key).
func (c *Cluster) Trusted() bool { return !c.codec.Authenticated() }

// Announce tells every node this node's groups now. Callers pass the whole
// state; the cluster numbers it.
//
// Lock order: memberlist calls NotifyJoin and NotifyLeave, which take mu,
// with its node lock held, and GetBroadcasts asks for the member count
// (node lock) with the broadcast queue's lock held. So mu is never held
// while calling into memberlist, or the three make a cycle (seen in the
// 128-node bench); announceMu, which memberlist's callbacks never take,
// keeps announces queued in the order they are numbered.
func (c *Cluster) Announce(info NodeInfo) {
	c.announceMu.Lock()
	defer c.announceMu.Unlock()
	c.mu.Lock()
	info.Node, info.Boot, info.Seq = c.self.Node, c.self.Boot, c.self.Seq+1
	c.self = info
	raw := c.codec.Encode(nil, info)
	c.latest[info.Node] = raw
	c.mu.Unlock()
	if _, err := c.table.Apply(info); err != nil {
		c.log.Error("own announce refused by the name table", "err", err)
	}
	c.sent.Add(1)
	c.queue.QueueBroadcast(announce{node: info.Node, msg: raw})
}

// reannounce sends this node's current state again.
func (c *Cluster) reannounce() {
	c.mu.Lock()
	self := c.self
	c.mu.Unlock()
	c.Announce(self)
}

// run re-announces periodically and retries the seeds that are not members.
func (c *Cluster) run() {
	defer c.wg.Done()
	c.joinSeeds()
	refresh := time.NewTicker(c.cfg.Refresh)
	defer refresh.Stop()
	rejoin := time.NewTicker(2 * time.Second)
	defer rejoin.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-refresh.C:
			c.reannounce()
		case <-rejoin.C:
			c.joinSeeds()
		}
	}
}

// joinSeeds asks every seed that is not a member now to let us in.
func (c *Cluster) joinSeeds() {
	members := map[string]bool{}
	c.mu.Lock()
	for _, a := range c.addrs {
		members[a] = true
	}
	c.mu.Unlock()
	var want []string
	for _, s := range c.cfg.Seeds {
		if !members[s] {
			want = append(want, s)
		}
	}
	if len(want) == 0 {
		return
	}
	if n, err := c.ml.Join(want); err != nil && n == 0 {
		c.log.Debug("name port: no seed answered yet", "seeds", want, "err", err)
	}
}

// Stats reports the announce counters.
func (c *Cluster) Stats() ClusterStats {
	st := ClusterStats{
		Members: c.ml.NumMembers(), Sent: c.sent.Load(), Received: c.received.Load(),
		BytesSent: c.bytesSent.Load(), Dropped: map[string]uint64{}, Trusted: c.Trusted(),
	}
	c.dropMu.Lock()
	for k, v := range c.dropped {
		st.Dropped[k] = v
	}
	c.dropMu.Unlock()
	return st
}

// Stop stops without telling the others: they keep this node in their
// tables until a new process with the same node id and address takes its
// place (a restart that hands the node over) or failure detection drops
// it. Calls after the first, or after Leave, do nothing.
func (c *Cluster) Stop() error {
	err := errors.New("names: cluster already left")
	c.leaveOnce.Do(func() {
		close(c.stop)
		err = c.ml.Shutdown()
		c.wg.Wait()
	})
	return err
}

// Leave tells the others this node is going and stops. Calls after the
// first do nothing.
func (c *Cluster) Leave(timeout time.Duration) error {
	err := errors.New("names: cluster already left")
	c.leaveOnce.Do(func() {
		close(c.stop)
		err = c.ml.Leave(timeout)
		err = errors.Join(err, c.ml.Shutdown())
		c.wg.Wait()
	})
	return err
}

func (c *Cluster) drop(reason string, err error) {
	c.dropMu.Lock()
	c.dropped[reason]++
	n := c.dropped[reason]
	c.dropMu.Unlock()
	if n&(n-1) == 0 { // 1, 2, 4, 8...: loud enough, never a flood
		c.log.Warn("peer announce dropped", "reason", reason, "count", n, "err", err)
	}
}

// receive decodes, authenticates and applies one announce; relay says
// whether to pass it on.
func (c *Cluster) receive(msg []byte, relay bool) {
	info, err := c.codec.Decode(msg)
	switch {
	case errors.Is(err, ErrUnauthenticated):
		c.drop(DropAuth, err)
		return
	case err != nil:
		c.drop(DropMalformed, err)
		return
	}
	if info.Node == c.cfg.Self {
		return // our own, relayed back
	}
	raw := bytes.Clone(msg)
	c.mu.Lock()
	if old, ok := c.latest[info.Node]; ok && !newer(info, old, c.codec) {
		c.mu.Unlock()
		return
	}
	c.latest[info.Node] = raw
	alive := c.alive[info.Node]
	c.mu.Unlock()
	if !alive {
		return // applied when memberlist says it joined
	}
	c.apply(info)
	if relay {
		c.queue.QueueBroadcast(announce{node: info.Node, msg: raw})
	}
}

func (c *Cluster) apply(info NodeInfo) {
	changed, err := c.table.Apply(info)
	switch {
	case errors.Is(err, ErrFull):
		c.dropMu.Lock()
		c.dropped[DropFull]++
		warn := !c.warnedFull[info.Node]
		c.warnedFull[info.Node] = true
		c.dropMu.Unlock()
		if warn {
			c.log.Error("node refused", "err", err)
		}
		return
	case err != nil:
		c.drop(DropInvalid, err)
		return
	}
	c.received.Add(1)
	if changed && c.cfg.OnChange != nil {
		c.cfg.OnChange()
	}
}

// newer reports whether info is newer than the announce old.
func newer(info NodeInfo, old []byte, codec *Codec) bool {
	prev, err := codec.Decode(old)
	if err != nil {
		return true
	}
	return info.Boot > prev.Boot || (info.Boot == prev.Boot && info.Seq > prev.Seq)
}

// announce is a queued broadcast: only the newest of a node is kept.
type announce struct {
	node string
	msg  []byte
}

func (a announce) Name() string    { return a.node }
func (a announce) Message() []byte { return a.msg }
func (a announce) Finished()       {}
func (a announce) Invalidates(o memberlist.Broadcast) bool {
	nb, ok := o.(memberlist.NamedBroadcast)
	return ok && nb.Name() == a.node
}

// delegate is the Cluster as memberlist's Delegate.
type delegate Cluster

func (d *delegate) NodeMeta(limit int) []byte { return nil }

func (d *delegate) NotifyMsg(b []byte) { (*Cluster)(d).receive(b, true) }

func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	out := d.queue.GetBroadcasts(overhead, limit)
	for _, b := range out {
		d.bytesSent.Add(uint64(len(b)))
	}
	return out
}

// LocalState is every announce this node holds, so one push/pull teaches
// a joining node the whole table.
func (d *delegate) LocalState(join bool) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []byte
	for _, raw := range d.latest {
		out = binary.AppendUvarint(out, uint64(len(raw)))
		out = append(out, raw...)
	}
	return out
}

func (d *delegate) MergeRemoteState(buf []byte, join bool) {
	for len(buf) > 0 {
		n, k := binary.Uvarint(buf)
		if k <= 0 || uint64(len(buf)-k) < n {
			(*Cluster)(d).drop(DropMalformed, errors.New("push/pull state: bad length"))
			return
		}
		(*Cluster)(d).receive(buf[k:k+int(n)], false)
		buf = buf[k+int(n):]
	}
}

// events is the Cluster as memberlist's EventDelegate.
type events Cluster

func (e *events) NotifyJoin(n *memberlist.Node) {
	c := (*Cluster)(e)
	c.mu.Lock()
	c.addrs[n.Name] = n.Address()
	c.mu.Unlock()
	if n.Name == c.cfg.Self {
		return // memberlist.Create tells us of ourselves before c is complete
	}
	c.mu.Lock()
	c.alive[n.Name] = true
	raw := c.latest[n.Name]
	c.mu.Unlock()
	if raw != nil {
		if info, err := c.codec.Decode(raw); err == nil {
			c.apply(info)
		}
	}
	// Gossip reaches a newcomer only by chance until the next push/pull
	// (15 s), so tell it our state directly, off memberlist's goroutine.
	c.mu.Lock()
	own := c.latest[c.cfg.Self]
	c.mu.Unlock()
	node := *n
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		if err := c.ml.SendReliable(&node, own); err != nil {
			c.log.Debug("announce to a newcomer", "node", node.Name, "err", err)
		}
	}()
}

func (e *events) NotifyLeave(n *memberlist.Node) {
	c := (*Cluster)(e)
	if n.Name == c.cfg.Self {
		return
	}
	c.mu.Lock()
	delete(c.alive, n.Name)
	delete(c.addrs, n.Name)
	c.mu.Unlock()
	if c.table.Remove(n.Name) {
		c.log.Info("node left or died", "node", n.Name, "addr", n.Address())
		if c.cfg.OnChange != nil {
			c.cfg.OnChange()
		}
	}
}

func (e *events) NotifyUpdate(n *memberlist.Node) {
	c := (*Cluster)(e)
	c.mu.Lock()
	if _, ok := c.addrs[n.Name]; ok {
		c.addrs[n.Name] = n.Address()
	}
	c.mu.Unlock()
}

// logAdapter puts memberlist's log lines into the node's log at debug
// level, its warnings and errors at warn. memberlist has no hook for
// packets that fail to decrypt, only this log line; each counts as a
// dropped unauthenticated message, beside the announces our codec drops.
type logAdapter struct{ c *Cluster }

func (l *logAdapter) Write(p []byte) (int, error) {
	msg := string(bytes.TrimSpace(p))
	lower := bytes.ToLower(p)
	switch {
	case bytes.Contains(p, []byte("[ERR]")) && bytes.Contains(lower, []byte("crypt")):
		// "Decrypt packet failed", "No installed keys could decrypt",
		// "remote state is (not) encrypted": a peer without our key.
		l.c.drop(DropAuth, errors.New(msg))
	case bytes.Contains(p, []byte("[ERR]")), bytes.Contains(p, []byte("[WARN]")):
		l.c.log.Warn("memberlist", "msg", msg)
	default:
		l.c.log.Debug("memberlist", "msg", msg)
	}
	return len(p), nil
}
