#!/usr/bin/env bash
# Runs the README's worked example of a service policy (examples/policy:
# classes ONLINE and BATCH, application environment orders) on one node:
# scdctl find starts the environment's server, 44 orders calls and one
# 300 ms reports call run, and after the first policy interval (10 s)
# scdctl report shows goals against actuals. Stops the node again. Used by
# `make policy-demo`; needs the ports 12200-12202 on 127.0.0.1.
set -euo pipefail
bin=$(cd "${1:-bin}" && pwd)
defs=$(cd "$(dirname "$0")/../examples/policy" && pwd)
. "$(dirname "$0")/nodes.sh" # $dir, $pids, stopped on exit
ctl() { "$bin/scdctl" -c "$defs" "$@"; }
"$bin/scdd" -c "$defs" 2>"$dir/scdd.log" &
pids+=($!)
for _ in $(seq 100); do
	if ctl -t 1s status >/dev/null 2>&1; then break; fi
	if ! kill -0 "${pids[0]}" 2>/dev/null; then cat "$dir/scdd.log"; echo "policy-demo: scdd exited" >&2; exit 1; fi
	sleep 0.1
done
echo '$ scdctl -c examples/policy status   # orders is an application environment: no server yet'
ctl status | sed -n '1,/^REPLACED/p' | grep -E '^(GROUP|orders|reports|env:)'
echo
echo '$ scdctl -c examples/policy find orders   # starts its server where capacity is (here: this node)'
ctl find orders
echo
echo '# 44 orders calls (class ONLINE, goal: 90% within 200 ms): 40 of 20 ms, 2 of 250 ms, 2 of 600 ms;'
echo '# one reports call of 300 ms (class BATCH, goal: an average of 5 s)'
for _ in $(seq 40); do ctl call orders sleep 20 >/dev/null; done
for ms in 250 250 600 600; do ctl call orders sleep "$ms" >/dev/null; done
ctl call reports sleep 300 >/dev/null
echo '# ... waiting for the end of the first policy interval (10 s)'
for _ in $(seq 150); do
	if ctl report -json | grep -q '"calls":44,'; then break; fi
	sleep 0.1
done
echo
echo '$ scdctl -c examples/policy report'
ctl report
