// Host time of validate_forward_batch on a grouped decode step of the Qwen3-8B shape: 36 layers x
// 8 KV heads at 4 heads per group (72 head groups), 256 requests, block 256, each group's table
// `pages` pages long. Every backend runs this check before each step, over every group's table.
//
// Built with the project (target forward_batch_validation_bench). Run:
//   build/forward_batch_validation_bench [num_requests] [num_groups] [pages]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/forward_batch_validation.h"

using namespace origami;

int main(int argc, char** argv) {
  const int num_requests = argc > 1 ? std::atoi(argv[1]) : 256;
  const int num_groups = argc > 2 ? std::atoi(argv[2]) : 72;
  const int pages = argc > 3 ? std::atoi(argv[3]) : 5;
  const int block_size = 256, num_blocks = 1 << 20;
  if (num_requests < 1 || num_groups < 1 || pages < 1) {
    std::fprintf(stderr, "usage: %s [num_requests >= 1] [num_groups >= 1] [pages >= 1]\n", argv[0]);
    return 2;
  }
  std::vector<RequestKV> kv(static_cast<size_t>(num_requests));
  SamplingParams sampling;
  ForwardBatch batch;
  BlockId next = 1;
  for (int r = 0; r < num_requests; ++r) {
    kv[r].groups.resize(static_cast<size_t>(num_groups));
    for (size_t g = 0; g < kv[r].groups.size(); ++g) {
      for (int p = 0; p < pages; ++p) kv[r].groups[g].blocks.push_back(next++ % (num_blocks - 1) + 1);
      kv[r].set_num_entries(g, pages * block_size - 10);
    }
    batch.token_ids.push_back(1);
    batch.positions.push_back(pages * block_size);
    SequenceInput in;
    in.request_id = static_cast<uint64_t>(r);
    in.query_start = r;
    in.num_query_tokens = 1;
    in.num_cached_entries = kv[r].num_entries(0) - 1;
    in.block_table = &kv[r].groups[0].blocks;
    in.kv = num_groups > 1 ? &kv[r] : nullptr;
    in.sampling = &sampling;
    batch.sequences.push_back(in);
  }
  ForwardBatchLimits limits;
  limits.vocab_size = 1000;
  limits.block_size = block_size;
  limits.num_blocks = num_blocks;
  limits.num_query_slots = -1;
  limits.num_groups = num_groups;
  const int reps = 200;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) {
    const Status st = validate_forward_batch(batch, limits);
    if (!st.is_ok()) {
      std::fprintf(stderr, "%s\n", st.to_string().c_str());
      return 1;
    }
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
  std::printf("%d requests x %d groups x %d pages: %.1f us per validate_forward_batch\n", num_requests, num_groups,
              pages, us);
  return 0;
}
