#!/usr/bin/env python3
"""FLA's Triton KDA decode path, timed in CUDA graphs, for the shapes of kda_decode_cuda_bench.

The path (flash-linear-attention / fla-core, imported as an installed package, never vendored):
  1. conv: fla.modules.causal_conv1d.ops.causal_conv1d_update with SiLU, one launch per projection
     (q, k, v, as models with separate q/k/v short convolutions run it) over the R rows;
  2. fla.ops.kda.fused_recurrent.fused_recurrent_kda_fwd with the gate (lower_bound), L2 norm
     and beta sigmoid in kernel, state in place through ssm_state_indices [N, T],
     num_accepted_tokens and cu_seqlens (continuous batching / speculative decoding), state
     layout [V, K] (state_v_first) like splice's;
  3. fla.modules.norm.fused_norm_gate rms_norm_gated with a sigmoid gate.
For T > 1 the conv is timed as the per-row update over all R rows (FLA has no speculative
rolling-window conv update); that is a lower bound on what a T > 1 conv costs.

Autotuning: FLA's conv update and gated RMSNorm kernels are Triton-autotuned on keys without the
row count (conv: D and W), so in one process the first shape's choice serves every later N, and
a config tuned at N = 1 ran the conv 10-30x slower at N = 512 in some processes (perf.md runs 162,
167: the three-kernel path's conv and norm took 15 to 463 us at fp32 T = 1 N = 512). Each shape is
therefore tuned afresh (every FLA autotuner's in-process cache cleared, Triton's on-disk autotune
cache off through FLA_CACHE_RESULTS=0), as a deployment tuned at its own batch size would run;
KDA_PEERS_TUNE_ONCE=1 keeps the first shape's choices instead.

Timing: G iterations over disjoint slot sets (>= 400 MB of state per replay, as the C++ bench)
captured in one torch CUDA graph, replayed after warm-up (at least KDA_BENCH_WARM_MS, default 50
ms); median replay time / G (graph_timing.py). The recurrent kernel alone is timed the same way.

FlashInfer: its T = 1 `fused_kda_decode` (the plain form of the op splice implements) is checked
against a float64 reference and timed the same way when it imports (bench/peers/flashinfer_kda.py;
its packed T > 1 kernel needs SM10x). KDA_PEERS_FLASHINFER=0 skips it.

Writes "<dtype> <N> <T> <fla_us> <fla_recurrent_us> <flashinfer_us>" lines to argv[1] (-1 where a
peer was not timed). KDA_BENCH_STATES (f32, bf16), KDA_BENCH_TS and KDA_BENCH_NS (comma lists)
restrict the grid as they do the C++ bench's.
"""
import math
import os
import sys

import torch

from flashinfer_kda import flashinfer_t1_times
from graph_timing import graph_us

H, D = 32, 128
TARGET_SET_BYTES = 400 * 2**20
MAX_SETS = 64
# Untimed replays for at least this many ms before the timed ones (KDA_BENCH_WARM_MS, as the C++
# bench: with 3 replays alone its first configurations after a switch read up to 10% slow).
WARM_MS = float(os.environ.get("KDA_BENCH_WARM_MS", "50"))


def reset_fla_autotuners():
    """Clears the in-process config cache of every Triton autotuner in FLA's loaded modules."""
    from triton.runtime.autotuner import Autotuner
    cleared = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith("fla") or module is None:
            continue
        for obj in list(vars(module).values()):
            seen = 0
            while obj is not None and seen < 4:  # heuristics / autotune wrappers nest through .fn
                if isinstance(obj, Autotuner):
                    obj.cache.clear()
                    cleared += 1
                    break
                try:
                    obj = getattr(obj, "fn", None)
                except Exception:  # noqa: BLE001 (a module attribute whose .fn raises)
                    obj = None
                seen += 1
    return cleared


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else "kda_peers.txt"
    tune_once = os.environ.get("KDA_PEERS_TUNE_ONCE", "0") == "1"
    if not tune_once:
        os.environ.setdefault("FLA_CACHE_RESULTS", "0")  # read when fla is imported

    def env_list(name, default):
        value = os.environ.get(name, "")
        return [v.strip() for v in value.split(",") if v.strip()] if value else default

    states = [{"f32": torch.float32, "bf16": torch.bfloat16}[s]
              for s in env_list("KDA_BENCH_STATES", ["f32", "bf16"])]
    token_counts = [int(t) for t in env_list("KDA_BENCH_TS", ["1", "2", "4", "8"])]
    sequence_counts = [int(n) for n in env_list("KDA_BENCH_NS", ["1", "8", "32", "128", "512"])]
    fi = (flashinfer_t1_times(states, sequence_counts, WARM_MS, TARGET_SET_BYTES, MAX_SETS)
          if 1 in token_counts else {})

    def line(dt, N, T, fla_us, fla_rec_us):
        fi_us = fi.get((dt, N), -1.0) if T == 1 else -1.0
        return f"{dt} {N} {T} {fla_us:.3f} {fla_rec_us:.3f} {fi_us:.3f}\n"

    try:
        from fla.modules.causal_conv1d.ops import causal_conv1d_update
        from fla.modules.norm.fused_norm_gate import rms_norm_gated
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
    except Exception as e:  # noqa: BLE001
        print(f"FLA not importable, its timings skipped: {e!r}")
        with open(out_path, "w") as f:
            f.writelines(line(dt, N, 1, -1.0, -1.0) for (dt, N) in fi)
        return

    dev = torch.device("cuda")
    C = H * D
    lines = []
    for sdt in states:
        for T in token_counts:
            for N in sequence_counts:
                if not tune_once:
                    cleared = reset_fla_autotuners()
                    if N == 1 and T == 1:
                        print(f"FLA autotuners reset before each shape ({cleared} loaded)")
                R = N * T
                es = torch.finfo(sdt).bits // 8
                per_set = N * H * D * D * es * (1 + T)
                G = max(1, min(MAX_SETS, math.ceil(TARGET_SET_BYTES / per_set)))
                slots = G * N * T + 1
                g = torch.Generator(device=dev).manual_seed(0)
                xq = torch.randn(R, C, device=dev, dtype=torch.bfloat16, generator=g)
                xk = torch.randn(R, C, device=dev, dtype=torch.bfloat16, generator=g)
                xv = torch.randn(R, C, device=dev, dtype=torch.bfloat16, generator=g)
                wq, wk, wv = (0.1 * torch.randn(C, 4, device=dev, generator=g) for _ in range(3))
                caches = [0.1 * torch.randn(R, C, 4, device=dev, generator=g).to(torch.bfloat16)
                          for _ in range(3)]
                raw_gate = torch.randn(1, R, H, D, device=dev, dtype=torch.bfloat16, generator=g)
                raw_beta = torch.randn(1, R, H, device=dev, dtype=torch.bfloat16, generator=g)
                A_log = 0.5 * torch.randn(H, device=dev, generator=g)
                dt_bias = 0.1 * torch.randn(C, device=dev, generator=g)
                og = torch.randn(R * H, D, device=dev, dtype=torch.bfloat16, generator=g)
                nw = torch.randn(D, device=dev, generator=g)
                state = (0.01 * torch.randn(slots, H, D, D, device=dev, generator=g)).to(sdt)
                cu = torch.arange(0, R + 1, T, device=dev, dtype=torch.int32)
                nat = torch.randint(1, T + 1, (N,), device=dev, dtype=torch.int32, generator=g)
                sis = [(1 + s * N * T + torch.arange(N * T, device=dev, dtype=torch.int32)).view(N, T)
                       for s in range(G)]
                out = torch.empty(1, R, H, D, device=dev, dtype=torch.bfloat16)

                def recurrent(si, q, k, v):
                    fused_recurrent_kda_fwd(
                        q=q, k=k, v=v, g=raw_gate, beta=raw_beta, A_log=A_log, dt_bias=dt_bias,
                        scale=D ** -0.5, initial_state=state, inplace_final_state=True,
                        cu_seqlens=cu, ssm_state_indices=si,
                        num_accepted_tokens=nat if T > 1 else None,
                        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                        use_beta_sigmoid_in_kernel=True, lower_bound=-5.0,
                        state_v_first=True, out=out)

                def full(si):
                    q, _ = causal_conv1d_update(xq, caches[0], weight=wq, activation="silu")
                    k, _ = causal_conv1d_update(xk, caches[1], weight=wk, activation="silu")
                    v, _ = causal_conv1d_update(xv, caches[2], weight=wv, activation="silu")
                    recurrent(si, q.view(1, R, H, D), k.view(1, R, H, D), v.view(1, R, H, D))
                    return rms_norm_gated(out.view(R * H, D), og, nw, None, activation="sigmoid",
                                          eps=1e-5)

                qf = torch.randn(1, R, H, D, device=dev, dtype=torch.bfloat16, generator=g)
                kf = torch.randn(1, R, H, D, device=dev, dtype=torch.bfloat16, generator=g)
                vf = torch.randn(1, R, H, D, device=dev, dtype=torch.bfloat16, generator=g)
                times = {}
                for name, fn in (("full", lambda si: full(si)),
                                 ("rec", lambda si: recurrent(si, qf, kf, vf))):
                    try:
                        times[name] = graph_us(fn, sis, WARM_MS)
                    except Exception as e:  # noqa: BLE001
                        print(f"FLA {name} failed for {sdt} N={N} T={T}: {e!r}")
                        times[name] = -1.0
                dt = "f32" if sdt == torch.float32 else "bf16"
                print(f"FLA {dt} N={N} T={T}: full {times['full']:.2f} us, recurrent "
                      f"{times['rec']:.2f} us (G={G})", flush=True)
                lines.append(line(dt, N, T, times['full'], times['rec']))
                del state, sis
                torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        f.writelines(lines)


if __name__ == "__main__":
    main()
