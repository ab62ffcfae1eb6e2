#pragma once
// Entry point of the CUDA backend, defined in the origami_cuda library (built with ORIGAMI_CUDA).
// Kept apart from the backend's own headers so that create_backend() needs no CUDA includes.
#include <memory>

#include "backend/backend.h"
#include "core/status.h"

namespace origami {

Expected<std::unique_ptr<Backend>> create_cuda_backend(const BackendOptions& options);

}  // namespace origami
