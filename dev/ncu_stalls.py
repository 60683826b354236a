#!/usr/bin/env python3
"""dev/ncu_stalls.py SOURCE_CSV [TOP [MIN_REGION]]: the PC-sampled stall ledger of one kernel from
`ncu -i rep --page source --csv --print-source sass` (dev/ncu_call.sh): totals per stall reason,
the TOP instructions by samples with their main reasons and execution counts, and the regions:
runs of consecutive instructions with one execution count (a role's phase: in the KDA stream
kernel 8 x items for the sweep warps' per-item code, 8 x items x T for their per-token code,
4 x items for the precompute warps') with at least MIN_REGION samples (default 40), their main
reasons and opcodes."""
import csv
import sys

rows = list(csv.reader(open(sys.argv[1])))
top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
min_region = int(sys.argv[3]) if len(sys.argv) > 3 else 40
hdr = rows[1]
col = {h: i for i, h in enumerate(hdr)}
reasons = [h for h in hdr if h.startswith('stall_') and '(Not Issued)' not in h]
insts = []
for r in rows[2:]:
    if len(r) != len(hdr):
        continue
    def num(h):
        v = r[col[h]].replace(',', '')
        return int(v) if v not in ('', '-') else 0
    insts.append({
        'idx': len(insts), 'addr': r[col['Address']], 'sass': r[col['Source']].strip(),
        'samples': num('Warp Stall Sampling (All Samples)'),
        'exec': num('Instructions Executed'),
        'why': {h[6:]: num(h) for h in reasons},
    })
total = sum(i['samples'] for i in insts)
print(f'{len(insts)} instructions, {total} samples')
agg = {}
for i in insts:
    for k, v in i['why'].items():
        agg[k] = agg.get(k, 0) + v
for k, v in sorted(agg.items(), key=lambda kv: -kv[1]):
    if v:
        print(f'  {k:18} {v:8} {100 * v / total:5.1f}%')
print(f'\ntop {top} instructions (index, samples %, executions, main reasons):')
for i in sorted(insts, key=lambda i: -i['samples'])[:top]:
    why = sorted(i['why'].items(), key=lambda kv: -kv[1])[:3]
    ws = ' '.join(f'{k}:{v}' for k, v in why if v)
    print(f"  {i['idx']:5} {100 * i['samples'] / total:5.2f}% {i['exec']:9} {i['sass'][:60]:60} {ws}")

print(f'\nregions with >= {min_region} samples (first-last index, executions, samples, reasons, opcodes):')
start = 0
for i in range(1, len(insts) + 1):
    if i < len(insts) and insts[i]['exec'] == insts[start]['exec']:
        continue
    run = insts[start:i]
    samples = sum(x['samples'] for x in run)
    if samples >= min_region:
        why = {}
        ops = {}
        for x in run:
            for k, v in x['why'].items():
                why[k] = why.get(k, 0) + v
            words = x['sass'].split()
            op = (words[1] if words and words[0].startswith('@') and len(words) > 1 else
                  (words[0] if words else '?')).split('.')[0]
            ops[op] = ops.get(op, 0) + 1
        w = ' '.join(f'{k}:{v}' for k, v in sorted(why.items(), key=lambda kv: -kv[1])[:3] if v)
        o = ' '.join(f'{k}:{v}' for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:4])
        print(f"  {start:5}-{i - 1:5} {insts[start]['exec']:9} {samples:6} "
              f"{100 * samples / total:5.1f}%  {w}  | {o}")
    start = i
