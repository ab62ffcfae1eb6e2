// The CPU backend against the reference implementation's fp32 outputs on the real test models:
// teacher-forced top-8 logits, and 48-token greedy continuations reproduced token for token.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "backend_cpu_test_util.h"

namespace origami::test {
namespace {

struct GoldenCase {
  const char* model;
  // Allowed |logit - golden| as a fraction of the position's largest |golden logit| (at least 1).
  // Both goldens are fp32 compute of the stored weights (bf16 -> fp32 is exact), so differences
  // are summation-order rounding only: measured ~1.2e-6 (stories260k) and ~1e-6 (tiny Qwen3);
  // 1e-4 leaves two orders of magnitude of margin yet catches any real formula error.
  double relative_tolerance;
};

class CpuGolden : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(CpuGolden, TeacherForcedTopLogits) {
  const GoldenCase gc = GetParam();
  const nlohmann::json golden = load_golden(gc.model);
  const int block_size = 16;
  auto backend = make_cpu_backend(gc.model, block_size, 64);
  ASSERT_NE(backend, nullptr);
  const int vocab = backend->config().vocab_size;
  double worst = 0.0;
  for (const auto& tf : golden["teacher_forced"]) {
    const std::vector<int32_t> ids = tf["ids"].get<std::vector<int32_t>>();
    PageCounter pages;
    TestSequence seq(1);
    StepOutput out = run_step(*backend, {{&seq, ids, LogitsMode::kAll}}, block_size, &pages);
    ASSERT_EQ(out.all_logits[0].size(), ids.size() * vocab);
    const auto& topk = tf["logits_topk"];
    ASSERT_EQ(topk.size(), ids.size());
    for (size_t pos = 0; pos < ids.size(); ++pos) {
      const float* logits = out.all_logits[0].data() + pos * vocab;
      double scale = 1.0;
      for (const auto& e : topk[pos]) scale = std::max(scale, std::fabs(e[1].get<double>()));
      const double tol = gc.relative_tolerance * scale;
      std::vector<char> in_golden(vocab, 0);
      double golden_min = 1e300;
      for (const auto& e : topk[pos]) {
        const int id = e[0].get<int>();
        const double want = e[1].get<double>();
        in_golden[id] = 1;
        golden_min = std::min(golden_min, want);
        const double err = std::fabs(logits[id] - want);
        worst = std::max(worst, err / scale);
        EXPECT_LE(err, tol) << gc.model << " pos " << pos << " id " << id;
      }
      // Top-8 ids agree: nothing outside the golden set may beat the golden 8th logit by more
      // than the tolerance (a swap at the boundary is allowed only between near-equal logits).
      for (int id = 0; id < vocab; ++id) {
        if (in_golden[id]) continue;
        EXPECT_LT(logits[id], golden_min + tol) << gc.model << " pos " << pos << " id " << id;
      }
      // And the order of ours matches the golden order up to near ties.
      std::vector<int> order(vocab);
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + 8, order.end(),
                        [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
      for (int r = 0; r < 8; ++r) {
        const int golden_id = topk[pos][r][0].get<int>();
        if (order[r] != golden_id) {
          EXPECT_LE(std::fabs(logits[order[r]] - topk[pos][r][1].get<double>()), 2 * tol)
              << gc.model << " pos " << pos << " rank " << r;
        }
      }
    }
  }
  std::printf("[ info ] %s: max |logit - golden| / logit scale = %.3g\n", gc.model, worst);
}

TEST_P(CpuGolden, GreedyContinuations) {
  const GoldenCase gc = GetParam();
  const nlohmann::json golden = load_golden(gc.model);
  const int block_size = 16;
  auto backend = make_cpu_backend(gc.model, block_size, 64);
  ASSERT_NE(backend, nullptr);
  for (const auto& g : golden["greedy"]) {
    const std::vector<int32_t> prompt = g["prompt_ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> want = g["greedy_ids"].get<std::vector<int32_t>>();
    PageCounter pages;
    TestSequence seq(1);
    std::vector<int32_t> got;
    StepOutput out = run_step(*backend, {{&seq, prompt, LogitsMode::kLast}}, block_size, &pages);
    got.push_back(out.sampled_tokens[0]);
    while (got.size() < want.size()) {
      out = run_step(*backend, {{&seq, {got.back()}, LogitsMode::kLast}}, block_size, &pages);
      got.push_back(out.sampled_tokens[0]);
    }
    EXPECT_EQ(got, want) << gc.model << " prompt: " << g["prompt"].get<std::string>();
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CpuGolden,
                         ::testing::Values(GoldenCase{"stories260k", 1e-4}, GoldenCase{"origami-tiny-qwen3", 1e-4}),
                         [](const auto& info) {
                           std::string n = info.param.model;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace origami::test
