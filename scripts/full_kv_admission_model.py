#!/usr/bin/env python3
"""Fluid model of full-KV admission at max load: equal requests queued at once, waves under
--reserve-full-kv (TensorRT-LLM's GUARANTEED_NO_EVICT) against admissions paced so that requests'
ages spread (a lookahead reservation that never preempts: a request is admitted only if the pool
covers every running request's growth until it finishes, at a capped number of admissions a step).

The step time is a model, calibrated on the H100 runs of docs/benchmarks.md (fullres2k3000:
batch ~469, ~540k KV entries, ~23 ms a step):  step_ms = fixed + per_seq * batch + KV bytes / bandwidth.
It answers one question: how much of full KV's gap could a scheduler close, with no kernel faster?

  scripts/full_kv_admission_model.py [--requests 3000 --prompt 128 --output 2048 --pool-tokens 1020544]
"""
import argparse


def step_ms(batch, kv_tokens, a):
    return a.fixed_ms + a.per_seq_ms * batch + kv_tokens * a.entry_bytes / a.bandwidth * 1e3


def fits(running, new, a):
    """Whether every future step's KV (each request growing one entry a step until it ends,
    then freeing everything) stays within the pool with `new` admitted."""
    final = a.prompt + a.output
    rem = sorted((final - l, l) for l in running + [new])
    held, count = 0, 0
    for r, l in reversed(rem):  # at the step the request with r steps left ends: those with >= r left
        held += l
        count += 1
        if held + count * r > a.pool_tokens:
            return False
    return True


def simulate(a, rate=None):
    waiting, running, seconds, steps, tokens, credit = a.requests, [], 0.0, 0, 0, 0.0
    while waiting or running:
        credit = credit + rate if rate is not None else float("inf")
        while waiting and credit >= 1 and fits(running, a.prompt, a):
            running.append(a.prompt)
            waiting -= 1
            credit -= 1
        seconds += step_ms(len(running), sum(running), a) / 1e3
        steps += 1
        tokens += len(running)
        running = [l + 1 for l in running if l + 1 < a.prompt + a.output]
    return tokens / seconds, steps


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--output", type=int, default=2048)
    p.add_argument("--pool-tokens", type=int, default=469 * 2176, help="KV entries the pool holds")
    p.add_argument("--fixed-ms", type=float, default=2.5, help="weights-bound part of a step")
    p.add_argument("--per-seq-ms", type=float, default=0.0118, help="compute-bound GEMM time per sequence")
    p.add_argument("--entry-bytes", type=float, default=67.6e3, help="FP8 KV bytes per entry, all layers")
    p.add_argument("--bandwidth", type=float, default=2.6e12, help="bytes/s attention reads at")
    a = p.parse_args()
    for name in ("requests", "prompt", "output", "pool_tokens"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("fixed_ms", "per_seq_ms", "entry_bytes", "bandwidth"):
        if not getattr(a, name) >= 0 or (name == "bandwidth" and a.bandwidth == 0):
            p.error(f"--{name.replace('_', '-')} must be {'positive' if name == 'bandwidth' else 'non-negative'}")
    # A request that the pool cannot hold whole is never admitted: the model would wait forever.
    if a.prompt + a.output > a.pool_tokens:
        p.error(f"a request's {a.prompt} + {a.output} entries exceed the pool's {a.pool_tokens}")
    base, base_steps = simulate(a)
    print(f"waves (reserve full KV): {base:,.0f} tok/s, {base_steps} steps")
    steady = a.pool_tokens / (a.output * (a.prompt + a.output / 2))  # admissions a step that fill the pool
    for f in (0.8, 0.9, 1.0, 1.1, 1.2):
        tps, steps = simulate(a, rate=steady * f)
        print(f"paced at {f:.1f} x the steady rate ({steady * f:.3f} a step): {tps:,.0f} tok/s "
              f"({tps / base:.3f}x), {steps} steps")


if __name__ == "__main__":
    main()
