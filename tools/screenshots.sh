#!/usr/bin/env bash
# Makes the README's pictures from one real run: docs/img/dashboard.png (the
# Grafana dashboard's panels, drawn by tpdashboard from what a real
# Prometheus scraped) and docs/img/status-page.png (the status page in
# headless Chromium). Three nodes on 127.0.0.2-4 run the groups orders and
# reports (uap-echo); Debian's prometheus scrapes their /metrics every
# second; tpdashboard drives calls for DURATION (default 120s), takes the
# status page of n4 (the node it overloads) in the middle of the run and
# draws the panels;
# the second node holds orders for a tenth of the run. Used by
# `make screenshots`; needs prometheus and chromium (Debian packages).
set -euo pipefail
bin=$(cd "${1:-bin}" && pwd)
cd "$(dirname "$0")/.."
out=$PWD/docs/img
duration=${DURATION:-120}
for tool in prometheus chromium; do
	command -v "$tool" >/dev/null || { echo "screenshots: needs $tool (apt-get install prometheus chromium)"; exit 1; }
done
mkdir -p "$out"
. tools/nodes.sh # $dir, $pids, stopped on exit (the working directory is the repository now)
rpc=12300 name=12302 http=12301 prom=127.0.0.1:19090
targets=()
for i in 2 3 4; do
	d="$dir/n$i"
	mkdir -p "$d/usr"
	cat >"$d/sysconf" <<CONF
set node_id = "n$i"
set rpc_address = "127.0.0.$i"
set rpc_port = $rpc
set name_port = $name
set metrics_address = "127.0.0.$i:$http"
set all_node = "127.0.0.2", "127.0.0.3", "127.0.0.4"
set cluster_key = "screenshots-key-0123456789"
set control_socket = "ctl.sock"
CONF
	cat >"$d/usr/orders" <<CONF
set service_group = "orders"
set service = "echo=echo", "fail=fail"
set module = "$bin/uap-echo"
set parallel_count = 2,3
set queue_size = 64
set loadcheck_interval = 1
set levelup_queue_count = 8,16
set leveldown_queue_count = 0,4
CONF
	cat >"$d/usr/reports" <<CONF
set service_group = "reports"
set service = "cpu=cpu", "sleep=sleep", "crash=crash"
set module = "$bin/uap-echo"
set parallel_count = 1,3
set balance_count = 2
set queue_size = 24
set loadcheck_interval = 1
set levelup_queue_count = 4,8
set leveldown_queue_count = 0,2
CONF
	"$bin/scdd" -c "$d" -fast-failure-detection 2>"$dir/n$i.log" &
	pids+=($!)
	targets+=("\"127.0.0.$i:$http\"")
done
cat >"$dir/prometheus.yml" <<CONF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: tpsched
    static_configs:
      - targets: [$(IFS=,; echo "${targets[*]}")]
CONF
prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/tsdb" \
	--web.listen-address="$prom" --log.level=warn 2>"$dir/prometheus.log" &
pids+=($!)
for i in 2 3 4; do
	for _ in $(seq 100); do
		if curl -sf "http://127.0.0.$i:$http/status" | grep -q '"node":"n4"'; then break; fi
		sleep 0.1
	done
done
ctl() { "$bin/scdctl" -a "127.0.0.$1:$http" -H "127.0.0.$1:$rpc" -s "$dir/n$1/ctl.sock" "${@:2}"; }
(cd bench && go build -o "$dir/tpdashboard" ./cmd/tpdashboard)
# n3 holds orders from 30% to 40% of the run.
(
	sleep "$((duration * 30 / 100))"; ctl 3 hold orders
	sleep "$((duration * 10 / 100))"; ctl 3 release orders
) &
side=$!
"$dir/tpdashboard" -load "${duration}s" -prometheus "http://$prom" \
	-rpc "127.0.0.2:$rpc,127.0.0.3:$rpc,127.0.0.4:$rpc" -out "$out/dashboard.png" \
	-page "http://127.0.0.4:$http/" -page-at 0.42 -page-out "$out/status-page.png"
wait "$side"
echo "screenshots: $out/dashboard.png, $out/status-page.png"
