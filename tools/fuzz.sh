#!/usr/bin/env bash
# Runs every fuzz target of the module, each for $FUZZTIME (default 30s).
# Targets are found, not listed: every `func FuzzX(f *testing.F)` in a
# _test.go file. Used by `make fuzz` and, briefly, by `make check`.
#
# A target fails when its run fails with a failing input written to its
# corpus (testdata/fuzz/<target>/), or with anything but Go 1.26's own
# end-of-time race: its fuzz coordinator can report its -fuzztime deadline
# as "context deadline exceeded" when a worker is mid-input as the time
# runs out on a busy machine (golang/go#75804, fixed in Go 1.27), with no
# input written. That one is counted and the target's corpus replayed, so
# an input that fails is still a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
go=${GO:-go}
fuzztime=${FUZZTIME:-30s}
pattern='^func (Fuzz[A-Za-z0-9_]*)\([A-Za-z_][A-Za-z0-9_]* \*testing\.F\)'
out=$(mktemp)
trap 'rm -f "$out"' EXIT
n=0 raced=0
while IFS= read -r file; do
	dir=$(dirname "$file")
	for target in $(sed -En "s/${pattern}.*/\\1/p" "$file"); do
		n=$((n + 1))
		echo "fuzz: $target in $dir for $fuzztime"
		corpus="$dir/testdata/fuzz/$target"
		before=$(ls "$corpus" 2>/dev/null || true)
		if "$go" test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$dir/" 2>&1 | tee "$out"; then
			continue
		fi
		after=$(ls "$corpus" 2>/dev/null || true)
		if [ "$before" != "$after" ] || grep -q 'Failing input written' "$out" ||
			! grep -qx '    context deadline exceeded' "$out"; then
			echo "fuzz: $target failed" >&2
			exit 1
		fi
		raced=$((raced + 1))
		echo "fuzz: $target: no failing input, only the coordinator's deadline (golang/go#75804); replaying its corpus"
		"$go" test -count=1 -run "^${target}\$" "$dir/"
	done
done < <(grep -rlE --include='*_test.go' --exclude-dir=.git --exclude-dir=testdata "$pattern" . | sort)
if [ "$n" -eq 0 ]; then
	echo "fuzz: no fuzz target found" >&2
	exit 1
fi
echo "fuzz: $n target(s), $fuzztime each: no failure ($raced ended by the coordinator's deadline race, corpus replayed)"
