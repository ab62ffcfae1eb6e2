#pragma once
// The fused q/k RMSNorm + RoPE kernel against its CPU twin, for the CUDA kernel tests.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cuda/elementwise_kernels.h"
#include "cuda_test_util.h"
#include "model/config.h"

namespace origami::cuda::testing {

// One fused projection output [tokens, (nh + 2 nkv) * head_dim] through launch_qk_norm_rope,
// checked against cpu::rms_norm + cpu::apply_rope: q and k within `tol` (relative), v copied
// exactly. `positions` gives one position per token; empty = random positions in [0, 4096] for
// `num_tokens` tokens.
inline void check_qk_norm_rope(int num_tokens, int nh, int nkv, int head_dim, bool qk_norm, const RopeConfig& rope,
                               std::vector<int32_t> positions, double tol, std::mt19937& rng) {
  const int cols = (nh + 2 * nkv) * head_dim, half = head_dim / 2;
  const std::vector<float> qkv = random_bf16_values(static_cast<size_t>(num_tokens) * cols, rng);
  const std::vector<float> q_norm = random_bf16_values(head_dim, rng), k_norm = random_bf16_values(head_dim, rng);
  if (positions.empty()) {
    positions.resize(static_cast<size_t>(num_tokens));
    for (int& p : positions) p = static_cast<int>(rng() % 4097);
  }
  ASSERT_EQ(static_cast<int>(positions.size()), num_tokens);
  const std::vector<float> inv_freq = cpu::rope_inv_freq(rope, head_dim);
  DeviceBuffer<bf16> d_qkv(to_device_bf16(qkv)), d_qn(to_device_bf16(q_norm)), d_kn(to_device_bf16(k_norm));
  DeviceBuffer<int32_t> d_pos(positions);
  DeviceBuffer<float> d_freq(inv_freq);
  DeviceBuffer<bf16> d_q(static_cast<size_t>(num_tokens) * nh * head_dim);
  DeviceBuffer<bf16> d_k(static_cast<size_t>(num_tokens) * nkv * head_dim), d_v(static_cast<size_t>(num_tokens) * nkv * head_dim);
  d_q.poison();
  d_k.poison();
  d_v.poison();
  RopeArgs a;
  a.qkv = d_qkv.get();
  a.qkv_stride = cols;
  a.positions = d_pos.get();
  a.inv_freq = d_freq.get();
  a.q_norm = qk_norm ? d_qn.get() : nullptr;
  a.k_norm = qk_norm ? d_kn.get() : nullptr;
  a.eps = 1e-6f;
  a.num_tokens = num_tokens;
  a.num_heads = nh;
  a.num_kv_heads = nkv;
  a.head_dim = head_dim;
  a.q_out = d_q.get();
  a.k_out = d_k.get();
  a.v_out = d_v.get();
  launch_qk_norm_rope(a, nullptr);
  std::vector<float> want_q, want_k, want_v;
  std::vector<float> cs(half), sn(half);
  for (int t = 0; t < num_tokens; ++t) {
    const float* row = qkv.data() + static_cast<size_t>(t) * cols;
    std::vector<float> q(row, row + nh * head_dim), k(row + nh * head_dim, row + (nh + nkv) * head_dim);
    if (qk_norm) {
      cpu::rms_norm(nh, head_dim, q.data(), head_dim, q_norm.data(), 1e-6f, q.data(), head_dim);
      cpu::rms_norm(nkv, head_dim, k.data(), head_dim, k_norm.data(), 1e-6f, k.data(), head_dim);
    }
    cpu::rope_cos_sin(positions[t], inv_freq.data(), half, cs.data(), sn.data());
    cpu::apply_rope(q.data(), nh, head_dim, cs.data(), sn.data());
    cpu::apply_rope(k.data(), nkv, head_dim, cs.data(), sn.data());
    want_q.insert(want_q.end(), q.begin(), q.end());
    want_k.insert(want_k.end(), k.begin(), k.end());
    want_v.insert(want_v.end(), row + (nh + nkv) * head_dim, row + cols);
  }
  const std::string what = std::to_string(num_tokens) + " tokens, " + std::to_string(nh) + "/" + std::to_string(nkv) +
                           " heads, d " + std::to_string(head_dim) + ", norm " + std::to_string(qk_norm);
  EXPECT_LT(rel_err(from_device_bf16(d_q.download()), want_q), tol) << what;
  EXPECT_LT(rel_err(from_device_bf16(d_k.download()), want_k), tol) << what;
  EXPECT_EQ(rel_err(from_device_bf16(d_v.download()), want_v), 0.0) << what;
}

}  // namespace origami::cuda::testing
