// Compression end to end on origami-tiny-qwen3 with the CPU backend: a budget larger than every
// sequence changes nothing (token for token equal to full KV, with or without prefix caching);
// a compressed request never holds more than N_max blocks; kept entries are bit-exact copies of
// original entries in their original order with the window kept (zipage), exactly sinks +
// recent (streaming) or the smallest-norm keys + window (knorm); shared prefix blocks stay bit-identical while other requests compress;
// a tiny pool with prefix sharing never deadlocks or loses a request.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "engine_test_util.h"
#include "head_budgets_test_util.h"
#include "policy/policy_registry.h"

namespace origami::testing {
namespace {

constexpr int kBlock = 16;

// 12 prompts of mixed lengths; several share a 40-token prefix.
std::vector<BatchItem> mixed_items(int max_tokens, uint32_t seed = 99) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(3, 8000);
  std::vector<int32_t> shared(40);
  for (auto& t : shared) t = tok(rng);
  std::vector<BatchItem> items;
  for (int i = 0; i < 12; ++i) {
    BatchItem item;
    const int len = 3 + (i * 23) % 90;
    if (i % 3 == 0) item.prompt_token_ids = shared;
    while (static_cast<int>(item.prompt_token_ids.size()) < len) item.prompt_token_ids.push_back(tok(rng));
    item.sampling = greedy(max_tokens - (i % 4) * 5);
    items.push_back(item);
  }
  return items;
}

std::vector<BatchResult> run_items(const EngineConfig& config, const std::vector<BatchItem>& items,
                                   EngineMetrics* metrics = nullptr) {
  auto engine = make_engine(config);
  if (!engine) return {};
  std::vector<BatchResult> results = run_batch(*engine, items);
  for (const BatchResult& r : results) EXPECT_TRUE(r.ok) << r.error;
  if (metrics) *metrics = engine->metrics();
  return results;
}

// The registered base policies (not aliases) that compress, other than `except`; only cache-full
// ones when `cache_full_only`.
std::vector<std::string> other_base_policies(const std::vector<std::string>& except, bool cache_full_only) {
  std::vector<std::string> out;
  for (const PolicyInfo& info : PolicyRegistry::builtin().policies()) {
    if (!info.alias_of.empty() || std::find(except.begin(), except.end(), info.name) != except.end()) continue;
    auto policy = PolicyRegistry::builtin().create(info.name);
    EXPECT_TRUE(policy.has_value()) << info.name;
    if (!policy || !(*policy)->compresses()) continue;
    if (cache_full_only && (*policy)->trigger() != CompressionTrigger::kCacheFull) continue;
    out.push_back(info.name);
  }
  return out;
}

EngineConfig policy_config(const std::string& policy, int budget, bool prefix_caching = false) {
  EngineConfig c = cpu_config(tiny_qwen3_dir());
  c.kv_policy = policy;
  // A policy that takes no budget (a sliding window's ratio) runs without one.
  auto created = PolicyRegistry::builtin().create(policy);
  c.kv_budget = created && !(*created)->takes_budget() ? 0 : budget;
  if (created && (*created)->needs().gate_scores) {
    c.kv_gates = tiny_qwen3_gates();
    c.kv_policy_options = {{"window", "16"}};  // fastkvzip's 128 exceeds these budgets
  }
  c.enable_prefix_caching = prefix_caching;
  // A policy that splits its budget by calibrated head budgets (tangram) runs on a budget file.
  if (created && (*created)->budget_split() == BudgetSplit::kCalibrated)
    c.kv_head_budgets = write_head_budgets("invariants_budgets.json");
  return c;
}

TEST(EngineCompression, BudgetLargerThanEverySequenceEqualsFullKV) {
  const std::vector<BatchItem> items = mixed_items(30);
  const std::vector<BatchResult> full = run_items(cpu_config(tiny_qwen3_dir()), items);
  struct Case {
    const char* policy;
    bool prefix;
  };
  std::vector<Case> cases = {Case{"zipage", true}, Case{"zipage-attn", false}, Case{"streaming", false}, Case{"snapkv", true}};
  // Every other registered compressing policy too (aliases only change a recipe's defaults).
  std::vector<std::string> others = other_base_policies({"zipage", "streaming", "snapkv"}, false);
  for (const std::string& name : others) cases.push_back(Case{name.c_str(), false});
  for (const Case& cs : cases) {
    {
      const char* policy = cs.policy;
      const bool prefix = cs.prefix;
      EngineMetrics m;
      const std::vector<BatchResult> got = run_items(policy_config(policy, 4096, prefix), items, &m);
      ASSERT_EQ(got.size(), full.size());
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_EQ(got[i].output_token_ids, full[i].output_token_ids) << policy << " prefix=" << prefix << " item " << i;
      EXPECT_EQ(m.num_compressions, 0) << policy;
    }
  }
}

// Runs requests step by step and checks after every step that each compressed request holds at
// most N_max blocks (N_max * b entries): zipage, streaming and every other registered cache-full
// policy, so a bounded policy is checked the day it is registered.
TEST(EngineCompression, CompressedRequestsStayWithinTheirCap) {
  std::vector<std::string> policies = {"zipage", "streaming"};
  for (const std::string& name : other_base_policies({"zipage", "streaming"}, true)) policies.push_back(name);
  for (const std::string& policy_name : policies) {
    const char* policy = policy_name.c_str();
    EngineConfig c = policy_config(policy, 40);  // N_max = 3, k = 32
    c.max_num_batched_tokens = 64;
    auto engine = make_engine(c);
    ASSERT_NE(engine, nullptr);
    std::vector<RequestId> ids;
    for (const BatchItem& item : mixed_items(70)) ids.push_back(*engine->add_request(item.prompt_token_ids, item.sampling));
    int checked = 0;
    while (engine->has_unfinished()) {
      for (const RequestOutput& out : engine->step()) EXPECT_NE(out.finish_reason, FinishReason::kError) << out.error;
      for (RequestId id : ids) {
        const Request* r = engine->request(id);
        if (r == nullptr || r->is_finished() || !r->compression.compressed()) continue;
        EXPECT_LE(r->kv.groups[0].blocks.size(), 3u) << policy << " request " << id;
        EXPECT_LE(r->kv.num_entries(0), 3 * kBlock) << policy << " request " << id;
        EXPECT_LT(r->kv.num_entries(0), r->num_computed_tokens + 1);
        ++checked;
      }
    }
    EXPECT_GT(checked, 100) << policy;
    EXPECT_GT(engine->metrics().num_compressions, 12) << policy;
    for (RequestId id : ids) EXPECT_EQ(engine->request(id)->output_token_ids.size(), engine->request(id)->sampling.max_tokens);
  }
}

// Keys of every (layer, KV head) of a request's first `n` entries, as [layer][head][entry][d].
using HeadKeys = std::vector<std::vector<std::vector<std::vector<float>>>>;
HeadKeys read_keys(Engine& engine, const Request& r, int n) {
  auto& cpu = dynamic_cast<CpuBackend&>(engine.backend());
  cpu::CpuKVCache& kv = cpu.kv_cache();
  const KVLayout& l = kv.layout();
  HeadKeys out(static_cast<size_t>(l.num_layers), std::vector<std::vector<std::vector<float>>>(static_cast<size_t>(l.num_kv_heads)));
  for (int layer = 0; layer < l.num_layers; ++layer) {
    for (int h = 0; h < l.num_kv_heads; ++h) {
      for (int e = 0; e < n; ++e) {
        const float* k = kv.key_at(layer, r.kv.groups[0].blocks[static_cast<size_t>(e / kBlock)], h, e % kBlock);
        out[static_cast<size_t>(layer)][static_cast<size_t>(h)].emplace_back(k, k + l.head_dim);
      }
    }
  }
  return out;
}

// Steps a full-KV engine and a compressing one on the same greedy request until the latter's
// first compression; returns (original keys before it, kept keys after it).
void keys_around_first_compression(const std::string& policy, int budget, HeadKeys* original, HeadKeys* kept,
                                   int* num_original) {
  const std::vector<int32_t> prompt = {463, 4592, 301, 270, 5936, 3001, 77, 1200, 8, 4242, 17, 903};
  auto full = make_engine(cpu_config(tiny_qwen3_dir()));
  auto comp = make_engine(policy_config(policy, budget));
  ASSERT_TRUE(full && comp);
  const RequestId fid = *full->add_request(prompt, greedy(200));
  const RequestId cid = *comp->add_request(prompt, greedy(200));
  for (int step = 0; step < 200; ++step) {
    const Request* fr = full->request(fid);
    // The compressing engine compresses at the start of its next step, then decodes one entry.
    *num_original = fr->kv.groups.empty() ? 0 : fr->kv.num_entries(0);
    if (*num_original > 0) *original = read_keys(*full, *fr, *num_original);
    full->step();
    comp->step();
    const Request* cr = comp->request(cid);
    if (cr->compression.num_compressions == 1) {
      *kept = read_keys(*comp, *cr, cr->compression.num_keep);
      return;
    }
    ASSERT_EQ(cr->output_token_ids, full->request(fid)->output_token_ids);  // identical until compressed
  }
  FAIL() << policy << " never compressed";
}

TEST(EngineCompression, ZipageKeepsOriginalEntriesInOrderWithTheWindow) {
  HeadKeys original, kept;
  int n = 0;
  keys_around_first_compression("zipage", 40, &original, &kept, &n);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_EQ(n, 48);  // N_max * b
  const int w = 16;
  int differing_heads = 0;
  std::vector<int> first_choice;
  for (size_t layer = 0; layer < kept.size(); ++layer) {
    for (size_t h = 0; h < kept[layer].size(); ++h) {
      const auto& k = kept[layer][h];
      const auto& o = original[layer][h];
      ASSERT_EQ(k.size(), 32u);
      // Each kept key is an original key, bit for bit, at increasing original indices.
      std::vector<int> chosen;
      size_t next = 0;
      for (const auto& key : k) {
        while (next < o.size() && std::memcmp(o[next].data(), key.data(), key.size() * sizeof(float)) != 0) ++next;
        ASSERT_LT(next, o.size()) << "layer " << layer << " head " << h << ": a kept key is not an original one in order";
        chosen.push_back(static_cast<int>(next++));
      }
      for (int i = 0; i < w; ++i) EXPECT_EQ(chosen[32 - w + i], n - w + i) << "window entry dropped";
      if (first_choice.empty()) first_choice = chosen;
      differing_heads += chosen != first_choice;
    }
  }
  EXPECT_GT(differing_heads, 0) << "token-wise eviction per head: heads should keep different entries";
}

TEST(EngineCompression, StreamingKeepsSinksAndRecentEntries) {
  HeadKeys original, kept;
  int n = 0;
  keys_around_first_compression("streaming", 40, &original, &kept, &n);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_EQ(n, 48);
  for (size_t layer = 0; layer < kept.size(); ++layer) {
    for (size_t h = 0; h < kept[layer].size(); ++h) {
      ASSERT_EQ(kept[layer][h].size(), 32u);
      for (int i = 0; i < 32; ++i) {
        const int src = i < 4 ? i : n - 32 + i;  // 4 sinks, then the 28 most recent entries
        EXPECT_EQ(kept[layer][h][static_cast<size_t>(i)], original[layer][h][static_cast<size_t>(src)])
            << "layer " << layer << " head " << h << " kept entry " << i;
      }
    }
  }
}

// knorm: at the first compression every (layer, KV head) keeps its 16 window entries and, of the
// 32 before them, the 16 keys with the smallest L2 norm (brute force in double), in order.
TEST(EngineCompression, KnormKeepsTheSmallestNormKeysAndTheWindow) {
  HeadKeys original, kept;
  int n = 0;
  keys_around_first_compression("knorm", 40, &original, &kept, &n);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_EQ(n, 48);
  const int k = 32, w = 16;
  int compared = 0;
  for (size_t layer = 0; layer < kept.size(); ++layer) {
    for (size_t h = 0; h < kept[layer].size(); ++h) {
      const auto& o = original[layer][h];
      std::vector<double> norm(static_cast<size_t>(n - w));
      for (int e = 0; e < n - w; ++e) {
        double ss = 0.0;
        for (float x : o[static_cast<size_t>(e)]) ss += static_cast<double>(x) * x;
        norm[static_cast<size_t>(e)] = std::sqrt(ss);
      }
      std::vector<int> order(static_cast<size_t>(n - w));
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int a, int b) { return norm[a] != norm[b] ? norm[a] < norm[b] : a > b; });
      // A cut within float rounding could go either way; such heads are only counted.
      if (norm[order[k - w]] - norm[order[k - w - 1]] < 1e-5 * norm[order[k - w]]) continue;
      std::vector<int> want(order.begin(), order.begin() + (k - w));
      std::sort(want.begin(), want.end());
      for (int e = n - w; e < n; ++e) want.push_back(e);
      ASSERT_EQ(kept[layer][h].size(), static_cast<size_t>(k));
      for (int i = 0; i < k; ++i)
        EXPECT_EQ(kept[layer][h][static_cast<size_t>(i)], o[static_cast<size_t>(want[i])])
            << "layer " << layer << " head " << h << " kept entry " << i;
      ++compared;
    }
  }
  EXPECT_GE(compared, static_cast<int>(kept.size() * kept[0].size()) / 2);
}

TEST(EngineCompression, SharedPrefixBlocksStayBitIdentical) {
  EngineConfig c = policy_config("zipage", 40, /*prefix_caching=*/true);
  auto engine = make_engine(c);
  ASSERT_NE(engine, nullptr);
  std::mt19937 rng(5);
  std::vector<int32_t> prompt(64);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % 8000 + 3);
  // A full-KV request leaves its first 3 blocks cached.
  RequestOptions full;
  full.kv_policy = "full";
  const RequestId first = *engine->add_request(prompt, greedy(2), full);
  while (engine->has_unfinished()) engine->step();
  const std::vector<int32_t> first_out = engine->request(first)->output_token_ids;
  auto& kv = dynamic_cast<CpuBackend&>(engine->backend()).kv_cache();
  auto snapshot = [&](BlockId b) {
    std::vector<float> v;
    for (int l = 0; l < kv.layout().num_layers; ++l) {
      v.insert(v.end(), kv.keys(l) + b * kv.block_stride(), kv.keys(l) + (b + 1) * kv.block_stride());
      v.insert(v.end(), kv.values(l) + b * kv.block_stride(), kv.values(l) + (b + 1) * kv.block_stride());
    }
    return v;
  };
  // Zipage requests sharing those blocks compress right after their prefill (64 > N_max * b).
  std::vector<RequestId> ids;
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> p = prompt;
    p.push_back(100 + i);
    ids.push_back(*engine->add_request(p, greedy(30)));
  }
  engine->step();  // admission: prefix hits
  std::vector<BlockId> shared;
  for (int i = 0; i < 3; ++i) shared.push_back(engine->request(ids[0])->kv.groups[0].blocks[static_cast<size_t>(i)]);
  EXPECT_EQ(engine->request(ids[0])->num_cached_prefix_tokens, 48);
  std::vector<std::vector<float>> before;
  for (BlockId b : shared) before.push_back(snapshot(b));
  while (engine->has_unfinished()) engine->step();
  for (RequestId id : ids) EXPECT_GE(engine->request(id)->compression.num_compressions, 2);
  for (size_t i = 0; i < shared.size(); ++i) EXPECT_TRUE(snapshot(shared[i]) == before[i]) << "shared block " << shared[i] << " was written";
  // The cache still serves them correctly: the same request again gives the same tokens.
  const RequestId again = *engine->add_request(prompt, greedy(2), full);
  while (engine->has_unfinished()) engine->step();
  EXPECT_EQ(engine->request(again)->num_cached_prefix_tokens, 48);
  EXPECT_EQ(engine->request(again)->output_token_ids, first_out);
}

TEST(EngineCompression, TinyPoolWithPrefixSharingNeverDeadlocks) {
  std::mt19937 rng(17);
  std::vector<int32_t> shared(50);
  for (auto& t : shared) t = static_cast<int32_t>(rng() % 8000 + 3);
  const char* policies[] = {"zipage", "zipage-attn", "streaming", "snapkv", "full"};
  // Both with budget reservation (bounded requests wait for their peak blocks) and without it
  // (the preemption paths: the pool is too small for every request's growth).
  for (int variant = 0; variant < 3; ++variant) {
    const bool async = variant != 1, reserve = variant != 2;
    EngineConfig c = policy_config("zipage", 40, /*prefix_caching=*/true);
    c.reserve_bounded_kv = reserve;
    c.num_kv_blocks = 14;
    c.num_query_slots = 2;
    c.max_num_batched_tokens = 48;
    c.async_compression = async;
    c.query_window = 32;  // room for snapkv's window beside zipage's
    auto engine = make_engine(c);
    ASSERT_NE(engine, nullptr);
    std::vector<BatchItem> items;
    for (int i = 0; i < 16; ++i) {
      BatchItem item;
      const int len = 5 + static_cast<int>(rng() % 60);
      if (i % 2 == 0) item.prompt_token_ids.assign(shared.begin(), shared.begin() + std::min(len, 50));
      while (static_cast<int>(item.prompt_token_ids.size()) < len) item.prompt_token_ids.push_back(static_cast<int32_t>(rng() % 8000 + 3));
      item.sampling = greedy(10 + static_cast<int>(rng() % 50));
      item.options.kv_policy = policies[i % 5];
      item.options.kv_budget = item.options.kv_policy == "snapkv" ? 40 : 0;
      // A full-KV request must fit the pool (13 usable blocks) to complete.
      if (item.options.kv_policy == "full") item.prompt_token_ids.resize(std::min<size_t>(item.prompt_token_ids.size(), 20));
      items.push_back(item);
    }
    const std::vector<BatchResult> results = run_batch(*engine, items);
    for (size_t i = 0; i < results.size(); ++i) {
      ASSERT_TRUE(results[i].ok) << "item " << i << ": " << results[i].error;
      EXPECT_EQ(static_cast<int>(results[i].output_token_ids.size()), items[i].sampling.max_tokens) << "item " << i;
    }
    const EngineMetrics& m = engine->metrics();
    EXPECT_GT(m.num_compressions, 5);
    if (!reserve) {
      EXPECT_GT(m.num_preemptions, 0);
    }
    EXPECT_EQ(engine->num_running(), 0u);
  }
}

TEST(EngineCompression, PerRequestPolicyEqualsEngineDefault) {
  // A zipage request in a full-KV engine decodes exactly like one in a zipage engine.
  const std::vector<BatchItem> base = mixed_items(50);
  const std::vector<BatchResult> engine_default = run_items(policy_config("zipage-global", 40), base);
  std::vector<BatchItem> per_request = base;
  for (BatchItem& item : per_request) {
    item.options.kv_policy = "zipage-global";
    item.options.kv_budget = 40;
  }
  EngineConfig c = cpu_config(tiny_qwen3_dir());
  c.query_window = 16;  // the zipage engine's query window: identical query-slot rows
  const std::vector<BatchResult> got = run_items(c, per_request);
  int compressed = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].output_token_ids, engine_default[i].output_token_ids) << "item " << i;
    compressed += got[i].num_compressions > 0;
  }
  EXPECT_GT(compressed, 5);
}

TEST(EngineCompression, MetricsCountCompressionsAndEvictions) {
  const std::vector<BatchItem> items = mixed_items(60);
  EngineMetrics m;
  const std::vector<BatchResult> results = run_items(policy_config("zipage", 40), items, &m);
  int64_t per_request = 0;
  for (const BatchResult& r : results) per_request += r.num_compressions;
  EXPECT_EQ(m.num_compressions, per_request);  // no preemption with the default pool
  EXPECT_GT(m.num_compressions, 0);
  // Every compression here drops from N_max * b = 48 entries (or a longer prompt) to 32.
  EXPECT_GE(m.num_evicted_tokens, m.num_compressions * 16);
  EXPECT_GT(m.compression_seconds, 0.0);
  EXPECT_GT(m.num_query_slots, 0);
}

}  // namespace
}  // namespace origami::testing
