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
#include "rope_check.h"

namespace origami::cuda {
namespace {

using testing::check_qk_norm_rope;
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
    for (bool qk_norm : {false, true})
      // The GPU rounds the normalised head to bf16 before rotating (as HF does): 2 roundings.
      check_qk_norm_rope(5, 32, 8, head_dim, qk_norm, rope, {0, 1, 4095, 17, 40000}, 2 * kTol, rng);
}

}  // namespace
}  // namespace origami::cuda
