#include "backend/cuda/sm_partition.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <string>
#include <utility>
#include <vector>

namespace origami::cuda {
namespace {

// The driver's green-context API, each entry point asked for at the version whose signature the
// typedef names: most came in 12.4, cuGreenCtxStreamCreate in 12.5 (asking for it as of 12.4
// finds nothing, as if the driver had no green contexts).
struct DriverApi {
  PFN_cuDeviceGetDevResource_v12040 get_dev_resource = nullptr;
  PFN_cuDevSmResourceSplitByCount_v12040 split_by_count = nullptr;
  PFN_cuDevResourceGenerateDesc_v12040 generate_desc = nullptr;
  PFN_cuGreenCtxCreate_v12040 green_ctx_create = nullptr;
  PFN_cuGreenCtxStreamCreate_v12050 green_ctx_stream_create = nullptr;
  PFN_cuGreenCtxDestroy_v12040 green_ctx_destroy = nullptr;
};

template <typename F>
void look_up(const char* symbol, unsigned version, F& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(symbol, &p, version, cudaEnableDefault, &found) == cudaSuccess &&
      found == cudaDriverEntryPointSuccess)
    fn = reinterpret_cast<F>(p);
}

// Looked up once; an entry left null means the driver lacks it.
const DriverApi& driver_api() {
  static const DriverApi api = [] {
    DriverApi a;
    look_up("cuDeviceGetDevResource", 12040, a.get_dev_resource);
    look_up("cuDevSmResourceSplitByCount", 12040, a.split_by_count);
    look_up("cuDevResourceGenerateDesc", 12040, a.generate_desc);
    look_up("cuGreenCtxCreate", 12040, a.green_ctx_create);
    look_up("cuGreenCtxStreamCreate", 12050, a.green_ctx_stream_create);
    look_up("cuGreenCtxDestroy", 12040, a.green_ctx_destroy);
    return a;
  }();
  return api;
}

__global__ void record_sm_ids_kernel(int* ids, unsigned long long hold_ns) {
  // The launch's dynamic shared memory (the SM's whole) is reserved whether or not it is touched.
  if (threadIdx.x != 0) return;
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  ids[blockIdx.x] = static_cast<int>(sm);
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < hold_ns);
}

Status driver_error(const char* call, CUresult r) {
  return internal_error(std::string("SM partition: ") + call + " failed (CUresult " + std::to_string(static_cast<int>(r)) + ")");
}

}  // namespace

struct SmPartition::Contexts {
  std::array<CUgreenCtx, 2> green{};
  ~Contexts() {
    for (CUgreenCtx g : green)
      if (g != nullptr) driver_api().green_ctx_destroy(g);
  }
};

Expected<SmPartition> SmPartition::split(int device, int first_sms) {
  const DriverApi& api = driver_api();
  if (api.get_dev_resource == nullptr || api.split_by_count == nullptr || api.generate_desc == nullptr ||
      api.green_ctx_create == nullptr || api.green_ctx_stream_create == nullptr || api.green_ctx_destroy == nullptr)
    return Status(ErrorCode::kUnimplemented, "SM partition: the CUDA driver has no green contexts (needs 12.5 or later)");
  // The primary context first: green contexts retain it, and creating it here keeps its start out
  // of what follows (the driver's advice).
  cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess) err = cudaFree(nullptr);
  if (err != cudaSuccess) return internal_error(std::string("SM partition: cannot use the device: ") + cudaGetErrorString(err));

  CUdevResource all{};
  if (CUresult r = api.get_dev_resource(static_cast<CUdevice>(device), &all, CU_DEV_RESOURCE_TYPE_SM); r != CUDA_SUCCESS)
    return driver_error("cuDeviceGetDevResource", r);
  const int total = static_cast<int>(all.sm.smCount);
  if (first_sms < 1 || first_sms >= total)
    return invalid_argument("SM partition: the first set must have 1 to " + std::to_string(total - 1) + " SMs, not " +
                            std::to_string(first_sms));
  // One group of at least first_sms SMs; the driver rounds up to its granularity, and the rest
  // comes back as `remaining`.
  CUdevResource parts[2]{};
  unsigned groups = 1;
  if (CUresult r = api.split_by_count(&parts[0], &groups, &all, &parts[1], 0, static_cast<unsigned>(first_sms));
      r != CUDA_SUCCESS)
    return driver_error("cuDevSmResourceSplitByCount", r);
  if (groups != 1 || parts[1].sm.smCount == 0)
    return invalid_argument("SM partition: " + std::to_string(first_sms) + " SMs, rounded to the GPU's granularity, leave none of " +
                            std::to_string(total) + " for the second set");

  SmPartition p;
  p.contexts_ = std::make_unique<Contexts>();
  for (int set = 0; set < 2; ++set) {
    CUdevResourceDesc desc{};
    if (CUresult r = api.generate_desc(&desc, &parts[set], 1); r != CUDA_SUCCESS) return driver_error("cuDevResourceGenerateDesc", r);
    if (CUresult r = api.green_ctx_create(&p.contexts_->green[set], desc, static_cast<CUdevice>(device), CU_GREEN_CTX_DEFAULT_STREAM);
        r != CUDA_SUCCESS)
      return driver_error("cuGreenCtxCreate", r);
    CUstream s = nullptr;
    if (CUresult r = api.green_ctx_stream_create(&s, p.contexts_->green[set], CU_STREAM_NON_BLOCKING, 0); r != CUDA_SUCCESS)
      return driver_error("cuGreenCtxStreamCreate", r);
    p.streams_[set] = s;  // CUstream and cudaStream_t are the same handle
    p.sms_[set] = static_cast<int>(parts[set].sm.smCount);
  }
  return Expected<SmPartition>(std::move(p));
}

SmPartition::SmPartition(SmPartition&& other) noexcept
    : contexts_(std::move(other.contexts_)), streams_(std::exchange(other.streams_, {})), sms_(other.sms_) {}

// Swapped: `other` releases what this held when it goes.
SmPartition& SmPartition::operator=(SmPartition&& other) noexcept {
  std::swap(contexts_, other.contexts_);
  std::swap(streams_, other.streams_);
  std::swap(sms_, other.sms_);
  return *this;
}

cudaError_t record_sm_ids(int* device_ids, int ctas, cudaStream_t stream) {
  if (device_ids == nullptr || ctas < 1) return cudaErrorInvalidValue;
  int device = 0, smem = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(record_sm_ids_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  record_sm_ids_kernel<<<ctas, 32, static_cast<size_t>(smem), stream>>>(device_ids, 20'000);
  return cudaGetLastError();
}

Expected<std::set<int>> sms_used(cudaStream_t stream, int ctas) {
  if (ctas < 1) return invalid_argument("sms_used: at least one CTA");
  int* d_ids = nullptr;
  cudaError_t err = cudaMalloc(&d_ids, ctas * sizeof(int));
  std::vector<int> ids(ctas, -1);
  if (err == cudaSuccess) err = record_sm_ids(d_ids, ctas, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  if (err == cudaSuccess) err = cudaMemcpy(ids.data(), d_ids, ctas * sizeof(int), cudaMemcpyDeviceToHost);
  if (d_ids != nullptr) cudaFree(d_ids);
  if (err != cudaSuccess) return internal_error(std::string("sms_used: ") + cudaGetErrorString(err));
  return std::set<int>(ids.begin(), ids.end());
}

SmPartition::~SmPartition() {
  for (cudaStream_t& s : streams_)
    if (s != nullptr) {
      cudaStreamDestroy(s);
      s = nullptr;
    }
  contexts_.reset();  // after the streams: each belongs to its green context
}

}  // namespace origami::cuda
