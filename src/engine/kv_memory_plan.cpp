#include "engine/kv_memory_plan.h"

#include <algorithm>
#include <limits>

#include "core/host_memory.h"

#include "policy/kv_budget.h"
#include "policy/policy_registry.h"

namespace origami {
namespace {

int64_t default_cpu_kv_bytes() { return int64_t{1} << 30; }
// Slots of an engine whose default policy needs none: enough for requests that pick a policy
// with queries, small enough to cost little memory.
constexpr int kSlotsWithoutQueryPolicy = 8;
// Rows per slot when the default policy needs none: the largest built-in default window (SnapKV).
constexpr int kDefaultQueryWindow = 32;

}  // namespace

Expected<KVMemoryPlan> plan_kv_memory(const EngineConfig& config, const ModelConfig& model, const KVLayout& layout,
                                      const Backend& backend) {
  KVMemoryPlan plan;
  Expected<std::shared_ptr<const KVPolicy>> policy = PolicyRegistry::builtin().create(config.kv_policy, config.kv_policy_options);
  if (!policy) return policy.status();
  plan.default_policy = *policy;
  const KVPolicy& p = **policy;
  if (config.kv_budget < 0)
    return invalid_argument("kv_budget must be >= 0 tokens (0 = the policy's default), got " + std::to_string(config.kv_budget));
  plan.default_budget = resolve_kv_budget(0, config.kv_budget, p.default_budget());
  if (p.compresses() && !p.takes_budget() && config.kv_budget > 0)
    return invalid_argument("kv_budget " + std::to_string(config.kv_budget) + " is given, but KV policy " + p.name() +
                            " takes no budget (its compressions keep a ratio of a sliding window; see its options)");
  if (p.compresses()) ORIGAMI_RETURN_IF_ERROR(p.check_budget(plan.default_budget, config.block_size));
  if (config.num_query_slots < -1)
    return invalid_argument("num_query_slots must be >= -1 (-1 = no compression, 0 = automatic), got " +
                            std::to_string(config.num_query_slots));
  if (config.num_query_slots == -1 && p.compresses())
    return invalid_argument("num_query_slots = -1 turns compression off, but KV policy " + p.name() + " compresses");
  if (config.compression_layer_stride < 1)
    return invalid_argument("compression_layer_stride must be >= 1, got " + std::to_string(config.compression_layer_stride));
  if (config.query_window < 0)
    return invalid_argument("query_window must be >= 0, got " + std::to_string(config.query_window));

  const PolicyNeeds needs = p.needs();
  plan.compression = config.num_query_slots != -1;
  CompressionConfig& cc = plan.compression_config;
  cc.layer_stride = config.compression_layer_stride;
  cc.max_window = config.query_window > 0 ? config.query_window : needs.window_queries ? needs.window : kDefaultQueryWindow;
  if (needs.window_queries && cc.max_window < needs.window)
    return invalid_argument("query_window " + std::to_string(cc.max_window) + " is smaller than the window " +
                            std::to_string(needs.window) + " of KV policy " + p.name());
  // A full-KV default engine keeps score pages so that requests may choose any policy.
  cc.global_scores = plan.compression && (needs.global_scores || !p.compresses());

  // What one block takes in the backend's memory: FP8 entries (E4M3 + a scale per head vector)
  // fit about twice the blocks of bf16 in the same bytes on CUDA.
  const int64_t block_bytes = static_cast<int64_t>(backend.kv_page_bytes(layout));
  const int64_t page_bytes = cc.global_scores
                                 ? int64_t{model.num_layers} * model.num_kv_heads * config.block_size * int64_t{sizeof(float)}
                                 : 0;
  const int64_t slot_bytes = plan.compression ? static_cast<int64_t>(backend.query_slot_bytes(cc.max_window)) : 0;
  int cap = 0;
  if (plan.compression) {
    cap = config.num_query_slots > 0 ? config.num_query_slots
          : needs.window_queries     ? config.max_num_seqs
                                     : std::min(config.max_num_seqs, kSlotsWithoutQueryPolicy);
  }
  // The blocks one request holds at most under the default budget (a SnapKV prompt is only
  // bounded at its end: its budget plus the block decoding writes into).
  // A policy without a budget (kvllm) grows like full KV: no bound to size the slots by.
  const int max_blocks =
      p.compresses() && p.takes_budget() ? max_blocks_for_budget(plan.default_budget, config.block_size) : 1;

  // Block counts are int; sizes are computed in 64 bits and checked before narrowing, and a CPU
  // cache must fit in host memory (its allocation would otherwise fail or be overcommitted).
  const int64_t max_pool_blocks = std::numeric_limits<int>::max() - 1;
  if (config.device == "cpu") {
    const double requested = config.num_kv_blocks > 0 ? static_cast<double>(config.num_kv_blocks) * (block_bytes + page_bytes)
                                                      : static_cast<double>(config.kv_cache_bytes);
    ORIGAMI_RETURN_IF_ERROR(check_host_memory(
        requested, config.num_kv_blocks > 0 ? "the KV cache (--num-kv-blocks " + std::to_string(config.num_kv_blocks) + ")"
                                            : std::string("the KV cache (--kv-cache-memory)")));
  }
  if (config.num_kv_blocks <= 0 && config.kv_cache_bytes / (block_bytes + page_bytes) > max_pool_blocks)
    return invalid_argument("--kv-cache-memory " + format_bytes(static_cast<double>(config.kv_cache_bytes)) + " is " +
                            std::to_string(config.kv_cache_bytes / (block_bytes + page_bytes)) + " KV blocks of " +
                            format_bytes(static_cast<double>(block_bytes + page_bytes)) + ", more than the " +
                            std::to_string(max_pool_blocks) + " a pool can index: lower --kv-cache-memory");
  if (config.num_kv_blocks > 0) {
    plan.num_blocks = config.num_kv_blocks + 1;  // the null block is not counted as usable
    cc.num_query_slots =
        needs.window_queries
            ? size_query_slots(int64_t{config.num_kv_blocks} * (block_bytes + page_bytes), block_bytes, page_bytes,
                               max_blocks, slot_bytes, cap).num_query_slots
            : cap;
  } else {
    int64_t bytes = config.kv_cache_bytes;
    if (bytes <= 0 && config.device == "cpu") bytes = default_cpu_kv_bytes();
    const int64_t requested = std::max<int64_t>(bytes, 0);
    bytes = static_cast<int64_t>(backend.available_kv_bytes(static_cast<size_t>(requested)));
    // An explicit size is a promise to the user (a benchmark compares at equal memory): refuse it
    // rather than quietly allocate less.
    if (config.kv_cache_bytes > 0 && bytes < config.kv_cache_bytes)
      return invalid_argument("--kv-cache-memory " + format_bytes(static_cast<double>(config.kv_cache_bytes)) +
                              " does not fit: the " + config.device + " backend has " +
                              format_bytes(static_cast<double>(bytes)) +
                              " left after the weights and step buffers (within --gpu-memory-utilization): lower "
                              "--kv-cache-memory or raise --gpu-memory-utilization");
    if (needs.window_queries) {
      const QuerySlotSizing s = size_query_slots(bytes, block_bytes, page_bytes, max_blocks, slot_bytes, cap);
      cc.num_query_slots = s.num_query_slots;
      plan.num_blocks = s.num_blocks;
    } else {
      cc.num_query_slots = cap;
      plan.num_blocks = static_cast<int>(std::min<int64_t>(
          std::max<int64_t>(bytes - cap * slot_bytes, 0) / (block_bytes + page_bytes), max_pool_blocks));
    }
  }
  if (plan.num_blocks < 2)
    return invalid_argument("the KV cache holds no usable block (one block takes " +
                            format_bytes(static_cast<double>(block_bytes + page_bytes)) +
                            "): raise --kv-cache-memory or --num-kv-blocks");
  if (needs.window_queries && cc.num_query_slots < 1)
    return invalid_argument("the KV cache (" + std::to_string(plan.num_blocks - 1) + " blocks) cannot hold one request of KV policy " +
                            p.name() + " at budget " + std::to_string(plan.default_budget) + " (" +
                            std::to_string(max_blocks) + " blocks) plus its query slot: raise --kv-cache-memory or lower --kv-budget");
  return plan;
}

}  // namespace origami
