#!/usr/bin/env bash
# make test, make check, make test-short: go test over both modules (the
# node's and bench/), each run recorded with go test -json under
# .testtimes/ (gitignored) and summed up by tools/testtimes: the slowest
# tests, the failures. Both modules always run; the exit status is a
# failure if either failed, and the last lines say which.
#
#   test   the README's command, a few minutes: every package of both
#          modules under the race detector but itest; then itest's fast
#          subset, its scdd and UAPs built without -race. Tests marked
#          testenv.Slow skip (their skip line says so).
#   check  the full suite (CI): TPSCHED_TEST_FULL=1, everything under the
#          race detector, itest's scdd and UAPs built with -race too; itest
#          runs alone, after the other packages.
#   short  go test -short: no itest (it builds and starts scdd), and no
#          tests that start real daemons; no race detector.
set -uo pipefail
cd "$(dirname "$0")/.."
go=${GO:-go}
mode=${1:?usage: gotest.sh test|check|short}
timeout=${TEST_TIMEOUT:-30m}
out=.testtimes
mkdir -p "$out"
tt=$(mktemp -d)
trap 'rm -rf "$tt"' EXIT
"$go" build -o "$tt/testtimes" ./tools/testtimes || exit 1

declare -a results
failed=0
# run NAME DIR ARGS...: go test -json ARGS in DIR, recorded as NAME.
run() {
	local name=$1 dir=$2
	shift 2
	echo "== $name: (cd $dir && go test $*)"
	local start=$SECONDS
	(cd "$dir" && "$go" test -json "$@") | "$tt/testtimes" -o "$out/$mode-$name.json"
	local st=$?
	local took=$((SECONDS - start))
	if [ "$st" -eq 0 ]; then
		results+=("ok    $name (${took} s)")
	else
		results+=("FAIL  $name (${took} s)")
		failed=1
	fi
}

case $mode in
test)
	# Every package of the node's module but itest, under -race.
	mapfile -t units < <("$go" list ./... | grep -v '^tpsched/itest$')
	run units . -race -count=1 -timeout "$timeout" "${units[@]}"
	run itest . -count=1 -timeout "$timeout" ./itest/
	run bench bench -race -count=1 -timeout "$timeout" ./...
	;;
check)
	export TPSCHED_TEST_FULL=1
	mapfile -t units < <("$go" list ./... | grep -v '^tpsched/itest$')
	run units . -race -count=1 -timeout "$timeout" "${units[@]}"
	# itest alone, after the others: its experiments judge the node's
	# share of the machine (TestWLMWeightsForMissedGoal fails in CI when
	# other programs take the CPU), so no other package runs beside it.
	# Its bound is its own: the whole of it takes about 21 minutes here,
	# which left TEST_TIMEOUT's 30 only nine to spare on a slower day;
	# 40 still ends a hang well inside CI's 90.
	run itest . -race -count=1 -timeout "${ITEST_TIMEOUT:-40m}" ./itest/
	run bench bench -race -count=1 -timeout "$timeout" ./...
	;;
short)
	run root . -short -count=1 -timeout "$timeout" ./...
	run bench bench -short -count=1 -timeout "$timeout" ./...
	;;
*)
	echo "gotest.sh: unknown mode $mode (test, check, short)" >&2
	exit 2
	;;
esac
echo
echo "== make $mode: $SECONDS s; per-test times in $out/$mode-*.json (go run ./tools/testtimes $out/$mode-*.json)"
printf '%s\n' "${results[@]}"
exit "$failed"
