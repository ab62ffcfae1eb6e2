// NCCL loaded at run time (backend/cuda/nccl_library.h) over every visible GPU: all-reduce and
// all-gather of fp32 and bf16 against the sums and concatenations computed on the host, eagerly
// and captured in a CUDA graph (as tensor-parallel decode steps run them). With one GPU the
// collectives are copies, which still checks the ABI; with several they move data between GPUs.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/nccl_library.h"

namespace origami::cuda {
namespace {

std::vector<int> visible_devices() {
  int n = 0;
  ORIGAMI_CUDA_CHECK(cudaGetDeviceCount(&n));
  std::vector<int> devices(n);
  for (int i = 0; i < n; ++i) devices[i] = i;
  return devices;
}

TEST(CudaNccl, LibraryLoadsWithAVersion) {
  auto lib = NcclLibrary::get();
  ASSERT_TRUE(lib.has_value()) << lib.status().to_string();
  std::printf("[nccl] version %s, %zu GPU(s)\n", (*lib)->version_string().c_str(), visible_devices().size());
  EXPECT_GE((*lib)->version(), 21000);
}

// Rank r holds values (r + 1) * (i % 7); the sum over n ranks is n (n + 1) / 2 * (i % 7), exact in
// bf16 for these small integers. Each rank runs on its own thread (no group needed), `graph`
// captures the collective on the rank's stream first and replays it.
void check_collectives(bool graph) {
  const std::vector<int> devices = visible_devices();
  auto comms = NcclCommunicators::create(devices);
  ASSERT_TRUE(comms.has_value()) << comms.status().to_string();
  const int n = comms->size();
  constexpr size_t kCount = 4099;  // not a multiple of anything
  std::vector<std::vector<float>> reduced(n), gathered(n);
  std::vector<std::vector<__nv_bfloat16>> reduced_bf16(n);
  std::vector<Status> status(n);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      ORIGAMI_CUDA_CHECK(cudaSetDevice(devices[rank]));
      cudaStream_t stream;
      ORIGAMI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      std::vector<float> host(kCount);
      std::vector<__nv_bfloat16> host_bf16(kCount);
      for (size_t i = 0; i < kCount; ++i) {
        host[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 7));
        host_bf16[i] = __float2bfloat16(host[i]);
      }
      float *buf, *gather;
      __nv_bfloat16* buf_bf16;
      ORIGAMI_CUDA_CHECK(cudaMalloc(&buf, kCount * sizeof(float)));
      ORIGAMI_CUDA_CHECK(cudaMalloc(&buf_bf16, kCount * sizeof(__nv_bfloat16)));
      ORIGAMI_CUDA_CHECK(cudaMalloc(&gather, n * kCount * sizeof(float)));
      ORIGAMI_CUDA_CHECK(cudaMemcpy(buf, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice));
      ORIGAMI_CUDA_CHECK(cudaMemcpy(buf_bf16, host_bf16.data(), kCount * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
      auto enqueue = [&]() -> Status {
        ORIGAMI_RETURN_IF_ERROR(comms->all_gather(rank, buf, gather, kCount, NcclDataType::kFloat32, stream));
        ORIGAMI_RETURN_IF_ERROR(comms->all_reduce_sum(rank, buf, kCount, NcclDataType::kFloat32, stream));
        return comms->all_reduce_sum(rank, buf_bf16, kCount, NcclDataType::kBFloat16, stream);
      };
      if (graph) {
        // NCCL connects its ranks lazily, on a communicator's first collectives, with calls that
        // a stream capture does not allow; the engine's eager prefill steps do this before it
        // captures decode graphs, and so does this warm-up (its results are overwritten below).
        const Status warm_up = enqueue();
        ORIGAMI_CUDA_CHECK(cudaStreamSynchronize(stream));
        ORIGAMI_CUDA_CHECK(cudaMemcpy(buf, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice));
        ORIGAMI_CUDA_CHECK(
            cudaMemcpy(buf_bf16, host_bf16.data(), kCount * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
        cudaGraph_t g;
        cudaGraphExec_t exec;
        ORIGAMI_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        status[rank] = warm_up.is_ok() ? enqueue() : warm_up;
        ORIGAMI_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
        ORIGAMI_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
        ORIGAMI_CUDA_CHECK(cudaGraphLaunch(exec, stream));
        ORIGAMI_CUDA_CHECK(cudaStreamSynchronize(stream));
        ORIGAMI_CUDA_CHECK(cudaGraphExecDestroy(exec));
        ORIGAMI_CUDA_CHECK(cudaGraphDestroy(g));
      } else {
        status[rank] = enqueue();
        ORIGAMI_CUDA_CHECK(cudaStreamSynchronize(stream));
      }
      reduced[rank].resize(kCount);
      reduced_bf16[rank].resize(kCount);
      gathered[rank].resize(n * kCount);
      ORIGAMI_CUDA_CHECK(cudaMemcpy(reduced[rank].data(), buf, kCount * sizeof(float), cudaMemcpyDeviceToHost));
      ORIGAMI_CUDA_CHECK(
          cudaMemcpy(reduced_bf16[rank].data(), buf_bf16, kCount * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
      ORIGAMI_CUDA_CHECK(cudaMemcpy(gathered[rank].data(), gather, n * kCount * sizeof(float), cudaMemcpyDeviceToHost));
      cudaFree(buf);
      cudaFree(buf_bf16);
      cudaFree(gather);
      cudaStreamDestroy(stream);
    });
  }
  for (auto& t : threads) t.join();
  const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
  for (int rank = 0; rank < n; ++rank) {
    ASSERT_TRUE(status[rank].is_ok()) << "rank " << rank << ": " << status[rank].to_string();
    for (size_t i = 0; i < kCount; ++i) {
      const float want = ranks_sum * static_cast<float>(i % 7);
      ASSERT_EQ(reduced[rank][i], want) << "fp32 all-reduce, rank " << rank << " element " << i;
      ASSERT_EQ(__bfloat162float(reduced_bf16[rank][i]), want) << "bf16 all-reduce, rank " << rank << " element " << i;
      for (int src = 0; src < n; ++src)
        ASSERT_EQ(gathered[rank][src * kCount + i], static_cast<float>((src + 1) * static_cast<int>(i % 7)))
            << "all-gather, rank " << rank << " from " << src << " element " << i;
    }
  }
}

TEST(CudaNccl, AllReduceAndAllGatherOverEveryGpu) { check_collectives(false); }
TEST(CudaNccl, CollectivesReplayFromACudaGraph) { check_collectives(true); }

}  // namespace
}  // namespace origami::cuda
