// Command scdctl drives a tpsched node: call a service, show the schedule
// queues and processes, hold and release service groups, take profiles. It
// finds the local node by default (127.0.0.1 on the default ports, the
// control socket where scdd puts it); -c DIR reads the addresses from that
// definition directory's sysconf, -H, -a and -s name them outright.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"tpsched/internal/version"
	"tpsched/netio"
	"tpsched/netio/rpcport"
	"tpsched/procmgr"
	"tpsched/scd"
	"tpsched/scd/client"
	"tpsched/scd/def"
)

const usage = `usage: scdctl [flags] COMMAND [ARGS] [flags]

Commands:
  call GROUP SERVICE [DATA]   call a service and print its reply (DATA "-" reads stdin;
                              -node NODE: on that node only, never balanced or transferred)
  status [-json]              service groups, queue depths, processes and restarts
  prc [GROUP] [-json]         processes: pid, kind, state, calls held and served, CPU time, since
  chprc GROUP RESIDENT[,MAX] [-json]
                              change GROUP's parallel_count while it runs (until the node stops):
                              extra residents start, surplus ones stop after their current call;
                              within the definition's maximum and the node's max_processes
  hold GROUP                  refuse new calls to GROUP ('service closed'); queued calls finish
  release GROUP               let GROUP take calls again
  restart                     start a new scdd that takes the node's sockets over; this one
                              lets its callers go and drains (no call is dropped)
  find ENV                    where to send calls for application environment ENV (svcpolicy):
                              the nodes that serve it, those meeting their goals first; when none
                              does, one server starts on the node with the most spare CPU first
  quiesce ENV                 stop every server of ENV in the cluster after the calls they hold;
                              none starts again until resume
  resume ENV                  let ENV have servers again (from none)
  refresh ENV                 replace the processes of every server of ENV, one at a time
  policy                      make every node read svcpolicy again (an environment it drops
                              is quiesced)
  report [-json]              goals against actuals per service class (performance index,
                              response-time distribution, queue and service time, CPU per call);
                              servers and high-water mark per application environment
  pprof PROFILE [SECONDS]     write a profile of scdd to stdout: heap, goroutine, allocs,
                              block, mutex, threadcreate; profile (CPU) or trace for SECONDS

call and find use the node's RPC port, status and report its HTTP address (metrics_address);
prc, chprc, hold, release, restart, quiesce, resume, refresh, policy and pprof go over its
control socket, which admits only scdd's own user and root. Flags may come before or after the command; "--"
ends them (for DATA that starts with "-").

Flags:
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// node is where the node's three doors are.
type node struct {
	rpc  string // host:port of RPC calls
	http string // host:port of /status and /metrics
	sock string // path of the control socket
	// socks are where the control socket may be when -s did not say
	// (scd.ControlSocketCandidates), for the error when none is there.
	socks []string
	// sockErr is why the control socket could not be chosen (the sockets
	// of several other nodes were found): the error of a control command.
	sockErr error
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("scdctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("c", os.Getenv("DCCONFPATH"), "definition directory whose sysconf names the node's addresses (default $DCCONFPATH)")
	var nd node
	fs.StringVar(&nd.rpc, "H", os.Getenv("TPSCHED_RPC"), "RPC address host:port of the node (default $TPSCHED_RPC, else from sysconf, else 127.0.0.1:12000)")
	fs.StringVar(&nd.http, "a", os.Getenv("TPSCHED_HTTP"), "HTTP address host:port of the node's /status and /metrics (default $TPSCHED_HTTP, else sysconf's metrics_address, else "+def.DefaultMetricsAddress+")")
	fs.StringVar(&nd.sock, "s", os.Getenv("TPSCHED_CONTROL_SOCKET"), "control socket of the node, for prc, chprc, hold, release, restart, quiesce, resume, refresh, policy and pprof (default $TPSCHED_CONTROL_SOCKET, else sysconf's control_socket, else where scdd puts it for sysconf's node_id; without -c, the only node's socket found there)")
	timeout := fs.Duration("t", 30*time.Second, "how long a command waits")
	asJSON := fs.Bool("json", false, "status, prc, chprc, report, quiesce, resume, refresh, policy: print the node's answer as JSON")
	showVersion := fs.Bool("version", false, "print scdctl's version and exit")
	help := fs.Bool("h", false, "print this help and exit")
	fs.BoolVar(help, "help", false, "print this help and exit")
	var co callOptions
	fs.BoolVar(&co.noReply, "no-reply", false, "call: send the call without waiting for an answer (call-no-reply)")
	fs.BoolVar(&co.balanced, "balanced", false, "call: mark the call as already balanced: the node serves it unless the group is held there, or LEVEL2 while another node is lower")
	fs.BoolVar(&co.loadBalance, "loadbalance", false, "call: ask the node which nodes run the group and send the call to a least loaded one (dccltloadbalance)")
	fs.StringVar(&co.node, "node", "", "call: send the call to this node only (a node id of the cluster, or host:port): an explicit destination, never balanced or transferred")
	printUsage := func(w io.Writer) {
		fmt.Fprint(w, usage)
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(stderr)
	}
	fs.Usage = func() { printUsage(stderr) }
	words, err := parseInterspersed(fs, args)
	if err != nil {
		return 2
	}
	switch {
	case *help || (len(words) > 0 && words[0] == "help"):
		printUsage(stdout)
		return 0
	case *showVersion:
		fmt.Fprintln(stdout, version.Line("scdctl"))
		return 0
	case len(words) == 0:
		fs.Usage()
		return 2
	}
	if err := resolve(*dir, &nd); err != nil {
		fmt.Fprintln(stderr, "scdctl:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	cmd, rest := words[0], words[1:]
	switch cmd {
	case "call":
		err = call(ctx, nd, co, rest, stdout)
	case "status":
		err = status(ctx, nd.http, *asJSON, rest, stdout)
	case "hold", "release":
		err = hold(ctx, nd, cmd, rest, stdout)
	case "prc":
		err = prc(ctx, nd, *asJSON, rest, stdout)
	case "chprc":
		err = chprc(ctx, nd, *asJSON, rest, stdout)
	case "pprof":
		err = profile(nd, *timeout, rest, stdout)
	case "restart":
		err = restart(ctx, nd, rest, stdout)
	case "find":
		err = find(ctx, nd, rest, stdout)
	case "quiesce", "resume", "refresh", "policy":
		err = envAction(ctx, nd, *asJSON, cmd, rest, stdout)
	case "report":
		err = report(ctx, nd, *asJSON, rest, stdout)
	default:
		fmt.Fprintf(stderr, "scdctl: unknown command %q\n", cmd)
		fs.Usage()
		return 2
	}
	if err != nil {
		if errors.Is(err, usageError("")) {
			fmt.Fprintln(stderr, err)
			return 2
		}
		fmt.Fprintln(stderr, "scdctl:", err)
		return 1
	}
	return 0
}

// parseInterspersed parses flags wherever they stand among the words, as
// people type them (scdctl call -t 1s demo echo hi); "--" ends the flags.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var words []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(words, rest...), nil
		}
		if len(rest) == 0 {
			return words, nil
		}
		words = append(words, rest[0])
		args = rest[1:]
	}
}

type usageError string

func (e usageError) Error() string { return "usage: scdctl " + string(e) }

func (e usageError) Is(target error) bool { _, ok := target.(usageError); return ok }

// resolve fills the addresses the flags left empty: from the definition
// directory's sysconf when given (only sysconf: a command must reach the
// node while another file is being edited), else the embedded default's.
func resolve(dir string, nd *node) error {
	if nd.rpc != "" && nd.http != "" && nd.sock != "" {
		return nil
	}
	var cfg *def.Config
	var err error
	if dir != "" {
		cfg, err = def.LoadSysconf(dir)
	} else {
		cfg, err = def.LoadDefault()
	}
	if err != nil {
		return err
	}
	sys := cfg.System
	host := sys.RPCAddress
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	if nd.rpc == "" {
		nd.rpc = net.JoinHostPort(host, strconv.Itoa(sys.RPCPort))
	}
	if nd.http == "" {
		nd.http = sys.MetricsAddress
	}
	if nd.sock == "" {
		nd.socks = scd.ControlSocketCandidates(cfg)
		nd.sock, nd.sockErr = scd.FindControlSocket(cfg)
	}
	return nil
}

// callOptions are the flags that shape a call.
type callOptions struct {
	noReply, balanced, loadBalance bool
	node                           string // explicit destination: node id or host:port
}

func call(ctx context.Context, nd node, co callOptions, args []string, stdout io.Writer) error {
	if len(args) < 2 || len(args) > 3 {
		return usageError("call GROUP SERVICE [DATA]")
	}
	rpc := nd.rpc
	dest := ""
	if co.node != "" {
		if co.balanced || co.loadBalance {
			return usageError("call -node NODE: an explicit destination is never balanced (no -balanced, -loadbalance)")
		}
		var err error
		if dest, err = destination(ctx, nd, co.node); err != nil {
			return err
		}
		rpc = dest
	}
	var data []byte
	if len(args) == 3 {
		data = []byte(args[2])
		if args[2] == "-" {
			var err error
			if data, err = io.ReadAll(os.Stdin); err != nil {
				return err
			}
		}
	}
	c, err := client.New(client.Options{Hosts: []string{rpc}, MaxMessageSize: def.MaxMaxMessageSize,
		Balanced: co.balanced, LoadBalance: co.loadBalance})
	if err != nil {
		return err
	}
	defer c.Close()
	var reply []byte
	switch {
	case dest != "" && co.noReply:
		err = c.CallNoReplyTo(ctx, dest, args[0], args[1], data)
	case dest != "":
		reply, err = c.CallTo(ctx, dest, args[0], args[1], data)
	case co.noReply:
		err = c.CallNoReply(ctx, args[0], args[1], data)
	default:
		reply, err = c.Call(ctx, args[0], args[1], data)
	}
	if err != nil {
		var te *netio.Error
		if errors.As(err, &te) && te.Code == netio.CodeNetworkDown {
			return fmt.Errorf("%w (is scdd running at %s?)", err, rpc)
		}
		return err
	}
	stdout.Write(reply)
	if len(reply) > 0 && reply[len(reply)-1] != '\n' {
		io.WriteString(stdout, "\n")
	}
	return nil
}

// destination is the RPC address of -node: host:port or an IP address as
// given, else a node id the local node's cluster table (its /status) knows.
func destination(ctx context.Context, nd node, name string) (string, error) {
	if _, _, err := net.SplitHostPort(name); err == nil {
		return name, nil
	}
	if net.ParseIP(name) != nil {
		return name, nil
	}
	body, err := httpDo(ctx, http.DefaultClient, http.MethodGet, "http://"+nd.http+"/status",
		"-node "+name+" names a node id, looked up in the local node's status; give host:port to call an address")
	if err != nil {
		return "", err
	}
	var st scd.Status
	if err := json.Unmarshal(body, &st); err != nil {
		return "", fmt.Errorf("status from %s: %w", nd.http, err)
	}
	if st.Node == name {
		return st.RPC, nil
	}
	var known []string
	if st.Cluster != nil {
		for _, ns := range st.Cluster.Nodes {
			if ns.Node == name {
				return ns.Addr, nil
			}
			known = append(known, ns.Node)
		}
	}
	if len(known) == 0 {
		known = []string{st.Node}
	}
	return "", fmt.Errorf("-node %s: node %s knows no node of that id (it knows %s); give host:port to call an address",
		name, st.Node, strings.Join(known, ", "))
}

func status(ctx context.Context, addr string, asJSON bool, args []string, stdout io.Writer) error {
	if len(args) > 0 {
		return usageError("status [-json]")
	}
	body, err := httpDo(ctx, http.DefaultClient, http.MethodGet, "http://"+addr+"/status",
		"is scdd running? -a or sysconf's metrics_address names its HTTP address")
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

// hold holds or releases a group over the control socket and says what
// happened.
func hold(ctx context.Context, nd node, verb string, args []string, stdout io.Writer) error {
	if len(args) != 1 {
		return usageError(verb + " GROUP")
	}
	body, err := httpDo(ctx, controlClient(nd), http.MethodPost, "http://scdd/"+verb+"?group="+url.QueryEscape(args[0]), "")
	if err != nil {
		return err
	}
	var res scd.HoldResult
	if err := json.Unmarshal(body, &res); err != nil {
		return fmt.Errorf("%s: answer from %s: %w", verb, nd.sock, err)
	}
	switch {
	case res.Held && res.Changed:
		fmt.Fprintf(stdout, "held service group %s: new calls get 'service closed'", res.Group)
		if res.InFlight > 0 {
			fmt.Fprintf(stdout, "; the %d call(s) queued or running still finish", res.InFlight)
		}
		fmt.Fprintln(stdout)
	case res.Held:
		fmt.Fprintf(stdout, "service group %s was already held; nothing changed\n", res.Group)
	case res.Changed:
		fmt.Fprintf(stdout, "released service group %s: it takes calls again\n", res.Group)
	default:
		fmt.Fprintf(stdout, "service group %s was not held; nothing changed\n", res.Group)
	}
	return nil
}

// prc lists the processes of one group or all (OpenTP1's prcls).
func prc(ctx context.Context, nd node, asJSON bool, args []string, stdout io.Writer) error {
	if len(args) > 1 {
		return usageError("prc [GROUP] [-json]")
	}
	u := "http://scdd/prc"
	if len(args) == 1 {
		u += "?group=" + url.QueryEscape(args[0])
	}
	body, err := httpDo(ctx, controlClient(nd), http.MethodGet, u, "")
	if err != nil {
		return err
	}
	if asJSON {
		_, err := stdout.Write(body)
		return err
	}
	var groups []scd.GroupProcesses
	if err := json.Unmarshal(body, &groups); err != nil {
		return fmt.Errorf("prc: answer from %s: %w", nd.sock, err)
	}
	printProcesses(stdout, groups, time.Now())
	return nil
}

// printProcesses shows each group's parallel_count and a line per process.
func printProcesses(stdout io.Writer, groups []scd.GroupProcesses, now time.Time) {
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tSLOT\tPID\tKIND\tSTATE\tCALLS\tSERVED\tCPU-S\tRESTARTS\tREPLACED\tSINCE")
	for _, g := range groups {
		for _, p := range g.Processes {
			pid, since := "-", "-"
			if p.PID != 0 {
				pid = strconv.Itoa(p.PID)
			}
			if !p.Started.IsZero() {
				since = p.Started.Local().Format("2006-01-02 15:04:05") + " (" + now.Sub(p.Started).Round(time.Second).String() + ")"
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%d\t%d\t%.3f\t%d\t%d\t%s\n", g.Group, p.Slot, pid, p.Kind, p.State,
				p.Calls, p.Served, p.CPUSeconds, p.Restarts, p.Replaced, since)
		}
	}
	tw.Flush()
	for _, g := range groups {
		def := ""
		if g.Count != g.Def {
			def = " (defined " + g.Def.String() + ", changed by chprc)"
		}
		fmt.Fprintf(stdout, "%s: server %s, parallel_count %s%s\n", g.Group, g.Server, g.Count, def)
	}
	fmt.Fprintln(stdout, "CALLS: calls a process holds now (its current one and those handed over ahead, up to 8); SERVED: calls it completed.")
}

// chprc changes a group's process counts while it runs (OpenTP1's scdchprc).
func chprc(ctx context.Context, nd node, asJSON bool, args []string, stdout io.Writer) error {
	const use = "chprc GROUP RESIDENT[,MAX] [-json]"
	if len(args) != 2 {
		return usageError(use)
	}
	resident, maxProcs, hasMax := args[1], "", false
	if r, m, ok := strings.Cut(args[1], ","); ok {
		resident, maxProcs, hasMax = strings.TrimSpace(r), strings.TrimSpace(m), true
	}
	if _, err := strconv.Atoi(resident); err != nil {
		return usageError(use + ": RESIDENT is a whole number")
	}
	q := url.Values{"group": {args[0]}, "resident": {resident}}
	if hasMax {
		if _, err := strconv.Atoi(maxProcs); err != nil {
			return usageError(use + ": MAX is a whole number")
		}
		q.Set("max", maxProcs)
	}
	body, err := httpDo(ctx, controlClient(nd), http.MethodPost, "http://scdd/chprc?"+q.Encode(), "")
	if err != nil {
		return err
	}
	if asJSON {
		_, err := stdout.Write(body)
		return err
	}
	var res scd.ChprcResult
	if err := json.Unmarshal(body, &res); err != nil {
		return fmt.Errorf("chprc: answer from %s: %w", nd.sock, err)
	}
	if res.Before == res.Count {
		fmt.Fprintf(stdout, "service group %s: parallel_count was %s already; nothing changed\n", res.Group, res.Count)
	} else {
		fmt.Fprintf(stdout, "service group %s: parallel_count %s -> %s (defined %s; until the node stops)", res.Group, res.Before, res.Count, res.Def)
		if res.Count.Resident > res.Before.Resident {
			fmt.Fprintf(stdout, "; %d more resident process(es) start", res.Count.Resident-res.Before.Resident)
		}
		if res.Count.Resident < res.Before.Resident {
			fmt.Fprintf(stdout, "; %d resident process(es) stop after their current call", res.Before.Resident-res.Count.Resident)
		}
		if res.Count.Max < res.Before.Max {
			fmt.Fprint(stdout, "; non-resident processes above the maximum stop after their current call")
		}
		fmt.Fprintln(stdout)
	}
	printProcesses(stdout, []scd.GroupProcesses{res.GroupProcesses}, time.Now())
	return nil
}

// restart asks the node to hand its sockets to a new scdd.
func restart(ctx context.Context, nd node, args []string, stdout io.Writer) error {
	if len(args) != 0 {
		return usageError("restart")
	}
	body, err := httpDo(ctx, controlClient(nd), http.MethodPost, "http://scdd/restart", "")
	if err != nil {
		return err
	}
	var res scd.RestartResult
	if err := json.Unmarshal(body, &res); err != nil {
		return fmt.Errorf("restart: answer from %s: %w", nd.sock, err)
	}
	fmt.Fprintf(stdout, "restarted: pid %d serves the node (it took %s); pid %d lets its %d connection(s) go and drains\n",
		res.NewPID, res.Took, res.OldPID, res.Conns)
	return nil
}

var profileName = regexp.MustCompile(`^[a-z_]+$`)

// profile writes one of scdd's Go profiles to stdout.
func profile(nd node, timeout time.Duration, args []string, stdout io.Writer) error {
	if len(args) < 1 || len(args) > 2 || !profileName.MatchString(args[0]) {
		return usageError("pprof PROFILE [SECONDS]")
	}
	u := "http://scdd/debug/pprof/" + args[0]
	if timed := args[0] == "profile" || args[0] == "trace"; timed {
		secs := 30
		if args[0] == "trace" {
			secs = 1
		}
		if len(args) == 2 {
			n, err := strconv.Atoi(args[1])
			if err != nil || n < 1 {
				return usageError("pprof " + args[0] + " [SECONDS]: SECONDS is a whole number >= 1")
			}
			secs = n
		}
		u += "?seconds=" + strconv.Itoa(secs)
		// The profile takes its seconds: wait for them and a little more.
		timeout = max(timeout, time.Duration(secs)*time.Second+10*time.Second)
	} else if len(args) == 2 {
		return usageError("pprof " + args[0] + ": SECONDS only for profile and trace")
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	body, err := httpDo(ctx, controlClient(nd), http.MethodGet, u, "")
	if err != nil {
		return err
	}
	_, err = stdout.Write(body)
	return err
}

// controlClient speaks HTTP over the node's control socket.
func controlClient(nd node) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if nd.sockErr != nil {
				return nil, nd.sockErr
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, "unix", nd.sock)
			if err == nil {
				return c, nil
			}
			switch {
			case errors.Is(err, syscall.ENOENT):
				where := ""
				if len(nd.socks) > 1 {
					where = " nor at " + strings.Join(nd.socks[1:], ", ")
				}
				return nil, fmt.Errorf("no control socket at %s%s (is scdd running? -s names the socket, -c DIR reads node_id and control_socket from its sysconf)", nd.sock, where)
			case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
				return nil, fmt.Errorf("control socket %s: %w (it admits only scdd's own user and root)", nd.sock, err)
			case errors.Is(err, syscall.ECONNREFUSED):
				return nil, fmt.Errorf("control socket %s: nobody listens (scdd stopped?)", nd.sock)
			}
			return nil, fmt.Errorf("control socket %s: %w", nd.sock, err)
		},
	}}
}

// httpDo runs one request; hint is added to an error in reaching the node.
func httpDo(ctx context.Context, hc *http.Client, method, u, hint string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the method and URL say nothing the message does not
		}
		if hint != "" {
			err = fmt.Errorf("%w (%s)", err, hint)
		}
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		return nil, errors.New(strings.TrimSpace(string(bytes.TrimSpace(body))))
	}
	return body, nil
}
