#!/bin/sh
# Runs procmgr's containment and priority tests on cgroup v2 with controllers
# (issue 29 item 4). A hybrid host's v2 hierarchy (/sys/fs/cgroup/unified)
# has none: cpu, pids and memory are bound to their v1 hierarchies. This
# script moves each of them whose v1 hierarchy holds no cgroup to the v2
# hierarchy (unmount the v1 hierarchy, which frees the controller, then
# enable it in the v2 root's cgroup.subtree_control), runs the tests, and
# moves them back (disable it in every v2 cgroup, deepest first, then mount
# the v1 hierarchy again), also when the tests fail or the script is
# interrupted. A v1 hierarchy with cgroups in it is not touched: they may be
# another program's (the development machine's memory hierarchy holds its
# sandbox's), and the kernel would keep the controller bound to it anyway.
#
# Needs root. Environment: CGROUP2 (the v2 mount, default
# /sys/fs/cgroup/unified, or /sys/fs/cgroup when that is cgroup2),
# CONTROLLERS (default "cpu pids memory"), REQUIRE (controllers that must
# move or the script fails; default "cpu pids"), TESTS (go test -run).
# Exit status: the tests', or 2 if the machine could not be set up or
# restored.
set -u

GO=${GO:-go}
CONTROLLERS=${CONTROLLERS:-cpu pids memory}
REQUIRE=${REQUIRE:-cpu pids}
TESTS=${TESTS:-Cgroup2|Weight|CPU|Contain|PureV2|LeftItsGroup|ForkBomb|ChildForked|Stale|Delegat|KillNever}
if [ -z "${CGROUP2:-}" ]; then
	if [ "$(stat -f -c %T /sys/fs/cgroup)" = cgroup2fs ]; then CGROUP2=/sys/fs/cgroup; else CGROUP2=/sys/fs/cgroup/unified; fi
fi

say() { echo "cgroup2-ci: $*" >&2; }

[ "$(id -u)" = 0 ] || { say "needs root"; exit 2; }
[ "$(stat -f -c %T "$CGROUP2" 2>/dev/null)" = cgroup2fs ] || { say "$CGROUP2 is not a cgroup2 mount"; exit 2; }

# v1mount CONTROLLER prints the mount point of the v1 hierarchy that has
# CONTROLLER bound, with its super options, as "point superopts".
v1mount() {
	awk -v c="$1" '{
		for (i = 7; i <= NF && $i != "-"; i++) ;
		if ($(i+1) != "cgroup") next
		n = split($(i+3), o, ",")
		for (j = 1; j <= n; j++) if (o[j] == c) { print $5, $(i+3); exit }
	}' /proc/self/mountinfo
}

has() { tr ' ' '\n' <"$1" | grep -qx "$2"; }

MOVED=""     # "controller:mountpoint:superopts" of each controller moved
RESTORED=0

restore() {
	[ "$RESTORED" = 1 ] && return
	RESTORED=1
	bad=0
	for m in $MOVED; do
		c=${m%%:*}; rest=${m#*:}; mp=${rest%%:*}; opts=${rest#*:}
		# Deepest first: a cgroup may drop a controller only when none of
		# its children has it enabled for theirs.
		find "$CGROUP2" -depth -name cgroup.subtree_control 2>/dev/null | while read -r f; do
			if has "$f" "$c"; then echo "-$c" >"$f" 2>/dev/null || say "cannot disable $c in $f"; fi
		done
		i=0
		until mount -t cgroup -o "$opts" cgroup "$mp" 2>/dev/null; do
			# The controller leaves v2 once its last css is gone (RCU).
			i=$((i + 1))
			if [ $i -ge 100 ]; then say "cannot mount the v1 $c hierarchy at $mp again"; bad=1; break; fi
			sleep 0.1
		done
		[ $i -lt 100 ] && say "$c back on cgroup v1 at $mp"
	done
	if [ $bad = 1 ]; then
		say "RESTORE FAILED: see above; /proc/self/mountinfo's cgroup lines:"
		grep cgroup /proc/self/mountinfo >&2
		exit 2
	fi
}
trap 'rm -rf "${BIN:-/nonexistent}"; restore' EXIT
trap 'restore; exit 130' INT TERM

# Built before the controllers move, so that they are away from v1 for the
# tests' run alone.
BIN=$(mktemp -d)
$GO test -c -race -o "$BIN/procmgr.test" ./procmgr/ || { rm -rf "$BIN"; say "cannot build the procmgr tests"; exit 2; }

for c in $CONTROLLERS; do
	line=$(v1mount "$c")
	if [ -z "$line" ]; then
		has "$CGROUP2/cgroup.controllers" "$c" && say "$c is on cgroup v2 already" || say "$c: no v1 hierarchy and not on v2"
		continue
	fi
	mp=${line%% *}; opts=${line#* }
	if [ "$(echo "$opts" | tr ',' '\n' | grep -cvx -e rw -e ro -e "$c")" != 0 ]; then
		say "$c: its v1 hierarchy at $mp binds more ($opts): left on v1"; continue
	fi
	# tpsched's own top level, left by daemons that stopped: rmdir refuses
	# it while it holds a daemon's cgroup.
	rmdir "$mp/tpsched" 2>/dev/null
	if [ -n "$(find "$mp" -mindepth 1 -type d -print -quit)" ]; then
		say "$c: its v1 hierarchy at $mp holds cgroups ($(find "$mp" -mindepth 1 -maxdepth 1 -type d -printf '%f ')): left on v1"; continue
	fi
	if ! umount "$mp"; then
		# Busy: a process has a file of it open. Go 1.25+ keeps its cgroup's
		# cpu.cfs_quota_us and cpu.cfs_period_us open for GOMAXPROCS
		# (GODEBUG=cgroupgomaxprocs=0 turns that off), so every Go program
		# that runs holds the v1 cpu hierarchy.
		holders=$(for p in /proc/[0-9]*; do
			ls -l "$p/fd" 2>/dev/null | grep -q " $mp/" && printf '%s(%s) ' "${p#/proc/}" "$(cat "$p/comm" 2>/dev/null)"
		done)
		say "$c: umount $mp failed (open in: ${holders:-processes this user cannot inspect}): left on v1"
		continue
	fi
	MOVED="$MOVED $c:$mp:$opts"
	i=0
	until has "$CGROUP2/cgroup.controllers" "$c"; do
		i=$((i + 1))
		if [ $i -ge 100 ]; then say "$c: not free for v2 10 s after umount (a cgroup was made meanwhile?)"; exit 2; fi
		sleep 0.1
	done
	echo "+$c" >"$CGROUP2/cgroup.subtree_control" || { say "$c: cannot enable it on v2"; exit 2; }
	say "$c moved to cgroup v2 at $CGROUP2"
done
for c in $REQUIRE; do
	grep -qw "$c" "$CGROUP2/cgroup.subtree_control" || { say "$c must be on cgroup v2 for this run and is not"; exit 2; }
done

say "controllers on $CGROUP2: $(cat "$CGROUP2/cgroup.subtree_control")"
start=$(date +%s)
(cd procmgr && TPSCHED_REQUIRE_BPF=1 timeout 600 "$BIN/procmgr.test" -test.count=1 -test.v -test.run "$TESTS") >"$BIN/out" 2>&1
rc=$?
restore
grep -E -- '^(--- |    --- |ok|FAIL|PASS)' "$BIN/out" >&2
grep -E -A2 -- '--- SKIP' "$BIN/out" >&2
[ $rc = 0 ] || cat "$BIN/out" >&2
say "tests: exit $rc, $(($(date +%s) - start)) s with the controllers on v2"
rm -rf "$BIN"
exit $rc
