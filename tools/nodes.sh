# Sourced by the scripts that start scdd nodes of their own (cluster.sh,
# screenshots.sh): a temporary directory for their definitions and logs
# ($dir), and the processes to stop when the script ends ($pids: each gets
# SIGTERM, so nodes drain, and is waited for).
dir=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$dir"
}
trap cleanup EXIT
