#include "backend/cuda/step_input_upload.h"

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_check.h"

namespace origami::cuda {
namespace {

// Parts closer than this many elements are copied together: a copy call costs about as much as
// moving that many bytes. (The regions are sized for the largest step, e.g. a grouped layout's
// slots are G x the token capacity, so copying everything up to the last page would move
// megabytes that a decode step never reads.)
constexpr size_t kMergeGap = 16384;  // 64 KiB

// The merged parts, each at the same offset in the stage as in the device inputs.
struct StagedRanges {
  int64_t begin[StepInputUpload::kMaxRanges];
  int64_t offset[StepInputUpload::kMaxRanges + 1];  // exclusive prefix sum of the parts' lengths
  int count;
};

__global__ void move_staged_ranges_kernel(int32_t* __restrict__ dev, const int32_t* __restrict__ stage,
                                          StagedRanges r) {
  const int64_t total = r.offset[r.count];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int k = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    while (i >= r.offset[k + 1]) ++k;  // i only grows: the part index only moves forward
    const int64_t e = r.begin[k] + (i - r.offset[k]);
    dev[e] = stage[e];
  }
}

}  // namespace

StepInputUpload::StepInputUpload() {
  ORIGAMI_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  for (cudaEvent_t* e : {&host_read_, &staged_, &stage_read_})
    ORIGAMI_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
}

StepInputUpload::~StepInputUpload() {
  if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);
  if (stage_pending_read_) cudaEventSynchronize(stage_read_);
  if (stage_ != nullptr) cudaFree(stage_);
  for (cudaEvent_t e : {host_read_, staged_, stage_read_})
    if (e != nullptr) cudaEventDestroy(e);
  if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
}

Status StepInputUpload::wait_idle() const {
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_stream_));
  if (stage_pending_read_) ORIGAMI_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stage_read_));
  return Status::ok();
}

Status StepInputUpload::wait_host_staging_read() const {
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(host_read_));
  return Status::ok();
}

Status StepInputUpload::ensure_stage(size_t elems) {
  if (elems <= stage_elems_) return Status::ok();
  ORIGAMI_RETURN_IF_ERROR(wait_idle());  // neither stream still uses the old stage
  const size_t grown = std::max(elems, stage_elems_ * 2);
  if (stage_ != nullptr) cudaFree(stage_);
  stage_ = nullptr;
  stage_elems_ = 0;
  if (cudaMalloc(&stage_, grown * sizeof(int32_t)) != cudaSuccess) {
    cudaGetLastError();
    return Status(ErrorCode::kResourceExhausted,
                  "CUDA backend: out of device memory for the step inputs' upload stage (" +
                      std::to_string(grown * sizeof(int32_t)) + " bytes)");
  }
  stage_elems_ = grown;
  return Status::ok();
}

Status StepInputUpload::upload(int32_t* dev, const int32_t* host, const InputRange* ranges, size_t num_ranges,
                               bool overlap, cudaStream_t compute) {
  InputRange merged[kMaxRanges];
  int count = 0;
  for (size_t i = 0; i < num_ranges;) {
    InputRange m = ranges[i];
    while (++i < num_ranges && ranges[i].begin <= m.end + kMergeGap) m.end = std::max(m.end, ranges[i].end);
    if (m.end <= m.begin) continue;
    if (count == kMaxRanges) return invalid_argument("step inputs: more than " + std::to_string(kMaxRanges) + " parts to upload");
    merged[count++] = m;
  }
  if (count == 0) return Status::ok();
  if (overlap) {
    ORIGAMI_RETURN_IF_ERROR(ensure_stage(merged[count - 1].end));
    // The step staged before this one must have been moved out of the stage first.
    if (stage_pending_read_) ORIGAMI_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_, stage_read_, 0));
  }
  // Directly into place on the compute stream, or into the stage (same offsets) on the copy stream.
  int32_t* target = overlap ? stage_ : dev;
  cudaStream_t stream = overlap ? copy_stream_ : compute;
  StagedRanges r{};
  r.count = count;
  r.offset[0] = 0;
  for (int k = 0; k < count; ++k) {
    const size_t n = merged[k].end - merged[k].begin;
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(target + merged[k].begin, host + merged[k].begin, n * sizeof(int32_t),
                                                 cudaMemcpyHostToDevice, stream));
    r.begin[k] = static_cast<int64_t>(merged[k].begin);
    r.offset[k + 1] = r.offset[k] + static_cast<int64_t>(n);
  }
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaEventRecord(host_read_, stream));
  if (!overlap) return Status::ok();
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaEventRecord(staged_, copy_stream_));
  // The compute stream moves the stage into place once the step before is done with `dev`.
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute, staged_, 0));
  constexpr int kThreads = 256;
  const int64_t total = r.offset[count];
  const int blocks = static_cast<int>(std::min<int64_t>((total + kThreads - 1) / kThreads, 1024));
  move_staged_ranges_kernel<<<blocks, kThreads, 0, compute>>>(dev, stage_, r);
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaEventRecord(stage_read_, compute));
  stage_pending_read_ = true;
  ++num_staged_;
  return Status::ok();
}

}  // namespace origami::cuda
