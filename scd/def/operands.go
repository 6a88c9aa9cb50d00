package def

import (
	"fmt"
	"net"
	"strings"
	"time"
)

// Operand tables, one per file kind. A handler gets the values of one set
// statement and returns the reason a value is wrong; the caller adds the
// file, line and operand. Defaults live in defaultSystem, defaultSched and
// defaultServer.

type handler[T any] func(dst *T, v []string) error

func defaultSystem(hostname string) System {
	return System{
		NodeID:         hostname,
		RPCAddress:     "0.0.0.0",
		RPCPort:        DefaultRPCPort,
		NamePort:       DefaultNamePort,
		MetricsAddress: DefaultMetricsAddress,
		WatchTime:      DefaultWatchTime,
		MaxConnections: DefaultMaxConnections,
		FrameTimeout:   DefaultFrameTimeout,
		BufferBudget:   DefaultBufferBudget,
	}
}

var systemOperands = map[string]handler[System]{
	"node_id": func(s *System, v []string) (err error) {
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
	"rpc_address": func(s *System, v []string) (err error) {
		if s.RPCAddress, err = one(v); err != nil {
			return err
		}
		if !validHost(s.RPCAddress) {
			return fmt.Errorf("%q is not an IP address or host name (the port goes in rpc_port)", s.RPCAddress)
		}
		return nil
	},
	"rpc_port": func(s *System, v []string) (err error) {
		// 0 picks a free port (scdd logs the one it got): for tests and
		// for several nodes on one host.
		s.RPCPort, err = intIn(v, 0, 65535)
		return err
	},
	"all_node": func(s *System, v []string) error {
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
	"metrics_address": func(s *System, v []string) (err error) {
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
	"watch_time": func(s *System, v []string) (err error) {
		s.WatchTime, err = secondsIn(v, 0, maxSeconds)
		return err
	},
	"max_processes": func(s *System, v []string) (err error) {
		s.MaxProcesses, err = intIn(v, 0, 1<<20)
		return err
	},
	"name_port": func(s *System, v []string) (err error) {
		s.NamePort, err = intIn(v, 0, 65535)
		return err
	},
	"cluster_key": func(s *System, v []string) (err error) {
		if s.ClusterKey, err = one(v); err != nil {
			return err
		}
		if n := len(s.ClusterKey); n < 16 || n > 1024 {
			return fmt.Errorf("want 16..1024 bytes, got %d", n)
		}
		return nil
	},
	"memory_reserve": func(s *System, v []string) (err error) {
		mib, err := intIn(v, 0, 1<<24)
		s.MemoryReserve = int64(mib) << 20
		return err
	},
	"max_connections": func(s *System, v []string) (err error) {
		s.MaxConnections, err = intIn(v, 1, 1<<20)
		return err
	},
	"frame_timeout": func(s *System, v []string) (err error) {
		s.FrameTimeout, err = secondsIn(v, 1, 3600)
		return err
	},
	"rpc_buffer_budget": func(s *System, v []string) (err error) {
		mib, err := intIn(v, 1, 1<<20)
		s.BufferBudget = int64(mib) << 20
		return err
	},
}

func defaultSched() Sched {
	return Sched{AnnounceServerStatus: true, ScheduleRate: 50, Multi: 1, BalanceRule: "opentp1"}
}

var schedOperands = map[string]handler[Sched]{
	"scd_this_node_first": func(s *Sched, v []string) (err error) {
		s.ThisNodeFirst, err = boolYN(v)
		return err
	},
	"scd_announce_server_status": func(s *Sched, v []string) (err error) {
		s.AnnounceServerStatus, err = boolYN(v)
		return err
	},
	"schedule_rate": func(s *Sched, v []string) (err error) {
		s.ScheduleRate, err = intIn(v, 50, 100)
		return err
	},
	"scd_retry_of_comm_error": func(s *Sched, v []string) (err error) {
		s.RetryOfCommError, err = intIn(v, 0, MaxNodes)
		return err
	},
	"scdmulti": func(s *Sched, v []string) (err error) {
		s.Multi, err = intIn(v, 1, 64)
		return err
	},
	"scd_balance_rule": func(s *Sched, v []string) (err error) {
		if s.BalanceRule, err = one(v); err != nil {
			return err
		}
		if s.BalanceRule != "opentp1" && s.BalanceRule != "p2c" {
			return fmt.Errorf("want opentp1 or p2c, got %q", s.BalanceRule)
		}
		return nil
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
	}
}

var serverOperands = map[string]handler[Server]{
	"service_group": func(s *Server, v []string) (err error) {
		if s.ServiceGroup, err = one(v); err != nil {
			return err
		}
		return checkIdent("service group", s.ServiceGroup)
	},
	"service": func(s *Server, v []string) error {
		seen := map[string]bool{}
		s.Services = nil
		for _, e := range v {
			name, entry, ok := strings.Cut(e, "=")
			if !ok {
				return fmt.Errorf("want \"name=entry\", got %q", e)
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
	"module": func(s *Server, v []string) (err error) {
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
	"receive_from": func(s *Server, v []string) error {
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
	"parallel_count": func(s *Server, v []string) error {
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
	"balance_count": func(s *Server, v []string) (err error) {
		s.BalanceCount, err = intIn(v, 0, maxBalance)
		return err
	},
	"nonresident_idle_time": func(s *Server, v []string) (err error) {
		ms, err := intIn(v, 0, 3600000)
		s.NonResidentIdle = time.Duration(ms) * time.Millisecond
		return err
	},
	"cpu_wait_limit": func(s *Server, v []string) (err error) {
		s.CPUWaitLimit, err = intIn(v, 0, 100)
		return err
	},
	"schedule_priority": func(s *Server, v []string) (err error) {
		s.SchedulePriority, err = intIn(v, 1, maxPriority)
		return err
	},
	"scd_refresh_process": func(s *Server, v []string) (err error) {
		s.RefreshProcess, err = boolYN(v)
		return err
	},
	"loadcheck_interval": func(s *Server, v []string) (err error) {
		s.LoadCheckInterval, err = secondsIn(v, 0, maxSeconds)
		return err
	},
	"levelup_queue_count": func(s *Server, v []string) error {
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
	"leveldown_queue_count": func(s *Server, v []string) error {
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
	"loadlevel_message": func(s *Server, v []string) (err error) {
		s.LoadLevelMessage, err = boolYN(v)
		return err
	},
	"scdmulti": func(s *Server, v []string) (err error) {
		s.Multi, err = boolYN(v)
		return err
	},
	"multi_schedule": func(s *Server, v []string) (err error) {
		s.MultiSchedule, err = boolYN(v)
		return err
	},
	"max_message_size": func(s *Server, v []string) (err error) {
		s.MaxMessageSize, err = intIn(v, minMessage, MaxMaxMessageSize)
		return err
	},
	"queue_size": func(s *Server, v []string) (err error) {
		s.QueueSize, err = intIn(v, 1, maxQueueSize)
		return err
	},
	"watch_time": func(s *Server, v []string) (err error) {
		s.WatchTime, err = secondsIn(v, 0, maxSeconds)
		return err
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

var clientOperands = map[string]handler[Client]{
	"dchost": func(c *Client, v []string) error {
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
	"dcscddirect": func(c *Client, v []string) (err error) {
		c.Direct, err = boolYN(v)
		return err
	},
	"dchostselect": func(c *Client, v []string) (err error) {
		c.HostSelect, err = boolYN(v)
		return err
	},
	"dcscdhostchange": func(c *Client, v []string) (err error) {
		c.HostChange, err = boolYN(v)
		return err
	},
	"dccltloadbalance": func(c *Client, v []string) (err error) {
		c.LoadBalance, err = boolYN(v)
		return err
	},
	"dccache": func(c *Client, v []string) (err error) {
		c.CacheEntries, err = intIn(v, 1, maxCache)
		return err
	},
	"dccltcachetim": func(c *Client, v []string) (err error) {
		c.CacheTime, err = secondsIn(v, 0, maxSeconds)
		return err
	},
	"dcnamuse": func(c *Client, v []string) (err error) {
		c.NameUse, err = boolYN(v)
		return err
	},
	"dcwatchtim": func(c *Client, v []string) (err error) {
		c.WatchTime, err = secondsIn(v, 0, maxSeconds)
		return err
	},
	"dcmaxmsgsize": func(c *Client, v []string) (err error) {
		c.MaxMessageSize, err = intIn(v, minMessage, MaxMaxMessageSize)
		return err
	},
}

// clientAliases are other names betranrc accepts, spelled as in the server
// files.
var clientAliases = map[string]string{
	"watch_time":       "dcwatchtim",
	"max_message_size": "dcmaxmsgsize",
}

// whereElse names the file an operand belongs in, for "unknown operand".
func whereElse(name string) string {
	switch {
	case systemOperands[name] != nil:
		return "sysconf"
	case schedOperands[name] != nil:
		return "scdsvcdef"
	case serverOperands[name] != nil:
		return "usrrc or usr/<server>"
	case clientOperands[name] != nil || clientAliases[name] != "":
		return "betranrc"
	}
	return ""
}
