// validate_compression_batch's pass that names nothing (compression_batch_fits) against the named
// checks it defers to (describe_compression_batch_error), over random batches with one random
// fault each: the pass never accepts a batch the named checks reject, and it accepts what they
// accept (a batch of valid jobs is not sent to the slow path).
#include "kv/compression_validation.h"

#include <gtest/gtest.h>

#include <deque>
#include <random>
#include <vector>

namespace origami {
namespace {

constexpr int kBlock = 4;
constexpr int kNumBlocks = 400;
constexpr int kSlots = 4;
constexpr int kMaxWindow = 8;

struct Batch {
  std::deque<std::vector<BlockId>> tables;  // stable addresses for the jobs' pointers
  std::vector<CompressionJob> jobs;
};

// `n` jobs over disjoint blocks: compactions (some in place, some to fresh blocks) and block
// evictions, with the recipes given.
Batch make_batch(int n, std::mt19937& rng, const std::vector<const ScoreRecipe*>& recipes, const ScoreRecipe* evict) {
  Batch b;
  BlockId next = 1;
  std::uniform_int_distribution<int> entries(0, 40), coin(0, 3);
  for (int j = 0; j < n; ++j) {
    CompressionJob job;
    job.request_id = 100 + static_cast<uint64_t>(j / 3);
    job.group = j % 3;
    if (coin(rng) == 0) {  // a block eviction over 3-6 whole blocks
      job.kind = CompressionKind::kEvictBlock;
      job.recipe = evict;
      job.num_entries = kBlock * (3 + coin(rng));
      std::vector<BlockId>& src = b.tables.emplace_back();
      for (int p = 0; p < job.num_entries / kBlock; ++p) src.push_back(next++);
      job.src_blocks = &src;
      b.jobs.push_back(job);
      continue;
    }
    job.recipe = recipes[static_cast<size_t>(rng() % recipes.size())];
    job.num_entries = entries(rng);
    job.num_keep = job.num_entries == 0 ? 0 : static_cast<int>(rng() % (job.num_entries + 1));
    job.num_scored_entries = job.num_entries;
    job.query_slot = static_cast<int>(rng() % kSlots);
    std::vector<BlockId>& src = b.tables.emplace_back();
    for (int p = 0; p < (job.num_entries + kBlock - 1) / kBlock; ++p) src.push_back(next++);
    job.src_blocks = &src;
    if (coin(rng) < 2) {
      job.dst_blocks = &src;  // in place: destination page p is source page p
    } else {
      std::vector<BlockId>& dst = b.tables.emplace_back();
      for (int p = 0; p < (job.num_keep + kBlock - 1) / kBlock; ++p) dst.push_back(next++);
      job.dst_blocks = &dst;
    }
    b.jobs.push_back(job);
  }
  return b;
}

// One random fault among those the checks look for (or none).
void corrupt(Batch& b, std::mt19937& rng) {
  CompressionJob& job = b.jobs[rng() % b.jobs.size()];
  CompressionJob& other = b.jobs[rng() % b.jobs.size()];
  auto table = [&](const std::vector<BlockId>* t) -> std::vector<BlockId>& { return *const_cast<std::vector<BlockId>*>(t); };
  switch (rng() % 12) {
    case 0: break;
    case 1: if (!table(job.src_blocks).empty()) table(job.src_blocks).pop_back(); break;
    case 2: if (!table(job.src_blocks).empty()) table(job.src_blocks)[rng() % job.src_blocks->size()] = kNumBlocks; break;
    case 3: if (!table(job.src_blocks).empty()) table(job.src_blocks)[0] = kNullBlock; break;
    case 4: job.num_keep = job.num_entries + 1; break;
    case 5: job.query_slot = kSlots; break;
    case 6: job.num_positions = job.num_entries - 1; break;
    case 7:  // a destination page listed twice
      if (job.kind == CompressionKind::kCompact && job.dst_blocks->size() >= 2) table(job.dst_blocks)[1] = (*job.dst_blocks)[0];
      break;
    case 8:  // a destination page that is a later source page
      if (job.kind == CompressionKind::kCompact && job.dst_blocks != job.src_blocks && !job.dst_blocks->empty() &&
          job.src_blocks->size() >= 2)
        table(job.dst_blocks)[0] = job.src_blocks->back();
      break;
    case 9:  // another job writes this job's source page
      if (other.kind == CompressionKind::kCompact && &other != &job && !other.dst_blocks->empty() &&
          !job.src_blocks->empty() && other.num_keep > 0)
        table(other.dst_blocks)[0] = (*job.src_blocks)[0];
      break;
    case 10: job.num_scored_entries = job.num_entries + 1; break;
    case 11: if (job.kind == CompressionKind::kEvictBlock) job.num_entries += 1; else job.recipe = nullptr; break;
  }
}

TEST(CompressionBatchValidation, ThePassThatNamesNothingAgreesWithTheNamedChecks) {
  ScoreRecipe window;  // reads queries
  window.scorer = Scorer::kAttention;
  window.window = 4;
  ScoreRecipe norms;  // reads none
  norms.scorer = Scorer::kKeyNorm;
  ScoreRecipe too_wide = window;  // a window the query cache cannot hold
  too_wide.window = kMaxWindow + 1;
  std::mt19937 rng(23);
  int accepted = 0, rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<const ScoreRecipe*> recipes = {&window, &norms};
    if (trial % 50 == 0) recipes.push_back(&too_wide);
    Batch b = make_batch(1 + trial % 9, rng, recipes, &norms);
    corrupt(b, rng);
    const bool fits = compression_batch_fits(b.jobs, kBlock, kNumBlocks, kSlots, kMaxWindow, false);
    const Status named = describe_compression_batch_error(b.jobs, kBlock, kNumBlocks, kSlots, kMaxWindow, false);
    ASSERT_EQ(fits, named.is_ok()) << "trial " << trial << ": " << named.to_string();
    EXPECT_EQ(validate_compression_batch(b.jobs, kBlock, kNumBlocks, kSlots, kMaxWindow, false).to_string(),
              named.to_string());
    (fits ? accepted : rejected) += 1;
  }
  EXPECT_GT(accepted, 500);
  EXPECT_GT(rejected, 500);
}

}  // namespace
}  // namespace origami
