// Host time of planning one batch of per-head compactions for the CUDA compressor
// (plan_compression: every job's descriptor, chunk map and tables), the way CudaCompressor::begin
// plans it now (into a plan kept between batches, over the jobs' indices) against the way it did
// before (a copy of the jobs, planned into fresh vectors each batch). A Fast KVzip batch with
// per-head pages is ~51 requests x 288 tables (Qwen3-8B shape) = ~14,700 jobs and ~5 MB of plan;
// memory touched for the first time each batch costs page faults (docs/benchmarks.md, "Per-head
// pages: the host's step named part by part"). Needs no GPU (host code of the CUDA library).
//   build/compression_plan_bench [requests=51] [batches=20]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/cuda/cuda_compression.h"

using namespace origami;
using namespace origami::cuda;

namespace {

constexpr int kLayers = 36, kKvHeads = 8, kGroups = kLayers * kKvHeads, kBlockSize = 256;
constexpr int kPagesPerTable = 5, kEntries = 1100;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int requests = argc > 1 ? std::atoi(argv[1]) : 51;
  const int batches = argc > 2 ? std::atoi(argv[2]) : 20;
  if (requests < 1 || batches < 1) {
    std::fprintf(stderr, "usage: compression_plan_bench [requests >= 1] [batches >= 1]\n");
    return 2;
  }
  // Fast KVzip's default: gate scores, one global threshold over the request's heads, whole pages.
  ScoreRecipe recipe;
  recipe.gate_scores = true;
  recipe.allocation = KeepAllocation::kGlobal;
  recipe.page_aligned = true;
  std::vector<std::vector<BlockId>> tables(static_cast<size_t>(requests) * kGroups);
  std::vector<CompressionJob> jobs;
  BlockId next = 1;
  for (int r = 0; r < requests; ++r)
    for (int g = 0; g < kGroups; ++g) {
      std::vector<BlockId>& t = tables[static_cast<size_t>(r) * kGroups + g];
      for (int p = 0; p < kPagesPerTable; ++p) t.push_back(next++);
      CompressionJob job;
      job.request_id = static_cast<uint64_t>(r + 1);
      job.group = g;
      job.src_blocks = &t;
      job.dst_blocks = &t;
      job.num_entries = kEntries;
      job.num_keep = kEntries;  // a joint job may keep all of its head's entries
      job.mean_keep = 1024;
      job.recipe = &recipe;
      jobs.push_back(job);
    }
  std::vector<int> group_heads(kGroups);
  for (int g = 0; g < kGroups; ++g) group_heads[static_cast<size_t>(g)] = g % kKvHeads;
  std::vector<int32_t> all(jobs.size());
  for (size_t j = 0; j < all.size(); ++j) all[j] = static_cast<int32_t>(j);

  std::vector<double> fresh, kept;
  CompressionPlan kept_plan;
  size_t descs = 0;
  for (int b = 0; b < batches; ++b) {
    auto t0 = std::chrono::steady_clock::now();
    {
      const std::vector<CompressionJob> copy = jobs;  // what begin() built per launch sequence
      const CompressionPlan plan = plan_compression(copy, kBlockSize, 1, 4, CompressionKind::kCompact, &group_heads, 1);
      descs = plan.descs.size();
    }
    fresh.push_back(ms_since(t0));
    t0 = std::chrono::steady_clock::now();
    plan_compression_into(jobs, &all, kBlockSize, 1, 4, CompressionKind::kCompact, &group_heads, 1, &kept_plan);
    kept.push_back(ms_since(t0));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("%d requests x %d tables = %zu jobs (%zu descriptors), %d batches, median ms a batch\n", requests, kGroups,
              jobs.size(), descs, batches);
  std::printf("| plan | ms |\n|---|---|\n| fresh vectors, copied jobs (before) | %.3f |\n| kept plan, job indices | %.3f |\n",
              median(fresh), median(kept));
  return 0;
}
