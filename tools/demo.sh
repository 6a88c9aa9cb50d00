#!/usr/bin/env bash
# Starts scdd on the embedded default, calls demo/echo, shows the status and
# stops the node again (SIGTERM drains). Used by `make demo`.
set -euo pipefail
bin=${1:-bin}
log=$(mktemp)
"$bin/scdd" 2>"$log" &
pid=$!
stop() {
	if kill -TERM $pid 2>/dev/null; then
		echo "\$ kill -TERM $pid   # stop the node: it drains, then its UAPs stop"
		if wait $pid; then
			echo "demo: scdd stopped (pid $pid, drained)"
		else
			echo "demo: scdd stopped with status $? (pid $pid); its log:" >&2
			cat "$log" >&2
		fi
	fi
	rm -f "$log"
}
trap stop EXIT
for _ in $(seq 100); do
	if "$bin/scdctl" -t 1s status >/dev/null 2>&1; then break; fi
	if ! kill -0 $pid 2>/dev/null; then cat "$log"; echo "demo: scdd exited" >&2; exit 1; fi
	sleep 0.1
done
# scdd's start-up warnings are what a newcomer must see (not root, no
# eBPF, no cgroups), and its log is otherwise hidden (issue 31 item 4):
# each is one short line naming its section of docs/WARNINGS.md.
if grep -q 'level=WARN' "$log"; then
	echo "scdd warned at start (docs/WARNINGS.md explains each):"
	sed -n 's/^time=[^ ]* level=WARN msg="\(\([^"\\]\|\\.\)*\)"/  \1/p' "$log" | cut -c1-300
fi
echo '$ scdctl call demo echo hello'
"$bin/scdctl" call demo echo hello
echo '$ scdctl status'
"$bin/scdctl" status
