// Package bench measures tpsched beside the systems its users would pick
// instead, in the same run on the same machine, and writes the report.
//
// It owns:
//   - the load generator: one Caller per connection for each protocol the
//     peers speak (tpsched frames, gRPC unary over HTTP/2, HTTP/1.1
//     keep-alive), each written out by hand so that it costs about the same
//     CPU per call whatever the peer (grpc-go's own client cost as much as
//     the server it measured, on the same two cores), driven
//     closed loop (N connections, one call outstanding each) or open loop
//     (a fixed arrival rate, or a profile of rates; latency counted from the
//     intended send time, so a slow server cannot hide its queue by slowing
//     the generator down);
//   - the peers (System): a bare gnet echo server, a gRPC-go echo server,
//     nginx + PHP-FPM (pm=static, dynamic and ondemand), HAProxy leastconn in front
//     of Go HTTP worker processes, Enduro/X's exbenchcl/exbenchsv (an
//     install built by hand, named by TPSCHED_ENDUROX) and tpsched itself
//     (scdd + uap-echo, resident or with non-resident processes, and caller
//     UAPs, cmd/uap-caller, for local calls), each
//     started on 127.0.0.1 in a temporary directory of its own; a system
//     whose load comes from processes of its own (the caller UAPs,
//     exbenchcl) drives its runs itself;
//   - the accounting of each run's window: CPU from /proc (per call, peak
//     RSS of a process tree), context switches per thread from /proc and
//     system calls from an eBPF counter, for the server and the load
//     generator apart (the wake-ups per call of every grid report);
//   - the scenarios (S1 echo grid, S2 CPU-bound pool, S3 load step on pools
//     that grow, S4 open-loop overload, S5 tpsched's CPU guard on and off
//     under overload, S6 three tpsched nodes on 127.0.0.2-4 with one three
//     times slower under the random, OpenTP1 and P2C balancing rules, S7
//     32, 64 and 128 members of tpsched's name layer in one process, and
//     32 real scdd nodes on 127.0.0.10 and on: join time, announce
//     propagation and traffic, with bench/sim's routing rules over 1,000
//     simulated nodes beside them, S8 skewed connections on a node's
//     receiving sockets placed by the kernel's hash and by steering, S9 a
//     node restarted under load by hand-off and by stop and start, S10
//     local calls alone, caller UAPs against Enduro/X, beside the direct
//     call and a call whose service makes a local call), S6's nodes and
//     S7's real nodes on loopback or, with -net lab, each in a network
//     namespace of its own on a bridge (internal/netlab, net.go),
//     run interleaved and summarised as medians, and the report: Markdown,
//     JSON and PNG plots in bench/results/;
//   - the report's check on itself: a run has the machine to itself (the
//     systems not measured are stopped with SIGSTOP for its length,
//     pause.go), each run's window accounts for what
//     other tenants of the machine spent (a run waits for them to go quiet
//     and a disturbed run is run again), each cell states the run-to-run
//     noise and flags a system whose runs spread far more than their
//     neighbours', and the quick and full grids are compared cell by cell,
//     flagging a system that moved beyond the noise.
//
// # Usage
//
//	make bench-deps   # once, as root: nginx, php-fpm, haproxy from apt
//	make bench        # the full run (about 35 minutes)
//	make bench-quick  # the development run (a plan of about 8 minutes of runs), into bench/results/quick/
//	TPSCHED_ENDUROX=$PREFIX bin/tpbench -scenarios S10   # S10 with Enduro/X installed under $PREFIX
//	bin/tpbench -scenarios S6,S7 -out /tmp/cluster   # one or more scenarios alone
//	bin/tpbench -quick -scenarios S6,S7 -net lab -net-loss 1 -out /tmp/lab   # their nodes in namespaces, 1% loss between them (root)
//	bin/tpbench -quick -scenarios S1 -systems grpc-go,tpsched -quiet-cores 0   # two peers, other tenants not waited for
//
// The pure parts (percentiles, the open-loop schedule, /proc parsing, the
// window's attribution and per-call arithmetic, S10's summaries and
// exbenchcl's result, S3's
// windows and recovery time, S5's status summaries, S6's metrics parsing,
// level shares and verdict, S7's seeds, pooling and verdict, report formatting)
// are tested without starting any server. Figures are medians of
// interleaved runs; ratios are what to quote, since the load generator shares
// the cores with the servers.
package bench
