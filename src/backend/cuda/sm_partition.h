#pragma once
// The GPU's SMs split into two disjoint sets, each with a stream whose kernels run only on its
// set (CUDA green contexts). Why: a max-load decode step is mostly attention (memory-bound) and
// projections (compute-bound); two kernels on two ordinary streams do not overlap, because each
// fills every SM with its own CTAs and the hardware runs them one after the other
// (docs/kernels.md, "Overlapping attention with the GEMMs"). Pinned to disjoint SMs they can.
//
// The driver entry points are looked up at run time (cudaGetDriverEntryPointByVersion), so
// nothing links against libcuda and a driver without green contexts gives a Status, not a
// loader error. Kernels launched through the runtime on these streams run in the green
// context; memory is the device's, shared with the primary context.
#include <cuda_runtime.h>

#include <array>
#include <memory>
#include <set>

#include "core/status.h"

namespace origami::cuda {

class SmPartition {
 public:
  // Splits `device`'s SMs into a first set of at least `first_sms` (rounded up to the GPU's
  // partition granularity: 8 SMs on Hopper) and a second set of the rest. Fails with a message
  // when the driver has no green contexts, first_sms is not in [1, SMs), or nothing is left.
  static Expected<SmPartition> split(int device, int first_sms);

  SmPartition(SmPartition&&) noexcept;
  SmPartition& operator=(SmPartition&&) noexcept;
  ~SmPartition();

  // Non-blocking streams of set 0 and set 1; valid while this object lives.
  cudaStream_t stream(int set) const { return streams_[set]; }
  // SMs in each set, as the driver provisioned them.
  int sms(int set) const { return sms_[set]; }

 private:
  struct Contexts;
  SmPartition() = default;
  std::unique_ptr<Contexts> contexts_;
  std::array<cudaStream_t, 2> streams_{};
  std::array<int, 2> sms_{};
};

// Where a stream's kernels run: `ctas` CTAs, each taking an SM's whole shared memory (so one CTA
// an SM at a time) and holding it ~20 us, write the id of the SM they ran on to device_ids[cta].
// Enough CTAs visit every SM the stream may use; tests and benchmarks check partitions with it.
cudaError_t record_sm_ids(int* device_ids, int ctas, cudaStream_t stream);

// record_sm_ids on `stream`, waited for: the distinct SMs its `ctas` CTAs ran on.
Expected<std::set<int>> sms_used(cudaStream_t stream, int ctas);

}  // namespace origami::cuda
