#!/usr/bin/env python3
"""dev/ncu_stalls.py SOURCE_CSV [TOP]: the PC-sampled stall ledger of one kernel from
`ncu -i rep --page source --csv --print-source sass` (dev/ncu_call.sh): totals per stall reason,
then the TOP instructions by samples with their main reasons and execution counts, and the
samples per run of instructions between barriers/branches (a coarse map of the loop)."""
import csv
import sys

rows = list(csv.reader(open(sys.argv[1])))
top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
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
