# python3 ex55.py DIR...: each session's Enduro/X 1x1 and 5x5 runs (calls/s, and the servers'
# voluntary switches per call, about 2 when its servers sleep at every call), and the cells'
# spread as the report judged it
import json, glob, sys, os
for d in sys.argv[1:]:
    for s10 in sorted(glob.glob(d + '/[0-9][0-9]-S10')):
        j = json.load(open(glob.glob(s10 + '/*.json')[0]))
        out = []
        for x in j['cells']:
            if x['connections'] not in (1, 5):
                continue
            for r in x['results']:
                if r['system'] == 'Enduro/X' and r.get('runs'):
                    runs = ' '.join(f"{u['throughput_per_s']/1e3:.1f}k({u['server_voluntary_cs_per_call']:.1f})" for u in r['runs'])
                    out.append(f"{x['connections']}x{x['connections']}: {runs}")
        n5 = [n for n in j['validity']['noise'] if n['cell'].endswith(' x 5')][0]
        out.append(f"5x5 spread {100*n5['spread'].get('Enduro/X', 0):.0f}% (cell noise {100*n5['noise']:.0f}%)" +
                   (' unsteady' if 'Enduro/X' in (n5.get('unsteady') or []) else ''))
        print(f"{d} {os.path.basename(s10)[:2]}  " + '  |  '.join(out))
