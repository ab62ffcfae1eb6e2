// InvariantDivider (core/invariant_divider.h) against plain integer division: every divisor from 1
// to 4,096 (page sizes) and a few larger ones, over the small numerators a page table sees, each
// multiple of the divisor and its neighbours, and numerators up to 2^31 - 1, where the multiply-
// high and the add come closest to 32 bits.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <random>
#include <vector>

#include "core/invariant_divider.h"

namespace origami {
namespace {

void expect_divides(const InvariantDivider& v, int d, int n) {
  ASSERT_EQ(v.divide(n), n / d) << "n = " << n << ", d = " << d << " (mul " << v.mul << ", shift " << v.shift << ")";
}

TEST(InvariantDivider, MatchesDivisionForEveryPageSize) {
  std::mt19937 rng(31);
  std::uniform_int_distribution<int> any(0, INT_MAX);
  std::vector<int> divisors;
  for (int d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (int d : {5000, 65535, 65536, 65537, 1 << 20, (1 << 20) + 1, 1'000'000'007, INT_MAX}) divisors.push_back(d);
  for (int d : divisors) {
    const InvariantDivider v = InvariantDivider::make(d);
    ASSERT_EQ(v.divisor, static_cast<uint32_t>(d));
    for (int n = 0; n < 3 * 4096; ++n) expect_divides(v, d, n);
    for (long long k = 1; k * d < INT_MAX && k < 64; ++k)
      for (int delta : {-1, 0, 1}) expect_divides(v, d, static_cast<int>(k * d + delta));
    for (int n : {INT_MAX, INT_MAX - 1, INT_MAX - d, INT_MAX / 2, 1 << 30}) expect_divides(v, d, n);
    for (int i = 0; i < 64; ++i) expect_divides(v, d, any(rng));
  }
}

TEST(InvariantDivider, NonPositiveDivisorsAreOne) {
  for (int d : {0, -1, INT_MIN}) {
    const InvariantDivider v = InvariantDivider::make(d);
    EXPECT_EQ(v.divisor, 1u);
    for (int n : {0, 1, 7, INT_MAX}) EXPECT_EQ(v.divide(n), n);
  }
}

}  // namespace
}  // namespace origami
