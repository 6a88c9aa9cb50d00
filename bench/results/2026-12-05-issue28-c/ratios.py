# python3 ratios.py DIR: the issue-28 ratios of each S10 session in DIR
# (NN-S10/*.json), for the Go local calls and the C ones, and their medians;
# with the direct path's against the gnet echo where the session has an S1
# report too (NN-S1/*.json).
import json, glob, statistics as st, sys, os

R = sys.argv[1] if len(sys.argv) > 1 else '.'
med = lambda runs, k: st.median([x[k] for x in runs])
GO, C, EX = 'tpsched local call', 'tpsched C local call', 'Enduro/X'

rows = []
for s10 in sorted(glob.glob(R + '/[0-9][0-9]-S10')):
    j = json.load(open(glob.glob(s10 + '/*.json')[0]))
    c = {(x['payload_bytes'], x['connections'], r['system']): r['runs'] for x in j['cells'] for r in x['results'] if r.get('runs')}
    f = lambda sys_, n, k='throughput_per_s': med(c[(128, n, sys_)], k)
    r = {'session': os.path.basename(s10)[:2]}
    for tag, s in (('go', GO), ('c', C)):
        r[tag + ' 1/EX'] = f(s, 1) / f(EX, 1)
        r[tag + ' 5/EX'] = f(s, 5) / f(EX, 5)
        r[tag + ' 64/5'] = f(s, 64) / f(s, 5)
        r[tag + ' 128/5'] = f(s, 128) / f(s, 5)
        r[tag + ' p99 64'] = f(s, 64, 'p99_us') / 1000
        r[tag + ' p99 128'] = f(s, 128, 'p99_us') / 1000
        r[tag + ' cpu1/EX'] = f(s, 1, 'cpu_us_per_call') / f(EX, 1, 'cpu_us_per_call')
        r[tag + ' cpu5/EX'] = f(s, 5, 'cpu_us_per_call') / f(EX, 5, 'cpu_us_per_call')
    r['abs'] = ', '.join(f"{n}: {f(GO, n)/1e3:.1f}k / {f(C, n)/1e3:.1f}k" for n in (1, 5, 64, 128)) + \
        f"; EX {f(EX, 1)/1e3:.1f}k, {f(EX, 5)/1e3:.1f}k"
    r['callers cpu'] = ', '.join(f"{f(GO, n, 'loadgen_cpu_us_per_call'):.0f}/{f(C, n, 'loadgen_cpu_us_per_call'):.0f}" for n in (1, 5, 64, 128))
    r['disturbed'] = f"{len(j['validity'].get('disturbed') or [])} of {j['validity']['runs']}"
    s1 = glob.glob(s10[:-3] + 'S1/*.json')
    if s1:
        j1 = json.load(open(s1[0]))
        c1 = {(x['payload_bytes'], x['connections'], r_['system']): r_['runs'] for x in j1['cells'] for r_ in x['results'] if r_.get('runs')}
        g = lambda sys_, n, k: med(c1[(128, n, sys_)], k)
        r['p50/echo'] = g('tpsched', 1, 'p50_us') / g('gnet-echo', 1, 'p50_us')
        r['64c/echo'] = g('tpsched', 64, 'throughput_per_s') / g('gnet-echo', 64, 'throughput_per_s')
        r['disturbed'] += f"; S1 {len(j1['validity'].get('disturbed') or [])} of {j1['validity']['runs']}"
    rows.append(r)

keys = [k for k in rows[0] if k not in ('session', 'abs', 'callers cpu', 'disturbed')]
keys += [k for r in rows for k in r if k not in keys and k not in ('session', 'abs', 'callers cpu', 'disturbed')]
fmt = lambda k, x: f"{x:.1f} ms" if 'p99' in k else f"{x:.2f}x"
print('| session | ' + ' | '.join(keys) + ' |')
print('|---|' + '---:|' * len(keys))
for r in rows:
    print('| ' + r['session'] + ' | ' + ' | '.join(fmt(k, r[k]) if k in r else '-' for k in keys) + ' |')
print()
print('| session | calls/s Go / C at 1, 5, 64, 128 callers; Enduro/X 1x1, 5x5 | callers\' CPU per call, Go/C us, at 1, 5, 64, 128 | kept runs disturbed |')
print('|---|---|---|---|')
for r in rows:
    print(f"| {r['session']} | {r['abs']} | {r['callers cpu']} | {r['disturbed']} |")
print()
print('| ratio | median | min .. max | sessions |')
print('|---|---:|---|---:|')
for k in keys:
    v = [r[k] for r in rows if k in r]
    print(f"| {k} | {fmt(k, st.median(v))} | {fmt(k, min(v))} .. {fmt(k, max(v))} | {len(v)} |")
