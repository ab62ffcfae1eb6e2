// FP8 projections on the CUDA backend: the quantize kernel against its host twin (bit for bit),
// the cuBLASLt FP8 GEMM (both scaling paths) against a CPU reference over the same quantized
// operands, and the FP8 engine against the CPU backend's FP8 emulation (teacher-forced logits,
// greedy runs, FP8 checkpoints, dummy weights).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <tuple>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_factory.h"
#include "backend/cuda/fp8_gemm.h"
#include "backend/cuda/fp8_gemv.h"
#include "backend/cuda/fp8_small_gemm.h"
#include "backend/cuda/fp8_kernels.h"
#include "core/fp8.h"
#include "cuda_test_util.h"
#include "model/config.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"
#include "unit/fp8_checkpoint_fixture.h"
#include "unit/model_test_util.h"

namespace origami::cuda {
namespace {

using testing::DeviceBuffer;
using testing::rel_err;
using testing::teacher_forced_logits;

TEST(Fp8Kernels, QuantizeRowsMatchesHostBitForBit) {
  std::mt19937 rng(5);
  for (auto [rows, cols] : {std::pair{1, 512}, std::pair{37, 4096}, std::pair{64, 1408}, std::pair{3, 8}}) {
    std::vector<float> x = testing::random_bf16_values(static_cast<size_t>(rows) * cols, rng, 0.7f);
    for (int c = 0; c < cols; ++c) x[c] = 0.0f;  // an all-zero row
    if (rows > 2) x[static_cast<size_t>(2) * cols + 1] = bf16_to_f32(f32_to_bf16(1e4f));  // one outlier row
    DeviceBuffer<__nv_bfloat16> dx(testing::to_device_bf16(x));
    DeviceBuffer<uint8_t> codes(x.size());
    DeviceBuffer<float> scales(rows);
    for (bool with_static : {false, true}) {
      DeviceBuffer<float> fixed(std::vector<float>{0.01f});
      launch_quantize_rows_fp8(dx.get(), rows, cols, with_static ? fixed.get() : nullptr, codes.get(), scales.get(),
                               nullptr);
      std::vector<uint8_t> want(x.size());
      std::vector<float> want_scales(rows, 0.01f);
      if (with_static)
        quantize_with_scale_fp8(x.data(), x.size(), 0.01f, want.data());
      else
        quantize_rows_fp8(x.data(), rows, cols, cols, want.data(), want_scales.data());
      EXPECT_EQ(codes.download(), want) << rows << "x" << cols << " static " << with_static;
      EXPECT_EQ(scales.download(), want_scales) << rows << "x" << cols << " static " << with_static;
    }
  }
}

// The GEMM epilogue's scaling (and split-K's sum of partials) against the host, bit for bit:
// y = bf16((acc[0] + ... + acc[s-1]) * row scale * column scale), partials added in split order.
// Both kernels are run: four columns a thread (aligned buffers, cols % 4 == 0) and one element a
// thread (column scales one float off their alignment), at decode's row counts and odd shapes.
TEST(Fp8Kernels, ScaledProductsMatchHostBitForBit) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> value(-40.0f, 40.0f), scale(1e-4f, 3e-2f);
  for (auto [rows, cols, splits] : {std::tuple{1, 4096, 1}, std::tuple{3, 6144, 1}, std::tuple{64, 28672, 1},
                                    std::tuple{7, 36, 1}, std::tuple{5, 33, 1}, std::tuple{64, 4096, 2},
                                    std::tuple{17, 4096, 3}, std::tuple{320, 1024, 4}}) {
    const size_t plane = static_cast<size_t>(rows) * cols;
    std::vector<float> acc(plane * splits), rs(rows), cs(cols + 1);
    for (float& v : acc) v = value(rng);
    for (float& v : rs) v = scale(rng);
    for (float& v : cs) v = scale(rng);
    for (int offset : {0, 1}) {
      if (splits > 1 && offset == 1) continue;  // split-K takes aligned scales only
      std::vector<uint16_t> want(plane);
      for (int i = 0; i < rows; ++i)
        for (int j = 0; j < cols; ++j) {
          const size_t e = static_cast<size_t>(i) * cols + j;
          float sum = acc[e];
          for (int s = 1; s < splits; ++s) sum += acc[s * plane + e];
          want[e] = f32_to_bf16(sum * rs[i] * cs[offset + j]);
        }
      DeviceBuffer<float> d_acc(acc), d_rs(rs), d_cs(cs);
      DeviceBuffer<__nv_bfloat16> y(plane);
      if (splits == 1)
        launch_scale_fp8_product(d_acc.get(), rows, cols, d_rs.get(), d_cs.get() + offset, y.get(), nullptr);
      else
        launch_sum_scale_fp8_partials(d_acc.get(), splits, rows, cols, d_rs.get(), d_cs.get(), y.get(), nullptr);
      const std::vector<__nv_bfloat16> got = y.download();
      size_t mismatches = 0;
      for (size_t e = 0; e < plane; ++e) {
        uint16_t bits;
        std::memcpy(&bits, &got[e], sizeof bits);
        mismatches += bits != want[e];
      }
      EXPECT_EQ(mismatches, 0u) << rows << "x" << cols << " splits " << splits << " scale offset " << offset;
    }
  }
}

// y = (x . w^T) * xs[i] * ws[j] over E4M3 operands. Every product of two E4M3 values is exact in
// fp32, so the GEMM's only errors are its accumulation and the bf16 output's rounding: within
// half a bf16 ulp (2^-9 relative, 2^-8 with the scales' rounding) of the exact sum, plus the
// accumulator's error. Hopper's FP8 tensor cores add products into a narrower accumulator
// before cuBLASLt promotes the partial sums to fp32 (DeepSeek-V3, section 3.3.2: about 14 bits),
// so the accumulation term is bounded by 2^-14 of the sum of |products|.
// With fast accumulation (Fp8Gemm::set_fast_accumulation) nothing is promoted: each of the K / 32
// tensor-core steps (an FP8 MMA consumes 32 of K) adds into that ~14-bit accumulator, each
// rounding at most 2^-13 of the accumulator, itself at most the sum of |products|: the
// accumulation term is bounded by (K / 32) 2^-13 of the sum of |products| (a worst case; the test
// prints how much of it a run uses).
// Split-K (Fp8Gemm::force_splits, 2-4 ways where the split divides k) is held to the same bound:
// each partial's accumulation is bounded by its own share of the sum of |products| (fast: by
// (K / s / 32) 2^-13 of it), and adding s fp32 partials costs (s - 1) 2^-24 more, far inside the
// margin. Its mean error must also stay within 5% of the unsplit epilogue path's.
void expect_gemm_matches_reference(bool fast_accumulation) {
  std::mt19937 rng(9);
  Fp8Gemm gemm;
  gemm.set_fast_accumulation(fast_accumulation);
  cudaStream_t stream;
  ORIGAMI_CUDA_CHECK(cudaStreamCreate(&stream));
  const bool outer = gemm.outer_vector_supported(64, 512, 512);
  std::printf("[fp8 gemm] cuBLASLt outer-vector scaling: %s\n", outer ? "available" : "not available (epilogue path)");
  for (auto [m, n, k] : {std::tuple{1, 512, 512}, std::tuple{7, 1024, 512}, std::tuple{64, 2816, 512},
                         std::tuple{300, 512, 1408}, std::tuple{16, 4096, 4096}, std::tuple{130, 1024, 1536}}) {
    const std::vector<float> x = testing::random_bf16_values(static_cast<size_t>(m) * k, rng, 1.0f);
    const std::vector<float> w = testing::random_bf16_values(static_cast<size_t>(n) * k, rng, 0.02f);
    std::vector<uint8_t> xq(x.size()), wq(w.size());
    std::vector<float> xs(m), ws(n);
    quantize_rows_fp8(x.data(), m, k, k, xq.data(), xs.data());
    quantize_rows_fp8(w.data(), n, k, k, wq.data(), ws.data());
    std::vector<double> ref(static_cast<size_t>(m) * n), mag(ref.size());
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        double s = 0, a = 0;
        for (int e = 0; e < k; ++e) {
          const double p = static_cast<double>(fp8_e4m3_to_f32(xq[static_cast<size_t>(i) * k + e])) *
                           fp8_e4m3_to_f32(wq[static_cast<size_t>(j) * k + e]);
          s += p;
          a += std::fabs(p);
        }
        ref[static_cast<size_t>(i) * n + j] = s * xs[i] * ws[j];
        mag[static_cast<size_t>(i) * n + j] = a * xs[i] * ws[j];
      }
    DeviceBuffer<uint8_t> dxq(xq), dwq(wq);
    DeviceBuffer<float> dxs(xs), dws(ws), acc(static_cast<size_t>(m) * n);
    DeviceBuffer<__nv_bfloat16> y(static_cast<size_t>(m) * n);
    DeviceBuffer<float> split_acc(static_cast<size_t>(Fp8Gemm::kMaxSplits) * m * n);
    double unsplit_mean = -1;
    // Paths: outer-vector, epilogue, then split-K 2, 3, 4 ways.
    for (int path_index = 0; path_index < 2 + Fp8Gemm::kMaxSplits - 1; ++path_index) {
      const int splits = path_index < 2 ? 1 : path_index;
      const Fp8Gemm::Scaling path = path_index == 0 ? Fp8Gemm::Scaling::kOuterVector : Fp8Gemm::Scaling::kEpilogue;
      if (path == Fp8Gemm::Scaling::kOuterVector && !gemm.outer_vector_supported(m, n, k)) continue;
      if (splits > 1 && !Fp8Gemm::split_divides(k, splits)) continue;
      gemm.force_scaling(path);
      gemm.force_splits(splits);
      ASSERT_EQ(gemm.splits_for(m, n, k), splits) << "no batched cuBLASLt plan for m " << m << " n " << n << " k " << k;
      y.poison();
      gemm.linear(dxq.get(), dxs.get(), m, k, dwq.get(), dws.get(), n, y.get(), splits > 1 ? split_acc.get() : acc.get(),
                  stream);
      ORIGAMI_CUDA_CHECK(cudaStreamSynchronize(stream));
      const std::vector<float> got = testing::from_device_bf16(y.download());
      double worst = 0, worst_acc = 0, sum_err = 0;
      const double acc_bound = fast_accumulation ? std::ldexp(static_cast<double>((k + 31) / 32), -13) : std::ldexp(1.0, -14);
      for (size_t i = 0; i < got.size(); ++i) {
        const double err = std::fabs(got[i] - ref[i]);
        const double bound = std::ldexp(std::fabs(ref[i]), -8) + acc_bound * mag[i];
        ASSERT_LE(err, bound) << "m " << m << " n " << n << " k " << k << " element " << i << " path "
                              << static_cast<int>(path) << " fast accumulation " << fast_accumulation;
        worst = std::max(worst, err / bound);
        worst_acc = std::max(worst_acc, std::max(0.0, err - std::ldexp(std::fabs(ref[i]), -8)) / mag[i]);
        sum_err += err;
      }
      const double mean = sum_err / got.size();
      std::printf("[fp8 gemm] %s accumulation m %d n %d k %d %s, K split %d: worst error %.2f of the bound; beyond bf16 "
                  "rounding %.2e of sum|p|; mean |error| %.3e\n",
                  fast_accumulation ? "fast" : "split", m, n, k,
                  path == Fp8Gemm::Scaling::kOuterVector ? "outer-vector" : "epilogue", splits, worst, worst_acc, mean);
      if (path_index == 1) unsplit_mean = mean;
      if (splits > 1) {
        EXPECT_LE(mean, unsplit_mean * 1.05) << "K split " << splits << " m " << m << " n " << n << " k " << k;
      }
    }
    gemm.clear_forced_scaling();
    gemm.force_splits(0);
  }
  cudaStreamDestroy(stream);
}

TEST(Fp8Gemm, MatchesCpuReferenceOnBothScalingPaths) { expect_gemm_matches_reference(false); }
TEST(Fp8Gemm, FastAccumulationMatchesCpuReferenceWithinItsModel) { expect_gemm_matches_reference(true); }

// ---- the engine: CUDA FP8 vs the CPU backend's FP8 emulation (tiny-qwen3) ----

constexpr int kBlockSize = 16;
constexpr int kNumBlocks = 256;

std::string tiny_dir() { return testing::shared_dir() + "/models/origami-tiny-qwen3"; }

using testing::Model;
Model load(const std::string& dir) { return testing::load_model(dir); }

// Which kernel takes decode's few rows: cuBLASLt alone, the GEMV (all 4 rows it serves; the
// default's 2 are a subset) or the few-row tensor-core GEMM (16 rows, the GEMV off).
enum class FewRows { kCublasLt, kGemv, kSmallGemm };

std::unique_ptr<Backend> make(const Model& m, const std::string& device, bool fp8, bool graphs = true,
                              bool kv_fp8 = false, bool fast_accumulation = false, FewRows few = FewRows::kCublasLt) {
  BackendOptions opt;
  opt.device = device;
  opt.enable_cuda_graphs = graphs;
  opt.fp8_fast_accumulation = fast_accumulation;
  opt.fp8_gemv_rows = few == FewRows::kGemv ? kFp8GemvMaxRows : 0;
  opt.fp8_small_gemm_rows = few == FewRows::kSmallGemm ? kFp8SmallGemmMaxRows : 0;
  if (fp8) opt.quantization = WeightQuantization::kFp8;
  std::unique_ptr<Backend> b;
  if (device == "cuda") {
    auto r = create_cuda_backend(opt);
    EXPECT_TRUE(r.has_value()) << r.status().to_string();
    b = std::move(r).value();
  } else {
    b = std::make_unique<CpuBackend>(opt);
  }
  Status st = b->load(m.config, m.weights);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  KVLayout layout = KVLayout::full(m.config.num_layers, m.config.num_kv_heads, m.config.head_dim, kBlockSize,
                                   kNumBlocks, device == "cuda" ? DType::kBF16 : DType::kF32);
  layout.fp8 = kv_fp8;
  st = b->allocate_kv_cache(layout);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return b;
}

// Greedy runs of several prompts together: the prompt in one step, then decode-only steps
// (CUDA graphs on the GPU).
std::vector<std::vector<int32_t>> greedy(Backend& backend, const std::vector<std::vector<int32_t>>& prompts, int n) {
  SamplingParams sp;
  sp.temperature = 0.0f;
  std::vector<std::vector<BlockId>> tables(prompts.size());
  std::vector<std::vector<int32_t>> tokens = prompts, out(prompts.size());
  BlockId next = 1;
  for (size_t s = 0; s < prompts.size(); ++s)
    for (int i = 0; i * kBlockSize < static_cast<int>(prompts[s].size()) + n; ++i) tables[s].push_back(next++);
  std::vector<int> computed(prompts.size(), 0);
  while (static_cast<int>(out[0].size()) < n) {
    ForwardBatch batch;
    for (size_t s = 0; s < prompts.size(); ++s) {
      SequenceInput in;
      in.request_id = s;
      in.start_position = computed[s];
      in.num_cached_entries = computed[s];
      in.block_table = &tables[s];
      in.logits_mode = LogitsMode::kLast;
      in.sampling = &sp;
      testing::append_sequence(batch, in, tokens[s].data() + computed[s],
                               static_cast<int>(tokens[s].size()) - computed[s]);
    }
    StepOutput o;
    const Status st = backend.execute(batch, &o);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (!st.is_ok()) break;
    for (size_t s = 0; s < prompts.size(); ++s) {
      computed[s] = static_cast<int>(tokens[s].size());
      tokens[s].push_back(o.sampled_tokens[s]);
      out[s].push_back(o.sampled_tokens[s]);
    }
  }
  return out;
}

std::vector<std::vector<int32_t>> golden_prompts() {
  std::ifstream in(testing::shared_dir() + "/golden/origami-tiny-qwen3_golden.json");
  nlohmann::json g;
  in >> g;
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& e : g["greedy"]) prompts.push_back(e["prompt_ids"].get<std::vector<int32_t>>());
  return prompts;
}

// Tokens of wikitext (real text) for the teacher-forced comparisons.
std::vector<int32_t> wikitext_ids(size_t count) {
  auto tok = Tokenizer::load(tiny_dir());
  EXPECT_TRUE(tok.has_value()) << tok.status().to_string();
  std::ifstream in(testing::shared_dir() + "/data/wikitext2_test_dev.txt");
  std::stringstream text;
  text << in.rdbuf();
  std::vector<int32_t> ids = (*tok)->encode(text.str().substr(0, 8 * count), true);
  ids.resize(std::min(ids.size(), count));
  return ids;
}

double perplexity(const std::vector<float>& logits, const std::vector<int32_t>& ids, int vocab) {
  double nll = 0;
  for (size_t t = 0; t + 1 < ids.size(); ++t) {
    const float* row = logits.data() + t * vocab;
    double mx = row[0], sum = 0;
    for (int v = 1; v < vocab; ++v) mx = std::max(mx, static_cast<double>(row[v]));
    for (int v = 0; v < vocab; ++v) sum += std::exp(row[v] - mx);
    nll -= row[ids[t + 1]] - mx - std::log(sum);
  }
  return std::exp(nll / static_cast<double>(ids.size() - 1));
}

// FP8 differs between two implementations more than bf16 does: where the GPU's bf16 input and
// the CPU's fp32 input of a GEMM differ by bf16 rounding (2^-9), the E4M3 code (steps of 2^-4 to
// 2^-3) flips for a few percent of the elements, each flip a whole step. So the CUDA FP8 logits
// are compared with the emulation against FP8's own effect: they must be closer to the
// emulation than the emulation is to full precision.
// Perplexity is held to what users of FP8 expect, within 1% of full precision (CPU fp32), for the
// CUDA path and for the emulation, not to the emulation's own perplexity: that moves with the
// order of the emulation's fp32 sums alone. The same code built on two hosts (-march=native)
// gave 28.595 and 28.474 on these 256 tokens, with CUDA FP8 at 28.779 both times (+0.64% and
// +1.07% against the emulation, +0.60% against fp32): two FP8 roundings of differently rounded
// inputs each sit a fraction of a percent from fp32, on either side.
// Fast accumulation is outside the emulation (the CPU promotes every sum to fp32, as the default
// GEMMs do; the tensor cores' ~14-bit accumulator is not modelled, its error is bounded per GEMM
// in Fp8Gemm.FastAccumulationMatchesCpuReferenceWithinItsModel): its logits must still be closer
// to the emulation than the emulation is to full precision, and its perplexity is reported, not
// held to 1% (the H100 measured +1.6% against fp32 where the promoted sums give +0.6%: the reason
// the option is off by default, docs/fidelity.md).
void expect_teacher_forced_logits_match_cpu(bool fast_accumulation) {
  const Model m = load(tiny_dir());
  const int vocab = m.config.vocab_size;
  auto gpu = make(m, "cuda", true, true, false, fast_accumulation), cpu = make(m, "cpu", true),
       cpu_full = make(m, "cpu", false);
  auto gpu_bf16 = make(m, "cuda", false);
  const std::vector<int32_t> ids = wikitext_ids(256);
  const std::vector<float> g = teacher_forced_logits(*gpu, ids, kBlockSize), c = teacher_forced_logits(*cpu, ids, kBlockSize), f = teacher_forced_logits(*cpu_full, ids, kBlockSize);
  const std::vector<float> b = teacher_forced_logits(*gpu_bf16, ids, kBlockSize);
  const double err = rel_err(g, c), fp8_effect = rel_err(c, f), bf16_err = rel_err(b, f);
  const double ppl_g = perplexity(g, ids, vocab), ppl_c = perplexity(c, ids, vocab), ppl_f = perplexity(f, ids, vocab);
  std::printf("[tiny-qwen3 fp8%s] wikitext %zu tokens: rel err CUDA FP8 vs CPU FP8 %.3e; CPU FP8 vs CPU fp32 %.3e; "
              "CUDA bf16 vs CPU fp32 %.3e; perplexity CUDA FP8 %.4f, CPU FP8 %.4f, CPU fp32 %.4f\n",
              fast_accumulation ? ", fast accumulation" : "", ids.size(), err, fp8_effect, bf16_err, ppl_g, ppl_c, ppl_f);
  EXPECT_LT(err, fp8_effect);
  EXPECT_LT(std::fabs(ppl_c / ppl_f - 1), 0.01) << "the CPU FP8 emulation against fp32";
  if (!fast_accumulation) {
    EXPECT_LT(std::fabs(ppl_g / ppl_f - 1), 0.01) << "CUDA FP8 against fp32";
  }
}

TEST(Fp8Engine, TeacherForcedLogitsMatchCpuEmulation) { expect_teacher_forced_logits_match_cpu(false); }
TEST(Fp8Engine, FastAccumulationTeacherForcedLogitsMatchCpuEmulation) { expect_teacher_forced_logits_match_cpu(true); }

// Greedy: as in cuda_backend_e2e_test, a divergence passes only at a near-tie, here measured
// against the two backends' logit noise at that position: the CPU model's gap between its token
// and the GPU's must be within 4 standard deviations of the CPU-GPU logit difference
// (teacher-forced on the common prefix). CUDA graphs on and off.
void expect_greedy_matches_cpu(const Model& m, bool fp8_weights, bool kv_fp8, const char* tag,
                               bool fast_accumulation = false, FewRows few = FewRows::kCublasLt) {
  const int vocab = m.config.vocab_size;
  const auto prompts = golden_prompts();
  const int n = 32;
  for (bool graphs : {true, false}) {
    auto gpu = make(m, "cuda", fp8_weights, graphs, kv_fp8, fast_accumulation, few),
         cpu = make(m, "cpu", fp8_weights, true, kv_fp8);
    const auto g = greedy(*gpu, prompts, n), c = greedy(*cpu, prompts, n);
    for (size_t s = 0; s < prompts.size(); ++s) {
      int agree = 0;
      while (agree < n && g[s][agree] == c[s][agree]) ++agree;
      std::printf("[tiny-qwen3 %s] graphs=%d prompt %zu: CUDA greedy agrees with the CPU emulation for %d/%d tokens\n",
                  tag, graphs, s, agree, n);
      if (agree == n) continue;
      std::vector<int32_t> prefix = prompts[s];
      prefix.insert(prefix.end(), c[s].begin(), c[s].begin() + agree);
      auto oracle = make(m, "cpu", fp8_weights, true, kv_fp8),
           gpu_tf = make(m, "cuda", fp8_weights, false, kv_fp8, fast_accumulation, few);
      const std::vector<float> lc = teacher_forced_logits(*oracle, prefix, kBlockSize);
      const std::vector<float> lg = teacher_forced_logits(*gpu_tf, prefix, kBlockSize);
      const float* last_c = lc.data() + (prefix.size() - 1) * vocab;
      const float* last_g = lg.data() + (prefix.size() - 1) * vocab;
      double var = 0;
      for (int v = 0; v < vocab; ++v) var += (last_c[v] - last_g[v]) * (last_c[v] - last_g[v]);
      const double sigma = std::sqrt(var / vocab);
      const float gap = last_c[c[s][agree]] - last_c[g[s][agree]];
      std::printf("[tiny-qwen3 %s]   parted at token %d: CPU logit gap %.4f, CPU-GPU logit noise sigma %.4f\n", tag,
                  agree, gap, sigma);
      EXPECT_LT(gap, 4 * sigma) << tag << " prompt " << s << " parted at a clear choice";
    }
    if (graphs) {
      auto* cuda = dynamic_cast<CudaBackend*>(gpu.get());
      ASSERT_NE(cuda, nullptr);
      EXPECT_GT(cuda->num_graph_steps(), 0);
    }
  }
}

TEST(Fp8Engine, GreedyMatchesCpuEmulation) { expect_greedy_matches_cpu(load(tiny_dir()), true, false, "fp8"); }
TEST(Fp8Engine, FastAccumulationGreedyMatchesCpuEmulation) {
  expect_greedy_matches_cpu(load(tiny_dir()), true, false, "fp8 fast accumulation", true);
}
// --fp8-gemv-rows 4: the golden prompts decode together (at most 4 rows a step), so every decode step's
// projections run through the GEMV (the prompts' prefill and the teacher-forced oracle through cuBLASLt).
TEST(Fp8Engine, GemvGreedyMatchesCpuEmulation) {
  ASSERT_LE(golden_prompts().size(), static_cast<size_t>(kFp8GemvMaxRows));
  expect_greedy_matches_cpu(load(tiny_dir()), true, false, "fp8 gemv", false, FewRows::kGemv);
  expect_greedy_matches_cpu(load(tiny_dir()), true, true, "fp8 gemv kv-fp8", false, FewRows::kGemv);
}
// The few-row tensor-core GEMM (BackendOptions::fp8_small_gemm_rows 16, the GEMV off): the golden
// prompts decode together, so every decode step's projections run through it (a prefill of more
// than 16 tokens, and the teacher-forced oracle's, through cuBLASLt).
TEST(Fp8Engine, SmallGemmGreedyMatchesCpuEmulation) {
  expect_greedy_matches_cpu(load(tiny_dir()), true, false, "fp8 small gemm", false, FewRows::kSmallGemm);
  expect_greedy_matches_cpu(load(tiny_dir()), true, true, "fp8 small gemm kv-fp8", false, FewRows::kSmallGemm);
}

// The FP8 KV cache on the GPU (bf16 weights) implements the CPU's emulation: its logits are
// closer to the CPU with the FP8 cache than to the CPU without it (wrong codes, scales or
// addressing would not be), with the same perplexity within 1%; then FP8 weights and FP8 KV
// together, against the CPU emulating both.
TEST(Fp8KvCache, TeacherForcedLogitsFollowTheCpuEmulation) {
  const Model m = load(tiny_dir());
  const int vocab = m.config.vocab_size;
  const std::vector<int32_t> ids = wikitext_ids(256);
  for (bool fp8_weights : {false, true}) {
    auto gpu = make(m, "cuda", fp8_weights, true, true);
    auto cpu = make(m, "cpu", fp8_weights, true, true), cpu_bf16_kv = make(m, "cpu", fp8_weights);
    const std::vector<float> g = teacher_forced_logits(*gpu, ids, kBlockSize);
    const std::vector<float> c = teacher_forced_logits(*cpu, ids, kBlockSize);
    const std::vector<float> cb = teacher_forced_logits(*cpu_bf16_kv, ids, kBlockSize);
    const double to_emulation = rel_err(g, c), to_unquantized = rel_err(g, cb), kv_effect = rel_err(c, cb);
    const double ppl_g = perplexity(g, ids, vocab), ppl_c = perplexity(c, ids, vocab), ppl_cb = perplexity(cb, ids, vocab);
    std::printf("[tiny-qwen3 kv fp8] weights %s: rel err CUDA FP8-KV vs CPU FP8-KV %.3e, vs CPU unquantized KV %.3e; "
                "FP8 KV effect on the CPU %.3e; perplexity CUDA %.4f, CPU FP8-KV %.4f, CPU unquantized KV %.4f\n",
                fp8_weights ? "fp8" : "bf16", to_emulation, to_unquantized, kv_effect, ppl_g, ppl_c, ppl_cb);
    EXPECT_LT(to_emulation, to_unquantized);
    EXPECT_LT(std::fabs(ppl_g / ppl_c - 1), 0.01);
  }
}

// Greedy with the FP8 KV cache (bf16 weights, then FP8 weights too).
TEST(Fp8KvCache, GreedyMatchesCpuEmulation) {
  const Model m = load(tiny_dir());
  expect_greedy_matches_cpu(m, false, true, "kv fp8");
  expect_greedy_matches_cpu(m, true, true, "fp8 + kv fp8");
}

// An FP8 checkpoint on the GPU: compressed-tensors per channel = on-load quantization (the same
// codes and scales, so the same logits bit for bit); ModelOpt with static input scales close to
// the CPU's emulation of it.
TEST(Fp8Engine, CheckpointsMatch) {
  origami::testing::TempDir ct, mo;
  origami::testing::write_fp8_checkpoint(tiny_dir(), ct.path(), origami::testing::Fp8Format::kCompressedTensorsChannel);
  origami::testing::write_fp8_checkpoint(tiny_dir(), mo.path(), origami::testing::Fp8Format::kModelOptConfig, 0.05f);
  const Model bf16 = load(tiny_dir()), ckpt = load(ct.path().string()), modelopt = load(mo.path().string());
  std::vector<int32_t> ids(96);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + 11) % bf16.config.vocab_size);
  auto a = make(ckpt, "cuda", false), b = make(bf16, "cuda", true);
  EXPECT_EQ(teacher_forced_logits(*a, ids, kBlockSize), teacher_forced_logits(*b, ids, kBlockSize));
  // Static scales: the same comparison as the dynamic case (closer to the emulation than FP8 is
  // to full precision).
  const std::vector<int32_t> text = wikitext_ids(256);
  auto g = make(modelopt, "cuda", false), c = make(modelopt, "cpu", false), f = make(bf16, "cpu", false);
  const std::vector<float> lc = teacher_forced_logits(*c, text, kBlockSize);
  const double err = rel_err(teacher_forced_logits(*g, text, kBlockSize), lc), effect = rel_err(lc, teacher_forced_logits(*f, text, kBlockSize));
  std::printf("[tiny-qwen3 fp8] ModelOpt static scales: rel err CUDA vs CPU %.3e, CPU FP8 vs fp32 %.3e\n", err, effect);
  EXPECT_LT(err, effect);
}

TEST(Fp8Engine, DummyWeightsRun) {
  const Model m = load(tiny_dir());
  BackendOptions opt;
  opt.device = "cuda";
  opt.quantization = WeightQuantization::kFp8;
  auto r = create_cuda_backend(opt);
  ASSERT_TRUE(r.has_value());
  auto b = std::move(r).value();
  ASSERT_TRUE(b->load_dummy(m.config, 3).is_ok());
  ASSERT_TRUE(b->allocate_kv_cache(KVLayout::full(m.config.num_layers, m.config.num_kv_heads, m.config.head_dim,
                                                  kBlockSize, kNumBlocks, DType::kBF16))
                  .is_ok());
  const std::vector<float> l = teacher_forced_logits(*b, {1, 2, 3, 4, 5, 6, 7, 8}, kBlockSize);
  ASSERT_EQ(l.size(), 8u * m.config.vocab_size);
  double sum = 0;
  for (float v : l) {
    ASSERT_TRUE(std::isfinite(v));
    sum += std::fabs(v);
  }
  EXPECT_GT(sum, 0.0);
}

}  // namespace
}  // namespace origami::cuda
