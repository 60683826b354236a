#!/usr/bin/env python3
"""An independent float32 NumPy Llama (Hugging Face conventions) for checking splice's loaders.

It reads a Hugging Face directory (config.json, model.safetensors, tokenizer.json), such as the
one `export_gguf_as_hf` writes from the packaged SmolLM2-135M GGUF, and greedily decodes a prompt
by recomputing the whole sequence each step (no cache: slow, plain, easy to audit).

  1. RMSNorm:   y = x / sqrt(mean(x^2) + eps) * w
  2. RoPE:      rotate-half pairs (i, i + head_dim / 2), angle = pos * theta^(-2i / head_dim)
  3. Attention: causal softmax(q k^T / sqrt(head_dim)) v with GQA (kv heads repeated)
  4. MLP:       down(silu(gate(x)) * up(x)); logits = norm(x) @ embed^T when tied

Needs numpy, safetensors and tokenizers (pip). Usage:
  scripts/np_llama_reference.py DIR "prompt text" [--steps 20] [--save-logits first.npy]
"""
import argparse
import json

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("prompt")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--save-logits", help="write the first step's last-position logits (.npy)")
    args = ap.parse_args()

    cfg = json.load(open(f"{args.dir}/config.json"))
    w = load_file(f"{args.dir}/model.safetensors")
    w = {k: v.astype(np.float32) for k, v in w.items()}
    tok = Tokenizer.from_file(f"{args.dir}/tokenizer.json")
    hidden, heads, kv_heads = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    eps, theta = cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    lm_head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    eos = cfg.get("eos_token_id")
    eos = set(eos if isinstance(eos, list) else [eos])

    def rms(x, weight):
        scale = 1.0 / np.sqrt(np.mean(x.astype(np.float64) ** 2, -1, keepdims=True) + eps)
        return (x * scale.astype(np.float32)) * weight

    def rope(x, pos):  # x: [seq, heads, head_dim]
        angle = np.outer(pos, inv_freq)
        angle = np.concatenate([angle, angle], -1)[:, None, :]
        cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
        x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2 :]
        return x * cos + np.concatenate([-x2, x1], -1) * sin

    def forward(ids):
        seq = len(ids)
        x = w["model.embed_tokens.weight"][ids]  # [seq, hidden]
        pos = np.arange(seq)
        mask = np.triu(np.full((seq, seq), -np.inf, dtype=np.float32), 1)
        for layer in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{layer}."
            h = rms(x, w[p + "input_layernorm.weight"])
            q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(seq, heads, head_dim)
            k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(seq, kv_heads, head_dim)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(seq, kv_heads, head_dim)
            q, k = rope(q, pos), rope(k, pos)
            k = np.repeat(k, heads // kv_heads, 1)
            v = np.repeat(v, heads // kv_heads, 1)
            s = np.einsum("thd,shd->hts", q, k) / np.sqrt(head_dim) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.einsum("hts,shd->thd", s, v).reshape(seq, heads * head_dim)
            x = x + o @ w[p + "self_attn.o_proj.weight"].T
            h = rms(x, w[p + "post_attention_layernorm.weight"])
            g = h @ w[p + "mlp.gate_proj.weight"].T
            u = h @ w[p + "mlp.up_proj.weight"].T
            x = x + ((g / (1 + np.exp(-g))) * u) @ w[p + "mlp.down_proj.weight"].T
        return rms(x, w["model.norm.weight"]) @ lm_head.T  # [seq, vocab]

    ids = tok.encode(args.prompt).ids
    print("prompt ids", ids)
    generated = []
    for step in range(args.steps):
        logits = forward(ids)[-1]
        if step == 0:
            top = np.argsort(-logits)[:10]
            print("first-step top10", top.tolist(), [round(float(v), 4) for v in logits[top]])
            if args.save_logits:
                np.save(args.save_logits, logits)
        nxt = int(np.argmax(logits))
        ids.append(nxt)
        generated.append(nxt)
        if nxt in eos:
            break
    print("generated ids", generated)
    print("text", repr(tok.decode(generated)))


if __name__ == "__main__":
    main()
