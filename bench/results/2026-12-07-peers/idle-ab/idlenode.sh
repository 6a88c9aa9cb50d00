#!/bin/bash
# idlenode.sh BIN SECONDS: scdd with bench (5 uap-echo) and 128 resident uap-caller, idle, for SECONDS
BIN=$(readlink -f $1) T=$2 PORT=${PORT:-23411}
D=$(mktemp -d); mkdir -p $D/conf/usr
cat >$D/conf/sysconf <<EOT
set rpc_address = "127.0.0.1"
set rpc_port = $PORT
set metrics_address = "127.0.0.1:$((PORT + 1))"
set control_socket = "ctl.sock"
EOT
echo 'set scdmulti = 2' >$D/conf/scdsvcdef
printf 'set service_group = "bench"\nset service = "echo=echo"\nset module = "%s"\nset parallel_count = 5\nset queue_size = 1024\nset max_message_size = 1048576\n' "$BIN/uap-echo" >$D/conf/usr/bench
printf 'set service_group = "callers"\nset service = "run=run"\nset module = "%s"\nset parallel_count = 128\nset queue_size = 1024\nset max_message_size = 1048576\n' "$BIN/uap-caller" >$D/conf/usr/callers
$BIN/scdd -c $D/conf -log-level warn >$D/log 2>&1 &
S=$!
trap 'kill $S; wait $S; rm -rf $D' EXIT
sleep $T
