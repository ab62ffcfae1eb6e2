#pragma once
// Next-token sampling from one row of fp32 logits, with vLLM's meanings for temperature, top-k,
// top-p and min-p, and a counter-based RNG so that a request's draws depend only on its seed and
// the output index: the same tokens alone or in any batch, on any backend.
#include <cstdint>

#include "sampling/sampling_params.h"

namespace origami {

// Uniform in [0, 1) from (seed, index), 24 random bits. Pure integer math (two splitmix64
// finalizer rounds) so that the CUDA sampling kernel computes bit-identical values:
//   key  = mix64(seed + kGolden)
//   bits = mix64(key + (index + 1) * kGolden)
//   u    = float(bits >> 40) * 2^-24
// with kGolden = 0x9E3779B97F4A7C15 and mix64 the splitmix64 finalizer. For one seed, distinct
// indices give distinct 64-bit states (the map is a bijection of index).
float sampling_uniform(uint64_t seed, uint64_t index);

// The splitmix64 finalizer; a bijection on 64-bit words.
uint64_t mix64(uint64_t z);

// The seed a request samples with: its own `params.seed` when set, else one derived from the
// engine's seed and a per-engine request counter, so unseeded requests differ from each other
// yet an engine run with the same engine seed and request order reproduces them.
uint64_t resolve_seed(const SamplingParams& params, uint64_t engine_seed, uint64_t request_counter);

// What greedy_token() and sample_token() return, instead of a token, for a row whose largest
// logit (NaN ignored) is not finite: every logit NaN or -inf, or one +inf. Such logits mean the
// model's arithmetic broke down (NaN or overflowing weights); the engine fails the request
// rather than decoding token 0 forever. The CUDA sampling kernel writes the same value.
inline constexpr int32_t kNonFiniteLogits = -2;

// Argmax of logits[vocab_size]; NaN counts as -inf, ties go to the lowest id; kNonFiniteLogits
// when the largest logit is not finite.
int32_t greedy_token(const float* logits, int vocab_size);

// Samples the next token from logits[vocab_size] (fp32).
//
// Greedy (temperature < SamplingParams::kGreedyTemperature, or top_k == 1): greedy_token().
// Otherwise, in vLLM's order:
//   1. temperature: p = softmax(logits / temperature) over the whole vocabulary;
//   2. min-p on those probabilities: keep p >= min_p * p_max (ratio-based, so it does not matter
//      whether it is taken before or after renormalising);
//   3. top-k: keep the k highest logits (exactly k: ties at the boundary go to the lower id,
//      where vLLM may keep every tied token);
//   4. top-p on the survivors renormalised: in descending order, keep each token whose preceding
//      mass is < top_p, i.e. the smallest prefix with mass >= top_p; the top token always stays;
//   5. one inverse-CDF draw with u = sampling_uniform(seed, sample_index) over the kept tokens
//      renormalised, walked in descending probability, ties by ascending id.
// NaN logits count as -inf; if the largest logit is not finite the result is kNonFiniteLogits.
// Cost: greedy is one pass; top-k selects with a bounded heap and exponentiates only k logits;
// otherwise one exp pass, and the order is never fully sorted: weights are bucketed by their top
// float bits and only the buckets holding the top-p cut and the draw are sorted.
int32_t sample_token(const float* logits, int vocab_size, const SamplingParams& params, uint64_t seed,
                     uint64_t sample_index);

}  // namespace origami
