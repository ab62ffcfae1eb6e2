// The CUDA gate (src/backend/cuda/sink_gate.h) against the CPU reference gates::gate_scores
// (double internals, fp32 weights) on random hidden states (bf16-exact, as the backend's normed
// rows are), for the shipped origami-tiny-qwen3 gates and for random gates of the tiny shape, the
// Qwen3-8B shape and an odd one (G 3, D' 8, 5 sinks); sink keys, biases and norm weights are drawn
// too, so that every term counts:
//   - against the reference run on the projection weights rounded to bf16 (the GPU's GEMM
//     operands): max |diff| < 2e-4 (what is left is fp32 against double and the GEMM's summation
//     order);
//   - against the reference on the fp32 weights: max |diff| < 6e-3 and mean < 5e-4 (the cost of
//     bf16 projection weights: the two CPU references alone differ by up to 2.1e-3, mean 1.5e-4);
//   - the scores land in F at each (table, token)'s slot, one table or head tables (head groups),
//     negative slots skipped, nothing else written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "backend/cuda/gemm.h"
#include "backend/cuda/sink_gate.h"
#include "cuda_test_util.h"
#include "gates/gate_weights.h"
#include "gates/sink_attention_gate.h"
#include "model/config.h"

namespace origami::cuda {
namespace {

using testing::DeviceBuffer;
using testing::random_bf16_values;
using testing::shared_dir;
using testing::to_device_bf16;

std::string tiny_gates() { return std::string(ORIGAMI_SOURCE_DIR) + "/assets/gates/origami-tiny-qwen3.safetensors"; }

ModelConfig tiny_config() {
  auto c = load_model_config(shared_dir() + "/models/origami-tiny-qwen3");
  EXPECT_TRUE(c.has_value()) << c.status().to_string();
  return c.has_value() ? *c : ModelConfig{};
}

// Random gates whose every parameter matters: the reference initialization, then sink keys,
// biases and norm weights drawn as well (trained gates have all of them away from their start).
gates::GateWeights random_gates(const gates::GateShape& shape, uint64_t seed) {
  gates::GateWeights w = gates::init_gates(shape, seed);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  for (gates::GateLayer& l : w.layers) {
    for (float& x : l.sink_keys) x = normal(rng);
    for (float& x : l.bias) x = uniform(rng) < 0.25f ? 0.0f : 4.0f * uniform(rng);
    for (float& x : l.q_norm) x = 0.5f + 1.5f * uniform(rng);
    for (float& x : l.k_norm) x = 0.5f + 1.5f * uniform(rng);
  }
  return w;
}

// The same gates with the projection weights rounded to bf16, as the GPU's GEMM reads them.
gates::GateWeights bf16_projections(gates::GateWeights w) {
  for (gates::GateLayer& l : w.layers)
    for (std::vector<float>* v : {&l.q_weight, &l.k_weight})
      for (float& x : *v) x = bf16_to_f32(f32_to_bf16(x));
  return w;
}

struct Errors {
  double max_rounded = 0, max_fp32 = 0, mean_fp32 = 0;
};

// Every layer of `w` over `rows` random hidden states, against both references.
Errors check_gates(const gates::GateWeights& w, int rows, uint32_t seed) {
  const gates::GateShape& s = w.shape;
  const int H = s.num_kv_heads;
  std::mt19937 rng(seed);
  // Rows of different scales, as the normed hidden states (norm weights) have.
  std::vector<float> hidden(static_cast<size_t>(rows) * s.hidden_size);
  for (int t = 0; t < rows; ++t) {
    const std::vector<float> row = random_bf16_values(s.hidden_size, rng, 0.25f + (t % 7) * 0.5f);
    std::copy(row.begin(), row.end(), hidden.begin() + static_cast<size_t>(t) * s.hidden_size);
  }
  const gates::GateWeights rounded = bf16_projections(w);
  DeviceSinkGates dev;
  Status st = dev.load(w);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_TRUE(dev.reserve(rows).is_ok());
  Gemm gemm;
  gemm.set_stream(nullptr);
  DeviceBuffer<__nv_bfloat16> d_hidden(to_device_bf16(hidden));
  DeviceBuffer<float> d_scores(static_cast<size_t>(rows) * H);
  Errors e;
  double sum = 0;
  size_t count = 0;
  for (int l = 0; l < s.num_layers; ++l) {
    d_scores.poison();
    GateScoreDestination dst;
    dst.token_scores = d_scores.get();
    dev.enqueue(l, d_hidden.get(), rows, dst, gemm, nullptr);
    const std::vector<float> got = d_scores.download();
    std::vector<float> want_rounded(got.size()), want(got.size());
    gates::gate_scores(s, rounded.layers[l], hidden.data(), rows, s.hidden_size, want_rounded.data());
    gates::gate_scores(s, w.layers[l], hidden.data(), rows, s.hidden_size, want.data());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(std::isfinite(got[i])) << "layer " << l << " score " << i << " not written";
      if (!std::isfinite(got[i])) return e;
      e.max_rounded = std::max(e.max_rounded, std::fabs(static_cast<double>(got[i]) - want_rounded[i]));
      const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
      e.max_fp32 = std::max(e.max_fp32, d);
      sum += d;
      ++count;
    }
  }
  e.mean_fp32 = sum / std::max<size_t>(count, 1);
  return e;
}

void expect_close(const Errors& e, const std::string& what) {
  std::printf("[gate] %s: max |gpu - cpu| %.2e on bf16-rounded projections; %.2e max, %.2e mean on fp32 ones\n",
              what.c_str(), e.max_rounded, e.max_fp32, e.mean_fp32);
  EXPECT_LT(e.max_rounded, 2e-4) << what;
  EXPECT_LT(e.max_fp32, 6e-3) << what;
  EXPECT_LT(e.mean_fp32, 5e-4) << what;
}

TEST(CudaSinkGate, ShippedGatesMatchCpuReference) {
  const ModelConfig mc = tiny_config();
  auto w = gates::load_gates(tiny_gates(), mc);
  ASSERT_TRUE(w.has_value()) << w.status().to_string();
  expect_close(check_gates(*w, 333, 1), "shipped tiny-qwen3 gates");
}

TEST(CudaSinkGate, RandomGatesMatchCpuReference) {
  const ModelConfig mc = tiny_config();
  expect_close(check_gates(random_gates(gates::gate_shape_for(mc), 7), 257, 2), "random gates, tiny shape");
  // The Qwen3-8B shape (H 8, G 4, D 4096) on two layers: long dot products, four queries per head.
  gates::GateShape big;
  big.num_layers = 2;
  big.num_kv_heads = 8;
  big.group_size = 4;
  big.hidden_size = 4096;
  expect_close(check_gates(random_gates(big, 9), 130, 3), "random gates, Qwen3-8B shape");
  // A group that is no power of two (padding lanes of the kernel), another rank and sink count.
  gates::GateShape odd;
  odd.num_layers = 1;
  odd.num_kv_heads = 3;
  odd.group_size = 3;
  odd.hidden_size = 512;
  odd.rank = 8;
  odd.num_sinks = 5;
  expect_close(check_gates(random_gates(odd, 13), 77, 4), "random gates, G 3, D' 8, 5 sinks");
}

// F destinations: per (table, token) slots, head tables of head groups, -1 skipped.
TEST(CudaSinkGate, ScoresLandInTheirSlots) {
  const ModelConfig mc = tiny_config();
  const gates::GateWeights w = random_gates(gates::gate_shape_for(mc), 11);
  const int H = w.shape.num_kv_heads, rows = 45, bs = 16, num_blocks = 12;
  std::mt19937 rng(4);
  const std::vector<float> hidden = random_bf16_values(static_cast<size_t>(rows) * w.shape.hidden_size, rng);
  DeviceSinkGates dev;
  ASSERT_TRUE(dev.load(w).is_ok());
  ASSERT_TRUE(dev.reserve(rows).is_ok());
  Gemm gemm;
  gemm.set_stream(nullptr);
  DeviceBuffer<__nv_bfloat16> d_hidden(to_device_bf16(hidden));
  DeviceBuffer<float> d_scores(static_cast<size_t>(rows) * H);
  for (const bool grouped : {false, true}) {
    SCOPED_TRACE(grouped ? "head groups" : "one table");
    // Grouped: 2 tables of 2 heads each, heads {0, 2} and {1, 3} (non-adjacent), pages of 2 heads.
    const int tables = grouped ? 2 : 1, page_heads = grouped ? 2 : H;
    const std::vector<int32_t> head_table = {0, 1, 0, 1}, head_slot = {0, 0, 1, 1};
    // Distinct slots over all tables (the groups' pages are their own), every 5th token skipped.
    std::vector<int32_t> all(num_blocks * bs);
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int32_t>(i);
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<int32_t> slots(static_cast<size_t>(tables) * rows);
    for (size_t i = 0; i < slots.size(); ++i) slots[i] = i % 5 == 4 ? -1 : all[i];
    DeviceBuffer<int32_t> d_slots(slots), d_table(head_table), d_slot(head_slot);
    DeviceBuffer<float> d_f(static_cast<size_t>(num_blocks) * page_heads * bs);
    d_f.poison();
    GateScoreDestination dst;
    dst.token_scores = d_scores.get();
    dst.f = d_f.get();
    dst.slot_mapping = d_slots.get();
    dst.head_table = grouped ? d_table.get() : nullptr;
    dst.head_slot = grouped ? d_slot.get() : nullptr;
    dst.page_heads = page_heads;
    dst.block_size = bs;
    dev.enqueue(1, d_hidden.get(), rows, dst, gemm, nullptr);
    const std::vector<float> scores = d_scores.download(), f = d_f.download();
    std::vector<char> written(f.size(), 0);
    for (int t = 0; t < rows; ++t)
      for (int h = 0; h < H; ++h) {
        const int tb = grouped ? head_table[h] : 0, in_page = grouped ? head_slot[h] : h;
        const int slot = slots[static_cast<size_t>(tb) * rows + t];
        if (slot < 0) continue;
        const size_t at = (static_cast<size_t>(slot / bs) * page_heads + in_page) * bs + slot % bs;
        EXPECT_EQ(f[at], scores[static_cast<size_t>(t) * H + h]) << "token " << t << " head " << h;
        written[at] = 1;
      }
    for (size_t i = 0; i < f.size(); ++i) {
      if (!written[i]) {
        EXPECT_TRUE(std::isnan(f[i])) << "F[" << i << "] written though no entry maps there";
      }
    }
  }
}

TEST(CudaSinkGate, RefusesRanksBeyondTheKernel) {
  gates::GateShape s = gates::gate_shape_for(tiny_config(), kMaxDeviceGateRank + 1);
  s.num_layers = 1;
  DeviceSinkGates dev;
  const Status st = dev.load(gates::init_gates(s, 1));
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("rank"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace origami::cuda
