// Command scdctl drives a tpsched node: call a service, show the schedule
// queues and processes, hold and release service groups, take profiles. It
// finds the local node by default (127.0.0.1 on the default ports, the
// control socket where scdd puts it); -c DIR reads the addresses from that
// definition directory's sysconf, -H, -a and -s name them outright.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"tpsched/internal/version"
	"tpsched/netio"
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
                              change GROUP's parallel_count while it runs (until it stops or restarts):
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
                              (1..3600)

call and find use the node's RPC port, status and report its HTTP address (metrics_address);
prc, chprc, hold, release, restart, quiesce, resume, refresh, policy and pprof go over its
control socket, which admits only scdd's own user and root. Flags may come before or after the command; "--"
ends them (for DATA that starts with "-"). scdctl help COMMAND (or COMMAND -h) describes one command.

` + instancesNote + `
Flags:
`

// instancesNote is said of the commands that take an application
// environment, in the whole usage and in theirs.
const instancesNote = `With subsystem instances (svcpolicy instance -n NAME) ENV@NAME is one instance's servers;
find needs it, quiesce, resume, refresh and prc take ENV for every instance.
`

// instanceCommands are the commands instancesNote speaks of.
var instanceCommands = []string{"find", "quiesce", "resume", "refresh", "prc"}

// commands are scdctl's commands, in the order of usage, for the short
// usage and a misspelt command's did-you-mean.
var commands = []string{"call", "status", "prc", "chprc", "hold", "release", "restart",
	"find", "quiesce", "resume", "refresh", "policy", "report", "pprof"}

// shortUsage is what a usage error prints: a misspelt command or flag
// should not scroll its own message off the screen under 60 lines of
// help (issue 31 item 6); -h prints them all.
func shortUsage() string {
	return "usage: scdctl [flags] COMMAND [ARGS] [flags]\n" +
		"commands: " + strings.Join(commands, ", ") + "\n" +
		"scdctl -h describes every command and flag\n"
}

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
	fs.BoolVar(&co.direct, "direct", false, "call: a scheduler-direct request (dcscddirect = Y): the node weighs LEVEL0 against LEVEL1 nodes by schedule_rate; without it the call goes to the least-loaded node")
	fs.BoolVar(&co.loadBalance, "loadbalance", false, "call: ask the node which nodes run the group and send the call to a least loaded one (dccltloadbalance)")
	fs.StringVar(&co.node, "node", "", "call: send the call to this node only (a node id of the cluster, or host:port): an explicit destination, never balanced or transferred")
	printUsage := func(w io.Writer) {
		fmt.Fprint(w, usage)
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(stderr)
	}
	fs.Usage = func() { fmt.Fprint(stderr, shortUsage()) }
	words, err := parseInterspersed(fs, args)
	if err != nil {
		return 2
	}
	switch {
	case len(words) > 0 && words[0] == "help" && len(words) > 1:
		return commandHelp(fs, words[1], stdout, stderr)
	case *help && len(words) > 0 && words[0] != "help":
		return commandHelp(fs, words[0], stdout, stderr) // an unknown one is a usage error
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
	if !slices.Contains(commands, words[0]) {
		// Before resolve: a misspelt command needs no node to be told so.
		msg := fmt.Sprintf("scdctl: unknown command %q", words[0])
		if s := def.Suggest(words[0], commands); s != "" {
			msg += " (did you mean " + s + "?)"
		}
		fmt.Fprintln(stderr, msg)
		fs.Usage()
		return 2
	}
	if msg := badAddress(nd); msg != "" {
		fmt.Fprintln(stderr, "scdctl:", msg)
		fs.Usage()
		return 2
	}
	if msg := misplacedFlag(fs, words[0]); msg != "" {
		fmt.Fprintln(stderr, "scdctl:", msg)
		fs.Usage()
		return 2
	}
	if msg := repeatedFlag(fs, args); msg != "" {
		fmt.Fprintln(stderr, "scdctl:", msg)
		fs.Usage()
		return 2
	}
	if *timeout <= 0 {
		// A context that has already ended fails every command with
		// 'context deadline exceeded', which reads as a node that is down.
		fmt.Fprintf(stderr, "scdctl: -t %s: want a duration above 0 (30s, 2m)\n", *timeout)
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
		err = fmt.Errorf("command %s is listed but not handled (a bug in scdctl)", cmd) // commands and this switch disagree
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

// commandHelp prints cmd's part of the usage and the flags it takes
// (scdctl help CMD, scdctl CMD -h): the whole usage is 60 lines, most of
// them about other commands.
func commandHelp(fs *flag.FlagSet, cmd string, stdout, stderr io.Writer) int {
	if cmd == "help" {
		fmt.Fprint(stdout, "usage: scdctl help [COMMAND]\nDescribes COMMAND and the flags it takes (as scdctl COMMAND -h); without COMMAND, every command and flag (as scdctl -h).\n")
		return 0
	}
	text := commandUsage(cmd)
	if text == "" {
		msg := fmt.Sprintf("scdctl: help: unknown command %q", cmd)
		if s := def.Suggest(cmd, commands); s != "" {
			msg += " (did you mean " + s + "?)"
		}
		fmt.Fprintln(stderr, msg)
		fmt.Fprint(stderr, shortUsage())
		return 2
	}
	fmt.Fprint(stdout, text)
	if slices.Contains(instanceCommands, cmd) {
		fmt.Fprint(stdout, "\n"+instancesNote)
	}
	fmt.Fprintf(stdout, "\nFlags of %s:\n", cmd)
	door := "s" // the control socket
	switch cmd {
	case "call", "find":
		door = "H"
	case "status", "report":
		door = "a"
	}
	names := []string{"c", door, "t"}
	for name, cmds := range flagCommands {
		if slices.Contains(cmds, cmd) {
			names = append(names, name)
		}
	}
	slices.Sort(names[3:])
	for _, name := range names {
		f := fs.Lookup(name)
		kind, usage := flag.UnquoteUsage(f)
		if kind != "" {
			kind = " " + kind
		}
		if f.DefValue != "" && f.DefValue != "false" {
			usage += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(stdout, "  -%s%s\n    \t%s\n", name, kind, usage)
	}
	return 0
}

// commandUsage is cmd's entry in usage, its synopsis first ("usage:
// scdctl [flags] hold GROUP") and then what it does, or "" for no command.
func commandUsage(cmd string) string {
	list := usage[strings.Index(usage, "Commands:"):strings.Index(usage, "\ncall and find")]
	var b strings.Builder
	in := false
	for _, l := range strings.Split(list, "\n") {
		if len(l) > 2 && l[:2] == "  " && l[2] != ' ' { // a command's first line
			if in {
				break
			}
			synopsis, what, _ := strings.Cut(strings.TrimSpace(l), "  ")
			if in = strings.Fields(synopsis)[0] == cmd; in {
				fmt.Fprintf(&b, "usage: scdctl [flags] %s\n", synopsis)
				if what = strings.TrimSpace(what); what != "" {
					fmt.Fprintf(&b, "%s\n", what)
				}
			}
			continue
		}
		if l = strings.TrimSpace(l); in && l != "" {
			fmt.Fprintf(&b, "%s\n", l)
		}
	}
	return b.String()
}

// badAddress says why -H or -a (or the variable behind it) is no address
// of a node, or "". -a without a port went to port 80, and a URL there
// to a host named http.
func badAddress(nd node) string {
	for _, a := range []struct {
		flag, addr string
		port       int // 0: the port is required
	}{{"-H (or $TPSCHED_RPC)", nd.rpc, def.DefaultRPCPort}, {"-a (or $TPSCHED_HTTP)", nd.http, 0}} {
		if a.addr == "" {
			continue
		}
		if strings.Contains(a.addr, "://") {
			return fmt.Sprintf("%s %q: give host:port, not a URL", a.flag, a.addr)
		}
		if _, _, err := def.SplitHostPort(a.addr, a.port); err != nil {
			return fmt.Sprintf("%s %q: %v", a.flag, a.addr, err)
		}
	}
	return ""
}

// flagCommands are the flags that only some commands take, with those
// commands.
var flagCommands = map[string][]string{
	"json":        {"status", "prc", "chprc", "report", "quiesce", "resume", "refresh", "policy"},
	"no-reply":    {"call"},
	"balanced":    {"call"},
	"direct":      {"call"},
	"loadbalance": {"call"},
	"node":        {"call"},
}

// misplacedFlag says why a flag given does not go with cmd, or "": one
// that cmd would leave unused misleads (status -node n2 would show this
// node's status, hold -json print no JSON).
func misplacedFlag(fs *flag.FlagSet, cmd string) string {
	msg := ""
	fs.Visit(func(f *flag.Flag) {
		if cmds, ok := flagCommands[f.Name]; ok && msg == "" && !slices.Contains(cmds, cmd) && f.Value.String() != f.DefValue {
			msg = fmt.Sprintf("-%s is not for %s (only for %s)", f.Name, cmd, strings.Join(cmds, ", "))
		}
	})
	return msg
}

// repeatedFlag says which flag args give twice, or "": the flag package
// keeps the last, so scdctl -c a status -c b read b's sysconf with nothing
// said. args parsed already (parseInterspersed), so every flag is known.
func repeatedFlag(fs *flag.FlagSet, args []string) string {
	seen := map[string]bool{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		if len(a) < 2 || a[0] != '-' {
			continue
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		f := fs.Lookup(name)
		if f == nil {
			continue
		}
		if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); !hasValue && !(ok && bf.IsBoolFlag()) {
			i++ // its value, which may begin with "-"
		}
		if seen[f.Name] {
			return fmt.Sprintf("-%s given twice: give it once", f.Name)
		}
		seen[f.Name] = true
	}
	return ""
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

// Where to look when the node's RPC port or HTTP address does not answer:
// without -c scdctl reaches the embedded default's, which a node started
// on definitions of its own does not use, though the control actions find
// its socket.
const (
	rpcHint  = "-c DIR reads the node's address from its sysconf's rpc_address and rpc_port, -H names it"
	httpHint = "is scdd running? -c DIR reads the node's HTTP address from its sysconf's metrics_address, -a names it"
)

// callOptions are the flags that shape a call.
type callOptions struct {
	noReply, balanced, loadBalance, direct bool
	node                                   string // explicit destination: node id or host:port
}

func call(ctx context.Context, nd node, co callOptions, args []string, stdout io.Writer) error {
	if len(args) < 2 || len(args) > 3 {
		return usageError("call GROUP SERVICE [DATA]")
	}
	rpc := nd.rpc
	dest := ""
	if co.node != "" {
		if co.balanced || co.loadBalance || co.direct {
			return usageError("call -node NODE: an explicit destination is never balanced (no -balanced, -loadbalance, -direct)")
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
		Balanced: co.balanced, LoadBalance: co.loadBalance, SchedulerDirect: co.direct})
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
			return fmt.Errorf("%w (is scdd running at %s? %s)", err, rpc, rpcHint)
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
	body, err := httpDo(ctx, http.DefaultClient, http.MethodGet, "http://"+nd.http+"/status", nd.http,
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
