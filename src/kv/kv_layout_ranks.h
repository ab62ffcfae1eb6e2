#pragma once
// A KV layout cut across tensor-parallel ranks: rank r holds KV heads [r * H / R, (r + 1) * H / R)
// of every layer (the attention heads' split), so each rank's pool holds only its heads.
//
// The one-group layout splits as it is (every rank has every page, with its heads). Head groups
// split when every group holds as many heads on each rank: then a group's pages exist on every
// rank with the same page ids and tables, each rank storing its own heads' slots, and the
// scheduler's one shared pool stays one pool (no rank holds pages it cannot use). Groups that lie
// on one rank (adjacent heads) would need a pool per rank instead; they are refused.
//
// striped_heads() builds such groups: group k of a layer takes hp / R heads from every rank's
// slice, so per-head pages on one GPU (hp = 1) become, at R ranks, groups of R heads, one per
// rank, sharing one page table (the group keeps the largest of its heads' counts).
#include <vector>

#include "core/status.h"
#include "kv/kv_layout.h"

namespace origami {

// Per layer, the groups of `heads_per_group` heads, heads_per_group / ranks from each rank's
// slice: group k has, for every rank r, heads r * H / R + k * (hp / R) + [0, hp / R).
// heads_per_group must be a multiple of `ranks` and divide num_kv_heads; ranks must divide it.
Expected<std::vector<std::vector<std::vector<int>>>> striped_heads(int num_layers, int num_kv_heads,
                                                                   int heads_per_group, int ranks);

// Rank `rank`'s part of `layout` over `ranks` ranks: num_kv_heads / ranks heads, numbered from 0
// (head h of the rank is model head rank * H / R + h); the same groups, page counts, budgets and
// pool, each group with its heads on this rank, in the group's slot order. Fails with a message
// naming tensor parallelism when the heads do not split (KV heads not a multiple of the ranks, a
// group with more heads on one rank than on another).
Expected<KVLayout> slice_layout_for_rank(const KVLayout& layout, int rank, int ranks);

}  // namespace origami
