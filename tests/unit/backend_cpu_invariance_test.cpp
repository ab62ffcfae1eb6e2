// A sequence's logits are bit-identical however it is computed: one prefill or chunks of 1, 7,
// 16 tokens; pages of 1, 16 or 32 entries; alone or batched with 31 other sequences that are
// prefilling and decoding in the same steps; on any number of threads; with an fp32, bf16 or fp8
// KV cache (the emulated narrower caches round each entry on its own, so nothing above may change
// their values either).
#include <algorithm>
#include <string>
#include <tuple>

#include "backend_cpu_test_util.h"

namespace origami::test {
namespace {

constexpr int kDecodeSteps = 4;

struct Variant {
  int block_size = 16;
  int chunk = 0;          // 0: the whole prompt in one step
  bool batched = false;   // run beside 31 other sequences
  int num_threads = 0;    // 0: all cores
};

// Prompts of assorted lengths for the other sequences, cut from the golden token lists.
std::vector<std::vector<int32_t>> other_prompts(const nlohmann::json& golden, int count) {
  std::vector<int32_t> pool;
  for (const auto& tf : golden["teacher_forced"])
    for (int id : tf["ids"]) pool.push_back(id);
  for (const auto& g : golden["greedy"])
    for (int id : g["prompt_ids"]) pool.push_back(id);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < count; ++i) {
    const int len = 1 + (i * 13) % 40;
    const int start = (i * 29) % (static_cast<int>(pool.size()) - len);
    prompts.emplace_back(pool.begin() + start, pool.begin() + start + len);
  }
  return prompts;
}

// Logits of the target's last prompt token and of its next kDecodeSteps greedy decodes.
std::vector<std::vector<float>> run_target(const std::string& model, const std::vector<int32_t>& prompt,
                                           const Variant& v, const nlohmann::json& golden,
                                           KVCacheDType kv_dtype) {
  const int num_blocks = 1 + 32 * ((160 + v.block_size - 1) / v.block_size);
  auto backend = make_cpu_backend(model, v.block_size, num_blocks, v.num_threads, kv_dtype);
  if (!backend) return {};
  const int vocab = backend->config().vocab_size;
  PageCounter pages;
  TestSequence target(0);
  std::vector<TestSequence> others;
  std::vector<std::vector<int32_t>> prompts;
  if (v.batched) {
    prompts = other_prompts(golden, 31);
    for (int i = 0; i < 31; ++i) others.emplace_back(i + 1);
  }
  std::vector<int32_t> other_next(others.size(), -1);  // next token of each other sequence

  // Everything the other sequences do in a step: prefill their prompt at the first step, then
  // decode one token per step.
  auto add_others = [&](std::vector<StepPart>* parts) {
    for (size_t i = 0; i < others.size(); ++i) {
      if (other_next[i] < 0) parts->push_back({&others[i], prompts[i], LogitsMode::kLast});
      else parts->push_back({&others[i], {other_next[i]}, LogitsMode::kLast});
    }
  };
  auto take_others = [&](const StepOutput& out, size_t first) {
    for (size_t i = 0; i < others.size(); ++i) {
      EXPECT_GE(out.sampled_tokens[first + i], 0);
      other_next[i] = out.sampled_tokens[first + i];
    }
  };

  std::vector<std::vector<float>> result;
  const int chunk = v.chunk > 0 ? v.chunk : static_cast<int>(prompt.size());
  int32_t next = -1;
  for (int start = 0; start < static_cast<int>(prompt.size()); start += chunk) {
    const int n = std::min(chunk, static_cast<int>(prompt.size()) - start);
    const bool last = start + n == static_cast<int>(prompt.size());
    std::vector<StepPart> parts;
    add_others(&parts);
    const size_t target_idx = parts.size();
    parts.push_back({&target, {prompt.begin() + start, prompt.begin() + start + n},
                     last ? LogitsMode::kAll : LogitsMode::kNone});
    StepOutput out = run_step(*backend, parts, v.block_size, &pages);
    take_others(out, 0);
    if (last) {
      EXPECT_EQ(out.all_logits[target_idx].size(), static_cast<size_t>(n) * vocab);
      result.push_back(last_row(out.all_logits[target_idx], vocab));
      next = out.sampled_tokens[target_idx];
    } else {
      EXPECT_EQ(out.sampled_tokens[target_idx], -1);
      EXPECT_TRUE(out.all_logits[target_idx].empty());
    }
  }
  for (int step = 0; step < kDecodeSteps; ++step) {
    std::vector<StepPart> parts;
    parts.push_back({&target, {next}, LogitsMode::kAll});
    add_others(&parts);
    StepOutput out = run_step(*backend, parts, v.block_size, &pages);
    take_others(out, 1);
    result.push_back(out.all_logits[0]);
    next = out.sampled_tokens[0];
  }
  return result;
}

class CpuInvariance : public ::testing::TestWithParam<std::tuple<std::string, KVCacheDType>> {};

TEST_P(CpuInvariance, LogitsBitIdenticalAcrossChunkingPagingAndBatching) {
  const auto [model, kv_dtype] = GetParam();
  const nlohmann::json golden = load_golden(model);
  const std::vector<int32_t> prompt = golden["greedy"][2]["prompt_ids"].get<std::vector<int32_t>>();
  const auto reference = run_target(model, prompt, {16, 0, false}, golden, kv_dtype);
  ASSERT_EQ(reference.size(), 1u + kDecodeSteps);
  if (kv_dtype != KVCacheDType::kAuto) {
    // The emulation must actually round: its logits differ from the fp32 cache's.
    const auto fp32 = run_target(model, prompt, {16, 0, false}, golden, KVCacheDType::kAuto);
    ASSERT_EQ(fp32.size(), reference.size());
    EXPECT_FALSE(fp32.back() == reference.back()) << kv_cache_dtype_name(kv_dtype) << " KV gives the fp32 logits";
  }
  const std::vector<Variant> variants = {
      {1, 0, false},  {32, 0, false}, {16, 1, false}, {16, 7, false}, {16, 16, false},
      {1, 7, false},  {32, 7, false}, {16, 0, true},  {16, 7, true},  {1, 16, true},
      {16, 7, true, 1}, {32, 0, false, 1}, {16, 7, true, 3},
  };
  for (const Variant& v : variants) {
    const auto got = run_target(model, prompt, v, golden, kv_dtype);
    ASSERT_EQ(got.size(), reference.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(got[i] == reference[i]) << model << " " << kv_cache_dtype_name(kv_dtype) << ": block_size "
                                          << v.block_size << ", chunk " << v.chunk
                                          << (v.batched ? ", batched" : ", alone") << ", threads " << v.num_threads
                                          << ": logits of step " << i << " differ";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CpuInvariance,
                         ::testing::Combine(::testing::Values("stories260k", "origami-tiny-qwen3"),
                                            ::testing::Values(KVCacheDType::kAuto, KVCacheDType::kBF16,
                                                              KVCacheDType::kFP8)),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param);
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n + "_" + kv_cache_dtype_name(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace origami::test
