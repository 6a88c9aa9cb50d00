package def

import "fmt"

// The operands of a client's definitions (operands.go has the tables' shape).

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
			c.SchedulerDirect, err = boolYN(v)
			return err
		},
		value:  "N",
		values: "Y or N",
		opentp1: "Y: the client makes its requests to the schedule service of a dchost node for load balancing (the server side decides; 000, 001 Table 3-6); " +
			"the schedule_rate operand is valid only for such requests (000). N: RPCs go through the name service.",
		tpsched: "Both send every call to a dchost node (or, with dccltloadbalance = Y, to one learned from the name service, marked balanced). " +
			"Y marks the calls scheduler-direct: the node chooses among the nodes that run the group with schedule_rate weighting LEVEL0 against LEVEL1 nodes. " +
			"N: the node, whose name table is the name service, sends the call to the least-loaded node that runs the group (Table 3-7: announce Y, " +
			"this_node_first N), as it does a call a UAP makes.",
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
