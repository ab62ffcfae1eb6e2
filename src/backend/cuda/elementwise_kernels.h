#pragma once
// Launchers of the CUDA backend's element-wise kernels (embedding, norms, RoPE, activations).
// Tensors are device pointers, row-major; shapes are given in the comments. Every launcher only
// enqueues work on `stream` (no synchronisation, no allocation), so it can be captured in a graph.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kv_cache_write.h"

namespace origami::cuda {

using bf16 = __nv_bfloat16;

// residual[t, :] = table[ids[t], :] in fp32.   table [vocab, hidden], residual [n, hidden]
void launch_embedding_gather(const bf16* table, const int32_t* ids, int n, int hidden, float* residual,
                             cudaStream_t stream);

// residual += delta (when delta is not null), then out = rmsnorm(residual) * weight.
// residual [n, hidden] fp32 (updated in place), delta [n, hidden] bf16, weight [hidden], out [n, hidden].
void launch_add_rmsnorm(float* residual, const bf16* delta, const bf16* weight, float eps, int n, int hidden,
                        bf16* out, cudaStream_t stream);

// Per token: optional per-head RMSNorm of q and k (Qwen3; q_norm/k_norm null to skip), then
// rotate-half RoPE at positions[t] with frequencies inv_freq[head_dim / 2] (fp32, built on the host).
// qkv [n, qkv_stride] holds q (num_heads heads), then k (num_kv_heads), then v, each head_dim wide.
// Writes q to q_out [n, num_heads, head_dim], k to k_out [n, num_kv_heads, head_dim] and v to
// v_out [n, num_kv_heads, head_dim] (contiguous, as the attention and KV-write kernels read them).
//
// Optionally the KV write is fused in, saving the separate write_kv_cache(_fp8) launch per layer
// (head_dim 64 and 128 only: qk_norm_rope_writes_kv): when kv.slot_mapping is set, each roped k
// head (the bf16 values k_out would hold) and each v head go straight into the paged cache,
// stored bit for bit as write_kv_cache (into kv.k_cache / kv.v_cache) or, when kv_fp8.k_codes is
// set, write_kv_cache_fp8 would store them from k_out / v_out. kv.k / kv.v are unused; kv's
// num_tokens, num_kv_heads and head_dim must equal these. k_out / v_out may then be null (skipped).
struct RopeArgs {
  const bf16* qkv = nullptr;
  int qkv_stride = 0;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  const bf16* q_norm = nullptr;
  const bf16* k_norm = nullptr;
  float eps = 1e-6f;
  int num_tokens = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  bf16* q_out = nullptr;
  bf16* k_out = nullptr;
  bf16* v_out = nullptr;
  KVWriteArgs kv;
  KVWriteFp8Out kv_fp8;
};
void launch_qk_norm_rope(const RopeArgs& args, cudaStream_t stream);

// Whether launch_qk_norm_rope can write the KV cache itself for heads of this size.
inline bool qk_norm_rope_writes_kv(int head_dim) { return head_dim == 64 || head_dim == 128; }

// out[t, i] = silu(gate_up[t, i]) * gate_up[t, inter + i].   gate_up [n, 2 * inter], out [n, inter]
void launch_silu_and_mul(const bf16* gate_up, int n, int inter, bf16* out, cudaStream_t stream);

// x[t, c] += bias[c].   x [n, cols], bias [cols]
void launch_bias_add(bf16* x, const bf16* bias, int n, int cols, cudaStream_t stream);

// out[r, :] = in[rows[r], :].   in [*, cols], rows [num_rows], out [num_rows, cols]
void launch_gather_rows(const bf16* in, const int32_t* rows, int num_rows, int cols, bf16* out,
                        cudaStream_t stream);

// Fills `n` bf16 values with a deterministic pseudo-random normal(0, std) stream keyed by `seed`
// (or with `constant` when std == 0): device-side weights for --dummy-weights.
void launch_fill_random_bf16(bf16* out, size_t n, float std, float constant, uint64_t seed, cudaStream_t stream);

}  // namespace origami::cuda
