# ab.py DIR: per session, the Go local-call cells of the new build (NN-S10) beside the base build's (NN-S10-base)
import json, glob, statistics as st, sys, os
R = sys.argv[1] if len(sys.argv) > 1 else '.'
GO = 'tpsched local call'
def cells(d):
    j = json.load(open(glob.glob(d + '/*.json')[0]))
    c = {(x['payload_bytes'], x['connections'], r['system']): r['runs'] for x in j['cells'] for r in x['results'] if r.get('runs')}
    return lambda n, k='throughput_per_s': st.median([x[k] for x in c[(128, n, GO)]])
rows = []
print('| session | build | calls/s at 1, 5, 64, 128 | 64/5 | 128/5 | p99 64, 128 | callers CPU per call at 64, 128 | callers switches per call at 64, 128 |')
print('|---|---|---|---:|---:|---|---|---|')
for d in sorted(glob.glob(R + '/[0-9][0-9]-S10-base')):
    nn = os.path.basename(d)[:2]
    for tag, dd in (('base', d), ('new', d[:-5])):
        f = cells(dd)
        sw = lambda n: f(n, 'loadgen_voluntary_cs_per_call') + f(n, 'loadgen_involuntary_cs_per_call')
        r = (f(64) / f(5), f(128) / f(5))
        rows.append((tag, r))
        print(f"| {nn} | {tag} | {', '.join(f'{f(n)/1e3:.1f}k' for n in (1, 5, 64, 128))} | {r[0]:.2f}x | {r[1]:.2f}x | {f(64, 'p99_us')/1e3:.1f}, {f(128, 'p99_us')/1e3:.1f} ms | {f(64, 'loadgen_cpu_us_per_call'):.0f}, {f(128, 'loadgen_cpu_us_per_call'):.0f} us | {sw(64):.2f}, {sw(128):.2f} |")
print()
for tag in ('base', 'new'):
    v = [r for t, r in rows if t == tag]
    print(f"{tag}: 64/5 median {st.median(x[0] for x in v):.2f}x, 128/5 median {st.median(x[1] for x in v):.2f}x over {len(v)} sessions")
