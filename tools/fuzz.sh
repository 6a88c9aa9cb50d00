#!/usr/bin/env bash
# Runs every fuzz target of the module, each for $FUZZTIME (default 30s).
# Targets are found, not listed: every `func FuzzX(f *testing.F)` in a
# _test.go file. Used by `make fuzz` and, briefly, by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
go=${GO:-go}
fuzztime=${FUZZTIME:-30s}
pattern='^func (Fuzz[A-Za-z0-9_]*)\([A-Za-z_][A-Za-z0-9_]* \*testing\.F\)'
n=0
while IFS= read -r file; do
	dir=$(dirname "$file")
	for target in $(sed -En "s/${pattern}.*/\\1/p" "$file"); do
		n=$((n + 1))
		echo "fuzz: $target in $dir for $fuzztime"
		"$go" test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$dir/"
	done
done < <(grep -rlE --include='*_test.go' --exclude-dir=.git --exclude-dir=testdata "$pattern" . | sort)
if [ "$n" -eq 0 ]; then
	echo "fuzz: no fuzz target found" >&2
	exit 1
fi
echo "fuzz: $n target(s), $fuzztime each: no failure"
