#include "sched/scheduler.h"

#include <algorithm>

#include "core/check.h"

namespace origami {
namespace {

// Entries the request's cache holds (equal across groups for full KV). Slot math counts entries,
// not logical tokens, so that a compressed request asks only for the room its cache needs.
int num_entries(const Request& request) {
  return request.kv.groups.empty() ? 0 : request.kv.groups[0].num_entries;
}

}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config, KVCacheManager* kv) : config_(config), kv_(kv) {
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

void Scheduler::reject(Request* request, std::string why, SchedulerOutput* out) {
  kv_->free(*request);
  request->num_computed_tokens = 0;
  request->error = std::move(why);
  out->rejected.push_back(request);
}

void Scheduler::preempt(Request* request, SchedulerOutput* out) {
  // Recompute, not swap: the request keeps its output tokens and later prefills prompt + output.
  kv_->free(*request);
  request->num_computed_tokens = 0;
  request->status = RequestStatus::kPreempted;
  ++request->num_preemptions;
  waiting_.push_front(request);
  out->preempted.push_back(request);
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int budget = config_.max_num_batched_tokens;

  // Running requests, in admission order. Requests finish their prefill in admission order (each
  // takes the budget before the next), so this order already puts decodes before prefill chunks.
  size_t i = 0;
  while (i < running_.size() && budget > 0) {
    Request* request = running_[i];
    const int remaining = request->num_tokens() - request->num_computed_tokens;
    if (remaining <= 0 || (!config_.enable_chunked_prefill && remaining > budget)) {
      ++i;
      continue;
    }
    const int num_new = std::min(remaining, budget);
    const int entries_after = num_entries(*request) + num_new;
    bool scheduled = false;
    for (;;) {
      if (kv_->allocate_slots(*request, entries_after)) {
        scheduled = true;
        break;
      }
      std::string why = never_fits(*request, entries_after);
      if (!why.empty()) {
        running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
        reject(request, std::move(why), &out);
        break;
      }
      // The most recently admitted request gives its blocks back; it has not been scheduled yet
      // in this step because it comes after `request` (or is `request` itself).
      Request* victim = running_.back();
      running_.pop_back();
      preempt(victim, &out);
      if (victim == request) break;
    }
    if (!scheduled) continue;  // `request` left running_; index i now names the next one
    out.sequences.push_back({request, num_new});
    budget -= num_new;
    ++i;
  }

  // Waiting requests, FCFS. After a preemption the cache is tight: admitting now would only
  // take blocks the preempted requests need to come back.
  if (out.preempted.empty()) {
    while (!waiting_.empty() && budget > 0 && static_cast<int>(running_.size()) < config_.max_num_seqs) {
      Request* request = waiting_.front();
      const int num_tokens = request->num_tokens();
      std::string why = never_fits(*request, num_tokens);
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
      const int num_cached = kv_->acquire_cached_prefix(*request);
      request->num_computed_tokens = num_cached;
      const int remaining = num_tokens - num_cached;
      bool admitted = config_.enable_chunked_prefill || remaining <= budget;
      const int num_new = std::min(remaining, budget);
      admitted = admitted && kv_->allocate_slots(*request, num_entries(*request) + num_new);
      if (!admitted) {
        // FCFS: the head waits for room rather than being overtaken.
        kv_->abandon_admission(*request);
        request->num_computed_tokens = 0;
        break;
      }
      waiting_.pop_front();
      request->status = RequestStatus::kRunning;
      request->num_cached_prefix_tokens = num_cached;
      running_.push_back(request);
      out.sequences.push_back({request, num_new});
      budget -= num_new;
    }
  }
  out.num_batched_tokens = config_.max_num_batched_tokens - budget;
  return out;
}

void Scheduler::on_step_done(const SchedulerOutput& output) {
  for (const ScheduledSequence& s : output.sequences) {
    Request* request = s.request;
    if (request->status != RequestStatus::kRunning) continue;  // finished or aborted meanwhile
    request->num_computed_tokens += s.num_new_tokens;
    ORIGAMI_CHECK(request->num_computed_tokens <= request->num_tokens());
    kv_->cache_full_blocks(*request, request->num_computed_tokens);
  }
}

void Scheduler::finish_request(Request* request, FinishReason reason) {
  auto it = std::find(running_.begin(), running_.end(), request);
  if (it != running_.end()) {
    running_.erase(it);
  } else {
    auto wit = std::find(waiting_.begin(), waiting_.end(), request);
    if (wit != waiting_.end()) waiting_.erase(wit);
  }
  kv_->free(*request);
  request->status = RequestStatus::kFinished;
  request->finish_reason = reason;
}

}  // namespace origami
