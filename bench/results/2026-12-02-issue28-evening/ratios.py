import json,glob,statistics as st,sys,os
R=sys.argv[1]
def med(runs,k): return st.median([x[k] for x in runs])
def cells(path):
    j=json.load(open(glob.glob(path+'/*.json')[0]))
    out={}
    for c in j['cells']:
        for r in c['results']:
            out[(c['payload_bytes'],c['connections'],r['system'])]=r['runs']
    return j,out
rows=[]
for s10 in sorted(glob.glob(R+'/[0-9][0-9]-S10')):
    nn=os.path.basename(s10)[:2]
    j,c=cells(s10)
    L=lambda n,k='throughput_per_s': med(c[(128,n,'tpsched local call')],k)
    E=lambda n,k='throughput_per_s': med(c[(128,n,'Enduro/X')],k)
    r={'session':nn}
    r['1/EX']=L(1)/E(1); r['5/EX']=L(5)/E(5); r['64/5']=L(64)/L(5); r['128/5']=L(128)/L(5)
    r['p99_64']=L(64,'p99_us')/1000; r['p99_128']=L(128,'p99_us')/1000
    r['cpu1']=L(1,'cpu_us_per_call')/E(1,'cpu_us_per_call'); r['cpu5']=L(5,'cpu_us_per_call')/E(5,'cpu_us_per_call')
    r['abs']=f"{L(1)/1e3:.1f}k/{E(1)/1e3:.1f}k, {L(5)/1e3:.1f}k/{E(5)/1e3:.1f}k, 64: {L(64)/1e3:.1f}k, 128: {L(128)/1e3:.1f}k"
    r['s10dist']=f"{len(j['validity'].get('disturbed') or [])} of {j['validity']['runs']}"
    s1=s10[:-3]+'S1'
    if glob.glob(s1+'/*.json'):
        j1,c1=cells(s1)
        t=lambda n,k: med(c1[(128,n,'tpsched')],k); g=lambda n,k: med(c1[(128,n,'gnet-echo')],k)
        r['p50/echo']=t(1,'p50_us')/g(1,'p50_us'); r['64c/echo']=t(64,'throughput_per_s')/g(64,'throughput_per_s')
        r['s1dist']=f"{len(j1['validity'].get('disturbed') or [])} of {j1['validity']['runs']}"
    rows.append(r)
keys=['1/EX','5/EX','64/5','p99_64','128/5','p99_128','cpu1','cpu5','p50/echo','64c/echo']
print('| session | '+' | '.join(keys)+' | S10 figures (local / EX 1x1, 5 / 5x5, 64, 128) | S10 kept disturbed | S1 kept disturbed |')
print('|---|'+'---:|'*len(keys)+'---|---|---|')
for r in rows:
    print('| '+r['session']+' | '+' | '.join((f"{r[k]:.1f} ms" if k.startswith('p99') else f"{r[k]:.2f}x") if k in r else '-' for k in keys)+f" | {r['abs']} | {r['s10dist']} | {r.get('s1dist','-')} |")
print()
print('| ratio | median | min .. max | sessions |')
print('|---|---:|---|---:|')
for k in keys:
    v=[r[k] for r in rows if k in r]
    if not v: continue
    f=(lambda x: f"{x:.1f} ms") if k.startswith('p99') else (lambda x: f"{x:.2f}x")
    print(f"| {k} | {f(st.median(v))} | {f(min(v))} .. {f(max(v))} | {len(v)} |")
