// Joint selection of a runtime allocation on the CUDA compressor; see joint_selection.h and, for
// the definition, cpu::joint_head_counts (backend/cpu/joint_selection.h).
#include "backend/cuda/joint_selection.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <unordered_map>
#include <tuple>

#include "backend/cuda/compression_device.cuh"
#include "backend/cuda/radix_select.cuh"

namespace origami::cuda {
namespace {

using compression_device::kFull;
using compression_device::kSelectThreads;
using radix_select::order_key;

// One member's row of the group: its entries and selection scores.
struct MemberRow {
  int job, n;
  const float* scores;
};
__device__ __forceinline__ MemberRow member_row(const GroupArgs& a, const JointArgs& j, int m) {
  const int rpj = a.num_group_layers * a.num_kv_heads;
  const int row = j.members[m];
  const CompressionJobDesc& jd = a.jobs[row / rpj];
  return MemberRow{row / rpj, jd.n, a.final_scores + jd.score0 + static_cast<size_t>(row % rpj) * jd.n};
}

// cpu::joint_head_counts' floor(alpha_safe x mean_keep), in double as there.
__device__ __forceinline__ int guarantee_floor(const CompressionJobDesc& jd) {
  return static_cast<int>(floor(static_cast<double>(jd.alpha_safe) * jd.mean_keep));
}

// Grid (member). The member's guarantee and the key below which its remaining entries lie.
__global__ void __launch_bounds__(kSelectThreads) joint_guarantee_kernel(const GroupArgs a, const JointArgs j) {
  __shared__ radix_select::RadixSmem radix;
  __shared__ int s_protected;
  const int m = blockIdx.x, t = threadIdx.x;
  const MemberRow r = member_row(a, j, m);
  if (t == 0) s_protected = 0;
  __syncthreads();
  int protect = 0;
  for (int e = t; e < r.n; e += blockDim.x) protect += r.scores[e] == INFINITY ? 1 : 0;
  if (protect > 0) atomicAdd(&s_protected, protect);
  __syncthreads();
  const int g = min(r.n, max(s_protected, guarantee_floor(a.jobs[r.job])));
  unsigned long long cut;
  if (g == 0) {
    cut = ~0ull;  // above every key (none is all ones: the entry index is below 2^31)
  } else if (g >= r.n) {
    cut = 0;  // nothing remains
  } else {
    // Keys of one row are unique: exactly g keys are >= the result, the rest below it.
    cut = radix_select::block_kth_key(
              g,
              [&](auto&& f) {
                for (int e = t; e < r.n; e += blockDim.x) f(order_key(r.scores[e], e));
              },
              radix)
              .key;
  }
  if (t == 0) {
    j.guaranteed[m] = g;
    j.cut[m] = cut;
  }
}

// Per head, one warp: its remaining entries (keys below its cut) above `thr` (at or above it when
// `whole`) and whether it holds one equal to it; as 2 x above + equal in head_counts.
__device__ void count_above(const GroupArgs& a, const JointArgs& j, int m0, int m1, unsigned long long thr, bool whole) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int m = m0 + warp; m < m1; m += warps) {
    const MemberRow r = member_row(a, j, m);
    const unsigned long long cut = j.cut[m];
    int above = 0;
    bool equal = false;
    for (int e = lane; e < r.n; e += 32) {
      const unsigned long long key = order_key(r.scores[e], e);
      if (key >= cut) continue;
      above += whole ? key >= thr : key > thr;
      equal = equal || (!whole && key == thr);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) above += __shfl_xor_sync(kFull, above, o);
    equal = __any_sync(kFull, equal);
    if (lane == 0) j.head_counts[m] = 2 * above + (equal ? 1 : 0);
  }
}

__device__ __forceinline__ long long pages_of(long long entries, int b) { return (entries + b - 1) / b; }

// Shared memory of page_threshold: a 256-bin histogram per warp, and the scope's pages at each
// bucket boundary of the pass.
struct PageSmem {
  unsigned hist[kSelectThreads / 32][256];
  unsigned long long pages_at[257];
  int digit, done;
};

// The page-aligned threshold (cpu::joint_head_counts with a page size): the lowest key threshold
// whose heads' pages, sum of ceil((g_h + remaining entries above it) / b), fit `scope_pages`. Radix
// descent, 8 bits per pass from the most significant as block_kth_key, counting pages instead of
// keys: per pass each warp takes a head at a time, histograms its remaining entries inside the
// current prefix and adds the head's pages at every bucket boundary to pages_at; the boundary
// chosen is the lowest whose pages fit; the bucket below it is descended into unless the pages
// fit exactly (any lower entry that opens a page would overflow) or the keys are resolved.
// Returns {key, whole, rank} as block_kth_key: whole: keep keys >= key; else keep keys > key and,
// of the heads holding key itself, `rank` pages' worth in head order (a head's key entry opens a
// page only when its count so far is a whole number of pages).
__device__ radix_select::KthKey page_threshold(const GroupArgs& a, const JointArgs& j, int m0, int m1,
                                               long long scope_pages, PageSmem& sm) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, warps = blockDim.x >> 5;
  const int b = a.block_size;
  unsigned long long prefix = 0;
  radix_select::KthKey r;
  for (int shift = 56; shift >= 0; shift -= 8) {
    // The bits at and below this pass's digit; a key is inside the prefix when the rest equal it.
    const unsigned long long low = shift == 56 ? ~0ull : (1ull << (shift + 8)) - 1;
    for (int i = t; i < 257; i += blockDim.x) sm.pages_at[i] = 0;
    __syncthreads();
    unsigned* hist = sm.hist[warp];
    for (int m = m0 + warp; m < m1; m += warps) {
      for (int i = lane; i < 256; i += 32) hist[i] = 0;
      __syncwarp();
      const MemberRow row = member_row(a, j, m);
      const unsigned long long cut = j.cut[m];
      int above = 0;
      for (int e = lane; e < row.n; e += 32) {
        const unsigned long long key = order_key(row.scores[e], e);
        if (key >= cut) continue;
        const unsigned long long hi = key & ~low;
        if (hi > prefix) {
          ++above;
        } else if (hi == prefix) {
          atomicAdd(&hist[(key >> shift) & 255], 1u);
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) above += __shfl_xor_sync(kFull, above, o);
      __syncwarp();
      // Lane l holds bins [8l, 8l + 8); the entries in the bins above its own, by a suffix scan.
      unsigned own = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) own += hist[8 * lane + i];
      unsigned incl = own;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned v = __shfl_down_sync(kFull, incl, o);
        if (lane + o < 32) incl += v;
      }
      long long count = static_cast<long long>(j.guaranteed[m]) + above + (incl - own);
      for (int i = 7; i >= 0; --i) {
        count += hist[8 * lane + i];
        atomicAdd(&sm.pages_at[8 * lane + i], static_cast<unsigned long long>(pages_of(count, b)));
      }
      if (lane == 0) atomicAdd(&sm.pages_at[256], static_cast<unsigned long long>(pages_of(j.guaranteed[m] + above, b)));
      __syncwarp();  // the histogram is the next head's
    }
    __syncthreads();
    if (t == 0) {
      // pages_at falls as the boundary rises; pages_at[256] fits (the last pass's choice, or the
      // guarantees' pages) and pages_at[0] does not (the bucket descended into, or every entry).
      int d = 256;
      while (d > 0 && sm.pages_at[d - 1] <= static_cast<unsigned long long>(scope_pages)) --d;
      sm.digit = d;
      sm.done = sm.pages_at[d] == static_cast<unsigned long long>(scope_pages) || shift == 0;
    }
    __syncthreads();
    const int d = sm.digit;
    if (sm.done) {
      if (sm.pages_at[d] == static_cast<unsigned long long>(scope_pages)) {
        // The keys at or above the boundary (d = 256: above the prefix).
        r.key = d == 256 ? prefix | low : prefix | (static_cast<unsigned long long>(d) << shift);
        r.whole = d < 256;
        r.rank = 0;
      } else {  // resolved (shift 0): bucket d - 1 is one key, which heads may share
        r.key = prefix | static_cast<unsigned long long>(d - 1);
        r.whole = false;
        r.rank = static_cast<int>(scope_pages - static_cast<long long>(sm.pages_at[d]));
      }
      __syncthreads();  // sm is rewritten by the counting that follows
      return r;
    }
    prefix |= static_cast<unsigned long long>(d - 1) << shift;
    __syncthreads();
  }
  return r;  // not reached: the last pass is done
}

// Grid (scope). The scope's counts (see joint_selection.h), then the jobs' maxima.
__global__ void __launch_bounds__(kSelectThreads) joint_scope_kernel(const GroupArgs a, const JointArgs j) {
  __shared__ union {
    radix_select::RadixSmem radix;
    PageSmem page;
  } smem;
  __shared__ long long s_sum[4];  // guarantees, remaining entries; their pages, every entry's pages
  const JointScope scope = j.scopes[blockIdx.x];
  const int t = threadIdx.x;
  const int m0 = scope.member0, m1 = scope.member0 + scope.num_members;
  const CompressionJobDesc& first = a.jobs[member_row(a, j, m0).job];
  const int b = a.block_size;
  const bool paged = first.page_aligned != 0;
  if (t < 4) s_sum[t] = 0;
  __syncthreads();
  long long sums[4] = {0, 0, 0, 0};
  for (int m = m0 + t; m < m1; m += blockDim.x) {
    const int n = member_row(a, j, m).n;
    sums[0] += j.guaranteed[m];
    sums[1] += n - j.guaranteed[m];
    if (paged) {
      sums[2] += pages_of(j.guaranteed[m], b);
      sums[3] += pages_of(n, b);
    }
  }
  for (int i = 0; i < 4; ++i)
    if (sums[i] > 0) atomicAdd(reinterpret_cast<unsigned long long*>(&s_sum[i]), static_cast<unsigned long long>(sums[i]));
  __syncthreads();
  const long long scope_total = static_cast<long long>(first.mean_keep) * scope.num_members;
  if (paged) {
    // Pages: P = max(floor(T / b), the guarantees' pages); each head fills its last page.
    const long long scope_pages = max(scope_total / b, s_sum[2]);
    if (scope_pages <= s_sum[2] || s_sum[3] <= scope_pages) {
      // The guarantees' pages alone, or every entry.
      for (int m = m0 + t; m < m1; m += blockDim.x) {
        const int n = member_row(a, j, m).n;
        j.head_counts[m] = scope_pages <= s_sum[2] ? static_cast<int>(min(static_cast<long long>(n), pages_of(j.guaranteed[m], b) * b)) : n;
      }
    } else {
      const radix_select::KthKey th = page_threshold(a, j, m0, m1, scope_pages, smem.page);
      count_above(a, j, m0, m1, th.key, th.whole);
      __syncthreads();
      // Ties: a head holding the key whose count is a whole number of pages opens one more page
      // with it; rank such pages, in the scope's order. Then every head fills its last page.
      if (t == 0) {
        int taken = 0;
        for (int m = m0; m < m1; ++m) {
          const int v = j.head_counts[m];
          long long c = j.guaranteed[m] + (v >> 1);
          if ((v & 1) && c % b == 0 && taken < th.rank) {
            ++taken;
            ++c;
          }
          j.head_counts[m] = static_cast<int>(min(static_cast<long long>(member_row(a, j, m).n), pages_of(c, b) * b));
        }
      }
    }
  } else {
    const long long total = scope_total - s_sum[0];
    if (total <= 0 || total >= s_sum[1]) {
      // The guarantees alone, or every entry.
      for (int m = m0 + t; m < m1; m += blockDim.x) j.head_counts[m] = total <= 0 ? j.guaranteed[m] : member_row(a, j, m).n;
    } else {
      // The threshold over every head's remaining entries (keys below its cut).
      const radix_select::KthKey kth = radix_select::block_kth_key(
          static_cast<int>(total),
          [&](auto&& f) {
            for (int m = m0; m < m1; ++m) {
              const MemberRow r = member_row(a, j, m);
              const unsigned long long cut = j.cut[m];
              for (int e = t; e < r.n; e += blockDim.x) {
                const unsigned long long key = order_key(r.scores[e], e);
                if (key < cut) f(key);
              }
            }
          },
          smem.radix);
      count_above(a, j, m0, m1, kth.key, kth.whole);
      __syncthreads();
      // Ties to the head listed first, in the scope's order.
      if (t == 0) {
        int taken = 0;
        for (int m = m0; m < m1; ++m) {
          const int v = j.head_counts[m];
          const int take = (v & 1) && taken < kth.rank ? 1 : 0;
          taken += take;
          j.head_counts[m] = j.guaranteed[m] + (v >> 1) + take;
        }
      }
    }
  }
  __syncthreads();
  for (int m = m0 + t; m < m1; m += blockDim.x) atomicMax(j.kept_counts + member_row(a, j, m).job, j.head_counts[m]);
}

}  // namespace

JointPlan plan_joint_selection(const std::vector<const CompressionJob*>& desc_jobs, int rows_per_job,
                               const std::function<std::pair<int, int>(int, int)>& row_head) {
  // (request, scope layer or -1) -> (layer, KV head, row), in the order requests first appear.
  // Per-head pages give a batch 288 jobs a request (73,728 for 256 requests compressed together):
  // a request's index and a job's scope are looked up once per job, not once per row (and the
  // request by a hash, not a scan).
  std::map<std::pair<size_t, int>, std::vector<std::tuple<int, int, int32_t>>> scopes;
  std::unordered_map<uint64_t, size_t> request_index;
  for (size_t d = 0; d < desc_jobs.size(); ++d) {
    const CompressionJob& job = *desc_jobs[d];
    if (job.kind != CompressionKind::kCompact || !runtime_allocation(*job.recipe)) continue;
    const size_t r = request_index.emplace(job.request_id, request_index.size()).first->second;
    const bool per_layer = job.recipe->allocation == KeepAllocation::kLayer;
    std::vector<std::tuple<int, int, int32_t>>* scope = per_layer ? nullptr : &scopes[{r, -1}];
    for (int lh = 0; lh < rows_per_job; ++lh) {
      const std::pair<int, int> head = row_head(static_cast<int>(d), lh);
      std::vector<std::tuple<int, int, int32_t>>& rows = per_layer ? scopes[{r, head.first}] : *scope;
      rows.emplace_back(head.first, head.second, static_cast<int32_t>(d) * rows_per_job + lh);
    }
  }
  JointPlan plan;
  for (auto& entry : scopes) {
    std::vector<std::tuple<int, int, int32_t>>& rows = entry.second;
    std::sort(rows.begin(), rows.end());
    plan.scopes.push_back({static_cast<int32_t>(plan.members.size()), static_cast<int32_t>(rows.size())});
    for (const auto& row : rows) plan.members.push_back(std::get<2>(row));
  }
  return plan;
}

cudaError_t launch_joint_counts(const GroupArgs& a, const JointArgs& j, cudaStream_t stream) {
  if (a.num_jobs == 0) return cudaSuccess;
  cudaError_t err = cudaMemsetAsync(j.kept_counts, 0, static_cast<size_t>(a.num_jobs) * sizeof(int32_t), stream);
  if (err != cudaSuccess || j.num_scopes == 0) return err;
  joint_guarantee_kernel<<<j.num_members, kSelectThreads, 0, stream>>>(a, j);
  joint_scope_kernel<<<j.num_scopes, kSelectThreads, 0, stream>>>(a, j);
  return cudaGetLastError();
}

}  // namespace origami::cuda
