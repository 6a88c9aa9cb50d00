package def

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// The operands of usr/<server>: a user server (operands.go has the tables' shape).

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
					return fmt.Errorf("service %q listed twice", shown(name))
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
				return fmt.Errorf("want queue or socket, got %q", shown(r))
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
		dflt:    "the primary group of uid's user (a uid with no passwd entry: the group of the same number); with no uid, as uid's default",
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
