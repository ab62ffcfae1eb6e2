#include "backend/cuda/nccl_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#if __has_include(<nccl.h>)
#include <nccl.h>
// The values declared by hand in nccl_library.h must be the header's.
static_assert(static_cast<int>(origami::cuda::NcclDataType::kInt32) == ncclInt32);
static_assert(static_cast<int>(origami::cuda::NcclDataType::kFloat32) == ncclFloat32);
static_assert(static_cast<int>(origami::cuda::NcclDataType::kBFloat16) == ncclBfloat16);
static_assert(ncclSum == 0);
static_assert(sizeof(origami::cuda::NcclUniqueId) == sizeof(ncclUniqueId));
#endif

namespace origami::cuda {
namespace {

constexpr int kNcclSuccess = 0;
constexpr int kNcclSum = 0;

template <typename Fn>
bool resolve(void* handle, const char* symbol, Fn* fn, std::string* missing) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, symbol));
  if (*fn == nullptr) *missing += std::string(missing->empty() ? "" : ", ") + symbol;
  return *fn != nullptr;
}

}  // namespace

Expected<const NcclLibrary*> NcclLibrary::get() {
  static std::once_flag once;
  static NcclLibrary* library = nullptr;
  static Status error;
  std::call_once(once, [] {
    const char* path = std::getenv("ORIGAMI_NCCL_LIBRARY");
    const std::string name = path != nullptr && path[0] != '\0' ? path : "libnccl.so.2";
    void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      error = not_found("NCCL is needed for more than one GPU and " + name +
                                                 " could not be loaded (" + (why ? why : "unknown") +
                                                 "): install NCCL or set ORIGAMI_NCCL_LIBRARY to its path");
      return;
    }
    auto* lib = new NcclLibrary();
    std::string missing;
    resolve(handle, "ncclGetVersion", &lib->get_version, &missing);
    resolve(handle, "ncclGetUniqueId", &lib->get_unique_id, &missing);
    resolve(handle, "ncclCommInitRank", &lib->comm_init_rank, &missing);
    resolve(handle, "ncclCommInitAll", &lib->comm_init_all, &missing);
    resolve(handle, "ncclCommDestroy", &lib->comm_destroy, &missing);
    resolve(handle, "ncclAllReduce", &lib->all_reduce, &missing);
    resolve(handle, "ncclAllGather", &lib->all_gather, &missing);
    resolve(handle, "ncclGroupStart", &lib->group_start, &missing);
    resolve(handle, "ncclGroupEnd", &lib->group_end, &missing);
    resolve(handle, "ncclGetErrorString", &lib->get_error_string, &missing);
    if (!missing.empty()) {
      error = not_found(name + " lacks " + missing + " (NCCL 2.x is needed)");
      delete lib;
      return;
    }
    if (lib->get_version(&lib->version_) != kNcclSuccess || lib->version_ < 21000) {
      error = Status(ErrorCode::kUnimplemented,
                     name + " is NCCL " + lib->version_string() + "; 2.10 or newer is needed (collectives in CUDA graphs)");
      delete lib;
      return;
    }
    library = lib;  // the handle stays open for the process's life
  });
  if (library == nullptr) return error;
  return static_cast<const NcclLibrary*>(library);
}

std::string NcclLibrary::version_string() const {
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return std::to_string(version_ / 10000) + "." + std::to_string(version_ / 100 % 100) + "." +
         std::to_string(version_ % 100);
}

Status NcclLibrary::check(int result, const char* call) const {
  if (result == kNcclSuccess) return Status::ok();
  return internal_error(std::string("NCCL error in ") + call + ": " + get_error_string(result));
}

Expected<NcclCommunicators> NcclCommunicators::create(const std::vector<int>& devices) {
  ORIGAMI_ASSIGN_OR_RETURN(const NcclLibrary* lib, NcclLibrary::get());
  if (devices.empty()) return invalid_argument("NCCL communicators need at least one device");
  NcclCommunicators c;
  c.lib_ = lib;
  c.devices_ = devices;
  c.comms_.assign(devices.size(), nullptr);
  // Connections made at init, not at a collective's first use (NCCL's default since 2.22): a
  // decode step captured into a CUDA graph before any eager step would otherwise be the first use,
  // and NCCL cannot connect inside a stream capture (it fails with an internal error). A value the
  // user set stays.
  setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
  ORIGAMI_RETURN_IF_ERROR(
      lib->check(lib->comm_init_all(c.comms_.data(), static_cast<int>(devices.size()), devices.data()), "ncclCommInitAll"));
  return c;
}

NcclCommunicators::NcclCommunicators(NcclCommunicators&& other) noexcept
    : lib_(other.lib_), comms_(std::move(other.comms_)), devices_(std::move(other.devices_)) {
  other.comms_.clear();
}

NcclCommunicators& NcclCommunicators::operator=(NcclCommunicators&& other) noexcept {
  if (this != &other) {
    this->~NcclCommunicators();
    lib_ = other.lib_;
    comms_ = std::move(other.comms_);
    devices_ = std::move(other.devices_);
    other.comms_.clear();
  }
  return *this;
}

NcclCommunicators::~NcclCommunicators() {
  for (void* comm : comms_)
    if (comm != nullptr) lib_->comm_destroy(comm);
  comms_.clear();
}

Status NcclCommunicators::all_reduce_sum(int rank, void* buffer, size_t count, NcclDataType type,
                                         cudaStream_t stream) const {
  return lib_->check(lib_->all_reduce(buffer, buffer, count, static_cast<int>(type), kNcclSum, comms_[rank], stream),
                     "ncclAllReduce");
}

Status NcclCommunicators::all_gather(int rank, const void* send, void* recv, size_t count, NcclDataType type,
                                     cudaStream_t stream) const {
  return lib_->check(lib_->all_gather(send, recv, count, static_cast<int>(type), comms_[rank], stream), "ncclAllGather");
}

Status NcclCommunicators::group_start() const { return lib_->check(lib_->group_start(), "ncclGroupStart"); }
Status NcclCommunicators::group_end() const { return lib_->check(lib_->group_end(), "ncclGroupEnd"); }

}  // namespace origami::cuda
