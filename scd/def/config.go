// Package def reads an OpenTP1-style definition directory (sysconf,
// scdsvcdef, usrrc, usr/<server>, betranrc) into typed, validated
// configuration. It owns the syntax, every operand's default and range, and
// the contradictions between operands; it touches neither the network nor
// processes. Every error in a file's content names the file (relative to the
// definition directory), the line and the operand:
//
//	usr/echo:7: parallel_count: resident 3 exceeds max 2
//
// # Usage
//
//	cfg, err := def.Load(dir)       // a definition directory
//	cfg, err := def.LoadFS(fsys)    // the same, from an fs.FS
//	cfg, err := def.LoadDefault()   // the embedded one-node demo (default/)
//	cc, err := def.LoadClient(path) // betranrc, overlaid by the environment
//	host, port, err := def.SplitHostPort("host1:12000", def.DefaultRPCPort)
//
// Errors are *Error. Parse exposes the syntax alone (statements, no operand
// knowledge).
package def

import "time"

// Config is one node's whole definition.
type Config struct {
	Dir     string // the directory it was read from; "" for the embedded default
	System  System
	Sched   Sched
	Servers []Server // one per file in usr/, sorted by name
	// Usrrc is the user service default definition applied to the
	// defaults: what holds for a service group this node transfers calls
	// for but does not define (its multi_schedule).
	Usrrc Server
	// Policy is the service policy definition (svcpolicy: service classes,
	// classification, application environments); nil without the file.
	Policy *Policy
}

// System is the system common definition (sysconf).
type System struct {
	NodeID         string        // node_id, 1..255 bytes; default: the host name
	RPCAddress     string        // rpc_address: the IP address or host name scdd listens on; default "127.0.0.1" (loopback unless a definition says otherwise)
	RPCPort        int           // rpc_port, 0..65535; default 12000; 0 picks a free port (scdd logs it)
	AllNodes       []string      // all_node: host[:port] of every node (port default rpc_port), this one included; at most 128 (002), as written
	MetricsAddress string        // metrics_address: host:port of the read-only HTTP endpoints /metrics and /status; default "127.0.0.1:12001"
	ControlSocket  string        // control_socket: path of the unix socket for control actions (hold, release, pprof), only for scdd's own user and root; relative to the definition directory; "" = the default scd.ControlSocketPath chooses (tpsched)
	WatchTime      time.Duration // watch_time (seconds, 0..65535): how long a caller waits for an answer; default 180 s, 0 = forever
	MemoryReserve  int64         // memory_reserve (MiB in the file, bytes here): below this much MemAvailable a non-resident process starts only after another ends; 0 = no gate
	MaxProcesses   int           // max_processes: node-wide cap on UAP processes, at least the sum of resident ones; 0 = no cap
	NamePort       int           // name_port: the UDP and TCP port of membership and announces (memberlist), the same on every node; default 12002; 0 picks a free one
	ClusterKey     string        // cluster_key: 16..1024 bytes shared by every node; peers' messages are authenticated with it (HMAC-SHA256); none = peers are trusted blindly
	uapAllowRoot   bool          // uap_allow_root: Y lets a user server's uid or gid be root (0); default N
	MaxConnections int           // max_connections: RPC connections open at once, 1..1048576; one beyond is closed at once, counted and logged; default 10000 (tpsched)
	FrameTimeout   time.Duration // frame_timeout (seconds, 1..3600): how long a frame may take to arrive whole once its first bytes came; default 30 s (tpsched)
	BufferBudget   int64         // rpc_buffer_budget (MiB in the file, bytes here), 1..1048576: bytes the RPC port holds in partial frames and unsent answers, node-wide; past it the connection holding the most is closed; default 64 MiB (tpsched)
	UAPSchedBatch  bool          // uap_sched_batch: Y starts UAPs as SCHED_BATCH, so a woken UAP does not preempt the scheduler thread that woke it; default Y (tpsched)
	UAPCPUGroups   string        // uap_cpu_groups: CPUGroupsPriority (the default) gives a server a cpu cgroup of its own on cgroup v1 only when a weight asks for one, CPUGroupsAlways always (tpsched)
	uapPidsMax     int           // uap_pids_max: every server's pids limit unless its definition gives one; AutoLimit (the default) = PidsMaxAuto, 0 = none (tpsched)
	uapMemoryMax   int64         // uap_memory_max (MiB in the file, bytes here): every server's memory limit unless its definition gives one; AutoLimit (the default) = half the host's memory, 0 = none (tpsched)
	clusterKeyFile string        // cluster_key_file: the file cluster_key was read from, as written (relative to the definition directory); "" when none (tpsched)

	// keyWarning is what the operator should hear about where cluster_key
	// is kept (a sysconf or key file others can read); see Warnings.
	keyWarning string
}

// AutoLimit is a pids or memory limit left to its default: the node
// computes it (PidsMaxAuto, half the host's memory).
const AutoLimit = -1

// PidsMaxAuto is the pids limit of a server whose definitions give none:
// 64 tasks (processes and threads) for each process parallel_count allows,
// and at least 512. A Go UAP runs about ten threads; the limit is there to
// stop a fork bomb, not to ration an honest server.
func PidsMaxAuto(maxProcesses int) int { return max(512, 64*maxProcesses) }

// Sched is the schedule service definition (scdsvcdef).
type Sched struct {
	ThisNodeFirst        bool   // scd_this_node_first; default N
	AnnounceServerStatus bool   // scd_announce_server_status; default Y
	ScheduleRate         int    // schedule_rate, 50..100; default 50
	RetryOfCommError     int    // scd_retry_of_comm_error, 0..128; default 0
	Multi                int    // scdmulti: receiving sockets (event loops) on the RPC port, 1..64; default 1
	BalanceRule          string // scd_balance_rule: "opentp1" (random, LEVEL2 avoided; the default) or "p2c" (power of two choices on level, then this node's in-flight count) (tpsched)
	// ReceiverGroups are the named multi-scheduler groups (the command
	// scdmulti -g NAME -m COUNT -p PORT, once per group), in the order given.
	ReceiverGroups []ReceiverGroup
}

// ReceiverGroup is one named group of receiving sockets (multi-scheduler
// daemons): Count sockets sharing Port on rpc_address. Only the user
// servers bound to it (usr scdmulti -g NAME) take calls there, and only
// there.
type ReceiverGroup struct {
	Name  string // -g: 1..31 bytes of [A-Za-z0-9_.-]
	Count int    // -m: receiving sockets, 1..64; default 1
	Port  int    // -p: 0..65535, not rpc_port or name_port, no two groups alike; 0 picks a free one (tests)
}

// ReceiveFrom says how a user server takes its requests.
type ReceiveFrom int

const (
	ReceiveQueue  ReceiveFrom = iota // from the shared-memory schedule queue
	ReceiveSocket                    // over a socket, exactly one process
)

// Service is one entry of the service operand, "name=entry" or "name"
// (entry = name).
type Service struct {
	Name  string // what a call names
	Entry string // the UAP's handler that serves it
}

// Server is one user server (usr/<name>), with usrrc's defaults applied.
type Server struct {
	Name              string        // the file name under usr/
	File              string        // the file it came from, for messages
	ServiceGroup      string        // service_group (required; 1..31 bytes of [A-Za-z0-9_.-])
	Services          []Service     // service = "name=entry" or "name", ... (required; names and entries 1..31 bytes of [A-Za-z0-9_.-])
	Module            string        // module: the UAP executable, as written (required); one group has one module on a node
	ReceiveFrom       ReceiveFrom   // receive_from = queue|socket; default queue; socket needs parallel_count = 1
	Resident          int           // parallel_count first value, 0..1024; default 1
	MaxProcesses      int           // parallel_count second value, 1..1024, >= Resident; default = Resident
	BalanceCount      int           // balance_count, 0..4096; default 3
	NonResidentIdle   time.Duration // nonresident_idle_time (milliseconds, 0..3600000): how long a non-resident process idles before it may stop; default 500 ms (tpsched: keeps the balance_count rule from flapping)
	CPUWaitLimit      int           // cpu_wait_limit (percent, 0..100): no non-resident start while the group's busy processes spend this share of their runnable time waiting for a CPU; default 50; 0 = no guard (tpsched)
	SchedulePriority  int           // schedule_priority 1 (highest) .. 16 (lowest); default 8
	RefreshProcess    bool          // scd_refresh_process; default N; Y needs resident 0 and balance_count 0 (002)
	LoadCheckInterval time.Duration // loadcheck_interval (seconds, 0..65535); default 30 s; 0 = no load check
	LevelUp           [2]int        // levelup_queue_count U1,U2 (0..32767); 0 <= D0 < U1 <= U2 <= QueueSize
	LevelDown         [2]int        // leveldown_queue_count D0,D1 (0..32767); D0 <= D1 < U2
	LevelThresholds   bool          // whether levelup/leveldown_queue_count were given (both or neither)
	LoadLevelMessage  bool          // loadlevel_message; default N
	MaxMessageSize    int           // max_message_size (bytes, 1 KiB .. 8 MiB); default 1 MiB
	QueueSize         int           // queue_size (slots, 1..65536); default 256
	WatchTime         time.Duration // watch_time (seconds, 0..65535); default sysconf's
	Env               []string      // putenv NAME value, as "NAME=value": usrrc's first, the server's own replacing same names
	UID               int           // uid: the user the server's processes run as, resolved to its number; -1 when not given; 0 only with sysconf uap_allow_root = Y
	GID               int           // gid: the group the server's processes run as, resolved to its number; -1 when not given; 0 only with uap_allow_root = Y
	PidsMax           int           // uap_pids_max: tasks (processes and threads) the server's processes may have together; AutoLimit = PidsMaxAuto(MaxProcesses), 0 = none; default sysconf's (tpsched)
	MemoryMax         int64         // uap_memory_max (MiB in the file, bytes here): memory the server's processes may use together; AutoLimit = half the host's memory, 0 = none; default sysconf's (tpsched)
	WorkingDirectory  string        // working_directory: the processes' working directory, as written (relative to the definition directory); "" = one the node prepares for the server (tpsched)

	ReceiverGroup string // scdmulti -g NAME: the receiver group whose sockets alone take the server's calls; "" the default group (the RPC port)
	MultiSchedule bool   // multi_schedule: calls this node transfers for the group are spread over the receiving node's receivers of the group; default N

	multi bool           // set scdmulti = Y|N, checked against scdsvcdef's; every socket of the default group takes every unbound group's calls, so nothing reads it
	given map[string]pos // where each operand given was set, for Errorf
}

// Client is the client environment definition (betranrc and environment
// variables of the same names in upper case; see LoadClient).
type Client struct {
	Hosts      []string // dchost: host[:port] (port default 12000), in order, as written; at most 128; none by default
	HostSelect bool     // dchostselect: start at a random host
	HostChange bool     // dcscdhostchange: next host on every RPC
	// SchedulerDirect is dcscddirect: Y marks the calls sent to a dchost
	// node scheduler-direct requests, balanced there with schedule_rate
	// weighting; N (default) leaves the node to send them to the
	// least-loaded node (Table 3-7 as written).
	SchedulerDirect bool
	LoadBalance     bool          // dccltloadbalance
	CacheEntries    int           // dccache, 1..4096; default 64
	CacheTime       time.Duration // dccltcachetim (seconds, 0..65535); default 30 s
	WatchTime       time.Duration // dcwatchtim (or watch_time in betranrc), seconds 0..65535; default 180 s
	MaxMessageSize  int           // dcmaxmsgsize (or max_message_size in betranrc), 1 KiB .. 8 MiB; default 1 MiB
}

// Defaults.
const (
	DefaultRPCPort         = 12000
	DefaultNamePort        = 12002
	DefaultMetricsAddress  = "127.0.0.1:12001"
	DefaultWatchTime       = 180 * time.Second
	DefaultMaxMessageSize  = 1 << 20
	MaxMaxMessageSize      = 8 << 20
	DefaultQueueSize       = 256
	MaxNodes               = 128 // all_node and dchost entries (002: at most 128 nodes)
	MaxSocketPath          = 107 // bytes of a unix socket path (sun_path less its NUL)
	DefaultNonResidentIdle = 500 * time.Millisecond
	DefaultCPUWaitLimit    = 50 // percent
	DefaultCacheEntries    = 64 // dccache
	DefaultCacheTime       = 30 * time.Second
	DefaultMaxConnections  = 10000
	DefaultFrameTimeout    = 30 * time.Second
	DefaultBufferBudget    = 64 << 20
)
