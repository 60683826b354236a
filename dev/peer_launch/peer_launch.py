#!/usr/bin/env python3
"""dev/peer_launch: how PyTorch SDPA's cuDNN (and FA2) backend launches its decode kernels.

For each shape 'B,Hq,Hkv,k_len,D' (bf16, q_len 1, K/V [B, Hkv, k_len, D] contiguous, as
bench/peers/attention_peers.py lays them out), runs the call a few times under torch.profiler
and prints every CUDA kernel of the last call with Kineto's launch record: grid, block, registers
per thread, dynamic + static shared memory, blocks per SM, and its duration. Then (--loop N) it
runs the call N more times with nothing else, for ncu to pick one launch.
"""
import argparse
import json
import os
import tempfile

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="32,64,8,65536,128")
    ap.add_argument("--backends", default="cudnn,flash")
    ap.add_argument("--loop", type=int, default=0)
    args = ap.parse_args()
    names = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    for shape in args.shapes.split(";"):
        b, hq, hkv, k_len, d = map(int, shape.split(","))
        q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, hkv, k_len, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, hkv, k_len, d, device="cuda", dtype=torch.bfloat16)
        for name in args.backends.split(","):
            def call():
                with sdpa_kernel([names[name]]):
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                call()
                torch.cuda.synchronize()
            path = os.path.join(tempfile.mkdtemp(), "trace.json")
            prof.export_chrome_trace(path)
            events = json.load(open(path))["traceEvents"]
            print(f"== {name} B={b} Hq={hq} Hkv={hkv} k_len={k_len} D={d}")
            for e in events:
                if e.get("cat") != "kernel":
                    continue
                a = e.get("args", {})
                print(f"  {e['dur']:9.1f} us grid={a.get('grid')} block={a.get('block')} "
                      f"regs={a.get('registers per thread')} smem={a.get('shared memory')} "
                      f"blocks/SM={a.get('blocks per SM')} occ={a.get('est. achieved occupancy %')} "
                      f"{e['name'][:110]}")
            for _ in range(args.loop):
                call()
            torch.cuda.synchronize()


if __name__ == "__main__":
    main()
