#include "sched/scheduler.h"

#include <algorithm>
#include <limits>
#include <string>

#include "core/check.h"
#include "core/host_timers.h"
#include "sched/compression_state.h"
#include "sched/retained_state.h"

namespace origami {

namespace {

// Slot math counts entries, not logical tokens, so that a compressed request asks only for the
// room its cache needs.
int num_entries(const Request& request) { return num_cache_entries(request); }

// Entries a compaction drops per (layer, KV head), averaged over the head groups.
int evicted_entries(const Request& request) {
  const RequestCompression& c = request.compression;
  const bool joint = c.runtime_allocated();
  if (c.groups.empty()) return c.src_entries - (joint ? c.kept_by_group[0] : c.num_keep);
  int sum = 0;
  for (size_t g = 0; g < c.groups.size(); ++g) {
    const GroupCompaction& gc = c.groups[g];
    sum += gc.compress ? gc.src_entries - (joint ? c.kept_by_group[g] : gc.num_keep) : 0;
  }
  return sum / static_cast<int>(c.groups.size());
}

// In flight: its source pages are being read. Bounded and compressed: it never needs another
// block, so preempting it would only throw away work (Zipage: compressed requests run to the end).
bool may_preempt(const Request& request) {
  return !request.compression.in_flight && !request.compression.switched_early && !request.memory_bounded();
}

// Whether the scheduler knows the request's peak blocks (budget reservation).
bool reserves_peak(const RequestCompression& c) {
  if (c.trigger == CompressionTrigger::kCacheFull) return c.max_blocks > 0;
  // Prefill-end compression applied chunk by chunk (TANGRAM): every group holds at most its keep
  // plus a chunk while the prompt is prefilled, then grows only by the outputs.
  return c.trigger == CompressionTrigger::kPrefillEnd && c.chunk_threshold >= 0;
}

// Prefill-end compression: the end-of-prefill decision is taken and nothing it decided is still
// pending or in flight, so no prompt chunk will ever be held again (until a preemption resets it).
bool prompt_behind(const RequestCompression& c) {
  return c.trigger == CompressionTrigger::kPrefillEnd && c.prefill_checked && !c.pending && !c.in_flight;
}

// Waits for its compression (pending or in flight) before it computes anything else.
bool blocked_on_compression(const Request& request) {
  return request.compression.pending || request.compression.in_flight;
}

}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config, KVCacheManager* kv)
    : config_(config), kv_(kv), slots_(std::max(config.num_query_slots, 0)) {
  ORIGAMI_CHECK(kv_ != nullptr);
  ORIGAMI_CHECK_MSG(config_.max_num_seqs >= 1, "max_num_seqs must be validated by the caller");
  ORIGAMI_CHECK_MSG(config_.max_num_batched_tokens >= 1, "max_num_batched_tokens must be validated by the caller");
}

void Scheduler::add_request(Request* request) {
  ORIGAMI_CHECK(request != nullptr && request->num_prompt_tokens() > 0);
  request->status = RequestStatus::kWaiting;
  waiting_.push_back(request);
}

std::string Scheduler::never_fits(const Request& request, int num_entries_after) const {
  const int need = kv_->blocks_needed(num_entries_after);
  if (need > kv_->num_usable_blocks()) {
    return "request " + std::to_string(request.id) + " needs " + std::to_string(need) + " KV blocks for " +
           std::to_string(num_entries_after) + " tokens, but the whole KV cache holds " +
           std::to_string(kv_->num_usable_blocks()) + " blocks of " + std::to_string(kv_->layout().block_size) +
           " tokens";
  }
  return {};
}

void Scheduler::release_slot(Request* request) {
  int& slot = request->compression.query_slot;
  if (slot < 0) return;
  slots_.release(slot);
  slot = -1;
}

void Scheduler::reject(Request* request, std::string why, SchedulerOutput* out) {
  release_slot(request);
  kv_->free(*request);
  request->num_computed_tokens = 0;
  request->compression.reset_progress();
  request->error = std::move(why);
  out->rejected.push_back(request);
}

void Scheduler::preempt(Request* request, SchedulerOutput* out, int* budget) {
  ORIGAMI_CHECK_MSG(!request->compression.in_flight, "a request being compressed cannot be preempted");
  auto it = std::find(running_.begin(), running_.end(), request);
  ORIGAMI_CHECK(it != running_.end());
  running_.erase(it);
  if (out != nullptr) {
    // Already scheduled earlier in this step: its blocks go back, so it cannot run.
    auto s = std::find_if(out->sequences.begin(), out->sequences.end(),
                          [&](const ScheduledSequence& seq) { return seq.request == request; });
    if (s != out->sequences.end()) {
      *budget += s->num_new_tokens;
      out->sequences.erase(s);
    }
    out->preempted.push_back(request);
  }
  // Recompute, not swap: the request keeps its output tokens and later prefills prompt + output.
  release_slot(request);
  kv_->free(*request);
  request->num_computed_tokens = 0;
  request->compression.reset_progress();
  request->status = RequestStatus::kPreempted;
  ++request->num_preemptions;
  waiting_.push_front(request);
}

Request* Scheduler::pick_victim(bool slotless_only) const {
  // Zipage's hybrid scheduling: the last running request without a query slot first.
  for (auto it = running_.rbegin(); it != running_.rend(); ++it)
    if (may_preempt(**it) && (*it)->compression.query_slot < 0) return *it;
  if (slotless_only) return nullptr;
  // With prefix sharing (and to free compression targets): the last uncompressed request.
  for (auto it = running_.rbegin(); it != running_.rend(); ++it)
    if (may_preempt(**it) && !(*it)->compression.compressed()) return *it;
  return nullptr;
}

SchedulerOutput Scheduler::schedule() {
  ORIGAMI_HOST_TIMER("scheduler.schedule");
  SchedulerOutput out;
  // One batch of compressions in flight at a time (the backend's compressor runs one).
  if (compressing_.empty()) {
    ORIGAMI_HOST_TIMER("scheduler.start_compressions");
    start_compressions(&out);
  }
  for (;;) {
    schedule_requests(&out);
    if (!out.sequences.empty() || running_.empty()) break;
    // Nothing runnable: the running requests wait for compressions or for each other.
    if (!compressing_.empty()) {
      out.wait_for_compressions = true;
      break;
    }
    // Tokens still being sampled (asynchronous scheduling): the engine learns them before it asks
    // again, and the requests waiting on them move or finish then: nothing to preempt for.
    if (std::any_of(running_.begin(), running_.end(), [](const Request* r) { return r->num_pending_tokens > 0; })) break;
    if (!preempt_to_make_progress(&out.preempted)) break;
  }
  return out;
}

void Scheduler::schedule_requests(SchedulerOutput* out_ptr) {
  SchedulerOutput& out = *out_ptr;
  // Preemptions of this pass (not those that freed compression targets) keep new requests out.
  const size_t preempted_before = out.preempted.size();
  int budget = config_.max_num_batched_tokens;
  const int block_size = kv_->layout().block_size;
  const bool constrained = !kv_->prefix_caching_enabled();

  // Running requests, in admission order. Requests finish their prefill in admission order (each
  // takes the budget before the next), so this order already puts decodes before prefill chunks.
  // A snapshot: preemption removes requests from running_ while we walk.
  const std::vector<Request*> order = running_;
  // Requests whose last token is on its way (asynchronous scheduling) finish once it is known:
  // they leave their place among max_num_seqs to a waiting request now, as they would have left
  // it one step at a time.
  int num_finishing = 0;
  for (Request* request : order) {
    if (request->status == RequestStatus::kRunning && request->sampled_all(config_.max_model_len)) ++num_finishing;
  }
  for (Request* request : order) {
    if (budget <= 0) break;
    if (request->status != RequestStatus::kRunning) continue;  // preempted earlier in this step
    if (blocked_on_compression(*request)) continue;
    if (request->sampled_all(config_.max_model_len)) continue;  // its last token is on its way
    const int remaining = request->num_tokens() - request->num_computed_tokens;
    if (remaining <= 0 || (!config_.enable_chunked_prefill && remaining > budget)) continue;
    int num_new = std::min(remaining, budget);
    // Only a request that captures queries needs its entries here (num_cache_entries walks every
    // head group's table of a runtime allocation).
    const int entries = may_capture_queries(*request) ? num_entries(*request) : 0;

    // A token of the next compression's window needs a query slot to capture its query into.
    const int capture_from = query_capture_from(*request, block_size, entries, num_new);
    bool take_slot = capture_from >= 0 && request->compression.query_slot < 0 && entries + num_new > capture_from;
    if (take_slot && slots_.num_free() == 0) {
      const int before_window = tokens_before_capture(*request, block_size, entries, num_new);
      if (before_window <= 0 || !config_.enable_chunked_prefill) {
        ++out.num_query_slot_waits;
        continue;
      }
      num_new = before_window;  // the tokens before the window need no slot
      take_slot = false;
    }
    bool scheduled = false;
    for (;;) {
      // Every head group gets the step's tokens (groups may hold different numbers of entries).
      if (kv_->append_slots(*request, num_new)) {
        scheduled = true;
        break;
      }
      // append_slots changed nothing (all or nothing): the entries before the step are as they were.
      std::string why = never_fits(*request, num_entries(*request) + num_new);
      if (!why.empty()) {
        running_.erase(std::find(running_.begin(), running_.end(), request));
        reject(request, std::move(why), &out);
        break;
      }
      Request* victim = pick_victim(constrained);
      if (victim == nullptr) break;  // constrained scheduling: wait for compressions to free blocks
      preempt(victim, &out, &budget);
      if (victim == request) break;
    }
    if (!scheduled) continue;
    if (take_slot) {
      request->compression.query_slot = slots_.acquire();
      ORIGAMI_CHECK(request->compression.query_slot >= 0);
    }
    out.sequences.push_back({request, num_new});
    budget -= num_new;
  }

  // Waiting requests, FCFS. After a preemption the cache is tight: admitting now would only
  // take blocks the preempted requests need to come back.
  if (out.preempted.size() == preempted_before) {
    // Compressions started this step may have put prompts behind their requests (those that
    // switched to their compacted tables at once; the others do when they complete). Only they:
    // shrink_reservation walks every head group, and no other running request's peak moved.
    for (Request* r : out.compressions)
      if (r->status == RequestStatus::kRunning) shrink_reservation(r);
    // Computed at the first waiting request that may be admitted: it walks every running
    // request's groups, and most steps (everything admitted, or no room) admit nothing.
    int reserved = -1;
    const bool reserving = config_.reserve_bounded_kv || config_.reserve_full_kv;
    while (!waiting_.empty() && budget > 0 && static_cast<int>(running_.size()) - num_finishing < config_.max_num_seqs) {
      if (reserved < 0) reserved = reserving ? reserved_growth() : 0;
      Request* request = waiting_.front();
      const int num_tokens = request->num_tokens();
      // Under prefill chunk compression the prompt never holds more than its threshold plus a chunk.
      std::string why = never_fits(
          *request, max_prefill_entries(request->compression, num_tokens, config_.max_num_batched_tokens));
      if (why.empty() && !config_.enable_chunked_prefill && num_tokens > config_.max_num_batched_tokens) {
        why = "request " + std::to_string(request->id) + " has " + std::to_string(num_tokens) +
              " tokens to prefill, more than max_num_batched_tokens (" +
              std::to_string(config_.max_num_batched_tokens) + ") with chunked prefill off";
      }
      if (!why.empty()) {
        waiting_.pop_front();
        reject(request, std::move(why), &out);
        continue;
      }
      // Tokens of a compression window must be computed (their queries captured), not served by
      // the prefix cache.
      const size_t copies_before = out.block_copies.size();
      int num_cached = continue_retained_context(request, &out);
      if (num_cached == 0) {
        const int window_from = query_capture_from(*request, block_size);
        num_cached = kv_->acquire_cached_prefix(*request, window_from >= 0 ? window_from : std::numeric_limits<int>::max());
      }
      request->num_computed_tokens = num_cached;
      const int remaining = num_tokens - num_cached;
      bool admitted = config_.enable_chunked_prefill || remaining <= budget;
      int num_new = std::min(remaining, budget);
      const int entries = may_capture_queries(*request) ? num_entries(*request) : 0;  // for the capture only
      const int capture_from = query_capture_from(*request, block_size, entries, num_new);
      bool take_slot = capture_from >= 0 && entries + num_new > capture_from;
      if (take_slot && slots_.num_free() == 0) {
        const int before_window = tokens_before_capture(*request, block_size, entries, num_new);
        if (before_window <= 0 || !config_.enable_chunked_prefill) {
          admitted = false;
        } else {
          num_new = before_window;
          take_slot = false;
        }
      }
      const int peak = reserving ? peak_blocks(*request) : -1;
      // Prefix blocks it now shares with a request that held them alone: that request's next
      // compression needs a fresh target for each, which nobody reserved when it was admitted.
      const int newly_shared = reserving ? newly_shared_blocks(*request) : 0;
      if (admitted && reserving && !running_.empty()) {
        // Blocks it takes now (unbounded) or ever (bounded), beyond those the prefix cache gave it,
        // must come out of what the running bounded requests do not still need.
        const int held = kv_->num_held_blocks(*request);
        // A bounded request's peak covers every prefix of its tokens, this step's included.
        const int needs = peak >= 0 ? peak - held : kv_->blocks_to_append(*request, num_new);
        // Retained contexts give their pages back before a request waits for them.
        kv_->reclaim_retained(reserved + newly_shared + needs);
        admitted = kv_->num_free_blocks() - reserved - newly_shared >= needs;
      }
      // Every head group gets the step's tokens: a continued retained context's groups may hold
      // different numbers of entries (per-head counts of a compressed context).
      admitted = admitted && kv_->append_slots(*request, num_new);
      if (!admitted) {
        // FCFS: the head waits for room rather than being overtaken.
        kv_->abandon_admission(*request);
        out.block_copies.resize(copies_before);  // their targets went back with the request's pages
        request->num_computed_tokens = 0;
        request->compression.reset_progress();  // a continuation resumed its context's state
        break;
      }
      waiting_.pop_front();
      request->status = RequestStatus::kRunning;
      request->num_cached_prefix_tokens = num_cached;
      if (take_slot) {
        request->compression.query_slot = slots_.acquire();
        ORIGAMI_CHECK(request->compression.query_slot >= 0);
      }
      running_.push_back(request);
      out.sequences.push_back({request, num_new});
      budget -= num_new;
      request->compression.reserved_blocks.clear();
      // A runtime allocation has no per-group peak (its groups' shares are decided at run time):
      // only its total is reserved (peak_blocks).
      if (peak >= 0 && !request->compression.runtime_allocated())
        for (int g = 0; g < kv_->num_groups(); ++g)
          request->compression.reserved_blocks.push_back(group_peak_blocks(*request, g));
      if (peak >= 0) reserved += std::max(0, peak - kv_->num_held_blocks(*request));
      reserved += newly_shared;
    }
  }
  out.num_batched_tokens = config_.max_num_batched_tokens - budget;
}

SchedulerUpdate Scheduler::update_from_output(const SchedulerOutput& output,
                                              const std::vector<CompressionResult>& finished) {
  advance(output);
  SchedulerUpdate update;
  for (const CompressionResult& result : finished) {
    auto it = std::find_if(compressing_.begin(), compressing_.end(),
                           [&](const Request* r) { return r->id == result.request_id; });
    ORIGAMI_CHECK_MSG(it != compressing_.end(), "the backend reported a compression that is not in flight");
    Request* request = *it;
    RequestCompression& c = request->compression;
    // One job per compressed head group: the request moves on once all of them are reported.
    ORIGAMI_CHECK_MSG(c.jobs_in_flight > 0, "the backend reported more compression jobs than were started");
    if (!result.status.is_ok()) c.job_failed = true;
    if (c.runtime_allocated() && c.src_kind == CompressionKind::kCompact && result.status.is_ok()) {
      // The backend's count for the group; a backend that does not say cannot run this request.
      const size_t g = static_cast<size_t>(result.group);
      if (result.num_kept < 0 || g >= c.kept_by_group.size()) c.job_failed = true;
      else c.kept_by_group[g] = result.num_kept;
    }
    if (--c.jobs_in_flight > 0) continue;
    if (!c.job_failed) {
      const bool block = c.src_kind == CompressionKind::kEvictBlock;
      update.num_evicted_entries += block ? kv_->layout().block_size : evicted_entries(*request);
      ++update.num_compressions;
      complete_compression(request, result.evicted_block);
      if (!block) update.num_kept_pages += c.kept_pages;
      shrink_reservation(request);
    } else {
      abort_compression(request);
      update.failed_compressions.push_back(request);
    }
  }
  return update;
}

void Scheduler::advance(const SchedulerOutput& output) {
  ORIGAMI_HOST_TIMER("scheduler.advance");
  const int block_size = kv_->layout().block_size;
  if (!output.sequences.empty()) ++num_steps_;
  // Requests found due this step, per policy name (a periodic trigger caps them per step). A step
  // sees one or two policies: a short list compared by name, not a map keyed by a string copied
  // per request.
  static const std::string kNoPolicy;
  due_per_policy_.clear();
  for (const ScheduledSequence& s : output.sequences) {
    Request* request = s.request;
    if (request->status != RequestStatus::kRunning) continue;  // finished or aborted meanwhile
    const bool was_prefilling = request->is_prefilling();
    const bool was_checked = request->compression.prefill_checked;
    request->num_computed_tokens += s.num_new_tokens;
    ORIGAMI_CHECK(request->num_computed_tokens <= request->num_tokens());
    kv_->cache_full_blocks(*request, request->num_computed_tokens);
    const std::string& policy = request->compression.policy != nullptr ? request->compression.policy->name() : kNoPolicy;
    auto it = std::find_if(due_per_policy_.begin(), due_per_policy_.end(),
                           [&](const std::pair<const std::string*, int>& d) { return *d.first == policy; });
    if (it == due_per_policy_.end()) it = due_per_policy_.insert(it, {&policy, 0});
    int& due_now = it->second;
    if (reached_compression_trigger(*request, block_size, num_steps_, due_now)) {
      request->compression.pending = true;
      ++due_now;
    }
    // A request's peak drops only when its prompt ends or its trigger decides (a keep, a prompt
    // left behind); otherwise it only grows with its tokens, and the walk over every head group
    // (72 x 256 requests for the Qwen3-8B shape) would change nothing.
    if (request->is_prefilling() != was_prefilling || request->compression.prefill_checked != was_checked ||
        request->compression.pending)
      shrink_reservation(request);
  }
}

int Scheduler::continue_retained_context(Request* request, SchedulerOutput* out) {
  if (!request->use_retained_contexts || !kv_->retained_contexts_enabled()) return 0;
  const std::string key = retained_policy_key(request->compression);
  const RetainedContext* context = kv_->find_retained(*request, request->num_tokens(), key);
  if (context == nullptr) return 0;
  // Copied first: taking fresh pages may release the context itself (its pages stay, held).
  const RetainedPolicyState state = context->state;
  const size_t copies_before = out->block_copies.size();
  const int served = kv_->continue_retained(*request, *context, &out->block_copies);
  if (served == 0) return 0;
  if (state.policy_key == key) resume_retained_policy_state(state, &request->compression);
  request->num_computed_tokens = served;
  const int entries = num_entries(*request);
  const int capture_from =
      query_capture_from(*request, kv_->layout().block_size, entries, request->num_tokens() - served);
  if (capture_from >= 0 && capture_from < entries) {
    kv_->abandon_admission(*request);
    out->block_copies.resize(copies_before);
    request->num_computed_tokens = 0;
    request->compression.reset_progress();
    return 0;
  }
  return served;
}

void Scheduler::finish_request(Request* request, FinishReason reason, bool retain) {
  ORIGAMI_CHECK_MSG(!request->compression.in_flight, "finish a request only after its compression completed");
  if (retain && request->status == RequestStatus::kRunning && request->num_computed_tokens > 0)
    kv_->retain(*request, request->num_computed_tokens, retained_policy_state(*request));
  auto it = std::find(running_.begin(), running_.end(), request);
  if (it != running_.end()) {
    running_.erase(it);
  } else {
    auto wit = std::find(waiting_.begin(), waiting_.end(), request);
    if (wit != waiting_.end()) waiting_.erase(wit);
  }
  release_slot(request);
  kv_->free(*request);
  request->compression.pending = false;
  request->status = RequestStatus::kFinished;
  request->finish_reason = reason;
}

bool Scheduler::preempt_to_make_progress(std::vector<Request*>* preempted) {
  Request* victim = pick_victim(/*slotless_only=*/false);
  if (victim == nullptr) {
    // Only bounded compressed requests are left, and none can move: recomputing one is still
    // correct, and frees its blocks and slot for the others.
    for (auto it = running_.rbegin(); it != running_.rend() && victim == nullptr; ++it)
      if (!(*it)->compression.in_flight && !(*it)->compression.switched_early) victim = *it;
  }
  if (victim == nullptr) return false;
  preempt(victim, nullptr, nullptr);
  preempted->push_back(victim);
  return true;
}

int Scheduler::group_peak_blocks(const Request& request, int group) const {
  const RequestCompression& c = request.compression;
  if (!reserves_peak(c))  // no compression bound: its whole length, when that is reserved too
    return config_.reserve_full_kv ? kv_->blocks_needed(request.num_prompt_tokens() + request.sampling.max_tokens) : -1;
  // Compressed under a cache-full policy with its prompt done: its tables never grow again.
  if (request.memory_bounded() && static_cast<size_t>(group) < request.kv.groups.size())
    return static_cast<int>(request.kv.groups[static_cast<size_t>(group)].blocks.size());
  const int chunk = config_.max_num_batched_tokens;
  const int num_tokens = request.num_tokens();  // a recomputed request prefills its outputs too
  const int final_blocks = kv_->blocks_needed(request.num_prompt_tokens() + request.sampling.max_tokens);
  if (c.trigger == CompressionTrigger::kCacheFull) {
    // The lead group's count triggers a compression, so until the first one every group grows with
    // it to N_max blocks (or the prompt's blocks while a longer prompt is prefilled); afterwards a
    // group holds its own ceil(keep / b) + 1 blocks (memory_bounded, above).
    const int prefill_blocks = kv_->blocks_needed(max_prefill_entries(c, num_tokens, chunk));
    return std::min(final_blocks, std::max(c.max_blocks, prefill_blocks));
  }
  // Prefill-end, chunk by chunk: the end of every chunk that leaves a group above its keep
  // compresses it (the smallest group's keep triggers, compression_state.h), unless the window
  // would reach into prefix-cache hits; so before each chunk a group holds at most
  // max(keep, cached prefix + window) entries. After the prompt's compression it holds at most
  // min(prompt, keep) and grows by the outputs (a recomputed request's prompt includes outputs
  // already generated, which only lowers that bound). A chunk keeps its chunk count (the budget
  // plus chunk_slack), the prompt's end the budget.
  const int keep = group_keep_of(c, group, final_keep(c));
  const int chunk_kept = group_keep_of(c, group, chunk_keep(c));
  const int decode = std::min(request.num_prompt_tokens(), keep) + request.sampling.max_tokens;
  if (prompt_behind(c)) {
    // The prompt's chunks are behind it: it holds at most its keep and grows by the outputs. Its
    // own blocks cover a group that never needed compressing.
    const int held = static_cast<size_t>(group) < request.kv.groups.size()
                         ? static_cast<int>(request.kv.groups[static_cast<size_t>(group)].blocks.size())
                         : 0;
    return std::max(held, std::min(final_blocks, kv_->blocks_needed(decode)));
  }
  const int cached = c.compressed() ? 0 : request.num_cached_prefix_tokens;
  const int prefill = std::min(num_tokens, std::max(chunk_kept, cached + c.window) + chunk);
  return std::min(final_blocks, kv_->blocks_needed(std::max(prefill, decode)));
}

void Scheduler::shrink_reservation(Request* request) const {
  std::vector<int>& reserved = request->compression.reserved_blocks;
  for (size_t g = 0; g < reserved.size(); ++g)
    reserved[g] = std::min(reserved[g], group_peak_blocks(*request, static_cast<int>(g)));
}

int Scheduler::joint_peak_blocks(const Request& request) const {
  const RequestCompression& c = request.compression;
  const KVLayout& layout = kv_->layout();
  const int b = layout.block_size;
  const long long groups = kv_->num_groups();
  // Every group holds at most the request's whole sequence.
  const long long final_tokens = request.num_prompt_tokens() + request.sampling.max_tokens;
  const long long cap = groups * kv_->blocks_needed(static_cast<int>(final_tokens));
  // Pages of groups holding x_g entries: sum of ceil(x_g / b) <= ceil(sum x_g / b) + groups.
  auto pages = [&](long long entries) { return std::min(cap, (entries + b - 1) / b + groups); };
  const long long remaining = final_tokens - request.num_computed_tokens;  // tokens still to write
  if (prompt_behind(c)) {
    // Past the prompt: the groups grow by the outputs from their current lengths.
    long long sum = 0;
    for (size_t g = 0; g < request.kv.groups.size(); ++g)
      sum += kv_->blocks_needed(static_cast<int>(request.kv.num_entries(g) + remaining));
    return static_cast<int>(std::min(cap, sum));
  }
  // A compression keeps mean_keep x (layers x KV heads) head-entries in all, and a group's length is
  // its largest head's count, at most the sum of its heads' counts: the groups' lengths sum to at
  // most that total (protected entries count against it; check_budget keeps them within the budget).
  const long long heads = static_cast<long long>(layout.num_layers) * layout.num_kv_heads;
  const long long kept_total = static_cast<long long>(c.num_keep) * heads;
  const int chunk = config_.max_num_batched_tokens;
  if (c.trigger == CompressionTrigger::kCacheFull) {
    // Compressed when the average over groups (rounded up) reaches the level
    // max(N_max b, (ceil(a / b) + 1) b), a being the average its last compression left: at most
    // ceil(kept_total / groups), the lengths summing to at most kept_total. The groups grow
    // together, one entry per decode step, so when the trigger fires they hold at most groups x
    // level (a prompt: its threshold plus one chunk), plus one entry each for the step it fires
    // in; page rounding is the `+ groups` of pages().
    const long long mean_after = (kept_total + groups - 1) / groups;
    const long long level = std::max<long long>(c.max_blocks, (mean_after + b - 1) / b + 1) * b;
    const long long at_trigger = groups * std::max<long long>(level, max_prefill_entries(c, request.num_tokens(), chunk));
    const long long bound = pages(at_trigger + groups);
    // Page-aligned counts (ScoreRecipe::page_aligned) with pages of one head: a compaction leaves
    // every head a whole number of pages, or all its entries. With the average keep a whole number
    // of pages, k = num_keep / b, the scope has P = heads x k pages: a compaction of groups holding
    // more than P pages' worth of entries (every cache-full compaction: it fires at N_max > k pages
    // a head on average) uses all P pages (enough page-opening entries exist), and if every group
    // held a whole number of pages before it, so does every group after it, those kept whole
    // included. The average is then exactly k b and the next trigger level max(N_max, k + 1) b;
    // growing together, the groups reach it after max(N_max, k + 1) - k whole pages each, holding
    // heads x max(N_max, k + 1) pages then (uniform's heads x N_max); before the first compaction
    // at most N_max pages each. The first compaction starts from whole pages when it fires at the
    // trigger level itself, N_max b entries a head: the prompt fits within that level, so no prompt
    // chunk or prompt end compresses first (a recomputed request, whose outputs are prefilled too,
    // keeps the bound above).
    const ScoreRecipe& recipe = c.policy->score_recipe();
    const bool whole_pages = recipe.page_aligned && groups == heads && c.num_keep % b == 0 &&
                             request.num_preemptions == 0 && request.num_prompt_tokens() <= static_cast<long long>(c.max_blocks) * b;
    if (whole_pages) {
      const long long keep_pages = c.num_keep / b;
      return static_cast<int>(std::min(bound, std::min(cap, groups * std::max<long long>(c.max_blocks, keep_pages + 1))));
    }
    return static_cast<int>(bound);
  }
  // Prefill-end compressed chunk by chunk: before each chunk the groups hold the kept total (or the
  // prefix hits and window a compression must wait for), plus one chunk each; afterwards the kept
  // total plus the outputs.
  const long long cached = c.compressed() ? 0 : request.num_cached_prefix_tokens;
  // A chunk keeps its chunk count (the budget plus chunk_slack), the prompt's end the budget.
  const long long chunk_total = static_cast<long long>(chunk_keep(c)) * heads;
  const long long final_total = static_cast<long long>(final_keep(c)) * heads;
  const long long prefill = std::max(chunk_total, groups * (cached + c.window)) + groups * std::min<long long>(chunk, request.num_tokens());
  const long long decode = final_total + groups * request.sampling.max_tokens;
  return static_cast<int>(pages(std::max(prefill, decode)));
}

int Scheduler::peak_blocks(const Request& request) const {
  const RequestCompression& c = request.compression;
  const bool bounded = reserves_peak(c);
  if (!bounded && !config_.reserve_full_kv) return -1;
  if (bounded && c.runtime_allocated()) return joint_peak_blocks(request) + fresh_targets_ahead(request);
  int total = 0;
  for (int g = 0; g < kv_->num_groups(); ++g) total += group_peak_blocks(request, g);
  if (!bounded) return total;  // its whole length (reserve_full_kv), never compacted
  // While shared prefix blocks are still held, compaction writes their entries to fresh blocks.
  const bool compresses_ahead = c.trigger != CompressionTrigger::kCacheFull ||
                                kv_->blocks_needed(request.num_prompt_tokens() + request.sampling.max_tokens) >= c.max_blocks;
  return total + (compresses_ahead ? fresh_targets_ahead(request) : 0);
}

int Scheduler::newly_shared_blocks(const Request& request) const {
  if (!kv_->blocks_may_be_shared()) return 0;
  int n = 0;
  for (size_t g = 0; g < request.kv.groups.size(); ++g)
    for (BlockId block : request.kv.groups[g].blocks) n += kv_->ref_count(block, static_cast<int>(g)) == 2 ? 1 : 0;
  return n;
}

int Scheduler::fresh_targets_ahead(const Request& request) const {
  const RequestCompression& c = request.compression;
  // After its first compaction a request's table is its own (never registered in the prefix
  // cache again, so nobody shares it) and this counts 0. Block eviction moves nothing: shared
  // prefix blocks stay in the table, and dropping one needs a fresh block for the next tokens.
  if (!kv_->blocks_may_be_shared()) return 0;  // reserved_growth() asks for every running request
  int shared = 0;
  for (size_t g = 0; g < request.kv.groups.size(); ++g) {
    const std::vector<BlockId>& blocks = request.kv.groups[g].blocks;
    // The destination places: N_max blocks (cache-full: the kept ones and the spare), or the
    // blocks the group's kept entries fill.
    // A runtime allocation's destination is the whole table (try_start_compression).
    const int dst = c.runtime_allocated() ? static_cast<int>(blocks.size())
                    : c.trigger == CompressionTrigger::kCacheFull
                        ? c.max_blocks
                        : kv_->blocks_needed(group_num_keep(c, static_cast<int>(g)));
    const int n = std::min(static_cast<int>(blocks.size()), dst);
    for (int i = 0; i < n; ++i)
      shared += kv_->ref_count(blocks[static_cast<size_t>(i)], static_cast<int>(g)) > 1 ? 1 : 0;
  }
  return shared;
}

int Scheduler::reserved_growth() const {
  int growth = 0;
  for (const Request* r : running_) {
    const int peak = peak_blocks(*r);
    if (peak >= 0) growth += std::max(0, peak - kv_->num_held_blocks(*r));
  }
  return growth;
}

}  // namespace origami
