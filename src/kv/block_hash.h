#pragma once
// Content hash of a full KV block for the prefix cache: the block's token ids chained with the
// hash of the block before it, so equal hashes mean (up to collisions) equal whole prefixes.
// Collisions are harmless: the pool also compares token ids and the chain link before serving.
#include <cstdint>
#include <span>

namespace origami {

constexpr uint64_t kRootBlockHash = 0x9e3779b97f4a7c15ull;  // the "parent" of a sequence's first block

using BlockHasher = uint64_t (*)(uint64_t parent_hash, std::span<const int32_t> token_ids);

// 64-bit, well mixed (xxHash64-style lanes and avalanche), a few ns per token.
uint64_t hash_block_tokens(uint64_t parent_hash, std::span<const int32_t> token_ids);

}  // namespace origami
