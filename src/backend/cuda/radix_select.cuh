#pragma once
// Block-wide radix selection over 64-bit order keys, shared by the per-row top-k of the
// compression kernels (compression_kernels.cu) and the joint selection's per-head guarantees and
// scope threshold (joint_selection.cu). CUDA only.
#include <cuda_runtime.h>

#include <cstdint>

namespace origami::cuda::radix_select {

// A 64-bit key whose unsigned order is cpu::select_keep's total order: the score's bits made
// monotone (NaN lowest, -0 == +0) above the entry index (ties to the larger index). Within one
// row keys are unique; rows of different heads may share a key.
__device__ __forceinline__ unsigned long long order_key(float s, int e) {
  uint32_t u = 0;
  if (!isnan(s)) {
    if (s == 0.0f) s = 0.0f;
    const uint32_t b = __float_as_uint(s);
    u = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  }
  return (static_cast<unsigned long long>(u) << 32) | static_cast<uint32_t>(e);
}

// Where the k-th largest of a multiset of keys lies.
struct KthKey {
  unsigned long long key = 0;
  // true: exactly k keys are >= key (the search ended on a bucket kept whole);
  // false: key is the k-th largest itself, k - rank keys are > key and rank (>= 1) of the keys
  // equal to it complete the k.
  bool whole = false;
  int rank = 0;
};

// Shared memory of block_kth_key.
struct RadixSmem {
  unsigned hist[256];
  unsigned long long prefix;
  int rank, done;
};

// The k-th largest (1 <= k <= count) of the keys that `for_each_key(f)` hands to f, each thread
// its own share (f(key) once per key the thread owns): radix select, 8 bits per pass from the
// most significant, ending early once the chosen bucket must be kept whole. Every thread of the
// block calls it and gets the result.
template <class ForEachKey>
__device__ KthKey block_kth_key(int k, ForEachKey for_each_key, RadixSmem& sm) {
  const int t = threadIdx.x;
  unsigned long long prefix = 0, mask = 0;
  int rank = k;
  KthKey r;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int i = t; i < 256; i += blockDim.x) sm.hist[i] = 0;
    __syncthreads();
    for_each_key([&](unsigned long long key) {
      if ((key & mask) == prefix) atomicAdd(&sm.hist[(key >> shift) & 255], 1u);
    });
    __syncthreads();
    if (t == 0) {
      int cum = 0;
      for (int dg = 255; dg >= 0; --dg) {
        const int h = static_cast<int>(sm.hist[dg]);
        if (cum + h >= rank) {
          prefix |= static_cast<unsigned long long>(dg) << shift;
          rank -= cum;
          sm.done = h == rank;
          break;
        }
        cum += h;
      }
      sm.prefix = prefix;
      sm.rank = rank;
    }
    __syncthreads();
    prefix = sm.prefix;
    rank = sm.rank;
    mask |= 0xffull << shift;
    const bool done = sm.done;
    __syncthreads();  // sm is rewritten by the next pass (or the next call)
    if (done) {
      r.key = prefix;
      r.whole = true;
      r.rank = rank;
      return r;
    }
  }
  r.key = prefix;
  r.whole = false;
  r.rank = rank;
  return r;
}

}  // namespace origami::cuda::radix_select
