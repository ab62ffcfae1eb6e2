// The CPU backend's OpenAI logprobs (SequenceInput::num_top_logprobs) against a brute-force
// log_softmax of the logits the same step returns (LogitsMode::kAll): the sampled token's
// log-probability (temperature sampling, so it is the raw distribution's, not the sampler's)
// and the top k; teacher-forced rows report the forced token; rows that ask nothing get NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend_cpu_test_util.h"
#include "sampling/logprob.h"

namespace origami::test {
namespace {

std::vector<double> brute_log_softmax(const std::vector<float>& row) {
  double m = -INFINITY;
  for (float x : row) m = std::max<double>(m, x);
  double sum = 0;
  for (float x : row) sum += std::exp(static_cast<double>(x) - m);
  std::vector<double> out(row.size());
  for (size_t i = 0; i < row.size(); ++i) out[i] = row[i] - m - std::log(sum);
  return out;
}

TEST(CpuBackendLogprobs, SampledAndTopKMatchBruteForceLogSoftmax) {
  constexpr int kBlock = 16;
  auto backend = make_cpu_backend("origami-tiny-qwen3", kBlock, 64);
  ASSERT_NE(backend, nullptr);
  const int vocab = backend->config().vocab_size;
  PageCounter pages;
  TestSequence a(1), b(2), c(3);
  a.sampling.temperature = 1.5f;  // a sampled (not greedy) token: its raw log-prob, not the tempered one
  a.sampling.top_k = 50;
  const std::vector<int32_t> prompt_a = {97, 11, 187, 0, 358, 1079}, prompt_b = {40, 1075, 264}, prompt_c = {1, 2};
  for (int step = 0; step < 3; ++step) {
    ForwardBatch batch;
    std::vector<TestSequence*> seqs = {&a, &b, &c};
    const std::vector<const std::vector<int32_t>*> prompts = {&prompt_a, &prompt_b, &prompt_c};
    std::vector<int32_t> tokens_of[3];
    for (int s = 0; s < 3; ++s) {
      tokens_of[s] = step == 0 ? *prompts[s] : std::vector<int32_t>{static_cast<int32_t>(100 + step + s)};
      TestSequence& q = *seqs[s];
      q.reserve(q.num_entries + static_cast<int>(tokens_of[s].size()), kBlock, &pages);
      SequenceInput in;
      in.request_id = q.id;
      in.query_start = static_cast<int>(batch.token_ids.size());
      in.num_query_tokens = static_cast<int>(tokens_of[s].size());
      in.start_position = q.num_entries;
      in.num_cached_entries = q.num_entries;
      in.block_table = &q.table;
      in.logits_mode = LogitsMode::kAll;
      in.sampling = &q.sampling;
      in.seed = 7;
      in.sample_index = step;
      in.num_top_logprobs = s == 0 ? 5 : s == 1 ? kMaxTopLogprobs : -1;
      if (s == 1) in.logprob_token = 777;  // teacher forcing: the forced token's log-prob
      for (size_t i = 0; i < tokens_of[s].size(); ++i) {
        batch.token_ids.push_back(tokens_of[s][i]);
        batch.positions.push_back(q.num_entries + static_cast<int>(i));
      }
      batch.sequences.push_back(in);
    }
    StepOutput out;
    ASSERT_TRUE(backend->execute(batch, &out).is_ok());
    ASSERT_EQ(out.logprobs.size(), 3u);
    for (int s = 0; s < 3; ++s) {
      seqs[s]->num_entries += static_cast<int>(tokens_of[s].size());
      const SequenceInput& in = batch.sequences[s];
      if (in.num_top_logprobs < 0) {
        EXPECT_TRUE(std::isnan(out.logprobs[s].logprob));
        EXPECT_TRUE(out.logprobs[s].top.empty());
        continue;
      }
      const std::vector<double> want = brute_log_softmax(last_row(out.all_logits[s], vocab));
      const int32_t token = in.logprob_token >= 0 ? in.logprob_token : out.sampled_tokens[s];
      EXPECT_NEAR(out.logprobs[s].logprob, want[token], 1e-5) << "step " << step << " seq " << s;
      std::vector<int> order(vocab);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return want[x] > want[y]; });
      ASSERT_EQ(static_cast<int>(out.logprobs[s].top.size()), in.num_top_logprobs);
      for (int j = 0; j < in.num_top_logprobs; ++j) {
        EXPECT_EQ(out.logprobs[s].top[j].token, order[j]) << "step " << step << " seq " << s << " rank " << j;
        EXPECT_NEAR(out.logprobs[s].top[j].logprob, want[order[j]], 1e-5);
      }
    }
  }
}

TEST(CpuBackendLogprobs, MoreThanTheMaximumIsRefused) {
  auto backend = make_cpu_backend("origami-tiny-qwen3", 16, 8);
  ASSERT_NE(backend, nullptr);
  TestSequence a(1);
  PageCounter pages;
  a.reserve(2, 16, &pages);
  ForwardBatch batch;
  batch.token_ids = {1, 2};
  batch.positions = {0, 1};
  SequenceInput in;
  in.num_query_tokens = 2;
  in.block_table = &a.table;
  in.sampling = &a.sampling;
  in.num_top_logprobs = kMaxTopLogprobs + 1;
  batch.sequences.push_back(in);
  StepOutput out;
  const Status st = backend->execute(batch, &out);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("num_top_logprobs"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace origami::test
