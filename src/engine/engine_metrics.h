#pragma once
// Counters the engine keeps while it runs; benchmarks and the server read them.
#include <cstdint>

namespace origami {

struct EngineMetrics {
  int64_t num_steps = 0;
  // Steps launched before the last one's tokens were known (EngineConfig::async_scheduling).
  int64_t num_pipelined_steps = 0;
  int64_t num_prompt_tokens_computed = 0;  // prefill tokens actually run (prefix hits excluded)
  int64_t num_prefix_cached_tokens = 0;
  // Retained contexts (KVCacheManager::retained_stats): contexts kept, admissions that continued
  // one, tokens those did not prefill again, contexts released; alive contexts and their pages.
  int64_t num_retained_contexts = 0;
  int64_t num_retained_hits = 0;
  int64_t num_retained_hit_tokens = 0;
  int64_t num_retained_releases = 0;
  int retained_contexts_alive = 0;
  int retained_kv_blocks = 0;
  int64_t num_generated_tokens = 0;
  int64_t num_preemptions = 0;
  int64_t num_finished = 0;
  int peak_running = 0;
  int peak_kv_blocks_used = 0;
  int num_kv_blocks_total = 0;
  double execute_seconds = 0.0;   // time in backend.execute
  double schedule_seconds = 0.0;  // time planning steps
  // Inside execute, where the backend measures it (StepOutput): its host time before the step's
  // first enqueue, and the steps' spans on the device. execute - prepare - device is the host's
  // wait and result handling; wall - execute - schedule the engine's own work between steps.
  double backend_prepare_seconds = 0.0;
  double device_seconds = 0.0;

  // KV compression.
  int64_t num_compressions = 0;      // request compressions completed
  int64_t num_evicted_tokens = 0;    // entries dropped per (layer, KV head), summed over compressions
  int64_t num_kept_kv_pages = 0;     // pages held right after each compaction (SchedulerUpdate), summed
  double compression_seconds = 0.0;  // wall time the engine spent starting or waiting for compressions
  // Time the backend spent running compressions (CUDA: the compression stream, overlapping the
  // decode steps when compression is async; CPU: the compression itself).
  double compression_device_seconds = 0.0;
  int64_t num_query_slot_waits = 0;  // request-steps skipped because no query slot was free
  int num_query_slots = 0;           // M (0: the engine cannot compress)
};

}  // namespace origami
