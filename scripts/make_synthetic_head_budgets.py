#!/usr/bin/env python3
"""Writes a SYNTHETIC head-budget file (origami-head-budgets, version 1) for a model shape.

`origami calibrate` measures budgets on a real model; the shapes we benchmark throughput on
(Qwen3-8B, Qwen3-32B) run with --dummy-weights, whose attention carries no information to
calibrate. This script draws per-head ratios with the spread calibrations show instead, so that
throughput runs exercise the non-uniform layout (clustering, ragged group tables, the split
map) at a realistic memory share. Its output is a benchmark fixture, never a quality claim: the
file's calibration.scorer is "synthetic".

The distribution: B = min(1, floor + Beta(a, b) * span), seeded, so a few heads per model keep
most of the context (retrieval-like heads) and most keep little. The defaults give a mean of
about 0.3 with heads from about 0.1 to about 0.9, the range the tiny model's calibration and
TANGRAM's Fig. 3 show.

  scripts/make_synthetic_head_budgets.py --config ../shared/configs/qwen3-8b/config.json \
      --output budgets-8b.json [--seed 1] [--floor 0.08] [--alpha 1.2] [--beta 3.5] [--span 0.9]
"""
import argparse
import json
import random
import statistics
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="the model's config.json")
    p.add_argument("--output", required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--floor", type=float, default=0.08)
    p.add_argument("--alpha", type=float, default=1.2)
    p.add_argument("--beta", type=float, default=3.5)
    p.add_argument("--span", type=float, default=0.9)
    a = p.parse_args()
    if not (0 < a.floor < 1 and a.span > 0 and a.alpha > 0 and a.beta > 0):
        sys.exit("make_synthetic_head_budgets: --floor must be in (0, 1), --span, --alpha, --beta > 0")
    with open(a.config) as f:
        cfg = json.load(f)
    try:
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads", heads))
        hidden = int(cfg["hidden_size"])
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        model = {"model_type": cfg["model_type"], "num_layers": layers, "num_kv_heads": kv_heads,
                 "num_attention_heads": heads, "head_dim": head_dim, "hidden_size": hidden,
                 "vocab_size": int(cfg["vocab_size"])}
    except KeyError as e:
        sys.exit(f"make_synthetic_head_budgets: {a.config}: missing {e}")
    rng = random.Random(a.seed)
    ratios = [[min(1.0, a.floor + rng.betavariate(a.alpha, a.beta) * a.span) for _ in range(kv_heads)]
              for _ in range(layers)]
    doc = {"format": "origami-head-budgets", "version": 1, "model": model,
           "calibration": {"scorer": "synthetic", "alpha": 0.0, "rho": statistics.fmean(sum(ratios, [])),
                           "samples": 1, "sample_tokens": [1]},
           "ratios": ratios, "mean": ratios, "std": [[0.0] * kv_heads for _ in range(layers)]}
    with open(a.output, "w") as f:
        json.dump(doc, f)
        f.write("\n")
    flat = sum(ratios, [])
    print(f"{a.output}: {layers} x {kv_heads} synthetic ratios, min {min(flat):.3f} mean {statistics.fmean(flat):.3f} "
          f"max {max(flat):.3f}")


if __name__ == "__main__":
    main()
