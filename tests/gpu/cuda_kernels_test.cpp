// Every element-wise, GEMM and sampling kernel of the CUDA backend against its CPU twin
// (src/backend/cpu/cpu_kernels.h, src/sampling/sampler.h) on random inputs of odd sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cuda/cluster_rows.h"
#include "backend/cuda/elementwise_kernels.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/logprob_kernels.h"
#include "backend/cuda/sampling_kernels.h"
#include "backend/cuda/tensor_parallel_kernels.h"
#include "cuda_test_util.h"
#include "rope_check.h"
#include "sampling/logprob.h"
#include "sampling/sampler.h"

namespace origami::cuda {
namespace {

using testing::check_qk_norm_rope;
using testing::DeviceBuffer;
using testing::from_device_bf16;
using testing::random_bf16_values;
using testing::rel_err;
using testing::to_device_bf16;

constexpr double kTol = 1e-2;
const int kLengths[] = {1, 7, 97, 1000, 4097};

TEST(CudaKernels, EmbeddingGather) {
  std::mt19937 rng(1);
  for (int hidden : kLengths) {
    const int vocab = 97, n = 7;
    const std::vector<float> table = random_bf16_values(static_cast<size_t>(vocab) * hidden, rng);
    std::vector<int32_t> ids(n);
    for (int& id : ids) id = static_cast<int>(rng() % vocab);
    DeviceBuffer<bf16> d_table(to_device_bf16(table));
    DeviceBuffer<int32_t> d_ids(ids);
    DeviceBuffer<float> d_out(static_cast<size_t>(n) * hidden);
    d_out.poison();
    launch_embedding_gather(d_table.get(), d_ids.get(), n, hidden, d_out.get(), nullptr);
    const std::vector<float> got = d_out.download();
    for (int t = 0; t < n; ++t)
      for (int i = 0; i < hidden; ++i)
        ASSERT_EQ(got[static_cast<size_t>(t) * hidden + i], table[static_cast<size_t>(ids[t]) * hidden + i]);
  }
}

TEST(CudaKernels, AddRmsNormMatchesCpu) {
  std::mt19937 rng(2);
  for (int hidden : kLengths) {
    for (int rows : {1, 7, 97}) {
      for (bool with_delta : {false, true}) {
        const size_t n = static_cast<size_t>(rows) * hidden;
        std::vector<float> residual = random_bf16_values(n, rng);
        const std::vector<float> delta = random_bf16_values(n, rng);
        const std::vector<float> weight = random_bf16_values(hidden, rng);
        DeviceBuffer<float> d_res(residual);
        DeviceBuffer<bf16> d_delta(to_device_bf16(delta));
        DeviceBuffer<bf16> d_w(to_device_bf16(weight));
        DeviceBuffer<bf16> d_out(n);
        d_out.poison();
        launch_add_rmsnorm(d_res.get(), with_delta ? d_delta.get() : nullptr, d_w.get(), 1e-5f, rows, hidden,
                           d_out.get(), nullptr);
        if (with_delta)
          for (size_t i = 0; i < n; ++i) residual[i] += delta[i];
        std::vector<float> want(n);
        cpu::rms_norm(rows, hidden, residual.data(), hidden, weight.data(), 1e-5f, want.data(), hidden);
        EXPECT_LT(rel_err(from_device_bf16(d_out.download()), want), kTol) << "hidden " << hidden << " rows " << rows;
        EXPECT_LT(rel_err(d_res.download(), residual), 1e-6) << "residual, hidden " << hidden;
      }
    }
  }
}

TEST(CudaKernels, QkNormRopeMatchesCpu) {
  std::mt19937 rng(3);
  RopeConfig plain;
  plain.theta = 1e6f;
  RopeConfig llama3;
  llama3.theta = 500000.0f;
  llama3.type = "llama3";
  llama3.factor = 8.0f;
  llama3.original_max_position_embeddings = 8192;
  for (int n : {1, 7, 97, 1000})
    for (int d : {8, 64, 128})
      for (bool norm : {false, true}) check_qk_norm_rope(n, 4, 2, d, norm, n % 2 ? plain : llama3, {}, kTol, rng);
}

TEST(CudaKernels, SiluAndMulMatchesCpu) {
  std::mt19937 rng(4);
  for (int inter : kLengths) {
    for (int rows : {1, 7, 97}) {
      const std::vector<float> gu = random_bf16_values(static_cast<size_t>(rows) * 2 * inter, rng, 2.0f);
      DeviceBuffer<bf16> d_in(to_device_bf16(gu));
      DeviceBuffer<bf16> d_out(static_cast<size_t>(rows) * inter);
      d_out.poison();
      launch_silu_and_mul(d_in.get(), rows, inter, d_out.get(), nullptr);
      std::vector<float> want(static_cast<size_t>(rows) * inter);
      cpu::silu_mul(rows, inter, gu.data(), gu.data() + inter, 2 * inter, want.data(), inter);
      EXPECT_LT(rel_err(from_device_bf16(d_out.download()), want), kTol) << inter << " x " << rows;
    }
  }
}

TEST(CudaKernels, BiasAddAndGatherRows) {
  std::mt19937 rng(5);
  for (int cols : kLengths) {
    const int rows = 7;
    const std::vector<float> x = random_bf16_values(static_cast<size_t>(rows) * cols, rng);
    const std::vector<float> b = random_bf16_values(cols, rng);
    DeviceBuffer<bf16> d_x(to_device_bf16(x)), d_b(to_device_bf16(b));
    launch_bias_add(d_x.get(), d_b.get(), rows, cols, nullptr);
    std::vector<float> want(x);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) want[static_cast<size_t>(r) * cols + c] += b[c];
    EXPECT_LT(rel_err(from_device_bf16(d_x.download()), want), kTol);
    const std::vector<int32_t> pick = {6, 0, 3};
    DeviceBuffer<int32_t> d_pick(pick);
    DeviceBuffer<bf16> d_g(pick.size() * cols);
    launch_gather_rows(d_x.get(), d_pick.get(), 3, cols, d_g.get(), nullptr);
    const std::vector<float> all = from_device_bf16(d_x.download()), got = from_device_bf16(d_g.download());
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < cols; ++c)
        ASSERT_EQ(got[static_cast<size_t>(r) * cols + c], all[static_cast<size_t>(pick[r]) * cols + c]);
  }
}

TEST(CudaKernels, GemmMatchesCpu) {
  std::mt19937 rng(6);
  Gemm gemm;
  gemm.set_stream(nullptr);
  for (int m : {1, 7, 97, 1000}) {
    for (int k : {7, 97, 1000}) {
      for (int n : {1, 97, 4097}) {
        const std::vector<float> x = random_bf16_values(static_cast<size_t>(m) * k, rng);
        const std::vector<float> w = random_bf16_values(static_cast<size_t>(n) * k, rng);
        DeviceBuffer<bf16> d_x(to_device_bf16(x)), d_w(to_device_bf16(w));
        DeviceBuffer<float> d_y32(static_cast<size_t>(m) * n);
        DeviceBuffer<bf16> d_y16(static_cast<size_t>(m) * n);
        d_y32.poison();
        d_y16.poison();
        gemm.linear(d_x.get(), m, k, d_w.get(), n, d_y32.get(), true);
        gemm.linear(d_x.get(), m, k, d_w.get(), n, d_y16.get(), false);
        std::vector<float> want(static_cast<size_t>(m) * n);
        cpu::gemm_nt(m, n, k, x.data(), k, w.data(), k, nullptr, want.data(), n, nullptr);
        EXPECT_LT(rel_err(d_y32.download(), want), 1e-4) << m << "x" << k << "x" << n;
        EXPECT_LT(rel_err(from_device_bf16(d_y16.download()), want), kTol) << m << "x" << k << "x" << n;
      }
    }
  }
}

TEST(CudaKernels, FillRandomHasRequestedMoments) {
  const size_t n = 1 << 20;
  DeviceBuffer<bf16> d(n);
  launch_fill_random_bf16(d.get(), n, 0.02f, 0.0f, 42, nullptr);
  const std::vector<float> v = from_device_bf16(d.download());
  double sum = 0, sq = 0;
  for (float x : v) {
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
    sq += static_cast<double>(x) * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 1e-4);
  EXPECT_NEAR(std::sqrt(sq / n), 0.02, 5e-4);
}

// The GPU sampler's tokens for `rows` rows of `vocab` logits (row stride = vocab) under `sp`,
// each row drawing with sampling_uniform(seed, row), and how many differ from the CPU sampler's.
struct SampledRows {
  std::vector<int32_t> tokens;
  int mismatches = 0;
};
SampledRows sample_on_gpu_and_cpu(const std::vector<float>& logits, int rows, int vocab, const SamplingParams& sp,
                                  uint64_t seed) {
  std::vector<RowSamplingParams> params(rows);
  for (int r = 0; r < rows; ++r) params[r] = row_sampling_params(&sp, sampling_uniform(seed, r));
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<RowSamplingParams> d_params(params);
  DeviceBuffer<int32_t> d_tokens(rows);
  d_tokens.poison();
  launch_sample_rows(d_logits.get(), rows, vocab, vocab, d_params.get(), d_tokens.get(), nullptr);
  SampledRows out;
  out.tokens = d_tokens.download();
  for (int r = 0; r < rows; ++r)
    if (out.tokens[r] != sample_token(logits.data() + static_cast<size_t>(r) * vocab, vocab, sp, seed, r))
      ++out.mismatches;
  return out;
}

SamplingParams sampling_params(float temperature, int top_k, float top_p, float min_p) {
  SamplingParams sp;
  sp.temperature = temperature;
  sp.top_k = top_k;
  sp.top_p = top_p;
  sp.min_p = min_p;
  return sp;
}

// The GPU sampler must pick the CPU sampler's token for the same logits, seed and index. Float
// summation order differs, so a draw landing within rounding of a CDF boundary may differ: allow
// one such case per configuration.
TEST(CudaKernels, SamplingMatchesCpuSampler) {
  std::mt19937 rng(7);
  struct Config {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
  };
  const Config configs[] = {{0.0f, 0, 1.0f, 0.0f},  {1.0f, 0, 1.0f, 0.0f},  {0.7f, 0, 1.0f, 0.0f},
                            {1.0f, 5, 1.0f, 0.0f},  {1.0f, 0, 0.9f, 0.0f},  {1.0f, 0, 1.0f, 0.05f},
                            {0.8f, 40, 0.95f, 0.02f}, {1.3f, 1, 1.0f, 0.0f}, {0.5f, 1000, 0.5f, 0.0f}};
  for (int vocab : {1, 7, 97, 1000, 4097, 151936}) {
    const int rows = vocab > 10000 ? 16 : 64;
    for (const Config& cfg : configs) {
      std::vector<float> logits(static_cast<size_t>(rows) * vocab);
      std::normal_distribution<float> dist(0.0f, 3.0f);
      for (float& x : logits) x = dist(rng);
      // A few exact ties and a -inf, which the sampler must order by id / skip.
      if (vocab > 10) {
        logits[3] = logits[5];
        logits[1] = -INFINITY;
      }
      const SampledRows got =
          sample_on_gpu_and_cpu(logits, rows, vocab, sampling_params(cfg.temperature, cfg.top_k, cfg.top_p, cfg.min_p), rng());
      EXPECT_LE(got.mismatches, 1) << "vocab " << vocab << " T " << cfg.temperature << " k " << cfg.top_k << " p "
                                   << cfg.top_p << " min_p " << cfg.min_p;
    }
  }
}

// Rows whose logits come in few distinct values (rounded to quarters, and one row all equal): the
// radix select's buckets then hold tens of thousands of tokens, so its passes read the whole row
// longer before the bucket fits the shared-memory stage (sampling_kernels.cu, kStagedCap), and
// the draw among exact ties goes by id. An odd vocabulary as the row stride leaves rows off the
// 16-byte boundary, which the vector loads must step around (row_loads.cuh), and cuts the rows'
// shares over a cluster's CTAs off it too.
TEST(CudaKernels, SamplingOverTiedLogitsMatchesCpuSampler) {
  std::mt19937 rng(13);
  struct Config {
    float temperature;
    int top_k;
    float top_p;
  };
  const Config configs[] = {{0.0f, 0, 1.0f}, {1.0f, 0, 1.0f}, {0.7f, 0, 0.9f}, {1.0f, 50, 1.0f}, {1.0f, 5000, 0.99f}};
  // 1 and 8 rows share each row over a cluster of 8 CTAs, 20 rows over 4, 40 over 2, 100 rows run
  // one CTA a row (cluster_ctas_per_row): the tokens must not depend on it. A 7-token row over 8
  // CTAs leaves some of them no tokens.
  for (const auto& [vocab, rows] : {std::pair{128257, 8}, std::pair{151936, 1}, std::pair{151936, 20},
                                    std::pair{128257, 40}, std::pair{7, 1}, std::pair{128257, 100}}) {
    std::vector<float> logits(static_cast<size_t>(rows) * vocab);
    std::normal_distribution<float> dist(0.0f, 2.0f);
    for (float& x : logits) x = std::round(dist(rng) * 4.0f) / 4.0f;
    std::fill(logits.begin(), logits.begin() + vocab, 0.5f);  // row 0: every logit the same
    for (const Config& cfg : configs) {
      // A single row is drawn 16 times (fresh uniforms), so that the one mismatch allowed is not
      // the whole comparison.
      const int draws = rows == 1 ? 16 : 1;
      int mismatches = 0;
      for (int d = 0; d < draws; ++d) {
        const SampledRows got = sample_on_gpu_and_cpu(logits, rows, vocab,
                                                      sampling_params(cfg.temperature, cfg.top_k, cfg.top_p, 0.0f), rng());
        mismatches += got.mismatches;
        if (cfg.temperature == 0.0f) {
          EXPECT_EQ(got.tokens[0], 0) << "greedy over equal logits takes the lowest id";
        }
      }
      EXPECT_LE(mismatches, 1) << "vocab " << vocab << " rows " << rows << " T " << cfg.temperature << " k "
                               << cfg.top_k << " p " << cfg.top_p;
    }
  }
  EXPECT_EQ(cluster_ctas_per_row(1, 132), 8);
  EXPECT_EQ(cluster_ctas_per_row(64, 132), 2);
  EXPECT_EQ(cluster_ctas_per_row(67, 132), 1);
}

// Tensor parallelism's greedy path: each shard's argmax, merged, picks what the CPU's argmax over
// the whole row picks (ties across and within shards to the lowest id, NaN as -inf, rows without a
// finite maximum flagged), for shards that split the vocabulary unevenly (the last one overhangs,
// its padding columns holding values that would win if they were read).
TEST(CudaKernels, ShardedArgmaxMatchesWholeRowArgmax) {
  std::mt19937 rng(11);
  for (int vocab : {1, 5, 1000, 4097, 151936}) {
    for (int ranks : {2, 4}) {
      const int rows = 24, shard = (vocab + ranks - 1) / ranks;
      std::vector<float> logits(static_cast<size_t>(rows) * vocab);
      std::normal_distribution<float> dist(0.0f, 3.0f);
      for (float& x : logits) x = dist(rng);
      auto row = [&](int r) { return logits.data() + static_cast<size_t>(r) * vocab; };
      if (vocab > 10) {
        std::uniform_int_distribution<int> pick(0, vocab - 1);
        for (int r = 0; r < rows; ++r) {
          const float top = *std::max_element(row(r), row(r) + vocab) + 1.0f;
          switch (r % 8) {
            case 0: row(r)[pick(rng)] = top; row(r)[pick(rng)] = top; break;  // a tie, maybe across shards
            case 1: row(r)[vocab - 1] = top; row(r)[0] = top; break;           // tie: first and last id
            case 2: std::fill(row(r), row(r) + vocab, NAN); break;             // no finite maximum
            case 3: row(r)[pick(rng)] = INFINITY; break;                        // +inf: flagged
            case 4: for (int i = 0; i < vocab; ++i) if (i % 3) row(r)[i] = NAN; break;
            case 5: std::fill(row(r), row(r) + std::min(vocab, shard), -INFINITY); break;  // a shard of -inf
            case 6: std::fill(row(r), row(r) + vocab, -5.0f); break;           // all equal: token 0
            default: break;
          }
        }
      }
      // Each rank's shard [rows, shard], zero-padded past the vocabulary, then its argmax.
      std::vector<ShardArgmax> gathered;
      for (int k = 0; k < ranks; ++k) {
        const int begin = k * shard, valid = std::max(0, std::min(shard, vocab - begin));
        std::vector<float> part(static_cast<size_t>(rows) * shard, 1e30f);
        for (int r = 0; r < rows; ++r)
          std::copy_n(row(r) + begin, valid, part.begin() + static_cast<size_t>(r) * shard);
        DeviceBuffer<float> d_part(part);
        DeviceBuffer<ShardArgmax> d_best(rows);
        launch_shard_argmax(d_part.get(), rows, shard, valid, begin, d_best.get(), nullptr);
        const std::vector<ShardArgmax> best = d_best.download();
        gathered.insert(gathered.end(), best.begin(), best.end());
      }
      DeviceBuffer<ShardArgmax> d_gathered(gathered);
      DeviceBuffer<int32_t> d_tokens(rows);
      d_tokens.poison();
      launch_merge_shard_argmax(d_gathered.get(), ranks, rows, d_tokens.get(), nullptr);
      const std::vector<int32_t> got = d_tokens.download();
      for (int r = 0; r < rows; ++r)
        EXPECT_EQ(got[r], greedy_token(row(r), vocab)) << "vocab " << vocab << " ranks " << ranks << " row " << r;
    }
  }
}

// Rows without a finite maximum logit (all NaN, NaN and -inf, a +inf) yield kNonFiniteLogits,
// as the CPU sampler does, greedy or sampled; a finite row beside them is unaffected.
TEST(CudaKernels, SamplingFlagsNonFiniteRows) {
  const int vocab = 4097;
  std::vector<float> logits(static_cast<size_t>(4) * vocab, 0.25f);
  for (int i = 0; i < vocab; ++i) {
    logits[i] = NAN;                                           // row 0: all NaN
    logits[static_cast<size_t>(vocab) + i] = i % 2 ? NAN : -INFINITY;  // row 1: NaN and -inf
  }
  logits[static_cast<size_t>(2) * vocab + 17] = INFINITY;  // row 2: one +inf
  logits[static_cast<size_t>(3) * vocab + 99] = 3.0f;      // row 3: finite, token 99
  for (int greedy : {1, 0}) {
    std::vector<RowSamplingParams> params(4);
    for (int r = 0; r < 4; ++r) {
      params[r].greedy = greedy;
      params[r].top_k = greedy ? 0 : 1;  // sampled rows still have one certain token in row 3
      params[r].u = sampling_uniform(5, r);
    }
    DeviceBuffer<float> d_logits(logits);
    DeviceBuffer<RowSamplingParams> d_params(params);
    DeviceBuffer<int32_t> d_tokens(4);
    d_tokens.poison();
    launch_sample_rows(d_logits.get(), 4, vocab, vocab, d_params.get(), d_tokens.get(), nullptr);
    const std::vector<int32_t> got = d_tokens.download();
    EXPECT_EQ(got[0], kNonFiniteLogits) << "greedy " << greedy;
    EXPECT_EQ(got[1], kNonFiniteLogits) << "greedy " << greedy;
    EXPECT_EQ(got[2], kNonFiniteLogits) << "greedy " << greedy;
    EXPECT_EQ(got[3], 99) << "greedy " << greedy;
  }
}

TEST(CudaKernels, RowLogprobsMatchCpu) {
  std::mt19937 rng(11);
  for (int vocab : {1, 7, 97, 1000, 4097, 151936}) {
    const int rows = vocab > 10000 ? 16 : 64;
    std::vector<float> logits(static_cast<size_t>(rows) * vocab);
    std::normal_distribution<float> dist(0.0f, 4.0f);
    for (float& x : logits) x = dist(rng);
    if (vocab > 10) {  // -inf and NaN entries count as impossible tokens
      logits[1] = -INFINITY;
      logits[2] = NAN;
    }
    std::vector<RowSamplingParams> params(rows);
    for (int r = 0; r < rows; ++r) params[r].logprob_token = r % 3 == 0 ? -1 : static_cast<int>(rng() % vocab);
    DeviceBuffer<float> d_logits(logits);
    DeviceBuffer<RowSamplingParams> d_params(params);
    DeviceBuffer<float> d_out(rows);
    DeviceBuffer<int32_t> d_sampled(std::vector<int32_t>(rows, 0));
    DeviceBuffer<TopLogprob> d_top(static_cast<size_t>(rows) * kMaxTopLogprobs);
    launch_row_logprobs(d_logits.get(), rows, vocab, vocab, d_params.get(), d_sampled.get(), d_out.get(), d_top.get(),
                        nullptr);
    const std::vector<float> got = d_out.download();
    for (int r = 0; r < rows; ++r) {
      if (params[r].logprob_token < 0) {
        EXPECT_TRUE(std::isnan(got[r])) << "row " << r << " asked nothing";
        continue;
      }
      const float want = log_softmax_at(logits.data() + static_cast<size_t>(r) * vocab, vocab, params[r].logprob_token);
      if (std::isinf(want)) {
        EXPECT_EQ(got[r], want) << "vocab " << vocab << " row " << r;
      } else {
        EXPECT_NEAR(got[r], want, 1e-5 * std::max(1.0f, std::fabs(want))) << "vocab " << vocab << " row " << r;
      }
    }
  }
}

// The OpenAI logprobs: the row token's log-probability (the sampled one, or logprob_token when
// set) and the top k, against sampling/logprob.h's token_logprobs on the same logits; rows that
// ask nothing get NaN and their top entries stay untouched.
TEST(CudaKernels, TopLogprobsMatchCpu) {
  std::mt19937 rng(12);
  const int kTops[] = {-1, 0, 1, 5, kMaxTopLogprobs};
  for (int vocab : {1, 7, 97, 1000, 4097, 151936}) {
    const int rows = vocab > 10000 ? 10 : 40;
    std::vector<float> logits(static_cast<size_t>(rows) * vocab);
    std::normal_distribution<float> dist(0.0f, 4.0f);
    for (float& x : logits) x = dist(rng);
    if (vocab > 10) {
      logits[1] = -INFINITY;
      logits[2] = NAN;
      // Ties at the top: equal logits are ordered by ascending id.
      float* row1 = logits.data() + vocab;
      row1[vocab - 1] = row1[3] = row1[5] = 100.0f;
    }
    // Row rows-1 has no finite logit: every log-probability is -inf.
    std::fill(logits.end() - vocab, logits.end(), -INFINITY);
    std::vector<RowSamplingParams> params(rows);
    std::vector<int32_t> sampled(rows);
    for (int r = 0; r < rows; ++r) {
      params[r].num_top_logprobs = kTops[r % 5];
      params[r].logprob_token = r % 7 == 3 ? static_cast<int>(rng() % vocab) : -1;  // teacher forcing rows
      sampled[r] = static_cast<int32_t>(rng() % vocab);
    }
    DeviceBuffer<float> d_logits(logits);
    DeviceBuffer<RowSamplingParams> d_params(params);
    DeviceBuffer<int32_t> d_sampled(sampled);
    DeviceBuffer<float> d_out(rows);
    DeviceBuffer<TopLogprob> d_top(static_cast<size_t>(rows) * kMaxTopLogprobs);
    launch_row_logprobs(d_logits.get(), rows, vocab, vocab, d_params.get(), d_sampled.get(), d_out.get(), d_top.get(),
                        nullptr);
    const std::vector<float> got = d_out.download();
    const std::vector<TopLogprob> got_top = d_top.download();
    auto near = [](float got, float want) {
      return std::isinf(want) ? got == want : std::fabs(got - want) <= 1e-5 * std::max(1.0f, std::fabs(want));
    };
    for (int r = 0; r < rows; ++r) {
      const int k = params[r].num_top_logprobs;
      const int32_t token = params[r].logprob_token >= 0 ? params[r].logprob_token : sampled[r];
      if (k < 0 && params[r].logprob_token < 0) {
        EXPECT_TRUE(std::isnan(got[r])) << "row " << r << " asked nothing";
        continue;
      }
      const TokenLogprobs want =
          token_logprobs(logits.data() + static_cast<size_t>(r) * vocab, vocab, token, std::max(k, 0));
      EXPECT_TRUE(near(got[r], want.logprob)) << "vocab " << vocab << " row " << r << ": " << got[r] << " vs " << want.logprob;
      ASSERT_EQ(static_cast<int>(want.top.size()), std::min(std::max(k, 0), vocab));
      for (size_t j = 0; j < want.top.size(); ++j) {
        const TopLogprob& g = got_top[static_cast<size_t>(r) * kMaxTopLogprobs + j];
        EXPECT_EQ(g.token, want.top[j].token) << "vocab " << vocab << " row " << r << " rank " << j;
        EXPECT_TRUE(near(g.logprob, want.top[j].logprob)) << "vocab " << vocab << " row " << r << " rank " << j;
      }
    }
  }
}

}  // namespace
}  // namespace origami::cuda
