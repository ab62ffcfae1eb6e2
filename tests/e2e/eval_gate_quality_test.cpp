// The shipped Fast KVzip gates of origami-tiny-qwen3 (assets/gates/, docs/gates.md) still predict
// KVzip's scores as recorded: on held-out text the model never saw (tests/data/gates/heldout.txt,
// a frozen copy of two passages of this project's docs; the first 512-token window of each),
// Spearman and top-25% overlap against exact KVzip scores must match the numbers in
// docs/gates.md, and beat the gates' initialization (which ranks at chance) by a wide margin.
// The metrics themselves are checked against hand-worked cases.
#include <gtest/gtest.h>

#include "engine/prompt_builder.h"
#include "engine_test_util.h"
#include "eval/gate_training.h"
#include "tokenizer/tokenizer.h"

namespace origami::testing {
namespace {

// Recorded in docs/gates.md ("CI check"), from this test's own setup.
constexpr double kRecordedSpearman = 0.3251;
constexpr double kRecordedOverlap = 0.4122;
constexpr double kTolerance = 0.005;

TEST(GateQuality, MetricsOnHandWorkedCases) {
  EXPECT_DOUBLE_EQ(eval::spearman({1, 2, 3, 4}, {10, 20, 30, 40}), 1.0);
  EXPECT_DOUBLE_EQ(eval::spearman({1, 2, 3, 4}, {4, 3, 2, 1}), -1.0);
  // Ranks (1, 2, 3) vs (1.5, 1.5, 3): rho = 0.866...
  EXPECT_NEAR(eval::spearman({1, 2, 3}, {5, 5, 9}), std::sqrt(3.0) / 2.0, 1e-12);
  EXPECT_EQ(eval::spearman({1, 1, 1}, {1, 2, 3}), 0.0);
  EXPECT_DOUBLE_EQ(eval::topk_overlap({9, 8, 1, 0}, {9, 0, 8, 1}, 2), 0.5);
  EXPECT_DOUBLE_EQ(eval::topk_overlap({1, 2, 3, 4}, {1, 2, 3, 4}, 3), 1.0);
  // Ties go to the later token in both rankings.
  EXPECT_DOUBLE_EQ(eval::topk_overlap({1, 1, 1, 1}, {0, 0, 0, 5}, 1), 1.0);
}

TEST(GateQuality, ShippedGatesReproduceTheRecordedHeldOutAgreement) {
  Expected<ModelConfig> config = load_model_config(tiny_qwen3_dir());
  ASSERT_TRUE(config.has_value());
  Expected<std::shared_ptr<Tokenizer>> tok = Tokenizer::load(tiny_qwen3_dir());
  ASSERT_TRUE(tok.has_value());
  Expected<gates::GateWeights> trained = gates::load_gates(tiny_qwen3_gates(), *config);
  ASSERT_TRUE(trained.has_value()) << trained.status().message();
  eval::SampleReadOptions read;
  read.max_samples = 2;
  read.max_tokens = 512;
  read.min_tokens = 256;
  Expected<std::vector<eval::CalibrationSample>> samples = eval::read_calibration_samples(
      std::string(ORIGAMI_TEST_DATA_DIR) + "/gates/heldout.txt", PromptBuilder(*tok), read);
  ASSERT_TRUE(samples.has_value()) << samples.status().message();
  ASSERT_EQ(samples->size(), 2u);
  eval::KVzipOptions options;
  options.prompts = eval::kvzip_prompts(**tok);
  auto scorer = eval::KVzipScorer::create(tiny_qwen3_dir(), *config, options, read.max_tokens, 0);
  ASSERT_TRUE(scorer.has_value());
  Expected<std::vector<eval::KVzipResult>> scored = eval::score_samples(**scorer, *samples, nullptr);
  ASSERT_TRUE(scored.has_value()) << scored.status().message();
  const eval::GateQuality q = eval::measure_gate_quality(*trained, *scored, 0.25, options.num_sinks);
  const eval::GateQuality init =
      eval::measure_gate_quality(gates::init_gates(trained->shape, 0), *scored, 0.25, options.num_sinks);
  std::printf("held-out CI text: trained spearman %.4f overlap %.4f; initial spearman %.4f overlap %.4f\n",
              q.spearman, q.overlap, init.spearman, init.overlap);
  EXPECT_NEAR(q.spearman, kRecordedSpearman, kTolerance);
  EXPECT_NEAR(q.overlap, kRecordedOverlap, kTolerance);
  EXPECT_GT(q.spearman, init.spearman + 0.1);
  EXPECT_GT(q.overlap, init.overlap + 0.05);
}

}  // namespace
}  // namespace origami::testing
