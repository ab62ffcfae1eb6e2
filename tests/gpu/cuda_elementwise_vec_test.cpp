// The vectorised paths of the element-wise kernels at real model sizes, against the CPU twins
// (cuda_kernels_test.cpp covers odd sizes, which take the scalar paths): add+RMSNorm with 1, 2
// and 4 chunks of 8 per thread (hidden 1000..8192) and the fallbacks past 8192 and for unaligned
// pointers; SiLU*up at 8B intermediate sizes; q/k-norm + RoPE with the 8B head counts (several
// warp groups per token) at positions up to 40000.
#include <gtest/gtest.h>

#include <random>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cuda/elementwise_kernels.h"
#include "cuda_test_util.h"

namespace origami::cuda {
namespace {

using testing::DeviceBuffer;
using testing::from_device_bf16;
using testing::random_bf16_values;
using testing::rel_err;
using testing::to_device_bf16;

// bf16 output rounding is ~2^-9 relative per element; the norm of the error is well under this.
constexpr double kTol = 4e-3;

// `offset` floats/bf16 of padding before every buffer: 1 makes the pointers unaligned.
void check_add_rmsnorm(int hidden, int rows, bool with_delta, int offset, std::mt19937& rng) {
  const size_t n = static_cast<size_t>(rows) * hidden;
  std::vector<float> residual = random_bf16_values(n + offset, rng);
  const std::vector<float> delta = random_bf16_values(n + offset, rng);
  const std::vector<float> weight = random_bf16_values(hidden + offset, rng);
  DeviceBuffer<float> d_res(residual);
  DeviceBuffer<bf16> d_delta(to_device_bf16(delta)), d_w(to_device_bf16(weight)), d_out(n + offset);
  d_out.poison();
  launch_add_rmsnorm(d_res.get() + offset, with_delta ? d_delta.get() + offset : nullptr, d_w.get() + offset, 1e-6f,
                     rows, hidden, d_out.get() + offset, nullptr);
  if (with_delta)
    for (size_t i = offset; i < n + offset; ++i) residual[i] += delta[i];
  std::vector<float> want(n);
  cpu::rms_norm(rows, hidden, residual.data() + offset, hidden, weight.data() + offset, 1e-6f, want.data(), hidden);
  std::vector<float> got = from_device_bf16(d_out.download());
  got.erase(got.begin(), got.begin() + offset);
  EXPECT_LT(rel_err(got, want), kTol) << "hidden " << hidden << " rows " << rows << " offset " << offset;
  std::vector<float> got_res = d_res.download();
  EXPECT_EQ(rel_err(got_res, residual), 0.0) << "residual, hidden " << hidden << " offset " << offset;
}

TEST(CudaElementwiseVec, AddRmsNormAtModelSizes) {
  std::mt19937 rng(11);
  for (int hidden : {8, 1000, 2048, 4096, 5120, 8192, 8200})
    for (int rows : {1, 3, 130})
      for (bool with_delta : {false, true}) check_add_rmsnorm(hidden, rows, with_delta, 0, rng);
  for (int hidden : {4096, 5120}) check_add_rmsnorm(hidden, 5, true, 1, rng);  // unaligned: scalar path
}

TEST(CudaElementwiseVec, SiluAndMulAtModelSizes) {
  std::mt19937 rng(12);
  for (int inter : {8, 3072, 12288, 14336})
    for (int rows : {1, 64}) {
      const std::vector<float> gu = random_bf16_values(static_cast<size_t>(rows) * 2 * inter, rng, 2.0f);
      DeviceBuffer<bf16> d_in(to_device_bf16(gu)), d_out(static_cast<size_t>(rows) * inter);
      d_out.poison();
      launch_silu_and_mul(d_in.get(), rows, inter, d_out.get(), nullptr);
      std::vector<float> want(static_cast<size_t>(rows) * inter);
      cpu::silu_mul(rows, inter, gu.data(), gu.data() + inter, 2 * inter, want.data(), inter);
      EXPECT_LT(rel_err(from_device_bf16(d_out.download()), want), kTol) << inter << " x " << rows;
    }
}

TEST(CudaElementwiseVec, QkNormRopeWithManyHeads) {
  std::mt19937 rng(13);
  RopeConfig rope;
  rope.theta = 1e6f;
  for (int head_dim : {64, 128})
    for (bool qk_norm : {false, true}) {
      const int nh = 32, nkv = 8, tokens = 5, cols = (nh + 2 * nkv) * head_dim, half = head_dim / 2;
      const std::vector<float> qkv = random_bf16_values(static_cast<size_t>(tokens) * cols, rng);
      const std::vector<float> q_norm = random_bf16_values(head_dim, rng), k_norm = random_bf16_values(head_dim, rng);
      const std::vector<int32_t> positions = {0, 1, 4095, 17, 40000};
      const std::vector<float> inv_freq = cpu::rope_inv_freq(rope, head_dim);
      DeviceBuffer<bf16> d_qkv(to_device_bf16(qkv)), d_qn(to_device_bf16(q_norm)), d_kn(to_device_bf16(k_norm));
      DeviceBuffer<int32_t> d_pos(positions);
      DeviceBuffer<float> d_freq(inv_freq);
      DeviceBuffer<bf16> d_q(static_cast<size_t>(tokens) * nh * head_dim);
      DeviceBuffer<bf16> d_k(static_cast<size_t>(tokens) * nkv * head_dim), d_v(static_cast<size_t>(tokens) * nkv * head_dim);
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
      a.num_tokens = tokens;
      a.num_heads = nh;
      a.num_kv_heads = nkv;
      a.head_dim = head_dim;
      a.q_out = d_q.get();
      a.k_out = d_k.get();
      a.v_out = d_v.get();
      launch_qk_norm_rope(a, nullptr);
      std::vector<float> want_q, want_k, want_v, cs(half), sn(half);
      for (int t = 0; t < tokens; ++t) {
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
      // The GPU rounds the normalised head to bf16 before rotating (as HF does): 2 roundings.
      EXPECT_LT(rel_err(from_device_bf16(d_q.download()), want_q), 2 * kTol) << "d " << head_dim << " norm " << qk_norm;
      EXPECT_LT(rel_err(from_device_bf16(d_k.download()), want_k), 2 * kTol) << "d " << head_dim << " norm " << qk_norm;
      EXPECT_EQ(rel_err(from_device_bf16(d_v.download()), want_v), 0.0);
    }
}

}  // namespace
}  // namespace origami::cuda
