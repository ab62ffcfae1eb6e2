// The CPU backend's FP8 KV emulation on real models: every entry the forward pass writes is the
// E4M3 dequantization of what an fp32 cache would hold, with that head vector's own scale (checked
// bit for bit on layer 0, whose K and V do not depend on earlier attention), and every stored head
// vector of every layer is exactly representable as E4M3 codes times amax / 448. bf16 likewise.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>

#include "backend_cpu_test_util.h"

namespace origami::test {
namespace {

// Prefill `prompt` in chunks of 5 and decode 3 greedy tokens; returns the sequence.
TestSequence fill(CpuBackend& backend, const std::vector<int32_t>& prompt, int block_size, PageCounter* pages) {
  TestSequence seq(1);
  int32_t next = -1;
  for (size_t start = 0; start < prompt.size(); start += 5) {
    const size_t end = std::min(prompt.size(), start + 5);
    StepOutput out = run_step(backend, {{&seq, {prompt.begin() + start, prompt.begin() + end}, LogitsMode::kLast}},
                              block_size, pages);
    next = out.sampled_tokens[0];
  }
  for (int i = 0; i < 3; ++i) next = run_step(backend, {{&seq, {next}, LogitsMode::kLast}}, block_size, pages).sampled_tokens[0];
  return seq;
}

std::vector<float> entry(const cpu::CpuKVCache& kv, bool key, int layer, const TestSequence& seq, int head, int e) {
  const int bs = kv.layout().block_size, d = kv.layout().head_dim;
  const float* p = key ? kv.key_at(layer, seq.table[e / bs], head, e % bs) : kv.value_at(layer, seq.table[e / bs], head, e % bs);
  return std::vector<float>(p, p + d);
}

// Whether v is E4M3 codes times one scale s whose 448 x s is v's amax (what an fp8 cache can
// hold). The stored amax is 448 x s rounded, which does not always divide back to s exactly, so
// the scales within 2 ulps of amax / 448 are tried.
bool fp8_representable(const std::vector<float>& v) {
  float amax = 0;
  for (float x : v) amax = std::max(amax, std::fabs(x));
  if (amax == 0) return true;
  float lo = amax / 448.0f;
  for (int i = 0; i < 2; ++i) lo = std::nextafter(lo, 0.0f);
  for (float scale = lo, i = 0; i < 5; ++i, scale = std::nextafter(scale, 1e30f)) {
    if (fp8_e4m3_to_f32(0x7e) * scale != amax) continue;
    bool all = true;
    for (float x : v) all = all && kv_fp8_dequantize(kv_fp8_quantize(x, scale), scale) == x;
    if (all) return true;
  }
  return false;
}

class CpuNarrowKV : public ::testing::TestWithParam<std::tuple<std::string, KVCacheDType>> {};

TEST_P(CpuNarrowKV, WritesRoundEveryEntryOnItsOwn) {
  const auto [model, kv_dtype] = GetParam();
  const nlohmann::json golden = load_golden(model);
  const std::vector<int32_t> prompt = golden["greedy"][2]["prompt_ids"].get<std::vector<int32_t>>();
  const int bs = 16, num_blocks = 40;
  auto fp32 = make_cpu_backend(model, bs, num_blocks, 2, KVCacheDType::kAuto);
  auto narrow = make_cpu_backend(model, bs, num_blocks, 2, kv_dtype);
  ASSERT_TRUE(fp32 && narrow);
  PageCounter pages_a, pages_b;
  const TestSequence a = fill(*fp32, prompt, bs, &pages_a);
  const TestSequence b = fill(*narrow, prompt, bs, &pages_b);
  ASSERT_EQ(a.num_entries, b.num_entries);
  const ModelConfig& c = narrow->config();
  int changed = 0;
  // The prompt's entries (the decoded tokens may differ between the two caches).
  for (int h = 0; h < c.num_kv_heads; ++h)
    for (int e = 0; e < static_cast<int>(prompt.size()); ++e)
      for (bool key : {true, false}) {
        std::vector<float> want = entry(fp32->kv_cache(), key, 0, a, h, e);
        const std::vector<float> raw = want;
        narrow->kv_cache().round_entry(want.data());
        if (kv_dtype == KVCacheDType::kFP8) {
          // The brute force: the nearest E4M3 code of each element over its vector's scale.
          float amax = 0;
          for (float x : raw) amax = std::max(amax, std::fabs(x));
          for (size_t i = 0; i < raw.size(); ++i)
            ASSERT_EQ(want[i], fp8_e4m3_to_f32(f32_to_fp8_e4m3(raw[i] / (amax / 448.0f))) * (amax / 448.0f));
        } else {
          for (size_t i = 0; i < raw.size(); ++i) ASSERT_EQ(want[i], bf16_to_f32(f32_to_bf16(raw[i])));
        }
        ASSERT_EQ(entry(narrow->kv_cache(), key, 0, b, h, e), want)
            << model << " layer 0 head " << h << " entry " << e << (key ? " key" : " value");
        changed += want != raw ? 1 : 0;
      }
  EXPECT_GT(changed, 0) << "rounding changed no entry";
  // Every layer: each stored vector is what the narrow cache can hold.
  for (int l = 0; l < c.num_layers; ++l)
    for (int h = 0; h < c.num_kv_heads; ++h)
      for (int e = 0; e < b.num_entries; ++e)
        for (bool key : {true, false}) {
          const std::vector<float> v = entry(narrow->kv_cache(), key, l, b, h, e);
          if (kv_dtype == KVCacheDType::kFP8) {
            ASSERT_TRUE(fp8_representable(v)) << model << " layer " << l << " head " << h << " entry " << e;
          } else {
            for (float x : v) ASSERT_EQ(x, bf16_to_f32(f32_to_bf16(x)));
          }
        }
}

INSTANTIATE_TEST_SUITE_P(Models, CpuNarrowKV,
                         ::testing::Combine(::testing::Values("stories260k", "origami-tiny-qwen3"),
                                            ::testing::Values(KVCacheDType::kBF16, KVCacheDType::kFP8)),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param);
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n + "_" + kv_cache_dtype_name(std::get<1>(info.param));
                         });

TEST(CpuNarrowKV, MemoryPlanCountsTheStoredBytes) {
  // The layout's own size: fp8 is head_dim codes + a 4-byte scale per head vector, about half of
  // bf16 (what the CUDA pool divides by); the CPU backend stores fp32 whatever it emulates.
  KVLayout bf16 = KVLayout::full(2, 4, 128, 16, 10, DType::kBF16);
  KVLayout fp8 = bf16;
  fp8.fp8 = true;
  EXPECT_EQ(bf16.page_bytes(0), size_t{2} * 2 * 4 * 16 * 128 * 2);
  EXPECT_EQ(fp8.page_bytes(0), size_t{2} * 2 * 4 * 16 * (128 + 4));
  EXPECT_GT(static_cast<double>(bf16.page_bytes(0)) / fp8.page_bytes(0), 1.9);
  CpuBackend cpu{BackendOptions{}};
  EXPECT_EQ(cpu.kv_page_bytes(fp8), size_t{2} * 2 * 4 * 16 * 128 * 4);
  EXPECT_EQ(cpu.kv_page_bytes(bf16), size_t{2} * 2 * 4 * 16 * 128 * 4);
}

}  // namespace
}  // namespace origami::test
