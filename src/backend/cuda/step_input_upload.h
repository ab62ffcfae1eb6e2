#pragma once
// A step's inputs (token ids, positions, slots, page tables, lengths: one int32 array laid out by
// the CUDA backend) go from pinned host staging to the device array the kernels and captured graphs
// read. Only the used parts are copied. With nothing launched before the step, the copies are
// enqueued on the compute stream (they start at once). While an earlier launched step still runs
// (asynchronous scheduling), the device array is still being read, so the copies go instead over a
// copy stream into a device stage, overlapping the running step, and one kernel on the compute
// stream moves the stage into place when the step starts. Per-head page tables make these inputs
// megabytes a step (~2-3 MB at 300 requests of the Qwen3-8B shape): tens of microseconds of PCIe
// that would otherwise follow the previous step on the compute stream.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/status.h"

namespace origami::cuda {

// A used part [begin, end) of the step inputs, in elements.
struct InputRange {
  size_t begin = 0, end = 0;
};

class StepInputUpload {
 public:
  // At most this many ranges a step (after merging neighbours).
  static constexpr int kMaxRanges = 16;

  StepInputUpload();
  ~StepInputUpload();
  StepInputUpload(const StepInputUpload&) = delete;
  StepInputUpload& operator=(const StepInputUpload&) = delete;

  // Waits until no upload is in flight or staged: before the host staging or the device inputs
  // are reallocated.
  Status wait_idle() const;
  // Waits until the last upload has read the host staging, which may then be rewritten.
  Status wait_host_staging_read() const;
  // Enqueues the copies of `ranges` (in order, none past the reserved size) from `host` to `dev`,
  // ahead of the work `compute` runs next. `overlap`: a launched step runs before this one on
  // `compute`, so the transfer goes through the stage.
  Status upload(int32_t* dev, const int32_t* host, const InputRange* ranges, size_t num_ranges, bool overlap,
                cudaStream_t compute);

  int64_t num_staged_uploads() const { return num_staged_; }

 private:
  // The stage (allocated when first needed: one step at a time never uses it) holds `elems`.
  Status ensure_stage(size_t elems);

  cudaStream_t copy_stream_ = nullptr;
  int32_t* stage_ = nullptr;
  size_t stage_elems_ = 0;
  cudaEvent_t host_read_ = nullptr;   // the last upload's copies from the host staging are done
  cudaEvent_t staged_ = nullptr;      // the stage holds the step's inputs (copy stream)
  cudaEvent_t stage_read_ = nullptr;  // the compute stream has moved the stage into place
  bool stage_pending_read_ = false;
  int64_t num_staged_ = 0;
};

}  // namespace origami::cuda
