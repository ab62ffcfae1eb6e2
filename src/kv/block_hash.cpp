#include "kv/block_hash.h"

namespace origami {
namespace {

constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kPrime3 = 0x165667B19E3779F9ull;
constexpr uint64_t kPrime4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t kPrime5 = 0x27D4EB2F165667C5ull;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline uint64_t round(uint64_t acc, uint64_t input) {
  acc += input * kPrime2;
  acc = rotl(acc, 31);
  return acc * kPrime1;
}

}  // namespace

uint64_t hash_block_tokens(uint64_t parent_hash, std::span<const int32_t> token_ids) {
  const size_t n = token_ids.size();
  // The parent hash seeds the state, so the same tokens after different prefixes hash apart.
  uint64_t h = parent_hash * kPrime1 + kPrime5 + static_cast<uint64_t>(n) * 4;
  size_t i = 0;
  // Two tokens form one 64-bit lane.
  for (; i + 2 <= n; i += 2) {
    const uint64_t lane = static_cast<uint64_t>(static_cast<uint32_t>(token_ids[i])) |
                          (static_cast<uint64_t>(static_cast<uint32_t>(token_ids[i + 1])) << 32);
    h ^= round(0, lane);
    h = rotl(h, 27) * kPrime1 + kPrime4;
  }
  if (i < n) {
    h ^= static_cast<uint64_t>(static_cast<uint32_t>(token_ids[i])) * kPrime1;
    h = rotl(h, 23) * kPrime2 + kPrime3;
  }
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  h *= kPrime3;
  h ^= h >> 32;
  return h;
}

}  // namespace origami
