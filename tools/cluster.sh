#!/usr/bin/env bash
# Starts a three-node cluster on 127.0.0.2, .3 and .4 (one host, as three),
# each node running group "work" from uap-echo, makes node 3 slow and
# overloads it, then sends calls through node 2 and shows where they went.
# Stops the nodes again. Used by `make cluster-demo`; needs Linux loopback
# (every 127.x address is local) and the ports 12100-12102 on those.
set -euo pipefail
bin=$(cd "${1:-bin}" && pwd)
. "$(dirname "$0")/nodes.sh" # $dir, $pids, stopped on exit
for i in 2 3 4; do
	d="$dir/n$i"
	mkdir -p "$d/usr"
	cat >"$d/sysconf" <<CONF
set node_id = "n$i"
set rpc_address = "127.0.0.$i"
set rpc_port = 12100
set name_port = 12102
set metrics_address = "127.0.0.$i:12101"
set all_node = "127.0.0.2", "127.0.0.3", "127.0.0.4"
set cluster_key = "cluster-demo-key-0123456789"
CONF
	cat >"$d/usr/work" <<CONF
set service_group = "work"
set service = "echo=echo", "sleep=sleep", "pid=pid"
set module = "$bin/uap-echo"
set parallel_count = 1
set loadcheck_interval = 1
set levelup_queue_count = 2,4
set leveldown_queue_count = 0,1
set loadlevel_message = Y
CONF
	"$bin/scdd" -c "$d" -fast-failure-detection 2>"$dir/n$i.log" &
	pids+=($!)
done
ctl() { "$bin/scdctl" -a "127.0.0.$1:12101" -H "127.0.0.$1:12100" "${@:2}"; }
for i in 2 3 4; do
	for _ in $(seq 100); do
		if ctl "$i" status --json 2>/dev/null | grep -q '"node":"n4"'; then break; fi
		sleep 0.1
	done
done
echo '$ scdctl status   # on n2: three nodes, all LEVEL0'
ctl 2 status | sed -n '/^cluster/,$p'
echo
echo '# n4 gets 40 calls of 200 ms it must keep (balanced calls stay where they are sent)...'
for _ in $(seq 40); do ctl 4 -balanced -no-reply call work sleep 200; done
sleep 2.5
echo '$ scdctl status   # on n2: n4 is LEVEL2 now'
ctl 2 status | sed -n '/^NODE/,$p'
echo
echo '# 30 calls through n2: none goes to n4'
for _ in $(seq 30); do ctl 2 call work pid >/dev/null; done
ctl 2 status | sed -n '/^NODE/,$p'
grep -h "load level changed" "$dir"/n4.log | head -2
