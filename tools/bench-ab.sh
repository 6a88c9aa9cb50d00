#!/usr/bin/env bash
# bench-ab.sh BEFORE AFTER ROUNDS OUT [tpbench flags...]: compare two builds
# of tpsched in one session. BEFORE and AFTER are git revisions; each is
# built into OUT/bin-before and OUT/bin-after, then tpbench -quick runs
# alternately from each ROUNDS times (before, after, before, ...), so both
# see the same hour of a shared machine, and tpcompare pools the reports
# into OUT/compare.md. Example, S1 and S10 with Enduro/X (README):
#
#   TPSCHED_ENDUROX=$HOME/endurox-install tools/bench-ab.sh main HEAD 4 /tmp/ab \
#       -scenarios S1,S10 -systems 'gnet-echo,tpsched,tpsched local call,tpsched nested call,Enduro/X'
set -euo pipefail
[ $# -ge 4 ] || { sed -n 2,11p "$0" >&2; exit 2; }
before=$1 after=$2 rounds=$3 out=$4
shift 4
top=$(git rev-parse --show-toplevel)
mkdir -p "$out"
out=$(cd "$out" && pwd)
for side in before after; do
	rev=${!side}
	src="$out/src-$side"
	rm -rf "$src"
	git -C "$top" worktree add --detach -f "$src" "$rev" >/dev/null
	if grep -q '^bench-bin:' "$src/Makefile"; then # with the C caller UAP
		make -s -C "$src" bench-bin BIN="$out/bin-$side" >/dev/null
	else
		make -s -C "$src" build BIN="$out/bin-$side" >/dev/null
		(cd "$src/bench" && go build -o "$out/bin-$side/" ./cmd/tpbench ./cmd/uap-caller)
	fi
	git -C "$top" worktree remove --force "$src"
	echo "$side: $rev ($(git -C "$top" rev-parse --short "$rev")) built"
done
for i in $(seq "$rounds"); do
	for side in before after; do
		"$out/bin-$side/tpbench" -quick -bin "$out/bin-$side" -out "$out/$side-$i" "$@" >"$out/$side-$i.log" 2>&1
		echo "$side $i of $rounds done"
	done
done
(cd "$top/bench" && go run ./cmd/tpcompare -before "$out/before-*" -after "$out/after-*") >"$out/compare.md"
echo "$out/compare.md"
