// One test matrix over every registered KV policy (aliases included), on origami-tiny-qwen3 with
// the CPU backend, so that a policy is tested end to end the day it is registered. For each
// policy, with and without prefix caching, a mixed batch runs through a backend that checks every
// step's compressions as they happen:
//   - budget respected: a job keeps exactly what the request's budget allows (k = (N_max - 1) * b
//     for cache-full triggers, the budget for prefill-end; for a periodic sliding window, all
//     before the window plus the window's kept share and buffer), and after every step a compressed
//     cache-full request holds at most N_max blocks; under a runtime allocation (adakv,
//     allocation=layer|global) the jobs name the budget as their average, may keep all their
//     entries, and the groups' reported counts average at least the budget;
//   - window kept: the protected tail (window / recent entries) and the sinks of the source land
//     bit-exact at the end and the start of the destination;
//   - prefix blocks never written: a page that two requests' tables hold is bit-identical after
//     every step;
//   - no block leaked: once every request has finished, no KV block is in use;
// and every request completes with the number of tokens it asked for. A policy that supports
// prefill chunk compression runs once with it on and once off (its default in one of the runs,
// the other value in the other), and with it on, some prompts (chunked at 48 tokens a step) must
// compress before their prefill ends.
#include <functional>
#include <map>
#include <random>
#include <set>

#include "cpu_backend_wrapper.h"
#include "engine_test_util.h"
#include "head_budgets_test_util.h"
#include "policy/kv_budget.h"
#include "policy/policy_registry.h"

namespace origami::testing {
namespace {

constexpr int kBlock = 16;
constexpr int kBudget = 64;

// Options for policies whose defaults would not compress requests this short (the matrix's
// requests hold up to ~200 tokens).
PolicyOptionMap matrix_options(const std::string& policy) {
  if (policy == "kvllm") return {{"window", "48"}, {"buffer", "8"}, {"delta", "4"}, {"chunk_budget", "6"}, {"chunk_len", "5"}};
  if (policy == "fastkvzip") return {{"window", "16"}};  // the default 128 exceeds the matrix's budget
  return {};
}

// The matrix options plus prefill_chunk_compression: the policy's default when `flip` is false,
// the other value when it is true; `on` says which it is (false for a policy without the option).
PolicyOptionMap matrix_options(const KVPolicy& policy, bool flip, bool* on) {
  PolicyOptionMap options = matrix_options(policy.name());
  *on = false;
  if (!policy.supports_prefill_chunk_compression()) return options;
  *on = policy.options().get_bool(kPrefillChunkCompressionOption) != flip;
  options[kPrefillChunkCompressionOption] = *on ? "1" : "0";
  return options;
}

// A policy that needs calibrated head budgets (tangram) runs with head_budgets_test_util.h's file:
// two groups per layer, shares 1/3 and 1. Its budget is the average per (layer, KV head), so the
// larger group keeps lead = ceil(64 x 12 / 8) = 96 entries and the smaller ceil(96 / 3) = 32.
bool calibrated(const KVPolicy& policy) { return policy.budget_split() == BudgetSplit::kCalibrated; }
void use_calibrated_budgets(const KVPolicy& policy, EngineConfig* c) {
  if (calibrated(policy)) c->kv_head_budgets = write_head_budgets("matrix_budgets.json");
}
int calibrated_keep(int group) { return group % 2 == 0 ? 32 : 96; }

// A CPU backend that checks the invariants above around each step.
class CheckingBackend : public CpuBackendWrapper {
 public:
  CheckingBackend() : CpuBackendWrapper("checking-cpu") {}

  Status execute(const ForwardBatch& batch, StepOutput* out) override {
    // Pages that two requests' tables hold (prefix hits): nobody may write them this step.
    std::map<BlockId, std::set<uint64_t>> holders;
    if (tables_) {
      for (const auto& [request, table] : tables_())
        for (BlockId b : table) holders[b].insert(request);
    }
    std::map<BlockId, std::vector<float>> shared;
    for (const auto& [block, requests] : holders)
      if (requests.size() > 1) shared[block] = page(block);
    // Protected entries of each job: sinks and the tail, as they are before the compaction.
    struct Protected {
      std::vector<std::vector<float>> sinks, tail;
    };
    std::vector<Protected> before;
    // Pages a block eviction reads: it writes none of them.
    std::vector<std::vector<std::vector<float>>> evict_pages(batch.compressions.size());
    for (size_t i = 0; i < batch.compressions.size(); ++i) {
      const CompressionJob& j = batch.compressions[i];
      jobs_seen_.push_back({j.request_id, j.num_entries, j.num_keep, j.num_positions, j.kind, j.group, j.mean_keep});
      if (j.kind == CompressionKind::kEvictBlock) {
        for (int p = 0; p < j.num_entries / kBlock; ++p) evict_pages[i].push_back(page((*j.src_blocks)[static_cast<size_t>(p)]));
        before.emplace_back();
        continue;
      }
      Protected p;
      const int tail = std::min(j.recipe->protected_tail(j.num_keep), j.num_entries);
      const int sinks = std::min(j.recipe->num_sinks, j.num_entries - tail);
      for (int e = 0; e < sinks; ++e) p.sinks.push_back(entry(*j.src_blocks, e));
      for (int e = j.num_entries - tail; e < j.num_entries; ++e) p.tail.push_back(entry(*j.src_blocks, e));
      before.push_back(std::move(p));
    }
    ORIGAMI_RETURN_IF_ERROR(inner_->execute(batch, out));
    for (const auto& [block, contents] : shared)
      EXPECT_EQ(page(block), contents) << "shared prefix block " << block << " was written";
    for (const CompressionResult& r : out->finished_compressions) EXPECT_TRUE(r.status.is_ok()) << r.status.to_string();
    // A runtime allocation's kept count is the result's; a request's groups keep at least its
    // average (each group holds its heads' largest count).
    std::map<uint64_t, std::pair<long long, int>> joint_kept;  // request -> (sum of counts, groups)
    auto kept_of = [&](const CompressionJob& j) {
      if (j.mean_keep == 0) return j.num_keep;
      for (const CompressionResult& r : out->finished_compressions)
        if (r.request_id == j.request_id && r.group == j.group) return r.num_kept;
      ADD_FAILURE() << "no result for request " << j.request_id << " group " << j.group;
      return -1;
    };
    for (const CompressionJob& j : batch.compressions) {
      if (j.kind != CompressionKind::kCompact || j.mean_keep == 0) continue;
      const int kept = kept_of(j);
      EXPECT_GE(kept, 0) << "request " << j.request_id;
      EXPECT_LE(kept, j.num_entries) << "request " << j.request_id;
      joint_kept[j.request_id].first += kept;
      ++joint_kept[j.request_id].second;
    }
    for (const CompressionJob& j : batch.compressions)
      if (j.mean_keep > 0 && j.num_entries >= j.mean_keep) {
        const auto& [sum, groups] = joint_kept[j.request_id];
        const long long total = static_cast<long long>(j.mean_keep) * groups;
        // Page-aligned counts (docs/policies.md): floor(total / b) pages at least, each full but a
        // head's last when it runs out of entries (short by at most b - 1).
        const long long least = j.recipe->page_aligned ? total / kBlock * kBlock - groups * (kBlock - 1) : total;
        EXPECT_GE(sum, least) << "request " << j.request_id;
      }
    for (size_t i = 0; i < batch.compressions.size(); ++i) {
      const CompressionJob& j = batch.compressions[i];
      if (j.kind == CompressionKind::kEvictBlock) {
        // Nothing moved, and the result names a block that is neither the first nor the last.
        for (size_t p = 0; p < evict_pages[i].size(); ++p)
          EXPECT_EQ(page((*j.src_blocks)[p]), evict_pages[i][p]) << "block eviction wrote page " << p;
        for (const CompressionResult& r : out->finished_compressions) {
          if (r.request_id != j.request_id) continue;
          EXPECT_GE(r.evicted_block, 1) << "request " << j.request_id;
          EXPECT_LE(r.evicted_block, j.num_entries / kBlock - 2) << "request " << j.request_id;
        }
        continue;
      }
      const Protected& p = before[i];
      const int tail = static_cast<int>(p.tail.size());
      for (size_t e = 0; e < p.sinks.size(); ++e)
        EXPECT_EQ(entry(*j.dst_blocks, static_cast<int>(e)), p.sinks[e]) << "request " << j.request_id << " sink " << e;
      const int kept = kept_of(j);
      for (int e = 0; e < tail; ++e)
        EXPECT_EQ(entry(*j.dst_blocks, kept - tail + e), p.tail[static_cast<size_t>(e)])
            << "request " << j.request_id << " protected entry " << (j.num_entries - tail + e);
    }
    return Status::ok();
  }

  // Every unfinished request's current page table, by request id.
  using Tables = std::vector<std::pair<uint64_t, std::vector<BlockId>>>;
  void set_tables(std::function<Tables()> tables) { tables_ = std::move(tables); }

  struct JobSeen {
    uint64_t request_id;
    int num_entries, num_keep;
    int num_positions;  // tokens computed when it started
    CompressionKind kind;
    int group;
    int mean_keep;  // a runtime allocation's average keep (0: uniform)
  };
  const std::vector<JobSeen>& jobs_seen() const { return jobs_seen_; }

 private:
  // K and V of one page, every layer and head.
  std::vector<float> page(BlockId block) {
    cpu::CpuKVCache& kv = inner_->kv_cache();
    const KVLayout& l = kv.layout();
    std::vector<float> out;
    for (int layer = 0; layer < l.num_layers; ++layer)
      for (int h = 0; h < l.num_kv_heads; ++h)
        for (int o = 0; o < l.block_size; ++o) {
          const float* k = kv.key_at(layer, block, h, o);
          const float* v = kv.value_at(layer, block, h, o);
          out.insert(out.end(), k, k + l.head_dim);
          out.insert(out.end(), v, v + l.head_dim);
        }
    return out;
  }
  // K and V of one entry of a table, every layer and head.
  std::vector<float> entry(const std::vector<BlockId>& table, int e) {
    cpu::CpuKVCache& kv = inner_->kv_cache();
    const KVLayout& l = kv.layout();
    const BlockId block = table.at(static_cast<size_t>(e / l.block_size));
    std::vector<float> out;
    for (int layer = 0; layer < l.num_layers; ++layer)
      for (int h = 0; h < l.num_kv_heads; ++h) {
        const float* k = kv.key_at(layer, block, h, e % l.block_size);
        const float* v = kv.value_at(layer, block, h, e % l.block_size);
        out.insert(out.end(), k, k + l.head_dim);
        out.insert(out.end(), v, v + l.head_dim);
      }
    return out;
  }

  std::vector<JobSeen> jobs_seen_;
  std::function<Tables()> tables_;
};

// 8 prompts of 3..140 tokens; several share a 48-token prefix (three full blocks).
std::vector<BatchItem> matrix_items() {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(3, 8000);
  std::vector<int32_t> shared(48);
  for (auto& t : shared) t = tok(rng);
  std::vector<BatchItem> items;
  for (int i = 0; i < 8; ++i) {
    BatchItem item;
    const int len = 3 + (i * 37) % 140;
    if (i % 3 == 0) item.prompt_token_ids = shared;
    while (static_cast<int>(item.prompt_token_ids.size()) < len) item.prompt_token_ids.push_back(tok(rng));
    item.sampling = greedy(40 + (i % 3) * 8);
    items.push_back(item);
  }
  return items;
}

// The invariants above for one policy (the matrix options plus `extra`), with and without prefix
// caching, with `heads_per_group` KV heads per head group (0: the one-group layout) and a KV cache
// of `kv_dtype`.
void check_policy_invariants(const std::string& name, const PolicyOptionMap& extra, int heads_per_group,
                             KVCacheDType kv_dtype = KVCacheDType::kAuto) {
  const PolicyRegistry& registry = PolicyRegistry::builtin();
  PolicyOptionMap base = matrix_options(name);
  for (const auto& [k, v] : extra) base[k] = v;
  auto policy = registry.create(name, base);
  ASSERT_TRUE(policy.has_value()) << name << ": " << policy.status().to_string();
  const bool joint = runtime_allocation((*policy)->score_recipe());
  {
    for (bool prefix : {false, true}) {
      bool chunked = false;
      PolicyOptionMap options = matrix_options(**policy, /*flip=*/!prefix, &chunked);
      for (const auto& [k, v] : extra) options[k] = v;
      SCOPED_TRACE(name + (prefix ? " with prefix caching" : "") + (chunked ? ", prefill chunk compression" : "") +
                   (heads_per_group > 0 ? ", heads per group " + std::to_string(heads_per_group) : "") + ", " +
                   kv_cache_dtype_name(kv_dtype) + " KV");
      EngineConfig c = cpu_config(tiny_qwen3_dir());
      c.block_size = kBlock;
      c.kv_cache_dtype = kv_dtype;
      c.heads_per_group = heads_per_group;
      c.kv_policy = name;
      if ((*policy)->needs().gate_scores) c.kv_gates = tiny_qwen3_gates();
      c.kv_policy_options = options;
      if ((*policy)->takes_budget()) c.kv_budget = kBudget;
      c.enable_prefix_caching = prefix;
      use_calibrated_budgets(**policy, &c);
      // Chunk compression: chunks of at most 48 tokens, so that long prompts end chunks above N_max blocks.
      c.max_num_batched_tokens = chunked ? 48 : 96;
      auto backend = std::make_unique<CheckingBackend>();
      CheckingBackend* checking = backend.get();
      auto created = Engine::create(c, std::move(backend));
      ASSERT_TRUE(created.has_value()) << created.status().to_string();
      Engine& engine = **created;
      const std::vector<BatchItem> items = matrix_items();
      std::vector<RequestId> ids;
      for (const BatchItem& item : items) ids.push_back(*engine.add_request(item.prompt_token_ids, item.sampling));
      checking->set_tables([&] {
        CheckingBackend::Tables tables;
        for (RequestId id : ids) {
          const Request* r = engine.request(id);
          if (!r->is_finished() && !r->kv.groups.empty()) tables.push_back({id, r->kv.groups[0].blocks});
        }
        return tables;
      });
      const CompressionTrigger trigger = (*policy)->trigger();
      const int max_blocks = max_blocks_for_budget(kBudget, kBlock);
      while (engine.has_unfinished()) {
        for (const RequestOutput& out : engine.step()) ASSERT_NE(out.finish_reason, FinishReason::kError) << out.error;
        for (RequestId id : ids) {
          const Request* r = engine.request(id);
          if (r->is_finished()) continue;
          if (!r->memory_bounded() || r->compression.in_flight || r->compression.pending) continue;
          ASSERT_LE(static_cast<int>(r->kv.groups[0].blocks.size()), max_blocks) << "request " << id;
        }
      }
      // Only chunk compression compresses a prompt before its last chunk.
      std::map<uint64_t, int> prompt_length;
      for (size_t i = 0; i < ids.size(); ++i) prompt_length[ids[i]] = static_cast<int>(items[i].prompt_token_ids.size());
      int mid_prompt_compressions = 0;
      for (const auto& job : checking->jobs_seen())
        mid_prompt_compressions += job.num_positions < prompt_length[job.request_id] ? 1 : 0;
      if (chunked) {
        EXPECT_GT(mid_prompt_compressions, 0) << "no prompt was compressed before its prefill ended";
      } else {
        EXPECT_EQ(mid_prompt_compressions, 0);
      }
      for (size_t i = 0; i < ids.size(); ++i) {
        const Request* r = engine.request(ids[i]);
        EXPECT_EQ(r->finish_reason, FinishReason::kLength) << "request " << ids[i];
        EXPECT_EQ(static_cast<int>(r->output_token_ids.size()), items[i].sampling.max_tokens) << "request " << ids[i];
      }
      const int keep = trigger == CompressionTrigger::kCacheFull ? entries_kept_for_budget(kBudget, kBlock) : kBudget;
      ASSERT_FALSE(checking->jobs_seen().empty()) << "no compression ran";
      int num_block_evictions = 0;
      const ScoreRecipe& recipe = (*policy)->score_recipe();
      for (const auto& job : checking->jobs_seen()) {
        // A periodic (sliding-window) compression keeps everything before its window, window_keep
        // of the window's compressible region, and the buffer.
        const int want = trigger == CompressionTrigger::kPeriodic
                             ? job.num_entries - (recipe.window - recipe.recent) + recipe.window_keep
                             : calibrated(**policy) ? calibrated_keep(job.group) : keep;
        if (joint) {
          // The backend chose the count; the job names the average and may keep all its entries.
          EXPECT_EQ(job.mean_keep, want) << "request " << job.request_id;
          EXPECT_EQ(job.num_keep, job.num_entries) << "request " << job.request_id;
        } else {
          EXPECT_EQ(job.num_keep, want) << "request " << job.request_id;
          EXPECT_LT(job.num_keep, job.num_entries) << "request " << job.request_id;
        }
        if (job.kind == CompressionKind::kEvictBlock) {
          ++num_block_evictions;
          // A whole block leaves a cache of N_max full blocks.
          EXPECT_EQ(job.num_entries, max_blocks * kBlock) << "request " << job.request_id;
        }
      }
      // PagedEviction runs both mechanisms: token-wise at the end of long prompts, whole blocks
      // while decoding.
      if (name == "pagedeviction") {
        EXPECT_GT(num_block_evictions, 0);
        EXPECT_LT(num_block_evictions, static_cast<int>(checking->jobs_seen().size()));
      }
      // One job per compressed head group (a policy that prefers per-head pages gets them when the
      // layout is left to it).
      if (calibrated(**policy) || heads_per_group > 0 || (*policy)->prefers_per_head_pages()) {
        EXPECT_GT(engine.metrics().num_compressions, 0);
        EXPECT_LE(engine.metrics().num_compressions, static_cast<int64_t>(checking->jobs_seen().size()));
      } else {
        EXPECT_EQ(engine.metrics().num_compressions, static_cast<int64_t>(checking->jobs_seen().size()));
      }
      EXPECT_EQ(engine.num_kv_blocks_used(), 0) << "KV blocks leaked";
    }
  }
}

TEST(EngineCompressionMatrix, EveryRegisteredPolicyKeepsTheInvariants) {
  const PolicyRegistry& registry = PolicyRegistry::builtin();
  int num_policies = 0;
  for (const PolicyInfo& info : registry.policies()) {
    auto policy = registry.create(info.name, matrix_options(info.name));
    ASSERT_TRUE(policy.has_value()) << info.name << ": " << policy.status().to_string();
    if (!(*policy)->compresses()) continue;
    ++num_policies;
    check_policy_invariants(info.name, {}, 0);
  }
  EXPECT_GE(num_policies, 3);
}

// The same over an FP8 KV cache (emulated E4M3 entries; moved entries keep their values bit for
// bit, so the window and prefix checks hold as they do in fp32), and on per-head pages.
TEST(EngineCompressionMatrix, EveryRegisteredPolicyKeepsTheInvariantsWithFp8KV) {
  const PolicyRegistry& registry = PolicyRegistry::builtin();
  for (const PolicyInfo& info : registry.policies()) {
    auto policy = registry.create(info.name, matrix_options(info.name));
    ASSERT_TRUE(policy.has_value()) << info.name << ": " << policy.status().to_string();
    if (!(*policy)->compresses()) continue;
    check_policy_invariants(info.name, {}, 0, KVCacheDType::kFP8);
  }
  check_policy_invariants("fastkvzip", {{"allocation", "global"}}, 1, KVCacheDType::kFP8);
}

// Runtime allocations (the backend chooses each group's count) on the one-group layout and on
// per-head pages: adakv per layer, Fast KVzip per layer and globally, KVzip globally (its
// reconstruction runs on the one-group layout only).
TEST(EngineCompressionMatrix, RuntimeAllocationsKeepTheInvariants) {
  for (int hp : {0, 1}) {
    check_policy_invariants("adakv", {}, hp);
    check_policy_invariants("fastkvzip", {{"allocation", "global"}}, hp);
    check_policy_invariants("fastkvzip", {{"allocation", "layer"}}, hp);
  }
  check_policy_invariants("kvzip", {{"allocation", "global"}}, 0);
}

// Every policy on a pool too small for the batch, with and without budget reservation and prefix
// caching: requests are preempted and recomputed, two are aborted (one while its compression is
// in flight, when one is), compressed bounded requests never exceed N_max blocks, the others
// complete, and every block comes back.
TEST(EngineCompressionMatrix, EveryRegisteredPolicySurvivesPreemptionAndAbort) {
  const PolicyRegistry& registry = PolicyRegistry::builtin();
  for (const PolicyInfo& info : registry.policies()) {
    auto policy = registry.create(info.name, matrix_options(info.name));
    ASSERT_TRUE(policy.has_value()) << info.name << ": " << policy.status().to_string();
    if (!(*policy)->compresses()) continue;
    int64_t preemptions = 0;
    int chunked_runs = 0;
    // Two of the four combinations keep the test short: each flag is on once and off once.
    for (bool reserve : {false, true}) {
      const bool prefix = !reserve;
      {
        bool chunked = false;
        const PolicyOptionMap options = matrix_options(**policy, /*flip=*/reserve, &chunked);
        chunked_runs += chunked ? 1 : 0;
        SCOPED_TRACE(info.name + (reserve ? " reserving" : "") + (prefix ? " with prefix caching" : "") +
                     (chunked ? ", prefill chunk compression" : ""));
        EngineConfig c = cpu_config(tiny_qwen3_dir());
        c.block_size = kBlock;
        c.kv_policy = info.name;
        if ((*policy)->needs().gate_scores) c.kv_gates = tiny_qwen3_gates();
        c.kv_policy_options = options;
        if ((*policy)->takes_budget()) c.kv_budget = kBudget;
        c.enable_prefix_caching = prefix;
        c.reserve_bounded_kv = reserve;
        use_calibrated_budgets(**policy, &c);
        c.num_kv_blocks = 24;
        c.max_num_batched_tokens = 96;
        auto created = Engine::create(c, std::make_unique<CheckingBackend>());
        ASSERT_TRUE(created.has_value()) << created.status().to_string();
        Engine& engine = **created;
        const std::vector<BatchItem> items = matrix_items();
        std::vector<RequestId> ids;
        for (const BatchItem& item : items) ids.push_back(*engine.add_request(item.prompt_token_ids, item.sampling));
        const int max_blocks = max_blocks_for_budget(kBudget, kBlock);
        std::set<RequestId> aborted;
        for (int step = 0; engine.has_unfinished(); ++step) {
          ASSERT_LT(step, 5000) << "no progress";
          if (step == 3) {
            engine.abort_request(ids[5]);
            aborted.insert(ids[5]);
          }
          if (aborted.size() < 2) {
            for (RequestId id : ids)
              if (engine.request(id)->compression.in_flight && aborted.count(id) == 0) {
                engine.abort_request(id);
                aborted.insert(id);
                break;
              }
          }
          for (const RequestOutput& out : engine.step()) ASSERT_NE(out.finish_reason, FinishReason::kError) << out.error;
          for (RequestId id : ids) {
            const Request* r = engine.request(id);
            if (r->is_finished() || !r->memory_bounded() || r->compression.in_flight || r->compression.pending) continue;
            ASSERT_LE(static_cast<int>(r->kv.groups[0].blocks.size()), max_blocks) << "request " << id;
          }
        }
        for (size_t i = 0; i < ids.size(); ++i) {
          const Request* r = engine.request(ids[i]);
          if (aborted.count(ids[i]) != 0) {
            EXPECT_TRUE(r->finish_reason == FinishReason::kAborted || r->finish_reason == FinishReason::kLength)
                << "request " << ids[i];
            continue;
          }
          EXPECT_EQ(r->finish_reason, FinishReason::kLength) << "request " << ids[i];
          EXPECT_EQ(static_cast<int>(r->output_token_ids.size()), items[i].sampling.max_tokens) << "request " << ids[i];
        }
        EXPECT_EQ(engine.num_kv_blocks_used(), 0) << "KV blocks leaked";
        preemptions += engine.metrics().num_preemptions;
      }
    }
    EXPECT_GT(preemptions, 0) << info.name << ": the pool never ran short";
    if ((*policy)->supports_prefill_chunk_compression()) {
      EXPECT_EQ(chunked_runs, 1) << info.name;
    }
  }
}

}  // namespace
}  // namespace origami::testing
