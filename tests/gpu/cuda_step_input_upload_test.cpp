// StepInputUpload: the used parts of the step inputs reach the device array exactly, directly or
// through the stage; behind a step still running on the compute stream, the staged upload leaves
// the device array alone until that step is done; and a second staged upload does not overwrite
// the stage before the first has been moved out of it. The compute stream is held busy by a host
// function (cudaLaunchHostFunc) that sleeps, so that the copy stream's work happens meanwhile.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/step_input_upload.h"

namespace origami::cuda {
namespace {

constexpr size_t kElems = 60000;

struct Buffers {
  int32_t* host = nullptr;  // pinned, as the backend's staging
  int32_t* dev = nullptr;
  int32_t* seen = nullptr;  // device snapshots of `dev`
  cudaStream_t compute = nullptr;
  Buffers() {
    ORIGAMI_CUDA_CHECK(cudaMallocHost(&host, kElems * sizeof(int32_t)));
    ORIGAMI_CUDA_CHECK(cudaMalloc(&dev, kElems * sizeof(int32_t)));
    ORIGAMI_CUDA_CHECK(cudaMalloc(&seen, 2 * kElems * sizeof(int32_t)));
    ORIGAMI_CUDA_CHECK(cudaMemset(dev, 0xff, kElems * sizeof(int32_t)));  // -1 everywhere
    // cudaMemset of device memory may still run when it returns, on the legacy default stream,
    // which the non-blocking streams below do not wait for: without this an upload could land
    // first and be overwritten (seen once on the H100: element 0 read -1).
    ORIGAMI_CUDA_CHECK(cudaDeviceSynchronize());
    ORIGAMI_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  }
  ~Buffers() {
    cudaStreamSynchronize(compute);
    cudaStreamDestroy(compute);
    cudaFreeHost(host);
    cudaFree(dev);
    cudaFree(seen);
  }
  void fill_host(int32_t base) {
    for (size_t i = 0; i < kElems; ++i) host[i] = base + static_cast<int32_t>(i);
  }
  // Holds the compute stream for `ms` milliseconds (the step before).
  void hold_compute(int ms) {
    hold_ms = ms;
    ORIGAMI_CUDA_CHECK(cudaLaunchHostFunc(
        compute, [](void* held) { std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(held))); },
        &hold_ms));
  }
  int hold_ms = 0;  // read by the host function when the stream reaches it
  void snapshot(int which) {
    ORIGAMI_CUDA_CHECK(cudaMemcpyAsync(seen + which * kElems, dev, kElems * sizeof(int32_t), cudaMemcpyDeviceToDevice,
                                       compute));
  }
  std::vector<int32_t> download(const int32_t* p) {
    std::vector<int32_t> v(kElems);
    ORIGAMI_CUDA_CHECK(cudaStreamSynchronize(compute));
    ORIGAMI_CUDA_CHECK(cudaMemcpy(v.data(), p, kElems * sizeof(int32_t), cudaMemcpyDeviceToHost));
    return v;
  }
};

// Two parts far apart (more than the merge gap between them) and a third close to the second.
const InputRange kRanges[] = {{0, 100}, {50000, 50100}, {50200, 50300}};

// Snapshot `which` holds the host values written with `base` at the used parts' ends.
void expect_snapshot(Buffers& b, int which, int32_t base, const char* what) {
  const std::vector<int32_t> v = b.download(b.seen + which * kElems);
  for (size_t i : {size_t{0}, size_t{99}, size_t{50000}, size_t{50299}})
    EXPECT_EQ(v[i], base + static_cast<int32_t>(i)) << "snapshot " << which << ", element " << i << ": " << what;
}

TEST(StepInputUpload, CopiesExactlyTheUsedPartsDirectlyAndStaged) {
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "staged" : "direct");
    Buffers b;
    StepInputUpload up;
    b.fill_host(1000);
    ASSERT_TRUE(up.upload(b.dev, b.host, kRanges, 3, overlap, b.compute).is_ok());
    const std::vector<int32_t> d = b.download(b.dev);
    for (size_t i = 0; i < kElems; ++i) {
      const bool used = i < 100 || (i >= 50000 && i < 50300);  // the close parts are copied with their gap
      ASSERT_EQ(d[i], used ? b.host[i] : -1) << "element " << i;
    }
    EXPECT_EQ(up.num_staged_uploads(), overlap ? 1 : 0);
  }
}

TEST(StepInputUpload, StagedUploadWaitsForTheStepBeforeToFinishWithTheInputs) {
  Buffers b;
  StepInputUpload up;
  b.fill_host(1000);
  ASSERT_TRUE(up.upload(b.dev, b.host, kRanges, 3, false, b.compute).is_ok());
  ASSERT_TRUE(up.wait_host_staging_read().is_ok());
  b.fill_host(5000);
  b.hold_compute(50);  // the step before, still running
  b.snapshot(0);       // what it reads at its end
  ASSERT_TRUE(up.upload(b.dev, b.host, kRanges, 3, /*overlap=*/true, b.compute).is_ok());
  // The host staging is read by the copy stream while the compute stream is held.
  ASSERT_TRUE(up.wait_host_staging_read().is_ok());
  b.snapshot(1);
  expect_snapshot(b, 0, 1000, "overwritten while the step before ran");
  expect_snapshot(b, 1, 5000, "the new inputs");
}

TEST(StepInputUpload, ASecondStagedUploadWaitsUntilTheFirstLeftTheStage) {
  Buffers b;
  StepInputUpload up;
  b.fill_host(1000);
  b.hold_compute(50);
  ASSERT_TRUE(up.upload(b.dev, b.host, kRanges, 3, true, b.compute).is_ok());
  b.snapshot(0);
  ASSERT_TRUE(up.wait_host_staging_read().is_ok());  // returns while the compute stream is still held
  b.fill_host(7000);
  ASSERT_TRUE(up.upload(b.dev, b.host, kRanges, 3, true, b.compute).is_ok());
  b.snapshot(1);
  expect_snapshot(b, 0, 1000, "the second upload overwrote the stage");
  expect_snapshot(b, 1, 7000, "the second inputs");
  EXPECT_EQ(up.num_staged_uploads(), 2);
}

// Parts closer than the merge gap are one copy; more separate parts than kMaxRanges are refused
// before anything is copied.
TEST(StepInputUpload, MorePartsThanItTakesAfterMergingIsAnError) {
  Buffers b;
  StepInputUpload up;
  b.fill_host(1);
  std::vector<InputRange> close, apart;
  for (size_t k = 0; k <= StepInputUpload::kMaxRanges; ++k) {
    close.push_back({k * 3, k * 3 + 1});
    apart.push_back({k * 20000, k * 20000 + 1});  // never copied: refused first
  }
  EXPECT_TRUE(up.upload(b.dev, b.host, close.data(), close.size(), false, b.compute).is_ok());
  const Status st = up.upload(b.dev, b.host, apart.data(), apart.size(), true, b.compute);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.to_string().find("parts"), std::string::npos) << st.to_string();
  EXPECT_EQ(up.num_staged_uploads(), 0);
}

}  // namespace
}  // namespace origami::cuda
