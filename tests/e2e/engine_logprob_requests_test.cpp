// Log-probabilities reach exactly the requests that ask for them, as such requests come and go:
// the engine asks the backend for them (and looks each scheduled request up for them) only while
// a request that wants them is tracked, so the count of those must follow every add and release.
#include <gtest/gtest.h>

#include <cmath>

#include "engine_test_util.h"

namespace origami::testing {
namespace {

BatchItem plain(std::vector<int32_t> prompt, int max_tokens) {
  BatchItem item;
  item.prompt_token_ids = std::move(prompt);
  item.sampling = greedy(max_tokens);
  return item;
}

BatchItem with_top_logprobs(std::vector<int32_t> prompt, int max_tokens, int top) {
  BatchItem item = plain(std::move(prompt), max_tokens);
  item.options.logprobs = top;
  return item;
}

BatchItem with_forced_logprobs(std::vector<int32_t> prompt, std::vector<int32_t> forced) {
  BatchItem item = plain(std::move(prompt), static_cast<int>(forced.size()));
  item.options.forced_output_tokens = std::move(forced);
  item.options.return_forced_logprobs = true;
  return item;
}

void expect_top_logprobs(const BatchResult& r, int top) {
  ASSERT_TRUE(r.ok) << r.error;
  ASSERT_EQ(r.logprobs.size(), r.output_token_ids.size());
  for (const TokenLogprobs& lp : r.logprobs) {
    EXPECT_TRUE(std::isfinite(lp.logprob));
    EXPECT_LE(lp.logprob, 0.0f);
    EXPECT_EQ(static_cast<int>(lp.top.size()), top);
  }
}

void expect_none(const BatchResult& r) {
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_TRUE(r.logprobs.empty());
  EXPECT_TRUE(r.forced_logprobs.empty());
}

TEST(EngineLogprobRequests, OnlyTheRequestsThatAskGetThemAcrossAddsAndReleases) {
  auto engine = make_engine(cpu_config(stories_dir()));
  ASSERT_NE(engine, nullptr);
  // None asks: none gets any.
  std::vector<BatchResult> first = run_batch(*engine, {plain({1, 5, 9}, 6), plain({1, 7}, 4)});
  for (const BatchResult& r : first) expect_none(r);
  // One asks beside one that does not, after the first ones were released.
  std::vector<BatchResult> second = run_batch(*engine, {with_top_logprobs({1, 5, 9}, 6, 3), plain({1, 7}, 4)});
  expect_top_logprobs(second[0], 3);
  expect_none(second[1]);
  // Greedy: the tokens are those of the same prompt without log-probabilities.
  EXPECT_EQ(second[0].output_token_ids, first[0].output_token_ids);
  // Teacher forcing after that request was released, and a plain request beside it.
  std::vector<BatchResult> third = run_batch(*engine, {plain({1, 7}, 4), with_forced_logprobs({1, 7, 3}, {4, 5, 6})});
  expect_none(third[0]);
  ASSERT_TRUE(third[1].ok) << third[1].error;
  ASSERT_EQ(third[1].forced_logprobs.size(), 3u);
  for (float lp : third[1].forced_logprobs) EXPECT_TRUE(std::isfinite(lp) && lp <= 0.0f);
  // All released: a plain request, then one that asks again.
  expect_none(run_batch(*engine, {plain({1, 5, 9}, 6)})[0]);
  expect_top_logprobs(run_batch(*engine, {with_top_logprobs({1, 7}, 4, 1)})[0], 1);
}

// Requests that ask and requests that do not, running in the same steps and finishing at
// different steps (one released while the other still runs).
TEST(EngineLogprobRequests, MixedInOneBatchWithDifferentLengths) {
  auto engine = make_engine(cpu_config(stories_dir()));
  ASSERT_NE(engine, nullptr);
  std::vector<BatchResult> results =
      run_batch(*engine, {with_top_logprobs({1, 5, 9}, 2, 2), plain({1, 7}, 8), with_top_logprobs({1, 7, 3}, 8, 4),
                          plain({1, 9}, 3)});
  expect_top_logprobs(results[0], 2);
  expect_none(results[1]);
  expect_top_logprobs(results[2], 4);
  expect_none(results[3]);
}

}  // namespace
}  // namespace origami::testing
