// Joint selection of a runtime allocation on the CUDA compressor; see joint_selection.h and, for
// the definition, cpu::joint_head_counts (backend/cpu/joint_selection.h).
#include "backend/cuda/joint_selection.h"

#include <algorithm>
#include <cmath>
#include <map>
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

// Grid (scope). The scope's counts (see joint_selection.h), then the jobs' maxima.
__global__ void __launch_bounds__(kSelectThreads) joint_scope_kernel(const GroupArgs a, const JointArgs j) {
  __shared__ radix_select::RadixSmem radix;
  __shared__ long long s_sum[2];  // guarantees, remaining entries
  const JointScope scope = j.scopes[blockIdx.x];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, warps = blockDim.x >> 5;
  const int m0 = scope.member0, m1 = scope.member0 + scope.num_members;
  if (t < 2) s_sum[t] = 0;
  __syncthreads();
  long long sum_g = 0, rest = 0;
  for (int m = m0 + t; m < m1; m += blockDim.x) {
    sum_g += j.guaranteed[m];
    rest += member_row(a, j, m).n - j.guaranteed[m];
  }
  if (sum_g > 0) atomicAdd(reinterpret_cast<unsigned long long*>(&s_sum[0]), static_cast<unsigned long long>(sum_g));
  if (rest > 0) atomicAdd(reinterpret_cast<unsigned long long*>(&s_sum[1]), static_cast<unsigned long long>(rest));
  __syncthreads();
  const CompressionJobDesc& first = a.jobs[member_row(a, j, m0).job];
  const long long total = static_cast<long long>(first.mean_keep) * scope.num_members - s_sum[0];
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
        radix);
    // Per head, one warp: its remaining entries above the threshold (at or above it when the
    // bucket is kept whole) and whether it holds an entry equal to it; as 2 x above + equal.
    for (int m = m0 + warp; m < m1; m += warps) {
      const MemberRow r = member_row(a, j, m);
      const unsigned long long cut = j.cut[m];
      int above = 0;
      bool equal = false;
      for (int e = lane; e < r.n; e += 32) {
        const unsigned long long key = order_key(r.scores[e], e);
        if (key >= cut) continue;
        above += kth.whole ? key >= kth.key : key > kth.key;
        equal = equal || (!kth.whole && key == kth.key);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) above += __shfl_xor_sync(kFull, above, o);
      equal = __any_sync(kFull, equal);
      if (lane == 0) j.head_counts[m] = 2 * above + (equal ? 1 : 0);
    }
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
  __syncthreads();
  for (int m = m0 + t; m < m1; m += blockDim.x) atomicMax(j.kept_counts + member_row(a, j, m).job, j.head_counts[m]);
}

}  // namespace

JointPlan plan_joint_selection(const std::vector<const CompressionJob*>& desc_jobs, int rows_per_job,
                               const std::function<std::pair<int, int>(int, int)>& row_head) {
  // (request, scope layer or -1) -> (layer, KV head, row), in the order requests first appear.
  std::map<std::pair<size_t, int>, std::vector<std::tuple<int, int, int32_t>>> scopes;
  std::vector<uint64_t> requests;
  for (size_t d = 0; d < desc_jobs.size(); ++d) {
    const CompressionJob& job = *desc_jobs[d];
    if (job.kind != CompressionKind::kCompact || !runtime_allocation(*job.recipe)) continue;
    const size_t r = static_cast<size_t>(std::find(requests.begin(), requests.end(), job.request_id) - requests.begin());
    if (r == requests.size()) requests.push_back(job.request_id);
    for (int lh = 0; lh < rows_per_job; ++lh) {
      const std::pair<int, int> head = row_head(static_cast<int>(d), lh);
      const int scope_layer = job.recipe->allocation == KeepAllocation::kLayer ? head.first : -1;
      scopes[{r, scope_layer}].emplace_back(head.first, head.second, static_cast<int32_t>(d) * rows_per_job + lh);
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
