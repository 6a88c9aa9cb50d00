#!/usr/bin/env bash
# make chaos: the fault experiments on real processes and sockets, at full
# length (TPSCHED_CHAOS_FULL=1), with nothing else running beside them. Each
# is a TestChaos* test: it fails if a call is lost, duplicated, answered to
# the wrong caller or wrongly refused, or if the node dies or stops
# listening, and it logs a "chaos figures:" line. This prints one line per
# experiment (result and figures), the table of docs/RELIABILITY.md.
set -uo pipefail
cd "$(dirname "$0")/.."
go=${GO:-go}
export TPSCHED_CHAOS_FULL=${TPSCHED_CHAOS_FULL:-1}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
# -p 1: one package at a time, so the figures are the node's, not the
# machine's sharing.
"$go" test -count=1 -p 1 -v -timeout 30m -run '^TestChaos' ./itest/ ./scd/ ./scd/peers/ >"$log" 2>&1
status=$?
# Figures belong to the test that logged them: go test -v streams a test's
# log lines between its "=== RUN" (or "=== CONT") line and its result.
awk '
	/^=== (RUN|CONT) / { cur = $3; if (!(cur in seen)) { seen[cur] = 1; order[++n] = cur }; next }
	/^ *--- (PASS|FAIL|SKIP): / { r = $2; sub(/:$/, "", r); res[$3] = r; next }
	/chaos figures: / && cur != "" {
		line = $0; sub(/.*chaos figures: /, "", line)
		fig[cur] = nfig[cur]++ ? fig[cur] " / " line : line
	}
	END {
		printf "| experiment | result | figures |\n|---|---|---|\n"
		for (i = 1; i <= n; i++) {
			c = order[i]
			if (c in fig || res[c] == "FAIL") printf "| %s | %s | %s |\n", c, res[c], fig[c]
		}
	}
' "$log"
echo
grep -E '^(ok|FAIL|---)' "$log" | grep -vE '^ *--- (PASS|SKIP)' || true
echo "chaos: $(( $(date +%s) - start )) s"
if [ "$status" -ne 0 ]; then
	echo "chaos: FAILED; the whole log follows" >&2
	cat "$log" >&2
fi
exit "$status"
