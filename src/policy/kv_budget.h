#pragma once
// Budget arithmetic of Compressed PagedAttention (Zipage §4.1–4.2): a request may hold at most
// N_max = floor(budget / b) + 1 blocks; a compression keeps k = (N_max - 1) * b entries per
// (layer, KV head) and leaves block N_max for new tokens. The number of query slots M follows
// the paper's eq. 1 (eq. 2 with global scores).
#include <cstdint>
#include <vector>

namespace origami {

// The largest KV budget, in tokens, for every way of giving one (--kv-budget, a request's
// kv_budget, eval sweeps): 2^30 keeps N_max * b, and every sum of a budget with a block or a
// window, far inside int.
inline constexpr int kMaxKvBudget = 1 << 30;

// The budget a request runs with, in tokens: the request's if set (> 0), else the engine's, else
// the policy's default. The one place this order is written.
int resolve_kv_budget(int request_budget, int engine_budget, int policy_default);

// N_max: blocks a request may hold while decoding under `budget` tokens (>= 1 block of budget).
int max_blocks_for_budget(int budget, int block_size);
// k = (N_max - 1) * b: entries kept per (layer, KV head) by a cache-full compression.
int entries_kept_for_budget(int budget, int block_size);

// Calibrated per-head budgets (`tangram`): the budget is the average entries kept per (layer,
// KV head), and head group g keeps ceil(ratio_g x lead) with ratio_g <= 1 its share of the group
// keeping most. Returns that lead count, ceil(average x G / sum of ratios), so that the groups keep
// `average` entries on average (at least: each group rounds up). Empty ratios: uniform, `average`.
int lead_budget_for_average(int average, const std::vector<float>& group_ratios);

struct QuerySlotSizing {
  int num_query_slots = 0;  // M
  int num_blocks = 0;       // N_total: KV blocks that fit beside the slots
};

// Splits `available_bytes` between KV blocks and query slots:
//   M = floor(m_avail / (m_block * N_max + m_q)),  N_total = floor((m_avail - M * m_q) / m_block)
// with m_block = bytes of one KV block plus its global-score page (0 without global scores) and
// m_q = bytes of one query slot. M is then capped to [0, max_slots]; a cap frees the memory of
// the slots it removes for blocks.
QuerySlotSizing size_query_slots(int64_t available_bytes, int64_t block_bytes, int64_t score_page_bytes,
                                 int max_blocks, int64_t slot_bytes, int max_slots);

}  // namespace origami
