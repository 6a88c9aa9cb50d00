#!/bin/bash
# S10 with Enduro/X alone and with the two local-call systems alone, alternating: bash /root/alone.sh NN...
OUT=/root/hold-results/alone; mkdir -p $OUT; BIN=/root/HOLD
for n in "$@"; do
  for sys in 'Enduro/X' 'tpsched local call,tpsched C local call'; do
    tag=$( [ "$sys" = 'Enduro/X' ] && echo ex || echo local )
    echo "$n $tag start $(date -u +%FT%TZ) loadavg $(cat /proc/loadavg)" >> $OUT/sessions.txt
    TPSCHED_ENDUROX=/root/endurox-install $BIN/tpbench -bin $BIN -quick -scenarios S10 -systems "$sys" -runs 5 -workers 5 -out $OUT/$n-$tag > $OUT/$n-$tag.log 2>&1
    echo "$n $tag exit $? end $(date -u +%FT%TZ)  cmd: TPSCHED_ENDUROX=/root/endurox-install $BIN/tpbench -bin $BIN -quick -scenarios S10 -systems '$sys' -runs 5 -workers 5 -out $OUT/$n-$tag" >> $OUT/sessions.txt
    sleep 10
  done
done
