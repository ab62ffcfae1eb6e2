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
//
// Page-aligned (page_size b > 0, ScoreRecipe::page_aligned): the scope's total is counted in pages
// of b entries, so that no head's last page is left partly empty.
//  1. the guarantees as above, g_h; the scope gets P = max(floor(T / b), sum_h ceil(g_h / b))
//     pages, T = mean_keep x m (the guarantees' pages even where they exceed floor(T / b));
//  2. the threshold: the longest prefix of the scope's remaining entries in the order of step 2
//     above (score, entry index, head listed first) such that the heads' pages, sum over heads of
//     ceil(c_h / b) with c_h = g_h + the head's entries in the prefix, are at most P;
//  3. every head fills its last page with its next-best entries: c_h = min(n_h, ceil(c_h / b) x b).
// Every head's count is then a whole number of pages, or all its entries. Equivalently, since an
// entry opens a page exactly when it is a head's (k x b + 1)-th best for k >= ceil(g_h / b): each
// head keeps ceil(g_h / b) + o_h pages' worth, o_h its page-opening entries among the scope's best
// P - sum_h ceil(g_h / b) page-opening entries (by the same order).
// page_size 0: the entry counts above.
std::vector<int> joint_head_counts(KeepAllocation allocation, const std::vector<HeadSelectionScores>& heads,
                                   int mean_keep, float alpha_safe, int page_size = 0);

}  // namespace origami::cpu
