package names

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"tpsched/internal/testenv"
	"tpsched/scd/loadlevel"
)

type member struct {
	c     *Gossip
	table *Table
}

// startMembers starts n clusters on 127.0.0.1, each seeded with the first.
func startMembers(t *testing.T, n int, key func(i int) []byte) []member {
	t.Helper()
	var out []member
	var seed string
	for i := range n {
		name := fmt.Sprintf("m%d", i)
		table := NewTable(name)
		var seeds []string
		if seed != "" {
			seeds = []string{seed}
		}
		c, err := Join(GossipConfig{Self: name, BindAddr: "127.0.0.1", Port: 0, Seeds: seeds, Key: key(i), Fast: true},
			table, NodeInfo{Addr: "127.0.0.1:1", Announce: true, Groups: []GroupInfo{{Group: "g"}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Leave(100 * time.Millisecond) })
		if seed == "" {
			seed = net.JoinHostPort("127.0.0.1", strconv.Itoa(c.Port()))
		}
		out = append(out, member{c, table})
	}
	return out
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10 s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func levelSeen(m member, node string) (loadlevel.Level, bool) {
	info, ok := m.table.Get(node)
	if !ok || len(info.Groups) == 0 {
		return 0, false
	}
	return info.Groups[0].Level, true
}

// Five members in one process: each learns the others, a level change of
// one reaches all (relayed, not only from its originator), and a member
// that leaves is removed everywhere.
func TestClusterSpreadsAnnouncesAndLeaves(t *testing.T) {
	key := func(int) []byte { return []byte("same-key-for-all-members") }
	ms := startMembers(t, 5, key)
	for i, m := range ms {
		eventually(t, fmt.Sprintf("m%d to know all five", i), func() bool { return m.table.Len() == 5 })
	}
	ms[3].c.Announce(NodeInfo{Addr: "127.0.0.1:1", Announce: true, Groups: []GroupInfo{{Group: "g", Level: loadlevel.Level2}}})
	for i, m := range ms {
		eventually(t, fmt.Sprintf("m%d to see m3 at LEVEL2", i), func() bool {
			l, ok := levelSeen(m, "m3")
			return ok && l == loadlevel.Level2
		})
	}
	if err := ms[4].c.Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	for i, m := range ms[:4] {
		eventually(t, fmt.Sprintf("m%d to forget m4", i), func() bool { _, ok := m.table.Get("m4"); return !ok })
	}
	if st := ms[0].c.Stats(); st.Sent == 0 || st.Received == 0 || st.BytesSent == 0 || st.Trusted {
		t.Errorf("stats %+v: want announces sent, received and bytes counted, not trusted blindly", st)
	}
}

// TestRefreshNeverOverwritesANewerAnnounce: the refresh and announces of
// alternating holds run at once; after each announce the member's table
// (and the state it refreshes) shows what was announced last. Before, the
// refresh read the state, another announce came, and the refresh then
// numbered the older state after it: the hold was overwritten, and every
// refresh sent the stale state again.
func TestRefreshNeverOverwritesANewerAnnounce(t *testing.T) {
	ms := startMembers(t, 1, func(int) []byte { return nil })
	c, table := ms[0].c, ms[0].table
	state := func(held bool) NodeInfo {
		return NodeInfo{Addr: "127.0.0.1:1", Announce: true, Groups: []GroupInfo{{Group: "g", Held: held}}}
	}
	stop := repeatInTwo(c.reannounce)
	wrong := 0
	for i := range 2000 {
		held := i%2 == 0
		c.Announce(state(held))
		if info, _ := table.Get("m0"); info.Groups[0].Held != held {
			wrong++
		}
	}
	stop()
	if info, _ := table.Get("m0"); info.Groups[0].Held != false {
		t.Error("at the end the table holds the state announced before the last")
	}
	if wrong > 0 {
		t.Errorf("%d of 2000 announces overwritten by an older state", wrong)
	}
}

// A member with another key cannot join (memberlist's gossip is encrypted
// with a key derived from cluster_key): its packets are dropped and
// counted, and it never enters the others' tables.
func TestClusterDropsForgedAnnounces(t *testing.T) {
	ms := startMembers(t, 3, func(i int) []byte {
		if i == 2 {
			return []byte("forger-key-0123456789")
		}
		return []byte("honest-key-0123456789")
	})
	eventually(t, "m0 to drop m2's announces", func() bool {
		return ms[0].c.Stats().Dropped[DropAuth] > 0 && ms[0].table.Len() == 2
	})
	if _, ok := ms[0].table.Get("m2"); ok {
		t.Error("m0's table holds the forger")
	}
	if _, ok := ms[2].table.Get("m0"); ok {
		t.Error("the forger believed m0's announce signed with another key")
	}
}

// An announce that reaches a member with a wrong tag (a peer that has the
// memberlist key but not the announce key cannot exist today, so it is
// handed over directly) is dropped and counted, and applies nothing.
func TestClusterDropsWronglyTaggedAnnounce(t *testing.T) {
	ms := startMembers(t, 1, func(int) []byte { return []byte("honest-key-0123456789") })
	forged := NewCodec([]byte("forger-key-0123456789")).Encode(nil, NodeInfo{Node: "evil", Addr: "10.0.0.66:1", Boot: 1, Seq: 1,
		Groups: []GroupInfo{{Group: "g"}}})
	(*delegate)(ms[0].c).NotifyMsg(forged)
	(*delegate)(ms[0].c).NotifyMsg(NewCodec(nil).Encode(nil, NodeInfo{Node: "evil", Boot: 1, Seq: 1}))
	if got := ms[0].c.Stats().Dropped[DropAuth]; got != 2 {
		t.Errorf("dropped as unauthenticated: %d, want 2 (a wrong tag and no tag)", got)
	}
	if _, ok := ms[0].table.Get("evil"); ok {
		t.Error("a forged announce entered the table")
	}
}

// memberlist calls back from inside Create, before Join has its
// Memberlist: a peer that has this node in its all_node may join it
// first. Those callbacks must find the cluster ready and wait for the
// Memberlist where they need it (a 32-node start crashed a node on a nil
// Memberlist in NotifyJoin's announce to the newcomer).
func TestCallbacksBeforeMemberlistStarts(t *testing.T) {
	c := unjoinedGossip(t, GossipConfig{}, NewTable("m0"))
	peer := &memberlist.Node{Name: "m1", Addr: net.IPv4(127, 0, 0, 1), Port: 1}
	(*events)(c).NotifyJoin(peer)
	(*delegate)(c).NotifyMsg(NewCodec(nil).Encode(nil, NodeInfo{Node: "m1", Addr: "127.0.0.1:2", Boot: 1, Seq: 1, Groups: []GroupInfo{{Group: "g"}}}))
	(*delegate)(c).GetBroadcasts(2, 1400)
	(*delegate)(c).MergeRemoteState((*delegate)(c).LocalState(true), true)
	if _, ok := c.table.Get("m1"); !ok {
		t.Error("a peer's announce that came before memberlist started was not applied")
	}
	time.Sleep(50 * time.Millisecond) // give the announce to the newcomer its chance to run
}

// TestAnnouncesOfNodesNeverJoiningAreBounded: announces of 10,000 nodes
// that never join (anyone can send them without a key, any keyed peer
// with one) keep at most MaxNodes of them, and none goes out in a
// push/pull; an announce that came before its node joined is still
// applied, and relayed, when it joins, and its node's announce leaves
// the push/pull state when it leaves.
func TestAnnouncesOfNodesNeverJoiningAreBounded(t *testing.T) {
	c := unjoinedGossip(t, GossipConfig{}, NewTable("m0"))
	codec := NewCodec(nil)
	msg := func(node string) []byte {
		return codec.Encode(nil, NodeInfo{Node: node, Addr: "127.0.0.1:2", Boot: 1, Seq: 1, Groups: []GroupInfo{{Group: "g"}}})
	}
	(*delegate)(c).NotifyMsg(msg("m1")) // before m1 joins
	for i := range 10_000 {
		(*delegate)(c).NotifyMsg(msg(fmt.Sprintf("x%d", i)))
	}
	c.mu.Lock()
	latest, early := len(c.latest), len(c.early)
	c.mu.Unlock()
	if latest > MaxNodes || early > MaxNodes {
		t.Errorf("kept %d announces of members and %d of others, want at most %d each", latest, early, MaxNodes)
	}
	if st := (*delegate)(c).LocalState(false); len(st) != 0 {
		t.Errorf("push/pull state of %d bytes with no member and no own announce, want none", len(st))
	}
	// m1's early announce may have been evicted by the flood; it comes
	// again (m1 sends its own to each node it sees join).
	(*delegate)(c).NotifyMsg(msg("m1"))
	(*events)(c).NotifyJoin(&memberlist.Node{Name: "m1", Addr: net.IPv4(127, 0, 0, 1), Port: 1})
	if _, ok := c.table.Get("m1"); !ok {
		t.Error("an announce that came before its node joined was not applied when it joined")
	}
	c.mu.Lock()
	_, pending := c.pending["m1"]
	c.mu.Unlock()
	if !pending {
		t.Error("an announce that came by gossip before its node joined was not relayed when it joined")
	}
	if st := (*delegate)(c).LocalState(false); !bytes.Contains(st, msg("m1")) {
		t.Error("a member's announce is not in the push/pull state")
	}
	(*events)(c).NotifyLeave(&memberlist.Node{Name: "m1", Addr: net.IPv4(127, 0, 0, 1), Port: 1})
	if st := (*delegate)(c).LocalState(false); len(st) != 0 {
		t.Errorf("push/pull state of %d bytes after the only member left, want none", len(st))
	}
	(*delegate)(c).NotifyMsg(msg("m1")) // the same one, relayed late
	if _, ok := c.table.Get("m1"); ok {
		t.Error("a late relay of an announce put a node that left back in the table")
	}
}

// TestLateAnnounceNeverBringsBackADeadNode: announces of m1 keep coming
// while memberlist finds m1 alive and then dead, again and again; once it
// is dead and the announces have stopped, it is in no table. Before, an
// announce that found m1 alive and was applied after NotifyLeave removed
// it put the dead node back.
func TestLateAnnounceNeverBringsBackADeadNode(t *testing.T) {
	c := unjoinedGossip(t, GossipConfig{}, NewTable("m0"))
	codec := NewCodec(nil)
	m1 := &memberlist.Node{Name: "m1", Addr: net.IPv4(127, 0, 0, 1), Port: 1}
	seq := uint64(0)
	back := 0
	for range 500 {
		stop := repeatInTwo(func() {
			(*delegate)(c).NotifyMsg(codec.Encode(nil, NodeInfo{Node: "m1", Addr: "127.0.0.1:2", Boot: 1,
				Seq: atomic.AddUint64(&seq, 1), Groups: []GroupInfo{{Group: "g"}}}))
		})
		(*events)(c).NotifyJoin(m1)
		for from := atomic.LoadUint64(&seq); atomic.LoadUint64(&seq) < from+4; {
			runtime.Gosched() // the announces come while m1 is alive, and as it leaves
		}
		(*events)(c).NotifyLeave(m1)
		stop()
		if _, ok := c.table.Get("m1"); ok {
			back++
			c.table.Remove("m1")
		}
	}
	if back > 0 {
		t.Errorf("a dead node was back in the table after %d of 500 leaves", back)
	}
}

// TestLeftNodeIsOutOfTheTableBeforeOnLeave: when OnLeave lets a node's
// peer go (the calls queued for it are sent elsewhere), the node is out of
// the table already: a call routed meanwhile would otherwise find it, make
// it a fresh peer that no later leave ends, or have the calls sent back.
func TestLeftNodeIsOutOfTheTableBeforeOnLeave(t *testing.T) {
	table := NewTable("m0")
	var inTable []bool
	c := unjoinedGossip(t, GossipConfig{OnLeave: func(node string) {
		_, ok := table.Get(node)
		inTable = append(inTable, ok)
	}}, table)
	m1 := &memberlist.Node{Name: "m1", Addr: net.IPv4(127, 0, 0, 1), Port: 1}
	(*events)(c).NotifyJoin(m1)
	(*delegate)(c).NotifyMsg(NewCodec(nil).Encode(nil, NodeInfo{Node: "m1", Addr: "127.0.0.1:2", Boot: 1, Seq: 1, Groups: []GroupInfo{{Group: "g"}}}))
	if _, ok := table.Get("m1"); !ok {
		t.Fatal("m1's announce was not applied")
	}
	(*events)(c).NotifyLeave(m1)
	if len(inTable) != 1 || inTable[0] {
		t.Errorf("OnLeave called %d times, finding m1 in the table %v; want once, out of it", len(inTable), inTable)
	}
}

// repeatInTwo runs f over and over on two goroutines until the stop it
// returns is called, which waits for them.
func repeatInTwo(f func()) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
					f()
				}
			}
		})
	}
	return func() { close(done); wg.Wait() }
}

// unjoinedGossip is node m0's Gossip without memberlist, its callbacks
// called by the test; its goroutines end at the test's end.
func unjoinedGossip(t *testing.T, cfg GossipConfig, table *Table) *Gossip {
	cfg.Self, cfg.Logger = "m0", slog.New(slog.DiscardHandler)
	c := newGossip(cfg, table)
	t.Cleanup(func() {
		close(c.stop)
		c.waitGoroutines()
	})
	return c
}

// joinM3 joins a fourth member, m3, to seeds, its changes applied
// slowly (onChange) when slow is set.
func joinM3(t *testing.T, seeds []string, slow bool) (*Gossip, *Table) {
	t.Helper()
	table := NewTable("m3")
	cfg := GossipConfig{Self: "m3", BindAddr: "127.0.0.1", Port: 0, Fast: true, Key: []byte("same-key-for-all-members"), Seeds: seeds}
	if slow {
		// Each change applied slowly: a Joined closed before the seed's
		// state was all applied would show in the table.
		cfg.OnChange = func() { time.Sleep(20 * time.Millisecond) }
	}
	c, err := Join(cfg, table, NodeInfo{Addr: "127.0.0.1:1", Groups: []GroupInfo{{Group: "g"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Leave(100 * time.Millisecond) })
	return c, table
}

// knowsAll reports whether table holds m0, m1 and m2.
func knowsAll(table *Table) bool {
	for _, node := range []string{"m0", "m1", "m2"} {
		if _, ok := table.Get(node); !ok {
			return false
		}
	}
	return true
}

// TestJoinedMeansTheSeedsTablesAreHere: when Joined closes, a newcomer's
// table already holds every node its seed knew: the router waits for it
// before it answers a call for a group no known node runs (a restarted
// node would otherwise refuse calls for the others' groups).
func TestJoinedMeansTheSeedsTablesAreHere(t *testing.T) {
	key := func(int) []byte { return []byte("same-key-for-all-members") }
	ms := startMembers(t, 3, key)
	eventually(t, "m0 to know all three", func() bool { return ms[0].table.Len() == 3 })
	c, table := joinM3(t, []string{net.JoinHostPort("127.0.0.1", strconv.Itoa(ms[0].c.Port()))}, true)
	select {
	case <-c.Joined():
	case <-time.After(10 * time.Second):
		t.Fatal("Joined not closed within 10 s of joining a live seed")
	}
	if !knowsAll(table) {
		t.Errorf("Joined closed before the table had m0, m1 and m2 (%d nodes)", table.Len())
	}
}

// TestAHungSeedDoesNotHoldTheOthers: a seed that takes the connection and
// never answers (a stopped node) does not keep the newcomer from learning
// the table from the seed after it: the seeds are asked at once, not one
// after another (then m0's answer waited for memberlist's TCP timeout,
// 10 s). Joined waits for every seed, so it is not closed yet.
func TestAHungSeedDoesNotHoldTheOthers(t *testing.T) {
	key := func(int) []byte { return []byte("same-key-for-all-members") }
	ms := startMembers(t, 3, key)
	eventually(t, "m0 to know all three", func() bool { return ms[0].table.Len() == 3 })
	hung, err := net.Listen("tcp", "127.0.0.1:0") // connections wait in its backlog, unanswered
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Close()
	c, table := joinM3(t, []string{hung.Addr().String(), net.JoinHostPort("127.0.0.1", strconv.Itoa(ms[0].c.Port()))}, false)
	deadline := time.Now().Add(3 * time.Second)
	for !knowsAll(table) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !knowsAll(table) {
		t.Errorf("3 s after the join began, with the first seed hanging, the table has %d nodes, want m0, m1, m2 and m3", table.Len())
	}
	select {
	case <-c.Joined():
		t.Error("Joined closed while a seed had not answered")
	default:
	}
}

// A node restarted with its clock set back, its new Boot lower than the
// incarnation the others remember, is heard at once: it takes a Boot after
// the remembered one as soon as it learns of it (as memberlist's
// incarnation numbers refute a suspicion). Taken for older, its announces
// were ignored for as long as the old incarnation was remembered.
func TestANodeRestartedWithItsClockSetBackIsHeard(t *testing.T) {
	m0 := startMembers(t, 1, func(int) []byte { return nil })[0]
	// m1's last incarnation, an hour ahead, as m0 remembers it after its
	// death: an announce of a node not alive now, which m0 does not relay
	// when the node joins (it had it from a push/pull, not by gossip).
	past := NewCodec(nil).Encode(nil, NodeInfo{Node: "m1", Addr: "127.0.0.1:2", Announce: true,
		Boot: uint64(time.Now().Add(time.Hour).UnixNano()), Seq: 9, Groups: []GroupInfo{{Group: "old"}}})
	(*delegate)(m0.c).MergeRemoteState(append(binary.AppendUvarint(nil, uint64(len(past))), past...), false)
	seed := net.JoinHostPort("127.0.0.1", strconv.Itoa(m0.c.Port()))
	c, err := Join(GossipConfig{Self: "m1", BindAddr: "127.0.0.1", Seeds: []string{seed}, Fast: true},
		NewTable("m1"), NodeInfo{Addr: "127.0.0.1:3", Announce: true, Groups: []GroupInfo{{Group: "new"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Leave(100 * time.Millisecond) })
	eventually(t, "m0 to take the restarted m1's announce", func() bool {
		info, ok := m0.table.Get("m1")
		return ok && info.Addr == "127.0.0.1:3"
	})
}

// An announce of this node newer than its own (a past incarnation's, from
// a clock that was ahead) moves this node's Boot past it and is announced
// again; not again within a second (two live nodes of one name would pass
// each other in a storm), and one that cannot be passed (the largest Boot)
// is dropped as invalid.
func TestOwnNewerAnnounceMovesTheBootOn(t *testing.T) {
	c := unjoinedGossip(t, GossipConfig{}, NewTable("m0"))
	c.self = NodeInfo{Node: "m0", Boot: 100, Seq: 3}
	close(c.ready)
	codec := NewCodec(nil)
	(*delegate)(c).NotifyMsg(codec.Encode(nil, NodeInfo{Node: "m0", Boot: 99, Seq: 50}))
	(*delegate)(c).NotifyMsg(codec.Encode(nil, NodeInfo{Node: "m0", Boot: 100, Seq: 3}))
	if c.self.Boot != 100 {
		t.Fatalf("an older or equal own announce moved the Boot to %d", c.self.Boot)
	}
	// The next two at once after it, not after the wait for its
	// announce: a busy machine (CI, under -race) can take a second over
	// that wait, and 600 would then be passed as it should.
	(*delegate)(c).NotifyMsg(codec.Encode(nil, NodeInfo{Node: "m0", Boot: 500, Seq: 1}))
	(*delegate)(c).NotifyMsg(codec.Encode(nil, NodeInfo{Node: "m0", Boot: 600, Seq: 1}))
	(*delegate)(c).NotifyMsg(codec.Encode(nil, NodeInfo{Node: "m0", Boot: 1<<64 - 1, Seq: 1}))
	eventually(t, "the Boot to move past 500 and be announced", func() bool {
		c.announceMu.Lock()
		defer c.announceMu.Unlock()
		info, ok := c.table.Get("m0")
		return ok && info.Boot == 501
	})
	c.dropMu.Lock()
	got := c.dropped[DropInvalid]
	c.dropMu.Unlock()
	if got != 1 {
		t.Errorf("an own announce with the largest Boot: %d dropped as invalid, want 1", got)
	}
	if info, _ := c.table.Get("m0"); info.Boot != 501 {
		t.Errorf("the Boot is %d after two more own newer announces within a second, want 501", info.Boot)
	}
}

// Two live nodes given one name outlive each other once a second, for as
// long as both run: the first time is said as a warning (it may be a past
// incarnation), the second as an error naming the likely cause, and then
// nothing for namesakeQuiet, where every one was a warning before.
func TestANamesakeIsSaidOnceNotEverySecond(t *testing.T) {
	c := unjoinedGossip(t, GossipConfig{}, NewTable("m0"))
	var log testenv.SyncBuffer
	c.log = slog.New(slog.NewTextHandler(&log, nil))
	c.self = NodeInfo{Node: "m0", Boot: 100, Seq: 3}
	close(c.ready)
	codec := NewCodec(nil)
	for i := range 10 {
		(*delegate)(c).NotifyMsg(codec.Encode(nil, NodeInfo{Node: "m0", Boot: uint64(200 + 100*i), Seq: 1}))
		c.mu.Lock()
		c.outlived = c.outlived.Add(-1100 * time.Millisecond) // a second went by
		c.mu.Unlock()
	}
	text := log.String()
	if w, e := strings.Count(text, "level=WARN"), strings.Count(text, "level=ERROR"); w != 1 || e != 1 ||
		!strings.Contains(text, "another live node announces itself as m0") {
		t.Errorf("ten outlives a second apart: %d warnings and %d errors, want 1 and 1 naming the namesake:\n%s", w, e, text)
	}
	eventually(t, "the Boot to move past the last", func() bool {
		c.announceMu.Lock()
		defer c.announceMu.Unlock()
		info, ok := c.table.Get("m0")
		return ok && info.Boot == 1101
	})
}

// TestStopIsBoundedWhileSeedsHang: a node whose seeds take the connection
// and never answer (stopped nodes, a link that drops everything) stops at
// once. Before, Stop waited for every join in progress to reach
// memberlist's TCP timeout (10 s), and for a second wave of joins after
// it when more than joinAtOnce seeds hung.
func TestStopIsBoundedWhileSeedsHang(t *testing.T) {
	var seeds []string
	for range joinAtOnce + 1 {
		hung, err := net.Listen("tcp", "127.0.0.1:0") // connections wait in its backlog, unanswered
		if err != nil {
			t.Fatal(err)
		}
		defer hung.Close()
		seeds = append(seeds, hung.Addr().String())
	}
	c, err := Join(GossipConfig{Self: "m0", BindAddr: "127.0.0.1", Seeds: seeds, Fast: true},
		NewTable("m0"), NodeInfo{Addr: "127.0.0.1:1", Groups: []GroupInfo{{Group: "g"}}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the joins are waiting for their seeds
	start := time.Now()
	for _, stop := range []func() error{c.Stop, func() error { return c.Leave(100 * time.Millisecond) }} {
		_ = stop()
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Stop took %v with its seeds hanging, want well under memberlist's 10 s TCP timeout", took)
	}
}

// TestNoLogWriteUnderMu: the lines the receive path writes (a 129th
// node refused, an own announce newer than this node's) are written with
// c.mu let go. memberlist's NotifyJoin and NotifyLeave take c.mu with its
// node lock held, so a log write that waits for its output (a stderr not
// read) under c.mu held up memberlist's whole membership.
func TestNoLogWriteUnderMu(t *testing.T) {
	table := NewTable("m0")
	c := unjoinedGossip(t, GossipConfig{}, table)
	h := &muCheckHandler{c: c}
	c.log = slog.New(h)
	c.self = NodeInfo{Node: "m0", Boot: 100, Seq: 3}
	codec := NewCodec(nil)
	for i := range MaxNodes {
		if _, err := table.Apply(NodeInfo{Node: fmt.Sprintf("n%03d", i), Boot: 1, Seq: 1}); err != nil {
			t.Fatal(err)
		}
	}
	(*events)(c).NotifyJoin(&memberlist.Node{Name: "x", Addr: net.IPv4(127, 0, 0, 1), Port: 1})
	(*delegate)(c).NotifyMsg(codec.Encode(nil, NodeInfo{Node: "x", Addr: "127.0.0.1:2", Boot: 1, Seq: 1}))
	(*delegate)(c).NotifyMsg(codec.Encode(nil, NodeInfo{Node: "m0", Boot: 500, Seq: 1}))
	if h.lines.Load() < 2 {
		t.Fatalf("%d lines logged, want the 129th node's refusal and the outlive", h.lines.Load())
	}
	if n := h.underMu.Load(); n > 0 {
		t.Errorf("%d of %d log lines written with c.mu held", n, h.lines.Load())
	}
}

// muCheckHandler counts the lines logged and those logged while c.mu is
// held (by anyone: the test runs nothing beside).
type muCheckHandler struct {
	c              *Gossip
	lines, underMu atomic.Int32
}

func (h *muCheckHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *muCheckHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *muCheckHandler) WithGroup(string) slog.Handler            { return h }
func (h *muCheckHandler) Handle(_ context.Context, r slog.Record) error {
	h.lines.Add(1)
	if h.c.mu.TryLock() {
		h.c.mu.Unlock()
	} else {
		h.underMu.Add(1)
	}
	return nil
}

// TestRefusedNodesAreForgottenWhenTheyLeave: with the table full, nodes
// that join, are refused and leave again (a new name each time, as
// anyone can join without a key) leave nothing behind. Before, the note
// that each had been warned about stayed for ever.
func TestRefusedNodesAreForgottenWhenTheyLeave(t *testing.T) {
	table := NewTable("m0")
	c := unjoinedGossip(t, GossipConfig{}, table)
	for i := range MaxNodes {
		if _, err := table.Apply(NodeInfo{Node: fmt.Sprintf("n%03d", i), Boot: 1, Seq: 1}); err != nil {
			t.Fatal(err)
		}
	}
	codec := NewCodec(nil)
	for i := range 1000 {
		n := &memberlist.Node{Name: fmt.Sprintf("x%d", i), Addr: net.IPv4(127, 0, 0, 1), Port: 1}
		(*events)(c).NotifyJoin(n)
		(*delegate)(c).NotifyMsg(codec.Encode(nil, NodeInfo{Node: n.Name, Addr: "127.0.0.1:2", Boot: 1, Seq: 1}))
		(*events)(c).NotifyLeave(n)
	}
	c.dropMu.Lock()
	warned, full := len(c.warnedFull), c.dropped[DropFull]
	c.dropMu.Unlock()
	if full != 1000 {
		t.Errorf("%d announces dropped as table_full, want 1000", full)
	}
	if warned > 0 {
		t.Errorf("%d refused nodes that left are still remembered, want none", warned)
	}
}

// TestANodeRefusedWhileTheTableWasFullIsTakenWhenOneLeaves: a live node
// refused as the 129th enters the table as soon as another leaves, from
// the announce of it this node holds. Before, that announce was kept
// (and went out in push/pull) while the table held nothing of it, and
// every copy of it was ignored as no newer: the node stayed out until
// it announced again (its refresh, up to 20 s later).
func TestANodeRefusedWhileTheTableWasFullIsTakenWhenOneLeaves(t *testing.T) {
	table := NewTable("m0")
	c := unjoinedGossip(t, GossipConfig{}, table)
	codec := NewCodec(nil)
	join := func(name string) *memberlist.Node {
		n := &memberlist.Node{Name: name, Addr: net.IPv4(127, 0, 0, 1), Port: 1}
		(*events)(c).NotifyJoin(n)
		(*delegate)(c).NotifyMsg(codec.Encode(nil, NodeInfo{Node: name, Addr: "127.0.0.1:2", Boot: 1, Seq: 1, Groups: []GroupInfo{{Group: "g"}}}))
		return n
	}
	var first *memberlist.Node
	for i := range MaxNodes {
		n := join(fmt.Sprintf("n%03d", i))
		if i == 0 {
			first = n
		}
	}
	join("x")
	if _, ok := table.Get("x"); ok || table.Len() != MaxNodes {
		t.Fatalf("the 129th node is in the table (%d nodes)", table.Len())
	}
	(*events)(c).NotifyLeave(first)
	if _, ok := table.Get("x"); !ok {
		t.Error("a node refused while the table was full is still out of it after another left")
	}
	if table.Len() != MaxNodes {
		t.Errorf("%d nodes in the table, want %d", table.Len(), MaxNodes)
	}
}
