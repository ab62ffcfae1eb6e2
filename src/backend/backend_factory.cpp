#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#if defined(ORIGAMI_HAVE_CUDA)
#include "backend/cuda/cuda_backend_factory.h"
#endif

namespace origami {

Expected<std::unique_ptr<Backend>> create_backend(const BackendOptions& options) {
  if (options.num_threads < 0)
    return invalid_argument("backend: num_threads must be >= 0 (0 = all cores), got " +
                            std::to_string(options.num_threads));
  if (options.tensor_parallel_size < 1)
    return invalid_argument("tensor-parallel-size must be >= 1, got " + std::to_string(options.tensor_parallel_size));
  if (options.tensor_parallel_size > 1 && options.device != "cuda")
    return invalid_argument("tensor-parallel-size " + std::to_string(options.tensor_parallel_size) +
                            " needs --device cuda (the CPU backend runs on one process)");
  if (options.device == "cpu") return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(options));
  if (options.device == "cuda") {
#if defined(ORIGAMI_HAVE_CUDA)
    return create_cuda_backend(options);
#else
    return invalid_argument("device 'cuda': origami was built without CUDA (-DORIGAMI_CUDA=ON)");
#endif
  }
  return invalid_argument("device '" + options.device + "' is unknown (expected 'cpu' or 'cuda')");
}

}  // namespace origami
