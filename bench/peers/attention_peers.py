#!/usr/bin/env python3
"""Peers of splice's CUDA flash-decode kernel, timed exactly like bench/cuda/flash_decode_cuda_bench.

1. Grid (same as the splice benchmark): batch {1, 8, 32, 128} x k_len {1K, 4K, 16K, 64K} x
   (Hq, Hkv) {(32, 8), (32, 32), (64, 8)}, head_dim 128, bf16, q_len 1 (shapes whose K+V exceed
   --max-kv-gb are skipped), plus SmolLM2-135M's attention (B 1, Hq 9, Hkv 3, head_dim 64) at
   k_len 64, 256 and 1K (also in --quick).
2. Peers: PyTorch SDPA pinned to the cuDNN backend and to the flash (FA2) backend, with
   enable_gqa=True (no K/V expansion), and FlashInfer's BatchDecodeWithPagedKVCacheWrapper when
   `import flashinfer` works (not on the device image: carried as wheels in .whl/, its kernels
   JIT-compiled at the first plan of each kind): NHD pages of 16 keys (vLLM's FlashInfer layout),
   each sequence's pages contiguous, planned once per shape, CUDA-graph mode, tensor cores where
   the GQA group is >= 4 (vLLM's rule). Its output on set 0 (the SDPA set's K/V repacked) is
   compared with the first SDPA backend's.
3. Timing: `sets` rotating input sets (>= 512 MB touched per replay, at most 64 sets, and never
   less than 128 MB, over twice the L2: up to 4096 sets of the tiny shapes), one CUDA graph with
   one call per set, warm-up replays, then --reps replays timed with CUDA events; time per call =
   median replay / sets.
4. With --splice JSON (the splice benchmark's output from the same gpu-check run), prints the
   combined table last (shape, splice us, GB/s, % of the 4.4 TB/s floor, best peer us, ratio) and
   writes it as JSON.
"""
import argparse
import json
import math
import sys

FLOOR_BYTES_PER_S = 4.4e12
ROTATE_BYTES = 512 << 20
FLASHINFER_PAGE = 16
FLASHINFER_WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended split-KV workspace
FLASHINFER_MAX_REL_DIFF = 0.02  # of max |o|: bf16 outputs of two correct kernels agree far closer
MAX_SETS = 64
MIN_TOUCHED_BYTES = 128 << 20  # > 2x the L2
MAX_SMALL_SETS = 4096
WARMUP_REPLAYS = 3


def grid(max_kv_gb, quick):
    """(batch, hq, hkv, k_len, head_dim, kv bytes), smallest KV first as in the splice bench."""
    shapes = []
    for hq, hkv in ((32, 8), (32, 32), (64, 8)):
        for batch in (1, 8, 32, 128):
            for k_len in (1024, 4096, 16384, 65536):
                kv = 2 * batch * hkv * k_len * 128 * 2
                if quick and batch != 1 and kv < (1 << 30):
                    continue
                if kv <= max_kv_gb * 1e9:
                    shapes.append((batch, hq, hkv, k_len, 128, kv))
    for k_len in (64, 256, 1024):  # SmolLM2-135M's attention
        shapes.append((1, 9, 3, k_len, 64, 2 * 3 * k_len * 64 * 2))
    return sorted(shapes, key=lambda shape: shape[5])


def sets_for(kv):
    sets = max(1, min(MAX_SETS, math.ceil(ROTATE_BYTES / kv)))
    if sets * kv < MIN_TOUCHED_BYTES:
        sets = min(math.ceil(MIN_TOUCHED_BYTES / kv), MAX_SMALL_SETS)
    return sets


def time_graph(torch, fn, sets, reps):
    """Captures one call per set into a graph; returns (median us per call, spread us)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(sets):  # warm-up outside capture (plans, handles, workspaces)
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(sets):
            fn(i)
    for _ in range(WARMUP_REPLAYS):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / sets)
    times.sort()
    del graph
    return times[len(times) // 2], times[-1] - times[0]


def flashinfer_peer(torch, flashinfer, qs, ks, vs, sets, batch, hq, hkv, k_len, head_dim):
    """FlashInfer's paged decode over `sets` K/V sets: set 0 is the SDPA set repacked (for the
    agreement check), the others fresh random pages. Returns (call(i), outs)."""
    page = FLASHINFER_PAGE
    pages = k_len // page  # per sequence (every k_len here is a multiple of 16)
    dev = "cuda"

    def paged(x):  # [batch, hkv, k_len, D] -> [batch * pages, page, hkv, D] (NHD)
        return x.transpose(1, 2).reshape(batch * pages, page, hkv, head_dim).contiguous()

    shape = (batch * pages, page, hkv, head_dim)
    k_pages = [paged(ks[0])] + [torch.randn(shape, device=dev, dtype=torch.bfloat16)
                                for _ in range(sets - 1)]
    v_pages = [paged(vs[0])] + [torch.randn(shape, device=dev, dtype=torch.bfloat16)
                                for _ in range(sets - 1)]
    q = [x.reshape(batch, hq, head_dim) for x in qs]  # [batch, hq, 1, D] -> [batch, hq, D]
    indptr = torch.arange(batch + 1, dtype=torch.int32, device=dev) * pages
    indices = torch.arange(batch * pages, dtype=torch.int32, device=dev)
    last_page_len = torch.full((batch,), page, dtype=torch.int32, device=dev)
    workspace = torch.zeros(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        workspace, "NHD", use_cuda_graph=True, use_tensor_cores=hq // hkv >= 4,
        paged_kv_indptr_buffer=indptr, paged_kv_indices_buffer=indices,
        paged_kv_last_page_len_buffer=last_page_len)
    wrapper.plan(indptr.cpu(), indices.cpu(), last_page_len.cpu(), hq, hkv, head_dim, page,
                 q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    outs = [torch.empty(batch, hq, head_dim, device=dev, dtype=torch.bfloat16) for _ in range(sets)]

    def call(i):
        wrapper.run(q[i], (k_pages[i], v_pages[i]), out=outs[i])
    return call, outs


def run_peers(args):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        import flashinfer
        flashinfer_info = "%s (page %d, NHD, CUDA-graph mode, tensor cores at group >= 4)" % (
            flashinfer.__version__, FLASHINFER_PAGE)
    except Exception as error:  # absent on the device image unless its wheels are carried
        flashinfer = None
        flashinfer_info = "absent (%s)" % str(error).splitlines()[0][:120]
    info = {"torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "device": torch.cuda.get_device_name(),
            "flashinfer": flashinfer_info}
    print("peers:", json.dumps(info), flush=True)

    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    flashinfer_failed = {}  # (tensor cores, head_dim) -> the first error: one JIT attempt per kind
    rows = []
    shapes = grid(args.max_kv_gb, args.quick)
    if args.shapes:  # "B,Hq,Hkv,k_len,D;...": only these
        shapes = [tuple(int(x) for x in item.split(",")) for item in args.shapes.split(";") if item]
        shapes = [(b, hq, hkv, n, d, 2 * b * hkv * n * d * 2) for b, hq, hkv, n, d in shapes]
    for batch, hq, hkv, k_len, head_dim, kv in shapes:
        sets = max(sets_for(kv), args.min_sets)
        gen = torch.Generator(device="cuda").manual_seed(batch * 7 + k_len + hq)

        def sets_of(heads, length):  # one allocation, one contiguous view per set
            return torch.randn(sets, batch, heads, length, head_dim, device="cuda",
                               dtype=torch.bfloat16, generator=gen).unbind(0)
        qs = sets_of(hq, 1)
        ks = sets_of(hkv, k_len)
        vs = sets_of(hkv, k_len)
        outs = [None] * sets
        row = {"batch": batch, "num_qo_heads": hq, "num_kv_heads": hkv, "k_len": k_len,
               "head_dim": head_dim, "kv_bytes": kv, "sets": sets}
        reference = None
        for name, backend in backends.items():
            def call(i, backend=backend):
                with sdpa_kernel([backend]):
                    outs[i] = F.scaled_dot_product_attention(qs[i], ks[i], vs[i], is_causal=False,
                                                             enable_gqa=hkv != hq)
            try:
                us, spread = time_graph(torch, call, sets, args.reps)
                row[name + "_us"] = us
                row[name + "_spread_us"] = spread
                if reference is None:
                    reference = outs[0].float()
                else:  # peers must agree with each other
                    row[name + "_max_diff_vs_first"] = float((outs[0].float() - reference).abs().max())
            except Exception as error:  # a backend that refuses the shape is reported, not fatal
                row[name + "_us"] = None
                row[name + "_error"] = str(error).splitlines()[0][:160]
        fi_kind = (hq // hkv >= 4, head_dim)
        if flashinfer is not None and fi_kind in flashinfer_failed:
            row["flashinfer_us"] = None
            row["flashinfer_error"] = "skipped: " + flashinfer_failed[fi_kind]
        elif flashinfer is not None:
            try:
                call, fi_outs = flashinfer_peer(torch, flashinfer, qs, ks, vs, sets, batch, hq, hkv,
                                                k_len, head_dim)
                us, spread = time_graph(torch, call, sets, args.reps)
                row["flashinfer_us"] = us
                row["flashinfer_spread_us"] = spread
                if reference is not None:  # [batch, hq, 1, D] against [batch, hq, D]
                    ref = reference.reshape(batch, hq, head_dim)
                    diff = float((fi_outs[0].float() - ref).abs().max())
                    row["flashinfer_max_diff_vs_first"] = diff
                    scale = max(float(ref.abs().max()), 1e-6)
                    if diff > FLASHINFER_MAX_REL_DIFF * scale:  # a time for wrong output is no peer
                        row["flashinfer_unchecked_us"] = row.pop("flashinfer_us")
                        row["flashinfer_us"] = None
                        row["flashinfer_error"] = (
                            "output differs from SDPA's: max |diff| %.3g of %.3g" % (diff, scale))
                del call, fi_outs
            except Exception as error:  # JIT or plan failures are reported, not fatal
                row["flashinfer_us"] = None
                row["flashinfer_error"] = brief(error)
                flashinfer_failed[fi_kind] = row["flashinfer_error"]
        rows.append(row)
        print("  B=%-3d Hq=%-2d Hkv=%-2d k_len=%-6d D=%-3d sets=%-4d cudnn %s us, flash %s us, "
              "flashinfer %s us%s" % (
                  batch, hq, hkv, k_len, head_dim, sets, fmt(row.get("cudnn_us")),
                  fmt(row.get("flash_us")), fmt(row.get("flashinfer_us")),
                  " (%s)" % row["flashinfer_error"] if "flashinfer_error" in row else ""),
              flush=True)
        del qs, ks, vs, outs, reference
        torch.cuda.empty_cache()
    return info, rows


def brief(error):
    """An exception's first and last lines (a JIT build failure puts its cause last)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [repr(error)]
    text = lines[0] if len(lines) == 1 else lines[0] + " ... " + lines[-1]
    return text[:240]


def fmt(value, digits=2):
    return "-" if value is None else ("%.*f" % (digits, value))


def combine(splice_json, peers, info, out_json):
    with open(splice_json) as f:
        splice = json.load(f)
    def key_of(r):
        return (r["batch"], r["num_qo_heads"], r["num_kv_heads"], r["k_len"], r.get("head_dim", 128))
    by_shape = {key_of(r): r for r in peers}
    table = []
    header = "%-26s %9s %7s %7s %9s %9s %9s %9s %7s" % (
        "B,Hq,Hkv,k_len,D", "splice us", "GB/s", "%floor", "cudnn us", "flash us", "fi us",
        "best peer", "ratio")
    lines = [header]
    grid_order = lambda r: (r["num_qo_heads"] != 9, r["num_kv_heads"] != 8 or r["num_qo_heads"] != 32,
                            r["num_qo_heads"], r["num_kv_heads"], r["batch"], r["k_len"])
    for r in sorted(splice["rows"], key=grid_order):
        key = key_of(r)
        p = by_shape.get(key, {})
        peer_times = [t for t in (p.get("cudnn_us"), p.get("flash_us"), p.get("flashinfer_us"))
                      if t is not None]
        best = min(peer_times) if peer_times else None
        ratio = best / r["us"] if best else None  # > 1: splice is faster than the best peer
        floor_pct = 100.0 * r["floor_us"] / r["us"]
        table.append({**r, "cudnn_us": p.get("cudnn_us"), "flash_us": p.get("flash_us"),
                      "flashinfer_us": p.get("flashinfer_us"), "best_peer_us": best,
                      "ratio_best_peer_over_splice": ratio, "pct_of_floor": floor_pct})
        lines.append("%-26s %9.2f %7.0f %6.1f%% %9s %9s %9s %9s %7s" % (
            "%d,%d,%d,%d,%d" % key, r["us"], r["gbps"], floor_pct, fmt(p.get("cudnn_us")),
            fmt(p.get("flash_us")), fmt(p.get("flashinfer_us")), fmt(best), fmt(ratio)))
    with open(out_json, "w") as f:
        json.dump({"splice_device": splice.get("device"), "peers": info,
                   "floor_tbps": splice.get("floor_tbps"),
                   "method": splice.get("method"), "rows": table}, f, indent=1)
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="attention_peers.json")
    parser.add_argument("--splice", help="splice benchmark JSON to combine with")
    parser.add_argument("--combined", default="attention_combined.json")
    parser.add_argument("--table", help="also write the combined table here")
    parser.add_argument("--max-kv-gb", type=float, default=40.0)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--shapes", help="'B,Hq,Hkv,k_len,D;...': these shapes instead of the grid")
    parser.add_argument("--min-sets", type=int, default=1,
                        help="at least this many input sets (2: no set is read twice in a row)")
    args = parser.parse_args()
    try:
        import torch
        if not torch.cuda.is_available():
            print("attention_peers: no CUDA device, skipped")
            return 0
    except ImportError:
        print("attention_peers: PyTorch is not installed, peers skipped")
        return 0
    info, rows = run_peers(args)
    with open(args.json, "w") as f:
        json.dump({"info": info, "rows": rows}, f, indent=1)
    if args.splice:
        table = combine(args.splice, rows, info, args.combined)
        if args.table:
            with open(args.table, "w") as f:
                f.write(table + "\n")
        print("\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
