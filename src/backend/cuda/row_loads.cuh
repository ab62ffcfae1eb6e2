#pragma once
// One thread block reading a whole row of fp32 values (a logits row: 128K-152K entries) with many
// loads in flight. Why: a loop of one 4-byte load an iteration keeps one load a thread in flight,
// so a block of 1024 threads pulls a 512 KB row latency-bound on one SM (the greedy argmax took
// 35 us over a Llama-3 row, docs/benchmarks.md "Sampling on the GPU"); two 16-byte loads a thread,
// both issued before either is used, put 8x the bytes in flight (17 us). Four measured no faster
// and cost the sampler's registers.
//
// for_each_row_value visits every (value, index) of row[0, n) exactly once, in no set order, so it
// serves reductions whose result does not depend on order (an argmax under a total order, integer
// sums, histograms). Rows need not be 16-byte aligned (a row stride of any length): the few
// values before the first 16-byte boundary and after the last whole vector are read one by one.
// Plain loads, not the read-only path: the sampling kernel writes adjusted logits into the row
// earlier in the same launch.
#include <cuda_runtime.h>

#include <cstdint>

namespace origami::cuda {

template <typename F>
__device__ __forceinline__ void for_each_row_value(const float* row, int n, F&& f) {
  constexpr int kVectorsInFlight = 2;
  const int misalign = static_cast<int>((reinterpret_cast<uintptr_t>(row) >> 2) & 3);
  const int head = misalign == 0 ? 0 : (4 - misalign < n ? 4 - misalign : n);
  if (static_cast<int>(threadIdx.x) < head) f(row[threadIdx.x], static_cast<int>(threadIdx.x));
  const int num_vectors = (n - head) >> 2;
  const float4* vectors = reinterpret_cast<const float4*>(row + head);
  const int stride = static_cast<int>(blockDim.x);
  for (int v0 = static_cast<int>(threadIdx.x); v0 < num_vectors; v0 += stride * kVectorsInFlight) {
    float4 x[kVectorsInFlight];
#pragma unroll
    for (int u = 0; u < kVectorsInFlight; ++u) {
      const int v = v0 + u * stride;
      if (v < num_vectors) x[u] = vectors[v];
    }
#pragma unroll
    for (int u = 0; u < kVectorsInFlight; ++u) {
      const int v = v0 + u * stride;
      if (v < num_vectors) {
        const int i = head + 4 * v;
        f(x[u].x, i);
        f(x[u].y, i + 1);
        f(x[u].z, i + 2);
        f(x[u].w, i + 3);
      }
    }
  }
  const int tail0 = head + 4 * num_vectors;
  const int t = tail0 + static_cast<int>(threadIdx.x);
  if (t < n) f(row[t], t);
}

}  // namespace origami::cuda
