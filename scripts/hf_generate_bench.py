#!/usr/bin/env python3
"""Output throughput of HuggingFace transformers' generate() on a random-init model: the baseline
that `origami bench` is compared with in docs/benchmarks.md.

The model is built from a config folder (config.json only, e.g. ../shared/configs/qwen3-8b)
with random weights directly on the GPU in bf16; prompts are random token ids of exactly
--input-len tokens; generation is greedy with min_new_tokens = max_new_tokens = --output-len
(the equivalent of ignore_eos), default attention (sdpa) and the default dynamic KV cache.
One warm-up generate of 8 tokens precedes the timed one. Prints one line starting with
HF_GENERATE (and the same as JSON with --json).

Usage: scripts/hf_generate_bench.py --config DIR [--batch 128] [--input-len 128] [--output-len 1024]
"""
import argparse
import json
import time

import torch
import transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True, help="folder with config.json")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    config = transformers.AutoConfig.from_pretrained(args.config)
    t0 = time.perf_counter()
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.eval()
    init_s = time.perf_counter() - t0
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    ids = torch.randint(0, config.vocab_size, (args.batch, args.input_len), device="cuda", generator=gen)
    mask = torch.ones_like(ids)

    def generate(n):
        with torch.no_grad():
            return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                  do_sample=False, pad_token_id=0)

    generate(8)  # warm-up: kernels, cuBLAS handles, allocator
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = generate(args.output_len)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    new_tokens = (out.shape[1] - args.input_len) * out.shape[0]
    result = {
        "config": args.config, "batch": args.batch, "input_len": args.input_len, "output_len": args.output_len,
        "generated_tokens": int(new_tokens), "wall_seconds": wall, "output_tokens_per_second": new_tokens / wall,
        "model_init_seconds": init_s, "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
        "transformers": transformers.__version__, "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
    }
    assert out.shape[1] == args.input_len + args.output_len, "generation stopped early"
    print(f"HF_GENERATE {args.config.rstrip('/').split('/')[-1]} batch={args.batch} in={args.input_len} "
          f"out={args.output_len}: {new_tokens} tokens in {wall:.2f} s = {new_tokens / wall:.1f} tok/s "
          f"(peak {result['peak_memory_gib']:.1f} GiB, transformers {transformers.__version__})")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
