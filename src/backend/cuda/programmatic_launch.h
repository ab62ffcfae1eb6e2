#pragma once
// Programmatic dependent launch (Hopper): a kernel launched as a programmatic dependent of the one
// before it on the stream may be scheduled while that one's last blocks still run, instead of
// after it has completed and the launch has gone through. A decode step is ~10 small kernels a
// layer (300+ at batch 1), each boundary a few microseconds of idle SMs; overlapping the next
// kernel's launch with the previous one's tail is how engines keep batch-1 decode near the
// bandwidth floor.
//
// The rule that keeps it exact: every kernel launched with launch_programmatic() calls
// wait_for_previous_grid() before it reads or writes any memory another kernel of the step touches
// (that wait returns once the previous grid has completed and its writes are visible), so the
// results are those of ordinary stream order; allow_next_grid() lets the kernel after it be
// scheduled early. Kernels launched the ordinary way (cuBLAS, or any kernel while this is off)
// keep full stream order, and both calls are no-ops for them.
//
// On by default on compute capability 9.0 and later (measured on the H100: batch-1 decode step
// 1.048x, batch 256 1.008x, docs/kernels.md); ORIGAMI_PDL=0 in the environment turns it off
// (set_programmatic_launch() for tests).
#include <cuda_runtime.h>

#include <utility>

namespace origami::cuda {

bool programmatic_launch_enabled();
void set_programmatic_launch(bool on);

__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches `kernel` on `stream`, as a programmatic dependent of the previous kernel when enabled,
// with the grid in thread-block clusters of `cluster_blocks` CTAs along x when it is above 1 (grid.x
// a multiple of it; 1-8 are portable): CTAs of a cluster run at once and share their shared memory.
template <typename... Params, typename... Args>
cudaError_t launch_programmatic_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                         cudaStream_t stream, unsigned cluster_blocks, Args&&... args) {
  cudaLaunchAttribute attr[2] = {};
  unsigned num_attrs = 0;
  if (cluster_blocks > 1) {
    attr[num_attrs].id = cudaLaunchAttributeClusterDimension;
    attr[num_attrs].val.clusterDim.x = cluster_blocks;
    attr[num_attrs].val.clusterDim.y = 1;
    attr[num_attrs].val.clusterDim.z = 1;
    ++num_attrs;
  }
  if (programmatic_launch_enabled()) {
    attr[num_attrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[num_attrs].val.programmaticStreamSerializationAllowed = 1;
    ++num_attrs;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = num_attrs;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

// The same without clusters: one CTA is its own.
template <typename... Params, typename... Args>
cudaError_t launch_programmatic(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                Args&&... args) {
  return launch_programmatic_clusters(kernel, grid, block, smem, stream, 1u, std::forward<Args>(args)...);
}

}  // namespace origami::cuda
