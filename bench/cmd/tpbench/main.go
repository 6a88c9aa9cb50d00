// Command tpbench runs the benchmark scenarios: tpsched beside a bare gnet
// echo server, gRPC-go, nginx + PHP-FPM and HAProxy + Go workers, each
// started on 127.0.0.1 in a temporary directory of its own, measured
// interleaved, and written to bench/results/<date>-<scenario>.md with the
// figures as JSON and the plots as PNG beside it. S6 runs three tpsched
// nodes on 127.0.0.2-4 (one of them three times slower) under each
// balancing rule; S7 runs 128 members of tpsched's name layer in this
// process and times how fast an announce reaches all of them. S8 puts
// skewed connections on a node's receiving sockets, placed by the kernel's
// hash and by steering; S9 restarts a node under load, by hand-off and by
// stopping and starting it. S10 sets local calls (caller UAPs on the node)
// beside Enduro/X's exbenchcl/exbenchsv, when TPSCHED_ENDUROX names an
// Enduro/X install. With -net lab (root), S6's nodes and S7's real scdd
// nodes run each in a network namespace of its own on a bridge instead of
// on loopback addresses, with -net-loss percent of the packets between
// two nodes dropped.
//
//	tpbench [-quick] [-scenarios S1,S2,S3,S4,S5,S6,S7,S8,S9,S10] [-out bench/results] [-bin bin] [-net loopback|lab [-net-loss 1]]
//
// It also serves the Go peers when run with -serve (gnet, grpc, http): the
// harness starts itself that way so each peer is a process of its own.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"tpsched/internal/version"

	"tpsched/bench"
)

func main() {
	serve := flag.String("serve", "", "internal: serve a Go peer (gnet, grpc or http) on -addr")
	addr := flag.String("addr", "", "internal: the address for -serve")
	loops := flag.Int("loops", 1, "internal: event loops of the gnet peer")
	binDir := flag.String("bin", "bin", "directory with scdd and uap-echo (make build) and uap-caller (make bench)")
	out := flag.String("out", "bench/results", "directory for the reports")
	quick := flag.Bool("quick", false, "the development grid (a plan of about 8 minutes of runs, printed at the start; S3 shorter and one run, S5 and S6 shorter, S7 smaller and once)")
	scen := flag.String("scenarios", "S1,S2,S3,S4,S5,S6,S7,S8,S9,S10", "scenarios to run")
	runs := flag.Int("runs", 3, "interleaved runs per cell (S3: per system, one in -quick; S5 and S6: per system, at least 5 but in -quick; S8 and S9: per system); figures are their medians (3 or more)")
	dur := flag.Duration("duration", 0, "measured time per run (default 2s, quick 0.75s; S4 twice that)")
	warm := flag.Duration("warmup", 0, "unmeasured time before each run (default 0.5s, quick 0.25s; S4 twice that)")
	workers := flag.Int("workers", 2, "worker processes per system")
	front := flag.Int("front", 2, "receiving threads/processes per system (scdmulti, nginx workers, HAProxy threads, gnet loops)")
	systems := flag.String("systems", "", "only these systems, by report name, comma-separated (default all)")
	s4queue := flag.Int("s4-queue", 32, "bounded queue in S4 (tpsched queue_size, PHP-FPM backlog, HAProxy maxqueue in total)")
	s5limit := flag.Int("s5-limit", bench.S5WaitLimit, "cpu_wait_limit of S5's guarded system (1..100; the other has 0, the guard off)")
	s5load := flag.Float64("s5-load", bench.S5Load, "S5's offered open-loop rate as a multiple of the measured capacity")
	s5queue := flag.Int("s5-queue", bench.S5Queue, "queue_size in S5 (a full queue answers 'server busy')")
	s5dur := flag.Duration("s5-duration", 0, "S5's measured time per run (default 4s, quick 2s)")
	s5warm := flag.Duration("s5-warmup", 0, "S5's warm-up per run, in which the group grows (default 1s, quick 0.5s)")
	s6load := flag.Float64("s6-load", bench.S6Load, "S6's offered open-loop rate as a share of the three nodes' nominal capacity")
	s6dur := flag.Duration("s6-duration", 0, "S6's measured time per run (default 10s, quick 4s)")
	s6warm := flag.Duration("s6-warmup", 0, "S6's warm-up per run (default 3s, quick 2s)")
	s6queue := flag.Int("s6-queue", bench.S6Queue, "queue_size on S6's nodes (a full queue answers 'server busy'; random's p99 is about this times the slow node's service time)")
	s7nodes := flag.String("s7-nodes", "", "S7's member counts, comma-separated, each 2..128 (default 32,64,128; quick 16,32,64)")
	s7runs := flag.Int("s7-runs", 0, "S7's runs of each member count (default 3, quick 1)")
	s7probes := flag.Int("s7-changes", 0, "S7's announced changes measured per run (default 30, quick 10)")
	s7quiet := flag.Duration("s7-quiet", 0, "S7's quiet spell for the refresh traffic (default 20s, one refresh period; quick 5s)")
	s7real := flag.Int("s7-real", 0, "S7's real scdd nodes on 127.0.0.10 and on, or in namespaces with -net lab (default 32, quick 8; -1: none)")
	s7sim := flag.String("s7-sim", "", "node counts of S7's simulation, comma-separated (default 128,1000, quick 1000; none: no simulation)")
	network := flag.String("net", bench.NetLoopback, "where S6's nodes and S7's real scdd nodes run: loopback (addresses of this host's lo) or lab "+
		"(root: each in a network namespace of its own with its own address on a bridge; the load generator and observers stay on the host)")
	netLoss := flag.Float64("net-loss", 0, "with -net lab: percent (0 to 100) of the packets on every link between two nodes dropped at random, each way")
	s8receivers := flag.Int("s8-receivers", bench.S8Receivers, "S8's receiving sockets (scdmulti); keep it at or below the cores")
	s8heavy := flag.Int("s8-heavy", bench.S8Heavy, "S8's heavy connections")
	quietCores := flag.Float64("quiet-cores", bench.DefaultQuiet.Cores, "before each run wait until other tenants use under this many cores; a run over it is disturbed and run again (0: off)")
	quietWait := flag.Duration("quiet-wait", bench.DefaultQuiet.MaxWait, "the longest wait for other tenants to go quiet before a run")
	quietRetries := flag.Int("quiet-retries", bench.DefaultQuiet.Retries, "how often a disturbed run is run again (S1, S2, S4)")
	quietBudget := flag.Duration("quiet-budget", bench.DefaultQuiet.Budget, "the most the session spends waiting for quiet and running disturbed runs again")
	peersRunning := flag.Bool("peers-running", false, "keep the systems not measured running during a run, as reports before 2026-12-07 did (by default they are stopped with SIGSTOP: idle, they still wake and disturb the one measured)")
	countSyscalls := flag.Bool("count-syscalls", true, "count every process's system calls in the kernel (an eBPF program, root) for the system calls per call of the grids' reports")
	enduroxServers := flag.Int("endurox-servers", 0, "S10: Enduro/X's exbenchsv processes in every cell (0: as many as the cell's callers, 1x1 and 5x5); Enduro/X runs when "+
		"TPSCHED_ENDUROX names its install prefix")
	compare := flag.String("compare", "", "the other grid's reports (a directory) or one report JSON, to flag systems that moved beyond the noise (default: the full grid's for -quick, out/quick for the full grid)")
	showVersion := flag.Bool("version", false, "print tpbench's version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Line("tpbench"))
		return
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *serve != "" {
		if err := servePeer(ctx, *serve, *addr, *loops); err != nil {
			fmt.Fprintf(os.Stderr, "tpbench -serve %s: %v\n", *serve, err)
			os.Exit(1)
		}
		return
	}
	if *runs < 3 {
		fmt.Fprintln(os.Stderr, "tpbench: -runs must be 3 or more (figures are medians of interleaved runs)")
		os.Exit(2)
	}
	if *dur == 0 {
		*dur = 2 * time.Second
		if *quick {
			*dur = 750 * time.Millisecond
		}
	}
	if *warm == 0 {
		*warm = 500 * time.Millisecond
		if *quick {
			*warm = 250 * time.Millisecond
		}
	}
	if *s5limit < 1 || *s5limit > 100 {
		fmt.Fprintln(os.Stderr, "tpbench: -s5-limit must be 1..100 (the system without the guard is always measured beside it)")
		os.Exit(2)
	}
	if *s5warm == 0 && *quick {
		*s5warm = 500 * time.Millisecond
	}
	if *s6load <= 0 {
		fmt.Fprintln(os.Stderr, "tpbench: -s6-load must be above 0")
		os.Exit(2)
	}
	if *s6queue < bench.S6LevelUp[1] {
		fmt.Fprintf(os.Stderr, "tpbench: -s6-queue must be at least %d (levelup_queue_count's LEVEL2 threshold)\n", bench.S6LevelUp[1])
		os.Exit(2)
	}
	s7sizes, err := parseInts(*s7nodes)
	if err != nil || slices.ContainsFunc(s7sizes, func(n int) bool { return n < 2 || n > bench.S7Nodes }) {
		fmt.Fprintf(os.Stderr, "tpbench: -s7-nodes must be numbers 2..%d (a cluster holds at most %d nodes)\n", bench.S7Nodes, bench.S7Nodes)
		os.Exit(2)
	}
	if *s7real > 0 && (*s7real < 2 || *s7real > 200) {
		fmt.Fprintln(os.Stderr, "tpbench: -s7-real must be 2..200 (addresses 127.0.0.10 and on) or -1")
		os.Exit(2)
	}
	var s7simNodes []int
	if *s7sim != "none" {
		if s7simNodes, err = parseInts(*s7sim); err != nil || slices.ContainsFunc(s7simNodes, func(n int) bool { return n < 1 || n > 4096 }) {
			fmt.Fprintln(os.Stderr, "tpbench: -s7-sim must be node counts 1..4096 or none")
			os.Exit(2)
		}
	}
	if *network != bench.NetLoopback && *network != bench.NetLab {
		fmt.Fprintf(os.Stderr, "tpbench: -net must be %s or %s\n", bench.NetLoopback, bench.NetLab)
		os.Exit(2)
	}
	if *netLoss < 0 || *netLoss > 100 || (*netLoss > 0 && *network != bench.NetLab) {
		fmt.Fprintln(os.Stderr, "tpbench: -net-loss must be 0 to 100, and is for -net lab only")
		os.Exit(2)
	}
	if *s8receivers < 2 || *s8heavy < 1 {
		fmt.Fprintln(os.Stderr, "tpbench: -s8-receivers must be 2 or more (steering places connections among sockets) and -s8-heavy 1 or more")
		os.Exit(2)
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "tpbench:", err)
		os.Exit(1)
	}
	bin, _ := filepath.Abs(*binDir)
	cfg := bench.Config{
		Env:           bench.Env{Bin: bin, Self: self},
		Out:           *out,
		Quick:         *quick,
		Scenarios:     strings.Split(strings.ToUpper(*scen), ","),
		Runs:          *runs,
		Warmup:        *warm,
		Duration:      *dur,
		Spec:          bench.Spec{Workers: *workers, Front: *front, Queue: 1024, EnduroXServers: *enduroxServers},
		S4Queue:       *s4queue,
		S5WaitLimit:   *s5limit,
		S5Load:        *s5load,
		S5Warmup:      *s5warm,
		S5Duration:    *s5dur,
		S5Queue:       *s5queue,
		S6Load:        *s6load,
		S6Warmup:      *s6warm,
		S6Duration:    *s6dur,
		S6Queue:       *s6queue,
		S7Sizes:       s7sizes,
		S7Runs:        *s7runs,
		S7Probes:      *s7probes,
		S7Quiet:       *s7quiet,
		S7Real:        *s7real,
		S7SimNodes:    s7simNodes,
		S7SimOff:      *s7sim == "none",
		Net:           *network,
		NetLoss:       *netLoss,
		S8Receivers:   *s8receivers,
		S8Heavy:       *s8heavy,
		Systems:       splitList(*systems),
		Compare:       *compare,
		Quiet:         bench.Quiet{Cores: *quietCores, MaxWait: *quietWait, Retries: *quietRetries, Budget: *quietBudget},
		PeersRunning:  *peersRunning,
		CountSyscalls: *countSyscalls,
		Log:           os.Stderr,
	}
	start := time.Now()
	if err := bench.Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "tpbench:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "tpbench: done in %v\n", time.Since(start).Round(time.Second))
}

// parseInts reads a comma-separated list of integers; "" is none.
func parseInts(s string) ([]int, error) {
	if s == "" {
		return nil, nil
	}
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

func servePeer(ctx context.Context, kind, addr string, loops int) error {
	switch kind {
	case "gnet":
		return bench.ServeEcho(ctx, addr, loops)
	case "grpc":
		return bench.ServeGRPC(ctx, addr)
	case "http":
		return bench.ServeHTTPWorker(ctx, addr)
	}
	return fmt.Errorf("unknown peer %q", kind)
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
