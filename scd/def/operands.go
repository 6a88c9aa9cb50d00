package def

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// Operand tables, one per kind of file. Each entry says how the values of
// one set statement are read and what the operand reference
// (docs/OPERANDS.md, generated from these tables by `go generate`) says
// about it. A handler gets the values and returns the reason a value is
// wrong; the caller adds the file, line and operand. Defaults live in
// defaultSystem, defaultSched, defaultServer and defaultClient; a test
// checks that each operand's documented default is what they hold.

type handler[T any] func(dst *T, v []string) error

// operand is one operand of one kind of file.
type operand[T any] struct {
	set handler[T]
	// value is the default as it would be written in the file; a test sets
	// it on the defaults and expects no change. "" when the default cannot
	// be written: dflt then says it in words.
	value   string
	dflt    string
	values  string // what may be written
	opentp1 string // what the source documents say it means; "" when they do not describe it
	tpsched string // what tpsched adds to that meaning, or the whole meaning
	own     bool   // tpsched's own operand: OpenTP1 has none of this name
}

// command is one definition command of one kind of file: OpenTP1 writes
// some definitions as a command with options (scdmulti -g NAME -m COUNT
// -p PORT) rather than as set statements, and a file may give a command
// more than once.
type command[T any] struct {
	set      func(dst *T, flags map[string]string) error
	synopsis string // how it is written, options in upper case
	dflt     string // what holds without it
	values   string
	opentp1  string
	tpsched  string
}

// options are the letters of the options the command's synopsis names.
func (c command[T]) options() string {
	var out []byte
	for _, w := range strings.Fields(c.synopsis) {
		if isOption(w) {
			out = append(out, w[1])
		}
	}
	return string(out)
}

// flagsOf checks a command's options against the allowed letters and
// returns them by letter.
func flagsOf(st Stmt, allowed string) (map[string]string, error) {
	out := make(map[string]string, len(st.Flags))
	for _, f := range st.Flags {
		if !strings.Contains(allowed, f.Name) {
			opts := make([]string, len(allowed))
			for i := range allowed {
				opts[i] = "-" + allowed[i:i+1]
			}
			return nil, fmt.Errorf("unknown option -%s (it takes %s)", f.Name, strings.Join(opts, ", "))
		}
		out[f.Name] = f.Value
	}
	return out, nil
}

func defaultSystem(hostname string) System {
	return System{
		NodeID:         hostname,
		RPCAddress:     "127.0.0.1",
		RPCPort:        DefaultRPCPort,
		NamePort:       DefaultNamePort,
		MetricsAddress: DefaultMetricsAddress,
		WatchTime:      DefaultWatchTime,
		MaxConnections: DefaultMaxConnections,
		FrameTimeout:   DefaultFrameTimeout,
		BufferBudget:   DefaultBufferBudget,
		UAPSchedBatch:  true,
		uapPidsMax:     AutoLimit,
		uapMemoryMax:   AutoLimit,
	}
}

var systemOperands = map[string]operand[System]{
	"node_id": {
		set: func(s *System, v []string) (err error) {
			if s.NodeID, err = one(v); err != nil {
				return err
			}
			if s.NodeID == "" || len(s.NodeID) > 255 {
				return fmt.Errorf("want 1..255 bytes, got %d", len(s.NodeID))
			}
			for i := 0; i < len(s.NodeID); i++ {
				if c := s.NodeID[i]; c <= ' ' || c == 0x7f || c == '"' || c == ',' {
					return fmt.Errorf("%q: %q not allowed", s.NodeID, c)
				}
			}
			return nil
		},
		dflt:    "the host name",
		values:  "1..255 bytes without blanks, control characters, quotes or commas",
		tpsched: "The node's name towards its peers, in announces, in `scdctl status` and in metric labels. Every node of a cluster needs its own.",
	},
	"rpc_address": {
		set: func(s *System, v []string) (err error) {
			if s.RPCAddress, err = one(v); err != nil {
				return err
			}
			if !validHost(s.RPCAddress) {
				return fmt.Errorf("%q is not an IP address or host name (the port goes in rpc_port)", s.RPCAddress)
			}
			return nil
		},
		value:  "127.0.0.1",
		values: "an IP address or a host name, without a port",
		tpsched: "The address the RPC port listens on; in a cluster the name port (membership and announces) listens there too. " +
			"Together with rpc_port it tells which all_node entry is this node. Loopback unless a definition names another address: " +
			"an all_node entry on another host then is an error, and a non-loopback address without cluster_key a warning at start-up.",
	},
	"rpc_port": {
		set: func(s *System, v []string) (err error) {
			// 0 picks a free port (scdd logs the one it got): for tests and
			// for several nodes on one host.
			s.RPCPort, err = intIn(v, 0, 65535)
			return err
		},
		value:   "12000",
		values:  "0..65535",
		tpsched: "The TCP port clients (dchost) and other nodes (all_node) send calls to. 0 picks a free port, which scdd logs: for tests.",
	},
	"all_node": {
		set: func(s *System, v []string) error {
			if len(v) > MaxNodes {
				return fmt.Errorf("%d nodes, at most %d (the inter-node load-balancing limit)", len(v), MaxNodes)
			}
			for _, n := range v {
				if _, _, err := SplitHostPort(n, DefaultRPCPort); err != nil {
					return err
				}
			}
			s.AllNodes = append([]string(nil), v...)
			return nil
		},
		dflt:   "none: no cluster, every call is served on this node",
		values: "host[:port], ... (the port defaults to rpc_port); at most 128 entries, no node twice",
		opentp1: "Each OpenTP1 node lists the other nodes, so that the nodes exchange the name information of the user servers running on them; " +
			"inter-node load balancing needs it (000, 001). At most 128 nodes (002).",
		tpsched: "Lists every node's RPC address, this node's included (found by rpc_address and rpc_port). " +
			"Peers are joined on their name_port. A list that names only this node runs no cluster.",
	},
	"metrics_address": {
		set: func(s *System, v []string) (err error) {
			if s.MetricsAddress, err = one(v); err != nil {
				return err
			}
			if host, port, perr := net.SplitHostPort(s.MetricsAddress); perr == nil && port == "0" {
				// Port 0 picks a free port, as rpc_port 0 does.
				if !validHost(host) {
					return fmt.Errorf("%q is not an IP address or host name", host)
				}
				return nil
			}
			_, _, err = SplitHostPort(s.MetricsAddress, 0)
			return err
		},
		value:   DefaultMetricsAddress,
		values:  "host:port; port 0 picks a free one",
		tpsched: "The read-only HTTP endpoint of `/metrics` and `/status`. Control actions (hold, release, pprof) go to control_socket.",
		own:     true,
	},
	"control_socket": {
		set: func(s *System, v []string) (err error) {
			if s.ControlSocket, err = one(v); err != nil {
				return err
			}
			// A unix socket path is at most 107 bytes (sun_path less its NUL);
			// a relative one is checked again once joined to the directory.
			if s.ControlSocket == "" || len(s.ControlSocket) > MaxSocketPath || strings.ContainsRune(s.ControlSocket, 0) {
				return fmt.Errorf("want a path of 1..%d bytes, got %d", MaxSocketPath, len(s.ControlSocket))
			}
			return nil
		},
		dflt:   "/run/tpsched/NODE_ID.sock as root, else $XDG_RUNTIME_DIR/tpsched/, else the definition directory",
		values: "a path of 1..107 bytes; relative to the definition directory",
		tpsched: "The unix socket of the control actions (hold, release, pprof): only scdd's own user and root may use it " +
			"(checked with SO_PEERCRED).",
		own: true,
	},
	"watch_time": {
		set: func(s *System, v []string) (err error) {
			s.WatchTime, err = secondsIn(v, 0, maxSeconds)
			return err
		},
		value:   "180",
		values:  "seconds, 0..65535; 0 = for ever",
		tpsched: "How long a call waits for its answer before it fails with 'timed out'. A user server's own watch_time (usrrc, usr) overrides it.",
	},
	"max_processes": {
		set: func(s *System, v []string) (err error) {
			s.MaxProcesses, err = intIn(v, 0, 1<<20)
			return err
		},
		value:   "0",
		values:  "0..1048576; 0 = no cap; at least the sum of the servers' resident processes",
		tpsched: "A cap on the UAP processes of the whole node: non-resident processes start only below it.",
	},
	"name_port": {
		set: func(s *System, v []string) (err error) {
			s.NamePort, err = intIn(v, 0, 65535)
			return err
		},
		value:   "12002",
		values:  "0..65535; 0 picks a free one (tests)",
		tpsched: "The UDP and TCP port of membership and announces (memberlist), the same on every node of a cluster; used only when all_node names other nodes.",
	},
	"cluster_key": {
		set: func(s *System, v []string) (err error) {
			if s.ClusterKey, err = one(v); err != nil {
				return err
			}
			if n := len(s.ClusterKey); n < 16 || n > 1024 {
				return fmt.Errorf("want 16..1024 bytes, got %d", n)
			}
			return nil
		},
		dflt:   "none: peers are trusted blindly",
		values: "16..1024 bytes, the same on every node",
		tpsched: "A secret shared by the nodes of a cluster: membership gossip is encrypted with a key derived from it, " +
			"and announces and the hello of a peer connection that carries transferred calls are authenticated (HMAC-SHA256).",
		own: true,
	},
	"cluster_key_file": {
		set: func(s *System, v []string) (err error) {
			if s.clusterKeyFile, err = one(v); err != nil {
				return err
			}
			if s.clusterKeyFile == "" {
				return errors.New("empty path")
			}
			return nil // read by Load, which knows the directory
		},
		dflt:   "none",
		values: "a path, relative to the definition directory or absolute; the file holds the key (16..1024 bytes, a final newline is not part of it), not with cluster_key",
		tpsched: "cluster_key kept in a file of its own, so that sysconf can stay readable to others and the key not: " +
			"a key file that others can read is refused, one its group can read gives a warning at start.",
		own: true,
	},
	"uap_pids_max": {
		set: func(s *System, v []string) (err error) {
			s.uapPidsMax, err = intIn(v, 0, maxPids)
			return err
		},
		dflt:   "64 per process of a server's parallel_count maximum, at least 512",
		values: "tasks, 0..4194304; 0 = no limit",
		tpsched: "The pids limit of every user server whose definition gives none (usr uap_pids_max): how many processes and threads " +
			"its processes may have together (pids.max of its cgroup). A fork bomb stops there; the node and the other servers go on.",
		own: true,
	},
	"uap_memory_max": {
		set: func(s *System, v []string) (err error) {
			mib, err := intIn(v, 0, 1<<24)
			s.uapMemoryMax = int64(mib) << 20
			return err
		},
		dflt:   "half of the host's memory",
		values: "MiB, 0..16777216; 0 = no limit",
		tpsched: "The memory limit of every user server whose definition gives none (usr uap_memory_max): how much memory its processes " +
			"may use together (memory.max of its cgroup, memory.limit_in_bytes on cgroup v1). Past it the kernel kills one of them, not scdd.",
		own: true,
	},
	"uap_allow_root": {
		set: func(s *System, v []string) (err error) {
			s.uapAllowRoot, err = boolYN(v)
			return err
		},
		value:   "N",
		values:  "Y or N",
		tpsched: "Y allows a user server's uid or gid to be root (0). Without it a definition that would run UAPs as root is refused.",
		own:     true,
	},
	"memory_reserve": {
		set: func(s *System, v []string) (err error) {
			mib, err := intIn(v, 0, 1<<24)
			s.MemoryReserve = int64(mib) << 20
			return err
		},
		value:   "0",
		values:  "MiB, 0..16777216; 0 = no gate",
		opentp1: "If there is no spare system memory, a non-resident process is executed after the finish of any currently executing non-resident process (000).",
		tpsched: "Says what spare memory is: while MemAvailable is below this much, a non-resident process starts only after another one ended, higher schedule_priority first.",
		own:     true,
	},
	"max_connections": {
		set: func(s *System, v []string) (err error) {
			s.MaxConnections, err = intIn(v, 1, 1<<20)
			return err
		},
		value:   "10000",
		values:  "1..1048576",
		tpsched: "RPC connections open at once: one beyond is closed at once, counted (tpsched_connections_refused_total) and logged. scdd warns at start when the open-file limit cannot hold this many.",
		own:     true,
	},
	"uap_sched_batch": {
		set: func(s *System, v []string) (err error) {
			s.UAPSchedBatch, err = boolYN(v)
			return err
		},
		value:  "Y",
		values: "Y or N",
		tpsched: "Y starts UAP processes under the SCHED_BATCH policy (same weight, nice and cgroup as before): a UAP woken for a call " +
			"does not preempt the scheduler thread that woke it, but runs on an idle CPU or when that thread blocks, so the calls handed over " +
			"in one burst are served in one go. On the 2-core machine S1 at 64 connections serves about 25% more calls/s with it and " +
			"1 connection the same. N keeps the kernel's default policy (a woken UAP preempts).",
		own: true,
	},
	"frame_timeout": {
		set: func(s *System, v []string) (err error) {
			s.FrameTimeout, err = secondsIn(v, 1, 3600)
			return err
		},
		value:   "30",
		values:  "seconds, 1..3600",
		tpsched: "How long a frame may take to arrive whole once its first bytes came; a connection past it is closed and counted.",
		own:     true,
	},
	"rpc_buffer_budget": {
		set: func(s *System, v []string) (err error) {
			mib, err := intIn(v, 1, 1<<20)
			s.BufferBudget = int64(mib) << 20
			return err
		},
		value:   "64",
		values:  "MiB, 1..1048576",
		tpsched: "Bytes the RPC port may hold node-wide in partial frames and unsent answers; past it the connection holding the most is closed and counted. The requests of the calls admitted and not yet ended are kept under the same figure, counted apart: a call that would pass it is answered 'server busy' if its group holds more than its share (the budget over the number of groups). scdd's Go memory limit is this plus 128 MiB unless GOMEMLIMIT is set (a soft limit: with both counts full, the garbage collector works harder).",
		own:     true,
	},
}

func defaultSched() Sched {
	return Sched{AnnounceServerStatus: true, ScheduleRate: 50, Multi: 1, BalanceRule: "opentp1"}
}

var schedOperands = map[string]operand[Sched]{
	"scd_this_node_first": {
		set: func(s *Sched, v []string) (err error) {
			s.ThisNodeFirst, err = boolYN(v)
			return err
		},
		value:  "N",
		values: "Y or N",
		opentp1: "Y: a request goes to the user server on this node unless that server is hard to schedule (overloaded or shut down); only then to another node. " +
			"N: a node is chosen at random, avoiding nodes that are hard to schedule, so a request may leave this node even when it could be served here (000, 001 Table 3-7).",
	},
	"scd_announce_server_status": {
		set: func(s *Sched, v []string) (err error) {
			s.AnnounceServerStatus, err = boolYN(v)
			return err
		},
		value:  "Y",
		values: "Y or N; the same on every node",
		opentp1: "Y: the node reports its servers' load levels to every node (on a change, and at least every 30 seconds) and nodes are chosen by load. " +
			"N: nothing is reported and nodes are chosen at random (001 Table 3-7).",
	},
	"schedule_rate": {
		set: func(s *Sched, v []string) (err error) {
			s.ScheduleRate, err = intIn(v, 50, 100)
			return err
		},
		value:  "50",
		values: "percent, 50..100",
		opentp1: "The rate of schedules made to LEVEL0 nodes, for requests from a scheduler-direct client (DCSCDDIRECT=Y): LEVEL0 nodes weigh the rate, LEVEL1 nodes 100 - rate, " +
			"each times their number (80 with 3 LEVEL0 and 2 LEVEL1 nodes: 240:40, about 85:15) (000).",
		tpsched: "Applies to every call a client sends to this node's scheduler, that is every call not marked balanced; with scd_balance_rule = p2c it weighs the two choices.",
	},
	"scd_retry_of_comm_error": {
		set: func(s *Sched, v []string) (err error) {
			s.RetryOfCommError, err = intIn(v, 0, MaxNodes)
			return err
		},
		value:  "0",
		values: "0..128",
		opentp1: "How many other nodes a request is scheduled to after a communication error, never more than the nodes that run the service group; 0 returns the error (000). " +
			"On a retry LEVEL1 nodes are avoided unless only LEVEL1 and LEVEL2 nodes remain.",
		tpsched: "A transferred call is retried when the node chosen for it could not be reached.",
	},
	"scdmulti": {
		set: func(s *Sched, v []string) (err error) {
			s.Multi, err = intIn(v, 1, maxMulti)
			return err
		},
		value:  "1",
		values: "1..64",
		opentp1: "The multi-scheduler facility: besides the master scheduler daemon, start daemons that only receive service requests, " +
			"so that requests are not delayed by contention on receiving (000).",
		tpsched: "The number of receiving sockets (event loops) sharing the RPC port through SO_REUSEPORT, the first included: " +
			"the default receiver group, which takes the calls of every user server not bound to a named group (the command scdmulti -g). " +
			"A new connection goes to the socket with the least work (calls in flight plus connections) where the steering program loads, else by the kernel's hash.",
	},
	"scd_balance_rule": {
		set: func(s *Sched, v []string) (err error) {
			if s.BalanceRule, err = one(v); err != nil {
				return err
			}
			if s.BalanceRule != "opentp1" && s.BalanceRule != "p2c" {
				return fmt.Errorf("want opentp1 or p2c, got %q", s.BalanceRule)
			}
			return nil
		},
		value:  "opentp1",
		values: "opentp1 or p2c",
		tpsched: "How a node is chosen among those that run a group: opentp1 is the documents' rule (random, LEVEL2 avoided unless all are LEVEL2); " +
			"p2c takes two nodes at random and keeps the one with the lower level, then the fewer calls in flight from this node.",
		own: true,
	},
}

var schedCommands = map[string]command[Sched]{
	"scdmulti": {
		set: func(s *Sched, flags map[string]string) error {
			g := ReceiverGroup{Name: flags["g"], Count: 1}
			if _, ok := flags["g"]; !ok {
				return errors.New("-g GROUP is required (the default group is set scdmulti = N and rpc_port)")
			}
			if err := checkIdent("receiver group", g.Name); err != nil {
				return fmt.Errorf("-g: %w", err)
			}
			var err error
			if v, ok := flags["m"]; ok {
				if g.Count, err = parseUint(v, 1, maxMulti); err != nil {
					return fmt.Errorf("-m: %w", err)
				}
			}
			v, ok := flags["p"]
			if !ok {
				return errors.New("-p PORT is required (each receiver group listens on a port of its own)")
			}
			if g.Port, err = parseUint(v, 0, 65535); err != nil {
				return fmt.Errorf("-p: %w", err)
			}
			for _, o := range s.ReceiverGroups {
				if o.Name == g.Name {
					return fmt.Errorf("receiver group %q defined twice", g.Name)
				}
				if o.Port == g.Port && g.Port != 0 {
					return fmt.Errorf("port %d is receiver group %s's already", g.Port, o.Name)
				}
			}
			s.ReceiverGroups = append(s.ReceiverGroups, g)
			return nil
		},
		synopsis: "scdmulti -g GROUP -m COUNT -p PORT",
		dflt:     "none: one receiver group, the default, on rpc_port (set scdmulti)",
		values: "once per group: -g a name of 1..31 bytes of letters, digits, '_', '-' and '.', no group twice; -m 1..64 (default 1); " +
			"-p 0..65535, not rpc_port, not name_port, no two groups alike (0 picks a free one: tests)",
		opentp1: "Multi-scheduler daemons can be grouped by the servers that receive requests from a queue, so that servers do not contend for receiving " +
			"service request messages; a grouped server names its group with scdmulti in its user service definition (000, 002).",
		tpsched: "A named receiver group: COUNT receiving sockets (event loops) sharing PORT on rpc_address through SO_REUSEPORT. " +
			"Only the user servers bound to it (usr scdmulti -g GROUP) take calls there, and their calls are taken only there: " +
			"a call on another group's sockets is answered 'wrong receiver' naming the right address, which tpsched's Go client follows by itself. " +
			"The documents name the operand but not its shape; the options are those of OpenTP1's own scdmulti command.",
	},
}

var serverCommands = map[string]command[Server]{
	"scdmulti": {
		set: func(s *Server, flags map[string]string) error {
			name, ok := flags["g"]
			if !ok {
				return errors.New("-g GROUP is required (a receiver group of scdsvcdef)")
			}
			if err := checkIdent("receiver group", name); err != nil {
				return fmt.Errorf("-g: %w", err)
			}
			s.ReceiverGroup = name
			return nil
		},
		synopsis: "scdmulti -g GROUP",
		dflt:     "none: the server's calls are taken by the default receiver group (rpc_port)",
		values:   "-g a receiver group defined in scdsvcdef (scdmulti -g GROUP -m COUNT -p PORT); once per file; in usrrc it binds every server that does not say otherwise; only for receive_from = queue",
		opentp1:  "When multi-scheduler daemons are grouped, the server side names the group in its user service definition with scdmulti (000, 002).",
		tpsched: "Binds the server to the receiver group: its service group's calls are taken on that group's port only, and that port takes no other server's. " +
			"Contradicts set scdmulti = N.",
	},
}

func defaultServer() Server {
	return Server{
		Resident:          1,
		MaxProcesses:      1,
		BalanceCount:      3,
		NonResidentIdle:   DefaultNonResidentIdle,
		CPUWaitLimit:      DefaultCPUWaitLimit,
		SchedulePriority:  8,
		LoadCheckInterval: 30 * time.Second,
		MaxMessageSize:    DefaultMaxMessageSize,
		QueueSize:         DefaultQueueSize,
		WatchTime:         DefaultWatchTime, // replaced by sysconf's unless usrrc or usr sets it
		UID:               -1,
		GID:               -1,
		PidsMax:           AutoLimit, // likewise
		MemoryMax:         AutoLimit, // likewise
	}
}

var serverOperands = map[string]operand[Server]{
	"service_group": {
		set: func(s *Server, v []string) (err error) {
			if s.ServiceGroup, err = one(v); err != nil {
				return err
			}
			return checkIdent("service group", s.ServiceGroup)
		},
		dflt:    "none: required",
		values:  "1..31 bytes of letters, digits, '_', '-' and '.'",
		opentp1: "The service group the user server serves; the same group on several nodes is what inter-node load balancing spreads over (000).",
		tpsched: "Calls name it. One user server per group on a node.",
	},
	"service": {
		set: func(s *Server, v []string) error {
			seen := map[string]bool{}
			s.Services = nil
			for _, e := range v {
				name, entry, ok := strings.Cut(e, "=")
				if !ok {
					entry = name // "name" alone: the handler has the service's name
				}
				if err := checkIdent("service name", name); err != nil {
					return err
				}
				if err := checkIdent("entry", entry); err != nil {
					return err
				}
				if seen[name] {
					return fmt.Errorf("service %q listed twice", name)
				}
				seen[name] = true
				s.Services = append(s.Services, Service{Name: name, Entry: entry})
			}
			return nil
		},
		dflt:    "none: required",
		values:  `"name=entry" or "name", ...: names and entries 1..31 bytes of letters, digits, '_', '-' and '.'; no name twice`,
		opentp1: "The services of the user server: each service name with the entry point of the UAP that runs it.",
		tpsched: "A call for service name is served by the UAP's handler registered as entry; \"name\" alone means \"name=name\". When a UAP attaches, scdd logs (with file and line) each entry it does not register.",
	},
	"module": {
		set: func(s *Server, v []string) (err error) {
			if s.Module, err = one(v); err != nil {
				return err
			}
			if s.Module == "" || len(s.Module) > maxModuleLen {
				return fmt.Errorf("want 1..%d bytes, got %d", maxModuleLen, len(s.Module))
			}
			for i := 0; i < len(s.Module); i++ {
				if c := s.Module[i]; c < ' ' || c == 0x7f {
					return fmt.Errorf("control character %q not allowed", c)
				}
			}
			return nil
		},
		dflt:   "none: required",
		values: "a path or a file name, 1..4095 bytes without control characters",
		tpsched: "The UAP executable: an absolute path; a path with a '/' relative to the definition directory; " +
			"a bare name looked up in the definition directory's aplib/, then beside scdd, then in $PATH.",
	},
	"receive_from": {
		set: func(s *Server, v []string) error {
			r, err := one(v)
			if err != nil {
				return err
			}
			switch strings.ToLower(r) {
			case "queue":
				s.ReceiveFrom = ReceiveQueue
			case "socket":
				s.ReceiveFrom = ReceiveSocket
			default:
				return fmt.Errorf("want queue or socket, got %q", r)
			}
			return nil
		},
		value:  "queue",
		values: "queue or socket",
		opentp1: "Whether the server receives requests from a schedule queue or from a socket. A socket-receiving server cannot use the Multiserver facility: " +
			"its parallel_count must be one process; nodes are chosen for it at random, without looking at load (000).",
		tpsched: "queue: the shared-memory schedule queue. socket: one process served over a socket; needs parallel_count = 1.",
	},
	"parallel_count": {
		set: func(s *Server, v []string) error {
			if len(v) != 1 && len(v) != 2 {
				return fmt.Errorf("want resident[,max], got %d values", len(v))
			}
			res, err := parseUint(v[0], 0, maxParallel)
			if err != nil {
				return fmt.Errorf("resident: %w", err)
			}
			mx := res
			if len(v) == 2 {
				if mx, err = parseUint(v[1], 0, maxParallel); err != nil {
					return fmt.Errorf("max: %w", err)
				}
			}
			if mx == 0 {
				return fmt.Errorf("max 0: a server needs at least one process")
			}
			if res > mx {
				return fmt.Errorf("resident %d exceeds max %d", res, mx)
			}
			s.Resident, s.MaxProcesses = res, mx
			return nil
		},
		value:  "1",
		values: "resident[,max]: 0..1024 each, resident <= max, max >= 1; max defaults to resident",
		opentp1: "The Multiserver facility: resident processes start with the server and stay; max - resident non-resident processes " +
			"start when they are needed (see balance_count) (000).",
	},
	"balance_count": {
		set: func(s *Server, v []string) (err error) {
			s.BalanceCount, err = intIn(v, 0, maxBalance)
			return err
		},
		value:  "3",
		values: "0..4096",
		opentp1: "A non-resident process starts while the requests remaining in the schedule queue exceed balance_count x the processes running, " +
			"and non-resident processes stop when fewer remain (000).",
		tpsched: "With 0 a non-resident process is started per waiting request. A process stops only after nonresident_idle_time without work.",
	},
	"nonresident_idle_time": {
		set: func(s *Server, v []string) (err error) {
			ms, err := intIn(v, 0, 3600000)
			s.NonResidentIdle = time.Duration(ms) * time.Millisecond
			return err
		},
		value:   "500",
		values:  "milliseconds, 0..3600000",
		tpsched: "How long a non-resident process idles before the balance_count rule may stop it: keeps the rule from starting and stopping processes on every burst.",
		own:     true,
	},
	"cpu_wait_limit": {
		set: func(s *Server, v []string) (err error) {
			s.CPUWaitLimit, err = intIn(v, 0, 100)
			return err
		},
		value:  "50",
		values: "percent, 0..100; 0 = no guard",
		tpsched: "No non-resident process starts while the group's busy processes spend this share of their runnable time waiting for a CPU: " +
			"another process could not help then.",
		own: true,
	},
	"schedule_priority": {
		set: func(s *Server, v []string) (err error) {
			s.SchedulePriority, err = intIn(v, 1, maxPriority)
			return err
		},
		value:   "8",
		values:  "1 (highest) .. 16 (lowest)",
		opentp1: "The server's scheduling priority: non-resident processes of a server with a higher priority are scheduled before those of a lower one (000).",
		tpsched: "Also the CPU weight of the server's processes: the cgroup's cpu.weight (or cpu.shares on cgroup v1), else nice.",
	},
	"scd_refresh_process": {
		set: func(s *Server, v []string) (err error) {
			s.RefreshProcess, err = boolYN(v)
			return err
		},
		value:   "N",
		values:  "Y or N; Y needs parallel_count = 0,max and balance_count = 0",
		opentp1: "The non-resident UAP process refresh facility: a non-resident process is replaced by a fresh one after each request; only with balance_count 0 (002).",
	},
	"loadcheck_interval": {
		set: func(s *Server, v []string) (err error) {
			s.LoadCheckInterval, err = secondsIn(v, 0, maxSeconds)
			return err
		},
		value:  "30",
		values: "seconds, 0..65535; 0 = no load check for this group",
		opentp1: "How often the group's load level is checked (Table 3-12, or Table 3-14 with the thresholds below). Checks run on a tick of the greatest common divisor " +
			"of 10 and every server's interval (3 and 5 give 1 s). A changed level is reported to every node (000).",
	},
	"levelup_queue_count": {
		set: func(s *Server, v []string) error {
			p, err := pair(v, 0, maxQueueCount)
			if err != nil {
				return fmt.Errorf("want U1,U2: %w", err)
			}
			if p[0] > p[1] {
				return fmt.Errorf("U1 %d exceeds U2 %d (Table 3-14 needs U1 <= U2)", p[0], p[1])
			}
			s.LevelUp = p
			return nil
		},
		dflt:    "none: Table 3-12 (the processing rate) decides the level",
		values:  "U1,U2: 0..32767 each; with leveldown_queue_count, 0 <= D0 < U1 <= U2 <= queue_size",
		opentp1: "The numbers of requests remaining in the queue (U1, U2) that raise the level to LEVEL1 and LEVEL2 (000 Table 3-14).",
		tpsched: "Given with leveldown_queue_count or not at all; the order of the four values is checked so that no row of Table 3-14 is empty.",
	},
	"leveldown_queue_count": {
		set: func(s *Server, v []string) error {
			p, err := pair(v, 0, maxQueueCount)
			if err != nil {
				return fmt.Errorf("want D0,D1: %w", err)
			}
			if p[0] > p[1] {
				return fmt.Errorf("D0 %d exceeds D1 %d (Table 3-14 needs D0 <= D1)", p[0], p[1])
			}
			s.LevelDown = p
			return nil
		},
		dflt:    "none: Table 3-12 (the processing rate) decides the level",
		values:  "D0,D1: 0..32767 each; with levelup_queue_count, D0 <= D1 < U2",
		opentp1: "The numbers of requests remaining in the queue (D0, D1) that lower the level to LEVEL0 and LEVEL1 (000 Table 3-14).",
		tpsched: "Given with levelup_queue_count or not at all.",
	},
	"loadlevel_message": {
		set: func(s *Server, v []string) (err error) {
			s.LoadLevelMessage, err = boolYN(v)
			return err
		},
		value:   "N",
		values:  "Y or N",
		opentp1: "Y: a message reports each change of the group's load level (000).",
		tpsched: "The message is a log line with the Q, q and X behind the change.",
	},
	"scdmulti": {
		set: func(s *Server, v []string) (err error) {
			s.multi, err = boolYN(v)
			return err
		},
		dflt:    "as Y when scdsvcdef's scdmulti is 2 or more",
		values:  "Y or N; Y needs scdmulti of 2 or more in scdsvcdef, N needs scdmulti 1 there",
		opentp1: "On the receiving side of the multi-scheduler facility: the server's requests are received by the multi-scheduler daemons (000).",
		tpsched: "Every socket of the default receiver group (rpc_port) takes the calls of every server not bound to a named group, so such a server cannot be kept off them: " +
			"N is refused while scdsvcdef's scdmulti is 2 or more, and Y says what happens anyway. " +
			"To give a server receivers of its own, bind it to a named group with the command scdmulti -g GROUP.",
	},
	"multi_schedule": {
		set: func(s *Server, v []string) (err error) {
			s.MultiSchedule, err = boolYN(v)
			return err
		},
		value:   "N",
		values:  "Y or N",
		opentp1: "On the sending side of the multi-scheduler facility: the server's RPCs are spread over the receiving node's multi-scheduler daemons (000).",
		tpsched: "The sending side in tpsched is the node transferring a call to another node: with Y it keeps one connection per receiver of the group's " +
			"receiver group there (learned from that node) and spreads the calls over them, instead of sending all on one. " +
			"A group this node transfers but does not define takes usrrc's value. Go callers set client.Options.MultiSchedule.",
	},
	"max_message_size": {
		set: func(s *Server, v []string) (err error) {
			s.MaxMessageSize, err = intIn(v, minMessage, MaxMaxMessageSize)
			return err
		},
		value:   "1048576",
		values:  "bytes, 1024..8388608",
		tpsched: "The largest request or reply of the group; a larger request is refused with 'message too big'.",
	},
	"queue_size": {
		set: func(s *Server, v []string) (err error) {
			s.QueueSize, err = intIn(v, 1, maxQueueSize)
			return err
		},
		value:   "256",
		values:  "slots, 1..65536",
		tpsched: "The schedule queue's length: a call that finds it full is refused with 'server busy'.",
	},
	"uid": {
		set: func(s *Server, v []string) (err error) {
			s.UID, err = lookupID(v, "user")
			return err
		},
		dflt:   "a root scdd: an id of the server's own (a hash of its name from 1900000000, no passwd entry); otherwise scdd's user",
		values: "a user name that exists on the node, or a number 0..4294967294; root (0) only with sysconf uap_allow_root = Y",
		tpsched: "The user the server's UAP processes run as; a name is looked up when the definitions are read. " +
			"A root scdd never runs a UAP as root by default: each server without uid gets an id of its own, so that one group's processes cannot reach another's.",
	},
	"gid": {
		set: func(s *Server, v []string) (err error) {
			s.GID, err = lookupID(v, "group")
			return err
		},
		dflt:    "the primary group of uid's user; with no uid, as uid's default",
		values:  "a group name that exists on the node, or a number 0..4294967294; root (0) only with sysconf uap_allow_root = Y",
		tpsched: "The group the server's UAP processes run as (no supplementary groups); a name is looked up when the definitions are read.",
	},
	"uap_pids_max": {
		set: func(s *Server, v []string) (err error) {
			s.PidsMax, err = intIn(v, 0, maxPids)
			return err
		},
		dflt:   "sysconf's uap_pids_max",
		values: "tasks, 0..4194304; 0 = no limit",
		tpsched: "How many processes and threads the server's processes may have together: pids.max of its cgroup. " +
			"A fork past it fails in the UAP; `scdctl status` shows the limit, the count now and how often it was hit.",
		own: true,
	},
	"uap_memory_max": {
		set: func(s *Server, v []string) (err error) {
			mib, err := intIn(v, 0, 1<<24)
			s.MemoryMax = int64(mib) << 20
			return err
		},
		dflt:   "sysconf's uap_memory_max",
		values: "MiB, 0..16777216; 0 = no limit",
		tpsched: "How much memory the server's processes may use together (memory.max of its cgroup). Past it the kernel kills one of them " +
			"(the node replaces it; `scdctl status` counts the kills).",
		own: true,
	},
	"working_directory": {
		set: func(s *Server, v []string) (err error) {
			if s.WorkingDirectory, err = one(v); err != nil {
				return err
			}
			if s.WorkingDirectory == "" {
				return errors.New("empty path")
			}
			return nil
		},
		dflt: "a directory of the server's own that the node prepares, owned by its UAP user: /var/lib/tpsched/NODE_ID/SERVER as root, " +
			"else $TMPDIR/tpsched-UID/NODE_ID/SERVER",
		values:  "a directory, absolute or relative to the definition directory, that the server's user can enter",
		tpsched: "The working directory of the server's UAP processes (they no longer share scdd's). The node checks that it exists; it does not create or change it.",
		own:     true,
	},
	"watch_time": {
		set: func(s *Server, v []string) (err error) {
			s.WatchTime, err = secondsIn(v, 0, maxSeconds)
			return err
		},
		dflt:    "sysconf's watch_time",
		values:  "seconds, 0..65535; 0 = for ever",
		tpsched: "How long a call to this group waits for its answer before it fails with 'timed out'.",
	},
}

func defaultClient() Client {
	return Client{
		CacheEntries:   DefaultCacheEntries,
		CacheTime:      DefaultCacheTime,
		WatchTime:      DefaultWatchTime,
		MaxMessageSize: DefaultMaxMessageSize,
	}
}

var clientOperands = map[string]operand[Client]{
	"dchost": {
		set: func(c *Client, v []string) error {
			if len(v) > MaxNodes {
				return fmt.Errorf("%d hosts, at most %d", len(v), MaxNodes)
			}
			for _, h := range v {
				if _, _, err := SplitHostPort(h, DefaultRPCPort); err != nil {
					return err
				}
			}
			c.Hosts = append([]string(nil), v...)
			return nil
		},
		dflt:    "none: the calling program names its own nodes",
		values:  "host[:port], ... (the port defaults to 12000); at most 128",
		opentp1: "The OpenTP1 nodes the client asks to schedule its requests, in this order (000, 003).",
		tpsched: "A node that cannot be reached is passed over for the next; a call that was sent is never sent to a second node.",
	},
	"dcscddirect": {
		set: func(c *Client, v []string) (err error) {
			_, err = boolYN(v) // LoadClient checks it against dccltloadbalance
			return err
		},
		dflt:    "as Y",
		values:  "Y or N; N needs dccltloadbalance = Y",
		opentp1: "Y: the client sends its requests to the schedule service of a dchost node, which balances them over the nodes (the server side decides; 000, 001 Table 3-6).",
		tpsched: "The client always sends its calls straight to a scheduler: a dchost node's, or with dccltloadbalance = Y one it learned from the name service. " +
			"N without dccltloadbalance = Y would ask for RPCs through the name service without balancing, which tpsched does not have, so it is refused.",
	},
	"dchostselect": {
		set: func(c *Client, v []string) (err error) {
			c.HostSelect, err = boolYN(v)
			return err
		},
		value:   "N",
		values:  "Y or N",
		opentp1: "Y: the first dchost node is chosen at random instead of in order (000, 003).",
	},
	"dcscdhostchange": {
		set: func(c *Client, v []string) (err error) {
			c.HostChange, err = boolYN(v)
			return err
		},
		value:   "N",
		values:  "Y or N",
		opentp1: "Y: every RPC goes to the next dchost scheduler, round robin (003).",
	},
	"dccltloadbalance": {
		set: func(c *Client, v []string) (err error) {
			c.LoadBalance, err = boolYN(v)
			return err
		},
		value:  "N",
		values: "Y or N",
		opentp1: "Y: the client decides: it asks a node's name service which schedulers serve the group, caches those with the lowest load level, " +
			"picks the first at random and then goes round robin; the receiving node serves such a request itself unless the server is held there, " +
			"or is LEVEL2 while another node is lower. An RPC to an explicit destination does not balance (000, 001, 003).",
		tpsched: "Calls fall back to dchost when no node can be learned or reached.",
	},
	"dccache": {
		set: func(c *Client, v []string) (err error) {
			c.CacheEntries, err = intIn(v, 1, maxCache)
			return err
		},
		value:   "64",
		values:  "1..4096",
		opentp1: "The size of the client's cache of load information, managed least recently used first (000, 003).",
		tpsched: "Counted in service groups.",
	},
	"dccltcachetim": {
		set: func(c *Client, v []string) (err error) {
			c.CacheTime, err = secondsIn(v, 0, maxSeconds)
			return err
		},
		value:   "30",
		values:  "seconds, 0..65535",
		opentp1: "How long cached load information is used before the name service is asked again: shorter follows the load better and asks more often (000, 003).",
		tpsched: "0: ask before every call.",
	},
	"dcnamuse": {
		set: func(c *Client, v []string) (err error) {
			_, err = boolYN(v) // LoadClient checks it against dccltloadbalance
			return err
		},
		dflt:    "as dccltloadbalance",
		values:  "Y or N, the same as dccltloadbalance",
		opentp1: "Y: RPCs ask the name service which scheduler to send to; client-side load balancing needs dcnamuse=Y with dccltloadbalance=Y (003).",
		tpsched: "The client asks the name service exactly when it balances (dccltloadbalance = Y), so dcnamuse may be left out; " +
			"a value that differs from dccltloadbalance's is refused.",
	},
	"dcwatchtim": {
		set: func(c *Client, v []string) (err error) {
			c.WatchTime, err = secondsIn(v, 0, maxSeconds)
			return err
		},
		value:   "180",
		values:  "seconds, 0..65535; 0 = for ever",
		tpsched: "How long a call waits for its answer when the caller gives no deadline.",
	},
	"dcmaxmsgsize": {
		set: func(c *Client, v []string) (err error) {
			c.MaxMessageSize, err = intIn(v, minMessage, MaxMaxMessageSize)
			return err
		},
		value:   "1048576",
		values:  "bytes, 1024..8388608",
		tpsched: "A larger request is refused before it is sent.",
	},
}

// clientAliases are other names betranrc accepts, spelled as in the server
// files.
var clientAliases = map[string]string{
	"watch_time":       "dcwatchtim",
	"max_message_size": "dcmaxmsgsize",
}

// refusedOperands are operands of OpenTP1's that tpsched refuses in any
// file, with the reason; the reference lists them too.
var refusedOperands = map[string]refusedOperand{}

type refusedOperand struct {
	file    string // where OpenTP1 puts it
	opentp1 string
	why     string
}

// unknownOperand is the reason for an operand that table does not know:
// where it belongs instead, or the operand it was likely meant to be.
func unknownOperand[T any](name string, table map[string]operand[T]) string {
	if w := whereElse(name); w != "" {
		return "unknown operand here (it belongs in " + w + ")"
	}
	here := make([]string, 0, len(table))
	for op := range table {
		here = append(here, op)
	}
	if s := Suggest(name, here); s != "" {
		return "unknown operand (did you mean " + s + "?)"
	}
	if s := Suggest(name, allOperandNames()); s != "" {
		return "unknown operand (did you mean " + s + "? it belongs in " + whereElse(s) + ")"
	}
	return "unknown operand"
}

// allOperandNames lists the operands of every kind of file, and betranrc's
// aliases.
func allOperandNames() []string {
	var all []string
	for op := range systemOperands {
		all = append(all, op)
	}
	for op := range schedOperands {
		all = append(all, op)
	}
	for op := range serverOperands {
		all = append(all, op)
	}
	for op := range clientOperands {
		all = append(all, op)
	}
	for a := range clientAliases {
		all = append(all, a)
	}
	return all
}

// whereElse names the file an operand belongs in, for "unknown operand".
func whereElse(name string) string {
	if _, ok := systemOperands[name]; ok {
		return "sysconf"
	}
	if _, ok := schedOperands[name]; ok {
		return "scdsvcdef"
	}
	if _, ok := serverOperands[name]; ok {
		return "usrrc or usr/<server>"
	}
	if _, ok := clientOperands[name]; ok || clientAliases[name] != "" {
		return "betranrc"
	}
	return ""
}
