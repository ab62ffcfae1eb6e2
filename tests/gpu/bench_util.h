#pragma once
// Helpers of the GPU benchmarks (tests that run only with ORIGAMI_CUDA_BENCH=1): their switches,
// the model shape they run, the copy bandwidth their floors use, and decode steps of one token per
// sequence over given page tables.
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "backend/forward_batch.h"
#include "cuda_test_util.h"

namespace origami::cuda::testing {

// Whether environment variable `name` is set to exactly `value`.
inline bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == value;
}

inline bool bench_enabled() { return env_is("ORIGAMI_CUDA_BENCH", "1"); }

// Environment variable `name` as a comma-separated list of integers ("1,64,256"), or `fallback`
// when unset or empty.
inline std::vector<int> env_list(const char* name, std::vector<int> fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return fallback;
  std::vector<int> out;
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoi(item));
  return out;
}

// Environment variable `name` as one integer, or `fallback` when unset or empty.
inline int env_int(const char* name, int fallback) { return env_list(name, {fallback})[0]; }

// Device-to-device copy bandwidth, bytes read + written (GB/s): the yardstick of the floors.
inline double measure_copy_gbps(cudaStream_t stream) {
  const size_t n = size_t(1) << 30;
  DeviceBuffer<char> src(n), dst(n);
  ORIGAMI_CUDA_CHECK(cudaMemsetAsync(src.get(), 1, n, stream));
  for (int i = 0; i < 3; ++i)
    ORIGAMI_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), n, cudaMemcpyDeviceToDevice, stream));
  const float ms = median_ms(stream, 20, [&](int) {
    ORIGAMI_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), n, cudaMemcpyDeviceToDevice, stream));
  });
  return 2.0 * n / ms / 1e6;
}

// ORIGAMI_BENCH_CONFIG: a configs/ folder name of the shared dir (default qwen3-8b).
inline std::string bench_config_name() {
  const char* v = std::getenv("ORIGAMI_BENCH_CONFIG");
  return v != nullptr && v[0] != '\0' ? v : "qwen3-8b";
}

// One decode step of tables.size() sequences at position `pos` (`pos` entries cached, one new
// token each, token ids derived from the sequence and the position); with `offsets`, sequence s
// at pos + (*offsets)[s]. The tables, `sampling` and `offsets` must outlive the batch.
inline ForwardBatch decode_step_batch(const std::vector<std::vector<BlockId>>& tables, int base_pos, int vocab_size,
                                      const SamplingParams* sampling, const std::vector<int>* offsets = nullptr) {
  ForwardBatch fb;
  for (size_t s = 0; s < tables.size(); ++s) {
    const int pos = base_pos + (offsets != nullptr ? (*offsets)[s] : 0);
    SequenceInput in;
    in.query_start = static_cast<int>(s);
    in.num_query_tokens = 1;
    in.start_position = pos;
    in.num_cached_entries = pos;
    in.block_table = &tables[s];
    in.sampling = sampling;
    fb.token_ids.push_back((static_cast<int>(s) * 31 + pos) % vocab_size);
    fb.positions.push_back(pos);
    fb.sequences.push_back(in);
  }
  return fb;
}

}  // namespace origami::cuda::testing
