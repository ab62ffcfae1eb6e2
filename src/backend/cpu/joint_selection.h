#pragma once
// A runtime allocation's kept counts (KeepAllocation kLayer / kGlobal, kv/compression.h): how
// many entries each (layer, KV head) of a request keeps when its heads are selected jointly, from
// the heads' final selection scores (after protection: protected entries score +inf).
#include <vector>

#include "kv/compression.h"

namespace origami::cpu {

// One (layer, KV head)'s selection scores.
struct HeadSelectionScores {
  int layer = 0;
  const float* scores = nullptr;
  int n = 0;
};

// The entries each head keeps, in `heads`' order. A scope is one layer (kLayer) or every head
// (kGlobal); a scope of m heads keeps mean_keep x m entries in total:
//  1. every head keeps its +inf entries (the recipe's protected window and sinks) and at least
//     floor(alpha_safe x mean_keep) (AdaKV's safeguard), its own best ones, capped by its entries;
//  2. the scope's remaining total (if any) goes to one top-k over every head's remaining entries:
//     higher score first, NaN lowest, ties to the larger entry index (select_keep's order), then to
//     the head listed first.
// Within a head the kept entries are always its best by select_keep's order, so a head keeping
// c entries keeps select_keep(scores, n, c). A scope whose guarantees exceed its total keeps them.
std::vector<int> joint_head_counts(KeepAllocation allocation, const std::vector<HeadSelectionScores>& heads,
                                   int mean_keep, float alpha_safe);

}  // namespace origami::cpu
