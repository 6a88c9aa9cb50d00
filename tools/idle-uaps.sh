#!/bin/bash
# idle-uaps.sh [N] [BIN]: the CPU that N idle caller UAPs (bench's
# uap-caller, a Go UAP) and scdd use while no call runs, as S10's resident
# callers do between its runs. Starts scdd from BIN (default bin/, as
# `make build` and `make bench` leave it) with 2 uap-echo and N uap-caller
# processes on 127.0.0.1:$PORT (default 23111), waits 8 s for them to
# settle, and reads their utime+stime from /proc over 10 s.
set -euo pipefail
N=${1:-128}
BIN=$(readlink -f "${2:-bin}")
PORT=${PORT:-23111}
for f in scdd uap-echo uap-caller; do
	[ -x "$BIN/$f" ] || { echo "idle-uaps: no $BIN/$f (make build; cd bench && go build -o ../bin/ ./cmd/uap-caller)" >&2; exit 2; }
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
printf 'set service_group = "bench"\nset service = "echo=echo"\nset module = "%s"\nset parallel_count = 2\n' "$BIN/uap-echo" >"$D/conf/usr/bench"
printf 'set service_group = "callers"\nset service = "run=run"\nset module = "%s"\nset parallel_count = %d\nset queue_size = %d\n' "$BIN/uap-caller" "$N" "$((N > 1024 ? N : 1024))" >"$D/conf/usr/callers"
"$BIN/scdd" -c "$D/conf" -log-level warn >"$D/log" 2>&1 &
SCDD=$!
sleep 8
pids=$(pgrep -f "^$BIN/uap-caller" | tr '\n' ' ')
ticks() { # utime+stime of the pids given, in clock ticks
	local s=0 p
	for p in "$@"; do
		{ read -r -a f <"/proc/$p/stat"; } 2>/dev/null || continue
		s=$((s + f[13] + f[14]))
	done
	echo "$s"
}
hz=$(getconf CLK_TCK)
c0=$(ticks $pids) s0=$(ticks "$SCDD")
sleep 10
c1=$(ticks $pids) s1=$(ticks "$SCDD")
echo "idle for 10 s: $(echo "$pids" | wc -w) caller UAPs $(echo "scale=3; ($c1 - $c0) / $hz / 10" | bc) cores, scdd $(echo "scale=3; ($s1 - $s0) / $hz / 10" | bc) cores"
