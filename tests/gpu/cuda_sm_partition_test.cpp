// SmPartition: the two sets are disjoint, cover the GPU, and a stream's kernels run only on its
// set's SMs (record_sm_ids: one CTA an SM at a time, three rounds of every SM in the set, so every
// SM of the set is seen and none outside it may be).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <set>

#include "backend/cuda/sm_partition.h"

namespace origami::cuda {
namespace {

int device_sms() {
  int device = 0, sms = 0;
  EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  return sms;
}

std::set<int> sms_used_ok(cudaStream_t stream, int ctas) {
  auto used = sms_used(stream, ctas);
  EXPECT_TRUE(used.has_value()) << used.status().message();
  return used ? *used : std::set<int>{};
}

TEST(SmPartition, StreamsRunOnDisjointSetsThatCoverTheGpu) {
  const int total = device_sms();
  for (int want : {8, total / 2, total - 16}) {
    auto p = SmPartition::split(0, want);
    ASSERT_TRUE(p.has_value()) << p.status().message();
    EXPECT_GE(p->sms(0), want);
    EXPECT_EQ(p->sms(0) + p->sms(1), total) << "asked " << want;
    const std::set<int> first = sms_used_ok(p->stream(0), 3 * p->sms(0));
    const std::set<int> second = sms_used_ok(p->stream(1), 3 * p->sms(1));
    EXPECT_EQ(static_cast<int>(first.size()), p->sms(0)) << "asked " << want;
    EXPECT_EQ(static_cast<int>(second.size()), p->sms(1)) << "asked " << want;
    for (int sm : first) EXPECT_EQ(second.count(sm), 0u) << "SM " << sm << " in both sets";
    for (int sm : first) EXPECT_TRUE(sm >= 0 && sm < total) << sm;
  }
  // An ordinary stream still reaches every SM.
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_EQ(static_cast<int>(sms_used_ok(s, 3 * total).size()), total);
  cudaStreamDestroy(s);
}

TEST(SmPartition, RefusesSetsThatCannotExist) {
  const int total = device_sms();
  for (int bad : {0, -4, total, total + 8}) {
    auto p = SmPartition::split(0, bad);
    ASSERT_FALSE(p.has_value()) << bad;
    EXPECT_NE(p.status().message().find("SMs"), std::string::npos) << p.status().message();
  }
}

}  // namespace
}  // namespace origami::cuda
