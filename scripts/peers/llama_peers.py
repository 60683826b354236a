#!/usr/bin/env python3
"""Llama-family peers for splice, on the GPU machine (PyTorch + transformers are on its image).

1. Cross-check (issue 7 item 6): a tiny random-initialized transformers LlamaForCausalLM (f32) is
   saved with save_pretrained (safetensors) and decoded greedily for 32 tokens by transformers;
   splice loads the same directory and decodes the same prompt (`splice run --logits-out`). The
   generated ids must agree and every step's logits must match within max|d| <= 1e-4 * max|logit|
   + 1e-5 (f32 weights and activations on both sides).
2. Speed (issue 7 "Measured"): a SmolLM2-135M-shaped Llama (30 layers, hidden 576, 9 heads, 3 KV
   heads, bf16, random weights) decoded at batch 1 by transformers eager (per-token latency,
   median over 64 tokens after warm-up, CUDA synchronized) and by `splice bench --device cuda`.

Usage: llama_peers.py SPLICE_BINARY OUT_DIR [--device cuda|cpu]
Writes OUT_DIR/llama_peers.json and prints a table last.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import time


def read_all_logits(path):
    import numpy as np
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    info = header["all_logits"]
    begin, end = info["data_offsets"]
    return np.frombuffer(data[begin:end], dtype=np.float32).reshape(info["shape"])


def crosscheck(splice, device, workdir):
    import numpy as np
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=211, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                         max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).float().eval()
    path = os.path.join(workdir, "tiny-llama")
    model.save_pretrained(path, safe_serialization=True)
    prompt = [3, 17, 42, 5]
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False,
                             min_new_tokens=32, pad_token_id=0)
        ids = out[0].tolist()
        ref = model(torch.tensor([ids])).logits[0].double().numpy()  # [len, vocab], teacher-forced
    logits_file = os.path.join(workdir, "tiny-llama-logits.safetensors")
    cmd = [splice, "run", "--model", path, "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", "32",
           "--dtype", "f32", "--device", device, "--json", "--stop", "-1", "--logits-out", logits_file,
           "--max-seq-len", "64"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        return {"ok": False, "error": run.stderr.strip()}
    got_ids = json.loads(run.stdout)["tokens"]
    got = read_all_logits(logits_file).astype(np.float64)
    n = got.shape[0]
    err = float(np.abs(got - ref[:n]).max())
    scale = float(np.abs(ref[:n]).max())
    ok = got_ids == ids[len(prompt):] and err <= 1e-4 * scale + 1e-5
    return {"ok": ok, "steps": n, "max_abs_err": err, "max_abs_logit": scale,
            "ids_match": got_ids == ids[len(prompt):]}


def speed(splice, device, workdir):
    import torch
    from smollm2_shaped import build_model

    model = build_model()
    path = os.path.join(workdir, "smollm2-shaped")
    model.save_pretrained(path, safe_serialization=True)
    result = {}
    if device == "cuda":
        model = model.cuda()
        token = torch.tensor([[1]], device="cuda")
        with torch.no_grad():
            out = model(token, use_cache=True)
            past = out.past_key_values
            times = []
            for i in range(96):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = model(token, past_key_values=past, use_cache=True)
                past = out.past_key_values
                torch.cuda.synchronize()
                if i >= 32:
                    times.append((time.perf_counter() - t0) * 1e6)
        times.sort()
        result["transformers_eager_us"] = times[len(times) // 2]
    cmd = [splice, "bench", "--model", path, "--device", device, "--dtype", "bf16", "--steps", "128",
           "--max-seq-len", "256", "--json"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        result["splice_error"] = run.stderr.strip()[-2000:]
    else:
        result["splice"] = json.loads(run.stdout)
    return result


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    splice, out_dir = sys.argv[1], sys.argv[2]
    device = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--device" else "cuda"
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        report = {"device": device, "crosscheck": crosscheck(splice, device, work), "speed": speed(splice, device, work)}
    with open(os.path.join(out_dir, "llama_peers.json"), "w") as f:
        json.dump(report, f, indent=2)
    c, s = report["crosscheck"], report["speed"]
    print("llama cross-check:", "PASS" if c.get("ok") else "FAIL", json.dumps(c))
    sp = s.get("splice", {})
    print(f"SmolLM2-shaped decode, batch 1, bf16 on {device}: splice p50 {sp.get('p50_us', 'n/a')} us "
          f"(host overhead {sp.get('host_overhead_us_p50', 'n/a')} us), transformers eager "
          f"{s.get('transformers_eager_us', 'n/a')} us {s.get('splice_error', '')}")
    return 0 if c.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
