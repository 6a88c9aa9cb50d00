#!/bin/bash
# run.sh [PAIRS] [SECS]: the kernel behaviour behind the node's cap on lanes
# (docs/ARCHITECTURE.md "Lanes"), with no tpsched in it. wakepairs.c's
# PAIRS pairs (default 5) pass a turn back and forth through a futex for
# SECS seconds (default 8), as lanes' callers and callees do, first in the
# cpu cgroup of this shell, then in a cpu cgroup of their own (made and
# removed here), while a process beside them sleeps 20 ms at a time. On
# 2026-12-06 (2 CPUs, Linux 6.18, cgroup v1 cpu controller) the sleeper's
# latest wake-up came a few ms late in the first run and seconds late in
# the second. Needs root, gcc, and the cpu controller (v1, or v2's).
set -euo pipefail
PAIRS=${1:-5} SECS=${2:-8}
D=$(mktemp -d)
trap 'rmdir "$CG" 2>/dev/null || true; rm -rf "$D"' EXIT
CG=""
gcc -O2 -Wall -o "$D/wakepairs" "$(dirname "$0")/wakepairs.c"
if [ -d /sys/fs/cgroup/cpu ] && [ -f /sys/fs/cgroup/cpu/cgroup.procs ]; then
	base=/sys/fs/cgroup/cpu$(awk -F: '$2 ~ /(^|,)cpu(,|$)/ {print $3}' /proc/self/cgroup)
elif grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
	base=/sys/fs/cgroup$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)
	grep -qw cpu "$base/cgroup.subtree_control" || { echo "run.sh: the cpu controller is not on in $base's cgroup.subtree_control" >&2; exit 2; }
else
	echo "run.sh: no cpu controller (cgroup v1 at /sys/fs/cgroup/cpu, or v2's)" >&2
	exit 2
fi
"$D/wakepairs" "$PAIRS" "$SECS" -
CG="${base%/}/wakepairs-$$"
mkdir "$CG"
"$D/wakepairs" "$PAIRS" "$SECS" "$CG/cgroup.procs"
