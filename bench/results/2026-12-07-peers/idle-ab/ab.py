# python3 ab.py: Enduro/X's S10 cells alone and beside an idle tpsched node, rounds alternating
import json, glob, statistics as st
for conns in (1, 5):
    for mode in ('alone', 'idle'):
        runs = []
        for d in sorted(glob.glob(f'[0-9]-{mode}')):
            j = json.load(open(glob.glob(d + '/*.json')[0]))
            for x in j['cells']:
                if x['connections'] == conns:
                    for r in x['results']:
                        runs += r.get('runs') or []
        tp = sorted(u['throughput_per_s'] for u in runs)
        slow = sum(1 for u in runs if u['server_voluntary_cs_per_call'] > 1.5)
        print(f"{conns}x{conns} {mode:5}: median {st.median(tp)/1e3:.1f}k calls/s over {len(tp)} runs "
              f"({tp[0]/1e3:.1f}k .. {tp[-1]/1e3:.1f}k); runs with the servers sleeping at every call "
              f"(over 1.5 voluntary switches a call): {slow}")
