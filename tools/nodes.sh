# Sourced by the scripts that start scdd nodes of their own (cluster.sh,
# screenshots.sh): a temporary directory for their definitions and logs
# ($dir), and the processes to stop when the script ends ($pids: each gets
# SIGTERM, so nodes drain, and is waited for). KEEP_DIR=1 keeps $dir, the
# nodes' definitions and logs, for a look afterwards.
dir=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	[ -n "${KEEP_DIR:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT
# A signal ends the script through its EXIT trap, so the nodes (and what a
# script started beside them) are stopped then too: a test that gives up
# on the script sends it SIGTERM.
trap 'exit 143' TERM
trap 'exit 130' INT
