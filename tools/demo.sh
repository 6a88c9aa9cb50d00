#!/usr/bin/env bash
# Starts scdd on the embedded default, calls demo/echo, shows the status and
# stops the node again (SIGTERM drains). Used by `make demo`.
set -euo pipefail
bin=${1:-bin}
log=$(mktemp)
"$bin/scdd" 2>"$log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 100); do
	if "$bin/scdctl" -t 1s status >/dev/null 2>&1; then break; fi
	if ! kill -0 $pid 2>/dev/null; then cat "$log"; echo "demo: scdd exited" >&2; exit 1; fi
	sleep 0.1
done
echo '$ scdctl call demo echo hello'
"$bin/scdctl" call demo echo hello
echo '$ scdctl status'
"$bin/scdctl" status
