#!/bin/bash
# local-callers.sh BIN [N] [RESIDENT]: one S10 local-call cell by hand. Starts
# scdd from BIN (scdd, uap-echo, uap-caller, localrun: make build, then
# cd bench && go build -o ../bin/ ./cmd/uap-caller ./cmd/localrun) with the
# bench group (2 uap-echo) and RESIDENT caller UAPs (default 8; S10 keeps
# 128), lets N of them (default 5) call bench/echo for 2 s, three times,
# and prints the calls/s of each run. N = 0: no call; it prints the CPU the
# idle callers and scdd use over two spans of 10 s, as S10's resident
# callers between its runs (scdd's from schedstat, all its threads).
# CALLER_DEF: more lines for the callers' definition, as printf %b reads
# them (CALLER_DEF='putenv GOMAXPROCS 1\n').
set -euo pipefail
[ $# -ge 1 ] || { sed -n 2,11p "$0" >&2; exit 2; }
BIN=$(readlink -f "$1") N=${2:-5} R=${3:-8} PORT=${PORT:-23211} W=${WORKERS:-2}
for f in scdd uap-echo uap-caller localrun; do
	[ -x "$BIN/$f" ] || { echo "local-callers: no $BIN/$f" >&2; exit 2; }
done
D=$(mktemp -d)
mkdir -p "$D/conf/usr"
trap 'kill $SCDD 2>/dev/null; wait $SCDD 2>/dev/null; rm -rf "$D"' EXIT
cat >"$D/conf/sysconf" <<EOT
set rpc_address = "127.0.0.1"
set rpc_port = $PORT
set metrics_address = "127.0.0.1:$((PORT + 1))"
set control_socket = "ctl.sock"
EOT
echo 'set scdmulti = 2' >"$D/conf/scdsvcdef"
printf 'set service_group = "bench"\nset service = "echo=echo"\nset module = "%s"\nset parallel_count = %d\nset queue_size = 1024\nset max_message_size = 1048576\n' "$BIN/uap-echo" "$W" >"$D/conf/usr/bench"
printf 'set service_group = "callers"\nset service = "run=run"\nset module = "%s"\nset parallel_count = %d\nset queue_size = %d\nset max_message_size = 1048576\n%b' "$BIN/uap-caller" "$R" "$((R > 1024 ? R : 1024))" "${CALLER_DEF:-}" >"$D/conf/usr/callers"
"$BIN/scdd" -c "$D/conf" -log-level warn >"$D/log" 2>&1 &
SCDD=$!
if [ "$N" -gt 0 ]; then
	sleep 3
	out=""
	for _ in 1 2 3; do out="$out $("$BIN/localrun" "127.0.0.1:$PORT" "$N")"; done
	echo "$N callers of $R resident, calls/s:$out"
	exit 0
fi
sleep 8 # the callers attach and settle
pids=$(pgrep -f "^$BIN/uap-caller" | tr '\n' ' ')
ticks() { # utime+stime of the pids given, in clock ticks
	local s=0 p
	for p in "$@"; do
		{ read -r -a f <"/proc/$p/stat"; } 2>/dev/null || continue
		s=$((s + f[13] + f[14]))
	done
	echo "$s"
}
runtime() { # on-CPU nanoseconds of every thread of pid $1 (schedstat: exact, where ticks sample)
	cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%.0f\n", s}'
}
hz=$(getconf CLK_TCK)
for _ in 1 2; do
	c0=$(ticks $pids) s0=$(runtime "$SCDD")
	sleep 10
	c1=$(ticks $pids) s1=$(runtime "$SCDD")
	echo "idle for 10 s: $(echo "$pids" | wc -w) caller UAPs $(echo "scale=3; ($c1 - $c0) / $hz / 10" | bc) cores, scdd $(echo "scale=4; ($s1 - $s0) / 10000000000" | bc) cores"
done
