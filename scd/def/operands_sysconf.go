package def

import (
	"fmt"
	"net"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The operands of sysconf: the node (operands.go has the tables' shape).

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
		UAPCPUGroups:   CPUGroupsPriority,
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
			// The id is a label of metrics, a key of /status's JSON and
			// what scdctl -node matches: bytes that are no UTF-8 come back
			// from JSON as U+FFFD, and a blank nobody sees (a no-break
			// space) makes an id that no one can type.
			if !utf8.ValidString(s.NodeID) {
				return fmt.Errorf("%q is not UTF-8", shown(s.NodeID))
			}
			for _, r := range s.NodeID {
				if unicode.IsSpace(r) || !unicode.IsGraphic(r) || r == '"' || r == ',' {
					return fmt.Errorf("%q: %q not allowed", shown(s.NodeID), r)
				}
			}
			return nil
		},
		dflt:    "the host name",
		values:  "1..255 bytes of UTF-8 without blanks, control characters, quotes or commas",
		tpsched: "The node's name towards its peers, in announces, in `scdctl status` and in metric labels. Every node of a cluster needs its own.",
	},
	"rpc_address": {
		set: func(s *System, v []string) (err error) {
			if s.RPCAddress, err = one(v); err != nil {
				return err
			}
			if !validHost(s.RPCAddress) {
				return fmt.Errorf("%q is not an IP address or host name (the port goes in rpc_port)", shown(s.RPCAddress))
			}
			return nil
		},
		value:  "127.0.0.1",
		values: "an IP address or a host name, without a port",
		tpsched: "The address the RPC port listens on; in a cluster the name port (membership and announces) listens there too. " +
			"Together with rpc_port it tells which all_node entry is this node. Loopback unless a definition names another address: " +
			"an all_node entry on another host then is an error, and a non-loopback address without cluster_key a warning at start-up. " +
			"On 0.0.0.0 or :: alike the RPC port listens on every address, IPv6's too.",
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
					return fmt.Errorf("%q is not an IP address or host name", shown(host))
				}
				return nil
			}
			_, _, err = SplitHostPort(s.MetricsAddress, 0)
			return err
		},
		value:  DefaultMetricsAddress,
		values: "host:port; port 0 picks a free one; not rpc_port or, in a cluster, name_port on the same address",
		tpsched: "The read-only HTTP endpoint of `/metrics` and `/status`. Control actions (hold, release, pprof) go to control_socket. " +
			"A host of 0.0.0.0 or :: alike listens on every address, IPv6's too.",
		own: true,
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
			path, err := one(v)
			if err != nil {
				return err
			}
			// Load's errors about the file repeat the path: it is bounded
			// as a path is (PATH_MAX less its NUL), not cut short there.
			// One refused is not kept: Load reads the file even when sysconf
			// has errors.
			if path == "" || len(path) > maxModuleLen {
				return fmt.Errorf("want a path of 1..%d bytes, got %d", maxModuleLen, len(path))
			}
			s.clusterKeyFile = path
			return nil // read by Load, which knows the directory
		},
		dflt:   "none",
		values: "a path of 1..4095 bytes, relative to the definition directory or absolute; the file holds the key (16..1024 bytes, a final newline is not part of it), not with cluster_key",
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
	"uap_cpu_groups": {
		set: func(s *System, v []string) (err error) {
			if s.UAPCPUGroups, err = one(v); err != nil {
				return err
			}
			if s.UAPCPUGroups != CPUGroupsPriority && s.UAPCPUGroups != CPUGroupsAlways {
				return fmt.Errorf("want %s or %s, got %q", CPUGroupsPriority, CPUGroupsAlways, shown(s.UAPCPUGroups))
			}
			return nil
		},
		value:  CPUGroupsPriority,
		values: CPUGroupsPriority + " or " + CPUGroupsAlways,
		tpsched: "With priority, a server's processes get a cpu cgroup of their own " +
			"only when its schedule_priority is not the default 8 or goal management gives it a weight (then the cgroup is made and its processes moved into it); " +
			"until then they share scdd's own cpu cgroup, where the host allows it: on cgroup v1 with the cpu hierarchy mounted apart and another of the server's cgroups to find its processes in; " +
			"on cgroup v2 when scdd runs in a unit with Delegate=yes, where the cpu controller stays off below the unit until the first server needs a weight, and then every server has a cpu cgroup. The kernel's group scheduling let processes that wake each other without pause in a cpu cgroup of their own " +
			"(two UAPs on a lane) keep every process outside it, scdd's threads included, from the CPU for seconds; in scdd's cgroup they are tasks beside its own. " +
			"always gives every server its cgroup, as before.",
		own: true,
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
