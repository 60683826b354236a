#!/usr/bin/env python3
"""The SmolLM2-135M-shaped Llama that splice's GPU benchmarks decode (issue 7's anchor model):
30 layers, hidden 576, 9 query / 3 KV heads of 64, MLP 1536, vocabulary 49152, tied embeddings,
bf16, random weights from torch.manual_seed(0). Needs PyTorch and transformers (the device image
has both).

Usage: smollm2_shaped.py OUT_DIR   (saves config.json + model.safetensors with save_pretrained)
Also imported by llama_peers.py (build_model).
"""
import sys


def build_model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                         max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=100000.0,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(torch.bfloat16).eval()


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: smollm2_shaped.py OUT_DIR")
    build_model().save_pretrained(sys.argv[1], safe_serialization=True)


if __name__ == "__main__":
    main()
