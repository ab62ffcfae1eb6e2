// PagedEviction (`pagedeviction`) checked against a brute force at every eviction, on
// origami-tiny-qwen3 with the CPU backend, block size 16 and budget 64 (N_max = 5: a prompt longer
// than 64 entries is compacted to 64 when prefilled; decode drops one block at 80 entries). A
// backend wrapper recomputes the scores from the cache itself, in double, before each job runs:
//   (t) token-wise prefill eviction: per KV head of layer 0, the kept entries are the top 64 of
//       ||v|| / ||k|| with the last 16 (the window) always kept, in their original order, as
//       bit-exact copies; entries whose scores lie within a relative 1e-5 of the cut may swap;
//   (b) block eviction: the block named by the result has the lowest mean of ||v|| / ||k|| over its
//       entries, every layer and every KV head, among blocks 1 .. 3 (never the first or the last;
//       within 1e-5 of the lowest if another is as low), no page is written, and the request's
//       table loses exactly that block;
// and tracks, per request and KV head, which logical position and which K/V every layer-0 entry
// holds. After every step each request's cache must hold exactly those entries, bit for bit, and
// every computed token must run at its logical position (the request's length, not its entry
// count) with the tracked number of cached entries. Long prompts are prefilled in chunks.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "cpu_backend_wrapper.h"
#include "engine_test_util.h"

namespace origami::testing {
namespace {

constexpr int kBlock = 16;
constexpr int kBudget = 64;  // N_max = 5
constexpr int kKeep = 64;
constexpr int kMaxBlocks = 5;
constexpr int kWindow = 16;  // pagedeviction's default
constexpr double kRelTol = 1e-5;

// One cached entry of layer 0 and one KV head: its logical position and its K and V.
struct Entry {
  int position = 0;
  std::vector<float> kv;
};

double vk_ratio(const float* k, const float* v, int d) {
  double kk = 0, vv = 0;
  for (int x = 0; x < d; ++x) {
    kk += static_cast<double>(k[x]) * k[x];
    vv += static_cast<double>(v[x]) * v[x];
  }
  return std::sqrt(vv) / std::max(std::sqrt(kk), 1e-6);
}

class BruteForceBackend : public CpuBackendWrapper {
 public:
  BruteForceBackend() : CpuBackendWrapper("pagedeviction-bruteforce") {}

  Status execute(const ForwardBatch& batch, StepOutput* out) override {
    const KVLayout& l = inner_->kv_cache().layout();
    // Brute force before the jobs run (they run inside execute, before the forward pass).
    std::vector<std::vector<std::vector<Entry>>> source(batch.compressions.size());  // [job][head][entry]
    std::vector<int> want_block(batch.compressions.size(), -1);
    std::vector<std::vector<double>> block_means(batch.compressions.size());
    for (size_t j = 0; j < batch.compressions.size(); ++j) {
      const CompressionJob& job = batch.compressions[j];
      auto& tracked = expected_[job.request_id];
      EXPECT_EQ(static_cast<int>(tracked.size()), l.num_kv_heads);
      for (int h = 0; h < l.num_kv_heads; ++h) {
        EXPECT_EQ(static_cast<int>(tracked[h].size()), job.num_entries) << "request " << job.request_id;
        source[j].push_back(read_entries(*job.src_blocks, h, tracked[h]));
      }
      if (job.kind == CompressionKind::kEvictBlock) {
        ++num_block_evictions_;
        const int nb = job.num_entries / kBlock;
        EXPECT_EQ(nb, kMaxBlocks) << "a block eviction runs at N_max full blocks";
        block_means[j].assign(nb, 0.0);
        for (int layer = 0; layer < l.num_layers; ++layer)
          for (int h = 0; h < l.num_kv_heads; ++h)
            for (int e = 0; e < job.num_entries; ++e) {
              const BlockId b = (*job.src_blocks)[e / kBlock];
              block_means[j][e / kBlock] += vk_ratio(kv().key_at(layer, b, h, e % kBlock),
                                                     kv().value_at(layer, b, h, e % kBlock), l.head_dim);
            }
        int best = 1;
        for (int p = 2; p <= nb - 2; ++p)
          if (block_means[j][p] < block_means[j][best]) best = p;
        want_block[j] = best;
      } else {
        ++num_compactions_;
        EXPECT_EQ(job.num_keep, kKeep);
      }
    }
    // Pages the block evictions read, to check that nothing writes them.
    std::vector<std::vector<std::vector<float>>> evict_pages(batch.compressions.size());
    for (size_t j = 0; j < batch.compressions.size(); ++j)
      if (batch.compressions[j].kind == CompressionKind::kEvictBlock)
        for (int p = 0; p < batch.compressions[j].num_entries / kBlock; ++p)
          evict_pages[j].push_back(page((*batch.compressions[j].src_blocks)[p]));

    ORIGAMI_RETURN_IF_ERROR(inner_->execute(batch, out));

    for (size_t j = 0; j < batch.compressions.size(); ++j) {
      const CompressionJob& job = batch.compressions[j];
      auto& tracked = expected_[job.request_id];
      if (job.kind == CompressionKind::kEvictBlock) {
        const auto result = std::find_if(out->finished_compressions.begin(), out->finished_compressions.end(),
                                         [&](const CompressionResult& r) { return r.request_id == job.request_id; });
        if (result == out->finished_compressions.end()) {
          ADD_FAILURE() << "the CPU backend reports a block eviction in the step that runs it";
          continue;
        }
        const int got = result->evicted_block;
        EXPECT_GE(got, 1);
        EXPECT_LE(got, job.num_entries / kBlock - 2);
        if (got < 1 || got > job.num_entries / kBlock - 2) continue;
        const std::vector<double>& m = block_means[j];
        if (got != want_block[j]) {
          EXPECT_LT(m[got] - m[want_block[j]], kRelTol * std::fabs(m[want_block[j]]))
              << "request " << job.request_id << ": block " << got << " evicted, brute force says " << want_block[j];
        }
        for (size_t p = 0; p < evict_pages[j].size(); ++p)
          EXPECT_EQ(page((*job.src_blocks)[p]), evict_pages[j][p]) << "a block eviction wrote page " << p;
        for (auto& head : tracked) head.erase(head.begin() + got * kBlock, head.begin() + (got + 1) * kBlock);
        evicted_tables_[job.request_id] = {*job.src_blocks, got};
        continue;
      }
      // Token-wise: which source entries landed in the destination, per head of layer 0.
      for (int h = 0; h < l.num_kv_heads; ++h) {
        const std::vector<Entry>& src = source[j][h];
        std::vector<double> s(src.size());
        for (size_t e = 0; e < src.size(); ++e)
          s[e] = vk_ratio(src[e].kv.data(), src[e].kv.data() + l.head_dim, l.head_dim);
        const int n = job.num_entries;
        for (int e = n - kWindow; e < n; ++e) s[e] = std::numeric_limits<double>::infinity();
        std::vector<int> order(n);
        for (int e = 0; e < n; ++e) order[e] = e;
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return s[a] > s[b] || (s[a] == s[b] && a > b); });
        const double cut = s[order[kKeep - 1]];
        // The kept entries, found by content in ascending source order.
        std::vector<Entry> dst_entries = read_entries(*job.dst_blocks, h, std::vector<Entry>(kKeep));
        std::vector<Entry> kept;
        size_t from = 0;
        for (int i = 0; i < kKeep; ++i) {
          while (from < src.size() && src[from].kv != dst_entries[i].kv) ++from;
          if (from == src.size()) {
            ADD_FAILURE() << "request " << job.request_id << " head " << h << ": kept entry " << i
                          << " is no source entry (or the order changed)";
            break;
          }
          kept.push_back(src[from]);
          const bool in_top = std::find(order.begin(), order.begin() + kKeep, static_cast<int>(from)) != order.begin() + kKeep;
          if (!in_top) {
            EXPECT_LT(std::fabs(s[from] - cut), kRelTol * std::fabs(cut))
                << "request " << job.request_id << " head " << h << ": entry " << from << " (score " << s[from]
                << ") kept below the cut " << cut;
          }
          ++from;
        }
        tracked[h] = std::move(kept);
      }
    }

    // The step's tokens: their positions are logical, their entries follow the tracked ones.
    size_t token = 0;
    for (const SequenceInput& in : batch.sequences) {
      auto& tracked = expected_[in.request_id];
      if (in.start_position == 0) tracked.assign(l.num_kv_heads, {});  // new, or recomputed after preemption
      int& next = next_position_[in.request_id];
      if (in.start_position == 0) next = 0;
      EXPECT_EQ(in.start_position, next) << "request " << in.request_id;
      EXPECT_EQ(in.num_cached_entries, static_cast<int>(tracked[0].size())) << "request " << in.request_id;
      for (int i = 0; i < in.num_query_tokens; ++i)
        EXPECT_EQ(batch.positions[token + i], in.start_position + i) << "request " << in.request_id;
      token += in.num_query_tokens;
      for (int h = 0; h < l.num_kv_heads; ++h) {
        std::vector<Entry> added(in.num_query_tokens);
        for (int i = 0; i < in.num_query_tokens; ++i) added[i].position = in.start_position + i;
        std::vector<Entry> all = tracked[h];
        all.insert(all.end(), added.begin(), added.end());
        all = read_entries(*in.block_table, h, all);
        tracked[h].assign(all.begin(), all.end());
      }
      next += in.num_query_tokens;
    }
    return Status::ok();
  }

  // Checks a request's cache against the tracked entries (after engine.step()).
  void check(const Request& r) {
    auto it = expected_.find(r.id);
    if (it == expected_.end() || r.kv.groups.empty()) return;
    const BlockTable& table = r.kv.groups[0];
    const auto& tracked = it->second;
    ASSERT_EQ(r.kv.num_entries(0), static_cast<int>(tracked[0].size())) << "request " << r.id;
    auto ev = evicted_tables_.find(r.id);
    if (ev != evicted_tables_.end()) {
      // The table lost exactly the evicted block; its last block is for the next tokens.
      std::vector<BlockId> want = ev->second.first;
      want.erase(want.begin() + ev->second.second);
      ASSERT_GE(table.blocks.size(), want.size());
      EXPECT_TRUE(std::equal(want.begin(), want.end(), table.blocks.begin())) << "request " << r.id;
      evicted_tables_.erase(ev);
    }
    if (r.compression.compressed()) {
      EXPECT_LE(static_cast<int>(table.blocks.size()), kMaxBlocks) << "request " << r.id;
    }
    for (size_t h = 0; h < tracked.size(); ++h) {
      const std::vector<Entry> now = read_entries(table.blocks, static_cast<int>(h), tracked[h]);
      for (size_t e = 0; e < now.size(); ++e)
        ASSERT_EQ(now[e].kv, tracked[h][e].kv) << "request " << r.id << " head " << h << " entry " << e
                                               << " (position " << tracked[h][e].position << ")";
    }
  }

  int num_block_evictions() const { return num_block_evictions_; }
  int num_compactions() const { return num_compactions_; }

 private:
  cpu::CpuKVCache& kv() { return inner_->kv_cache(); }
  // Layer-0 K and V of head h for the entries of `like` (positions kept), read from `table`.
  std::vector<Entry> read_entries(const std::vector<BlockId>& table, int h, std::vector<Entry> like) {
    const int d = kv().layout().head_dim;
    for (size_t e = 0; e < like.size(); ++e) {
      const BlockId b = table.at(e / kBlock);
      const float* k = kv().key_at(0, b, h, static_cast<int>(e % kBlock));
      const float* v = kv().value_at(0, b, h, static_cast<int>(e % kBlock));
      like[e].kv.assign(k, k + d);
      like[e].kv.insert(like[e].kv.end(), v, v + d);
    }
    return like;
  }
  std::vector<float> page(BlockId block) {
    const KVLayout& l = kv().layout();
    std::vector<float> out;
    for (int layer = 0; layer < l.num_layers; ++layer)
      for (int h = 0; h < l.num_kv_heads; ++h)
        for (int o = 0; o < kBlock; ++o) {
          const float* k = kv().key_at(layer, block, h, o);
          const float* v = kv().value_at(layer, block, h, o);
          out.insert(out.end(), k, k + l.head_dim);
          out.insert(out.end(), v, v + l.head_dim);
        }
    return out;
  }

  std::map<uint64_t, std::vector<std::vector<Entry>>> expected_;  // request -> head -> entries
  std::map<uint64_t, int> next_position_;
  std::map<uint64_t, std::pair<std::vector<BlockId>, int>> evicted_tables_;  // table before, block dropped
  int num_block_evictions_ = 0, num_compactions_ = 0;
};

TEST(EnginePagedEvictionBruteForce, KeepsTheBruteForceTokensAndBlocks) {
  EngineConfig c = cpu_config(tiny_qwen3_dir());
  c.block_size = kBlock;
  c.kv_policy = "pagedeviction";
  c.kv_budget = kBudget;
  c.max_num_batched_tokens = 48;  // prompts of 100 and 150 tokens prefill in chunks
  auto backend = std::make_unique<BruteForceBackend>();
  BruteForceBackend* brute = backend.get();
  auto created = Engine::create(c, std::move(backend));
  ASSERT_TRUE(created.has_value()) << created.status().to_string();
  Engine& engine = **created;
  std::mt19937 rng(5);
  std::vector<RequestId> ids;
  for (int len : {30, 100, 150}) {
    std::vector<int32_t> prompt(len);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % 8000 + 3);
    ids.push_back(*engine.add_request(prompt, greedy(110)));
  }
  for (int step = 0; engine.has_unfinished(); ++step) {
    ASSERT_LT(step, 2000);
    for (const RequestOutput& out : engine.step()) ASSERT_NE(out.finish_reason, FinishReason::kError) << out.error;
    for (RequestId id : ids) {
      const Request* r = engine.request(id);
      if (!r->is_finished() && !r->compression.in_flight) brute->check(*r);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  for (RequestId id : ids) EXPECT_EQ(engine.request(id)->output_token_ids.size(), 110u);
  EXPECT_EQ(brute->num_compactions(), 2);  // the two prompts longer than the budget
  EXPECT_GE(brute->num_block_evictions(), 15);
  EXPECT_EQ(engine.num_kv_blocks_used(), 0);
}

}  // namespace
}  // namespace origami::testing
