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
//     of Go HTTP worker processes, and tpsched itself (scdd + uap-echo,
//     resident or with non-resident processes), each
//     started on 127.0.0.1 in a temporary directory of its own;
//   - process accounting from /proc (CPU per call, peak RSS of a process
//     tree);
//   - the scenarios (S1 echo grid, S2 CPU-bound pool, S3 load step on pools
//     that grow, S4 open-loop overload, S5 tpsched's CPU guard on and off
//     under overload, S6 three tpsched nodes on 127.0.0.2-4 with one three
//     times slower under the random, OpenTP1 and P2C balancing rules, S7
//     32, 64 and 128 members of tpsched's name layer in one process, and
//     32 real scdd nodes on 127.0.0.10 and on: join time, announce
//     propagation and traffic, with bench/sim's routing rules over 1,000
//     simulated nodes beside them, S8 skewed connections on a node's
//     receiving sockets placed by the kernel's hash and by steering, S9 a
//     node restarted under load by hand-off and by stop and start, S10 a
//     UAP's local call to another UAP against the direct call),
//     run interleaved and summarised as medians, and the report: Markdown,
//     JSON and PNG plots in bench/results/;
//   - the report's check on itself: each run's window accounts for what
//     other tenants of the machine spent (a run waits for them to go quiet
//     and a disturbed run is run again), each cell states the run-to-run
//     noise and flags a system whose runs spread far more than their
//     neighbours', and the quick and full grids are compared cell by cell,
//     flagging a system that moved beyond the noise.
//
// # Usage
//
//	make bench-deps   # once, as root: nginx, php-fpm, haproxy from apt
//	make bench        # the full run (about 30 minutes)
//	make bench-quick  # the development run (about 6 minutes), into bench/results/quick/
//	bin/tpbench -scenarios S6,S7 -out /tmp/cluster   # one or more scenarios alone
//	bin/tpbench -quick -scenarios S1 -systems grpc-go,tpsched -quiet-cores 0   # two peers, other tenants not waited for
//
// The pure parts (percentiles, the open-loop schedule, /proc parsing, S3's
// windows and recovery time, S5's status summaries, S6's metrics parsing,
// level shares and verdict, S7's seeds, pooling and verdict, report formatting)
// are tested without starting any server. Figures are medians of
// interleaved runs; ratios are what to quote, since the load generator shares
// the cores with the servers.
package bench
