#pragma once
// fp32 building blocks of the CPU forward pass. Every kernel computes each output row with a
// reduction order that depends only on that row's inputs (never on how many rows are in the call
// or where the row sits), so a sequence's result is bit-identical alone, batched or chunked.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cpu/cpu_thread_pool.h"
#include "model/config.h"

namespace origami::cpu {

// C[m, n] = sum_k A[m, k] * W[n, k] (+ bias[n]): a batch of rows times a Linear weight in HF
// layout ([out_features, in_features]). Row strides lda / ldw / ldc are in elements.
// Each C element is one dot product over k with a fixed lane-split accumulation, so its value
// does not depend on m, on the row's index, on the threads or on the blocking. pool may be null.
void gemm_nt(int m, int n, int k, const float* a, size_t lda, const float* w, size_t ldw, const float* bias,
             float* c, size_t ldc, ThreadPool* pool);

// The dot product gemm_nt computes for one (row, column) pair, exposed so attention and tests
// share exactly the same arithmetic.
float dot(const float* a, const float* b, int k);

// out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * w, for `rows` rows of length n (strides in elements).
// In place is allowed (out == x).
void rms_norm(int rows, int n, const float* x, size_t ldx, const float* w, float eps, float* out, size_t ldo);

// Inverse frequencies of rotary embeddings, [head_dim / 2], as the HF reference computes them in
// fp32 (default) or with Llama 3.1 frequency smoothing (type "llama3").
std::vector<float> rope_inv_freq(const RopeConfig& rope, int head_dim);

// cos / sin of the rotary angles of logical `position`: [head_dim / 2] each. The angle is the fp32
// product position * inv_freq[i], as in the reference.
void rope_cos_sin(int position, const float* inv_freq, int half_dim, float* cos_out, float* sin_out);

// Rotates `num_heads` heads of one token in place ([num_heads, head_dim], contiguous), HF
// rotate_half convention: pairs (i, i + head_dim / 2) share angle i.
void apply_rope(float* x, int num_heads, int head_dim, const float* cos, const float* sin);

// out[i] = silu(gate[i]) * up[i] for `rows` rows of length n; gate and up are row-strided views.
void silu_mul(int rows, int n, const float* gate, const float* up, size_t ld_in, float* out, size_t ld_out);

// x[i] += y[i] over `count` elements.
void add_inplace(float* x, const float* y, size_t count);

}  // namespace origami::cpu
