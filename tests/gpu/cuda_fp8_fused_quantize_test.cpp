// The FP8 activation quantization fused into its producers (fp8_fused_kernels.h) against the
// unfused pair it replaces, bit for bit: launch_add_rmsnorm / launch_silu_and_mul, then
// launch_quantize_rows_fp8 (or, for widths that kernel does not take, the host twin
// quantize_rows_fp8, which matches it bit for bit: cuda_fp8_test). Then the engine: tiny-qwen3
// with FP8 projections gives the same logits and log-probabilities, bit for bit, with
// BackendOptions::fuse_fp8_quantize on and off, prefill and decode, CUDA graphs on and off,
// dynamic and static (ModelOpt checkpoint) activation scales.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_factory.h"
#include "backend/cuda/elementwise_kernels.h"
#include "backend/cuda/fp8_fused_kernels.h"
#include "backend/cuda/fp8_kernels.h"
#include "core/fp8.h"
#include "cuda_test_util.h"
#include "unit/fp8_checkpoint_fixture.h"
#include "unit/model_test_util.h"

namespace origami::cuda {
namespace {

using testing::DeviceBuffer;
using bf16 = __nv_bfloat16;

constexpr float kStaticScale = 0.01f;  // small enough that the outliers saturate

template <typename T>
std::vector<uint32_t> bits32(const std::vector<T>& v) {
  static_assert(sizeof(T) == 4);
  std::vector<uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * 4);
  return out;
}

std::vector<uint16_t> bits16(const std::vector<bf16>& v) {
  std::vector<uint16_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * 2);
  return out;
}

// The unfused reference's quantization of bf16 rows `x` (device): the device kernel where it
// applies (cols % 8 == 0), else the host twin.
void reference_quantize(const DeviceBuffer<bf16>& x, int rows, int cols, const float* static_scale_dev,
                        DeviceBuffer<uint8_t>& codes, DeviceBuffer<float>& scales) {
  if (cols % 8 == 0) {
    launch_quantize_rows_fp8(x.get(), rows, cols, static_scale_dev, codes.get(), scales.get(), nullptr);
    return;
  }
  const std::vector<float> v = testing::from_device_bf16(x.download());
  std::vector<uint8_t> c(v.size());
  std::vector<float> s(rows, kStaticScale);
  if (static_scale_dev != nullptr)
    quantize_with_scale_fp8(v.data(), v.size(), kStaticScale, c.data());
  else
    quantize_rows_fp8(v.data(), rows, cols, cols, c.data(), s.data());
  codes.upload(c);
  scales.upload(s);
}

// Row 0 carries an outlier; with two rows or more the last row is all zero (its scale is the
// smallest normal, its codes zero).
void add_special_rows(std::vector<float>& v, int rows, int cols, float outlier) {
  v[1 % cols] = bf16_to_f32(f32_to_bf16(outlier));
  if (rows >= 2) std::fill(v.end() - cols, v.end(), 0.0f);
}

struct NormCase {
  int rows, hidden;
};

// residual += delta (or none), rmsnorm * weight, quantized: fused == unfused for the residual, the
// codes, the scales and (when asked for) the bf16 normed rows. Hidden sizes cover every kernel of
// launch_add_rmsnorm: register-resident with 1, 2 and 4 chunks per thread (64, 4096, 5120) and the
// scalar one (16384: too wide; 100: not a multiple of 8).
TEST(Fp8FusedQuantize, AddRmsnormMatchesUnfusedBitForBit) {
  std::mt19937 rng(17);
  DeviceBuffer<float> fixed(std::vector<float>{kStaticScale});
  for (int rows : testing::test_sizes({1, 7, 64, 1024}, {1, 7, 64}))
    for (int hidden : {64, 4096, 5120, 16384, 100}) {
      const size_t n = static_cast<size_t>(rows) * hidden;
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> residual(n);
      for (float& r : residual) r = normal(rng);
      add_special_rows(residual, rows, hidden, 300.0f);
      std::vector<float> delta = testing::random_bf16_values(n, rng, 0.5f);
      if (rows >= 2) std::fill(delta.end() - hidden, delta.end(), 0.0f);
      std::vector<float> weight = testing::random_bf16_values(hidden, rng, 0.3f);
      for (float& w : weight) w = bf16_to_f32(f32_to_bf16(1.0f + w));
      DeviceBuffer<bf16> d_delta(testing::to_device_bf16(delta)), d_weight(testing::to_device_bf16(weight));
      for (bool with_delta : {true, false})
        for (bool with_static : {false, true})
          for (bool keep_normed : {false, true}) {
            const float* static_scale = with_static ? fixed.get() : nullptr;
            const bf16* dp = with_delta ? d_delta.get() : nullptr;
            DeviceBuffer<float> res_ref(residual), res_fused(residual), scales_ref(rows), scales_fused(rows);
            DeviceBuffer<bf16> normed_ref(n), normed_fused(n);
            DeviceBuffer<uint8_t> codes_ref(n), codes_fused(n);
            codes_fused.poison();
            scales_fused.poison();
            normed_fused.poison();
            launch_add_rmsnorm(res_ref.get(), dp, d_weight.get(), 1e-6f, rows, hidden, normed_ref.get(), nullptr);
            reference_quantize(normed_ref, rows, hidden, static_scale, codes_ref, scales_ref);
            launch_add_rmsnorm_quantize_fp8(res_fused.get(), dp, d_weight.get(), 1e-6f, rows, hidden,
                                            Fp8RowsOut{codes_fused.get(), scales_fused.get(), static_scale},
                                            keep_normed ? normed_fused.get() : nullptr, nullptr);
            const std::string where = std::to_string(rows) + "x" + std::to_string(hidden) + " delta " +
                                      std::to_string(with_delta) + " static " + std::to_string(with_static) +
                                      " keep_normed " + std::to_string(keep_normed);
            ASSERT_EQ(bits32(res_fused.download()), bits32(res_ref.download())) << where;
            ASSERT_EQ(codes_fused.download(), codes_ref.download()) << where;
            ASSERT_EQ(bits32(scales_fused.download()), bits32(scales_ref.download())) << where;
            if (keep_normed) {
              ASSERT_EQ(bits16(normed_fused.download()), bits16(normed_ref.download())) << where;
            }
            if (rows >= 2 && !with_static) {  // the all-zero row (its delta is zero too)
              EXPECT_EQ(scales_fused.download().back(), fp8_row_scale(0.0f)) << where;
            }
          }
    }
}

// silu(gate) * up, quantized: fused == unfused for the codes and scales. Intermediate sizes: one
// warp (128), Llama-3-8B (14336), Qwen3-32B (25600), and the fallback kernel's: too wide for
// the register-resident one (33000, register-resident when its rows are shared out over CTAs)
// and not a multiple of 8 (100). Rows: 1 and 7 share each row over a cluster of 8 CTAs, 20 over 4,
// 64 over 2, 1024 run one CTA a row (cluster_rows.h, 132 SMs).
TEST(Fp8FusedQuantize, SiluAndMulMatchesUnfusedBitForBit) {
  std::mt19937 rng(23);
  DeviceBuffer<float> fixed(std::vector<float>{kStaticScale});
  for (int rows : testing::test_sizes({1, 7, 20, 64, 1024}, {1, 7, 20, 64}))
    for (int inter : {128, 14336, 25600, 33000, 100}) {
      const size_t n = static_cast<size_t>(rows) * inter;
      std::vector<float> gate_up = testing::random_bf16_values(2 * n, rng, 2.0f);
      // Row 0: a large activation (silu(30) * 100 ~ 3000); last row: gate and up zero.
      gate_up[1] = 30.0f;
      gate_up[static_cast<size_t>(inter) + 1] = 100.0f;
      if (rows >= 2) std::fill(gate_up.end() - 2 * inter, gate_up.end(), 0.0f);
      DeviceBuffer<bf16> d_gate_up(testing::to_device_bf16(gate_up));
      for (bool with_static : {false, true}) {
        const float* static_scale = with_static ? fixed.get() : nullptr;
        DeviceBuffer<bf16> act(n);
        DeviceBuffer<uint8_t> codes_ref(n), codes_fused(n);
        DeviceBuffer<float> scales_ref(rows), scales_fused(rows);
        codes_fused.poison();
        scales_fused.poison();
        launch_silu_and_mul(d_gate_up.get(), rows, inter, act.get(), nullptr);
        reference_quantize(act, rows, inter, static_scale, codes_ref, scales_ref);
        launch_silu_and_mul_quantize_fp8(d_gate_up.get(), rows, inter,
                                         Fp8RowsOut{codes_fused.get(), scales_fused.get(), static_scale}, nullptr);
        const std::string where = std::to_string(rows) + "x" + std::to_string(inter) + " static " +
                                  std::to_string(with_static);
        ASSERT_EQ(codes_fused.download(), codes_ref.download()) << where;
        ASSERT_EQ(bits32(scales_fused.download()), bits32(scales_ref.download())) << where;
        if (rows >= 2 && !with_static) {
          EXPECT_EQ(scales_fused.download().back(), fp8_row_scale(0.0f)) << where;
        }
      }
    }
}

// ---- the engine: tiny-qwen3 with FP8 projections, fused against unfused ----

constexpr int kBlockSize = 16;
constexpr int kNumBlocks = 256;

std::string tiny_dir() { return testing::shared_dir() + "/models/origami-tiny-qwen3"; }

std::unique_ptr<Backend> make(const testing::Model& m, bool fp8, bool fused, bool graphs) {
  BackendOptions opt;
  opt.device = "cuda";
  opt.enable_cuda_graphs = graphs;
  if (fp8) opt.quantization = WeightQuantization::kFp8;
  opt.fuse_fp8_quantize = fused;
  return testing::make_cuda_backend(m, opt, KVLayout::full(m.config.num_layers, m.config.num_kv_heads,
                                                           m.config.head_dim, kBlockSize, kNumBlocks, DType::kBF16));
}

std::vector<int32_t> token_ids(size_t count, int vocab, int salt) {
  std::vector<int32_t> ids(count);
  for (size_t i = 0; i < count; ++i) ids[i] = static_cast<int32_t>((i * 37 + 11 + 101 * salt) % vocab);
  return ids;
}

// What a run of forced decode steps yields, compared bit for bit.
struct DecodeRecord {
  std::vector<int32_t> tokens;        // sampled (greedy)
  std::vector<uint32_t> logprob_bits;  // the forced token's log-probability, then the top 5's
  std::vector<int32_t> top_tokens;
  bool operator==(const DecodeRecord& o) const {
    return tokens == o.tokens && logprob_bits == o.logprob_bits && top_tokens == o.top_tokens;
  }
};

// `prompts` prefilled together, then `steps` decode steps of one token per sequence (in CUDA
// graphs where the backend has them), each token forced from a fixed sequence and its
// log-probability and the top 5 recorded.
DecodeRecord forced_decode(Backend& backend, const std::vector<std::vector<int32_t>>& prompts, int steps, int vocab) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  std::vector<std::vector<BlockId>> tables(prompts.size());
  BlockId next = 1;
  for (size_t s = 0; s < prompts.size(); ++s)
    for (int i = 0; i * kBlockSize < static_cast<int>(prompts[s].size()) + steps + 1; ++i) tables[s].push_back(next++);
  std::vector<std::vector<int32_t>> forced(prompts.size());
  for (size_t s = 0; s < prompts.size(); ++s) forced[s] = token_ids(steps + 1, vocab, 7 + static_cast<int>(s));
  DecodeRecord rec;
  for (int step = 0; step <= steps; ++step) {
    ForwardBatch batch;
    for (size_t s = 0; s < prompts.size(); ++s) {
      const int cached = step == 0 ? 0 : static_cast<int>(prompts[s].size()) + step - 1;
      SequenceInput in;
      in.request_id = s;
      in.start_position = cached;
      in.num_cached_entries = cached;
      in.block_table = &tables[s];
      in.sampling = &greedy;
      in.logprob_token = forced[s][step];
      in.num_top_logprobs = 5;
      if (step == 0)
        testing::append_sequence(batch, in, prompts[s].data(), static_cast<int>(prompts[s].size()));
      else
        testing::append_sequence(batch, in, &forced[s][step - 1], 1);
    }
    StepOutput out;
    const Status st = backend.execute(batch, &out);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (!st.is_ok()) break;
    for (size_t s = 0; s < prompts.size(); ++s) {
      rec.tokens.push_back(out.sampled_tokens[s]);
      const TokenLogprobs& lp = out.logprobs[s];
      uint32_t b;
      std::memcpy(&b, &lp.logprob, 4);
      rec.logprob_bits.push_back(b);
      for (const TopLogprob& t : lp.top) {
        std::memcpy(&b, &t.logprob, 4);
        rec.logprob_bits.push_back(b);
        rec.top_tokens.push_back(t.token);
      }
    }
  }
  return rec;
}

void expect_fused_matches_unfused(const testing::Model& m, bool fp8, const char* tag) {
  const int vocab = m.config.vocab_size;
  // Prefill: every position's logits.
  const std::vector<int32_t> ids = token_ids(96, vocab, 0);
  auto unfused = make(m, fp8, false, false), fused = make(m, fp8, true, false);
  const std::vector<float> a = testing::teacher_forced_logits(*unfused, ids, kBlockSize);
  const std::vector<float> b = testing::teacher_forced_logits(*fused, ids, kBlockSize);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(bits32(b), bits32(a)) << tag << ": prefill logits";
  // Decode: three sequences of different lengths, graphs on and off.
  const std::vector<std::vector<int32_t>> prompts = {token_ids(5, vocab, 1), token_ids(19, vocab, 2),
                                                     token_ids(33, vocab, 3)};
  for (bool graphs : {true, false}) {
    auto u = make(m, fp8, false, graphs), f = make(m, fp8, true, graphs);
    const DecodeRecord ru = forced_decode(*u, prompts, 24, vocab), rf = forced_decode(*f, prompts, 24, vocab);
    ASSERT_FALSE(ru.logprob_bits.empty());
    EXPECT_TRUE(rf == ru) << tag << ": decode differs, graphs " << graphs;
    if (graphs) {
      auto* cuda = dynamic_cast<CudaBackend*>(f.get());
      ASSERT_NE(cuda, nullptr);
      EXPECT_GT(cuda->num_graph_steps(), 0) << tag << ": the fused run took no graph";
    }
  }
  std::printf("[tiny-qwen3 %s] fused quantization: prefill logits and decode log-probabilities identical\n", tag);
}

TEST(Fp8FusedQuantizeEngine, LogitsIdenticalOnAndOff) {
  expect_fused_matches_unfused(testing::load_model(tiny_dir()), true, "fp8 dynamic");
}

// A ModelOpt checkpoint: every projection has a static input scale, which the fused producers use.
TEST(Fp8FusedQuantizeEngine, StaticInputScalesIdenticalOnAndOff) {
  origami::testing::TempDir mo;
  origami::testing::write_fp8_checkpoint(tiny_dir(), mo.path(), origami::testing::Fp8Format::kModelOptConfig, 0.05f);
  expect_fused_matches_unfused(testing::load_model(mo.path().string()), false, "fp8 static");
}

// bf16 projections: the option changes nothing.
TEST(Fp8FusedQuantizeEngine, NoEffectOnBf16Weights) {
  expect_fused_matches_unfused(testing::load_model(tiny_dir()), false, "bf16");
}

}  // namespace
}  // namespace origami::cuda
