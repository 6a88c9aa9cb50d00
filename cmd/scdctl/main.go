// Command scdctl drives a tpsched node: call a service, show the schedule
// queues and processes, hold and release service groups. It finds the local
// node by default (127.0.0.1 on the default ports); -c DIR reads the ports
// from that definition directory's sysconf, -H and -a name them outright.
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
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"tpsched/netio"
	"tpsched/scd"
	"tpsched/scd/client"
	"tpsched/scd/def"
)

const usage = `usage: scdctl [flags] COMMAND [ARGS]

Commands:
  call GROUP SERVICE [DATA]   call a service and print its reply (DATA "-" reads stdin)
  status [--json]             service groups, queue depths and processes
  hold GROUP                  refuse new calls to GROUP ('service closed')
  release GROUP               let GROUP take calls again

Flags:
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("scdctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("c", os.Getenv("DCCONFPATH"), "definition directory whose sysconf names the node's ports")
	rpc := fs.String("H", os.Getenv("TPSCHED_RPC"), "RPC address host:port of the node (default from sysconf, else 127.0.0.1:12000)")
	ctl := fs.String("a", os.Getenv("TPSCHED_CONTROL"), "control address host:port of the node (default from sysconf, else "+def.DefaultMetricsAddress+")")
	timeout := fs.Duration("t", 30*time.Second, "how long a command waits")
	var co callOptions
	fs.BoolVar(&co.noReply, "no-reply", false, "call: send the call without waiting for an answer (call-no-reply)")
	fs.BoolVar(&co.balanced, "balanced", false, "call: mark the call as already balanced: the node serves it unless the group is held there, or LEVEL2 while another node is lower")
	fs.BoolVar(&co.loadBalance, "loadbalance", false, "call: ask the node which nodes run the group and send the call to a least loaded one (dccltloadbalance)")
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	if err := resolveAddrs(*dir, rpc, ctl); err != nil {
		fmt.Fprintln(stderr, "scdctl:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	var err error
	switch cmd {
	case "call":
		err = call(ctx, *rpc, co, rest, stdout)
	case "status":
		err = status(ctx, *ctl, rest, stdout)
	case "hold", "release":
		err = control(ctx, *ctl, cmd, rest)
	case "help", "-h", "--help":
		fs.Usage()
		return 0
	default:
		fmt.Fprintf(stderr, "scdctl: unknown command %q\n", cmd)
		fs.Usage()
		return 2
	}
	if err != nil {
		fmt.Fprintln(stderr, "scdctl:", err)
		var ue usageError
		if errors.As(err, &ue) {
			return 2
		}
		return 1
	}
	return 0
}

type usageError string

func (e usageError) Error() string { return string(e) }

// resolveAddrs fills the addresses the flags left empty: from the
// definition directory's sysconf when given, else the embedded defaults.
func resolveAddrs(dir string, rpc, ctl *string) error {
	if *rpc != "" && *ctl != "" {
		return nil
	}
	sys := def.System{RPCAddress: "127.0.0.1", RPCPort: def.DefaultRPCPort, MetricsAddress: def.DefaultMetricsAddress}
	if dir != "" {
		cfg, err := def.Load(dir)
		if err != nil {
			return err
		}
		sys = cfg.System
	}
	host := sys.RPCAddress
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	if *rpc == "" {
		*rpc = net.JoinHostPort(host, strconv.Itoa(sys.RPCPort))
	}
	if *ctl == "" {
		*ctl = sys.MetricsAddress
	}
	return nil
}

// callOptions are the flags that shape a call.
type callOptions struct{ noReply, balanced, loadBalance bool }

func call(ctx context.Context, rpc string, co callOptions, args []string, stdout io.Writer) error {
	if len(args) < 2 || len(args) > 3 {
		return usageError("call GROUP SERVICE [DATA]")
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
	if co.noReply {
		err = c.CallNoReply(ctx, args[0], args[1], data)
	} else {
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

func status(ctx context.Context, ctl string, args []string, stdout io.Writer) error {
	asJSON := len(args) == 1 && (args[0] == "--json" || args[0] == "-json")
	if len(args) > 1 || (len(args) == 1 && !asJSON) {
		return usageError("status [--json]")
	}
	body, err := httpDo(ctx, http.MethodGet, "http://"+ctl+"/status")
	if err != nil {
		return err
	}
	if asJSON {
		_, err := stdout.Write(body)
		return err
	}
	var st scd.Status
	if err := json.Unmarshal(body, &st); err != nil {
		return fmt.Errorf("status from %s: %w", ctl, err)
	}
	fmt.Fprintf(stdout, "node %s  rpc %s", st.Node, st.RPC)
	if st.Draining {
		fmt.Fprint(stdout, "  DRAINING")
	}
	fmt.Fprintln(stdout)
	fmt.Fprintf(stdout, "cpu priority: %s (%s)\n", st.CPU.Mechanism, st.CPU.Reason)
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
	fmt.Fprintln(tw, "GROUP\tSERVER\tSTATE\tPRIO\tLOAD\tQUEUE\tIN-FLIGHT\tQUEUED\tPROCESSED\tPROCESSES\tPIDS")
	for _, g := range st.Groups {
		state := "open"
		if g.Held {
			state = "held"
		}
		var pids []string
		nonres := 0
		for _, p := range g.Processes {
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d/%d\t%d\t%d\t%d\t%d+%d/%d\t%s\n", g.Group, g.Server, state, g.Priority,
			g.Load.Level, g.QueueDepth, g.QueueSize, g.InFlight, g.Queued, g.Processed,
			len(g.Processes)-nonres, nonres, g.Max, strings.Join(pids, ","))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "PROCESSES is resident+non-resident/most; * marks a non-resident process.")
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
	fmt.Fprintln(stdout, "WAIT%: share of the group's processes' runnable time lately spent waiting for a CPU; GUARD%: cpu_wait_limit.")
	if cl := st.Cluster; cl != nil {
		printCluster(stdout, tw, cl)
		return tw.Flush()
	}
	return nil
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
	fmt.Fprintf(stdout, "announces: %d sent, %d received, %d bytes gossiped, dropped %v\n",
		cl.Gossip.Sent, cl.Gossip.Received, cl.Gossip.BytesSent, cl.Gossip.Dropped)
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

func control(ctx context.Context, ctl, verb string, args []string) error {
	if len(args) != 1 {
		return usageError(verb + " GROUP")
	}
	_, err := httpDo(ctx, http.MethodPost, "http://"+ctl+"/"+verb+"?group="+url.QueryEscape(args[0]))
	return err
}

func httpDo(ctx context.Context, method, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w (is scdd running? its control address is metrics_address in sysconf)", err)
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
