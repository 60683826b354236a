"""FlashInfer's fused KDA decode (`flashinfer.kda_decode.fused_kda_decode`) as a peer of splice's
T = 1 kernel: a float64 check of its results, then its time over kda_decode_cuda_bench's shapes.

`fused_kda_decode` is the plain T = 1 form of the op splice's spec (shared/specs/kda_decode.md)
is call-compatible with: one row a sequence, `state_indices` [R] naming each row's slot (read and
written in place), conv + SiLU, L2 norms, the gated delta rule and the gated RMSNorm in one launch
(a CuTe DSL kernel, one CTA of 16 warps per (head, row)). FlashInfer documents it for SM100; this
module runs it wherever it imports and compiles, and says why where it does not. Its packed T > 1
sibling needs SM10x (issue 6), so only T = 1 is timed.

The check (before any timing): 6 rows of H = 32 heads, one of them a null row (slot 0), random
inputs with the spec's scales (§6), fp32 and bf16 state, both gate modes (lower_bound -5 and
None), against `reference_t1` below, the spec's §2-§3 per-token math in float64 with its
rounding points: output within atol 2e-2 / rtol 3e-2 (FlashInfer's own test tolerance), the
written states within atol 2e-3 / rtol 3e-2, the conv history bit for bit, the null row zero and
its slot untouched. A peer that fails it is reported and not timed.

Timing: as bench/peers/kda_peers.py times FLA (graph_timing.py): G calls over disjoint slot sets
(>= 400 MB of state a replay) captured in one CUDA graph, warmed for >= KDA_BENCH_WARM_MS, median
of 21 replays / G. The bytes are the ones splice's T = 1 floor counts (the state read and written
once).
"""
import math
import os

import torch

from graph_timing import graph_us

H, D = 32, 128
C = H * D


def round_bf16(t):
    return t.to(torch.bfloat16).to(torch.float64)


def reference_t1(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, slots, state,
                 output_gate, norm_weight, lower_bound, norm_eps):
    """The spec's T = 1 math in float64 for rows with distinct slots (slot <= 0: a null row).

    Returns (out [R, H, D] float64, {slot: new state [H, D, D] in the state dtype},
    {slot: new conv history [3C, 3] bf16}).
    """
    R = x.shape[0]
    wc = weight.to(torch.float64).permute(0, 2, 1).reshape(3 * C, 4)  # [3C, W]: tap w of channel c
    out = torch.zeros(R, H, D, dtype=torch.float64, device=x.device)
    new_state, new_conv = {}, {}
    for r in range(R):
        s = int(slots[r])
        if s <= 0:
            continue
        hist = conv_state[s].to(torch.float64)  # [3C, 3] oldest first
        xr = x[r].to(torch.float64)  # [3C]
        pre = (hist * wc[:, :3]).sum(-1) + xr * wc[:, 3]
        mixed = round_bf16(pre * torch.sigmoid(pre))  # [3C]
        q, k, v = (mixed[p * C:(p + 1) * C].view(H, D) for p in range(3))
        qh = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) * D ** -0.5  # [H, D]
        kh = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)  # [H, D]
        z = raw_gate[0, r].to(torch.float64) + dt_bias.to(torch.float64).view(H, D)  # [H, D]
        a = torch.exp(A_log.to(torch.float64)).view(H, 1)
        if lower_bound is not None:
            g = lower_bound * torch.sigmoid(a * z)
        else:
            g = -a * torch.where(z > 20, z, torch.log1p(torch.exp(torch.clamp(z, max=20))))
        b = torch.sigmoid(raw_beta[0, r].to(torch.float64)).view(H, 1)  # [H, 1]
        S = state[s].to(torch.float64) * torch.exp(g).view(H, 1, D)  # [H, V, K], decay first
        pred = torch.einsum("hvk,hk->hv", S, kh)
        delta = b * (v - pred)  # [H, V]
        S = S + delta.unsqueeze(-1) * kh.unsqueeze(1)
        o = round_bf16(torch.einsum("hvk,hk->hv", S, qh))  # [H, V]
        inv = 1.0 / torch.sqrt((o * o).mean(-1, keepdim=True) + norm_eps)
        og = torch.sigmoid(output_gate.reshape(R, H, D)[r].to(torch.float64))
        out[r] = round_bf16(o * inv * norm_weight.to(torch.float64) * og)
        new_state[s] = S.to(state.dtype)
        new_conv[s] = torch.stack([conv_state[s, :, 1], conv_state[s, :, 2], x[r]], dim=-1)
    return out, new_state, new_conv


def make_inputs(R, slots_total, state_dtype, dev, seed):
    """Random inputs with the spec's scales (§6); conv_state in its [slots, 3C, 3] layout with
    strides [9C, 1, 3C] (each history position one contiguous 3C vector)."""
    g = torch.Generator(device=dev).manual_seed(seed)

    def randn(*shape, scale=1.0, dtype=torch.float32):
        return (scale * torch.randn(*shape, device=dev, generator=g)).to(dtype)

    return dict(
        x=randn(R, 3 * C, dtype=torch.bfloat16),
        weight=randn(3, 4, C, scale=0.1),
        conv_state=randn(slots_total, 3, 3 * C, scale=0.1, dtype=torch.bfloat16).transpose(1, 2),
        raw_gate=randn(1, R, H, D, dtype=torch.bfloat16),
        raw_beta=randn(1, R, H, dtype=torch.bfloat16),
        A_log=randn(H, scale=0.5),
        dt_bias=randn(C, scale=0.1),
        state=randn(slots_total, H, D, D, scale=0.01, dtype=state_dtype),
        output_gate=randn(R, H, D, dtype=torch.bfloat16),
        norm_weight=randn(D),
    )


def check_against_reference(fused_kda_decode, dev):
    """Runs the float64 check; returns a list of failure strings (empty: it agrees)."""
    failures = []
    R, slots_total = 6, 16
    for sdt in (torch.float32, torch.bfloat16):
        for lower_bound in (-5.0, None):
            inp = make_inputs(R, slots_total, sdt, dev, seed=7)
            slots = torch.tensor([3, 0, 9, 1, 15, 6], device=dev, dtype=torch.int32)
            ref_out, ref_state, ref_conv = reference_t1(
                inp["x"], inp["weight"], inp["conv_state"], inp["raw_gate"], inp["raw_beta"],
                inp["A_log"], inp["dt_bias"], slots, inp["state"], inp["output_gate"],
                inp["norm_weight"], lower_bound, 1e-5)
            state0, conv0 = inp["state"].clone(), inp["conv_state"].clone()
            out = torch.empty(1, R, H, D, device=dev, dtype=torch.bfloat16)
            fused_kda_decode(inp["x"], inp["weight"], inp["conv_state"], inp["raw_gate"],
                             inp["raw_beta"], inp["A_log"], inp["dt_bias"], slots, inp["state"],
                             inp["output_gate"], inp["norm_weight"], lower_bound=lower_bound,
                             norm_eps=1e-5, output=out)
            torch.cuda.synchronize()
            case = f"state {str(sdt).split('.')[-1]}, lower_bound {lower_bound}"
            got = out[0].to(torch.float64)
            d_out = (got - ref_out).abs()
            bad = d_out > 2e-2 + 3e-2 * ref_out.abs()
            if bad.any():
                failures.append(f"{case}: output max |d| {d_out.max().item():.3g}, "
                                f"{int(bad.sum())} outside atol 2e-2 / rtol 3e-2")
            if got[1].abs().max().item() != 0.0:
                failures.append(f"{case}: the null row's output is not zero")
            max_ds = 0.0
            for s in range(slots_total):
                if s in ref_state:
                    want = ref_state[s].to(torch.float64)
                    d = (inp["state"][s].to(torch.float64) - want).abs()
                    max_ds = max(max_ds, d.max().item())
                    if (d > 2e-3 + 3e-2 * want.abs()).any():
                        failures.append(f"{case}: slot {s}'s state max |d| {d.max().item():.3g}")
                    if not torch.equal(inp["conv_state"][s], ref_conv[s]):
                        failures.append(f"{case}: slot {s}'s conv history differs")
                elif not (torch.equal(inp["state"][s], state0[s])
                          and torch.equal(inp["conv_state"][s], conv0[s])):
                    failures.append(f"{case}: untouched slot {s} was written")
            print(f"FlashInfer fused_kda_decode vs float64, {case}: output max |d| "
                  f"{d_out.max().item():.3g}, state max |d| {max_ds:.3g}", flush=True)
    return failures


def time_fused_kda_decode(fused_kda_decode, states, ns, dev, warm_ms, target_set_bytes,
                          max_sets):
    """{(dtype name, N): us per call} at T = 1 (a shape that fails: -1)."""
    times = {}
    for sdt in states:
        dt = "f32" if sdt == torch.float32 else "bf16"
        for N in ns:
            es = torch.finfo(sdt).bits // 8
            per_set = N * H * D * D * es * 2
            G = max(1, min(max_sets, math.ceil(target_set_bytes / per_set)))
            inp = make_inputs(N, G * N + 1, sdt, dev, seed=N)
            sets = [1 + s * N + torch.arange(N, device=dev, dtype=torch.int32) for s in range(G)]
            out = torch.empty(1, N, H, D, device=dev, dtype=torch.bfloat16)

            def call(si):
                fused_kda_decode(inp["x"], inp["weight"], inp["conv_state"], inp["raw_gate"],
                                 inp["raw_beta"], inp["A_log"], inp["dt_bias"], si, inp["state"],
                                 inp["output_gate"], inp["norm_weight"], lower_bound=-5.0,
                                 norm_eps=1e-5, output=out)

            try:
                times[(dt, N)] = graph_us(call, sets, warm_ms)
            except Exception as e:  # noqa: BLE001
                print(f"FlashInfer fused_kda_decode failed for {dt} N={N}: {e!r}")
                times[(dt, N)] = -1.0
            print(f"FlashInfer {dt} N={N} T=1: fused_kda_decode {times[(dt, N)]:.2f} us (G={G})",
                  flush=True)
            del inp, sets
            torch.cuda.empty_cache()
    return times


def flashinfer_t1_times(states, ns, warm_ms, target_set_bytes, max_sets):
    """FlashInfer's T = 1 times, {} when it is not installed, does not run here or fails the
    float64 check (each said on stdout)."""
    if os.environ.get("KDA_PEERS_FLASHINFER", "1") == "0":
        print("FlashInfer fused_kda_decode: skipped (KDA_PEERS_FLASHINFER=0)")
        return {}
    try:
        import flashinfer
        from flashinfer.kda_decode import fused_kda_decode
    except Exception as e:  # noqa: BLE001
        print(f"FlashInfer fused_kda_decode: not importable here, skipped ({e!r})")
        return {}
    dev = torch.device("cuda")
    major, minor = torch.cuda.get_device_capability()
    print(f"FlashInfer {flashinfer.__version__} fused_kda_decode on sm_{major}{minor}")
    try:
        failures = check_against_reference(fused_kda_decode, dev)
    except Exception as e:  # noqa: BLE001
        print(f"FlashInfer fused_kda_decode does not run on sm_{major}{minor}: {e!r}")
        return {}
    if failures:
        print("FlashInfer fused_kda_decode disagrees with the float64 reference, not timed:\n  "
              + "\n  ".join(failures))
        return {}
    return time_fused_kda_decode(fused_kda_decode, states, ns, dev, warm_ms, target_set_bytes,
                                 max_sets)
