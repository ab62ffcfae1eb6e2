#!/usr/bin/env python3
"""Writes a SYNTHETIC head-budget file (the format of `origami calibrate`, kv/head_budgets.h) for a
model config, for benchmarks of shapes that have no real weights (`--dummy-weights`): origami's
calibration runs on real models only. Each (layer, KV head) ratio is drawn uniformly from
[--low, --high] (default 0.1-0.6, the spread of a calibration; seeded), mean = ratio, std = 0, and
calibration.scorer = "synthetic" says what it is. Never use it for quality results.

  python3 scripts/lib/synthetic_head_budgets.py CONFIG_DIR OUT.json [--low 0.1] [--high 0.6] [--seed 7]
"""
import argparse
import json
import os
import random


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config_dir")
    ap.add_argument("out")
    ap.add_argument("--low", type=float, default=0.1)
    ap.add_argument("--high", type=float, default=0.6)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    if not 0.0 < a.low <= a.high <= 1.0:
        raise SystemExit(f"need 0 < low <= high <= 1, got {a.low}, {a.high}")
    with open(os.path.join(a.config_dir, "config.json")) as f:
        c = json.load(f)
    c = c.get("text_config", c)
    layers, kv = c["num_hidden_layers"], c.get("num_key_value_heads", c["num_attention_heads"])
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    rng = random.Random(a.seed)
    ratios = [[round(rng.uniform(a.low, a.high), 4) for _ in range(kv)] for _ in range(layers)]
    out = {
        "format": "origami-head-budgets",
        "version": 1,
        "model": {"model_type": c["model_type"], "num_layers": layers, "num_kv_heads": kv,
                  "num_attention_heads": c["num_attention_heads"], "head_dim": head_dim,
                  "hidden_size": c["hidden_size"], "vocab_size": c["vocab_size"]},
        "calibration": {"scorer": "synthetic", "alpha": 0.0, "rho": 0.25, "samples": 1, "sample_tokens": [4096]},
        "ratios": ratios,
        "mean": ratios,
        "std": [[0.0] * kv for _ in range(layers)],
    }
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
