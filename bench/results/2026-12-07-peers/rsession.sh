#!/bin/bash
# the same session with -peers-running (the systems not measured keep running, as before 325a418): bash /root/rsession.sh NN
set -u
NN=$1; BIN=${BIN:-/root/HOLD}; OUT=${OUT:-/root/hold-results/running}; RUNS=${RUNS:-5}
mkdir -p $OUT
S=$OUT/$NN-session.txt
echo "build: $(cat $BIN/BUILD) ($BIN), -peers-running" > $S
echo "S10 start: $(date -u +%FT%TZ)  loadavg: $(cat /proc/loadavg)" >> $S
CMD="TPSCHED_ENDUROX=/root/endurox-install $BIN/tpbench -bin $BIN -quick -peers-running -scenarios S10 -systems 'tpsched,tpsched local call,tpsched C local call,tpsched nested call,Enduro/X' -runs $RUNS -workers 5 -out $OUT/$NN-S10"
echo "cmd: $CMD" >> $S
eval "$CMD" > $OUT/$NN-S10.log 2>&1; st=$?
echo "S10 exit: $st  end: $(date -u +%FT%TZ)  loadavg: $(cat /proc/loadavg)" >> $S
echo "S1 start: $(date -u +%FT%TZ)" >> $S
CMD="$BIN/tpbench -bin $BIN -quick -peers-running -scenarios S1 -runs $RUNS -out $OUT/$NN-S1"
echo "cmd: $CMD" >> $S
eval "$CMD" > $OUT/$NN-S1.log 2>&1; st=$?
echo "S1 exit: $st  end: $(date -u +%FT%TZ)  loadavg: $(cat /proc/loadavg)" >> $S
