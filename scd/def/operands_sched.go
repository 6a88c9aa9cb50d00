package def

import (
	"errors"
	"fmt"
)

// The operands of scdsvcdef: scheduling (operands.go has the tables' shape).

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
		tpsched: "Applies to the calls of clients with dcscddirect = Y only (the frame's scheduler-direct flag); with scd_balance_rule = p2c it weighs the two choices. " +
			"Every other call this node balances (a client's without dcscddirect = Y, a UAP's own call, a balanced call that must move on) goes to the least-loaded node " +
			"that runs its group (Table 3-7, announce Y and this_node_first N): LEVEL0 nodes while there are any, uniform among them.",
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
		tpsched: "A transferred call is retried when the node chosen for it could not be reached. " +
			"Whatever the value, a node this node could not connect to in the last second (and has not since) is left out of the choice " +
			"while another node runs the group, so a node that died meets one call a second, not its share, until the failure detector takes it out.",
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
				return fmt.Errorf("want opentp1 or p2c, got %q", shown(s.BalanceRule))
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
					return fmt.Errorf("receiver group %q defined twice", shown(g.Name))
				}
				if o.Port == g.Port && g.Port != 0 {
					return fmt.Errorf("port %d is receiver group %s's already", g.Port, shown(o.Name))
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
