// TANGRAM end to end on origami-tiny-qwen3 (CPU backend), with head_budgets_test_util.h's file:
// two groups of 2 KV heads per layer (12 groups), shares 1/3 and 1 (clustered) of the budget.
//
//  - `tangram` needs calibrated budgets: without any it is a clear error, at engine creation (the
//    default policy) and per request.
//  - Its budget is the average per (layer, KV head): at 64, every job keeps its group's share
//    (32 or 96 entries), prompts are compressed chunk by chunk, and after the prompt every group's
//    table holds its own keep plus the tokens computed since; no group ever holds more blocks than
//    it was reserved at admission, nothing is preempted, every block comes back. The chunks before
//    a prompt's end are scored by KeyDiff (chunk_score's default), the prompt's end by its window.
//  - A request's own budget file (kv_head_budgets) under the engine's fixed groups: each group
//    takes its heads' largest ratio from that file; errors name the file or what is missing.
//  - Calibrated budgets under `zipage` (decode-time compression): every job keeps its group's
//    share of the budget, and fewer pages are used at the peak than with uniform budgets.
#include <algorithm>
#include <fstream>
#include <random>

#include "cpu_backend_wrapper.h"
#include "engine_test_util.h"
#include "head_budgets_test_util.h"

namespace origami::testing {
namespace {

constexpr int kBlock = 16;

// Records every compression job's group and count, and checks the reservation after each step.
class JobRecorder : public CpuBackendWrapper {
 public:
  JobRecorder() : CpuBackendWrapper("cpu") {}
  Status execute(const ForwardBatch& batch, StepOutput* out) override {
    for (const CompressionJob& job : batch.compressions)
      jobs.push_back({job.group, job.num_entries, job.num_keep, job.num_positions, job.request_id, job.recipe->scorer});
    return inner_->execute(batch, out);
  }
  struct Job {
    int group, entries, keep, positions;
    uint64_t request_id;
    Scorer scorer;
  };
  std::vector<Job> jobs;
};

std::vector<BatchItem> long_prompts(int n, int max_tokens, const RequestOptions& options) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> tok(20, 900);
  std::vector<BatchItem> items;
  for (int i = 0; i < n; ++i) {
    BatchItem item;
    for (int j = 0; j < 150 + 23 * i; ++j) item.prompt_token_ids.push_back(tok(rng));
    item.sampling = greedy(max_tokens);
    item.options = options;
    items.push_back(std::move(item));
  }
  return items;
}

EngineConfig tangram_config() {
  EngineConfig c = cpu_config(tiny_qwen3_dir());
  c.num_threads = 2;
  c.block_size = kBlock;
  c.kv_policy = "tangram";
  c.kv_budget = 64;
  c.kv_head_budgets = write_head_budgets("tangram_budgets.json");
  c.max_num_batched_tokens = 48;  // prompts of 150+ tokens end chunks above their budgets
  c.num_kv_blocks = 64;
  return c;
}

TEST(Tangram, NeedsCalibratedBudgets) {
  EngineConfig c = tangram_config();
  c.kv_head_budgets.clear();
  auto engine = Engine::create(c);
  ASSERT_FALSE(engine.has_value());
  EXPECT_NE(engine.status().message().find("needs calibrated per-head budgets"), std::string::npos)
      << engine.status().message();
  EXPECT_NE(engine.status().message().find("--kv-head-budgets"), std::string::npos) << engine.status().message();
  // Per request, on an engine whose default policy is another.
  c.kv_policy = "full";
  c.kv_budget = 0;
  auto full = make_engine(c);
  ASSERT_TRUE(full);
  RequestOptions o;
  o.kv_policy = "tangram";
  auto id = full->add_request({5, 6, 7}, greedy(2), o);
  ASSERT_FALSE(id.has_value());
  EXPECT_NE(id.status().message().find("kv_head_budgets"), std::string::npos) << id.status().message();
}

TEST(Tangram, EachGroupKeepsItsShareOfTheAverageWithinItsReservation) {
  auto recorder = std::make_unique<JobRecorder>();
  JobRecorder* jobs = recorder.get();
  auto created = Engine::create(tangram_config(), std::move(recorder));
  ASSERT_TRUE(created.has_value()) << created.status().to_string();
  Engine& engine = **created;
  const std::vector<BatchItem> items = long_prompts(4, 24, RequestOptions{});
  std::vector<RequestId> ids;
  for (const BatchItem& item : items) ids.push_back(*engine.add_request(item.prompt_token_ids, item.sampling));
  std::vector<bool> checked_after_prompt(ids.size(), false);
  while (engine.has_unfinished()) {
    for (const RequestOutput& out : engine.step()) ASSERT_NE(out.finish_reason, FinishReason::kError) << out.error;
    for (size_t i = 0; i < ids.size(); ++i) {
      const Request* r = engine.request(ids[i]);
      if (r->is_finished() || r->kv.groups.empty()) continue;
      const std::vector<int>& reserved = r->compression.reserved_blocks;
      ASSERT_EQ(reserved.size(), 12u) << "request " << ids[i] << " runs without a reservation";
      for (size_t g = 0; g < 12; ++g)
        ASSERT_LE(static_cast<int>(r->kv.groups[g].blocks.size()), reserved[g]) << "request " << ids[i] << " group " << g;
      // Right after its prompt: each group holds its own keep plus the token computed since.
      if (!checked_after_prompt[i] && !r->is_prefilling() && r->compression.compressed() && !r->compression.pending &&
          !r->compression.in_flight) {
        checked_after_prompt[i] = true;
        const int since = r->num_computed_tokens - r->num_prompt_tokens();
        for (size_t g = 0; g < 12; ++g)
          EXPECT_EQ(r->kv.num_entries(g), (g % 2 == 0 ? 32 : 96) + since) << "request " << ids[i] << " group " << g;
      }
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_TRUE(checked_after_prompt[i]) << "request " << ids[i];
    EXPECT_EQ(engine.request(ids[i])->output_token_ids.size(), 24u);
  }
  ASSERT_FALSE(jobs->jobs.empty());
  int mid_prompt = 0;
  for (const JobRecorder::Job& j : jobs->jobs) {
    EXPECT_EQ(j.keep, j.group % 2 == 0 ? 32 : 96) << "group " << j.group;
    EXPECT_GT(j.entries, j.keep);
    const bool chunk = j.positions < engine.request(j.request_id)->num_prompt_tokens();
    mid_prompt += chunk ? 1 : 0;
    // chunk_score=keydiff (the default): a chunk before the question is scored by KeyDiff, the
    // prompt's end by its window's attention.
    EXPECT_EQ(j.scorer, chunk ? Scorer::kKeyDiff : Scorer::kAttention) << "positions " << j.positions;
  }
  EXPECT_GT(mid_prompt, 0) << "prompts must be compressed chunk by chunk";
  EXPECT_LT(mid_prompt, static_cast<int>(jobs->jobs.size())) << "every prompt's end compresses too";
  EXPECT_EQ(engine.metrics().num_preemptions, 0);
  EXPECT_EQ(engine.num_kv_blocks_used(), 0) << "KV blocks leaked";
}

// Engine: adjacent groups ({0, 1}, {2, 3} per layer), no budget file. A request brings its own:
// groups take 0.9 (share 1) and 0.8 (share 8/9); average 64 -> lead ceil(64 x 12 / (6 x 17/9)) =
// 68, the other group ceil(8/9 x 68) = 61.
TEST(Tangram, RequestBudgetsUnderTheEnginesGroups) {
  EngineConfig c = tangram_config();
  c.kv_head_budgets.clear();
  c.kv_policy = "full";
  c.kv_budget = 0;
  c.heads_per_group = 2;
  auto recorder = std::make_unique<JobRecorder>();
  JobRecorder* jobs = recorder.get();
  auto created = Engine::create(c, std::move(recorder));
  ASSERT_TRUE(created.has_value()) << created.status().to_string();
  RequestOptions o;
  o.kv_policy = "tangram";
  o.kv_budget = 64;
  o.kv_head_budgets = std::make_shared<const HeadBudgets>(*load_head_budgets(write_head_budgets("tangram_request_budgets.json")));
  const std::vector<BatchResult> results = run_batch(**created, long_prompts(2, 8, o));
  for (const BatchResult& r : results) ASSERT_TRUE(r.ok) << r.error;
  ASSERT_FALSE(jobs->jobs.empty());
  for (const JobRecorder::Job& j : jobs->jobs) EXPECT_EQ(j.keep, j.group % 2 == 0 ? 68 : 61) << "group " << j.group;

  // Errors: budgets for another model, an engine without head groups. (Reading the file is the
  // request parser's: the engine only ever gets budgets already read.)
  RequestOptions other_model = o;
  {
    HeadBudgets b = *o.kv_head_budgets;
    b.model.num_layers = 7;
    b.ratios.resize(7, b.ratios[0]);
    b.mean.resize(7, b.mean[0]);
    b.stddev.resize(7, b.stddev[0]);
    other_model.kv_head_budgets = std::make_shared<const HeadBudgets>(std::move(b));
    other_model.kv_head_budgets_source = "other.json";
  }
  auto e2 = (*created)->add_request({5, 6, 7}, greedy(2), other_model);
  ASSERT_FALSE(e2.has_value());
  EXPECT_NE(e2.status().message().find("kv_head_budgets other.json: model.num_layers"), std::string::npos)
      << e2.status().message();
  c.heads_per_group = 0;
  auto one_group = make_engine(c);
  ASSERT_TRUE(one_group);
  auto e3 = one_group->add_request({5, 6, 7}, greedy(2), o);
  ASSERT_FALSE(e3.has_value());
  EXPECT_NE(e3.status().message().find("no head groups"), std::string::npos) << e3.status().message();
}

// Zipage (cache-full, decode-time compression) with calibrated budgets: the budget is what the
// largest group keeps (64; the other ceil(64 / 3) = 22), as for every policy with uniform split.
TEST(Tangram, ZipageServesCalibratedBudgets) {
  int peak[2] = {0, 0};
  for (int calibrated = 0; calibrated < 2; ++calibrated) {
    EngineConfig c = tangram_config();
    c.kv_policy = "zipage";
    c.kv_head_budgets = calibrated ? write_head_budgets("zipage_budgets.json") : "";
    c.heads_per_group = 2;
    auto recorder = std::make_unique<JobRecorder>();
    JobRecorder* jobs = recorder.get();
    auto created = Engine::create(c, std::move(recorder));
    ASSERT_TRUE(created.has_value()) << created.status().to_string();
    const std::vector<BatchItem> items = long_prompts(3, 96, RequestOptions{});
    const std::vector<BatchResult> results = run_batch(**created, items);
    for (const BatchResult& r : results) {
      ASSERT_TRUE(r.ok) << r.error;
      EXPECT_EQ(r.output_token_ids.size(), 96u);
    }
    ASSERT_FALSE(jobs->jobs.empty());
    int decode_jobs = 0;
    for (const JobRecorder::Job& j : jobs->jobs) {
      EXPECT_EQ(j.keep, calibrated && j.group % 2 == 0 ? 22 : 64) << "group " << j.group;
      // Request ids count from 1 in submission order (run_batch releases finished requests).
      decode_jobs += j.positions > static_cast<int>(items.at(j.request_id - 1).prompt_token_ids.size()) ? 1 : 0;
    }
    EXPECT_GT(decode_jobs, 0) << "zipage compresses while decoding";
    peak[calibrated] = (*created)->metrics().peak_kv_blocks_used;
    EXPECT_EQ((*created)->num_kv_blocks_used(), 0);
  }
  EXPECT_LT(peak[1], peak[0]) << "calibrated budgets must free pages";
}

}  // namespace
}  // namespace origami::testing
