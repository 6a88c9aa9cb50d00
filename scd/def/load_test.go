package def

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"
	"time"
)

// baseUsr is the rest of a valid usr file; test text goes above it so that
// the operand under test sits on line 1.
const baseUsr = "set service_group = grp\nset service = \"a=a\"\nset module = uap\n"

// writeDir writes files (path relative to the directory) into a new
// definition directory. A nil map entry for "usr/x" is not added.
func writeDir(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func srv(c *Config) Server { return c.Servers[0] }

// operandCases: for every operand, its default (text ""), good values and
// bad values. text goes on line 1 of file; usr/x also gets baseUsr below it.
var operandCases = []struct {
	file string
	text string
	get  func(*Config) any
	want any
	err  string // expected error prefix, e.g. "usr/x:1: balance_count: "
}{
	// sysconf
	{"sysconf", "", func(c *Config) any { return c.System.RPCAddress }, "127.0.0.1", ""},
	{"sysconf", "set rpc_address = \"0.0.0.0\"", func(c *Config) any { return c.System.RPCAddress }, "0.0.0.0", ""},
	{"sysconf", "set all_node = \"10.0.0.2\", \"10.0.0.3\"", nil, nil,
		"sysconf:1: all_node: \"10.0.0.2\" is on another host, but this node listens on rpc_address 127.0.0.1 (the default), which no other host can reach: set rpc_address to this node's address"},
	{"sysconf", "set rpc_address = localhost\nset all_node = \"localhost\", \"[::2]:5\"", nil, nil,
		"sysconf:2: all_node: \"[::2]:5\" is on another host, but this node listens on rpc_address localhost, which no other host can reach"},
	{"sysconf", "set all_node = \"127.0.0.2\", \"127.0.0.3\", \"node4.example\"", func(c *Config) any { return len(c.System.AllNodes) }, 3, ""},
	{"sysconf", "set rpc_address = \"10.0.0.2\"\nset all_node = \"10.0.0.2\", \"10.0.0.3\"", func(c *Config) any { return len(c.System.AllNodes) }, 2, ""},
	{"sysconf", "set rpc_address = 10.1.2.3", func(c *Config) any { return c.System.RPCAddress }, "10.1.2.3", ""},
	{"sysconf", "set rpc_address = \"node-a.example\"", func(c *Config) any { return c.System.RPCAddress }, "node-a.example", ""},
	{"sysconf", "set rpc_address = 10.0.0.1:80", nil, nil, "sysconf:1: rpc_address: "},
	{"sysconf", "set rpc_address = a,b", nil, nil, "sysconf:1: rpc_address: want one value, got 2"},
	{"sysconf", "", func(c *Config) any { return c.System.RPCPort }, 12000, ""},
	{"sysconf", "set rpc_port = 1", func(c *Config) any { return c.System.RPCPort }, 1, ""},
	{"sysconf", "set rpc_port = 65535", func(c *Config) any { return c.System.RPCPort }, 65535, ""},
	{"sysconf", "set rpc_port = 0", func(c *Config) any { return c.System.RPCPort }, 0, ""},
	{"sysconf", "set rpc_port = -1", nil, nil, "sysconf:1: rpc_port: "},
	{"sysconf", `set metrics_address = "127.0.0.1:0"`, func(c *Config) any { return c.System.MetricsAddress }, "127.0.0.1:0", ""},
	{"sysconf", "set rpc_port = 65536", nil, nil, "sysconf:1: rpc_port: 65536 out of range 0..65535"},
	{"sysconf", "set rpc_port = x", nil, nil, "sysconf:1: rpc_port: want an unsigned integer, got \"x\""},
	{"sysconf", "set rpc_port = -1", nil, nil, "sysconf:1: rpc_port: want an unsigned integer"},
	{"sysconf", "set rpc_port = 99999999999999999999999", nil, nil, "sysconf:1: rpc_port: 99999999999999999999999 out of range"},
	{"sysconf", "", func(c *Config) any { return c.System.NodeID != "" }, true, ""},
	{"sysconf", "set node_id = n1", func(c *Config) any { return c.System.NodeID }, "n1", ""},
	{"sysconf", "set node_id = \"a b\"", nil, nil, "sysconf:1: node_id: "},
	{"sysconf", "set node_id = \"\"", nil, nil, "sysconf:1: node_id: want 1..255 bytes, got 0"},
	{"sysconf", "set node_id = \"n\xff\"", nil, nil, "sysconf:1: node_id: \"n\\xff\" is not UTF-8"},
	{"sysconf", "set node_id = \"a\u00a0b\"", nil, nil, `sysconf:1: node_id: "a\u00a0b": '\u00a0' not allowed`},
	{"sysconf", "set node_id = \"a\u200bb\"", nil, nil, `sysconf:1: node_id: "a\u200bb": '\u200b' not allowed`},
	{"sysconf", "set node_id = \"a\tb\"", nil, nil, "sysconf:1: node_id: \"a\\tb\": '\\t' not allowed"},
	{"sysconf", "set node_id = ノード1", func(c *Config) any { return c.System.NodeID }, "ノード1", ""},
	{"sysconf", "", func(c *Config) any { return c.System.AllNodes }, []string(nil), ""},
	{"sysconf", "set all_node = h1, h2:13000, \"[::1]:5\"", func(c *Config) any { return c.System.AllNodes }, []string{"h1", "h2:13000", "[::1]:5"}, ""},
	{"sysconf", "set all_node = h1:0", nil, nil, "sysconf:1: all_node: port in \"h1:0\""},
	{"sysconf", "set all_node = h1, \"h 2\"", nil, nil, "sysconf:1: all_node: bad host \"h 2\""},
	{"sysconf", "set all_node = " + nodes(129), nil, nil, "sysconf:1: all_node: 129 nodes, at most 128"},
	{"scdsvcdef", "scdmulti -g a -p 12001", nil, nil, "scdsvcdef:1: scdmulti: receiver group a: port 12001 is metrics_address's"},
	{"sysconf", "set metrics_address = \"127.0.0.1:12000\"", nil, nil, "sysconf:1: metrics_address: port 12000 is rpc_port's too, on the same address: give each its own"},
	{"sysconf", "set rpc_port = 13000\nset metrics_address = \"localhost:13000\"", nil, nil, "sysconf:2: metrics_address: port 13000 is rpc_port's too"},
	{"sysconf", "set metrics_address = \"0.0.0.0:13000\"\nset rpc_port = 13000", nil, nil, "sysconf:2: rpc_port: port 13000 is metrics_address's too"},
	{"sysconf", "set metrics_address = \"127.0.0.2:12000\"", func(c *Config) any { return c.System.MetricsAddress }, "127.0.0.2:12000", ""},
	{"sysconf", "set rpc_port = 0\nset metrics_address = \"127.0.0.1:0\"", func(c *Config) any { return c.System.RPCPort }, 0, ""},
	{"sysconf", "set rpc_port = 12002\nset all_node = \"127.0.0.1:12002\", \"127.0.0.2:12002\"", nil, nil, "sysconf:1: rpc_port: port 12002 is name_port's too"},
	{"sysconf", "set rpc_port = 12002\nset all_node = \"127.0.0.1:12002\"", func(c *Config) any { return c.System.RPCPort }, 12002, ""},
	{"sysconf", "set all_node = NodeA, \"nodea:12000\"", nil, nil, `sysconf:1: all_node: "NodeA" and "nodea:12000" are the same node`},
	{"sysconf", "set all_node = \"[::1]:12000\", \"[0:0::1]\"", nil, nil, `sysconf:1: all_node: "[::1]:12000" and "[0:0::1]" are the same node`},
	{"sysconf", "set all_node = \"::ffff:127.0.0.1\", 127.0.0.1", nil, nil, `sysconf:1: all_node: "::ffff:127.0.0.1" and "127.0.0.1" are the same node`},
	{"sysconf", "set all_node = " + nodes(128), func(c *Config) any { return len(c.System.AllNodes) }, 128, ""},
	{"sysconf", "set all_node = h1, h1:12000", nil, nil, "sysconf:1: all_node: \"h1\" and \"h1:12000\" are the same node"},
	{"sysconf", "set all_node = h1, h1:13000\nset rpc_port = 13000", nil, nil, "sysconf:1: all_node: \"h1\" and \"h1:13000\" are the same node"},
	{"sysconf", "", func(c *Config) any { return c.System.MetricsAddress }, "127.0.0.1:12001", ""},
	{"sysconf", "set metrics_address = \"0.0.0.0:9100\"", func(c *Config) any { return c.System.MetricsAddress }, "0.0.0.0:9100", ""},
	{"sysconf", "set metrics_address = localhost", nil, nil, "sysconf:1: metrics_address: missing port"},
	{"sysconf", "", func(c *Config) any { return c.System.ControlSocket }, "", ""},
	{"sysconf", `set control_socket = "/run/tpsched/a.sock"`, func(c *Config) any { return c.System.ControlSocket }, "/run/tpsched/a.sock", ""},
	{"sysconf", `set control_socket = ""`, nil, nil, "sysconf:1: control_socket: want a path of 1..107 bytes, got 0"},
	{"sysconf", `set control_socket = "/` + strings.Repeat("x", 107) + `"`, nil, nil, "sysconf:1: control_socket: want a path of 1..107 bytes, got 108"},
	{"sysconf", "", func(c *Config) any { return c.System.WatchTime }, 180 * time.Second, ""},
	{"sysconf", "set watch_time = 0", func(c *Config) any { return c.System.WatchTime }, time.Duration(0), ""},
	{"sysconf", "set watch_time = 65536", nil, nil, "sysconf:1: watch_time: 65536 out of range 0..65535"},
	{"sysconf", "", func(c *Config) any { return c.System.MaxConnections }, 10000, ""},
	{"sysconf", "set max_connections = 1", func(c *Config) any { return c.System.MaxConnections }, 1, ""},
	{"sysconf", "set max_connections = 0", nil, nil, "sysconf:1: max_connections: 0 out of range 1..1048576"},
	{"sysconf", "", func(c *Config) any { return c.System.FrameTimeout }, 30 * time.Second, ""},
	{"sysconf", "set frame_timeout = 3600", func(c *Config) any { return c.System.FrameTimeout }, time.Hour, ""},
	{"sysconf", "set frame_timeout = 0", nil, nil, "sysconf:1: frame_timeout: 0 out of range 1..3600"},
	{"sysconf", "", func(c *Config) any { return c.System.BufferBudget }, int64(64 << 20), ""},
	{"sysconf", "set rpc_buffer_budget = 256", func(c *Config) any { return c.System.BufferBudget }, int64(256 << 20), ""},
	{"sysconf", "set rpc_buffer_budget = 0", nil, nil, "sysconf:1: rpc_buffer_budget: 0 out of range 1..1048576"},
	{"sysconf", "", func(c *Config) any { return c.System.MaxProcesses }, 0, ""},
	{"sysconf", "set max_processes = 50", func(c *Config) any { return c.System.MaxProcesses }, 50, ""},
	{"sysconf", "set max_processes = many", nil, nil, "sysconf:1: max_processes: want an unsigned integer"},
	{"sysconf", "", func(c *Config) any { return c.System.MemoryReserve }, int64(0), ""},
	{"sysconf", "set memory_reserve = 512", func(c *Config) any { return c.System.MemoryReserve }, int64(512 << 20), ""},
	{"sysconf", "set memory_reserve = -1", nil, nil, "sysconf:1: memory_reserve: "},
	{"sysconf", "set schedule_rate = 60", nil, nil, "sysconf:1: schedule_rate: unknown operand here (it belongs in scdsvcdef)"},
	{"sysconf", "set nosuch = 1", nil, nil, "sysconf:1: nosuch: unknown operand"},
	{"sysconf", "set rpc_prot = 1", nil, nil, "sysconf:1: rpc_prot: unknown operand (did you mean rpc_port?)"},
	{"sysconf", "set scd_this_nod_first = Y", nil, nil, "sysconf:1: scd_this_nod_first: unknown operand (did you mean scd_this_node_first? it belongs in scdsvcdef)"},
	{"sysconf", "putenv A b", nil, nil, "sysconf:1: putenv: only allowed in usrrc and usr files"},
	{"sysconf", "", func(c *Config) any { return c.System.UAPCPUGroups }, "priority", ""},
	{"sysconf", "set uap_cpu_groups = always", func(c *Config) any { return c.System.UAPCPUGroups }, "always", ""},
	{"sysconf", "set uap_cpu_groups = never", nil, nil, "sysconf:1: uap_cpu_groups: want priority or always, got \"never\""},

	// scdsvcdef
	{"scdsvcdef", "", func(c *Config) any { return c.Sched.ThisNodeFirst }, false, ""},
	{"scdsvcdef", "", func(c *Config) any { return c.Sched.BalanceRule }, "opentp1", ""},
	{"scdsvcdef", "set scd_balance_rule = p2c", func(c *Config) any { return c.Sched.BalanceRule }, "p2c", ""},
	{"scdsvcdef", "set scd_balance_rule = least", nil, nil, "scdsvcdef:1: scd_balance_rule: want opentp1 or p2c, got \"least\""},
	{"sysconf", "", func(c *Config) any { return c.System.NamePort }, 12002, ""},
	{"sysconf", "set name_port = 13002", func(c *Config) any { return c.System.NamePort }, 13002, ""},
	{"sysconf", "set name_port = 65536", nil, nil, "sysconf:1: name_port: 65536 out of range 0..65535"},
	{"sysconf", "set cluster_key = \"0123456789abcdef\"", func(c *Config) any { return c.System.ClusterKey }, "0123456789abcdef", ""},
	{"sysconf", "set cluster_key = short", nil, nil, "sysconf:1: cluster_key: want 16..1024 bytes, got 5"},
	{"scdsvcdef", "set scd_this_node_first = y", func(c *Config) any { return c.Sched.ThisNodeFirst }, true, ""},
	{"scdsvcdef", "set scd_this_node_first = yes", nil, nil, "scdsvcdef:1: scd_this_node_first: want Y or N, got \"yes\""},
	{"scdsvcdef", "", func(c *Config) any { return c.Sched.AnnounceServerStatus }, true, ""},
	{"scdsvcdef", "set scd_announce_server_status = n", func(c *Config) any { return c.Sched.AnnounceServerStatus }, false, ""},
	{"scdsvcdef", "set scd_announce_server_status = 1", nil, nil, "scdsvcdef:1: scd_announce_server_status: want Y or N"},
	{"scdsvcdef", "", func(c *Config) any { return c.Sched.ScheduleRate }, 50, ""},
	{"scdsvcdef", "set schedule_rate = 100", func(c *Config) any { return c.Sched.ScheduleRate }, 100, ""},
	{"scdsvcdef", "set schedule_rate = 49", nil, nil, "scdsvcdef:1: schedule_rate: 49 out of range 50..100"},
	{"scdsvcdef", "set schedule_rate = 101", nil, nil, "scdsvcdef:1: schedule_rate: 101 out of range 50..100"},
	{"scdsvcdef", "", func(c *Config) any { return c.Sched.RetryOfCommError }, 0, ""},
	{"scdsvcdef", "set scd_retry_of_comm_error = 128", func(c *Config) any { return c.Sched.RetryOfCommError }, 128, ""},
	{"scdsvcdef", "set scd_retry_of_comm_error = 129", nil, nil, "scdsvcdef:1: scd_retry_of_comm_error: 129 out of range 0..128"},
	{"scdsvcdef", "", func(c *Config) any { return c.Sched.Multi }, 1, ""},
	{"scdsvcdef", "set scdmulti = 64", func(c *Config) any { return c.Sched.Multi }, 64, ""},
	{"scdsvcdef", "set scdmulti = 0", nil, nil, "scdsvcdef:1: scdmulti: 0 out of range 1..64"},
	{"scdsvcdef", "set scdmulti = 65", nil, nil, "scdsvcdef:1: scdmulti: 65 out of range 1..64"},
	{"scdsvcdef", "set queue_size = 5", nil, nil, "scdsvcdef:1: queue_size: unknown operand here (it belongs in usrrc or usr/<server>)"},

	// usr/x
	{"usr/x", "", func(c *Config) any { return srv(c).Name + " " + srv(c).File }, "x usr/x", ""},
	{"usr/x", "", func(c *Config) any { return srv(c).ServiceGroup }, "grp", ""},
	{"usr/x", "set service_group = \"\"", nil, nil, "usr/x:1: service_group: empty service group"},
	{"usr/x", "set service_group = " + strings.Repeat("g", 32), nil, nil, "usr/x:1: service_group: service group \"" + strings.Repeat("g", 32) + "\" is 32 bytes, at most 31"},
	{"usr/x", "set service_group = \"a/b\"", nil, nil, "usr/x:1: service_group: service group \"a/b\": '/' not allowed"},
	{"usr/x", "", func(c *Config) any { return srv(c).Services }, []Service{{"a", "a"}}, ""},
	{"usr/x", "set service = \"solo\", b=c, d", func(c *Config) any { return srv(c).Services }, []Service{{"solo", "solo"}, {"b", "c"}, {"d", "d"}}, ""},
	{"usr/x", "set service = \"echo=ecoh\"", func(c *Config) any { return srv(c).Services }, []Service{{"echo", "ecoh"}}, ""},
	{"usr/x", "set service = \"a=b=c\"", nil, nil, "usr/x:1: service: entry \"b=c\": '=' not allowed"},
	{"usr/x", "set service = \"=e\"", nil, nil, "usr/x:1: service: empty service name"},
	{"usr/x", "set service = \"n=\"", nil, nil, "usr/x:1: service: empty entry"},
	{"usr/x", "set service = \"a=a\", \"a=b\"", nil, nil, "usr/x:1: service: service \"a\" listed twice"},
	{"usr/x", "set service = \"" + strings.Repeat("s", 32) + "=e\"", nil, nil, "usr/x:1: service: service name"},
	{"usr/x", "", func(c *Config) any { return srv(c).Module }, "uap", ""},
	{"usr/x", "set module = \"\"", nil, nil, "usr/x:1: module: want 1..4095 bytes, got 0"},
	{"usr/x", "set module = \"a\tb\"", nil, nil, "usr/x:1: module: control character '\\t' not allowed"},
	{"usr/x", "", func(c *Config) any { return srv(c).ReceiveFrom }, ReceiveQueue, ""},
	{"usr/x", "set receive_from = Socket", func(c *Config) any { return srv(c).ReceiveFrom }, ReceiveSocket, ""},
	{"usr/x", "set receive_from = pipe", nil, nil, "usr/x:1: receive_from: want queue or socket, got \"pipe\""},
	{"usr/x", "", func(c *Config) any { return [2]int{srv(c).Resident, srv(c).MaxProcesses} }, [2]int{1, 1}, ""},
	{"usr/x", "set parallel_count = 3", func(c *Config) any { return [2]int{srv(c).Resident, srv(c).MaxProcesses} }, [2]int{3, 3}, ""},
	{"usr/x", "set parallel_count = 0, 1024", func(c *Config) any { return [2]int{srv(c).Resident, srv(c).MaxProcesses} }, [2]int{0, 1024}, ""},
	{"usr/x", "set parallel_count = 1,1025", nil, nil, "usr/x:1: parallel_count: max: 1025 out of range 0..1024"},
	{"usr/x", "set parallel_count = 1025", nil, nil, "usr/x:1: parallel_count: resident: 1025 out of range 0..1024"},
	{"usr/x", "set parallel_count = 1,2,3", nil, nil, "usr/x:1: parallel_count: want resident[,max], got 3 values"},
	{"usr/x", "set parallel_count = a", nil, nil, "usr/x:1: parallel_count: resident: want an unsigned integer"},
	{"usr/x", "", func(c *Config) any { return srv(c).BalanceCount }, 3, ""},
	{"usr/x", "set balance_count = 0", func(c *Config) any { return srv(c).BalanceCount }, 0, ""},
	{"usr/x", "set balance_count = 4097", nil, nil, "usr/x:1: balance_count: 4097 out of range 0..4096"},
	{"usr/x", "", func(c *Config) any { return srv(c).NonResidentIdle }, 500 * time.Millisecond, ""},
	{"usr/x", "set nonresident_idle_time = 50", func(c *Config) any { return srv(c).NonResidentIdle }, 50 * time.Millisecond, ""},
	{"usr/x", "", func(c *Config) any { return srv(c).CPUWaitLimit }, 50, ""},
	{"usr/x", "set cpu_wait_limit = 0", func(c *Config) any { return srv(c).CPUWaitLimit }, 0, ""},
	{"usr/x", "set cpu_wait_limit = 101", nil, nil, "usr/x:1: cpu_wait_limit: 101 out of range 0..100"},
	{"usr/x", "set nonresident_idle_time = 3600001", nil, nil, "usr/x:1: nonresident_idle_time: 3600001 out of range 0..3600000"},
	{"usr/x", "", func(c *Config) any { return srv(c).SchedulePriority }, 8, ""},
	{"usr/x", "set schedule_priority = 1", func(c *Config) any { return srv(c).SchedulePriority }, 1, ""},
	{"usr/x", "set schedule_priority = 16", func(c *Config) any { return srv(c).SchedulePriority }, 16, ""},
	{"usr/x", "set schedule_priority = 0", nil, nil, "usr/x:1: schedule_priority: 0 out of range 1..16"},
	{"usr/x", "set schedule_priority = 17", nil, nil, "usr/x:1: schedule_priority: 17 out of range 1..16"},
	{"usr/x", "", func(c *Config) any { return srv(c).RefreshProcess }, false, ""},
	{"usr/x", "set scd_refresh_process = Y\nset parallel_count = 0,4\nset balance_count = 0", func(c *Config) any { return srv(c).RefreshProcess }, true, ""},
	{"usr/x", "set scd_refresh_process = X", nil, nil, "usr/x:1: scd_refresh_process: want Y or N, got \"X\""},
	{"usr/x", "", func(c *Config) any { return srv(c).LoadCheckInterval }, 30 * time.Second, ""},
	{"usr/x", "set loadcheck_interval = 0", func(c *Config) any { return srv(c).LoadCheckInterval }, time.Duration(0), ""},
	{"usr/x", "set loadcheck_interval = 65536", nil, nil, "usr/x:1: loadcheck_interval: 65536 out of range 0..65535"},
	{"usr/x", "", func(c *Config) any { return srv(c).LevelThresholds }, false, ""},
	{"usr/x", "set levelup_queue_count = 5,10\nset leveldown_queue_count = 2,8", func(c *Config) any {
		return [3]any{srv(c).LevelUp, srv(c).LevelDown, srv(c).LevelThresholds}
	}, [3]any{[2]int{5, 10}, [2]int{2, 8}, true}, ""},
	{"usr/x", "set levelup_queue_count = 5", nil, nil, "usr/x:1: levelup_queue_count: want U1,U2: want two values, got 1"},
	{"usr/x", "set levelup_queue_count = 5,32768", nil, nil, "usr/x:1: levelup_queue_count: want U1,U2: 32768 out of range 0..32767"},
	{"usr/x", "set levelup_queue_count = 6,5", nil, nil, "usr/x:1: levelup_queue_count: U1 6 exceeds U2 5"},
	{"usr/x", "set leveldown_queue_count = 1,x", nil, nil, "usr/x:1: leveldown_queue_count: want D0,D1: want an unsigned integer"},
	{"usr/x", "set leveldown_queue_count = 3,2", nil, nil, "usr/x:1: leveldown_queue_count: D0 3 exceeds D1 2"},
	{"usr/x", "", func(c *Config) any { return srv(c).LoadLevelMessage }, false, ""},
	{"usr/x", "set loadlevel_message = Y", func(c *Config) any { return srv(c).LoadLevelMessage }, true, ""},
	{"usr/x", "set loadlevel_message = true", nil, nil, "usr/x:1: loadlevel_message: want Y or N"},
	{"usr/x", "set scdmulti = y", nil, nil, "usr/x:1: scdmulti: needs scdmulti of 2 or more in scdsvcdef, which has 1"},
	{"usr/x", "set scdmulti = 2", nil, nil, "usr/x:1: scdmulti: want Y or N"},
	{"usr/x", "set scdmulti = N", func(c *Config) any { return srv(c).Name }, "x", ""},
	{"usr/x", "", func(c *Config) any { return srv(c).MultiSchedule }, false, ""},
	{"usr/x", "set multi_schedule = Y", func(c *Config) any { return srv(c).MultiSchedule }, true, ""},
	{"usr/x", "set multi_schedule = 1", nil, nil, "usr/x:1: multi_schedule: want Y or N"},
	{"usrrc", "set multi_schedule = Y", func(c *Config) any { return [2]bool{srv(c).MultiSchedule, c.Usrrc.MultiSchedule} }, [2]bool{true, true}, ""},
	{"sysconf", "set multi_schedule = Y", nil, nil, "sysconf:1: multi_schedule: unknown operand here (it belongs in usrrc or usr/<server>)"},
	{"scdsvcdef", "scdmulti -g heavy -m 2 -p 12010", func(c *Config) any { return c.Sched.ReceiverGroups },
		[]ReceiverGroup{{Name: "heavy", Count: 2, Port: 12010}}, ""},
	{"scdsvcdef", "scdmulti -g a -p 12010\nSCDMULTI -p 12011 -m 64 -g b", func(c *Config) any { return c.Sched.ReceiverGroups },
		[]ReceiverGroup{{Name: "a", Count: 1, Port: 12010}, {Name: "b", Count: 64, Port: 12011}}, ""},
	{"scdsvcdef", "scdmulti -m 2 -p 12010", nil, nil, "scdsvcdef:1: scdmulti: -g GROUP is required (the default group is set scdmulti = N and rpc_port)"},
	{"scdsvcdef", "scdmulti -g a -m 2", nil, nil, "scdsvcdef:1: scdmulti: -p PORT is required (each receiver group listens on a port of its own)"},
	{"scdsvcdef", "scdmulti -g a -m 65 -p 1", nil, nil, "scdsvcdef:1: scdmulti: -m: 65 out of range 1..64"},
	{"scdsvcdef", "scdmulti -g a -p 65536", nil, nil, "scdsvcdef:1: scdmulti: -p: 65536 out of range 0..65535"},
	{"scdsvcdef", "scdmulti -g \"a b\" -p 1", nil, nil, "scdsvcdef:1: scdmulti: -g: "},
	{"scdsvcdef", "scdmulti -g a -p 1 -t 3", nil, nil, "scdsvcdef:1: scdmulti: unknown option -t (it takes -g, -m, -p)"},
	{"scdsvcdef", "scdmulti -g a -p 1 -g b", nil, nil, "scdsvcdef:1: scdmulti: option -g given twice"},
	{"scdsvcdef", "scdmulti -g a -p 1\nscdmulti -g a -p 2", nil, nil, `scdsvcdef:2: scdmulti: receiver group "a" defined twice`},
	{"scdsvcdef", "scdmulti -g a -p 1\nscdmulti -g b -p 1", nil, nil, "scdsvcdef:2: scdmulti: port 1 is receiver group a's already"},
	{"scdsvcdef", "scdmulti -g a -p 12000", nil, nil, "scdsvcdef:1: scdmulti: receiver group a: port 12000 is rpc_port, the default group's"},
	{"scdsvcdef", "scdmulti -g a -p 12002", nil, nil, "scdsvcdef:1: scdmulti: receiver group a: port 12002 is name_port"},
	{"scdsvcdef", "set scdmulti = 64\nscdmulti -g a -m 64 -p 1\nscdmulti -g b -m 64 -p 2\nscdmulti -g c -m 64 -p 3\nscdmulti -g d -m 1 -p 4", nil, nil,
		"scdsvcdef:5: scdmulti: receiver group d: 257 receiving sockets in all, at most 256"},
	{"scdsvcdef", "scdmulti", nil, nil, "scdsvcdef:1: scdmulti: -g GROUP is required"},
	{"scdsvcdef", "scdmulti -g", nil, nil, "scdsvcdef:1: scdmulti: option -g: missing value"},
	{"scdsvcdef", "scdmulty -g a -p 1", nil, nil, "scdsvcdef:1: scdmulty: unknown command (did you mean scdmulti?)"},
	{"usr/x", "scdmult -g a", nil, nil, "usr/x:1: scdmult: unknown command (did you mean scdmulti?)"},
	{"sysconf", "scdmulti -g a -p 1", nil, nil, "sysconf:1: scdmulti: unknown command (this file takes set statements only)"},
	{"usr/x", "", func(c *Config) any { return srv(c).MaxMessageSize }, 1 << 20, ""},
	{"usr/x", "set max_message_size = 8388608", func(c *Config) any { return srv(c).MaxMessageSize }, 8 << 20, ""},
	{"usr/x", "set max_message_size = 1024", func(c *Config) any { return srv(c).MaxMessageSize }, 1024, ""},
	{"usr/x", "set max_message_size = 8388609", nil, nil, "usr/x:1: max_message_size: 8388609 out of range 1024..8388608"},
	{"usr/x", "set max_message_size = 1023", nil, nil, "usr/x:1: max_message_size: 1023 out of range 1024..8388608"},
	{"usr/x", "", func(c *Config) any { return srv(c).QueueSize }, 256, ""},
	{"usr/x", "set queue_size = 65536", func(c *Config) any { return srv(c).QueueSize }, 65536, ""},
	{"usr/x", "set queue_size = 0", nil, nil, "usr/x:1: queue_size: 0 out of range 1..65536"},
	{"usr/x", "set queue_size = 65537", nil, nil, "usr/x:1: queue_size: 65537 out of range 1..65536"},
	{"usr/x", "", func(c *Config) any { return srv(c).WatchTime }, 180 * time.Second, ""},
	{"usr/x", "set watch_time = 5", func(c *Config) any { return srv(c).WatchTime }, 5 * time.Second, ""},
	{"usr/x", "set watch_time = 1.5", nil, nil, "usr/x:1: watch_time: want an unsigned integer, got \"1.5\""},
	{"usr/x", "", func(c *Config) any { return srv(c).Env }, []string(nil), ""},
	{"usr/x", "putenv LANG C\nputenv MSG \"a b\"", func(c *Config) any { return srv(c).Env }, []string{"LANG=C", "MSG=a b"}, ""},
	{"usr/x", "set rpc_port = 1", nil, nil, "usr/x:1: rpc_port: unknown operand here (it belongs in sysconf)"},
	{"usr/x", "set paralel_count = 2", nil, nil, "usr/x:1: paralel_count: unknown operand (did you mean parallel_count?)"},
	{"usr/x", "set Balance_Cuont = 2", nil, nil, "usr/x:1: balance_cuont: unknown operand (did you mean balance_count?)"},
	{"usrrc", "set watchtime = 2", nil, nil, "usrrc:1: watchtime: unknown operand (did you mean watch_time?)"},
	{"usr/x", "set scdmult = Y", nil, nil, "usr/x:1: scdmult: unknown operand (did you mean scdmulti?)"},
	{"usr/x", "set service_group = a\n" + baseUsr, nil, nil, "usr/x:2: service_group: set twice (first at line 1)"},

	// usrrc: the same operands, and the same errors.
	{"usrrc", "set balance_count = 7", func(c *Config) any { return srv(c).BalanceCount }, 7, ""},
	{"usrrc", "set balance_count = -7", nil, nil, "usrrc:1: balance_count: want an unsigned integer"},
	{"usrrc", "set all_node = a", nil, nil, "usrrc:1: all_node: unknown operand here (it belongs in sysconf)"},
}

func nodes(n int) string {
	var b []string
	for i := range n {
		b = append(b, "n"+strconv.Itoa(i))
	}
	return strings.Join(b, ",")
}

func TestOperands(t *testing.T) {
	for _, tc := range operandCases {
		name := tc.file + "/" + tc.text
		t.Run(name, func(t *testing.T) {
			files := map[string]string{"usr/x": baseUsr}
			if tc.file == "usr/x" {
				// The required operands the case does not set itself.
				rest := ""
				for _, l := range strings.SplitAfter(baseUsr, "\n") {
					if op, _, _ := strings.Cut(l, " ="); l != "" && !strings.Contains(tc.text, op+" =") {
						rest += l
					}
				}
				files["usr/x"] = tc.text + "\n" + rest
			} else {
				files[tc.file] = tc.text + "\n"
			}
			cfg, err := Load(writeDir(t, files))
			if tc.err != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
					t.Fatalf("error = %v, want prefix %q", err, tc.err)
				}
				var e *Error
				if !errors.As(err, &e) {
					t.Fatalf("error %T is not a *Error", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("error = %v", err)
			}
			if got := tc.get(cfg); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %#v, want %#v", got, tc.want)
			}
		})
	}
}

// contradictionCases: rules between operands, and between files.
var contradictionCases = []struct {
	name  string
	files map[string]string
	err   string // the whole error
}{
	{"resident above max", map[string]string{"usr/x": baseUsr + "set parallel_count = 3,2\n"},
		"usr/x:4: parallel_count: resident 3 exceeds max 2"},
	{"max zero", map[string]string{"usr/x": baseUsr + "set parallel_count = 0\n"},
		"usr/x:4: parallel_count: max 0: a server needs at least one process"},
	{"max zero of two", map[string]string{"usr/x": baseUsr + "set parallel_count = 0,0\n"},
		"usr/x:4: parallel_count: max 0: a server needs at least one process"},
	{"refresh with a resident process (default 1)", map[string]string{"usr/x": baseUsr + "set balance_count = 0\nset scd_refresh_process = Y\n"},
		"usr/x:5: scd_refresh_process: refresh needs no resident process (parallel_count = 0,max), got resident 1"},
	{"refresh, resident set later", map[string]string{"usr/x": baseUsr + "set scd_refresh_process = Y\nset balance_count = 0\nset parallel_count = 1,3\n"},
		"usr/x:6: parallel_count: refresh needs no resident process (parallel_count = 0,max), got resident 1"},
	{"refresh with balance_count (default 3)", map[string]string{"usr/x": baseUsr + "set parallel_count = 0,3\nset scd_refresh_process = Y\n"},
		"usr/x:5: scd_refresh_process: refresh needs balance_count 0, got 3"},
	{"refresh with balance_count set later", map[string]string{"usr/x": baseUsr + "set parallel_count = 0,3\nset scd_refresh_process = Y\nset balance_count = 1\n"},
		"usr/x:6: balance_count: refresh needs balance_count 0, got 1"},
	{"refresh in usrrc, balance in usr", map[string]string{"usrrc": "set scd_refresh_process = Y\nset parallel_count = 0,2\n", "usr/x": baseUsr + "set balance_count = 2\n"},
		"usr/x:4: balance_count: refresh needs balance_count 0, got 2"},
	{"refresh in usrrc, default balance", map[string]string{"usrrc": "set scd_refresh_process = Y\nset parallel_count = 0,2\n", "usr/x": baseUsr},
		"usrrc:1: scd_refresh_process: refresh needs balance_count 0, got 3 (for usr/x)"},
	{"socket with max 2", map[string]string{"usr/x": baseUsr + "set receive_from = socket\nset parallel_count = 1,2\n"},
		"usr/x:5: parallel_count: a socket-receiving server runs exactly one resident process (parallel_count = 1), got 1,2"},
	{"socket after max 2", map[string]string{"usr/x": baseUsr + "set parallel_count = 2\nset receive_from = socket\n"},
		"usr/x:5: receive_from: a socket-receiving server runs exactly one resident process (parallel_count = 1), got 2,2"},
	{"socket with no resident", map[string]string{"usr/x": baseUsr + "set receive_from = socket\nset parallel_count = 0,1\n"},
		"usr/x:5: parallel_count: a socket-receiving server runs exactly one resident process (parallel_count = 1), got 0,1"},
	{"levelup alone", map[string]string{"usr/x": baseUsr + "set levelup_queue_count = 5,10\n"},
		"usr/x:4: levelup_queue_count: given without leveldown_queue_count (Table 3-14 needs both)"},
	{"leveldown alone", map[string]string{"usr/x": baseUsr + "set leveldown_queue_count = 1,2\n"},
		"usr/x:4: leveldown_queue_count: given without levelup_queue_count (Table 3-14 needs both)"},
	{"D0 equals U1", map[string]string{"usr/x": baseUsr + "set levelup_queue_count = 5,10\nset leveldown_queue_count = 5,8\n"},
		"usr/x:5: leveldown_queue_count: D0 5 must be below U1 5 (Table 3-14: 0 <= D0 < U1 <= U2)"},
	{"D0 above U1, levelup last", map[string]string{"usr/x": baseUsr + "set leveldown_queue_count = 6,8\nset levelup_queue_count = 5,10\n"},
		"usr/x:5: levelup_queue_count: D0 6 must be below U1 5 (Table 3-14: 0 <= D0 < U1 <= U2)"},
	{"U1 zero", map[string]string{"usr/x": baseUsr + "set levelup_queue_count = 0,10\nset leveldown_queue_count = 0,8\n"},
		"usr/x:5: leveldown_queue_count: D0 0 must be below U1 0 (Table 3-14: 0 <= D0 < U1 <= U2)"},
	{"D1 equals U2", map[string]string{"usr/x": baseUsr + "set levelup_queue_count = 5,10\nset leveldown_queue_count = 2,10\n"},
		"usr/x:5: leveldown_queue_count: D1 10 must be below U2 10 (Table 3-14: D0 <= D1 < U2)"},
	{"U2 above queue_size", map[string]string{"usr/x": baseUsr + "set levelup_queue_count = 5,300\nset leveldown_queue_count = 2,8\n"},
		"usr/x:4: levelup_queue_count: U2 300 exceeds queue_size 256, so LEVEL2 could never be reached"},
	{"thresholds split over usrrc and usr are fine, but checked", map[string]string{"usrrc": "set levelup_queue_count = 5,10\n", "usr/x": baseUsr + "set leveldown_queue_count = 5,6\n"},
		"usr/x:4: leveldown_queue_count: D0 5 must be below U1 5 (Table 3-14: 0 <= D0 < U1 <= U2)"},
	{"same group, other module", map[string]string{"usr/a": baseUsr, "usr/b": "set service_group = grp\nset service = \"b=b\"\nset module = other\n"},
		`usr/b:1: service_group: service group "grp" is served by usr/a already (one user server per group)`},
	{"same group, same module", map[string]string{"usr/a": baseUsr, "usr/b": baseUsr},
		`usr/b:1: service_group: service group "grp" is served by usr/a already (one user server per group)`},
	{"scdmulti without multi-scheduler", map[string]string{"usr/x": baseUsr + "set scdmulti = Y\n"},
		"usr/x:4: scdmulti: needs scdmulti of 2 or more in scdsvcdef, which has 1"},
	{"scdmulti N with a multi-scheduler", map[string]string{"scdsvcdef": "set scdmulti = 3\n", "usr/x": baseUsr + "set scdmulti = N\n"},
		"usr/x:4: scdmulti: N is not supported: all 3 receiving sockets of scdsvcdef's scdmulti take every group's calls; remove it"},
	{"scdmulti N in usrrc with a multi-scheduler", map[string]string{"scdsvcdef": "set scdmulti = 2\n", "usrrc": "set scdmulti = N\n", "usr/x": baseUsr},
		"usrrc:1: scdmulti: N is not supported: all 2 receiving sockets of scdsvcdef's scdmulti take every group's calls; remove it (for usr/x)"},
	{"bound to an undefined receiver group", map[string]string{"scdsvcdef": "scdmulti -g heavy -p 12010\n", "usr/x": baseUsr + "scdmulti -g heavvy\n"},
		`usr/x:4: scdmulti: receiver group "heavvy" is not defined in scdsvcdef (scdmulti -g heavvy -m COUNT -p PORT) (did you mean heavy?)`},
	{"bound and set scdmulti = N", map[string]string{"scdsvcdef": "scdmulti -g heavy -p 12010\n", "usr/x": baseUsr + "scdmulti -g heavy\nset scdmulti = N\n"},
		"usr/x:5: scdmulti: set scdmulti = N contradicts scdmulti -g heavy, which binds the server to a receiver group: remove one"},
	{"socket server bound", map[string]string{"scdsvcdef": "scdmulti -g heavy -p 12010\n", "usr/x": baseUsr + "set receive_from = socket\nscdmulti -g heavy\n"},
		"usr/x:5: scdmulti: receiver groups are for servers that receive from a queue (000: multi-scheduler daemons are grouped by queue-receiving servers); this one has receive_from = socket"},
	{"bound twice in one file", map[string]string{"scdsvcdef": "scdmulti -g heavy -p 12010\n", "usr/x": baseUsr + "scdmulti -g heavy\nscdmulti -g heavy\n"},
		"usr/x:5: scdmulti: given twice (first at line 4): a server is bound to one receiver group"},
	{"bound with an option it does not take", map[string]string{"scdsvcdef": "scdmulti -g heavy -p 12010\n", "usr/x": baseUsr + "scdmulti -g heavy -m 2\n"},
		"usr/x:4: scdmulti: unknown option -m (it takes -g)"},
	{"node-wide cap below resident processes", map[string]string{"sysconf": "\nset max_processes = 3\n", "usr/a": baseUsr + "set parallel_count = 2\n", "usr/b": "set service_group = other\nset service = \"b=b\"\nset module = uap\nset parallel_count = 2\n"},
		"sysconf:2: max_processes: 3 is below the 4 resident processes of the user servers"},
	{"missing service_group", map[string]string{"usr/x": "set service = \"a=a\"\nset module = uap\n"},
		"usr/x:2: service_group: required (set it in this file or in usrrc)"},
	{"missing service", map[string]string{"usr/x": "set service_group = g\nset module = uap\n\n"},
		"usr/x:3: service: required (set it in this file or in usrrc)"},
	{"missing module, empty file", map[string]string{"usr/x": "set service_group = g\nset service = a=a\n", "usr/y": ""},
		"usr/x:2: module: required (set it in this file or in usrrc)\n" +
			"usr/y:1: service_group: required (set it in this file or in usrrc)\n" +
			"usr/y:1: service: required (set it in this file or in usrrc)\n" +
			"usr/y:1: module: required (set it in this file or in usrrc)"},
	{"empty usr file", map[string]string{"usr/y": ""},
		"usr/y:1: service_group: required (set it in this file or in usrrc)\n" +
			"usr/y:1: service: required (set it in this file or in usrrc)\n" +
			"usr/y:1: module: required (set it in this file or in usrrc)"},
	{"putenv in scdsvcdef", map[string]string{"scdsvcdef": "putenv A b\n", "usr/x": baseUsr},
		"scdsvcdef:1: putenv: only allowed in usrrc and usr files"},
}

func TestContradictions(t *testing.T) {
	for _, tc := range contradictionCases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(writeDir(t, tc.files))
			if err == nil || err.Error() != tc.err {
				t.Fatalf("error = %v\nwant    %s", err, tc.err)
			}
		})
	}
}

func TestUsrrc(t *testing.T) {
	dir := writeDir(t, map[string]string{
		"sysconf": "set watch_time = 60\n",
		"usrrc": `# defaults for every server
set module = "uap-echo"
set service = "echo=echo"
set balance_count = 5
set schedule_priority = 3
set watch_time = 20
putenv LANG C
putenv MODE rc
`,
		"usr/b": `set service_group = gb
set balance_count = 1
set service = "x=y", z=z
putenv MODE b
putenv EXTRA 1
`,
		"usr/a":      "set service_group = ga\nset module = \"uap-a\"\nset watch_time = 0\n",
		"usr/.hid":   "garbage",
		"usr/a~":     "garbage",
		"usr/d/file": "garbage",
	})
	cfg, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Dir != dir {
		t.Errorf("Dir = %q", cfg.Dir)
	}
	if len(cfg.Servers) != 2 || cfg.Servers[0].Name != "a" || cfg.Servers[1].Name != "b" {
		t.Fatalf("servers = %+v", cfg.Servers)
	}
	a, b := cfg.Servers[0], cfg.Servers[1]
	want := []struct {
		name      string
		got, want any
	}{
		{"a module overrides usrrc", a.Module, "uap-a"},
		{"a service from usrrc", a.Services, []Service{{"echo", "echo"}}},
		{"a balance_count from usrrc", a.BalanceCount, 5},
		{"a schedule_priority from usrrc", a.SchedulePriority, 3},
		{"a watch_time overrides usrrc", a.WatchTime, time.Duration(0)},
		{"a env from usrrc", a.Env, []string{"LANG=C", "MODE=rc"}},
		{"a file", a.File, "usr/a"},
		{"b module from usrrc", b.Module, "uap-echo"},
		{"b service overrides usrrc", b.Services, []Service{{"x", "y"}, {"z", "z"}}},
		{"b balance_count overrides", b.BalanceCount, 1},
		{"b watch_time from usrrc", b.WatchTime, 20 * time.Second},
		{"b env merged", b.Env, []string{"LANG=C", "MODE=b", "EXTRA=1"}},
		{"system watch_time", cfg.System.WatchTime, 60 * time.Second},
	}
	for _, w := range want {
		if !reflect.DeepEqual(w.got, w.want) {
			t.Errorf("%s: got %#v, want %#v", w.name, w.got, w.want)
		}
	}
}

// TestManyPutenvs: a file of many putenv statements loads in time linear
// in them. Each one looked through every variable set before it, so that
// 100000 of them (1.6 MB, far below the 16 MiB bound) took over a minute
// and a file at the bound hours; 50000 took 20 s.
func TestManyPutenvs(t *testing.T) {
	const n = 50000
	var b strings.Builder
	b.WriteString(baseUsr)
	for i := range n {
		fmt.Fprintf(&b, "putenv V%d %d\n", i, i)
	}
	b.WriteString("putenv V7 seven\n") // a second one of a name is refused, as ever
	rc := "putenv V1 rc\nputenv RC 1\n"
	done := make(chan struct{})
	var cfg *Config
	var err error
	go func() {
		defer close(done)
		cfg, err = LoadFS(fstest.MapFS{"usrrc": {Data: []byte(rc)}, "usr/x": {Data: []byte(b.String())}})
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("%d putenv statements still loading after 5 s", n)
	}
	const dup = "usr/x:50004: putenv: V7 given twice (first at line 11)"
	if err == nil || err.Error() != dup {
		t.Fatalf("error = %v, want %s", err, dup)
	}
	cfg, err = LoadFS(fstest.MapFS{"usrrc": {Data: []byte(rc)}, "usr/x": {Data: []byte(strings.TrimSuffix(b.String(), "putenv V7 seven\n"))}})
	if err != nil {
		t.Fatal(err)
	}
	env := cfg.Servers[0].Env
	if len(env) != n+1 || env[0] != "V1=1" || env[1] != "RC=1" || env[2] != "V0=0" || env[n] != fmt.Sprintf("V%d=%d", n-1, n-1) {
		t.Fatalf("%d variables, starting %q, ending %q", len(env), env[:3], env[len(env)-1])
	}
}

func TestWatchTimeFromSysconf(t *testing.T) {
	cfg, err := Load(writeDir(t, map[string]string{"sysconf": "set watch_time = 7\n", "usr/x": baseUsr}))
	if err != nil {
		t.Fatal(err)
	}
	if got := srv(cfg).WatchTime; got != 7*time.Second {
		t.Fatalf("WatchTime = %v, want 7s", got)
	}
}

func TestLoadDirErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope")
	if _, err := Load(missing); err == nil {
		t.Error("missing directory: no error")
	}
	empty := t.TempDir()
	if _, err := Load(empty); err == nil || err.Error() != "no user servers in "+filepath.Join(empty, "usr") {
		t.Errorf("no usr/: error = %v", err)
	}
	onlyHidden := writeDir(t, map[string]string{"usr/.x": baseUsr, "usr/x~": baseUsr})
	if _, err := Load(onlyHidden); err == nil || !strings.HasPrefix(err.Error(), "no user servers in ") {
		t.Errorf("only skipped files: error = %v", err)
	}
}

func TestLoadDefault(t *testing.T) {
	cfg, err := LoadDefault()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Dir != "" {
		t.Errorf("Dir = %q", cfg.Dir)
	}
	sys := cfg.System
	if sys.RPCAddress != "127.0.0.1" || sys.RPCPort != 12000 || sys.MetricsAddress != "127.0.0.1:12001" ||
		!reflect.DeepEqual(sys.AllNodes, []string{"127.0.0.1:12000"}) {
		t.Errorf("system = %+v", sys)
	}
	if !reflect.DeepEqual(cfg.Sched, defaultSched()) {
		t.Errorf("sched = %+v", cfg.Sched)
	}
	if len(cfg.Servers) != 1 {
		t.Fatalf("servers = %+v", cfg.Servers)
	}
	s := cfg.Servers[0]
	var names []string
	for _, sv := range s.Services {
		if sv.Entry != sv.Name {
			t.Errorf("service %+v: entry differs", sv)
		}
		names = append(names, sv.Name)
	}
	if s.Name != "demo" || s.File != "usr/demo" || s.ServiceGroup != "demo" || s.Module != "uap-echo" ||
		strings.Join(names, ",") != "echo,sleep,burn,cpu,fail,crash,pid,call" ||
		s.Resident != 2 || s.MaxProcesses != 4 || s.BalanceCount != 3 || s.QueueSize != 256 ||
		s.ReceiveFrom != ReceiveQueue || s.WatchTime != DefaultWatchTime {
		t.Errorf("demo = %+v", s)
	}
}

// TestLoopbackByDefault: a directory without sysconf, or a sysconf without
// rpc_address, listens on loopback and warns about nothing.
func TestLoopbackByDefault(t *testing.T) {
	for name, files := range map[string]map[string]string{
		"no sysconf":     {"usr/x": baseUsr},
		"no rpc_address": {"sysconf": "set rpc_port = 13000\nset name_port = 13002\n", "usr/x": baseUsr},
	} {
		cfg, err := Load(writeDir(t, files))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if cfg.System.RPCAddress != "127.0.0.1" {
			t.Errorf("%s: rpc_address %q, want 127.0.0.1", name, cfg.System.RPCAddress)
		}
		if w := cfg.System.Warnings(); len(w) != 0 {
			t.Errorf("%s: warnings %q", name, w)
		}
	}
}

func TestWarnings(t *testing.T) {
	const key = "0123456789abcdef"
	for _, tc := range []struct {
		addr, key string
		warn      bool
	}{
		{"127.0.0.1", "", false},
		{"127.0.0.3", "", false},
		{"::1", "", false},
		{"localhost", "", false},
		{"0.0.0.0", "", true},
		{"::", "", true},
		{"10.0.0.2", "", true},
		{"node1.example", "", true}, // a name is not resolved: it may be anything
		{"0.0.0.0", key, false},
		{"10.0.0.2", key, false},
	} {
		s := defaultSystem("h")
		s.RPCAddress, s.ClusterKey = tc.addr, tc.key
		w := s.Warnings()
		if (len(w) > 0) != tc.warn {
			t.Errorf("rpc_address %s, key %q: warnings %q, want a warning: %v", tc.addr, tc.key, w, tc.warn)
		}
	}
	// The name port is named only in a cluster: a node alone does not
	// listen on it, and the warning named it all the same.
	for _, tc := range []struct {
		allNode []string
		ports   string
	}{
		{nil, "port 12000"},
		{[]string{"0.0.0.0"}, "port 12000"}, // only this node
		{[]string{"0.0.0.0", "10.0.0.3"}, "ports 12000 and 12002"},
	} {
		s := defaultSystem("h")
		s.RPCAddress, s.AllNodes = "0.0.0.0", tc.allNode
		want := "sysconf: rpc_address 0.0.0.0 is not loopback and there is no cluster_key: " +
			"anyone who reaches " + tc.ports + " can pose as a node; set cluster_key (docs/WARNINGS.md#no-cluster_key-off-loopback)"
		if w := s.Warnings(); len(w) != 1 || w[0] != want {
			t.Errorf("all_node %q: warning %q\nwant      %q", tc.allNode, w, want)
		}
	}
}

// TestUIDGID: uid and gid take a name that exists or a number, from usrrc
// or the server's file; root needs uap_allow_root.
func TestUIDGID(t *testing.T) {
	// User 4243 stands for one whose primary group is root (operator,
	// sync or halt on some systems): a uid without gid runs with it.
	real := lookupUserID
	lookupUserID = func(uid string) (*user.User, error) {
		if uid == "4243" {
			return &user.User{Uid: uid, Gid: "0", Username: "op"}, nil
		}
		return real(uid)
	}
	t.Cleanup(func() { lookupUserID = real })
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody on this machine:", err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	grp, err := user.LookupGroupId(nobody.Gid)
	if err != nil {
		t.Skip("nobody's group has no name:", err)
	}
	gid, _ := strconv.Atoi(grp.Gid)
	for _, tc := range []struct {
		name     string
		files    map[string]string
		uid, gid int
		err      string // the whole error when not ""
	}{
		{"none", map[string]string{"usr/x": baseUsr}, -1, -1, ""},
		{"names", map[string]string{"usr/x": baseUsr + "set uid = nobody\nset gid = " + grp.Name + "\n"}, uid, gid, ""},
		{"numbers", map[string]string{"usr/x": baseUsr + "set uid = 4000\nset gid = \"4001\"\n"}, 4000, 4001, ""},
		{"from usrrc", map[string]string{"usrrc": "set uid = nobody\n", "usr/x": baseUsr + "set gid = 7\n"}, uid, 7, ""},
		{"usr over usrrc", map[string]string{"usrrc": "set uid = 9\n", "usr/x": baseUsr + "set uid = nobody\n"}, uid, gid, ""},
		{"uid without passwd entry", map[string]string{"usr/x": baseUsr + "set uid = 424242\n"}, 424242, 424242, ""},
		{"uid whose group is root", map[string]string{"usr/x": baseUsr + "set uid = 4243\n"}, 0, 0,
			"usr/x:4: uid: user 4243's primary group is root (gid 0), which would run the server's processes; name a gid, or set uap_allow_root = Y in sysconf to allow it"},
		{"uid whose group is root, allowed", map[string]string{"sysconf": "set uap_allow_root = Y\n", "usr/x": baseUsr + "set uid = 4243\n"}, 4243, 0, ""},
		{"root allowed", map[string]string{"sysconf": "set uap_allow_root = Y\n", "usr/x": baseUsr + "set uid = root\nset gid = 0\n"}, 0, 0, ""},
		{"root by name", map[string]string{"usr/x": baseUsr + "set uid = root\n"}, 0, 0,
			"usr/x:4: uid: root would run the server's processes; set uap_allow_root = Y in sysconf to allow it"},
		{"root by number", map[string]string{"usr/x": baseUsr + "\nset uid = 0\n"}, 0, 0,
			"usr/x:5: uid: root would run the server's processes; set uap_allow_root = Y in sysconf to allow it"},
		{"root in usrrc", map[string]string{"usrrc": "set uid = 0\n", "usr/x": baseUsr}, 0, 0,
			"usrrc:1: uid: root would run the server's processes; set uap_allow_root = Y in sysconf to allow it (for usr/x)"},
		{"root allowed explicitly N", map[string]string{"sysconf": "set uap_allow_root = N\n", "usr/x": baseUsr + "set uid = nobody\nset gid = root\n"}, 0, 0,
			"usr/x:5: gid: group root (gid 0) would run the server's processes; set uap_allow_root = Y in sysconf to allow it"},
		{"no such user", map[string]string{"usr/x": baseUsr + "set uid = no_such_user_tpsched\n"}, 0, 0,
			`usr/x:4: uid: no user "no_such_user_tpsched" on this machine`},
		{"no such group", map[string]string{"usr/x": "set gid = no_such_group_tpsched\n" + baseUsr}, 0, 0,
			`usr/x:1: gid: no group "no_such_group_tpsched" on this machine`},
		{"too big", map[string]string{"usr/x": baseUsr + "set uid = 4294967295\n"}, 0, 0,
			"usr/x:4: uid: 4294967295 out of range 0..4294967294"},
		// A signed number is no name (useradd takes none starting with
		// '-'): it was looked up as one, 'no user "-1" on this machine'.
		{"negative", map[string]string{"usr/x": baseUsr + "set uid = -1\n"}, 0, 0,
			`usr/x:4: uid: "-1": want a user name or a number 0..4294967294`},
		{"signed", map[string]string{"usr/x": baseUsr + "set gid = +7\n"}, 0, 0,
			`usr/x:4: gid: "+7": want a group name or a number 0..4294967294`},
		{"empty", map[string]string{"usr/x": baseUsr + "set gid = \"\"\n"}, 0, 0, "usr/x:4: gid: empty group name"},
		{"two values", map[string]string{"usr/x": baseUsr + "set uid = a, b\n"}, 0, 0, "usr/x:4: uid: want one value, got 2"},
		{"in sysconf", map[string]string{"sysconf": "set uid = 5\n", "usr/x": baseUsr}, 0, 0,
			"sysconf:1: uid: unknown operand here (it belongs in usrrc or usr/<server>)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Load(writeDir(t, tc.files))
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("error = %v\nwant    %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s := srv(cfg); s.UID != tc.uid || s.GID != tc.gid {
				t.Fatalf("uid %d gid %d, want %d %d", s.UID, s.GID, tc.uid, tc.gid)
			}
		})
	}
}

// TestDefaultDemoOffersEveryUAPEchoService: the embedded demo group offers
// every service uap-echo registers (the README lists them), so a service
// added to the UAP cannot be forgotten in the demo.
func TestDefaultDemoOffersEveryUAPEchoService(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "..", "cmd", "uap-echo", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	var registered []string
	for _, m := range regexp.MustCompile(`srv\.Handle\("([^"]+)"`).FindAllStringSubmatch(string(src), -1) {
		registered = append(registered, m[1])
	}
	if len(registered) < 5 {
		t.Fatalf("found only %v registered in uap-echo: has its source changed shape?", registered)
	}
	cfg, err := LoadDefault()
	if err != nil {
		t.Fatal(err)
	}
	offered := map[string]bool{}
	for _, sv := range cfg.Servers[0].Services {
		offered[sv.Name] = true
	}
	for _, name := range registered {
		if !offered[name] {
			t.Errorf("uap-echo serves %q but the demo group (default/usr/demo) does not offer it", name)
		}
	}
	if len(offered) != len(registered) {
		t.Errorf("demo offers %d services, uap-echo registers %d: %v", len(offered), len(registered), registered)
	}
}

// TestUAPLimits: uap_pids_max and uap_memory_max in sysconf are every
// server's, a server's own (or usrrc's) replaces them; left out, the node
// computes them (AutoLimit).
func TestUAPLimits(t *testing.T) {
	for _, tc := range []struct {
		sysconf, usr string
		pids         int
		mem          int64
	}{
		{"", "", AutoLimit, AutoLimit},
		{"set uap_pids_max = 300\nset uap_memory_max = 1024\n", "", 300, 1 << 30},
		{"set uap_pids_max = 300\n", "set uap_pids_max = 0\nset uap_memory_max = 64\n", 0, 64 << 20},
	} {
		cfg, err := Load(writeDir(t, map[string]string{"sysconf": tc.sysconf, "usr/x": tc.usr + baseUsr}))
		if err != nil {
			t.Fatalf("%q %q: %v", tc.sysconf, tc.usr, err)
		}
		if s := srv(cfg); s.PidsMax != tc.pids || s.MemoryMax != tc.mem {
			t.Errorf("%q %q: pids %d memory %d, want %d %d", tc.sysconf, tc.usr, s.PidsMax, s.MemoryMax, tc.pids, tc.mem)
		}
	}
	if _, err := Load(writeDir(t, map[string]string{"usr/x": "set uap_pids_max = 4194305\n" + baseUsr})); err == nil ||
		!strings.HasPrefix(err.Error(), "usr/x:1: uap_pids_max: ") {
		t.Errorf("pids over pid_max: %v", err)
	}
	if got := PidsMaxAuto(1); got != 512 {
		t.Errorf("PidsMaxAuto(1) = %d", got)
	}
	if got := PidsMaxAuto(64); got != 4096 {
		t.Errorf("PidsMaxAuto(64) = %d", got)
	}
	cfg, err := Load(writeDir(t, map[string]string{"usr/x": "set working_directory = \"run/x\"\n" + baseUsr}))
	if err != nil || srv(cfg).WorkingDirectory != "run/x" {
		t.Errorf("working_directory: %v %q", err, srv(cfg).WorkingDirectory)
	}
}

// TestClusterKeyWhereOthersCanRead (issue 19 item 12): cluster_key in a
// sysconf others can read is a warning; cluster_key_file holds it in a
// file of its own, refused when every user can read it, a warning when
// its group can.
func TestClusterKeyWhereOthersCanRead(t *testing.T) {
	const key = "0123456789abcdef0123"
	dir := writeDir(t, map[string]string{"sysconf": "set cluster_key = \"" + key + "\"\n", "usr/x": baseUsr})
	warned := func(cfg *Config, what string) bool {
		for _, w := range cfg.System.Warnings() {
			if strings.Contains(w, what) {
				return true
			}
		}
		return false
	}
	cfg, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !warned(cfg, "it holds cluster_key and users other than its owner can read it (mode 0644)") {
		t.Errorf("no warning for a 0644 sysconf with the key: %q", cfg.System.Warnings())
	}
	if err := os.Chmod(filepath.Join(dir, "sysconf"), 0o600); err != nil {
		t.Fatal(err)
	}
	if cfg, err = Load(dir); err != nil || len(cfg.System.Warnings()) != 0 {
		t.Errorf("a 0600 sysconf: %v, warnings %q", err, cfg.System.Warnings())
	}

	keyDir := t.TempDir()
	keyFile := filepath.Join(keyDir, "cluster.key")
	for _, tc := range []struct {
		mode    os.FileMode
		content string
		path    string
		err     string // prefix; "" loads
		warn    string
	}{
		{0o600, key + "\n", keyFile, "", ""},
		{0o640, key, keyFile, "", "is readable by its group (mode 0640)"},
		{0o644, key, keyFile, "sysconf:1: cluster_key_file: " + keyFile + " is readable by every user (mode 0644), so every UAP can read the key: chmod 600 it", ""},
		{0o600, "short\n", keyFile, "sysconf:1: cluster_key_file: " + keyFile + ": the key has 5 bytes, want 16..1024", ""},
		{0o600, key, "keys/cluster.key", "", ""},
		{0o600, key, filepath.Join(keyDir, "none"), "sysconf:1: cluster_key_file: ", ""},
	} {
		files := map[string]string{"sysconf": "set cluster_key_file = \"" + tc.path + "\"\n", "usr/x": baseUsr}
		if !filepath.IsAbs(tc.path) {
			files[tc.path] = tc.content
		}
		dir := writeDir(t, files)
		target := tc.path
		if !filepath.IsAbs(target) {
			target = filepath.Join(dir, target)
		} else if !strings.HasSuffix(target, "none") {
			if err := os.WriteFile(target, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if !strings.HasSuffix(target, "none") {
			if err := os.Chmod(target, tc.mode); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chmod(filepath.Join(dir, "sysconf"), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := Load(dir)
		if tc.err != "" {
			if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
				t.Errorf("%v %q: error %v, want %q", tc.mode, tc.path, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v %q: %v", tc.mode, tc.path, err)
			continue
		}
		if cfg.System.ClusterKey != key {
			t.Errorf("%v %q: key %q", tc.mode, tc.path, cfg.System.ClusterKey)
		}
		if w := cfg.System.Warnings(); (tc.warn == "") != (len(w) == 0) || (tc.warn != "" && !warned(cfg, tc.warn)) {
			t.Errorf("%v %q: warnings %q, want %q", tc.mode, tc.path, w, tc.warn)
		}
	}
	if _, err := Load(writeDir(t, map[string]string{"sysconf": "set cluster_key = \"" + key + "\"\nset cluster_key_file = \"k\"\n",
		"k": key, "usr/x": baseUsr})); err == nil || !strings.Contains(err.Error(), "cluster_key is given too") {
		t.Errorf("both: %v", err)
	}
}

// TestWarningsAreShortAndDocumented (issue 31 item 4): each warning of the
// definitions is one short line that names its section of
// docs/WARNINGS.md, which has it; the detail is there, not in the log.
func TestWarningsAreShortAndDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "WARNINGS.md"))
	if err != nil {
		t.Fatal(err)
	}
	var warnings []string
	open := writeDir(t, map[string]string{"sysconf": "set cluster_key = \"0123456789abcdef0123\"\n", "usr/x": baseUsr})
	cfg, err := Load(open)
	if err != nil {
		t.Fatal(err)
	}
	warnings = append(warnings, cfg.System.Warnings()...)
	s := defaultSystem("h")
	s.RPCAddress = "0.0.0.0"
	warnings = append(warnings, s.Warnings()...)
	if len(warnings) != 2 {
		t.Fatalf("want the two warnings, got %q", warnings)
	}
	anchor := regexp.MustCompile(`\(docs/WARNINGS\.md#([a-z_-]+)\)$`)
	for _, w := range warnings {
		// The path of the sysconf is in one of them: a temporary one here.
		if n := len(strings.ReplaceAll(w, open, "")); n > 200 {
			t.Errorf("a warning of %d characters, want at most 200 besides the path: %s", n, w)
		}
		m := anchor.FindStringSubmatch(w)
		if m == nil {
			t.Errorf("a warning that names no section of docs/WARNINGS.md: %s", w)
			continue
		}
		if !strings.Contains(string(doc), "(#"+m[1]+")") {
			t.Errorf("docs/WARNINGS.md has no #%s in its contents: %s", m[1], w)
		}
	}
}

// TestDefinitionFilesThatAreNoFiles: a definition file that is a named
// pipe, a directory or a link to nothing is refused, naming the file:
// Load does not wait on the pipe for a writer that never comes, and does
// not run on defaults as though the file were not there.
func TestDefinitionFilesThatAreNoFiles(t *testing.T) {
	for _, c := range []struct {
		file string
		make func(p string) error
		err  string
	}{
		{"sysconf", func(p string) error { return syscall.Mkfifo(p, 0o600) }, "sysconf: not a regular file (a named pipe)"},
		{"scdsvcdef", func(p string) error { return syscall.Mkfifo(p, 0o600) }, "scdsvcdef: not a regular file (a named pipe)"},
		{"usrrc", func(p string) error { return os.Mkdir(p, 0o755) }, "usrrc: not a regular file (a directory)"},
		{"svcpolicy", func(p string) error { return syscall.Mkfifo(p, 0o600) }, "svcpolicy: not a regular file (a named pipe)"},
		{"k", func(p string) error { return syscall.Mkfifo(p, 0o600) }, "sysconf:1: cluster_key_file: "},
		{"sysconf", func(p string) error { return os.Symlink("nowhere", p) }, "sysconf: a symbolic link to a file that does not exist"},
		{"usr/y", func(p string) error { return os.Symlink("nowhere", p) }, "usr/y: a symbolic link to a file that does not exist"},
	} {
		t.Run(c.file, func(t *testing.T) {
			files := map[string]string{"usr/x": baseUsr}
			if c.file == "k" {
				files["sysconf"] = "set cluster_key_file = k\n"
			}
			dir := writeDir(t, files)
			p := filepath.Join(dir, filepath.FromSlash(c.file))
			if err := c.make(p); err != nil {
				t.Fatal(err)
			}
			err := notWaitingOn(t, p, func() error { _, err := Load(dir); return err })
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Fatalf("Load: error = %v, want one with %q", err, c.err)
			}
		})
	}
}

// notWaitingOn runs load, which must not wait on the named pipe p: past
// 10 s the test fails (the pipe opened for writing and closed, so that
// load ends). It returns load's error.
func notWaitingOn(t *testing.T, p string, load func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- load() }()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		if f, err := os.OpenFile(p, os.O_WRONLY, 0); err == nil {
			f.Close()
		}
		<-done
		t.Fatalf("waited on %s for 10 s", p)
		return nil
	}
}

// TestDefinitionFilesPastTheBound: a definition file of more than 16 MiB
// is refused by its size, before it is read (a sparse file here: its bytes
// are never written), naming the file, its size and the bound. Each was
// read whole.
func TestDefinitionFilesPastTheBound(t *testing.T) {
	const size = maxDefinitionSize + 1
	abs := filepath.Join(t.TempDir(), "key")
	for _, c := range []struct {
		file    string // in the directory, or abs
		sysconf string
		err     string
	}{
		{"sysconf", "", "sysconf: 16777217 bytes, more than a definition file may have (16777216, 16 MiB)"},
		{"scdsvcdef", "", "scdsvcdef: 16777217 bytes, more than"},
		{"usrrc", "", "usrrc: 16777217 bytes, more than"},
		{"usr/y", "", "usr/y: 16777217 bytes, more than"},
		{"svcpolicy", "", "svcpolicy: 16777217 bytes, more than"},
		{"k", "set cluster_key_file = k\n", "sysconf:1: cluster_key_file: DIR/k: 16777217 bytes, more than"},
		{abs, "set cluster_key_file = \"" + abs + "\"\n", "sysconf:1: cluster_key_file: " + abs + ": 16777217 bytes, more than"},
	} {
		t.Run(filepath.Base(c.file), func(t *testing.T) {
			files := map[string]string{"usr/x": baseUsr}
			if c.sysconf != "" {
				files["sysconf"] = c.sysconf
			}
			dir := writeDir(t, files)
			p := c.file
			if !filepath.IsAbs(p) {
				p = filepath.Join(dir, filepath.FromSlash(p))
			}
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			err = f.Truncate(size)
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
			_, err = Load(dir)
			want := strings.ReplaceAll(c.err, "DIR", dir)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("Load: error = %.300v, want one with %q", err, want)
			}
		})
	}
}

// growingFile is a file whose Stat says it is empty and whose reads never
// end: a file that grows while it is read.
type growingFile struct{ read int64 }

func (g *growingFile) Stat() (fs.FileInfo, error) { return growingInfo{}, nil }
func (g *growingFile) Close() error               { return nil }
func (g *growingFile) Read(b []byte) (int, error) {
	clear(b)
	g.read += int64(len(b))
	return len(b), nil
}

type growingInfo struct{}

func (growingInfo) Name() string       { return "sysconf" }
func (growingInfo) Size() int64        { return 0 }
func (growingInfo) Mode() fs.FileMode  { return 0o644 }
func (growingInfo) ModTime() time.Time { return time.Time{} }
func (growingInfo) IsDir() bool        { return false }
func (growingInfo) Sys() any           { return nil }

// TestDefinitionFileThatGrowsWhileRead: the bound holds for a file whose
// size said less when it was opened: the read stops just past it.
func TestDefinitionFileThatGrowsWhileRead(t *testing.T) {
	g := &growingFile{}
	_, err := readOpened("sysconf", g)
	const want = "sysconf: grew past 16777216 bytes while it was read, more than a definition file may have (16 MiB)"
	if err == nil || err.Error() != want {
		t.Fatalf("error = %v, want %s", err, want)
	}
	if g.read > maxDefinitionSize+64<<10 {
		t.Fatalf("read %d bytes, want the bound and little more", g.read)
	}
}
