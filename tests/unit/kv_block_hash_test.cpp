// The prefix-cache hash: deterministic, chained on the parent, order-sensitive and well mixed.
#include "kv/block_hash.h"

#include <gtest/gtest.h>

#include <bit>
#include <random>
#include <unordered_set>
#include <vector>

namespace origami {
namespace {

TEST(BlockHash, DependsOnParentTokensAndOrder) {
  const std::vector<int32_t> t{1, 2, 3, 4, 5};
  const uint64_t h = hash_block_tokens(kRootBlockHash, t);
  EXPECT_EQ(h, hash_block_tokens(kRootBlockHash, t));
  EXPECT_NE(h, hash_block_tokens(h, t));
  EXPECT_NE(h, hash_block_tokens(kRootBlockHash, std::vector<int32_t>{2, 1, 3, 4, 5}));
  EXPECT_NE(h, hash_block_tokens(kRootBlockHash, std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_NE(hash_block_tokens(kRootBlockHash, std::vector<int32_t>{0}),
            hash_block_tokens(kRootBlockHash, std::vector<int32_t>{0, 0}));
}

TEST(BlockHash, NoCollisionsAmongManyBlocks) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> tok(0, 31);  // a small vocabulary: many near-duplicates
  std::unordered_set<uint64_t> seen;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> t(16);
    for (auto& x : t) x = tok(rng);
    seen.insert(hash_block_tokens(static_cast<uint64_t>(i % 7), t));
  }
  // Random 16-token blocks over 32 symbols repeat with negligible probability.
  EXPECT_EQ(static_cast<int>(seen.size()), n);
}

TEST(BlockHash, OneBitFlipChangesAboutHalfTheBits) {
  std::mt19937 rng(2);
  std::uniform_int_distribution<int32_t> tok(0, 150000);
  double total = 0;
  int count = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int32_t> t(15);
    for (auto& x : t) x = tok(rng);
    const uint64_t h = hash_block_tokens(kRootBlockHash, t);
    const size_t pos = static_cast<size_t>(trial) % t.size();
    t[pos] ^= 1 << (trial % 17);
    total += std::popcount(h ^ hash_block_tokens(kRootBlockHash, t));
    ++count;
  }
  const double mean = total / count;
  EXPECT_GT(mean, 30.0);
  EXPECT_LT(mean, 34.0);
}

}  // namespace
}  // namespace origami
