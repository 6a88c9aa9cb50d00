package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"tpsched/netio/rpcport"
	"tpsched/procmgr"
	"tpsched/scd"
)

// scdctl status: the node, its groups, receivers and cluster, as a table
// or as JSON.

func status(ctx context.Context, addr string, asJSON bool, args []string, stdout io.Writer) error {
	if len(args) > 0 {
		return usageError("status [-json]")
	}
	body, err := httpDo(ctx, http.DefaultClient, http.MethodGet, "http://"+addr+"/status", addr,
		httpHint)
	if err != nil {
		return err
	}
	if asJSON {
		_, err := stdout.Write(body)
		return err
	}
	var st scd.Status
	if err := json.Unmarshal(body, &st); err != nil {
		return fmt.Errorf("status from %s: %w", addr, err)
	}
	fmt.Fprintf(stdout, "node %s  rpc %s", st.Node, st.RPC)
	if st.Draining {
		fmt.Fprint(stdout, "  DRAINING")
	}
	fmt.Fprintln(stdout)
	fmt.Fprintf(stdout, "cpu priority: %s (%s)\n", st.CPU.Mechanism, st.CPU.Reason)
	c := st.Contain
	fmt.Fprintf(stdout, "uap containment: killed by %s; pids limit %s, memory limit %s; placed by %s; namespaces %s; no_new_privs %v\n",
		c.Kill, c.Pids, c.Memory, c.Placement, c.Namespaces, c.NoNewPrivs)
	fmt.Fprintf(stdout, "cpu measurement: %s", st.Probes.Name)
	if st.Probes.Reason != "" {
		fmt.Fprintf(stdout, " (%s)", st.Probes.Reason)
	}
	fmt.Fprintln(stdout)
	gate := "open"
	if st.Scaling.MemoryGateClosed {
		gate = "CLOSED"
	}
	fmt.Fprintf(stdout, "non-resident processes: %d started, %d stopped; memory gate %s; cpu guard held starts back %d times\n",
		st.Scaling.NonResidentStarts, st.Scaling.NonResidentStops, gate, st.Scaling.CPUGuardHolds)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tSERVER\tSTATE\tPRIO\tLOAD\tQUEUE\tIN-FLIGHT\tQUEUED\tPROCESSED\tPROCESSES\tRESTARTS\tREPLACED\tPIDS")
	envs := false
	for _, g := range st.Groups {
		state := groupState(g)
		envs = envs || g.Environment != ""
		var pids []string
		nonres, restarts, replaced := 0, 0, 0
		for _, p := range g.Processes {
			restarts += p.Restarts
			replaced += p.Replaced
			pid := string(p.State)
			if p.PID != 0 {
				pid = strconv.Itoa(p.PID)
			}
			if p.Kind == "nonresident" {
				nonres++
				pid += "*"
			}
			pids = append(pids, pid)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d/%d\t%d\t%d\t%d\t%d+%d/%d\t%d\t%d\t%s\n", g.Group, g.Server, state, g.Priority,
			g.Load.Level, g.QueueDepth, g.QueueSize, g.InFlight, g.Queued, g.Processed,
			len(g.Processes)-nonres, nonres, g.Max, restarts, replaced, dashIfEmpty(strings.Join(pids, ",")))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "QUEUE is calls waiting now/queue_size; QUEUED and PROCESSED count calls since this scdd started.")
	fmt.Fprintln(stdout, "PROCESSES is resident+non-resident/most; * marks a non-resident process; RESTARTS counts resident processes started again after they died,")
	fmt.Fprintln(stdout, "REPLACED those replaced at an operator's request (scdctl refresh).")
	if envs {
		fmt.Fprintln(stdout, "env: an application environment (svcpolicy); env:dormant has no server here until the cluster starts one (a call, scdctl find).")
	}
	fmt.Fprintln(stdout)
	fmt.Fprintln(tw, "GROUP\tLOAD\tRULE\tEVERY\tQ\tq\tPROCESSED\tX\tCHANGES\tCPU-S\tRUNQ-WAIT-S\tWAIT%\tGUARD%\tWAIT p50/p99")
	for _, g := range st.Groups {
		l, u := g.Load, g.Usage
		x := "-"
		if l.Rate != nil {
			x = fmt.Sprintf("%.0f", *l.Rate)
		}
		every := "never"
		if l.Interval > 0 {
			every = fmt.Sprintf("%gs", l.Interval)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%d\t%.3f\t%.3f\t%s\t%s\t%s\n", g.Group, l.Level, l.Rule, every,
			l.Queued, l.Remaining, l.Processed, x, l.Changes, u.Seconds, u.WaitSeconds,
			orDash(u.WaitPercent, u.WaitPercent >= 0), orDash(u.WaitLimit, u.WaitLimit > 0), waitQuantiles(u.Waits))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "Q, q, X: requests queued, remaining and the processing rate at the last load check (Table 3-12).")
	fmt.Fprintf(stdout, "WAIT%%: share of the group's processes' runnable time lately spent waiting for a CPU (- while they were runnable under %d%% of the time: idle); GUARD%%: cpu_wait_limit.\n", procmgr.CPUBusyFloor)
	fmt.Fprintln(stdout)
	fmt.Fprintln(tw, "GROUP\tTASKS\tLIMIT-HITS\tMEMORY-MIB\tOOM-KILLS\tOUTPUT-LINES\tDROPPED\tWORKING-DIRECTORY")
	for _, g := range st.Groups {
		l := g.Limits
		fmt.Fprintf(tw, "%s\t%d/%s\t%d\t%.1f/%s\t%d\t%d\t%d\t%s\n", g.Group, l.Pids, limitText(l.PidsMax, 1), l.PidsHits,
			float64(l.Memory)/(1<<20), limitText(l.MemoryMax, 1<<20), l.OOMKills, g.Output.Lines, g.Output.Dropped, g.WorkDir)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "TASKS, MEMORY: the server's cgroup now against uap_pids_max, uap_memory_max; LIMIT-HITS: forks refused at the limit; DROPPED: output lines over the rate.")
	if err := printReceivers(stdout, tw, st); err != nil {
		return err
	}
	if cl := st.Cluster; cl != nil {
		printCluster(stdout, tw, cl)
		return tw.Flush()
	}
	return nil
}

// groupState is a group's STATE column: held, or open; an application
// environment's says where its server here is (env:serving, env:dormant...).
func groupState(g scd.GroupStatus) string {
	switch {
	case g.Held:
		return "held"
	case g.Environment != "":
		return "env:" + g.Environment
	}
	return "open"
}

// limitText is a limit in unit, or "-" for none.
func limitText(v, unit int64) string {
	if v <= 0 {
		return "-"
	}
	return strconv.FormatInt(v/unit, 10)
}

// printReceivers shows each receiver group (scdmulti), how its new
// connections are placed, and each receiving socket's figures.
func printReceivers(stdout io.Writer, tw *tabwriter.Writer, st scd.Status) error {
	fmt.Fprintln(stdout)
	bound := map[string][]string{}
	for _, g := range st.Groups {
		bound[g.Receivers] = append(bound[g.Receivers], g.Group)
	}
	for _, s := range st.Steering {
		name, takes := s.Group, strings.Join(bound[s.Group], ",")
		if name == "" {
			name, takes = "default", "every group not bound elsewhere"
		}
		if s.Mechanism == rpcport.SteerNone {
			fmt.Fprintf(stdout, "receiver group %s on %s: %d receiver, which takes every new connection", name, s.Addr, s.Receivers)
		} else {
			fmt.Fprintf(stdout, "receiver group %s on %s: %d receivers, new connections placed by %s", name, s.Addr, s.Receivers, s.Mechanism)
		}
		if s.Reason != "" {
			fmt.Fprintf(stdout, " (%s)", s.Reason)
		}
		fmt.Fprintf(stdout, "; takes %s\n", orNone(takes))
	}
	fmt.Fprintln(tw, "RECEIVER-GROUP\tRECEIVER\tCONNECTIONS\tACCEPTED\tCALLS\tIN-FLIGHT")
	for _, r := range st.Receivers {
		name := r.Group
		if name == "" {
			name = "default"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\n", name, r.Index, r.Conns, r.Accepted, r.Calls, r.InFlight)
	}
	return tw.Flush()
}

func orNone(s string) string {
	if s == "" {
		return "no group"
	}
	return s
}

// printCluster shows every node this one knows, with its groups' levels
// and where this node's calls went.
func printCluster(stdout io.Writer, tw *tabwriter.Writer, cl *scd.ClusterStatus) {
	fmt.Fprintln(stdout)
	trust := "announces authenticated with cluster_key"
	if cl.Gossip.Trusted {
		trust = "no cluster_key: peers trusted blindly"
	}
	fmt.Fprintf(stdout, "cluster: %d members, rule %s, announce %s, this_node_first %s; %s\n",
		cl.Gossip.Members, cl.Rule, yn(cl.Announce), yn(cl.ThisNodeFirst), trust)
	fmt.Fprintf(stdout, "announces: %d sent, %d received, %d bytes gossiped, %s\n",
		cl.Gossip.Sent, cl.Gossip.Received, cl.Gossip.BytesSent, dropped(cl.Gossip.Dropped))
	fmt.Fprintln(tw, "NODE\tADDR\tGROUPS\tSENT-TO\tRECEIVED-FROM\tIN-FLIGHT")
	for _, ns := range cl.Nodes {
		var groups []string
		for _, g := range ns.Groups {
			s := g.Group + ":" + g.Level
			if g.Held {
				s += "(held)"
			}
			groups = append(groups, s)
		}
		name := ns.Node
		if ns.Local {
			name += " (this node)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\n", name, ns.Addr, strings.Join(groups, ","), ns.SentTo, ns.Received, ns.InFlight)
	}
}

// dropped says how many announces were dropped and why: "none dropped",
// or "3 dropped (full 1, unauthenticated 2)".
func dropped(by map[string]uint64) string {
	var total uint64
	var reasons []string
	for reason, n := range by {
		if n > 0 {
			total += n
			reasons = append(reasons, fmt.Sprintf("%s %d", reason, n))
		}
	}
	if total == 0 {
		return "none dropped"
	}
	sort.Strings(reasons)
	return fmt.Sprintf("%d dropped (%s)", total, strings.Join(reasons, ", "))
}

func yn(b bool) string {
	if b {
		return "Y"
	}
	return "N"
}

func orDash(v int, ok bool) string {
	if !ok {
		return "-"
	}
	return strconv.Itoa(v)
}

// waitQuantiles reads the median and 99th percentile run-queue wait off
// the log2 histogram, as "up to" bounds.
func waitQuantiles(h []scd.WaitBucket) string {
	var total uint64
	for _, b := range h {
		total += b.Count
	}
	if total == 0 {
		return "-"
	}
	bound := func(q float64) string {
		var seen uint64
		for _, b := range h {
			seen += b.Count
			if float64(seen) >= q*float64(total) {
				if b.UpToMicros == 0 {
					return "longer"
				}
				return "<" + (time.Duration(b.UpToMicros) * time.Microsecond).String()
			}
		}
		return "?"
	}
	return bound(0.5) + "/" + bound(0.99)
}
