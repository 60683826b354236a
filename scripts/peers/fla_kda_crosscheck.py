#!/usr/bin/env python3
"""Peer cross-check (issue 7 item 6, KDA part): splice against FLA's own KDAForCausalLM.

FLA (flash-linear-attention + fla-core) is imported as an installed package, never vendored. Its
attention layers need flash-attn, which the device lacks, so every model here is pure KDA
(`attn: null`). Per variant:
  1. Build a tiny random KDAForCausalLM with FLA + transformers (seeded). FLA's own init (std
     0.02) makes logits ~0 and greedy ids meaningless, so weights are re-drawn at O(1) scale:
     linears N(0, 1/fan_in), embeddings N(0, 1), norm weights 1 + N(0, 0.05^2), conv taps
     N(0, 0.3^2), A_log = log U(1, 16), g_proj bias N(0, 0.1^2); dt_bias keeps FLA's init. The
     model is cast to bf16 (A_log and dt_bias included, as `.to(bfloat16)` does) and saved with
     save_pretrained (safetensors + config.json). bos/eos are null so no stop token cuts splice's
     decode short.
  2. FLA decodes it on the GPU exactly as FLA runs inference: one forward over the prompt
     (use_cache=True), then one forward per token with past_key_values (fused_recurrent KDA
     kernel, ShortConvolution.step), greedy, for --steps tokens; the logits that chose each token
     are kept (float32 of FLA's bf16 logits).
  3. splice loads the saved directory (`splice run --model DIR`):
     a. greedy: one `--json --max-new-tokens STEPS` run; its ids against FLA's;
     b. teacher-forced logits: for every step i, `--prompt-ids PROMPT+FLA_IDS[:i]
        --max-new-tokens 1 --logits-out F` writes the logits at the last prompt position, compared
        with FLA's logits of step i (so one near-tie cannot derail the rest of the comparison).
  4. Pass iff, at every step, |splice - fla| <= ATOL + RTOL * |fla| elementwise (ATOL 0.125 = 4 bf16
     ulps of a logit in [4, 8), RTOL 2%: both sides round to bf16 at different points — FLA's
     fused residual+RMSNorm, cuBLAS bf16 GEMMs, Triton kernels with their own accumulation order),
     and the greedy ids agree up to the first step where FLA's top-2 logits are within 2*ATOL
     (a near tie either side may break differently). Measured numbers are printed and written to
     OUT/fla_kda_crosscheck.json.

Variants (--variants, comma-separated; default all):
  softplus     H=2, D=128, conv 4, gate -exp(A_log) softplus(f + dt_bias): splice's fused-op path
  lower_bound  the same with lower_bound -5 and safe_gate: lb * sigmoid(exp(A_log)(f + dt_bias))
  generic      GVA (4 value heads over 2 q/k heads), head_dim 64, expand_v 2, allow_neg_eigval:
               shapes the fused op cannot run; splice builds them from primitives

Running it (the device tool; FLA travels as wheels in .whl/, the build deps in .deps/ made here by
`scripts/gpu-check --pack-deps`; fetch the wheels here with
`python3 -m pip download --no-deps -d .whl flash-linear-attention==0.6.0 fla-core==0.6.0`):
  run(carry=[".whl", ".deps"], command=
      "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "
      "--target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit; "
      "python3 scripts/peers/fla_kda_crosscheck.py --build --device cuda --out $OUT")
`--build` configures and builds the `splice` target in build-flacheck/ (Release, Ninja when
present, .deps/usr as CMAKE_PREFIX_PATH when present); `--splice PATH` uses an existing binary
instead. `--device cpu` runs splice's CPU backend (FLA always runs on the GPU). Exit status: 0 all
variants pass, 1 a mismatch, 2 a setup problem (no GPU, no FLA, no splice).
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

ATOL = 0.125
RTOL = 0.02
PROMPT_LEN = 8
VOCAB = 512
HIDDEN = 256
LAYERS = 2
INTERMEDIATE = 512
SEED = 20261130
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VARIANTS = {
    "softplus": dict(num_heads=2, head_dim=128),
    "lower_bound": dict(num_heads=2, head_dim=128, lower_bound=-5.0, safe_gate=True),
    "generic": dict(num_heads=2, num_v_heads=4, head_dim=64, expand_v=2.0, allow_neg_eigval=True),
}


def setup_error(msg):
    print(f"fla_kda_crosscheck: {msg}", file=sys.stderr)
    sys.exit(2)


def build_splice():
    build = os.path.join(ROOT, "build-flacheck")
    deps = os.path.join(ROOT, ".deps", "usr")
    args = ["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DSPLICE_BUILD_BENCH=OFF", "-DSPLICE_BUILD_TESTS=OFF",
            "-DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20",
            "-DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20"]
    env = dict(os.environ)
    if os.path.isdir(deps):
        args += [f"-DCMAKE_PREFIX_PATH={deps}", "-DBLA_VENDOR=Generic"]
        lib = os.path.join(deps, "lib", "x86_64-linux-gnu")
        env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        os.environ["LD_LIBRARY_PATH"] = env["LD_LIBRARY_PATH"]
    if shutil.which("ninja"):
        args += ["-G", "Ninja"]
    subprocess.run(args, check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", build, "--target", "splice", f"-j{os.cpu_count() or 4}"], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    return os.path.join(build, "splice")


def init_weights(model, seed):
    """Re-draws every parameter at O(1) scale (see the module docstring)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = tuple(p.shape)
            if name.endswith("A_log"):
                value = torch.empty(shape).uniform_(1.0, 16.0, generator=g).log()
            elif name.endswith("dt_bias"):
                continue
            elif "embeddings" in name:
                value = torch.randn(shape, generator=g)
            elif "conv1d" in name:
                value = 0.3 * torch.randn(shape, generator=g)
            elif "norm" in name and p.dim() == 1:
                value = 1.0 + 0.05 * torch.randn(shape, generator=g)
            elif p.dim() == 2:
                value = torch.randn(shape, generator=g) / math.sqrt(shape[1])
            else:  # biases (g_proj.1.bias)
                value = 0.1 * torch.randn(shape, generator=g)
            p.copy_(value.to(p.dtype))


def fla_decode(model, prompt, steps):
    import torch
    logits, tokens = [], []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt], device="cuda"), use_cache=True)
        for _ in range(steps):
            row = out.logits[0, -1].float()
            logits.append(row.cpu())
            token = int(row.argmax())
            tokens.append(token)
            out = model(input_ids=torch.tensor([[token]], device="cuda"), past_key_values=out.past_key_values,
                        use_cache=True)
    return tokens, logits


def splice_cmd(splice, model_dir, prompt, device, cache):
    return [splice, "run", "--model", model_dir, "--prompt-ids", ",".join(str(t) for t in prompt), "--device", device,
            "--dtype", "bf16", "--max-seq-len", "128", "--tuning-cache", cache]


def run_variant(name, overrides, args, splice, workdir):
    import torch
    from safetensors.torch import load_file
    from fla.models import KDAConfig, KDAForCausalLM

    config = KDAConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS, vocab_size=VOCAB, intermediate_size=INTERMEDIATE,
                       norm_eps=1e-6, attn=None, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                       tie_word_embeddings=False, fuse_cross_entropy=False, **overrides)
    torch.manual_seed(SEED)
    model = KDAForCausalLM(config)
    init_weights(model, SEED)
    model = model.to(device="cuda", dtype=torch.bfloat16).eval()
    model_dir = os.path.join(workdir, name)
    model.save_pretrained(model_dir, safe_serialization=True)
    gen = torch.Generator().manual_seed(SEED + 1)
    prompt = torch.randint(0, VOCAB, (PROMPT_LEN,), generator=gen).tolist()
    fla_tokens, fla_logits = fla_decode(model, prompt, args.steps)
    cache = os.path.join(workdir, f"{name}.tuning.json")

    # a. splice's own greedy decode.
    out = subprocess.run(splice_cmd(splice, model_dir, prompt, args.device, cache) +
                         ["--max-new-tokens", str(args.steps), "--json"], check=True, capture_output=True, text=True)
    splice_tokens = json.loads(out.stdout)["tokens"]
    # b. teacher-forced logits at every step.
    worst = dict(abs=0.0, rel=0.0, step=-1, index=-1, splice=0.0, fla=0.0)
    failures = []
    for i in range(args.steps):
        path = os.path.join(workdir, f"{name}.logits.{i}.safetensors")
        subprocess.run(splice_cmd(splice, model_dir, prompt + fla_tokens[:i], args.device, cache) +
                       ["--max-new-tokens", "1", "--logits-out", path], check=True, capture_output=True, text=True)
        mine = load_file(path)["logits"].float().reshape(-1)
        ref = fla_logits[i]
        err = (mine - ref).abs()
        bound = ATOL + RTOL * ref.abs()
        j = int(torch.argmax(err - bound))
        if float(err.max()) > worst["abs"]:
            k = int(err.argmax())
            worst = dict(abs=float(err[k]), rel=float(err[k] / ref[k].abs().clamp_min(1e-6)), step=i, index=k,
                         splice=float(mine[k]), fla=float(ref[k]))
        if bool((err > bound).any()):
            failures.append(f"step {i}: {int((err > bound).sum())} logits outside, worst index {j} "
                            f"(splice {float(mine[j]):.5g}, fla {float(ref[j]):.5g})")
    # Greedy agreement up to the first near tie in FLA's logits.
    agree, compared = 0, 0
    for i, (a, b) in enumerate(zip(splice_tokens, fla_tokens)):
        top2 = torch.topk(fla_logits[i], 2).values
        if float(top2[0] - top2[1]) < 2 * ATOL:
            break
        compared += 1
        if a != b:
            failures.append(f"greedy step {i}: splice chose {a}, FLA {b} (FLA margin {float(top2[0] - top2[1]):.3g})")
            break
        agree += 1
    return dict(variant=name, config=overrides, prompt=prompt, fla_tokens=fla_tokens, splice_tokens=splice_tokens,
                greedy_agree=agree, greedy_compared=compared, worst=worst, failures=failures, ok=not failures)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--splice", help="path of the splice binary (default: build/splice or build-*/splice)")
    parser.add_argument("--build", action="store_true", help="build the splice target in build-flacheck/ first")
    parser.add_argument("--device", default="cuda", choices=["cpu", "cuda"], help="splice's device")
    parser.add_argument("--steps", type=int, default=32, help="greedy decode steps")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="directory for fla_kda_crosscheck.json")
    args = parser.parse_args()

    try:
        import torch
        import fla  # noqa: F401
        from fla.models import KDAForCausalLM  # noqa: F401
    except Exception as e:  # noqa: BLE001
        setup_error(f"FLA is not importable ({e}); install the wheels (see the module docstring)")
    if not torch.cuda.is_available():
        setup_error("FLA's kernels need a CUDA GPU; none is visible")
    splice = args.splice
    if args.build:
        splice = build_splice()
    if not splice:
        for cand in [os.path.join(ROOT, "build", "splice")] + sorted(
                os.path.join(ROOT, d, "splice") for d in os.listdir(ROOT) if d.startswith("build-")):
            if os.access(cand, os.X_OK):
                splice = cand
                break
    if not splice or not os.access(splice, os.X_OK):
        setup_error("no splice binary (pass --splice PATH or --build)")

    import fla as fla_module
    print(f"FLA {getattr(fla_module, '__version__', '?')}, torch {torch.__version__}, "
          f"GPU {torch.cuda.get_device_name()}, splice {splice} on {args.device}")
    print(f"tolerance: |splice - fla| <= {ATOL} + {RTOL} * |fla| per logit, {args.steps} steps, prompt {PROMPT_LEN}")
    results = []
    workdir = tempfile.mkdtemp(prefix="fla-kda-crosscheck-")
    try:
        for name in args.variants.split(","):
            if name not in VARIANTS:
                setup_error(f"unknown variant '{name}' (known: {', '.join(VARIANTS)})")
            r = run_variant(name, VARIANTS[name], args, splice, workdir)
            results.append(r)
            w = r["worst"]
            print(f"{name:12s} {'ok  ' if r['ok'] else 'FAIL'} max |err| {w['abs']:.4g} at step {w['step']} "
                  f"index {w['index']} (splice {w['splice']:.5g}, fla {w['fla']:.5g}); greedy ids agree "
                  f"{r['greedy_agree']}/{r['greedy_compared']} steps before the first near tie")
            for f in r["failures"][:8]:
                print("   ", f)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "fla_kda_crosscheck.json"), "w") as f:
        json.dump(dict(atol=ATOL, rtol=RTOL, steps=args.steps, results=results), f, indent=1)
    sys.exit(0 if all(r["ok"] for r in results) else 1)


if __name__ == "__main__":
    main()
