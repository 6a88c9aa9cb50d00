package names

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"math"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// This file joins the table to the other nodes: membership and failure
// detection come from memberlist; announces travel as memberlist user
// messages and in its push/pull state syncs.
//
// A change travels by the finger relay: a node that announces a change,
// or whose table an announce from a peer changed, sends it at once to its
// fingers, the live members 1, 2, 4, ... places after it on the ring of
// members sorted by name (ceil(log2 n) of them). Every member is some sum
// of powers of two after the originator, so with one view of the
// membership every member is reached, within log2 n hops, by ceil(log2 n)
// paths at once; a member that misses a copy has others coming. A node
// relays only what changed its table, so each change costs each member
// ceil(log2 n) messages, and duplicates die where they land.
//
// Every own announce also goes into memberlist's broadcast queue, which
// piggybacks it on gossip and probes to RetransmitMult x ceil(log10(n+1))
// random members: the periodic refresh (which changes nothing, so nobody
// relays it) travels only this way, so a refresh costs the cluster
// O(log n) messages, not a relay per member. Push/pull syncs carry the
// whole table and repair what a lost packet left behind.
//
// An announce is applied only while memberlist counts its node alive: a
// stale one relayed after the node died cannot bring it back.

// GossipConfig says how to join the other nodes.
type GossipConfig struct {
	Self     string   // this node's node_id: its memberlist name
	BindAddr string   // address for the name port; "0.0.0.0" lets memberlist choose what to advertise
	Port     int      // name_port; 0 picks a free one
	Seeds    []string // host:port of the other nodes' name ports (all_node)
	Key      []byte   // cluster_key; nil: announces are not authenticated
	// Refresh is how often this node announces even without a change;
	// default 20 s (the documents ask for at least every 30 s).
	Refresh time.Duration
	// State, when set, builds this node's state for the refresh (under
	// the lock that numbers announces, like AnnounceFunc's build), so a
	// change whose own announce was lost (made before the node joined)
	// goes out at the next refresh. Nil: the refresh sends the state
	// announced last again.
	State func() NodeInfo
	// Detector is the failure detection's timing; zero: LANDetector, or
	// FastDetector with Fast (detector.go).
	Detector Detector
	// Fast is FastDetector, for tests and one-host clusters, when Detector
	// is zero.
	Fast   bool
	Logger *slog.Logger
	// OnChange is called after the table changed because of a peer; it
	// must not block (memberlist's receive loop is waiting).
	OnChange func()
	// OnLeave is called when memberlist finds a node dead or left, from
	// its goroutine with its lock held: it must not block. The peer pool
	// drops its connections to the node there (peers.Pool.NodeLeft).
	OnLeave func(node string)
	// Transport is the name port bound ahead (ListenTransport) or taken
	// over (TransportFromFiles); Join owns it from then on. Nil: Join binds
	// BindAddr and Port itself.
	Transport *Transport
}

// GossipStats are the announce counters for status and /metrics.
type GossipStats struct {
	Members  int    `json:"members"`
	Sent     uint64 `json:"announces_sent"`     // own announces
	Received uint64 `json:"announces_received"` // announces applied, relays included
	Relayed  uint64 `json:"announces_relayed"`  // peers' changes this node passed on to its fingers
	// Announce messages and their bytes handed to memberlist: own and
	// relayed, gossiped, pushed to fingers or sent to newcomers; without
	// memberlist's own headers.
	MessagesSent uint64            `json:"announce_messages_sent"`
	BytesSent    uint64            `json:"announce_bytes_sent"`
	Dropped      map[string]uint64 `json:"announces_dropped"` // by reason
	Trusted      bool              `json:"peers_trusted_blindly"`
}

// Gossip is this node's membership and announcer.
type Gossip struct {
	cfg   GossipConfig
	log   *slog.Logger
	table *Table
	codec *Codec
	// transport is the name port's sockets (transport.go).
	transport *Transport
	queue     *memberlist.TransmitLimitedQueue

	announceMu sync.Mutex // orders Announce calls; never taken in memberlist's callbacks
	mu         sync.Mutex // guards the fields below it; never held while calling memberlist
	self       NodeInfo
	peers      map[string]memberlist.Node // memberlist's live members but this node, by name (copies made under its lock)
	ring       []string                   // the live members' names, this node's included, sorted; nil: rebuild
	latest     map[string][]byte          // the newest authenticated announce of this node and of each live member, as received
	early      map[string][]byte          // the newest of nodes not alive now (not joined yet, or left): at most MaxNodes (rememberEarly)
	unrelayed  map[string]bool            // nodes whose early announce came by gossip before they were alive: relay it when they are
	pending    map[string][]byte          // changes waiting for the pusher, the newest of each node
	wake       chan struct{}              // tells the pusher that pending has something (capacity 1)
	stopping   bool                       // Stop or Leave is waiting for the goroutines: start no more
	outliving  bool                       // outlive's announce is on its way
	outlived   time.Time                  // when outlive last moved the Boot on
	namesake   time.Time                  // when outlive last said another live node has this node's name
	told       map[string]time.Time       // live nodes last sent their newer announce (tellOfNewerLocked)
	port       int                        // the name port, as memberlist bound it

	sent, received, relayed, msgsSent, bytesSent atomic.Uint64
	newcomerMsgs                                 atomic.Uint64 // of msgsSent: own announces sent to newcomers

	dropMu     sync.Mutex
	dropped    map[string]uint64
	warnedFull map[string]bool // live nodes the full table refused, said once each

	ml      *memberlist.Memberlist // set once Create returns; callbacks wait for ready before they use it
	members atomic.Pointer[memberlist.Memberlist]
	ready   chan struct{} // closed once ml is set and this node has announced
	// joined is closed once this node's first join has asked every seed
	// (joinSeeds' first round ended).
	joined chan struct{}

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
func Join(cfg GossipConfig, table *Table, self NodeInfo) (*Gossip, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Refresh == 0 {
		cfg.Refresh = 20 * time.Second
	}
	c := newGossip(cfg, table)
	self.Node, self.Boot, self.Seq = cfg.Self, uint64(time.Now().UnixNano()), 0
	c.self = self

	t := cfg.Transport
	if t == nil {
		var err error
		if t, err = ListenTransport(cfg.BindAddr, cfg.Port); err != nil {
			return nil, err
		}
	}
	c.transport = t
	t.run(c.log)
	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.Self
	mc.Transport = t
	mc.BindAddr, mc.BindPort = cfg.BindAddr, t.Port()
	mc.AdvertiseAddr, mc.AdvertisePort = advertiseAddr(cfg.BindAddr), t.Port()
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
	// Probes keep memberlist's LAN timing (every 1 s, 500 ms timeout) by
	// default: a shorter timeout made busy nodes declare each other dead
	// (seen with 128 members on two cores, and in issue 30's network tests).
	det := cfg.Detector
	if det == (Detector{}) {
		det = LANDetector
		if cfg.Fast {
			det = FastDetector
		}
	}
	det.apply(mc)
	c.queue.RetransmitMult = mc.RetransmitMult
	// memberlist answers peers from inside Create: a node that has this
	// one in its all_node may join it before Create returns, and its
	// callbacks then run before c.ml is set (a 32-node start crashed so).
	// They find the queue and the maps ready; what needs c.ml waits for
	// ready, closed once c.ml is set and the first announce made.
	ml, err := memberlist.Create(mc)
	if err != nil {
		close(c.stop)
		_ = t.Shutdown()
		return nil, fmt.Errorf("name port %s: %w", net.JoinHostPort(cfg.BindAddr, strconv.Itoa(t.Port())), err)
	}
	c.ml = ml
	c.port = int(ml.LocalNode().Port)
	c.members.Store(ml)
	c.Announce(self)
	close(c.ready)
	c.wg.Add(2)
	go c.run()
	go c.pusher()
	return c, nil
}

// newGossip is a Gossip before its memberlist starts: everything
// memberlist's callbacks touch is in place.
func newGossip(cfg GossipConfig, table *Table) *Gossip {
	c := &Gossip{
		cfg: cfg, log: cfg.Logger, table: table, codec: NewCodec(cfg.Key),
		peers: map[string]memberlist.Node{}, latest: map[string][]byte{}, early: map[string][]byte{}, unrelayed: map[string]bool{},
		pending: map[string][]byte{}, wake: make(chan struct{}, 1),
		dropped: map[string]uint64{}, warnedFull: map[string]bool{}, told: map[string]time.Time{},
		stop: make(chan struct{}), ready: make(chan struct{}), joined: make(chan struct{}),
	}
	c.queue = &memberlist.TransmitLimitedQueue{NumNodes: c.numMembers, RetransmitMult: memberlist.DefaultLANConfig().RetransmitMult}
	return c
}

// numMembers is memberlist's count of live members; 1 (this node) before
// it has started.
func (c *Gossip) numMembers() int {
	if ml := c.members.Load(); ml != nil {
		return ml.NumMembers()
	}
	return 1
}

// Port is the name port memberlist listens on.
func (c *Gossip) Port() int { return c.port }

// Transport is the name port's sockets, for a process that takes the node
// over (Transport.Files).
func (c *Gossip) Transport() *Transport { return c.transport }

// Trusted reports whether peers are trusted blindly (no cluster_key).
func (c *Gossip) Trusted() bool { return !c.codec.Authenticated() }

// Announce tells every node this node's groups now. Callers pass the whole
// state; the cluster numbers it. A caller whose state may change while it
// announces (another goroutine announcing too) uses AnnounceFunc: with
// Announce, a state built before another caller's newer one can be
// numbered after it and overwrite it everywhere.
func (c *Gossip) Announce(info NodeInfo) {
	c.AnnounceFunc(func() NodeInfo { return info })
}

// AnnounceFunc tells every node the state build returns. build runs under
// the lock that numbers announces, so the announce numbered last holds the
// state read last: an older state never goes out under a newer number (a
// hold announced at once with a level change was overwritten so). build
// must not block nor announce.
//
// Lock order: memberlist calls NotifyJoin and NotifyLeave, which take mu,
// with its node lock held, and GetBroadcasts asks for the member count
// (node lock) with the broadcast queue's lock held. So mu is never held
// while calling into memberlist, or the three make a cycle (seen in the
// 128-node bench); announceMu, which memberlist's callbacks never take,
// keeps announces queued in the order they are numbered.
func (c *Gossip) AnnounceFunc(build func() NodeInfo) {
	c.announceMu.Lock()
	err := c.announceLocked(build()) // lockcheck: build must not block (its contract above)
	c.announceMu.Unlock()
	c.ownRefused(err)
}

// ownRefused logs why the table refused this node's own announce, if it
// did; never under announceMu or mu.
func (c *Gossip) ownRefused(err error) {
	if err != nil {
		c.log.Error("own announce refused by the name table", "err", err)
	}
}

// announceLocked numbers info and sends it, and returns the table's
// refusal of it, if any; c.announceMu is held.
func (c *Gossip) announceLocked(info NodeInfo) error {
	c.mu.Lock()
	info.Node, info.Boot, info.Seq = c.self.Node, c.self.Boot, c.self.Seq+1
	c.self = info
	raw := c.codec.Encode(nil, info)
	c.latest[info.Node] = raw
	c.mu.Unlock()
	changed, err := c.table.Apply(info)
	c.sent.Add(1)
	c.queue.QueueBroadcast(announce{node: info.Node, msg: raw})
	if changed {
		c.push(info.Node, raw)
	}
	return err
}

// push hands raw, node's announce, to the pusher, replacing an older one
// of node still waiting.
func (c *Gossip) push(node string, raw []byte) {
	c.mu.Lock()
	c.pending[node] = raw
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default: // already woken; it will find this one too
	}
}

// pusher sends what push hands it to this node's fingers.
func (c *Gossip) pusher() {
	defer c.wg.Done()
	for {
		select {
		case <-c.stop:
			return
		case <-c.wake:
		}
		c.mu.Lock()
		batch := c.pending
		c.pending = map[string][]byte{}
		fingers := c.fingersLocked()
		c.mu.Unlock()
		for _, raw := range batch {
			send := c.ml.SendBestEffort
			if len(raw) > maxPacketAnnounce {
				send = c.ml.SendReliable // would not fit a packet: memberlist's TCP path
			}
			for i := range fingers {
				if err := send(&fingers[i], raw); err != nil {
					c.log.Debug("announce to a finger", "node", fingers[i].Name, "err", err)
					continue
				}
				c.counted(raw)
			}
		}
	}
}

// maxPacketAnnounce is the largest announce pushed in a UDP packet:
// memberlist's packets hold 1400 bytes (UDPBufferSize), less its headers
// (message type, checksum, and with cluster_key the encryption's 29).
// A larger one goes over memberlist's TCP path, as it never fits its
// gossip either.
const maxPacketAnnounce = 1300

// counted counts one announce message sent.
func (c *Gossip) counted(raw []byte) {
	c.msgsSent.Add(1)
	c.bytesSent.Add(uint64(len(raw)))
}

// fingersLocked returns this node's fingers: the live members 1, 2, 4, ...
// places after it on the ring of live members sorted by name, each once.
// c.mu must be held.
func (c *Gossip) fingersLocked() []memberlist.Node {
	if c.ring == nil {
		c.ring = make([]string, 0, len(c.peers)+1)
		c.ring = append(c.ring, c.cfg.Self)
		for name := range c.peers {
			c.ring = append(c.ring, name)
		}
		slices.Sort(c.ring)
	}
	return fingers(c.ring, c.cfg.Self, c.peers)
}

// fingers are the members of ring (sorted, self in it) 1, 2, 4, ... places
// after self, while the distance is below the ring's size.
func fingers(ring []string, self string, peers map[string]memberlist.Node) []memberlist.Node {
	at, _ := slices.BinarySearch(ring, self)
	n := len(ring)
	var out []memberlist.Node
	for d := 1; d < n; d *= 2 {
		if p, ok := peers[ring[(at+d)%n]]; ok {
			out = append(out, p)
		}
	}
	return out
}

// reannounce sends this node's current state again: State's, or the one
// announced last. Read under announceMu: read before it, the state
// announced last could be replaced by a newer announce before this one
// numbered it again, and then overwrite it (and be refreshed every 20 s).
func (c *Gossip) reannounce() {
	c.announceMu.Lock()
	var err error
	if c.cfg.State != nil {
		err = c.announceLocked(c.cfg.State()) // lockcheck: State must not block, as AnnounceFunc's build
	} else {
		c.mu.Lock()
		self := c.self
		c.mu.Unlock()
		err = c.announceLocked(self)
	}
	c.announceMu.Unlock()
	c.ownRefused(err)
}

// run re-announces periodically and retries the seeds that are not members.
func (c *Gossip) run() {
	defer c.wg.Done()
	c.joinSeeds()
	close(c.joined)
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
func (c *Gossip) joinSeeds() {
	// The addresses come from the copies NotifyJoin made under
	// memberlist's lock: the nodes ml.Members returns are memberlist's
	// own, which it rewrites when a member refutes a suspicion.
	members := map[string]bool{}
	c.mu.Lock()
	for _, p := range c.peers {
		members[p.Address()] = true
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
	// Each seed on its own goroutine (at most joinAtOnce): memberlist's Join
	// asks its seeds one after another, so one that hangs (a stopped node,
	// a link that drops everything) held the others' answers for its TCP
	// timeout, and the table stayed empty meanwhile.
	var wg sync.WaitGroup
	var answered atomic.Int32
	sem := make(chan struct{}, joinAtOnce)
	for _, s := range want {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if n, _ := c.ml.Join([]string{s}); n > 0 {
				answered.Add(1)
			}
		}()
	}
	wg.Wait()
	if answered.Load() == 0 {
		c.log.Debug("name port: no seed answered yet", "seeds", want)
	}
}

// joinAtOnce bounds the seeds joinSeeds asks at once (a cluster of 128
// nodes has 127).
const joinAtOnce = 16

// Joined is closed once this node's first join has asked every seed and
// each answered, refused or failed: the table then holds what the seeds
// that answered knew (their push/pull states are applied before their
// joins end). A seed that hangs holds it until memberlist's TCP timeout;
// a caller that cannot wait that long bounds its own wait.
func (c *Gossip) Joined() <-chan struct{} { return c.joined }

// Stats reports the announce counters.
func (c *Gossip) Stats() GossipStats {
	st := GossipStats{
		Members: c.ml.NumMembers(), Sent: c.sent.Load(), Received: c.received.Load(), Relayed: c.relayed.Load(),
		MessagesSent: c.msgsSent.Load(), BytesSent: c.bytesSent.Load(), Dropped: map[string]uint64{}, Trusted: c.Trusted(),
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
func (c *Gossip) Stop() error {
	err := errors.New("names: cluster already left")
	c.leaveOnce.Do(func() {
		close(c.stop)
		err = c.ml.Shutdown()
		c.waitGoroutines()
	})
	return err
}

// Leave tells the others this node is going and stops. Calls after the
// first do nothing.
func (c *Gossip) Leave(timeout time.Duration) error {
	err := errors.New("names: cluster already left")
	c.leaveOnce.Do(func() {
		close(c.stop)
		err = c.ml.Leave(timeout)
		err = errors.Join(err, c.ml.Shutdown())
		c.waitGoroutines()
	})
	return err
}

// waitGoroutines waits for this cluster's goroutines, after no callback
// can start another.
func (c *Gossip) waitGoroutines() {
	c.mu.Lock()
	c.stopping = true
	c.mu.Unlock()
	c.wg.Wait()
}

func (c *Gossip) drop(reason string, err error) {
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
func (c *Gossip) receive(msg []byte, relay bool) {
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
		c.outlive(info) // our own, relayed back; or a past incarnation's
		return
	}
	raw := bytes.Clone(msg)
	c.mu.Lock()
	_, alive := c.peers[info.Node]
	known := c.latest
	if !alive {
		known = c.early
	}
	if old, ok := known[info.Node]; ok {
		prev, err := c.codec.Decode(old)
		if err == nil && !info.newer(&prev) {
			if alive && info.Boot < prev.Boot {
				c.tellOfNewerLocked(info.Node, old)
			}
			c.mu.Unlock()
			return
		}
	}
	if !alive {
		// Kept for when memberlist says it joined (applied then, and
		// relayed if it came by gossip), in a bounded place: anyone with
		// the key (or anyone, without one) can send announces of nodes
		// that never join, and latest goes out in every push/pull.
		c.rememberEarlyLocked(info.Node, raw)
		if relay {
			c.unrelayed[info.Node] = true
		}
		c.mu.Unlock()
		return
	}
	c.latest[info.Node] = raw
	// Applied under mu, as NotifyLeave deletes the node from peers under
	// it before it removes it from the table: applied after the unlock,
	// an announce that found the node alive could put it back in the
	// table once NotifyLeave had removed it.
	changed, err := c.applyTable(info)
	c.mu.Unlock()
	c.refused(info.Node, err) // logs: never with c.mu held
	c.changed(changed)
	if changed && relay {
		c.relayed.Add(1)
		c.push(info.Node, raw)
	}
}

// rememberEarlyLocked keeps raw as the newest announce of node, which is
// not alive now. early holds at most MaxNodes nodes: a newcomer beyond
// that evicts another at random (map order), so announces of nodes that
// never join cannot grow it, nor keep out for long those of a node about
// to join (which sends its own again when it sees this node, and is in
// the next push/pull). c.mu is held.
func (c *Gossip) rememberEarlyLocked(node string, raw []byte) {
	if _, ok := c.early[node]; !ok && len(c.early) >= MaxNodes {
		for other := range c.early {
			delete(c.early, other)
			delete(c.unrelayed, other)
			break
		}
	}
	c.early[node] = raw
}

// apply applies info to the table and reports whether the table changed.
func (c *Gossip) apply(info NodeInfo) bool {
	changed, err := c.applyTable(info)
	c.refused(info.Node, err)
	c.changed(changed)
	return changed
}

// changed tells OnChange when the table changed; never with c.mu held.
func (c *Gossip) changed(changed bool) {
	if changed && c.cfg.OnChange != nil {
		c.cfg.OnChange()
	}
}

// applyTable applies info to the table and reports whether the table
// changed, or why it refused info, without calling OnChange or logging:
// c.mu may be held. The caller hands the error to refused.
func (c *Gossip) applyTable(info NodeInfo) (bool, error) {
	changed, err := c.table.Apply(info)
	if err != nil {
		return false, err
	}
	c.received.Add(1)
	return changed, nil
}

// refused counts and logs node's announce that the table refused with err;
// nothing when err is nil. Never with c.mu held: it logs.
func (c *Gossip) refused(node string, err error) {
	switch {
	case errors.Is(err, ErrFull):
		c.dropMu.Lock()
		c.dropped[DropFull]++
		warn := !c.warnedFull[node]
		if warn && len(c.warnedFull) >= MaxNodes {
			// A leave that ran between the refusal and this leaves its
			// node here: bounded all the same (some said again).
			clear(c.warnedFull)
		}
		c.warnedFull[node] = true
		c.dropMu.Unlock()
		if warn {
			c.log.Error("node refused", "err", err)
		}
	case err != nil:
		c.drop(DropInvalid, err)
	}
}

// outlive answers an announce of this node that is newer than its own: a
// past incarnation's, made while the clock was ahead of where it is now
// (set back between two starts). The other nodes order a node's announces
// by (Boot, Seq) and take this incarnation's for older for as long as they
// remember that one, so this node moves its Boot past it and announces
// again, as memberlist's incarnation numbers refute a suspicion. At most
// once a second: two live nodes given one name would otherwise pass each
// other's Boot in a storm of announces. The announce goes out on a
// goroutine: memberlist's callbacks, which call this, never take
// announceMu.
func (c *Gossip) outlive(info NodeInfo) {
	c.mu.Lock()
	if !info.newer(&c.self) {
		c.mu.Unlock()
		return
	}
	if info.Boot == math.MaxUint64 {
		c.mu.Unlock()
		c.drop(DropInvalid, fmt.Errorf("an announce of this node with the largest boot, %d, which no later boot can pass", info.Boot))
		return
	}
	if time.Since(c.outlived) < time.Second {
		c.mu.Unlock()
		return
	}
	// A past incarnation is outlived once; being outlived again soon
	// after is another live node of this name, which passes this one's
	// Boot as this one passes its: said once as an error, then quiet
	// for a while, instead of a warning every second.
	// Said after c.mu is let go: memberlist's callbacks take it with
	// memberlist's lock held, and a log write may wait for its output.
	now := time.Now()
	var say func()
	switch boot := c.self.Boot; {
	case now.Sub(c.outlived) > namesakeWindow:
		say = func() {
			c.log.Warn("an announce of this node newer than its own (a past incarnation's, with the clock set back since; or another node has this node's name): announcing with a later boot",
				"boot", boot, "other_boot", info.Boot)
		}
	case now.Sub(c.namesake) > namesakeQuiet:
		c.namesake = now
		say = func() {
			c.log.Error(fmt.Sprintf("another live node announces itself as %s (its node_id given to two nodes?): each passes the other's boot once a second, "+
				"and the other nodes send this name's calls to whichever announced last; said again in %v if it goes on", c.cfg.Self, namesakeQuiet),
				"boot", boot, "other_boot", info.Boot)
		}
	}
	c.outlived = now
	c.self.Boot, c.self.Seq = info.Boot+1, 0
	if !c.outliving && !c.stopping { // else the announce on its way reads the Boot set here
		c.outliving = true
		c.goReadyLocked(func() {
			c.mu.Lock()
			c.outliving = false
			c.mu.Unlock()
			c.reannounce()
		})
	}
	c.mu.Unlock()
	if say != nil {
		say()
	}
}

// namesakeWindow is how soon a second outlive means another live node of
// this name rather than a past incarnation; namesakeQuiet how long outlive
// then keeps quiet about it.
const (
	namesakeWindow = 30 * time.Second
	namesakeQuiet  = 5 * time.Minute
)

// tellOfNewerLocked sends node, which is alive, the announce of it this
// node holds, newer than the one it just sent: a node restarted with its
// clock set back learns so of its past incarnation (outlive). A stale
// relay of a past incarnation sends it its current one, which it ignores;
// at most once a second per node, so a flood of stale announces makes no
// flood of answers. A packet when the announce fits one: a TCP send to a
// node that stopped answering holds Stop for memberlist's 10 s, and a
// packet lost is sent again at the node's next stale announce. c.mu is
// held.
func (c *Gossip) tellOfNewerLocked(node string, newer []byte) {
	if c.stopping || time.Since(c.told[node]) < time.Second {
		return
	}
	c.told[node] = time.Now()
	to := c.peers[node]
	c.goReadyLocked(func() {
		send := c.ml.SendBestEffort // c.ml is set once ready
		if len(newer) > maxPacketAnnounce {
			send = c.ml.SendReliable
		}
		if err := send(&to, newer); err != nil {
			c.log.Debug("telling a node of its newer announce", "node", to.Name, "err", err)
			return
		}
		c.counted(newer)
	})
}

// goReadyLocked runs f on a goroutine that Stop and Leave wait for, once
// memberlist runs (c.ml is set), unless the gossip stops first. c.mu is
// held and c.stopping false: Stop sets stopping under mu before it waits.
func (c *Gossip) goReadyLocked(f func()) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		select {
		case <-c.ready:
		case <-c.stop:
			return
		}
		f()
	}()
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

// delegate is the Gossip as memberlist's Delegate.
type delegate Gossip

func (d *delegate) NodeMeta(limit int) []byte { return nil }

func (d *delegate) NotifyMsg(b []byte) { (*Gossip)(d).receive(b, true) }

func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	out := d.queue.GetBroadcasts(overhead, limit)
	for _, b := range out {
		(*Gossip)(d).counted(b)
	}
	return out
}

// LocalState is this node's announce and every live member's, so one
// push/pull teaches a joining node the whole table (and no more: the
// announces of nodes not alive here stay out of it).
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
			(*Gossip)(d).drop(DropMalformed, errors.New("push/pull state: bad length"))
			return
		}
		(*Gossip)(d).receive(buf[k:k+int(n)], false)
		buf = buf[k+int(n):]
	}
}

// events is the Gossip as memberlist's EventDelegate.
type events Gossip

func (e *events) NotifyJoin(n *memberlist.Node) {
	c := (*Gossip)(e)
	if n.Name == c.cfg.Self {
		return // memberlist.Create tells us of ourselves before c is complete
	}
	c.mu.Lock()
	c.peers[n.Name] = *n
	c.ring = nil
	raw := c.early[n.Name]
	delete(c.early, n.Name)
	relay := c.unrelayed[n.Name]
	delete(c.unrelayed, n.Name)
	if raw != nil {
		c.latest[n.Name] = raw
	}
	c.mu.Unlock()
	if raw != nil {
		// An announce that came by gossip before its node was alive was
		// not relayed then: it is now, or the members that only this one
		// heard it from would wait for a push/pull.
		if info, err := c.codec.Decode(raw); err == nil && c.apply(info) && relay {
			c.relayed.Add(1)
			c.push(n.Name, raw)
		}
	}
	// Gossip reaches a newcomer only by chance until the next push/pull
	// (15 s), so tell it our state directly, off memberlist's goroutine.
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopping {
		return // memberlist's handlers outlive Shutdown by a moment
	}
	node := *n
	c.goReadyLocked(func() {
		c.mu.Lock()
		own := c.latest[c.cfg.Self]
		c.mu.Unlock()
		if err := c.ml.SendReliable(&node, own); err != nil {
			c.log.Debug("announce to a newcomer", "node", node.Name, "err", err)
			return
		}
		c.counted(own)
		c.newcomerMsgs.Add(1)
	})
}

func (e *events) NotifyLeave(n *memberlist.Node) {
	c := (*Gossip)(e)
	if n.Name == c.cfg.Self {
		return
	}
	c.mu.Lock()
	delete(c.peers, n.Name)
	delete(c.unrelayed, n.Name)
	delete(c.told, n.Name)
	if raw, ok := c.latest[n.Name]; ok {
		// Kept (bounded) among the nodes not alive, so that an older
		// announce of it relayed late is still known to be older.
		delete(c.latest, n.Name)
		c.rememberEarlyLocked(n.Name, raw)
	}
	c.ring = nil
	c.mu.Unlock()
	c.dropMu.Lock()
	delete(c.warnedFull, n.Name) // refused while the table was full: said again if it comes back
	c.dropMu.Unlock()
	// Out of the table before OnLeave lets its peer go: a call routed in
	// between would find the node still there and make it a fresh peer,
	// which no later leave ends, and the calls OnLeave sends elsewhere
	// could be routed back to it.
	removed := c.table.Remove(n.Name)
	admitted := removed && c.table.Len() == MaxNodes-1 && c.admitRefused()
	if c.cfg.OnLeave != nil {
		c.cfg.OnLeave(n.Name)
	}
	if removed {
		c.log.Info("node left or died", "node", n.Name, "addr", n.Address())
	}
	c.changed(removed || admitted)
}

// admitRefused applies the announce this node holds of a live member the
// table does not hold (refused when it was full), now that a node left
// the table: every copy of that announce that comes again is ignored as
// no newer, and the member would stay out until it announced anew (its
// refresh, up to 20 s). It reports whether the table changed.
func (c *Gossip) admitRefused() bool {
	var changed bool
	var errs []error
	var refused []string
	c.mu.Lock()
	for node := range c.peers {
		raw := c.latest[node]
		if raw == nil || c.table.Len() >= MaxNodes {
			continue
		}
		if _, ok := c.table.Get(node); ok {
			continue
		}
		info, err := c.codec.Decode(raw)
		if err != nil {
			continue
		}
		// Under mu, as receive applies: a leave cannot slip in between.
		ch, err := c.applyTable(info)
		changed = changed || ch
		if err != nil {
			errs, refused = append(errs, err), append(refused, node)
		}
	}
	c.mu.Unlock()
	for i, err := range errs {
		c.refused(refused[i], err)
	}
	return changed
}

func (e *events) NotifyUpdate(n *memberlist.Node) {
	c := (*Gossip)(e)
	if n.Name == c.cfg.Self {
		return
	}
	c.mu.Lock()
	if _, ok := c.peers[n.Name]; ok {
		c.peers[n.Name] = *n // its address may have changed
	}
	c.mu.Unlock()
}

// logAdapter puts memberlist's log lines into the node's log at debug
// level, its warnings and errors at warn. memberlist has no hook for
// packets that fail to decrypt, only this log line; each counts as a
// dropped unauthenticated message, beside the announces our codec drops.
type logAdapter struct{ c *Gossip }

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
