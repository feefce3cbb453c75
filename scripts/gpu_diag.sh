export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export COEXEC_KMEANS_DATA=$PWD/.bin/data
mkdir -p /tmp/tr
run() { # name args...
  n=$1; shift
  for k in 1 2 3; do
    /usr/bin/time -f "%e s wall" timeout 60 .bin/coexec run "$@" --policy hybrid --trace /tmp/tr/$n-$k.json --profile-dir /tmp/prof-$n >> $OUT/runs.txt 2>&1
    echo "$n try $k rc=$?" >> $OUT/runs.txt
  done
}
run nbody nbody --bodies 65536 --steps 4
run kmeans kmeans
run pathfinder pathfinder --cols 1000000 --rows 1000 --pyramid 20
run matmul matmul --count 60000
timeout 60 .bin/coexec run matmul --count 60000 --policy accel-only --trace /tmp/tr/matmul-acc.json --profile-dir /tmp/prof-matmul >> $OUT/runs.txt 2>&1
timeout 60 .bin/coexec run matmul --count 60000 --policy cpu-only --profile-dir /tmp/prof-matmul >> $OUT/runs.txt 2>&1
python3 - > $OUT/chunks.txt <<'PY'
import json,glob,collections
for f in sorted(glob.glob('/tmp/tr/*.json')):
    ev=json.load(open(f))['traceEvents']
    ch=[e for e in ev if e.get('ph')=='X']
    runs=collections.defaultdict(list)
    for e in ch: runs[e['args'].get('run')].append(e)
    print('==',f.split('/')[-1],len(ch),'events',len(runs),'runs')
    for r in sorted(runs)[:3]+sorted(runs)[-1:]:
        es=sorted(runs[r],key=lambda e:e['ts'])
        t0=min(e['ts'] for e in es)
        for e in es:
            a=e['args']
            if 'phase' not in a:
                print(' RUN',r,'dur %.3f ms'%(e['dur']/1e3),'imb %.3f'%a.get('imbalance',0),'split',[round(x,3) for x in a.get('split',[])]); continue
            if e['tid']>=15 or len(es)<60:
                print('  tid',e['tid'],'+%.3f ms'%((e['ts']-t0)/1e3),'dur %.3f'%(e['dur']/1e3),a['phase'],a['items'])
        cpu=[e for e in es if e['tid']<15 and 'phase' in e['args']]
        if cpu:
            print('  cpu chunks',len(cpu),'items',sum(e['args']['items'] for e in cpu),'first start +%.3f'%((min(e['ts'] for e in cpu)-t0)/1e3),'last end +%.3f'%((max(e['ts']+e['dur'] for e in cpu)-t0)/1e3), 'phases',collections.Counter(e['args']['phase'] for e in cpu))
PY
grep -E "run\(s\)|wall|rc=" $OUT/runs.txt
