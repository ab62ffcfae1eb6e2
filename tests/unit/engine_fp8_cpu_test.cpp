// FP8 on the CPU backend (the emulation the CUDA FP8 path is tested against): the tiny models in
// FP8 against themselves in full precision (perplexity on wikitext, teacher-forced logit error,
// greedy agreement and the logit gap where the runs part); FP8 checkpoints against on-load
// quantization (bit-identical); static input scales; the engine flag.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "engine/engine.h"
#include "model/fp8_weights.h"
#include "tokenizer/tokenizer.h"
#include "unit/backend_cpu_test_util.h"
#include "unit/fp8_checkpoint_fixture.h"
#include "unit/model_test_util.h"

namespace origami {
namespace {

constexpr int kBlockSize = 16;
constexpr int kNumBlocks = 128;

std::unique_ptr<CpuBackend> make_backend(const std::filesystem::path& dir, bool fp8) {
  auto config = load_model_config(dir);
  EXPECT_TRUE(config.has_value()) << config.status().to_string();
  auto weights = load_model_weights(dir, *config);
  EXPECT_TRUE(weights.has_value()) << weights.status().to_string();
  BackendOptions options;
  options.num_threads = 2;
  if (fp8) options.quantization = WeightQuantization::kFp8;
  auto backend = std::make_unique<CpuBackend>(options);
  Status st = backend->load(*config, *weights);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  st = backend->allocate_kv_cache(KVLayout::full(config->num_layers, config->num_kv_heads, config->head_dim, kBlockSize,
                                                 kNumBlocks, DType::kF32));
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return backend;
}

std::vector<float> all_logits(Backend& backend, const std::vector<int32_t>& ids) {
  test::PageCounter pages;
  test::TestSequence seq(1);
  StepOutput out = test::run_step(backend, {{&seq, ids, LogitsMode::kAll}}, kBlockSize, &pages);
  return out.all_logits.empty() ? std::vector<float>{} : out.all_logits[0];
}

// Perplexity of ids[1..] given the logits of every position.
double perplexity(const std::vector<float>& logits, const std::vector<int32_t>& ids, int vocab) {
  double nll = 0;
  for (size_t t = 0; t + 1 < ids.size(); ++t) {
    const float* row = logits.data() + t * vocab;
    double mx = row[0];
    for (int v = 1; v < vocab; ++v) mx = std::max(mx, static_cast<double>(row[v]));
    double sum = 0;
    for (int v = 0; v < vocab; ++v) sum += std::exp(row[v] - mx);
    nll -= row[ids[t + 1]] - mx - std::log(sum);
  }
  return std::exp(nll / static_cast<double>(ids.size() - 1));
}

std::vector<int32_t> wikitext_ids(const std::filesystem::path& model, size_t count) {
  auto tok = Tokenizer::load(model.string());
  EXPECT_TRUE(tok.has_value()) << tok.status().to_string();
  std::ifstream in(std::string(ORIGAMI_SHARED_DIR) + "/data/wikitext2_test_dev.txt");
  std::stringstream text;
  text << in.rdbuf();
  std::vector<int32_t> ids = (*tok)->encode(text.str().substr(0, 8 * count), true);
  EXPECT_GE(ids.size(), count);
  ids.resize(std::min(ids.size(), count));
  return ids;
}

// Greedy continuation of `prompt` for `n` tokens, one decode step at a time.
std::vector<int32_t> greedy(Backend& backend, const std::vector<int32_t>& prompt, int n) {
  test::PageCounter pages;
  test::TestSequence seq(1);
  std::vector<int32_t> out;
  StepOutput step = test::run_step(backend, {{&seq, prompt, LogitsMode::kLast}}, kBlockSize, &pages);
  for (int i = 0; i < n; ++i) {
    out.push_back(step.sampled_tokens[0]);
    if (i + 1 < n) step = test::run_step(backend, {{&seq, {out.back()}, LogitsMode::kLast}}, kBlockSize, &pages);
  }
  return out;
}

struct Fp8Report {
  double ppl_full = 0, ppl_fp8 = 0, rel_err = 0;
  int agree = 0, total = 0, prompts = 0, parted_clear = 0;
};

// FP8 vs full precision on one model: perplexity over `tokens` wikitext tokens, the relative L2
// error of the teacher-forced logits, and greedy agreement over 3 prompts of 32 new tokens.
Fp8Report compare(const std::filesystem::path& model, size_t tokens) {
  Fp8Report r;
  auto full = make_backend(model, false);
  auto fp8 = make_backend(model, true);
  const int vocab = full->config().vocab_size;
  const std::vector<int32_t> ids = wikitext_ids(model, tokens);
  const std::vector<float> a = all_logits(*full, ids), b = all_logits(*fp8, ids);
  r.ppl_full = perplexity(a, ids, vocab);
  r.ppl_fp8 = perplexity(b, ids, vocab);
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += a[i] * a[i];
  }
  r.rel_err = std::sqrt(num / den);
  const std::string name = model.filename().string();
  for (size_t start : {0u, 40u, 90u}) {
    const std::vector<int32_t> prompt(ids.begin() + start, ids.begin() + start + 24);
    auto f_backend = make_backend(model, false), q_backend = make_backend(model, true);
    const std::vector<int32_t> f = greedy(*f_backend, prompt, 32), q = greedy(*q_backend, prompt, 32);
    int agree = 0;
    while (agree < 32 && f[agree] == q[agree]) ++agree;
    r.agree += agree;
    r.total += 32;
    ++r.prompts;
    if (agree < 32) {
      // Where they part: the full-precision model's gap between its token and the FP8 one.
      std::vector<int32_t> prefix = prompt;
      prefix.insert(prefix.end(), f.begin(), f.begin() + agree);
      auto oracle = make_backend(model, false);
      const std::vector<float> l = all_logits(*oracle, prefix);
      const float* last = l.data() + (prefix.size() - 1) * vocab;
      const float gap = last[f[agree]] - last[q[agree]];
      std::printf("[%s] prompt at %zu: FP8 greedy agrees for %d/32 tokens; parts where the full model's logit gap is "
                  "%.4f\n",
                  name.c_str(), start, agree, gap);
      if (gap > 0.5f) ++r.parted_clear;
    } else {
      std::printf("[%s] prompt at %zu: FP8 greedy agrees for 32/32 tokens\n", name.c_str(), start);
    }
  }
  std::printf("[%s] wikitext %zu tokens: perplexity full %.4f, FP8 %.4f (%+.2f%%); teacher-forced logits rel err "
              "%.3e; greedy agreement %d/%d\n",
              name.c_str(), ids.size(), r.ppl_full, r.ppl_fp8, 100.0 * (r.ppl_fp8 / r.ppl_full - 1), r.rel_err,
              r.agree, r.total);
  return r;
}

// Per-channel FP8 weights with per-token FP8 activations keep a trained model's perplexity
// within a few percent (published: < 1% on 8B models; the tiny models have less redundancy)
// and never part from greedy at a clear choice (a logit gap above 0.5).
TEST(Fp8Cpu, TinyQwen3CloseToFullPrecision) {
  const Fp8Report r = compare(testing::tiny_qwen3_dir(), 256);
  EXPECT_LT(r.ppl_fp8 / r.ppl_full, 1.05);
  EXPECT_LT(r.rel_err, 0.1);
  EXPECT_EQ(r.parted_clear, 0);
}

TEST(Fp8Cpu, Stories260kCloseToFullPrecision) {
  const Fp8Report r = compare(testing::stories_dir(), 256);
  EXPECT_LT(r.ppl_fp8 / r.ppl_full, 1.05);
  EXPECT_LT(r.rel_err, 0.1);
  EXPECT_EQ(r.parted_clear, 0);
}

// A compressed-tensors per-channel checkpoint holds exactly what --quantization fp8 computes
// from the bf16 one: the logits agree bit for bit.
TEST(Fp8Cpu, CheckpointEqualsOnLoadQuantization) {
  testing::TempDir dir;
  testing::write_fp8_checkpoint(testing::tiny_qwen3_dir(), dir.path(), testing::Fp8Format::kCompressedTensorsChannel);
  const std::vector<int32_t> ids = wikitext_ids(testing::tiny_qwen3_dir(), 64);
  auto from_checkpoint = make_backend(dir.path(), false);  // the checkpoint alone switches FP8 on
  auto on_load = make_backend(testing::tiny_qwen3_dir(), true);
  const std::vector<float> a = all_logits(*from_checkpoint, ids), b = all_logits(*on_load, ids);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(a, b);
  auto full = make_backend(testing::tiny_qwen3_dir(), false);
  EXPECT_NE(all_logits(*full, ids), a);  // and FP8 is not a no-op
}

// Static input scales: the activations are rounded with the checkpoint's scale, so a scale far
// too small (everything saturates) changes the logits, and a sensible one stays close.
TEST(Fp8Cpu, StaticInputScalesAreApplied) {
  const std::vector<int32_t> ids = wikitext_ids(testing::tiny_qwen3_dir(), 96);
  auto full = make_backend(testing::tiny_qwen3_dir(), false);
  const std::vector<float> ref = all_logits(*full, ids);
  auto err = [&](float input_scale) {
    testing::TempDir dir;
    testing::write_fp8_checkpoint(testing::tiny_qwen3_dir(), dir.path(), testing::Fp8Format::kModelOptConfig,
                                  input_scale);
    auto b = make_backend(dir.path(), false);
    const std::vector<float> l = all_logits(*b, ids);
    double num = 0, den = 0;
    for (size_t i = 0; i < l.size(); ++i) {
      num += (l[i] - ref[i]) * (l[i] - ref[i]);
      den += ref[i] * ref[i];
    }
    return std::sqrt(num / den);
  };
  const double sensible = err(0.05f), saturating = err(1e-4f);
  std::printf("[origami-tiny-qwen3] ModelOpt per-tensor FP8, static input scale 0.05: logits rel err %.3e; 1e-4: "
              "%.3e\n",
              sensible, saturating);
  EXPECT_LT(sensible, 0.25);
  EXPECT_GT(saturating, 2 * sensible);
}

TEST(Fp8Cpu, EngineFlag) {
  EngineConfig config;
  config.model_dir = testing::tiny_qwen3_dir().string();
  config.num_threads = 2;
  config.quantization = "fp8";
  config.fp8_fused_quantize = false;
  auto engine = Engine::create(config);
  ASSERT_TRUE(engine.has_value()) << engine.status().to_string();
  SamplingParams params;
  params.temperature = 0.0f;
  params.max_tokens = 8;
  auto run = [&](Engine& e) {
    auto id = e.add_request({1, 2, 3, 4}, params);
    EXPECT_TRUE(id.has_value());
    std::vector<int32_t> tokens;
    while (e.has_unfinished())
      for (const RequestOutput& out : e.step()) tokens.insert(tokens.end(), out.new_token_ids.begin(), out.new_token_ids.end());
    return tokens;
  };
  const std::vector<int32_t> tokens = run(**engine);
  EXPECT_EQ(tokens.size(), 8u);
  // --fp8-fused-quantize (the default) and --fp8-gemv-rows are the CUDA backend's: on the CPU they
  // change nothing.
  config.fp8_fused_quantize = true;
  config.fp8_gemv_rows = 4;
  auto fused = Engine::create(config);
  ASSERT_TRUE(fused.has_value()) << fused.status().to_string();
  EXPECT_EQ(run(**fused), tokens);
  config.quantization = "int4";
  EXPECT_TRUE(testing::message_has(Engine::create(config).status(), {"--quantization", "int4"}));
}

}  // namespace
}  // namespace origami
