// Bad compression configs, jobs and capture arguments come back as errors that name the field,
// never as crashes, and leave the cache untouched.
#include <numeric>

#include "backend_cpu_compression_rig.h"

namespace origami::test {
namespace {

void expect_error(const Status& st, const std::string& needle) {
  EXPECT_FALSE(st.is_ok()) << "expected an error mentioning '" << needle << "'";
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
}

class CompressionErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    rig_ = make_rig(16, 12, 2, 4, 8, 1, /*global_scores=*/false);
    fill_entries(rig_, src_, 0, 50, 71);
    recipe_.window = 16;
    job_.request_id = 9;
    job_.src_blocks = &src_;
    job_.dst_blocks = &src_;
    job_.num_entries = 50;
    job_.num_keep = 20;
    job_.query_slot = 0;
    job_.recipe = &recipe_;
  }
  Status run(const CompressionJob& job) {
    const Snapshot before = snapshot(rig_, src_, 50);
    Status st = rig_.backend->compressor()->begin({job});
    if (!st.is_ok()) {  // failed jobs leave the cache alone, and wait reports the same error
      const Snapshot after = snapshot(rig_, src_, 50);
      EXPECT_EQ(before.k, after.k);
      EXPECT_EQ(before.v, after.v);
      EXPECT_TRUE(rig_.backend->compressor()->done());
      EXPECT_EQ(rig_.backend->compressor()->wait().message(), st.message());
    }
    return st;
  }

  Rig rig_;
  std::vector<BlockId> src_ = {1, 2, 3, 4};
  ScoreRecipe recipe_;
  CompressionJob job_;
};

TEST_F(CompressionErrors, JobsAreValidated) {
  ASSERT_TRUE(run(job_).is_ok());  // the baseline job is fine
  CompressionJob j = job_;
  j.src_blocks = nullptr;
  expect_error(run(j), "src_blocks is null");
  j = job_;
  j.dst_blocks = nullptr;
  expect_error(run(j), "dst_blocks is null");
  j = job_;
  j.recipe = nullptr;
  expect_error(run(j), "recipe is null");
  j = job_;
  j.num_keep = 51;
  expect_error(run(j), "num_keep 51");
  j = job_;
  j.num_entries = 80;  // needs 5 pages, the table has 4
  j.num_keep = 10;
  expect_error(run(j), "src_blocks has 4 pages");
  std::vector<BlockId> short_dst = {1};
  j = job_;
  j.dst_blocks = &short_dst;  // 20 entries need 2 pages
  expect_error(run(j), "dst_blocks has 1 pages");
  std::vector<BlockId> bad_block = {1, 99};
  j = job_;
  j.dst_blocks = &bad_block;
  expect_error(run(j), "dst_blocks[1] is block 99");
  std::vector<BlockId> later_page = {2, 1};  // page 2 is written before src page 1 (index 1) is read
  j = job_;
  j.dst_blocks = &later_page;
  expect_error(run(j), "src_blocks[1]");
  j = job_;
  j.query_slot = -1;
  expect_error(run(j), "query_slot -1");
  j = job_;
  j.query_slot = 2;
  expect_error(run(j), "query_slot 2");
  j = job_;
  j.num_scored_entries = 51;
  expect_error(run(j), "num_scored_entries 51");
  ScoreRecipe r = recipe_;
  r.window = 17;
  j = job_;
  j.recipe = &r;
  expect_error(run(j), "max_window 16");
  r = recipe_;
  r.pool_kernel = 4;
  j.recipe = &r;
  expect_error(run(j), "pool_kernel must be odd");
  r = recipe_;
  r.global_decay = 0.8f;
  j.recipe = &r;
  expect_error(run(j), "global_scores");
  r = recipe_;
  r.redundancy = RedundancyMode::kFlash;
  r.redundancy_tau = 0.0f;
  j.recipe = &r;
  expect_error(run(j), "redundancy_tau");
  r = recipe_;
  r.scorer = static_cast<Scorer>(kNumScorers);
  j.recipe = &r;
  expect_error(run(j), "not a registered scorer");
}

TEST_F(CompressionErrors, JobsOfOneBatchMustNotWriteEachOthersPages) {
  std::vector<BlockId> other = {5, 2};  // writes page 2, which job_ reads and writes
  CompressionJob j = job_;
  j.request_id = 10;
  j.src_blocks = j.dst_blocks = &other;
  j.num_entries = 30;
  j.num_keep = 17;
  expect_error(rig_.backend->compressor()->begin({job_, j}), "both write block 2");
  // Reading a shared page is fine when nobody writes it: job 2 reads page 1 (shared prefix) and
  // writes fresh pages 6, 7.
  std::vector<BlockId> src2 = {1, 5}, dst2 = {6, 7};
  j.src_blocks = &src2;
  j.dst_blocks = &dst2;
  std::vector<BlockId> dst1 = {8, 9};
  CompressionJob first = job_;
  first.dst_blocks = &dst1;
  fill_entries(rig_, src2, 16, 30, 72);
  EXPECT_TRUE(rig_.backend->compressor()->begin({first, j}).is_ok());
  // But a page one job writes cannot be read by another.
  CompressionJob reader = j;
  std::vector<BlockId> src3 = {8, 5};
  reader.src_blocks = &src3;
  expect_error(rig_.backend->compressor()->begin({first, reader}), "reads block 8");
}

TEST(CompressionConfigErrors, ConfigureNeedsAllocationAndSaneValues) {
  BackendOptions options;
  options.num_threads = 1;
  CpuBackend backend(options);
  expect_error(backend.configure_compression({}), "before load");
  ASSERT_TRUE(backend.load_dummy(rig_config(2, 2, 4, 16), 3).is_ok());
  expect_error(backend.configure_compression({}), "before allocate_kv_cache");
  ASSERT_TRUE(backend.allocate_kv_cache(KVLayout::full(2, 2, 16, 16, 8, DType::kF32)).is_ok());
  std::vector<BlockId> t = {1};
  ScoreRecipe recency;
  recency.scorer = Scorer::kRecency;
  CompressionJob job;
  job.src_blocks = job.dst_blocks = &t;
  job.num_entries = 4;
  job.num_keep = 2;
  job.recipe = &recency;
  // No compressor yet: a step that starts a compression reports it failed, and nothing else breaks.
  EXPECT_EQ(backend.compressor(), nullptr);
  ForwardBatch only_job;
  only_job.compressions = {job};
  only_job.wait_for_compressions = true;
  StepOutput step_out;
  ASSERT_TRUE(backend.execute(only_job, &step_out).is_ok());
  ASSERT_EQ(step_out.finished_compressions.size(), 1u);
  expect_error(step_out.finished_compressions[0].status, "configure_compression() was not called");
  CompressionConfig c;
  c.max_window = 0;
  expect_error(backend.configure_compression(c), "max_window");
  c = {};
  c.num_query_slots = -1;
  expect_error(backend.configure_compression(c), "num_query_slots");
  c = {};
  c.layer_stride = 0;
  expect_error(backend.configure_compression(c), "layer_stride");
  c = {};
  c.num_query_slots = 3;
  EXPECT_TRUE(backend.configure_compression(c).is_ok());
  // Q[L=2, max_window=16, h_q=4, d=16] floats per slot.
  EXPECT_EQ(backend.query_slot_bytes(16), size_t{2} * 16 * 4 * 16 * 4);
  EXPECT_TRUE(backend.compressor()->begin({job}).is_ok());
}

TEST_F(CompressionErrors, CaptureArgumentsAreValidated) {
  SamplingParams sampling;
  sampling.temperature = 0.0f;
  std::vector<BlockId> table = {5};
  auto step = [&](int slot, int from) {
    ForwardBatch batch;
    batch.token_ids = {3, 4};
    batch.positions = {0, 1};
    SequenceInput in;
    in.num_query_tokens = 2;
    in.block_table = &table;
    in.sampling = &sampling;
    in.query_slot = slot;
    in.query_capture_from = from;
    batch.sequences.push_back(in);
    StepOutput out;
    return rig_.backend->execute(batch, &out);
  };
  EXPECT_TRUE(step(1, 0).is_ok());
  EXPECT_TRUE(step(-1, -1).is_ok());
  expect_error(step(2, 0), "query_slot 2 outside [0, 2)");
  expect_error(step(-2, 0), "query_slot must be -1");
  expect_error(step(0, -1), "query_capture_from");
  // Two sequences may not capture into the same slot in one step.
  ForwardBatch batch;
  batch.token_ids = {3, 4};
  batch.positions = {0, 0};
  std::vector<BlockId> table2 = {6};
  for (int s = 0; s < 2; ++s) {
    SequenceInput in;
    in.request_id = s;
    in.query_start = s;
    in.num_query_tokens = 1;
    in.block_table = s ? &table2 : &table;
    in.sampling = &sampling;
    in.query_slot = 1;
    in.query_capture_from = 0;
    batch.sequences.push_back(in);
  }
  StepOutput out;
  expect_error(rig_.backend->execute(batch, &out), "also used by sequence 0");
}

}  // namespace
}  // namespace origami::test
