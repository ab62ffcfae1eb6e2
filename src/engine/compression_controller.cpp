#include "engine/compression_controller.h"

#include <chrono>

#include "core/check.h"

namespace origami {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

CompressionController::CompressionController(Backend* backend, Scheduler* scheduler, EngineMetrics* metrics)
    : backend_(backend), scheduler_(scheduler), metrics_(metrics) {}

CompressionController::Result CompressionController::start(const std::vector<Request*>& requests) {
  ORIGAMI_CHECK(!in_flight());
  Result result;
  if (requests.empty()) return result;
  batch_ = requests;
  jobs_.clear();
  jobs_.reserve(batch_.size());
  for (Request* r : batch_) {
    const RequestCompression& c = r->compression;
    ORIGAMI_CHECK(c.in_flight && c.policy != nullptr);
    CompressionJob job;
    job.request_id = r->id;
    // The source table and the destination list stay untouched until complete_compression().
    job.src_blocks = &r->kv.groups[0].blocks;
    job.num_entries = r->kv.groups[0].num_entries;
    job.dst_blocks = &c.dst_blocks;
    job.num_keep = c.num_keep;
    job.query_slot = c.query_slot;
    job.num_scored_entries = c.num_scored_entries;
    job.first_compression = !c.compressed();
    job.recipe = &c.policy->score_recipe();
    jobs_.push_back(job);
  }
  const auto t0 = std::chrono::steady_clock::now();
  Status st = backend_->begin_compression(jobs_);
  metrics_->compression_seconds += seconds_since(t0);
  if (!st.is_ok()) finish_batch(st, &result);
  return result;
}

bool CompressionController::poll(bool wait, Result* result) {
  if (!in_flight()) return true;
  if (!wait && !backend_->compression_done()) return false;
  const auto t0 = std::chrono::steady_clock::now();
  Status st = backend_->wait_compression();
  metrics_->compression_seconds += seconds_since(t0);
  finish_batch(st, result);
  return true;
}

void CompressionController::finish_batch(const Status& status, Result* result) {
  for (size_t i = 0; i < batch_.size(); ++i) {
    Request* r = batch_[i];
    if (status.is_ok()) {
      metrics_->num_compressions += 1;
      metrics_->num_evicted_tokens += jobs_[i].num_entries - jobs_[i].num_keep;
      scheduler_->complete_compression(r);
    } else {
      scheduler_->abort_compression(r);
      result->failed.push_back(r);
    }
  }
  if (!status.is_ok()) result->error = status;
  metrics_->compression_device_seconds = backend_->compression_device_seconds();
  batch_.clear();
  jobs_.clear();
}

}  // namespace origami
